"""The figures a replay reports, with the field's definitions (`docs/metrics.md`); `allocsim.report`
writes them for people and programs."""
from __future__ import annotations

from array import array
from bisect import bisect_right
from copy import copy
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from ..filenames import shown_name
from .sections import ALLOC_ROOT, FREE_ROOT, Sections, section_rows

#: The columns of a row (a compare/sweep cell, ``allocsim replay --json`` flattened), in table order.
COLUMNS = ["trace", "policy", "cap_bytes", "runtime", "options", "capacity_bytes", "completed", "load_bytes",
           "peak_allocated_bytes", "peak_reserved_bytes", "utilization", "fragmentation", "overhead_vs_load",
           "device_mallocs", "device_frees", "cache_flushes", "gc_incremental", "gc_full", "gc_time_seconds", "ooms",
           "first_oom_event", "caught_ooms", "alloc_time_seconds", "total_time_seconds", "device_time_seconds", "latency_p50", "latency_p99", "replay_seconds",
           "breakdown_at_peak"]


@dataclass
class OOMRecord:
    """One failed request: where, how big, and the state at that moment."""

    event: int
    size: int
    stream: int
    live_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    largest_free_fragmentation: float
    #: the recorded run failed this request too (an OOM record replayed); the walk went on past it
    recorded: bool = False
    #: why reserved > live requested bytes here (`breakdown`); None when the policy cannot say
    breakdown: dict | None = None
    #: the program survives this failure (an ALLOC flagged CATCHES_OOM, a cuDNN workspace try, or one inside a
    #: TRY scope): the walk went on without it (docs/allocator-dependent.md)
    caught: bool = False
    #: the label of the TRY scope that survived it (the try unwound), None if none
    scope: str | None = None

    def to_dict(self) -> dict:
        """`dataclasses.asdict`'s answer, made directly (a replay under a tight cap with ``--keep-going`` files tens
        of thousands, and asdict copied each field deeply: a quarter of such a replay)."""
        d = {name: getattr(self, name) for name in _OOM_FIELDS}
        if self.breakdown is not None:
            d["breakdown"] = dict(self.breakdown)       # flat: bytes by part
        return d


_OOM_FIELDS = [f.name for f in fields(OOMRecord)]


