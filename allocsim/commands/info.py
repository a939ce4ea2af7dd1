"""`allocsim info`: what a trace holds, without replaying it.

Events by kind, the request-size distribution (power-of-two histogram), LOAD,
iterations (from MARK events), streams, duration, what the recorded allocator
did upstream (SEGMENT events), and the recording's metadata.

Cost: one pass over the records a chunk at a time (plus the ALLOC count's, `Trace.n_allocs`, to
size the array of ALLOC sizes, and LOAD's, `Trace.load_bytes`) and one sort of the ALLOC sizes (O(n log n)); nothing per event in Python. Memory: the ALLOC sizes
(8 bytes per allocation, for the exact median and distinct count) and per-chunk temporaries.
"""
from __future__ import annotations

import struct

import numpy as np

from ..trace import events as ev
from ..units import fmt_bytes, fmt_count, fmt_seconds
from ..report.tables import dump_json
from ._common import load_trace, progress_bar

NAME = "info"
HELP = "summarise a trace: events, sizes, LOAD, iterations, streams, upstream segments, metadata"
EXAMPLE = "allocsim info traces/resnet50.bin --json"

#: Upstream events that add (+1) or remove (-1) reserved bytes.
_SEGMENT_SIGN = {ev.SEGMENT_ALLOC: 1, ev.SEGMENT_MAP: 1, ev.SEGMENT_FREE: -1, ev.SEGMENT_UNMAP: -1}


