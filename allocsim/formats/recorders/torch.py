"""PyTorch recorder: the caching allocator's own history, drained in chunks.

Recording uses ``torch.cuda.memory._record_memory_history`` (a ring buffer of
``max_entries`` per device, kept by the allocator itself, so the trace holds
exactly what the real allocator did, segment calls included).

**The program's own calls on its allocator** are recorded where they are
made, and passed on unchanged: ``torch.cuda.empty_cache()`` is a
CACHE_RELEASE (aux 0) before the segment frees it causes (an ``emptyCache()`` made in C++, as cuDNN's
benchmark mode makes one per plan search, is inferred from its segment frees by the converter), and
``torch.cuda.set_per_process_memory_fraction(f)`` for the recorded device a
SET_LIMIT (aux 0, addr = ``f`` as IEEE-754 float64 bits, size =
``int(f * total_memory)``, the bytes PyTorch allows). The fraction in force
when recording starts is written first when PyTorch can report it
(``get_per_process_memory_fraction``) and it is not 1. Each is preceded by a
drain, so it lands between the entries before and after it. Nothing here
allocates on the device or touches the allocator's counters: ``memory_stats()``
reads the same with and without the recorder (``tests/test_record_pressure.py``).

**Chunked drain, no loss, no duplicates.** The ring buffer is emptied at every
drain point: ``_snapshot()`` copies the entries recorded so far, they are
converted and streamed to the trace file, then recording is re-armed with
``clear_history=True``, which empties the buffer. Drain points are the
optimizer step post-hook (one per iteration), `allocsim.mark()`, and the end
of the program. They run on the main thread between operations, when no
other thread allocates on the device (autograd's backward has finished before
an optimizer step), so no entry falls between the copy and the clear: nothing
is lost, and since every drain clears what it copied, nothing is seen twice.
With ``--stacks all`` the allocations carry C++ frames too, and those made where
PyTorch catches their OOM (a cuDNN workspace try) are flagged CATCHES_OOM by the converter
(``docs/allocator-dependent.md``). The end-of-run check compares the number of ``alloc`` entries converted with
the allocator's own ``allocation.all.allocated`` counter and writes a note
to the stats file if they differ. Memory stays bounded by one iteration's
entries (the buffer and one copy); a chunk that fills the whole buffer may have
wrapped and is reported.

**Conversion** is forward only: recording starts before the program runs, so
every freed block was allocated inside the trace (blocks freed without a
recorded allocation are counted, not guessed). A recording started from inside a
program that has blocks live already (a notebook: `allocsim.recording`) is seeded
with them first, as the importer seeds a snapshot (`late_start`, docs/recording.md). An address maps to the dense id
of its live block (a dict, O(1) per entry, size = live blocks). MARKs land
exactly between the chunks they separate. The importer
(`allocsim.formats.importers.torch_snapshot`) handles the other case, snapshots taken
after the fact whose early history is gone, by seeding state backwards from the
final segments; that reconstruction is not needed here.
"""
from __future__ import annotations

from ...errors import GPUUnavailable
from ..importers.torch_snapshot import EntryConverter, StartState, _Where, private_pool_segments
from ...trace import events as ev
from ...trace.events import TORCH_AUX, fraction_bits
from . import cudnn
from ._base import Recorder, stderr
from .torch_compile import Hooks as CompileHooks
from .torch_pools import PoolHooks

DEFAULT_MAX_ENTRIES = 1_000_000
#: The functions of ``torch.cuda.memory`` the recorder wraps (also re-exported as ``torch.cuda.NAME``).
WRAPPED = ("empty_cache", "set_per_process_memory_fraction")


