"""The replay engine: walk the driving events once, in order, through a runtime into a policy.

The loop is the hot path. It touches only plain Python lists made from the
trace's columns a chunk of records at a time, binds every method it calls to a
local, and tracks just what cannot be derived afterwards: peak allocated and
reserved (with the free-space shape at the reserved peak), per-malloc modeled
latency, and OOMs. Live bytes (at an OOM) and LOAD come from the trace itself
(`LiveBytes`, `Trace.load_bytes`), vectorised a chunk at a time.

Memory is bounded by the live state, not the trace length: the id -> handle table
holds live ids only, the lists are one chunk's, and latencies are kept as one-byte
codes (`LatencyLog`; the exact total needs their order).
"""
from __future__ import annotations

import time
from array import array
from contextlib import nullcontext

import numpy as np

from .costs import CostModel
from .device import SimulatedDevice
from .errors import UsageError
from .metrics import LatencyLog, OOMRecord, ReplayResult, largest_free_fragmentation
from .runtime import RUNTIMES
from .sections import ALLOC_ROOT, FREE_ROOT, Sections
from .spec import PolicySpec, check_overrides_reached, plugin_errors
from .trace import ALLOC, FREE, SEGMENT_ALLOC, Trace
from .trace.trace import LiveBytes


def trace_capacity(trace: Trace) -> int | None:
    """The recorded device's total memory, if the trace's metadata names it."""
    dev = trace.meta.get("device") or {}
    total = dev.get("total_memory") if isinstance(dev, dict) else None
    return int(total) if total else None


def recorded_segments(trace: Trace) -> list[tuple[int, int]]:
    """``(size, address)`` of the recorded allocator's segment allocations, in order."""
    out = []
    for _, rec in trace._chunks():
        seg = rec[rec["kind"] == SEGMENT_ALLOC]
        out += zip(seg["size"].tolist(), seg["addr"].tolist())
    return out


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
                                 address_hints=(recorded_segments(trace) if cls.framework ==
                                                trace.meta.get("framework") else []) if cls.framework else None)
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
    """What the walk over the driving events keeps: peaks, counts, OOMs, where it stopped, latencies."""

    def __init__(self):
        self.peak_alloc = self.peak_res = 0
        self.frag_at_peak = 0.0
        self.n_allocs = self.n_frees = 0
        self.ooms: list[OOMRecord] = []
        self.done = 0                # driving events walked, set at the end
        self.stopped = False
        self.latency = LatencyLog()
        self.since_gc = 0
        self.timeline = (array("q"), array("q"), array("q"))


class _Chunk:
    """The driving events of one chunk of records, as lists, and their trace indices."""

    def __init__(self, at, kind, is_alloc, ids, sizes, streams, times):
        self.at = at                # trace index of each driving event (numpy int64)
        self.kind, self.is_alloc = kind, is_alloc
        self.ids, self.sizes, self.streams, self.times = ids, sizes, streams, times
        self.alloc_at = None        # positions of the ALLOCs, made at the lean walk's first OOM here


def _driving(trace: Trace, zero_counts: list):
    """Yield ``(start, records, is_alloc, local)`` per `CHUNK` records: ``local`` are the
    positions of the driving events, 0-byte ALLOCs and their FREEs left out.

    Every allocator modeled here bypasses its pool for 0-byte requests. The ids of
    live 0-byte objects are the only state carried between chunks; ``zero_counts``
    collects ``(trace index, is ALLOC)`` arrays of the bypassed events for `_run` to count.
    """
    zero_live = np.zeros(0, np.int64)       # ids of live 0-byte objects, sorted
    for start, rec in trace._chunks():
        kind = rec["kind"]
        is_alloc = kind == ALLOC
        is_free = kind == FREE
        zero = is_alloc & (rec["size"] == 0)
        if zero.any() or len(zero_live):
            ids = rec["id"].astype(np.int64)
            zero_live = np.union1d(zero_live, ids[zero])
            zero_free = is_free & np.isin(ids, zero_live)
            zero_live = np.setdiff1d(zero_live, ids[zero_free])
            skipped = np.flatnonzero(zero | zero_free)
            if len(skipped):
                zero_counts.append((skipped + start, zero[skipped]))
            is_alloc = is_alloc & ~zero
            is_free = is_free & ~zero_free
        local = np.flatnonzero(is_alloc | is_free)
        if len(local):
            yield start, rec, is_alloc, local