@dataclass
class ReplayResult:
    """One replay's figures, a plain record: `to_dict` is its JSON form; `allocsim.report` writes it."""

    policy: str
    runtime: str
    cap_bytes: int | None
    capacity_bytes: int | None
    trace: str | None
    options: dict
    events: int = 0
    driving_events: int = 0
    allocs: int = 0
    frees: int = 0
    completed: bool = True
    load_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    final_reserved_bytes: int = 0
    utilization: float = 0.0
    fragmentation: float = 0.0
    overhead_vs_load: float = 0.0
    largest_free_fragmentation_at_peak: float | None = 0.0
    device_mallocs: int = 0
    device_frees: int = 0
    device_malloc_bytes: int = 0
    device_free_bytes: int = 0
    cache_flushes: int = 0
    gc_incremental: int = 0
    gc_full: int = 0
    gc_time_seconds: float = 0.0
    gc_reclaimed_bytes: int = 0
    ooms: int = 0
    oom_events: list = field(default_factory=list)
    #: trace indices of the recorded OOMs this policy/setting served (they would not have happened)
    ooms_avoided: list = field(default_factory=list)
    #: OOMs the program survives (a request flagged CATCHES_OOM, or one inside a TRY scope): counted apart from
    #: ``ooms``, the walk went on past them
    caught_ooms: int = 0
    caught_oom_events: list = field(default_factory=list)
    #: what the tries those OOMs unwound dropped: blocks freed at the failure, later ALLOCs skipped up to the END
    unwound_blocks: int = 0
    skipped_allocs: int = 0
    alloc_time_seconds: float = 0.0
    total_time_seconds: float = 0.0
    #: the part of ``total_time_seconds`` spent in device calls (cudaMalloc, cudaFree and the sync it implies)
    device_time_seconds: float = 0.0
    latency: dict = field(default_factory=dict)
    latency_measured: bool = False     # True: wall time on a GPU; False: the cost model
    counters: dict = field(default_factory=dict)
    sections: list = field(default_factory=list)
    replay_seconds: float = 0.0        # wall time of the replay, set-up included (the trace already loaded)
    load_seconds: float = 0.0          # wall time loading the trace file (0 when handed a loaded trace)
    timeline: dict | None = None
    #: (lo, hi): the device limits under which this replay would go exactly the same way (`allocsim fit`)
    certified_limits: tuple | None = None
    #: why reserved > live requested bytes where reserved first reached its peak (`breakdown`, with the
    #: ``event``); None when the policy cannot say
    breakdown_at_peak: dict | None = None
    #: how much of the walk was folded (`allocsim.engine.fold`: events and steps skipped, the period): how the result
    #: was computed, not a figure of it, so left out of comparisons and of `to_dict`
    folded: dict | None = field(default=None, compare=False)

    @property
    def first_oom(self) -> OOMRecord | None:
        return self.oom_events[0] if self.oom_events else None

    def to_dict(self, *, timeline: bool = False) -> dict:
        """The JSON form: `dataclasses.asdict`'s, less ``certified_limits``, ``folded`` and (unless asked) the
        timeline; the OOM lists made by `OOMRecord.to_dict` (asdict copied every field of each deeply: a quarter of
        a replay that ran out tens of thousands of times under ``--keep-going``)."""
        ooms = {name: [o.to_dict() for o in getattr(self, name)] for name in ("oom_events", "caught_oom_events")}
        d = asdict(replace(self, oom_events=[], caught_oom_events=[]))
        d.pop("certified_limits")
        d.pop("folded")
        if not timeline:
            d.pop("timeline")
        d.update(ooms)
        return d


def _distinct(values: np.ndarray, counts: bool = False):
    """``numpy.unique(values)`` (and ``return_counts``) by its own steps, a sort and a mask: numpy 2.4's `unique`
    took 11-13 ms on its first call in a process, a tenth of a replay of the embedded trace."""
    s = np.sort(values)
    first = np.concatenate(([True], s[1:] != s[:-1])) if len(s) else np.zeros(0, bool)
    if not counts:
        return s[first]
    at = np.flatnonzero(first)
    return s[at], np.diff(np.append(at, len(s)))


