"""What a trace holds, without replaying it: the analysis `allocsim info` reports.

Events by kind, the request-size distribution (power-of-two histogram), LOAD,
iterations (from MARK events), streams, duration, what the recorded allocator
did upstream (SEGMENT events), the phases' shares of the requests and of LOAD
(`phases.phase_shares`), and the recording's metadata (`summarize`).

Cost: `Trace.load`'s validating pass over the records, a chunk at a time, which also finds
LOAD and feeds `Tally`, then one or two passes over the ALLOC sizes for the exact median (and one for
the phases of a trace that has some); nothing per event in Python. Memory: bounded by the live objects
(for LOAD), the size range and the distinct sizes above 4 MiB (`DistinctSizes`) and the MARKs, not by
the trace length.
"""
from __future__ import annotations

import numpy as np

from ..filenames import shown_name
from . import events as ev
from .phases import phase_shares
from .trace import Chunk

#: Upstream events that add (+1) or remove (-1) reserved bytes.
_SEGMENT_SIGN = {ev.SEGMENT_ALLOC: 1, ev.SEGMENT_MAP: 1, ev.SEGMENT_FREE: -1, ev.SEGMENT_UNMAP: -1}


def iterations(allocs_before_marks: np.ndarray, n_allocs: int) -> dict:
    """Allocations per iteration, an iteration being the events up to and including a MARK.

    ``allocs_before_marks``: ALLOCs before each MARK event, in order.
    """
    out = {"marks": int(len(allocs_before_marks))}
    if len(allocs_before_marks):
        per = np.diff(np.concatenate(([0], allocs_before_marks)))
        out.update(allocs_per_iteration_median=float(np.median(per)), allocs_per_iteration_min=int(per.min()),
                   allocs_per_iteration_max=int(per.max()),
                   allocs_after_last_mark=int(n_allocs - allocs_before_marks[-1]))
    return out


