"""The replay engine: walk the driving events once, in order, through a runtime into a policy.

The loop is the hot path. It touches only plain Python lists made once from the
trace's columns, binds every method it calls to a local, and tracks just what
cannot be derived afterwards: peak allocated and reserved (with the free-space
shape at the reserved peak), per-malloc modeled latency, and OOMs. Live bytes and
LOAD come from the trace itself (`Trace.live_curve`), vectorised.
"""
from __future__ import annotations

import time
from array import array
from contextlib import nullcontext

import numpy as np

from .costs import CostModel
from .device import SimulatedDevice
from .errors import UsageError
from .metrics import OOMRecord, ReplayResult, largest_free_fragmentation, latency_summary
from .runtime import RUNTIMES
from .sections import ALLOC_ROOT, FREE_ROOT, Sections
from .spec import PolicySpec, check_overrides_reached, plugin_errors
from .trace import ALLOC, FREE, SEGMENT_ALLOC, Trace



def trace_capacity(trace: Trace) -> int | None:
    """The recorded device's total memory, if the trace's metadata names it."""
    dev = trace.meta.get("device") or {}
    total = dev.get("total_memory") if isinstance(dev, dict) else None
    return int(total) if total else None


def recorded_segments(trace: Trace) -> list[tuple[int, int]]:
    """``(size, address)`` of the recorded allocator's segment allocations, in order."""
    seg = np.flatnonzero(np.asarray(trace.kind) == SEGMENT_ALLOC)
    return list(zip(trace.size[seg].tolist(), trace.addr[seg].tolist()))


def build(trace: Trace, policy, *, runtime: str = "eager", cap=None, capacity="trace", options=None,
          costs: CostModel | None = None, gc_every=None, device=None, backend: str = "sim", plan_progress=None):
    """Make (policy object, runtime, device, sections) ready to replay ``trace``.

    ``policy`` is what `PolicySpec.of` takes: ``"torch[expandable_segments:True]"``,
    ``"my.py:MyPool"``, a `PolicySpec` or a `Policy` subclass; ``options`` adds
    ``key=value`` texts or a dict of typed values. ``plan_progress(done, total)`` follows an
    offline policy's plan, made here (it can take minutes).
    """
    spec = PolicySpec.of(policy, options)
    cls = spec.policy_class()
    opts = spec.values()
    if runtime not in RUNTIMES:
        raise UsageError(f"unknown runtime {runtime!r} (known: {', '.join(RUNTIMES)})")
    if capacity == "trace":
        capacity = trace_capacity(trace)
    sections = Sections()
    if device is None and backend == "cuda" and not cls.real_gpu:
        from .gpu import CudaDevice
        device = CudaDevice(capacity=capacity, cap=cap, costs=costs)
    elif device is None:
        if backend not in ("sim", "cuda"):
            raise UsageError(f"unknown backend {backend!r} (known: sim, cuda)")
        device = SimulatedDevice(capacity=capacity, cap=cap, costs=costs or CostModel(),
                                 address_hints=recorded_segments(trace) if cls.framework and
                                 cls.framework == trace.meta.get("framework") else None)
    rt = RUNTIMES[runtime](device, sections, gc_every=gc_every)
    with plugin_errors(cls, spec.name, "being set up"):
        pol = cls(device, rt, sections, opts, trace=trace, **({"progress": plan_progress} if cls.offline else {}))
    check_overrides_reached(pol, spec.name)
    return pol, rt, device, sections


