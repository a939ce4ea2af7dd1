"""What the PyTorch recorder adds for private memory pools: the calls that route allocations to a pool.

PyTorch's caching allocator sends allocations to a *private pool* while a pool is in use
(``beginAllocateToPool`` … ``endAllocateToPool``), keeps the pool while it has users
(``use_count``) and frees its segments at the first release of cached blocks after the
last user is gone (``releasePool``). None of these calls leaves an entry in the
allocator's own history, so the recorder wraps the places a program reaches them from
(`docs/trace-format.md`, the pool events; `docs/models/torch.md`, private pools):

- ``torch.cuda.CUDAGraph.capture_begin`` / ``capture_end`` (``torch.cuda.graph``,
  ``make_graphed_callables``, torch.compile's CUDA graph trees): POOL_BEGIN with
  POOL_CAPTURE on the capturing stream, POOL_END; ``reset`` and the graph's deletion:
  POOL_RELEASE; ``replay``: GRAPH_REPLAY (informational);
- ``torch._C._cuda_beginAllocate{,CurrentStream,CurrentThread}ToPool``,
  ``_cuda_endAllocate{,CurrentStream}ToPool``, ``_cuda_releasePool`` (``use_mem_pool``,
  the graph trees' warm-up): POOL_BEGIN (every stream, or the current one), POOL_END,
  POOL_RELEASE;
- ``torch.cuda.MemPool()``: POOL_RETAIN; its deletion: POOL_RELEASE with POOL_EMPTY (the
  destructor releases the pool and empties its cache);
- ``torch._C._cuda_setCheckpointPoolState`` (graph trees restoring a pool's state from
  ``_cuda_getCheckpointState``): marked, and its frees and re-allocations of the pool's blocks
  (entries of the history) are put inside a POOL_BEGIN (every stream) … POOL_END + POOL_RELEASE
  of that pool, since PyTorch makes them in the pool's own blocks; where the blocks land is the
  model's best fit, not the checkpoint's addresses.

Each event is written after a drain of the allocator's history, so it lands between the
entries before and after it. Pools are numbered 1, 2, … in the order they appear.
"""
from __future__ import annotations

import functools
import weakref

from ...trace import events as ev

#: The ``torch._C`` calls wrapped, with the event each records (None: the checkpoint restore, only counted).
C_CALLS = {
    "_cuda_beginAllocateToPool": (ev.POOL_BEGIN, ev.POOL_ANY_STREAM),
    "_cuda_beginAllocateCurrentThreadToPool": (ev.POOL_BEGIN, ev.POOL_ANY_STREAM),
    "_cuda_beginAllocateCurrentStreamToPool": (ev.POOL_BEGIN, 0),
    "_cuda_endAllocateToPool": (ev.POOL_END, 0),
    "_cuda_endAllocateCurrentStreamToPool": (ev.POOL_END, 0),
    "_cuda_releasePool": (ev.POOL_RELEASE, 0),
    "_cuda_setCheckpointPoolState": (None, 0),
    "_cuda_getCheckpointState": (None, 1),
}