class DistinctSizes:
    """The set of request sizes seen, for their exact number without keeping every request.

    Sizes below `DENSE` (4 MiB) are flags in a boolean array grown to the largest one seen
    (at most 4 MiB of memory); larger ones, which real workloads repeat (a few weight and
    activation shapes), are a sorted array of distinct values, with new ones merged in
    batches. Memory: bounded by the size range and the distinct large sizes, not by the
    number of allocations.
    """

    DENSE = 1 << 22

    def __init__(self):
        self.small = np.zeros(0, bool)
        self.large = np.zeros(0, np.uint64)
        self._pending: list[np.ndarray] = []
        self._n_pending = 0

    def add(self, sizes: np.ndarray) -> None:
        """Add a sorted array of sizes."""
        cut = int(np.searchsorted(sizes, self.DENSE))
        if cut:
            top = int(sizes[cut - 1])
            if top >= len(self.small):
                grown = np.zeros(min(self.DENSE, max(top + 1, 2 * len(self.small))), bool)
                grown[:len(self.small)] = self.small
                self.small = grown
            self.small[sizes[:cut]] = True
        if cut < len(sizes):
            self._pending.append(sizes[cut:])
            self._n_pending += len(sizes) - cut
            if self._n_pending >= max(1 << 16, len(self.large) // 4):
                self._merge()

    def _merge(self) -> None:
        if self._pending:
            x = np.concatenate([self.large] + self._pending)
            x.sort()
            self.large = x[np.concatenate(([True], x[1:] != x[:-1]))]
            self._pending, self._n_pending = [], 0

    def __len__(self) -> int:
        self._merge()
        return int(np.count_nonzero(self.small)) + len(self.large)


def _alloc_sizes(trace):
    """Each chunk's ALLOC sizes (uint64), in trace order."""
    for start, rec in trace.chunks():
        yield Chunk(start, rec).alloc_sizes


def nth_alloc_size(trace, k: int, lo: int, hi: int) -> int:
    """The ``k``-th smallest (0-based) of the ALLOC sizes in [lo, hi): exact, in bounded memory.

    Each pass over the trace counts the candidates in 2**16 equal slices of the range
    and keeps only the slice holding the answer, so the range shrinks 65,536-fold a pass;
    once a slice is a single size, that is the answer. (Two passes for any range up to 4 GiB.)
    """
    while hi - lo > 1:
        shift = max(0, (hi - lo - 1).bit_length() - 16)
        counts = np.zeros(((hi - lo - 1) >> shift) + 1, np.int64)
        for sizes in _alloc_sizes(trace):
            v = sizes[(sizes >= lo) & (sizes < hi)] - np.uint64(lo)
            counts += np.bincount((v >> np.uint64(shift)).astype(np.intp), minlength=len(counts))
        below = np.cumsum(counts)
        j = int(np.searchsorted(below, k, side="right"))
        k -= int(below[j - 1]) if j else 0
        lo, hi = lo + (j << shift), min(hi, lo + ((j + 1) << shift))
    return lo


#: Lower edges of the size histogram's buckets: 0, then every power of two a uint64 holds. Bucket
#: ``[lo, 2 lo)`` (0-byte requests: ``[0, 1)``), its count and bytes; empty buckets are left out.
_EDGES = np.array([0] + [2 ** k for k in range(64)], np.uint64)


class Tally:
    """What `summarize` gathers in one pass over the records, a chunk at a time.

    A walker (`Trace.walk`): fed the chunks of the validating pass, so `info` reads the
    records once. Memory: the size histogram, the distinct sizes (`DistinctSizes`) and one
    entry per MARK; nothing per event.
    """

    def __init__(self):
        self.counts = np.zeros(max(ev.KIND_NAMES) + 1, np.int64)
        self.bucket_count = np.zeros(len(_EDGES), np.int64)    # ALLOCs per `_EDGES` bucket
        self.bucket_bytes = np.zeros(len(_EDGES), np.uint64)   # their bytes, modulo 2**64 as one uint64 sum
        self.distinct = DistinctSizes()
        self.max_size = 0
        self.pre_existing = 0
        self.private_segments = 0       # SEGMENT_ALLOCs in CUDA graph private pools
        self.in_request = 0             # FREEs made inside a request (CuPy's gc.collect on its limit/OOM path)
        self.catches_oom = 0            # ALLOCs flagged CATCHES_OOM
        self.catches_oom_max = 0        # the largest of them, bytes
        self.streams = set()
        self.t_min = self.t_max = None
        self.gc = [0, 0]                # incremental, full
        self.marks = []                 # ALLOCs before each MARK, a chunk each
        self.segment = 0                # reserved bytes the upstream events imply so far (Python int)
        self.segment_peak = 0
        self.limits = []                # SET_LIMIT events, in order (a program sets few)

    def add(self, chunk) -> None:
        rec, kind = chunk.rec, chunk.kind
        here = np.zeros(len(self.counts), np.int64)
        for k in ev.KIND_NAMES:
            here[k] = len(chunk.where(k))
        n_allocs_before = int(self.counts[ev.ALLOC])
        self.counts += here
        a = chunk.where(ev.ALLOC)
        self._add_sizes(np.sort(chunk.alloc_sizes))
        flags = rec["flags"]
        if flags.any():                 # rare: most traces flag nothing
            self.pre_existing += int(np.count_nonzero(flags[a] & ev.PRE_EXISTING))
            self.private_segments += int(np.count_nonzero(flags[chunk.where(ev.SEGMENT_ALLOC)] & ev.PRIVATE_POOL))
            self.in_request += int(np.count_nonzero(flags[chunk.where(ev.FREE)] & ev.IN_REQUEST))
            caught = a[flags[a] & ev.CATCHES_OOM != 0]
            if len(caught):
                self.catches_oom += len(caught)
                self.catches_oom_max = max(self.catches_oom_max, int(rec["size"][caught].max()))
        self._add_streams(chunk, np.concatenate((a, chunk.where(ev.FREE))))
        t = rec["time_ns"]
        lo, hi = int(t.min()), int(t.max())
        self.t_min = lo if self.t_min is None else min(self.t_min, lo)
        self.t_max = hi if self.t_max is None else max(self.t_max, hi)
        if here[ev.GC]:
            full = int(np.count_nonzero(rec["aux"][chunk.where(ev.GC)]))
            self.gc[0] += int(here[ev.GC]) - full
            self.gc[1] += full
        if here[ev.MARK]:
            self.marks.append(np.searchsorted(a, chunk.where(ev.MARK)) + n_allocs_before)
        if any(here[k] for k in _SEGMENT_SIGN):
            self._add_segments(kind, rec["size"])
        for j in chunk.where(ev.SET_LIMIT).tolist():
            self.limits.append(recorded_limit(chunk.start + j, rec[j]))

    def _add_sizes(self, sizes: np.ndarray) -> None:
        """The chunk's sorted ALLOC sizes into the histogram, the distinct sizes and the maximum."""
        if len(sizes):
            cuts = np.append(np.searchsorted(sizes, _EDGES), len(sizes))
            n = np.diff(cuts)
            some = np.flatnonzero(n)
            self.bucket_count += n
            self.bucket_bytes[some] += np.add.reduceat(sizes, cuts[some])     # uint64: wraps as one sum would
            self.distinct.add(sizes)
            self.max_size = max(self.max_size, int(sizes[-1]))

    def histogram(self) -> list[dict]:
        """The ALLOCs' power-of-two buckets: ``[{lo, hi, count, bytes}]``, hi exclusive (see `_EDGES`)."""
        return [{"lo": int(lo), "hi": 2 * int(lo) if lo else 1, "count": int(n), "bytes": int(b)}
                for lo, n, b in zip(_EDGES, self.bucket_count, self.bucket_bytes) if n]

    def median(self, trace) -> int:
        """The lower median ALLOC size (an actual request): its bucket, then `nth_alloc_size` within it."""
        k = (int(self.counts[ev.ALLOC]) - 1) // 2
        for b in self.histogram():
            if k < b["count"]:
                return nth_alloc_size(trace, k, b["lo"], b["hi"])
            k -= b["count"]
        return 0

    def _add_streams(self, chunk, driving: np.ndarray) -> None:
        """The streams of the chunk's ALLOCs and FREEs (at positions ``driving``)."""
        if len(driving):
            lo, hi = chunk.stream_range             # one stream in the whole chunk: no gather
            self.streams.update((lo,) if lo == hi else np.unique(chunk.rec["stream"][driving]).tolist())

    def _add_segments(self, kind: np.ndarray, size: np.ndarray) -> None:
        """The reserved bytes the chunk's upstream SEGMENT_* events imply, and their peak."""
        seg = np.isin(kind, list(_SEGMENT_SIGN))
        sign = np.vectorize(_SEGMENT_SIGN.get, otypes=[np.int64])(kind[seg])
        sizes = size[seg].astype(object)      # Python ints: no overflow on corrupt sizes
        run = np.cumsum(sign.astype(object) * sizes) + self.segment
        self.segment_peak = max(self.segment_peak, max(run.tolist()))
        self.segment = run[-1]

    def upstream_segments(self) -> dict:
        """SEGMENT_* counts and the reserved-bytes peak they imply (0 when none were recorded)."""
        out = {ev.KIND_NAMES[k].lower(): int(self.counts[k]) for k in _SEGMENT_SIGN}
        out["peak_reserved_bytes"] = int(self.segment_peak)
        return out


#: What a trace of one process of a run says of the process (docs/several-processes.md).
PROCESS_KEYS = ("rank", "local_rank", "world_size", "pid")


def summarize(trace, tally: Tally | None = None) -> dict:
    """Everything `allocsim info` reports, as a JSON-ready dict.

    ``tally``: a `Tally` already fed every chunk (by `Trace.load`'s validating pass);
    without one, a pass of its own. Then one or two passes over the ALLOC sizes, for the
    exact median.
    """
    if tally is None:
        tally = Tally()
        trace.walk(tally)
    counts = tally.counts
    by_kind = {name: int(counts[k]) for k, name in ev.KIND_NAMES.items() if counts[k]}
    n = int(counts[ev.ALLOC])
    histogram = tally.histogram()
    meta = trace.meta
    return {
        "path": shown_name(trace.path),
        "finished": bool(trace.finished),
        "events": int(len(trace)),
        "events_by_kind": by_kind,
        "allocs": n,
        "frees": int(counts[ev.FREE]),
        "pre_existing": tally.pre_existing,
        "distinct_sizes": len(tally.distinct),
        "median_alloc_bytes": tally.median(trace),
        "max_alloc_bytes": tally.max_size,
        "total_alloc_bytes": sum(b["bytes"] for b in histogram) % 2**64,
        "load_bytes": trace.load_bytes,
        "size_histogram": histogram,
        **iterations(np.concatenate(tally.marks) if tally.marks else np.zeros(0, np.int64), n),
        "streams": [trace.streams[s] if s < len(trace.streams) else f"#{s}" for s in sorted(tally.streams)],
        "duration_ns": tally.t_max - tally.t_min if len(trace) else 0,
        "gc_events": {"incremental": tally.gc[0], "full": tally.gc[1]},
        "oom_events": int(counts[ev.OOM]),
        "cache_releases": int(counts[ev.CACHE_RELEASE]),
        "limits": tally.limits,
        "upstream_segments": tally.upstream_segments(),
        **({"private_pool_segments": tally.private_segments} if tally.private_segments else {}),
        **({"frees_in_request": tally.in_request} if tally.in_request else {}),
        **({"catches_oom": catches_oom_known(tally.catches_oom, meta),
            "catches_oom_max_bytes": tally.catches_oom_max} if meta.get("framework") == "torch" else {}),
        **({"private_pools": _pool_summary(counts)} if counts[list(ev.POOL)].any() else {}),
        **({"phases": phase_shares(trace)} if counts[ev.PHASE_BEGIN] else {}),
        "metadata": {k: meta.get(k) for k in ("producer", "framework", "framework_version", "device",
                                               "allocator_settings", "command", "iterations")},
        **({"process": {k: meta[k] for k in PROCESS_KEYS if k in meta}} if "pid" in meta or "rank" in meta else {}),
        **({"device_memory": meta["device_memory"]} if "device_memory" in meta else {}),
    }


def catches_oom_known(flagged: int, meta: dict) -> int | None:
    """The number of requests the program survives failing (ALLOCs flagged CATCHES_OOM, ``flagged``), or None
    when the trace cannot tell: none flagged and no C++ stacks recorded (``meta["stacks"]`` is not ``"all"``)."""
    return flagged if flagged or meta.get("stacks") == "all" else None


def _pool_summary(counts) -> dict:
    """The private-pool events by kind (``begin``, ``end``, ``retain``, ``release``, ``graph_replay``)."""
    return {ev.KIND_NAMES[k].lower().removeprefix("pool_"): int(counts[k]) for k in (*ev.POOL, ev.GRAPH_REPLAY)}


def recorded_limit(index: int, r) -> dict:
    """A SET_LIMIT record as ``{event, bytes, by, fraction?}``: torch's fraction is its float64 bits in ``addr``."""
    out = {"event": int(index), "bytes": int(r["size"])}
    if int(r["aux"]) == ev.TORCH_AUX:
        out.update(by="torch set_per_process_memory_fraction", fraction=ev.bits_fraction(r["addr"]))
    else:
        out["by"] = "cupy set_limit"
    return out


def free_points(trace) -> tuple[np.ndarray, np.ndarray]:
    """``(sizes, after)``: each object's requested size, in the order the objects were allocated, and how many
    ALLOCs the trace made before its FREE (the number of ALLOCs when never freed): where among the program's
    allocations each free lands. Two recordings of one program hold the same ``sizes``; where their ``after``
    differ, the same object was let go at a different point (`moved_frees`)."""
    kind, ids = np.asarray(trace.kind), np.asarray(trace.id).astype(np.int64)
    is_alloc = kind == ev.ALLOC
    alloc_at = np.flatnonzero(is_alloc)
    ordinal = np.full(int(ids[alloc_at].max()) + 1 if len(alloc_at) else 0, -1, np.int64)
    ordinal[ids[alloc_at]] = np.arange(len(alloc_at))
    after = np.full(len(alloc_at), len(alloc_at), np.int64)
    freed = np.flatnonzero(kind == ev.FREE)
    after[ordinal[ids[freed]]] = np.cumsum(is_alloc)[freed]
    return np.asarray(trace.size)[alloc_at].astype(np.int64), after


def moved_frees(*traces) -> list[dict] | None:
    """The frees that recordings of one program make at different points: ``None`` when the traces are not the
    same program (their ALLOCs differ in number, size or order); else one ``{"alloc", "size", "after"}`` per
    object (its allocation's ordinal, its bytes, and the ALLOCs made before its FREE in each trace) whose FREE
    lands among different ALLOCs, left out those that every trace frees after its last ALLOC (or never), which
    change no peak."""
    points = [free_points(t) for t in traces]
    sizes = points[0][0]
    if any(len(s) != len(sizes) or not np.array_equal(s, sizes) for s, _ in points[1:]):
        return None
    after = np.stack([a for _, a in points])
    moved = np.flatnonzero((after.min(axis=0) != after.max(axis=0)) & (after.min(axis=0) < len(sizes)))
    return [{"alloc": int(i), "size": int(sizes[i]), "after": after[:, i].tolist()} for i in moved]
