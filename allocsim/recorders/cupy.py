"""CuPy recorder: pool requests from a MemoryHook, upstream calls from a wrapped allocator.

What it installs for the program's run (all removed at the end):

- a `MemoryHook` whose ``malloc_postprocess`` / ``free_postprocess`` record every
  pool request (ALLOC with the requested size; the pool's rounded size is kept
  in ``aux`` in 512-byte units, CuPy's rounding unit) and every return to the
  pool (FREE). Frees are paired with mallocs by ``pmem_id`` in order: a free
  closes the most recent open malloc with that id (Python reuses ids once an
  object is gone). A dict of lists, O(1) per event, size = live chunks.
- a fresh ``MemoryPool`` as the current allocator, whose upstream is a
  ``PythonFunctionAllocator`` around ``cudaMalloc`` / ``cudaFree``: each call is
  a SEGMENT_ALLOC / SEGMENT_FREE, including the frees that hooks cannot see
  (``free_all_blocks``, the OOM path).
- a ``gc.callbacks`` entry: each Python collection is a GC event (aux 1 when it
  is a full, generation-2, collection), placed at its start so that the frees it
  causes follow it.

Events stream to the file as they happen (`TraceWriter` with a path, flushed
every few thousand records). Times come from one monotonic clock read in each
callback. Hooks are thread-local: allocations on other threads are not seen.
"""
from __future__ import annotations

import gc
import time

from ..errors import GPUUnavailable
from ..trace import events as ev
from ._base import Recorder, stderr

ROUND_UNIT = 512


class CupyRecorder(Recorder):
    framework = "cupy"

    @classmethod
    def check_gpu(cls) -> None:
        import cupy
        if not cupy.cuda.is_available():
            raise GPUUnavailable(f"cannot record: cupy {cupy.__version__} sees no CUDA GPU "
                                 "(cupy.cuda.is_available() is False)")

    def _now(self) -> int:
        return time.perf_counter_ns() - self.t0

    def start(self) -> None:
        import cupy
        from cupy.cuda import memory_hook, runtime
        self.cupy = cupy
        self.t0 = time.perf_counter_ns()
        dev = cupy.cuda.Device()
        props = runtime.getDeviceProperties(dev.id)
        name = props["name"]
        meta = {**self.base_meta(), "framework_version": cupy.__version__,
                "cuda_version": runtime.runtimeGetVersion(),
                "device": {"index": dev.id, "name": name.decode() if isinstance(name, bytes) else str(name),
                           "total_memory": int(props["totalGlobalMem"])},
                "allocator": "cupy-pool", "alloc_aux": "rounded size in 512-byte units"}
        self.w = self.open_trace(meta)
        self.open: dict[int, list[int]] = {}        # pmem_id -> ids of open mallocs, most recent last
        self.segments: dict[int, int] = {}          # upstream pointer -> bytes
        self.counts = {"malloc": 0, "zero_malloc": 0, "free": 0, "failed_malloc": 0, "unmatched_free": 0, "segment_alloc": 0,
                       "segment_free": 0, "gc": 0}
        rec = self

        class Hook(memory_hook.MemoryHook):
            name = "allocsim-record"

            def malloc_postprocess(self, **kw):
                rec._on_malloc(kw)

            def free_postprocess(self, **kw):
                rec._on_free(kw)

        self.pool = cupy.cuda.MemoryPool(cupy.cuda.PythonFunctionAllocator(self._upstream_malloc,
                                                                           self._upstream_free).malloc)
        get = getattr(cupy.cuda, "get_allocator", None)
        self.prev_allocator = get() if get else cupy.get_default_memory_pool().malloc
        cupy.cuda.set_allocator(self.pool.malloc)
        self.hook = Hook()
        self.hook.__enter__()
        gc.callbacks.append(self._on_gc)

    # ---- callbacks (hot path: one dict operation and one record each) -------------------------
    def _on_malloc(self, kw) -> None:
        w = self.w
        if w is None:
            return
        size, rounded, ptr = kw["size"], kw["mem_size"], kw["mem_ptr"]
        stream = self.cupy.cuda.get_current_stream().ptr
        if not ptr and rounded == 0:
            # A 0-byte request: CuPy hands back a null pointer without touching the pool, and no
            # free hook ever fires for it. It is a request, not a failure.
            w.alloc(0, stream, t=self._now())
            self.counts["zero_malloc"] += 1
            return
        if not ptr:
            w.alloc(size, stream, t=self._now(), flags=ev.FAILED)
            w.oom(rounded, stream=stream)
            self.counts["failed_malloc"] += 1
            return
        i = w.next_id
        w.next_id += 1
        w.record(ev.ALLOC, id_=i, stream=stream, size=size, aux=rounded // ROUND_UNIT, t=self._now(), addr=ptr)
        self.open.setdefault(kw["pmem_id"], []).append(i)
        self.counts["malloc"] += 1

    def _on_free(self, kw) -> None:
        if self.w is None:
            return
        ids = self.open.get(kw["pmem_id"])
        if not ids:
            self.counts["unmatched_free"] += 1
            return
        i = ids.pop()
        if not ids:
            del self.open[kw["pmem_id"]]
        self.w.free(i, t=self._now(), addr=kw["mem_ptr"])
        self.counts["free"] += 1

    def _upstream_malloc(self, size: int, device_id: int) -> int:
        ptr = self.cupy.cuda.runtime.malloc(size)     # raises CUDARuntimeError on OOM: the pool retries
        self.segments[ptr] = size
        if self.w is not None:
            self.w.segment(ev.SEGMENT_ALLOC, ptr, size, t=self._now())
            self.counts["segment_alloc"] += 1
        return ptr

    def _upstream_free(self, ptr: int, device_id: int) -> None:
        self.cupy.cuda.runtime.free(ptr)
        size = self.segments.pop(ptr, 0)
        if self.w is not None:
            self.w.segment(ev.SEGMENT_FREE, ptr, size, t=self._now())
            self.counts["segment_free"] += 1

    def _on_gc(self, phase, info) -> None:
        if phase == "start" and self.w is not None:
            self.w.gc(info.get("generation") == 2, t=self._now())
            self.counts["gc"] += 1

    def mark(self, label: str) -> None:
        if self.w is not None:
            self.w.mark(label, t=self._now())

    # ---- end ------------------------------------------------------------------------------------
    def finish(self, exit_status: int = 0) -> dict:
        cupy = self.cupy
        gc.callbacks.remove(self._on_gc)
        self.hook.__exit__(None, None, None)
        cupy.cuda.Device().synchronize()
        pool = {"used_bytes": self.pool.used_bytes(), "total_bytes": self.pool.total_bytes(),
                "n_free_blocks": self.pool.n_free_blocks(), "live_segments": len(self.segments),
                "live_segment_bytes": sum(self.segments.values())}
        cupy.cuda.set_allocator(self.prev_allocator)
        self.w = None
        trace = self.close_trace()
        if self.counts["unmatched_free"]:
            self.note(f"{self.counts['unmatched_free']} frees of chunks allocated before recording were skipped")
        summary = self.trace_summary(trace)
        stderr(f"wrote {self.out}: {summary['events']} events, {summary['allocs']} allocs, "
               f"{summary['segment_allocs']} upstream allocs")
        return self.write_stats({"exit_status": exit_status, "framework_version": cupy.__version__,
                                 "device": trace.meta["device"], "pool": pool, "counts": self.counts,
                                 "trace_summary": summary})


RECORDER = CupyRecorder