def replay(trace: Trace | str, policy="split", *, runtime: str = "eager", cap=None, capacity="trace",
           options=None, costs: CostModel | None = None, keep_going: bool = False, gc_every=None,
           timeline: bool = False, progress=None, device=None, observer=None, backend: str = "sim",
           log_events: bool = False, plan_progress=None) -> ReplayResult:
    """Replay ``trace`` against ``policy``; return its `ReplayResult`.

    ``capacity="trace"`` takes the device memory recorded in the trace (else
    unlimited). ``observer(event_index, kind, id, handle)`` is called after each
    driving event (tests use it to check invariants; it slows the replay).
    ``progress`` is a callable taking the number of driving events done; ``plan_progress(done, total)``
    follows an offline policy's plan before the walk.
    ``log_events=True`` gives policies that keep a per-event log (``wants_event_index``)
    the trace index of each ALLOC (`allocsim validate` asks for it; it slows the walk).
    ``backend="cuda"`` makes a simulated policy's device calls real `cudaMalloc`/`cudaFree`
    on this GPU (measured latency); real-allocator policies always run on the GPU.
    """
    loaded = 0.0
    if isinstance(trace, str):
        t_load = time.perf_counter()
        trace = Trace.load(trace)
        loaded = time.perf_counter() - t_load
    t_start = time.perf_counter()
    spec = PolicySpec.of(policy, options)
    pol, rt, dev, sections = build(trace, spec, runtime=runtime, cap=cap, capacity=capacity, costs=costs,
                                   gc_every=gc_every, device=device, backend=backend, plan_progress=plan_progress)
    # an observer's own assertions (allocsim.testing) pass through as they are
    with plugin_errors(type(pol), spec.name, "replaying") if observer is None else nullcontext():
        try:
            res = _run(trace, pol, rt, dev, sections, keep_going=keep_going, timeline=timeline, progress=progress,
                       observer=observer, log_events=log_events)
        finally:
            pol.close()
    res.load_seconds = loaded
    res.replay_seconds = time.perf_counter() - t_start      # the policy's set-up (an oracle's plan) included
    return res


class _Walk:
    """What the walk over the driving events keeps: peaks, counts, OOMs, where it stopped."""

    def __init__(self, n: int):
        self.peak_alloc = self.peak_res = 0
        self.frag_at_peak = 0.0
        self.n_allocs = self.n_frees = 0
        self.ooms: list[OOMRecord] = []
        self.done = n
        self.stopped = False


CHUNK = 1 << 16


def _fast_chunk(w, is_alloc, ids, sizes, streams, pol, dev, handles, lat_append, on_alloc, on_free, on_oom):
    """The lean walk over one chunk: no tick, timeline, observer, event index or periodic GC.

    The same steps as the general loop in `_general_walk`, minus the per-event checks for
    those features and the per-event counters: `_run` derives the number of allocs
    (one latency each) and frees (where the walk stopped, less the skipped frees)
    afterwards, and ``on_oom`` finds the event from the latency count.
    ``is_alloc`` holds one bool per event. `tests/test_engine.py` checks that both
    walks give identical results.
    """
    malloc, free = pol.malloc, pol.free
    peak_alloc, peak_res = w.peak_alloc, w.peak_res
    for k, i, size, st in zip(is_alloc, ids, sizes, streams):
        if k:
            before = dev.clock
            h = malloc(size, st)
            lat_append(dev.clock - before)
            if h is None:
                w.peak_alloc, w.peak_res = peak_alloc, peak_res
                if on_oom(size, st):
                    return
                continue
            handles[i] = h
            if on_alloc is not None:
                on_alloc(i)
            a = pol.allocated
            if a > peak_alloc:
                peak_alloc = a
            r = dev.reserved
            if r > peak_res:
                peak_res = r
                w.frag_at_peak = largest_free_fragmentation(r, a, pol.largest_free())
        else:
            h = handles[i]
            if h is None:          # its ALLOC failed under --keep-going
                w.n_frees -= 1     # not a free: `_run` counts the others from where the walk ended
                continue
            if on_free is None:
                handles[i] = None
                free(h)
            else:
                on_free(i)
    w.peak_alloc, w.peak_res = peak_alloc, peak_res


