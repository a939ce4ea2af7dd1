"""CuPy recorder: observes the program's own memory pool, never replaces it.

The program keeps the allocator CuPy installed at import, the default
``MemoryPool``: its limit, its cache and its counters are the ones the program
uses and reads. What the recorder adds for the run (all removed at the end):

- a `MemoryHook` (hooks fire for every pool): ``malloc_postprocess`` records
  each request (ALLOC with the requested size; the pool's rounded size is kept
  in ``aux`` in 512-byte units, CuPy's rounding unit) and ``free_postprocess``
  each return to the pool (FREE, paired by ``pmem_id``: a free closes the most
  recent open malloc with that id, since Python reuses ids). A request that
  raised is an OOM record (size = request, addr = device free bytes) and no
  ALLOC; a 0-byte request (a null pointer, never freed) is an ALLOC of 0.
  ``alloc_postprocess`` is the pool's ``cudaMalloc``: a SEGMENT_ALLOC.
- Segment frees fire no hook (``free_all_blocks`` drops whole free chunks and
  ``cudaFree`` runs when their memory object dies). They are read from the
  pool's own ``total_bytes()``: when it falls, the segments that held no live
  chunk were released (a segment is released only whole, once every chunk of it
  is free and merged), and the fall must equal their bytes (a note otherwise).
  It is checked before and after each request: the pool's limit and OOM paths
  release inside a request, so a segment the request got upstream is written
  after those frees, and the request after it.
- ``cupy.get_default_memory_pool()`` returns a view of that same pool whose
  ``set_limit`` is a SET_LIMIT record (aux 1, size = the limit now in force) and
  whose ``free_all_blocks(stream)`` is a CACHE_RELEASE (aux 1, on that stream),
  before the segment frees it causes. Every other attribute is the pool's. A
  release or limit change made another way is still seen at the next request
  (a CACHE_RELEASE on stream 0 / a SET_LIMIT), with a note.
- a ``gc.callbacks`` entry: each Python collection is a GC event (aux 1 when
  it is a full, generation-2, collection), placed at its start so that the frees
  it causes follow it.
- frees made *inside* a request: between its ``malloc_preprocess`` and its
  ``malloc_postprocess``, after the pool's best-fit lookup, the only Python code
  that runs is the ``gc.collect()`` of the pool's limit and OOM paths
  (``_try_malloc``, docs/models/cupy.md) and the recorder's own hooks. The arrays
  such a collection frees (ones in reference cycles) are FREEs flagged
  ``IN_REQUEST`` with aux = which collection of the request freed them (1, 2;
  0: none), written before the ALLOC (or OOM) of that request: the replay hands
  them to the pool at that collection, not before the lookup. Python's automatic
  collections are paused inside a request (``gc.disable()`` from the pre hook to
  the post hook, when the program had them on), so that one due there runs just
  after the request, as it would without hooks (Python 3.12 runs a due
  collection at the next bytecode boundary, which without the recorder's Python
  hooks is after the request).

Events stream to the file as they happen. Times come from one monotonic clock
read in each callback. Hooks are thread-local: other threads are not seen; a
program that installs a pool of its own has its requests recorded, but only
the default pool's releases (a note says so).
"""
from __future__ import annotations

import bisect
import gc
import time

from ...errors import GPUUnavailable
from ...trace import events as ev
from ...trace.events import CUPY_AUX
from ._base import Recorder, stderr

ROUND_UNIT = 512


