"""The figures a replay reports, with the field's definitions (`docs/metrics.md`); `allocsim.report`
writes them for people and programs."""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import asdict, dataclass, field

import numpy as np


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
    alloc_time_seconds: float = 0.0
    total_time_seconds: float = 0.0
    latency: dict = field(default_factory=dict)
    latency_measured: bool = False     # True: wall time on a GPU; False: the cost model
    counters: dict = field(default_factory=dict)
    sections: list = field(default_factory=list)
    replay_seconds: float = 0.0        # wall time of the replay, set-up included (the trace already loaded)
    load_seconds: float = 0.0          # wall time loading the trace file (0 when handed a loaded trace)
    timeline: dict | None = None
    section_table: str = ""
    #: (lo, hi): the device limits under which this replay would go exactly the same way (`allocsim fit`)
    certified_limits: tuple | None = None
    #: why reserved > live requested bytes where reserved first reached its peak (`breakdown`, with the
    #: ``event``); None when the policy cannot say
    breakdown_at_peak: dict | None = None

    @property
    def first_oom(self) -> OOMRecord | None:
        return self.oom_events[0] if self.oom_events else None

    def to_dict(self, *, timeline: bool = False) -> dict:
        d = asdict(self)
        d.pop("section_table")
        d.pop("certified_limits")
        if not timeline:
            d.pop("timeline")
        return d

    def summary(self) -> str:
        """The human summary printed by ``allocsim replay`` (`report.text.replay_summary`)."""
        from .report.text import replay_summary
        return replay_summary(self)


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
        self.count = 0

    def extend(self, lat) -> None:
        """Append a chunk of latencies (a float sequence)."""
        if not len(lat):
            return
        self.count += len(lat)
        self._offsets = None
        if self._raw:
            self._chunks.append(np.array(lat, np.float64))
            return
        lat = np.asarray(lat, np.float64)
        idx = np.minimum(np.searchsorted(self._sorted, lat), max(len(self._sorted) - 1, 0))
        known = self._sorted[idx] == lat if len(self._sorted) else np.zeros(len(lat), bool)
        if not known.all():             # new distinct values: give them the next codes
            new = np.unique(lat[~known])
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

    def _range(self, lo: int, n: int) -> np.ndarray:
        """Codes (or raw latencies) ``lo`` to ``lo + n`` of the sequence, gathered from the chunks."""
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
        if self._raw:
            return np.unique(np.concatenate(self._chunks), return_counts=True)
        counts = np.zeros(len(self.values), np.int64)
        for c in self._chunks:
            counts += np.bincount(c, minlength=len(self.values))
        order = np.argsort(np.array(self.values, np.float64), kind="stable")
        keep = counts[order] > 0
        return np.array(self.values, np.float64)[order][keep], counts[order][keep]

    def quantiles(self, q) -> np.ndarray:
        """``numpy.quantile(latencies, q)`` (its default, linear method) from the value counts."""
        values, counts = self._sorted_counts()
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
        p50, p99 = self.quantiles(np.true_divide([50, 99], 100))
        values, _ = self._sorted_counts()
        return {"p50": float(p50), "p99": float(p99), "max": float(values[-1]),
                "mean": float(np.float64(self.total()) / self.count), "count": int(self.count)}


#: Latencies decoded at a time by `LatencyLog.total`.
_LEAF = 1 << 16


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