def _run(trace, pol, rt, dev, sections, *, keep_going, timeline, progress, observer, log_events=False) -> ReplayResult:
    kind_col = np.asarray(trace.kind)
    is_alloc = kind_col == ALLOC
    driving = is_alloc | (kind_col == FREE)
    # Every allocator modeled here bypasses its pool for 0-byte requests: drop them (and their frees).
    zero = is_alloc & (np.asarray(trace.size) == 0)
    zero_events = np.zeros(0, np.int64)      # trace indices of 0-byte ALLOCs and their FREEs
    if zero.any():
        zero_ids = np.zeros(trace.n_ids, bool)
        zero_ids[np.asarray(trace.id)[zero].astype(np.int64)] = True
        zero_free = (kind_col == FREE) & zero_ids[np.minimum(np.asarray(trace.id), max(trace.n_ids - 1, 0)).astype(np.int64)]
        zero_events = np.flatnonzero(zero | zero_free)
        driving &= ~zero & ~zero_free
    drive = np.flatnonzero(driving)
    n_drive = len(drive)
    tick = pol.tick
    times = trace.time_ns[drive].tolist() if tick is not None else None
    handles = [None] * trace.n_ids
    eager = rt.eager
    rt.attach(pol, handles, None if eager else trace.id_size.tolist())   # eager runtimes never look sizes up
    # policies that log what they do per event get the trace index of each ALLOC, when validate asks
    drive_idx = drive.tolist() if log_events and getattr(pol, "wants_event_index", False) else None

    on_alloc = None if eager else rt.on_alloc
    on_free = None if eager else rt.on_free
    gc_every = rt.gc_every or 0
    lat = array("d")
    lat_append = lat.append
    w = _Walk(n_drive)

    def on_oom(j, size, stream) -> bool:
        """Record an OOM at driving event j; True if the walk stops here."""
        ev_index = int(drive[j])
        w.ooms.append(OOMRecord(ev_index, size, stream, int(trace.live_curve[ev_index]) - size, pol.allocated,
                                dev.reserved,
                                largest_free_fragmentation(dev.reserved, pol.allocated, pol.largest_free())))
        if keep_going:
            return False
        w.done, w.stopped = j + 1, True
        return True

    alloc_at = []       # driving-event positions of the ALLOCs, made at the lean walk's first OOM

    def on_lean_oom(size, stream) -> bool:
        """`on_oom` for the lean walk: the failed ALLOC is the one whose latency was just appended."""
        if not alloc_at:
            alloc_at[:] = np.flatnonzero(is_alloc[drive]).tolist()
        return on_oom(alloc_at[len(lat) - 1], size, stream)

    general = tick is not None or timeline or observer is not None or drive_idx is not None or gc_every
    if not general:
        id_col, size_col, stream_col = trace.id, trace.size, trace.stream
        for j0 in range(0, n_drive, CHUNK):
            j1 = j0 + CHUNK
            at = drive[j0:j1]      # columns become lists a chunk at a time: their ints stay in cache
            _fast_chunk(w, is_alloc[at].tolist(), id_col[at].tolist(), size_col[at].tolist(), stream_col[at].tolist(),
                        pol, dev, handles, lat_append, on_alloc, on_free, on_lean_oom)
            if progress is not None:
                progress(min(j1, n_drive))
            if w.stopped:
                break
        w.n_allocs = len(lat)                       # one latency per ALLOC walked
        w.n_frees += w.done - len(lat)              # every other event walked is a FREE (less the skipped ones)
    else:
        kinds, ids, sizes, streams = (col[drive].tolist() for col in (kind_col, trace.id, trace.size, trace.stream))
        _general_walk(w, kinds, ids, sizes, streams, times, drive, drive_idx, pol, rt, dev, sections, handles,
                      lat_append, on_alloc, on_free, on_oom, tick, gc_every, timeline, observer, progress)
    if progress is not None:
        progress(n_drive)
    if len(zero_events):                     # count the bypassed 0-byte requests the walk got past
        end = int(drive[w.done - 1]) if w.stopped else len(trace)
        passed = zero_events[zero_events < end]
        n_zero_allocs = int(np.count_nonzero(kind_col[passed] == ALLOC))
        w.n_allocs += n_zero_allocs
        w.n_frees += len(passed) - n_zero_allocs
    peak_alloc, n_allocs, n_frees, ooms, done = w.peak_alloc, w.n_allocs, w.n_frees, w.ooms, w.done
    frag_at_peak = w.frag_at_peak

    pol.finish()
    peak_alloc = getattr(pol, "peak_allocated_override", None) or peak_alloc   # real allocators report their own
    lat_np = np.frombuffer(lat, dtype=np.float64) if len(lat) else np.zeros(0)
    alloc_time = float(lat_np.sum())
    gc_periodic = sum(v[1] for k, v in sections.stats.items() if len(k) == 1 and k[0] not in (ALLOC_ROOT, FREE_ROOT))
    eager_free_time = max(0.0, dev.clock - alloc_time - gc_periodic)
    sections.add(ALLOC_ROOT, alloc_time, n_allocs, path=(ALLOC_ROOT,))
    gc_frees = sum(v[0] for k, v in sections.stats.items() if k[-1] == FREE_ROOT)
    eager_frees = max(0, n_frees - gc_frees) if eager else 0
    if eager_frees or eager_free_time > 1e-12:
        sections.add(FREE_ROOT, eager_free_time, eager_frees, path=(FREE_ROOT,))

    counters = pol.counters()
    res = ReplayResult(
        policy=pol.name or type(pol).__name__, runtime=rt.name, cap_bytes=dev.cap, capacity_bytes=dev.capacity, trace=trace.path,
        options={k: v for k, v in pol.options.items() if any(p.name == k and p.default != v for p in pol.params)},
        events=len(trace), driving_events=done, allocs=n_allocs, frees=n_frees, completed=not ooms or keep_going,
        load_bytes=trace.load_bytes, peak_allocated_bytes=peak_alloc, peak_reserved_bytes=dev.peak_reserved,
        final_reserved_bytes=dev.reserved,
        largest_free_fragmentation_at_peak=frag_at_peak,
        device_mallocs=dev.n_malloc, device_frees=dev.n_free, device_malloc_bytes=dev.bytes_malloc,
        device_free_bytes=dev.bytes_free, cache_flushes=int(counters.get("cache_flushes", 0)),
        gc_incremental=rt.gc_incremental, gc_full=rt.gc_full, gc_time_seconds=rt.gc_time,
        gc_reclaimed_bytes=rt.reclaimed_bytes, ooms=len(ooms), oom_events=ooms, alloc_time_seconds=alloc_time,
        total_time_seconds=dev.clock, latency=latency_summary(lat_np), counters=counters,
        latency_measured=pol.real_gpu or getattr(dev, "measured", False),
        sections=sections.rows(), section_table=sections.table(),
        certified_limits=dev.certified() if hasattr(dev, "certified") else None,
    )
    if res.peak_reserved_bytes:
        res.utilization = res.peak_allocated_bytes / res.peak_reserved_bytes
        res.fragmentation = 1.0 - res.utilization
    if res.load_bytes:
        res.overhead_vs_load = res.peak_reserved_bytes / res.load_bytes - 1.0
    if timeline:
        tl_idx, tl_alloc, tl_res = w.timeline
        res.timeline = {"event": list(tl_idx), "allocated": list(tl_alloc), "reserved": list(tl_res),
                        "latency_quantiles": np.quantile(lat_np, np.linspace(0, 1, 501)).tolist() if len(lat_np) else [],
                        "oom_events": [o.event for o in ooms]}
    return res