def add_arguments(p):
    p.add_argument("trace", help="trace file (.bin)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def size_histogram(sizes: np.ndarray) -> list[dict]:
    """Power-of-two buckets of sorted ``sizes``: ``[{lo, hi, count, bytes}]``, hi exclusive.

    Bucket k holds sizes in [2**k, 2**(k+1)); 0-byte requests get their own
    bucket (lo = hi = 0). Empty buckets are left out. O(n) on sorted input.
    """
    if len(sizes) == 0:
        return []
    top = int(sizes[-1]).bit_length()
    edges = np.array([0, 1] + [2 ** k for k in range(1, top + 1)], np.uint64)
    cuts = np.searchsorted(sizes, edges, side="left").tolist() + [len(sizes)]
    out = []
    for b in range(len(edges)):
        lo, hi = cuts[b], cuts[b + 1]
        if hi > lo:
            lo_size = int(edges[b])
            out.append({"lo": lo_size, "hi": 2 * lo_size if lo_size else 1,
                        "count": hi - lo, "bytes": int(sizes[lo:hi].sum(dtype=np.uint64))})
    return out


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


class _Tally:
    """What `summarize` gathers in one pass over the records, a chunk at a time."""

    def __init__(self, n_allocs: int):
        self.counts = np.zeros(max(ev.KIND_NAMES) + 1, np.int64)
        self.sizes = np.zeros(n_allocs, np.uint64)      # ALLOC sizes, filled in order (sorted in place at the end)
        self.pre_existing = 0
        self.streams = set()
        self.t_min = self.t_max = None
        self.gc = [0, 0]                # incremental, full
        self.marks = []                 # ALLOCs before each MARK, a chunk each
        self.segment = 0                # reserved bytes the upstream events imply so far (Python int)
        self.segment_peak = 0
        self.limits = []                # SET_LIMIT events, in order (a program sets few)

    def add(self, start: int, rec) -> None:
        kind = rec["kind"]
        n_allocs_before = int(self.counts[ev.ALLOC])
        self.counts += np.bincount(kind, minlength=len(self.counts))[:len(self.counts)]
        a = kind == ev.ALLOC
        self.sizes[n_allocs_before:int(self.counts[ev.ALLOC])] = rec["size"][a]
        self.pre_existing += int(np.count_nonzero(rec["flags"][a] & ev.PRE_EXISTING))
        self.streams.update(np.unique(rec["stream"][a | (kind == ev.FREE)]).tolist())
        t = rec["time_ns"]
        lo, hi = int(t.min()), int(t.max())
        self.t_min = lo if self.t_min is None else min(self.t_min, lo)
        self.t_max = hi if self.t_max is None else max(self.t_max, hi)
        gc = kind == ev.GC
        full = np.count_nonzero(gc & (rec["aux"] != 0))
        self.gc[0] += int(np.count_nonzero(gc)) - int(full)
        self.gc[1] += int(full)
        marks = np.flatnonzero(kind == ev.MARK)
        if len(marks):
            self.marks.append(np.cumsum(a)[marks] + n_allocs_before)
        for j in np.flatnonzero(kind == ev.SET_LIMIT).tolist():
            self.limits.append(recorded_limit(start + j, rec[j]))
        seg = np.isin(kind, list(_SEGMENT_SIGN))
        if seg.any():
            sign = np.vectorize(_SEGMENT_SIGN.get, otypes=[np.int64])(kind[seg])
            sizes = rec["size"][seg].astype(object)      # Python ints: no overflow on corrupt sizes
            run = np.cumsum(sign.astype(object) * sizes) + self.segment
            self.segment_peak = max(self.segment_peak, max(run.tolist()))
            self.segment = run[-1]

    def upstream_segments(self) -> dict:
        """SEGMENT_* counts and the reserved-bytes peak they imply (0 when none were recorded)."""
        out = {ev.KIND_NAMES[k].lower(): int(self.counts[k]) for k in _SEGMENT_SIGN}
        out["peak_reserved_bytes"] = int(self.segment_peak)
        return out


def summarize(trace) -> dict:
    """Everything `allocsim info` reports, as a JSON-ready dict: one chunked pass over the records."""
    tally = _Tally(trace.n_allocs)
    for start, rec in trace._chunks():
        tally.add(start, rec)
    counts = tally.counts
    by_kind = {name: int(counts[k]) for k, name in ev.KIND_NAMES.items() if counts[k]}
    sizes = tally.sizes
    sizes.sort()
    n = len(sizes)
    distinct = int(np.count_nonzero(np.diff(sizes))) + 1 if n else 0
    meta = trace.meta
    return {
        "path": trace.path,
        "finished": bool(trace.finished),
        "events": int(len(trace)),
        "events_by_kind": by_kind,
        "allocs": int(n),
        "frees": int(counts[ev.FREE]),
        "pre_existing": tally.pre_existing,
        "distinct_sizes": distinct,
        "median_alloc_bytes": int(sizes[(n - 1) // 2]) if n else 0,   # lower median: an actual request
        "max_alloc_bytes": int(sizes[-1]) if n else 0,
        "total_alloc_bytes": int(sizes.sum(dtype=np.uint64)) if n else 0,
        "load_bytes": int(trace.load_bytes),
        "size_histogram": size_histogram(sizes),
        **iterations(np.concatenate(tally.marks) if tally.marks else np.zeros(0, np.int64), n),
        "streams": [trace.streams[s] if s < len(trace.streams) else f"#{s}" for s in sorted(tally.streams)],
        "duration_ns": tally.t_max - tally.t_min if len(trace) else 0,
        "gc_events": {"incremental": tally.gc[0], "full": tally.gc[1]},
        "oom_events": int(counts[ev.OOM]),
        "cache_releases": int(counts[ev.CACHE_RELEASE]),
        "limits": tally.limits,
        "upstream_segments": tally.upstream_segments(),
        "metadata": {k: meta.get(k) for k in ("producer", "framework", "framework_version", "device",
                                               "allocator_settings", "command", "iterations")},
    }


def recorded_limit(index: int, r) -> dict:
    """A SET_LIMIT record as ``{event, bytes, by, fraction?}``: torch's fraction is its float64 bits in ``addr``."""
    out = {"event": int(index), "bytes": int(r["size"])}
    if int(r["aux"]) == 0:
        out.update(by="torch set_per_process_memory_fraction",
                   fraction=struct.unpack("<d", struct.pack("<Q", int(r["addr"])))[0])
    else:
        out["by"] = "cupy set_limit"
    return out


def _limit_text(lim: dict) -> str:
    size = fmt_bytes(lim["bytes"]) if lim["bytes"] else "none"
    return size + (f" (fraction {lim['fraction']:.4g})" if "fraction" in lim else "") + f" at event {lim['event']:,}"


def _bucket_label(lo: int, hi: int) -> str:
    if lo == 0:
        return "0 B"
    return f"[{fmt_bytes(lo, 0)}, {fmt_bytes(hi, 0)})"


def format_summary(d: dict) -> str:
    """The human report of `summarize`'s dict."""
    m = d["metadata"]
    dev = m.get("device") if isinstance(m.get("device"), dict) else {}
    fw = " ".join(str(x) for x in (m.get("framework"), m.get("framework_version")) if x) or "-"
    lines = [f"trace {d['path'] or '-'}" + ("" if d["finished"] else
                                              "  (UNFINISHED: the writer died; this is the readable prefix)"),
             f"  producer {m.get('producer') or '-'}   framework {fw}",
             f"  device {dev.get('name') or '-'}" + (f"  ({fmt_bytes(dev['total_memory'])})"
                                                      if dev.get("total_memory") else "")]
    if m.get("command"):
        cmd = m["command"]
        lines.append(f"  command {' '.join(map(str, cmd)) if isinstance(cmd, list) else cmd}")
    if m.get("allocator_settings"):
        s = m["allocator_settings"]
        lines.append("  allocator settings " + (", ".join(f"{k}={v}" for k, v in s.items())
                                                  if isinstance(s, dict) else str(s)))
    lines += ["",
              f"  events {d['events']:,}: " + ", ".join(f"{k} {v:,}" for k, v in d["events_by_kind"].items()),
              f"  allocs {d['allocs']:,}   frees {d['frees']:,}   pre-existing {d['pre_existing']:,}"
              f"   distinct sizes {d['distinct_sizes']:,}",
              f"  median alloc {fmt_bytes(d['median_alloc_bytes'])}   max alloc {fmt_bytes(d['max_alloc_bytes'])}"
              f"   total requested {fmt_bytes(d['total_alloc_bytes'])}",
              f"  LOAD (peak live) {fmt_bytes(d['load_bytes'])}"]
    it = f"  marks {d['marks']:,}"
    if d["marks"]:
        it += (f"   allocs per iteration median {d['allocs_per_iteration_median']:g}"
               f" (min {d['allocs_per_iteration_min']:,}, max {d['allocs_per_iteration_max']:,})")
    if m.get("iterations") is not None:
        it += f"   iterations recorded {m['iterations']}"
    lines.append(it)
    lines.append(f"  streams {len(d['streams'])}: {', '.join(map(str, d['streams'])) or '-'}"
                 f"   duration {fmt_seconds(d['duration_ns'] / 1e9)}")
    gc = d["gc_events"]
    lines.append(f"  GC events incr / full {gc['incremental']:,} / {gc['full']:,}   OOM events {d['oom_events']:,}"
                 f"   cache releases {d['cache_releases']:,}")
    if d["limits"]:
        lines.append(f"  limits set {len(d['limits'])} ({d['limits'][0]['by']}): "
                     + ", ".join(_limit_text(lim) for lim in d["limits"][:5])
                     + (", ..." if len(d["limits"]) > 5 else ""))
    up = d["upstream_segments"]
    n_seg = sum(v for k, v in up.items() if k != "peak_reserved_bytes")
    if n_seg:
        lines.append(f"  upstream segments: alloc {up['segment_alloc']:,}, free {up['segment_free']:,}, "
                     f"map {up['segment_map']:,}, unmap {up['segment_unmap']:,};"
                     f" peak reserved {fmt_bytes(up['peak_reserved_bytes'])}")
    else:
        lines.append("  upstream segments: none recorded")
    if d["size_histogram"]:
        total_n = max(1, d["allocs"])
        total_b = max(1, d["total_alloc_bytes"])
        lines += ["", f"  {'size':<22} {'allocs':>8} {'%':>6} {'bytes':>12} {'%':>6}"]
        for b in d["size_histogram"]:
            lines.append(f"  {_bucket_label(b['lo'], b['hi']):<22} {fmt_count(b['count']):>8}"
                         f" {100 * b['count'] / total_n:>5.1f}% {fmt_bytes(b['bytes']):>12}"
                         f" {100 * b['bytes'] / total_b:>5.1f}%")
    return "\n".join(lines)


def run(args) -> int:
    quiet = args.quiet or args.json
    trace = load_trace(args.trace, quiet)
    _, close = progress_bar(None, "summarise", quiet, unit=None)
    try:
        d = summarize(trace)
    finally:
        close()
    if args.json:
        dump_json(d)
    else:
        print(format_summary(d))
    return 0