class TorchRecorder(Recorder):
    framework = "torch"

    @classmethod
    def check_gpu(cls) -> None:
        import torch
        if not torch.cuda.is_available():
            raise GPUUnavailable(f"cannot record: torch {torch.__version__} sees no CUDA GPU "
                                 "(torch.cuda.is_available() is False)")

    def _arm(self, clear: bool) -> None:
        import torch
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc" if self.stacks else None, stacks=self.stacks or "python",
            max_entries=self.max_entries, clear_history=clear)

    #: False: the device is the current one when recording starts. True (a process of a run, started at CUDA's
    #: initialisation, before the program picks its device): the first device the entries show (`_open_on`).
    follow_device = False

    def start(self) -> None:
        import torch
        history_on = torch.cuda.is_initialized() and any(torch.cuda.memory._snapshot().get("device_traces") or [])
        torch.cuda.init()
        self.torch = torch
        if history_on:          # a program that started late, and recorded its own history
            self.note("the program's own memory history (torch.cuda.memory._record_memory_history) was on: the "
                      "recording took it over, cleared it, and turned it off at its end")
        self.device = None
        self.max_entries = self.max_events or DEFAULT_MAX_ENTRIES
        self.steps = 0
        self.chunks = 0
        self.largest_chunk = 0
        self.other_device_entries = 0
        self.private_pools: dict[int, int] = {}     # base -> size of segments seen in CUDA graph private pools
        self.draining = False
        self.pool_hooks = PoolHooks(self)       # private pools: CUDA graphs, MemPool (`torch_pools`)
        self.releases = self.limits = 0
        self.program_releases: list[int] = []   # trace indices of the program's empty_cache() (`cudnn.plan_searches`)
        self.memory: dict = {}
        self._arm(clear=True)
        if not self.follow_device:
            device = torch.cuda.current_device()
            self._open_on(device, self._state_at_start(device))
        self._wrap_calls()
        self.pool_hooks.install()
        self.compile_hooks = CompileHooks(self)       # torch.compile's phases and tries (`torch_compile`)
        self.compile_hooks.install()
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._hook = register_optimizer_step_post_hook(self._on_step)

    def abort(self) -> None:
        """Start failed: undo what it had installed (the optimizer hook, the wrapped calls, the pool and compile
        hooks, the memory history), then remove the partial file, so that a notebook can start again."""
        for undo in (lambda: self._hook.remove(), self._unwrap_calls, lambda: self.pool_hooks.remove(),
                     lambda: self.compile_hooks.remove(),
                     lambda: self.torch.cuda.memory._record_memory_history(enabled=None)):
            try:
                undo()
            except Exception:       # not installed yet (AttributeError), or already undone
                pass
        super().abort()

    #: ``allocation.all.allocated`` when recording began: the allocations made before it (a late start)
    allocs_before = 0

    def _state_at_start(self, device: int) -> StartState | None:
        """What the allocator already holds on ``device`` when recording starts — nothing when CUDA starts with the
        recording (`allocsim record`), blocks and segments when a program started it late (a notebook that built
        its model first): the importer's `StartState` of a snapshot with no history yet (just armed and cleared)."""
        if not self.torch.cuda.memory_reserved(device):
            return None
        snap = self.torch.cuda.memory._snapshot()
        self.allocs_before = int(self.torch.cuda.memory_stats(device).get("allocation.all.allocated", 0))
        return StartState(snap, [], device, _Where(self.out))

    def _open_on(self, device: int, start: StartState | None = None) -> None:
        """Open the trace for ``device``: its metadata, the device's memory now, the fraction in force; with
        ``start``, the blocks and segments live before it, seeded as the importer seeds them (`late_start`)."""
        torch = self.torch
        self.device = device
        props = torch.cuda.get_device_properties(device)
        settings = torch.cuda.memory._snapshot().get("allocator_settings", {})
        meta = {**self.base_meta(), "framework_version": torch.__version__,
                "cuda_version": torch.version.cuda,
                "device": {"index": device, "name": props.name, "total_memory": int(props.total_memory)},
                "allocator": "pytorch-caching", "allocator_settings": settings,
                "max_entries": self.max_entries, "stacks": self.stacks}
        if start is not None:
            meta.update(late_start(start, device))
        gc = settings.get("garbage_collection_threshold")
        self.conv = EntryConverter(self.open_trace(meta), stacks=self.stacks, device=device, infer_releases=True,
                                   limit=int(props.total_memory),
                                   gc_threshold=isinstance(gc, (int, float)) and gc > 0)
        if start is not None:
            start.seed(self.conv)
            self.note(meta["started_late"]["missing"])
            import warnings
            warnings.warn(f"allocsim: {meta['started_late']['missing']}", RuntimeWarning, stacklevel=2)
        self.total_memory = int(props.total_memory)
        self.memory = {"total": self.total_memory, "start": self._device_memory(), "outside_peak": 0}
        self.fraction_limit = None
        self._retry_limit(self.memory["start"]["outside"])
        get_fraction = getattr(torch.cuda.memory, "get_per_process_memory_fraction", None)
        if get_fraction is not None and get_fraction(device) != 1.0:
            self.record_fraction(get_fraction(device))

    def _device_memory(self) -> dict:
        """The device's free bytes (``mem_get_info``), this allocator's reserved bytes, and what lies outside it
        (total - free - reserved: the CUDA context, NCCL's buffers, other processes on the device)."""
        free, total = self.torch.cuda.mem_get_info(self.device)
        reserved = int(self.torch.cuda.memory_reserved(self.device))
        return {"free": int(free), "reserved": reserved, "outside": max(0, int(total) - int(free) - reserved)}

    def _wrap_calls(self) -> None:
        """Put recording wrappers of `WRAPPED` in ``torch.cuda`` and ``torch.cuda.memory`` (`_unwrap_calls` undoes)."""
        import functools
        cuda, memory = self.torch.cuda, self.torch.cuda.memory
        self._originals = {name: getattr(memory, name) for name in WRAPPED}
        empty_cache, set_fraction = (self._originals[n] for n in WRAPPED)

        @functools.wraps(empty_cache)
        def recorded_empty_cache():
            if self.writer is None and self.follow_device and self.torch.cuda.is_initialized():
                self._open_on(self.torch.cuda.current_device())
            if self.writer is not None:
                self.drain()
                self.program_releases.append(self.writer.count)     # the program's own: not cuDNN's (`cudnn.seal`)
                self.conv.cache_release()
                self.releases += 1
            return empty_cache()

        @functools.wraps(set_fraction)
        def recorded_set_fraction(fraction, device=None):
            result = set_fraction(fraction, device)
            index = self.torch.cuda._utils._get_device_index(device, optional=True)
            if self.writer is None and self.follow_device:
                self._open_on(index)       # opening records the fraction now in force
            elif self.writer is not None and index == self.device:
                self.record_fraction(fraction)
            return result

        for name, fn in zip(WRAPPED, (recorded_empty_cache, recorded_set_fraction)):
            setattr(memory, name, fn)
            if getattr(cuda, name, None) is self._originals[name]:
                setattr(cuda, name, fn)

    def _unwrap_calls(self) -> None:
        cuda, memory = self.torch.cuda, self.torch.cuda.memory
        for name, fn in self._originals.items():
            if getattr(cuda, name, None) is getattr(memory, name):
                setattr(cuda, name, fn)
            setattr(memory, name, fn)

    def record_fraction(self, fraction: float) -> None:
        """A SET_LIMIT for a memory fraction of the recorded device, after the entries made before it."""
        self.drain()
        self.conv.w.record(ev.SET_LIMIT, aux=TORCH_AUX, addr=fraction_bits(fraction),
                           size=int(fraction * self.total_memory))
        self.fraction_limit = int(fraction * self.total_memory)
        self._retry_limit(self._device_memory()["outside"])
        self.limits += 1

    def _retry_limit(self, outside: int) -> None:
        """The bytes the allocator could hold now, for the converter's release-and-retry check (`EntryConverter`):
        the fraction's, and at most what the device has beside the memory outside the allocator (the CUDA
        context, NCCL, other processes: a cudaMalloc fails there long before the device's total)."""
        room = self.total_memory - outside
        self.conv.limit = room if self.fraction_limit is None else min(self.fraction_limit, room)

    def _on_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1
        self.mark(f"step {self.steps}")

    def settle(self) -> None:
        self.drain()

    def drain(self) -> None:
        """Move the ring buffer's entries into the trace and empty it (see the module docstring). A drain
        started while one runs (a pool's finalizer run by a collection inside it) does nothing: its event is
        written after the running drain's entries (`PoolHooks.record`)."""
        if self.draining:
            return None
        if self.pool_hooks.pending:         # a capture into a new pool: its begin comes only at its end
            self.pool_hooks.late += 1
        self.draining = True
        try:
            return self._drain()
        finally:
            self.draining = False
            self.pool_hooks.flush_deferred()

    def _drain(self):
        snap = self.torch.cuda.memory._snapshot()
        self._arm(clear=True)
        if self.writer is None:                     # follow_device, and nothing opened it yet
            used = [d for d, entries in enumerate(snap.get("device_traces", [])) if entries]
            if not used:
                return snap
            current = self.torch.cuda.current_device()
            self._open_on(current if current in used else used[0])
        self.chunks += 1
        outside = self._device_memory()["outside"]
        self.memory["outside_peak"] = max(self.memory["outside_peak"], outside)
        self._retry_limit(outside)
        private = private_pool_segments(snap, self.device)     # graph pools' segments alive now
        self.conv.private |= set(private)
        self.private_pools.update(private)
        for dev, entries in enumerate(snap.get("device_traces", [])):
            if dev != self.device:
                self.other_device_entries += len(entries)
                continue
            n = len(entries)
            self.largest_chunk = max(self.largest_chunk, n)
            if n >= self.max_entries:
                self.note(f"chunk {self.chunks} filled the ring buffer ({n} entries): early entries of it may "
                          "be lost; raise --max-events")
            self.conv.feed(entries)
        return snap

    def mark(self, label: str) -> None:
        if self.writer is None and not self.follow_device:
            return
        self.drain()
        if self.writer is not None:
            self.writer.mark(label)

    seal = cudnn.seal       # without C++ stacks, cuDNN's plan searches flagged from the trace's shape

    def finish(self, exit_status: int = 0) -> dict:
        torch = self.torch
        self._hook.remove()
        self._unwrap_calls()
        self.pool_hooks.remove()
        self.compile_hooks.remove()
        snap = self.drain()
        torch.cuda.memory._record_memory_history(enabled=None)
        if self.writer is None:                     # a process that never allocated on a device: no trace
            return {}
        try:
            torch.cuda.synchronize()
        except Exception as e:              # a program that died inside a graph capture leaves its stream capturing
            self.note(f"torch.cuda.synchronize() failed at the end ({type(e).__name__}: {e}); counters read as they are")
        mstats = {k: v for k, v in torch.cuda.memory_stats(self.device).items()}
        self.memory["end"] = self._device_memory()
        self.memory["outside_peak"] = max(self.memory["outside_peak"], self.memory["end"]["outside"],
                                          self.memory["start"]["outside"])
        trace = self.close_trace({"device_memory": self.memory, **self.late_meta()})
        c = self.conv.counts
        real_allocs = mstats.get("allocation.all.allocated")
        if real_allocs is not None and real_allocs - self.allocs_before != c["alloc"]:
            self.note(f"trace has {c['alloc']} allocs, the allocator counted {real_allocs - self.allocs_before}"
                      + (f" after the {self.allocs_before} made before recording began" if self.allocs_before else ""))
        if c["unmatched_free"]:
            self.note(f"{c['unmatched_free']} frees of blocks allocated before recording began were skipped")
        pools = self.pool_hooks.summary()
        if self.private_pools and not pools["pools"]:
            self.note(f"{len(self.private_pools)} segments belong to private pools whose calls were not seen "
                      f"(no pool events recorded): allocsim validate says which figures cannot be trusted")
        if pools["late_capture_begins"]:
            self.note(f"{pools['late_capture_begins']} drains fell inside a capture into a new pool, whose begin is "
                      f"written at the capture's end: the requests drained there are not routed to it")
        if pools["checkpoint_restores"]:
            self.note(f"a private pool's state was restored from a checkpoint {pools['checkpoint_restores']} times "
                      f"(CUDA graph trees): the model re-makes the blocks by best fit, not at the checkpoint's "
                      f"addresses (allocsim validate says whether the segment calls still match)")
        if self.other_device_entries:
            self.note(f"{self.other_device_entries} entries on devices other than cuda:{self.device} not recorded")
        summary = self.trace_summary(trace)
        stderr(f"wrote {self.out}: {summary['events']} events, {summary['allocs']} allocs, "
               f"{self.steps} optimizer steps, {self.chunks} chunks")
        return self.write_stats({
            "exit_status": exit_status, "framework_version": torch.__version__, "device": trace.meta["device"],
            "allocator_settings": snap.get("allocator_settings", {}), "memory_stats": mstats,
            "device_memory": self.memory, "optimizer_steps": self.steps, "private_pool_segments": len(self.private_pools), "private_pools": pools,
            "compile_scopes": self.compile_hooks.summary(), "cache_releases": self.releases,
            "cache_releases_inferred": c["cache_releases_inferred"], "limits_set": self.limits,
            "chunks": self.chunks, "largest_chunk": self.largest_chunk,
            "max_entries": self.max_entries, "conversion": c, "trace_summary": summary})


def late_start(start: StartState, device: int) -> dict:
    """The metadata of a trace whose recording began with blocks already live (docs/recording.md): the importer's
    ``initial_segments`` and ``pre_existing``, and ``started_late``, which says what the trace then lacks."""
    blocks = sum(b[0] for b in start.blocks.values())
    reserved = sum(s["total_size"] for s in start.segments.values())
    missing = (f"recording began with {len(start.blocks)} blocks ({blocks:,} bytes) live in {len(start.segments)} "
               f"segments ({reserved:,} bytes) on cuda:{device}: the trace starts with them as pre-existing blocks "
               f"and initial segments; the order and call sites of their allocations, the segment calls and the "
               f"peaks before it are not in it, and allocsim validate's model places those blocks itself (unseeded)")
    return {"initial_segments": start.initial_segments(), "pre_existing": len(start.blocks),
            "started_late": {"blocks": len(start.blocks), "block_bytes": blocks, "segments": len(start.segments),
                             "reserved_bytes": reserved, "missing": missing}}


RECORDER = TorchRecorder