class LatencyLog:
    """Every malloc latency of a replay, in order, as small codes into a table of distinct values.

    Modeled latencies take a few distinct values: one byte each (two past 255
    values) instead of eight. The order is kept because the total is numpy's
    pairwise sum over the sequence, which depends on it; percentiles and the
    maximum come from the value -> count table. Measured latencies (more than
    65,535 distinct values) fall back to float64 codes-free storage, exact as
    before. `tests/test_golden.py` and `tests/test_engine.py` check the figures
    equal numpy's over the plain array.
    """

    def __init__(self):
        self.values: list[float] = []       # code -> latency
        self._sorted = np.zeros(0)          # the values ascending, and the code of each
        self._sorted_code = np.zeros(0, np.intp)
        self._chunks: list[np.ndarray] = []
        self._raw = False                   # True: chunks hold the latencies themselves
        self._offsets = None                # where each chunk starts in the sequence, made when needed
        self._tiled: dict[int, int] = {}    # chunk -> how many times over it holds its first part
        self._pending = array("d")          # latencies appended since the last chunk was coded (`extend`)
        self.count = 0

    def copy(self) -> "LatencyLog":
        """An equal log that shares nothing this one changes (`allocsim.engine.replay.Replay.checkpoint`): its chunks are
        never changed in place, only their list and the tiling index."""
        c = copy(self)
        c.values, c._chunks, c._tiled = self.values[:], self._chunks[:], dict(self._tiled)
        c._pending = array("d", self._pending)
        return c

    def extend(self, lat) -> None:
        """Append latencies (a float sequence). A short piece (a walk that stops at every step boundary, as a
        folding one does, hands one per step) is kept as it is until `PENDING` have gathered: coding a piece costs
        tens of microseconds whatever its length. The codes, and so every figure, do not depend on the pieces."""
        if not len(lat):
            return
        self.count += len(lat)
        if isinstance(lat, np.ndarray) or len(lat) + len(self._pending) > PENDING:
            self._flush()
            self._code(lat)
        else:
            self._pending.extend(lat)

    def _flush(self) -> None:
        """Code the pending latencies (before anything reads the chunks)."""
        if len(self._pending):
            self._code(self._pending)
            self._pending = array("d")

    def _code(self, lat) -> None:
        """Append one chunk: the latencies' codes (new distinct values take the next ones)."""
        self._offsets = None
        if self._raw:
            self._chunks.append(np.array(lat, np.float64))
            return
        lat = np.asarray(lat, np.float64)
        idx = np.minimum(np.searchsorted(self._sorted, lat), max(len(self._sorted) - 1, 0))
        known = self._sorted[idx] == lat if len(self._sorted) else np.zeros(len(lat), bool)
        if not known.all():             # new distinct values: give them the next codes
            new = _distinct(lat[~known])
            self.values += new.tolist()
            if len(self.values) > 65535:
                self._raw = True
                table = np.array(self.values)
                self._chunks = [table[c] for c in self._chunks] + [lat.copy()]
                return
            order = np.argsort(self.values, kind="stable")
            self._sorted, self._sorted_code = np.array(self.values)[order], order
            idx = np.searchsorted(self._sorted, lat)
        self._chunks.append(self._sorted_code[idx].astype(np.uint8 if len(self.values) <= 256 else np.uint16))

    def extend_repeated(self, lat, times: int) -> None:
        """Append the sequence ``lat`` ``times`` times over (the windows a fold repeats), coded once."""
        if times <= 0 or not len(lat):
            return
        self._flush()
        self.count += len(lat)
        self._code(lat)
        if times > 1:
            self._chunks[-1] = np.tile(self._chunks[-1], times)
            self._tiled[len(self._chunks) - 1] = times
            self.count += len(lat) * (times - 1)

    def _range(self, lo: int, n: int) -> np.ndarray:
        """Codes (or raw latencies) ``lo`` to ``lo + n`` of the sequence, gathered from the chunks."""
        self._flush()
        if self._offsets is None:
            self._offsets = np.cumsum([0] + [len(c) for c in self._chunks]).tolist()
        k = bisect_right(self._offsets, lo) - 1
        parts, end = [], lo + n
        while lo < end:
            base = self._offsets[k]
            take = self._chunks[k][lo - base:end - base]
            parts.append(take)
            lo += len(take)
            k += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def total(self) -> float:
        """``numpy.sum`` of the latencies in order: its pairwise tree, leaves of `_LEAF` decoded at a time."""
        self._flush()
        table = None if self._raw else np.array(self.values, np.float64)

        def pairwise(lo: int, n: int) -> float:
            if n <= _LEAF:
                part = self._range(lo, n)
                return float(np.sum(part if table is None else table[part]))
            half = n // 2
            half -= half % 8
            return pairwise(lo, half) + pairwise(lo + half, n - half)

        return pairwise(0, self.count) if self.count else 0.0

    def _sorted_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct latencies ascending and how many times each occurs."""
        self._flush()
        if self._raw:
            return _distinct(np.concatenate(self._chunks), counts=True)
        counts = np.zeros(len(self.values), np.int64)
        for n, c in enumerate(self._chunks):
            times = self._tiled.get(n, 1)
            counts += times * np.bincount(c[:len(c) // times], minlength=len(self.values))
        order = np.argsort(np.array(self.values, np.float64), kind="stable")
        keep = counts[order] > 0
        return np.array(self.values, np.float64)[order][keep], counts[order][keep]

    def quantiles(self, q) -> np.ndarray:
        """``numpy.quantile(latencies, q)`` (its default, linear method) from the value counts."""
        return self._quantiles(q, *self._sorted_counts())

    def _quantiles(self, q, values: np.ndarray, counts: np.ndarray) -> np.ndarray:
        n = self.count
        q = np.asarray(q, np.float64)
        virtual = (n - 1) * q                                  # numpy's virtual index for 'linear'
        prev = np.floor(virtual).astype(np.intp)
        nxt = prev + 1
        above, below = virtual >= n - 1, virtual < 0
        prev[above], nxt[above] = n - 1, n - 1
        prev[below], nxt[below] = 0, 0
        gamma = virtual - prev
        ends = np.cumsum(counts)                               # rank r holds values[searchsorted(ends, r, right)]
        a = values[np.searchsorted(ends, prev, side="right")]
        b = values[np.searchsorted(ends, nxt, side="right")]
        diff = b - a                                           # numpy's _lerp
        return np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)

    def summary(self) -> dict:
        """p50, p99, max, mean and count: what `latency_summary` gives on the plain array."""
        if not self.count:
            return {}
        values, counts = self._sorted_counts()
        p50, p99 = self._quantiles(np.true_divide([50, 99], 100), values, counts)
        return {"p50": float(p50), "p99": float(p99), "max": float(values[-1]),
                "mean": float(np.float64(self.total()) / self.count), "count": int(self.count)}


#: Latencies decoded at a time by `LatencyLog.total`.
_LEAF = 1 << 16

#: Latencies `LatencyLog.extend` gathers before it codes them.
PENDING = 1 << 14


def latency_summary(lat: np.ndarray) -> dict:
    if len(lat) == 0:
        return {}
    p50, p99 = np.percentile(lat, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "max": float(lat.max()), "mean": float(lat.mean()),
            "count": int(len(lat))}


#: The parts of `breakdown`, in the order reports show them.
PARTS = ("hard", "soft", "stream", "rounding")


def breakdown(reserved: int, allocated: int, requested: int, free: dict) -> dict:
    """Why reserved > requested (the live objects' requested bytes, held in blocks): the policy's free
    bytes (``free_breakdown``: ``hard``, ``soft``, ``stream``, summing to reserved - allocated) and the
    ``rounding`` inside allocated blocks (allocated - requested). The four add up to reserved - requested."""
    return {"reserved": reserved, "requested": requested, "hard": free["hard"], "soft": free["soft"],
            "stream": free["stream"], "rounding": allocated - requested}


def largest_free_fragmentation(reserved: int, allocated: int, largest_free: int | None) -> float | None:
    """RMM arena's external fragmentation: 1 - largest free block / total free bytes."""
    if largest_free is None:       # not observable (a real allocator)
        return None
    total_free = reserved - allocated
    if total_free <= 0:
        return 0.0
    return max(0.0, 1.0 - largest_free / total_free)


def _with_roots(stats: dict, trace_allocs: int, trace_frees: int, alloc_time: float, clock: float,
                eager: bool) -> dict:
    """A copy of the section ``stats`` with the two roots added: ``pooled alloc`` (every malloc's latency) and
    ``pooled free`` (the eager frees and whatever time the clock holds outside the other roots)."""
    roots = Sections()
    roots.stats = {k: list(v) for k, v in stats.items()}
    out = roots.stats
    other_roots = 0.0               # added in order, not by `sum`: Python 3.12's float sum is compensated,
    for k, v in out.items():        # and the figure must be the same bit for bit on every Python
        if len(k) == 1 and k[0] not in (ALLOC_ROOT, FREE_ROOT):
            other_roots += v[1]
    eager_free_time = max(0.0, clock - alloc_time - other_roots)
    roots.add(ALLOC_ROOT, alloc_time, trace_allocs, path=(ALLOC_ROOT,))
    gc_frees = sum(v[0] for k, v in out.items() if k[-1] == FREE_ROOT)
    eager_frees = max(0, trace_frees - gc_frees) if eager else 0
    if eager_frees or eager_free_time > 1e-12:
        roots.add(FREE_ROOT, eager_free_time, eager_frees, path=(FREE_ROOT,))
    return out


def assemble_result(walk, *, policy, runtime, device, trace, stats: dict, allocs: int, frees: int,
                    breakdown_at_peak: dict | None, timeline: bool) -> ReplayResult:
    """The `ReplayResult` of a replay, from what its pieces hold at the end (or so far): the walk's peaks,
    counts, OOMs and latencies (``walk``, `allocsim.engine.replay`'s), the policy's name, options and counters, the
    runtime's collections, the device's calls and the section ``stats`` (with the policy's hot-path totals
    in). It reads them and changes none (a result taken mid-replay leaves the replay as it was)."""
    pol, rt, dev, w = policy, runtime, device, walk
    counters = pol.counters()
    alloc_time = w.latency.total()
    ooms = w.ooms
    res = ReplayResult(
        policy=pol.name or type(pol).__name__, runtime=rt.name, cap_bytes=dev.cap, capacity_bytes=dev.capacity,
        trace=shown_name(trace.path),
        options=pol.changed_options(pol.options),
        events=len(trace), driving_events=w.done, allocs=allocs, frees=frees, completed=not w.stopped,
        load_bytes=trace.load_bytes,
        peak_allocated_bytes=pol.peak_allocated_override or w.peak_alloc,     # real allocators report their own
        peak_reserved_bytes=dev.peak_reserved, final_reserved_bytes=dev.reserved,
        largest_free_fragmentation_at_peak=w.frag_at_peak,
        device_mallocs=dev.n_malloc, device_frees=dev.n_free, device_malloc_bytes=dev.bytes_malloc,
        device_free_bytes=dev.bytes_free, cache_flushes=int(counters.get("cache_flushes", 0)),
        gc_incremental=rt.gc_incremental, gc_full=rt.gc_full, gc_time_seconds=rt.gc_time,
        gc_reclaimed_bytes=rt.reclaimed_bytes, ooms=len(ooms), oom_events=list(ooms),
        ooms_avoided=[at for at, _, _ in w.served], caught_ooms=len(w.caught), caught_oom_events=list(w.caught),
        unwound_blocks=w.unwound, skipped_allocs=w.skipped_allocs,
        alloc_time_seconds=alloc_time,
        total_time_seconds=dev.clock, device_time_seconds=dev.malloc_time + dev.free_time, latency=w.latency.summary(), counters=counters,
        latency_measured=pol.real_gpu or dev.measured,
        sections=section_rows(_with_roots(stats, allocs, frees, alloc_time, dev.clock, rt.eager)),
        certified_limits=dev.certified(),
        breakdown_at_peak=breakdown_at_peak,
    )
    if res.peak_reserved_bytes:
        res.utilization = res.peak_allocated_bytes / res.peak_reserved_bytes
        res.fragmentation = 1.0 - res.utilization
    if res.load_bytes:
        res.overhead_vs_load = res.peak_reserved_bytes / res.load_bytes - 1.0
    if timeline:
        tl_idx, tl_alloc, tl_res = w.timeline
        res.timeline = {"event": list(tl_idx), "allocated": list(tl_alloc), "reserved": list(tl_res),
                        "latency_quantiles": w.latency.quantiles(np.linspace(0, 1, 501)).tolist()
                        if w.latency.count else [],
                        "oom_events": [o.event for o in ooms]}
    return res