def _general_walk(w, kinds, ids, sizes, streams, times, drive, drive_idx, pol, rt, dev, sections, handles,
                  lat_append, on_alloc, on_free, on_oom, tick, gc_every, timeline, observer, progress):
    """The walk with every feature: tick, periodic GC, event index, timeline samples, observer."""
    malloc, free = pol.malloc, pol.free
    since_gc = 0
    tl_idx, tl_alloc, tl_res = array("q"), array("q"), array("q")
    tl_step = max(1, len(kinds) // 4000)
    prog_step = max(1, len(kinds) // 200)
    for j in range(len(kinds)):
        i = ids[j]
        if tick is not None:
            tick(times[j])
        if kinds[j] == ALLOC:
            size = sizes[j]
            if gc_every:
                since_gc += size
                if since_gc >= gc_every:
                    since_gc = 0
                    sections.stack[:] = []
                    sections.push("gc(false) (periodic)", dev.clock)
                    rt.collect(False)
                    sections.pop(dev.clock)
                    sections.stack[:] = [ALLOC_ROOT]
            if drive_idx is not None:
                pol.event_index = drive_idx[j]
            before = dev.clock
            h = malloc(size, streams[j])
            lat_append(dev.clock - before)
            w.n_allocs += 1
            if h is None:
                if on_oom(j, size, streams[j]):
                    break
                continue
            handles[i] = h
            if on_alloc is not None:
                on_alloc(i)
            a = pol.allocated
            if a > w.peak_alloc:
                w.peak_alloc = a
            r = dev.reserved
            if r > w.peak_res:
                w.peak_res = r
                w.frag_at_peak = largest_free_fragmentation(r, a, pol.largest_free())
        else:
            h = handles[i]
            if h is None:          # its ALLOC failed under --keep-going
                continue
            w.n_frees += 1
            if on_free is None:
                handles[i] = None
                free(h)
            else:
                on_free(i)
        if timeline and (j % tl_step == 0 or dev.reserved != (tl_res[-1] if tl_res else -1)):
            tl_idx.append(int(drive[j]))
            tl_alloc.append(pol.allocated)
            tl_res.append(dev.reserved)
        if observer is not None:
            observer(int(drive[j]), kinds[j], i, h)
        if progress is not None and j % prog_step == 0:
            progress(j)
    w.timeline = (tl_idx, tl_alloc, tl_res)