def _driving_chunks(trace: Trace, *, times: bool, zero_counts: list):
    """Yield a `_Chunk` of Python lists per chunk of records that holds driving events (see `_driving`)."""
    for start, rec, is_alloc, local in _driving(trace, zero_counts):
        yield _Chunk(local + start, rec["kind"][local].tolist(), is_alloc[local].tolist(), rec["id"][local].tolist(),
                     rec["size"][local].tolist(), rec["stream"][local].tolist(),
                     rec["time_ns"][local].tolist() if times else None)


def _fast_chunk(w, c, pol, dev, handles, lat_append, on_alloc, on_free, on_oom):
    """The lean walk over one chunk: no tick, timeline, observer, event index or periodic GC.

    The same steps as the general loop in `_general_walk`, minus the per-event checks for
    those features and the per-event counters: `_run` derives the number of allocs
    (one latency each) and frees (where the walk stopped, less the skipped frees)
    afterwards, and ``on_oom`` finds the event from the latency count.
    `tests/test_engine.py` checks that both walks give identical results.
    """
    malloc, free = pol.malloc, pol.free
    peak_alloc, peak_res = w.peak_alloc, w.peak_res
    pop = handles.pop
    for k, i, size, st in zip(c.is_alloc, c.ids, c.sizes, c.streams):
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
                on_alloc(i, size)
            a = pol.allocated
            if a > peak_alloc:
                peak_alloc = a
            r = dev.reserved
            if r > peak_res:
                peak_res = r
                w.frag_at_peak = largest_free_fragmentation(r, a, pol.largest_free())
        elif on_free is None:
            h = pop(i, None)
            if h is None:          # its ALLOC failed under --keep-going
                w.n_frees -= 1     # not a free: `_run` counts the others from where the walk ended
                continue
            free(h)
        elif i in handles:
            on_free(i)
        else:
            w.n_frees -= 1
    w.peak_alloc, w.peak_res = peak_alloc, peak_res


def _count_driving(trace: Trace) -> int:
    """How many driving events the walk will see (0-byte ALLOCs and their FREEs left out)."""
    return sum(len(local) for *_, local in _driving(trace, []))


def _run(trace, pol, rt, dev, sections, *, keep_going, timeline, progress, observer, log_events=False) -> ReplayResult:
    tick = pol.tick
    handles = {}                 # id -> handle, live objects only
    eager = rt.eager
    rt.attach(pol, handles)
    # policies that log what they do per event get the trace index of each ALLOC, when validate asks
    log_index = log_events and getattr(pol, "wants_event_index", False)

    on_alloc = None if eager else rt.on_alloc
    on_free = None if eager else rt.on_free
    gc_every = rt.gc_every or 0
    general = tick is not None or timeline or observer is not None or log_index or gc_every
    n_drive = _count_driving(trace) if general else None    # the lean walk counts as it goes
    w = _Walk()
    live = LiveBytes()           # live requested bytes, read up to each OOM
    zero_counts = []
    j0 = 0                       # driving events before this chunk

    def on_oom(j, size, stream) -> bool:
        """Record an OOM at driving event j of this chunk; True if the walk stops here."""
        ev_index = int(c.at[j])
        w.ooms.append(OOMRecord(ev_index, size, stream, live.at(trace.records, ev_index) - size, pol.allocated,
                                dev.reserved,
                                largest_free_fragmentation(dev.reserved, pol.allocated, pol.largest_free())))
        if keep_going:
            return False
        w.done, w.stopped = j0 + j + 1, True
        return True

    def on_lean_oom(size, stream) -> bool:
        """`on_oom` for the lean walk: the failed ALLOC is the one whose latency was just appended."""
        if c.alloc_at is None:
            c.alloc_at = np.flatnonzero(c.is_alloc).tolist()
        return on_oom(c.alloc_at[len(lat) - 1], size, stream)

    for c in _driving_chunks(trace, times=tick is not None, zero_counts=zero_counts):
        lat = array("d")
        if general:
            _general_walk(w, c, j0, n_drive, log_index, pol, rt, dev, sections, handles, lat.append, on_alloc,
                          on_free, on_oom, tick, gc_every, timeline, observer, progress)
        else:
            _fast_chunk(w, c, pol, dev, handles, lat.append, on_alloc, on_free, on_lean_oom)
            if progress is not None:
                progress(j0 + len(c.at))
        w.latency.extend(lat)
        j0 += len(c.at)
        if w.stopped:
            break
    if n_drive is None:          # the lean walk saw every driving event, unless it stopped early
        n_drive = _count_driving(trace) if w.stopped else j0
    if not w.stopped:
        w.done = n_drive
    if not general:
        w.n_allocs = w.latency.count                # one latency per ALLOC walked
        w.n_frees += w.done - w.latency.count       # every other event walked is a FREE (less the skipped ones)
    if progress is not None:
        progress(n_drive)
    if zero_counts:                          # count the bypassed 0-byte requests the walk got past
        end = w.ooms[-1].event if w.stopped else len(trace)     # a walk stops only at the OOM just recorded
        for at, is_zero_alloc in zero_counts:
            passed = at < end
            n_zero_allocs = int(np.count_nonzero(is_zero_alloc[passed]))
            w.n_allocs += n_zero_allocs
            w.n_frees += int(np.count_nonzero(passed)) - n_zero_allocs
    peak_alloc, n_allocs, n_frees, ooms, done = w.peak_alloc, w.n_allocs, w.n_frees, w.ooms, w.done
    frag_at_peak = w.frag_at_peak

    pol.finish()
    peak_alloc = getattr(pol, "peak_allocated_override", None) or peak_alloc   # real allocators report their own
    alloc_time = w.latency.total()
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
        total_time_seconds=dev.clock, latency=w.latency.summary(), counters=counters,
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
                        "latency_quantiles": w.latency.quantiles(np.linspace(0, 1, 501)).tolist() if w.latency.count else [],
                        "oom_events": [o.event for o in ooms]}
    return res