class PoolHooks:
    """Wraps the pool calls of ``torch`` for one recorder; `remove` puts the originals back."""

    def __init__(self, recorder):
        self.rec = recorder
        self.torch = recorder.torch
        self.numbers: dict[tuple, int] = {}
        self.counts = {ev.KIND_NAMES[k]: 0 for k in (*ev.POOL, ev.GRAPH_REPLAY)}
        self.checkpoints = 0
        self.states: dict[int, tuple] = {}          # id(checkpoint state) -> (the state, kept alive; its pool)
        self.graphs: dict[int, tuple] = {}          # id(graph) -> its pool, while it holds one
        self.finalizers: list = []
        self.patched: list[tuple[object, str, object]] = []
        self.deferred: list[tuple] = []             # events met inside a drain, written at its end
        self.pending: dict[int, int] = {}           # id(graph) -> stream: captured into a new pool, begin unwritten
        self.late = 0                               # drains while such a begin was unwritten (`TorchRecorder.drain`)
        self.errors = 0

    # --- events -----------------------------------------------------------------------------------
    def number(self, pool) -> int:
        key = tuple(int(x) for x in pool)
        return self.numbers.setdefault(key, len(self.numbers) + 1)

    def record(self, kind: int, pool, *, stream: int = 0, flags: int = 0, drain: bool = True) -> None:
        """One pool event after the entries recorded so far (nothing once the trace is closed)."""
        rec = self.rec
        if rec.writer is None:
            return
        if getattr(rec, "draining", False):         # a finalizer run by a collection inside a drain
            self.deferred.append((kind, pool, stream, flags))
            return
        if drain:
            rec.drain()
        rec.conv.w.record(kind, aux=self.number(pool), addr=ev.pool_id_bits(pool), stream=stream, flags=flags)
        self.counts[ev.KIND_NAMES[kind]] += 1

    def flush_deferred(self) -> None:
        """Write the events met inside the drain that just ended, after its entries (their own come later)."""
        while self.deferred:
            kind, pool, stream, flags = self.deferred.pop(0)
            self.record(kind, pool, stream=stream, flags=flags, drain=False)

    def current_stream(self) -> int:
        return int(self.torch.cuda.current_stream(self.rec.device).cuda_stream)

    def ours(self, device) -> bool:
        return device is None or int(device) == self.rec.device

    # --- patching ---------------------------------------------------------------------------------
    def patch(self, owner, name: str, before, after=None) -> None:
        """Replace ``owner.name`` by a wrapper: ``before(*args, **kwargs)`` (its value is the note handed on),
        the original call, then ``after(note, result, *args, **kwargs)``. What the hooks do is never allowed to
        break the program: an exception of theirs is noted in the stats file and the call goes on (`safely`)."""
        original = getattr(owner, name, None)
        if original is None:
            return
        hooks = self

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            note = hooks.safely(before, *args, **kwargs)
            result = original(*args, **kwargs)
            if after is not None:
                hooks.safely(after, note, result, *args, **kwargs)
            return result
        setattr(owner, name, wrapper)
        self.patched.append((owner, name, original))

    def safely(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:                      # a hook's own failure: noted, the program goes on
            self.errors += 1
            if self.errors <= 3:
                self.rec.note(f"pool hook {getattr(fn, '__name__', fn)} failed ({type(e).__name__}: {e}); "
                              f"the pool events around it may be missing")
            return None

    def install(self) -> None:
        torch = self.torch
        graph_cls = getattr(torch.cuda, "CUDAGraph", None)
        if graph_cls is not None:
            self.patch(graph_cls, "capture_begin", self._before_capture, self._after_capture_begin)
            self.patch(graph_cls, "capture_end", lambda graph, *a, **k: None, self._after_capture_end)
            self.patch(graph_cls, "reset", self._before_reset)
            self.patch(graph_cls, "replay", self._before_replay)
        # use_mem_pool imports the calls by name into torch.cuda.memory: wrap them there too
        c_module = getattr(torch, "_C", None)       # a stand-in torch (the tests') may have none
        for name, (kind, flags) in C_CALLS.items():
            original = getattr(c_module, name, None)
            if original is None:
                continue
            owners = [o for o in (c_module, torch.cuda.memory, torch.cuda) if getattr(o, name, None) is original]
            for owner in owners:
                self.patch(owner, name, *self._c_hooks(kind, flags))
        mempool = getattr(torch.cuda.memory, "MemPool", None)
        if mempool is not None:
            self.patch(mempool, "__init__", lambda *a, **k: None, self._after_mempool_init)

    def remove(self) -> None:
        for owner, name, original in reversed(self.patched):
            setattr(owner, name, original)
        self.patched.clear()
        for f in self.finalizers:
            f.detach()

    def summary(self) -> dict:
        return {"pools": len(self.numbers), "events": dict(self.counts), "checkpoint_restores": self.checkpoints,
                "pool_ids": {str(n): list(k) for k, n in self.numbers.items()}, "hook_errors": self.errors,
                "late_capture_begins": self.late}

    # --- the torch._C calls -----------------------------------------------------------------------
    def _c_hooks(self, kind, flags):
        """``(before, after)`` for one ``torch._C`` call ``(device, pool or state, ...)``: a begin is written after
        the call (nothing is allocated inside it), an end after the call and a drain (the entries before it are
        the pool's), a release before the call (a MemPool's segment frees follow it)."""
        hooks = self

        def before(device, pool, *args, **kwargs):
            if not hooks.ours(device):
                return None
            if kind == ev.POOL_BEGIN:
                if hooks.rec.writer is not None:
                    hooks.rec.drain()
                return hooks.current_stream() if not flags else 0
            if kind == ev.POOL_RELEASE:
                hooks.record(kind, pool)
            elif kind is None and not flags:         # _cuda_setCheckpointPoolState(device, state, ...)
                return hooks.restore_begins(pool)
            return None

        def after(note, result, device, pool, *args, **kwargs):
            if not hooks.ours(device):
                return
            if kind == ev.POOL_BEGIN:
                hooks.record(kind, pool, stream=note or 0, flags=flags, drain=False)
            elif kind == ev.POOL_END:
                hooks.record(kind, pool)
            elif kind is None and flags:             # _cuda_getCheckpointState(device, pool) -> state
                hooks.states[id(result)] = (result, tuple(pool))
            elif kind is None and note is not None:  # a restored checkpoint of a known pool ends
                hooks.record(ev.POOL_END, note)
                hooks.record(ev.POOL_RELEASE, note, drain=False)
        before.__name__, after.__name__ = f"before {kind}", f"after {kind}"
        return before, after

    def restore_begins(self, state):
        """A checkpoint restored: PyTorch frees the pool's live blocks and re-makes the checkpoint's in the
        pool's own blocks, so those entries go inside a begin (every stream) and an end of the pool (after the
        call), and the user the begin gave it is taken back. Returns the pool, or None for an unknown state."""
        self.checkpoints += 1
        if self.rec.writer is not None:
            self.rec.mark(f"pool checkpoint restored ({self.checkpoints})")
        known = self.states.get(id(state))
        pool = known[1] if known is not None and known[0] is state else None
        if pool is not None:
            self.record(ev.POOL_BEGIN, pool, flags=ev.POOL_ANY_STREAM)
        return pool

    # --- CUDA graphs ------------------------------------------------------------------------------
    @staticmethod
    def given_pool(args, kwargs):
        """The pool a ``capture_begin(pool=...)`` names (a handle, a graph's ``pool()``, a MemPool), or None."""
        pool = kwargs.get("pool", args[0] if args else None)
        pool = getattr(pool, "id", pool)             # a MemPool
        if pool is None:
            return None
        pool = tuple(int(x) for x in pool)
        return pool if any(pool) else None

    def _before_capture(self, graph, *args, **kwargs):
        """The stream being captured and the pool named, after a drain of the entries before the capture."""
        if self.rec.writer is not None:
            self.rec.drain()
        return self.current_stream(), self.given_pool(args, kwargs)

    def _after_capture_begin(self, note, result, graph, *args, **kwargs):
        """``capture_begin`` allocates before it begins the pool (the RNG's graph-safe seed and offset, 8 bytes each,
        from the default pools): a drain writes those first. Then a named pool's begin is written; a new pool's id
        is known only once the capture ends (``CUDAGraph.pool()`` refuses before), so its begin is written then,
        before the capture's entries, which stay in the allocator's history until that drain."""
        stream, pool = note
        if self.rec.writer is not None:
            self.rec.drain()
        key = id(graph)
        if key not in self.graphs and key not in self.pending:
            try:
                self.finalizers.append(weakref.finalize(graph, self._graph_gone, key))
            except TypeError:                        # not weakly referable: its deletion goes unseen
                pass
        if pool is None:
            self.pending[key] = stream
            self.graphs.pop(key, None)
            return
        self.graphs[key] = pool
        self.record(ev.POOL_BEGIN, pool, stream=stream, flags=ev.POOL_CAPTURE, drain=False)

    def _after_capture_end(self, note, result, graph, *args, **kwargs):
        key = id(graph)
        if key in self.pending:
            stream = self.pending.pop(key)
            pool = self.graphs[key] = tuple(int(x) for x in graph.pool())
            self.record(ev.POOL_BEGIN, pool, stream=stream, flags=ev.POOL_CAPTURE, drain=False)
        pool = self.graphs.get(key)
        if pool is not None:
            self.record(ev.POOL_END, pool)

    def _before_reset(self, graph, *args, **kwargs):
        self.pending.pop(id(graph), None)
        pool = self.graphs.pop(id(graph), None)
        if pool is not None:
            self.record(ev.POOL_RELEASE, pool)

    def _graph_gone(self, key: int) -> None:
        self.pending.pop(key, None)
        pool = self.graphs.pop(key, None)
        if pool is not None:
            self.safely(self.record, ev.POOL_RELEASE, pool)

    def _before_replay(self, graph, *args, **kwargs):
        pool = self.graphs.get(id(graph))
        if pool is not None:
            self.record(ev.GRAPH_REPLAY, pool)

    # --- MemPool ----------------------------------------------------------------------------------
    def _after_mempool_init(self, note, result, pool_object, *args, **kwargs):
        device = getattr(pool_object, "device", None)
        if callable(device):
            device = device()
        if not self.ours(device if isinstance(device, int) else None):
            return
        pool = tuple(int(x) for x in pool_object.id)
        self.record(ev.POOL_RETAIN, pool)
        self.finalizers.append(weakref.finalize(pool_object, self.safely, self.record, ev.POOL_RELEASE, pool,
                                                flags=ev.POOL_EMPTY))
