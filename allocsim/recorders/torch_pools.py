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

from ..trace import events as ev

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
    def patch(self, owner, name: str, make) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        wrapper = functools.wraps(original)(make(original))
        setattr(owner, name, wrapper)
        self.patched.append((owner, name, original))

    def install(self) -> None:
        torch = self.torch
        graph_cls = getattr(torch.cuda, "CUDAGraph", None)
        if graph_cls is not None:
            self.patch(graph_cls, "capture_begin", self._capture_begin)
            self.patch(graph_cls, "capture_end", self._capture_end)
            self.patch(graph_cls, "reset", self._reset)
            self.patch(graph_cls, "replay", self._replay)
        # use_mem_pool imports the calls by name into torch.cuda.memory: wrap them there too
        for name, (kind, flags) in C_CALLS.items():
            original = getattr(torch._C, name, None)
            if original is None:
                continue
            wrapper = functools.wraps(original)(self._c_call(original, kind, flags))
            for owner in (torch._C, torch.cuda.memory, torch.cuda):
                if getattr(owner, name, None) is original:
                    setattr(owner, name, wrapper)
                    self.patched.append((owner, name, original))
        mempool = getattr(torch.cuda.memory, "MemPool", None)
        if mempool is not None:
            self.patch(mempool, "__init__", self._mempool_init)

    def remove(self) -> None:
        for owner, name, original in reversed(self.patched):
            setattr(owner, name, original)
        self.patched.clear()
        for f in self.finalizers:
            f.detach()

    def summary(self) -> dict:
        return {"pools": len(self.numbers), "events": dict(self.counts), "checkpoint_restores": self.checkpoints,
                "pool_ids": {str(n): list(k) for k, n in self.numbers.items()}}

    # --- wrappers ---------------------------------------------------------------------------------
    def _c_call(self, original, kind, flags):
        hooks = self

        def call(device, pool, *args, **kwargs):
            if not hooks.ours(device):
                return original(device, pool, *args, **kwargs)
            if kind is None and flags:               # _cuda_getCheckpointState(device, pool) -> state
                state = original(device, pool, *args, **kwargs)
                hooks.states[id(state)] = (state, tuple(pool))
                return state
            if kind is None:                         # _cuda_setCheckpointPoolState(device, state, ...)
                return hooks.restore(original, device, pool, *args, **kwargs)
            if kind == ev.POOL_END:
                result = original(device, pool, *args, **kwargs)
                hooks.record(kind, pool)
                return result
            stream = hooks.current_stream() if kind == ev.POOL_BEGIN and not flags else 0
            if kind == ev.POOL_BEGIN:
                hooks.rec.drain() if hooks.rec.writer is not None else None
                result = original(device, pool, *args, **kwargs)
                hooks.record(kind, pool, stream=stream, flags=flags, drain=False)
                return result
            hooks.record(kind, pool)
            return original(device, pool, *args, **kwargs)
        return call

    def restore(self, original, device, state, *args, **kwargs):
        """A checkpoint restored: PyTorch frees the pool's live blocks and re-makes the checkpoint's in the
        pool's own blocks, so those entries go inside a begin (every stream) and an end of the pool, and the
        user the begin gave it is taken back."""
        self.checkpoints += 1
        rec = self.rec
        if rec.writer is not None:
            rec.mark(f"pool checkpoint restored ({self.checkpoints})")
        known = self.states.get(id(state))
        pool = known[1] if known is not None and known[0] is state else None
        if pool is None:
            return original(device, state, *args, **kwargs)
        self.record(ev.POOL_BEGIN, pool, flags=ev.POOL_ANY_STREAM)
        result = original(device, state, *args, **kwargs)
        self.record(ev.POOL_END, pool)
        self.record(ev.POOL_RELEASE, pool, drain=False)
        return result

    def _capture_begin(self, original):
        hooks = self

        def capture_begin(graph, *args, **kwargs):
            stream = hooks.current_stream()
            if hooks.rec.writer is not None:
                hooks.rec.drain()
            result = original(graph, *args, **kwargs)
            pool = tuple(graph.pool())
            hooks.record(ev.POOL_BEGIN, pool, stream=stream, flags=ev.POOL_CAPTURE, drain=False)
            key = id(graph)
            if key not in hooks.graphs:
                try:
                    hooks.finalizers.append(weakref.finalize(graph, hooks._graph_gone, key))
                except TypeError:                    # not weakly referable: its deletion goes unseen
                    pass
            hooks.graphs[key] = pool
            return result
        return capture_begin

    def _capture_end(self, original):
        hooks = self

        def capture_end(graph, *args, **kwargs):
            result = original(graph, *args, **kwargs)
            pool = hooks.graphs.get(id(graph))
            if pool is not None:
                hooks.record(ev.POOL_END, pool)
            return result
        return capture_end

    def _reset(self, original):
        hooks = self

        def reset(graph, *args, **kwargs):
            pool = hooks.graphs.pop(id(graph), None)
            if pool is not None:
                hooks.record(ev.POOL_RELEASE, pool)
            return original(graph, *args, **kwargs)
        return reset

    def _graph_gone(self, key: int) -> None:
        pool = self.graphs.pop(key, None)
        if pool is not None:
            self.record(ev.POOL_RELEASE, pool)

    def _replay(self, original):
        hooks = self

        def replay(graph, *args, **kwargs):
            pool = hooks.graphs.get(id(graph))
            if pool is not None:
                hooks.record(ev.GRAPH_REPLAY, pool)
            return original(graph, *args, **kwargs)
        return replay

    def _mempool_init(self, original):
        hooks = self

        def __init__(pool_object, *args, **kwargs):
            original(pool_object, *args, **kwargs)
            device = getattr(pool_object, "device", None)
            if callable(device):
                device = device()
            if not hooks.ours(device if isinstance(device, int) else None):
                return
            pool = tuple(pool_object.id)
            hooks.record(ev.POOL_RETAIN, pool)
            hooks.finalizers.append(weakref.finalize(pool_object, hooks.record, ev.POOL_RELEASE, pool,
                                                     flags=ev.POOL_EMPTY))
        return __init__