def _general_walk(w, c, j0, n_drive, log_index, pol, rt, dev, sections, handles, lat_append, on_alloc, on_free,
                  on_oom, tick, gc_every, timeline, observer, progress):
    """The walk over one chunk with every feature: tick, periodic GC, event index, timeline samples, observer.

    ``j0`` is the number of driving events before this chunk, ``n_drive`` their total.
    """
    malloc, free = pol.malloc, pol.free
    tl_idx, tl_alloc, tl_res = w.timeline
    tl_step = max(1, n_drive // 4000)
    prog_step = max(1, n_drive // 200)
    kinds, ids, sizes, streams, times, at = c.kind, c.ids, c.sizes, c.streams, c.times, c.at
    for jc in range(len(kinds)):
        j = j0 + jc
        i = ids[jc]
        if tick is not None:
            tick(times[jc])
        if kinds[jc] == ALLOC:
            size = sizes[jc]
            if gc_every:
                w.since_gc += size
                if w.since_gc >= gc_every:
                    w.since_gc = 0
                    sections.stack[:] = []
                    sections.push("gc(false) (periodic)", dev.clock)
                    rt.collect(False)
                    sections.pop(dev.clock)
                    sections.stack[:] = [ALLOC_ROOT]
            if log_index:
                pol.event_index = int(at[jc])
            before = dev.clock
            h = malloc(size, streams[jc])
            lat_append(dev.clock - before)
            w.n_allocs += 1
            if h is None:
                if on_oom(jc, size, streams[jc]):
                    break
                continue
            handles[i] = h
            if on_alloc is not None:
                on_alloc(i, size)
            a = pol.allocated
            if a > w.peak_alloc:
                w.peak_alloc = a
            r = dev.reserved
            if r > w.peak_res:
                w.peak_res = r
                w.frag_at_peak = largest_free_fragmentation(r, a, pol.largest_free())
        else:
            if i not in handles:   # its ALLOC failed under --keep-going
                continue
            w.n_frees += 1
            if on_free is None:
                h = handles.pop(i)
                free(h)
            else:
                h = handles[i]
                on_free(i)
        if timeline and (j % tl_step == 0 or dev.reserved != (tl_res[-1] if tl_res else -1)):
            tl_idx.append(int(at[jc]))
            tl_alloc.append(pol.allocated)
            tl_res.append(dev.reserved)
        if observer is not None:
            observer(int(at[jc]), kinds[jc], i, h)
        if progress is not None and j % prog_step == 0:
            progress(j)