class PoolView:
    """The program's default pool, with `set_limit` and `free_all_blocks` recorded as they are called."""

    __slots__ = ("_pool", "_rec")

    def __init__(self, pool, rec):
        object.__setattr__(self, "_pool", pool)
        object.__setattr__(self, "_rec", rec)

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def __setattr__(self, name, value):
        setattr(self._pool, name, value)

    def __repr__(self):
        return repr(self._pool)

    def set_limit(self, size=None, fraction=None):
        self._pool.set_limit(size=size, fraction=fraction)
        if self._rec.w is not None:
            self._rec.record_limit()

    def free_all_blocks(self, stream=None):
        rec = self._rec
        if rec.w is not None:
            rec.cache_release(stream)
        self._pool.free_all_blocks(stream=stream)
        if rec.w is not None:
            rec.sync_segments()


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
        self.pool = cupy.get_default_memory_pool()
        meta = {**self.base_meta(), "framework_version": cupy.__version__,
                "cuda_version": runtime.runtimeGetVersion(),
                "device": {"index": dev.id, "name": name.decode() if isinstance(name, bytes) else str(name),
                           "total_memory": int(props["totalGlobalMem"])},
                "allocator": "cupy-pool", "alloc_aux": "rounded size in 512-byte units"}
        self.w = self.open_trace(meta)
        self.open: dict[int, list[int]] = {}        # pmem_id -> ids of open mallocs, most recent last
        self.chunk_at: dict[int, int] = {}          # id of a live chunk -> its address
        self.bases: list[int] = []                  # live segments' addresses, sorted
        self.segments: dict[int, list] = {}         # segment address -> [bytes, stream, live chunks]
        self.reserved = self.pool.total_bytes()     # what the events account for (0 unless CuPy ran before)
        self.counts = {"malloc": 0, "zero_malloc": 0, "free": 0, "failed_malloc": 0, "unmatched_free": 0,
                       "segment_alloc": 0, "failed_upstream": 0, "segment_free": 0, "gc": 0, "cache_release": 0,
                       "set_limit": 0, "unseen_release": 0, "unseen_limit": 0,
                       "free_in_request": 0, "gc_in_request": 0}
        if self.reserved:
            self.note(f"the pool held {self.reserved} bytes before recording began; their segments are not in "
                      "the trace")
        self.held = None                            # a segment got upstream by the request in progress
        self.release_stream = None                  # the stream a program's free_all_blocks named
        self.unexplained = 0                        # bytes the total_bytes() changes and the segments disagree by
        self.limit = 0
        self.request_gcs = -1                       # inside a request: the collections started in it; else -1
        self.request_depth = 0                      # requests in progress (one made by a finalizer nests)
        self.gc_paused = False                      # automatic collections paused by the recorder for the request
        if self.pool.get_limit():                   # CUPY_GPU_MEMORY_LIMIT, or a limit set before recording
            self.record_limit()
        rec = self

        class Hook(memory_hook.MemoryHook):
            name = "allocsim-record"

            def malloc_preprocess(self, **kw):
                rec._before_request()
                rec._enter_request()

            def malloc_postprocess(self, **kw):
                rec._leave_request()
                rec._on_malloc(kw)

            def free_postprocess(self, **kw):
                rec._on_free(kw)

            def alloc_postprocess(self, **kw):
                rec._on_upstream_alloc(kw)

        self.view = PoolView(self.pool, self)
        self.prev_get_pool = cupy.get_default_memory_pool
        cupy.get_default_memory_pool = lambda: self.view
        self.hook = Hook()
        self.hook.__enter__()
        gc.callbacks.append(self._on_gc)

    # ---- the program's own calls on its pool ----------------------------------------------------
    def record_limit(self) -> None:
        """A SET_LIMIT with the limit now in force (0: none)."""
        self.limit = self.pool.get_limit()
        self.w.record(ev.SET_LIMIT, size=self.limit, aux=CUPY_AUX, t=self._now())
        self.counts["set_limit"] += 1

    def cache_release(self, stream) -> None:
        """The program called ``free_all_blocks(stream)``: a CACHE_RELEASE before the frees it causes."""
        self.w.record(ev.CACHE_RELEASE, aux=CUPY_AUX, stream=stream.ptr if stream is not None else 0,
                      t=self._now())
        self.counts["cache_release"] += 1
        self.release_stream = None if stream is None else stream.ptr

    def sync_segments(self, held: int = 0) -> None:
        """Write the SEGMENT_FREEs that explain a fall of the pool's ``total_bytes()`` (see the module docstring).

        ``held``: bytes of a segment got upstream but not yet in `segments`.
        """
        total = self.pool.total_bytes() - held
        only, self.release_stream = self.release_stream, None
        if total >= self.reserved:
            self.unexplained += total - self.reserved
            self.reserved = total
            return
        freed = [b for b in self.bases if not self.segments[b][2] and (only is None or self.segments[b][1] == only)]
        t = self._now()
        for b in freed:
            size, stream, _ = self.segments.pop(b)
            self.w.segment(ev.SEGMENT_FREE, b, size, stream, t=t)
            self.counts["segment_free"] += 1
            self.reserved -= size
        if freed:
            self.bases = [b for b in self.bases if b in self.segments]
        self.unexplained += abs(self.reserved - total)
        self.reserved = total

    def _segment_of(self, ptr: int):
        k = bisect.bisect_right(self.bases, ptr) - 1
        if k >= 0:
            seg = self.segments[self.bases[k]]
            if ptr < self.bases[k] + seg[0]:
                return seg
        return None

    # ---- hook callbacks (hot path: a few dict operations and one record each) ----------------------
    def _enter_request(self) -> None:
        """The pool's lookup comes next: frees from here to `_leave_request` are inside the request (the outermost
        one, where a finalizer run by its collection makes a request of its own)."""
        self.request_depth += 1
        if self.request_depth > 1:
            return
        self.request_gcs = 0
        if gc.isenabled():
            gc.disable()
            self.gc_paused = True

    def _leave_request(self) -> None:
        self.request_depth = max(0, self.request_depth - 1)
        if self.request_depth:
            return
        self.request_gcs = -1
        if self.gc_paused:
            self.gc_paused = False
            gc.enable()

    def _before_request(self) -> None:
        if self.w is None:
            return
        if self.pool.get_limit() != self.limit:
            self.counts["unseen_limit"] += 1
            self.record_limit()
        if self.pool.total_bytes() < self.reserved:     # a release the view did not see
            self.counts["unseen_release"] += 1
            self.cache_release(None)
            self.sync_segments()

    def _on_malloc(self, kw) -> None:
        w = self.w
        if w is None:
            return
        size, rounded, ptr = kw["size"], kw["mem_size"], kw["mem_ptr"]
        stream = self.cupy.cuda.get_current_stream().ptr
        held, self.held = self.held, None
        self.sync_segments(held[1] if held else 0)  # the limit and OOM paths release inside the request
        if held is not None:
            self._add_segment(*held, stream)
        if not ptr and rounded == 0:
            # A 0-byte request: CuPy hands back a null pointer without touching the pool, and no
            # free hook ever fires for it. It is a request, not a failure.
            w.alloc(0, stream, t=self._now())
            self.counts["zero_malloc"] += 1
            return
        if not ptr:
            w.oom(size, device_free=self.cupy.cuda.runtime.memGetInfo()[0], stream=stream, t=self._now())
            self.counts["failed_malloc"] += 1
            return
        i = w.next_id
        w.next_id += 1
        w.record(ev.ALLOC, id_=i, stream=stream, size=size, aux=rounded // ROUND_UNIT, t=self._now(), addr=ptr)
        self.open.setdefault(kw["pmem_id"], []).append(i)
        self.chunk_at[i] = ptr
        seg = self._segment_of(ptr)
        if seg is not None:
            seg[2] += 1
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
        seg = self._segment_of(self.chunk_at.pop(i))
        if seg is not None:
            seg[2] -= 1
        n = self.request_gcs
        if n < 0:
            self.w.free(i, t=self._now(), addr=kw["mem_ptr"])
        else:
            self.w.record(ev.FREE, flags=ev.IN_REQUEST, aux=n, id_=i, t=self._now(), addr=kw["mem_ptr"])
            self.counts["free_in_request"] += 1
        self.counts["free"] += 1

    def _on_upstream_alloc(self, kw) -> None:
        if self.w is None:
            return
        ptr, size = kw["mem_ptr"], kw["mem_size"]
        if not ptr:                                 # a failed attempt: the pool releases and retries
            self.counts["failed_upstream"] += 1
            return
        self.held = (ptr, size)                     # written by _on_malloc, after the frees made before it

    def _add_segment(self, ptr: int, size: int, stream: int) -> None:
        self.segments[ptr] = [size, stream, 0]
        bisect.insort(self.bases, ptr)
        self.reserved += size
        self.w.segment(ev.SEGMENT_ALLOC, ptr, size, stream, t=self._now())
        self.counts["segment_alloc"] += 1

    def _on_gc(self, phase, info) -> None:
        if phase == "start" and self.w is not None:
            self.w.gc(info.get("generation") == 2, t=self._now())
            self.counts["gc"] += 1
            if self.request_gcs >= 0:
                self.request_gcs += 1
                self.counts["gc_in_request"] += 1

    def mark(self, label: str) -> None:
        if self.w is not None:
            self.w.mark(label, t=self._now())

    # ---- end ------------------------------------------------------------------------------------
    def finish(self, exit_status: int = 0) -> dict:
        cupy = self.cupy
        gc.callbacks.remove(self._on_gc)
        self.hook.__exit__(None, None, None)
        self.request_depth = min(self.request_depth, 1)
        self._leave_request()                       # an exit from inside a request (a hook raised)
        cupy.get_default_memory_pool = self.prev_get_pool
        cupy.cuda.Device().synchronize()
        self._before_request()                      # a last release or limit change made after the last request
        pool = {"used_bytes": self.pool.used_bytes(), "total_bytes": self.pool.total_bytes(),
                "n_free_blocks": self.pool.n_free_blocks(), "limit": self.pool.get_limit(),
                "live_segments": len(self.segments), "live_segment_bytes": sum(s[0] for s in self.segments.values())}
        get = getattr(cupy.cuda, "get_allocator", None)
        if get is not None and getattr(get(), "__self__", self.pool) is not self.pool:
            self.note("the program's allocator at the end is not the default pool: releases of its own pool "
                      "are not recorded")
        self.w = None
        trace = self.close_trace()
        if self.counts["unmatched_free"]:
            self.note(f"{self.counts['unmatched_free']} frees of chunks allocated before recording were skipped")
        if self.unexplained:
            self.note(f"the pool's total_bytes() moved by {self.unexplained} bytes that its recorded segments "
                      "do not explain")
        for key, what in (("unseen_release", "cache releases"), ("unseen_limit", "limit changes")):
            if self.counts[key]:
                self.note(f"{self.counts[key]} {what} made other than through cupy.get_default_memory_pool() "
                          "were recorded at the next request")
        summary = self.trace_summary(trace)
        stderr(f"wrote {self.out}: {summary['events']} events, {summary['allocs']} allocs, "
               f"{summary['segment_allocs']} upstream allocs")
        return self.write_stats({"exit_status": exit_status, "framework_version": cupy.__version__,
                                 "device": trace.meta["device"], "pool": pool, "counts": self.counts,
                                 "trace_summary": summary})


RECORDER = CupyRecorder
