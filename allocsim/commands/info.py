"""`allocsim info`: what a trace holds, without replaying it.

Events by kind, the request-size distribution (power-of-two histogram), LOAD,
iterations (from MARK events), streams, duration, what the recorded allocator
did upstream (SEGMENT events), and the recording's metadata.

Cost: a few vectorised passes over the columns plus one sort of the ALLOC sizes
(O(n log n)); nothing per event in Python.
"""
from __future__ import annotations

import numpy as np

from ..trace import events as ev
from ..units import fmt_bytes, fmt_count, fmt_seconds
from ._common import dump_json, load_trace, progress_bar

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


def iterations(kind: np.ndarray) -> dict:
    """Allocations per iteration, an iteration being the events up to and including a MARK."""
    marks = np.flatnonzero(kind == ev.MARK)
    out = {"marks": int(len(marks))}
    if len(marks):
        allocs_before = np.cumsum(kind == ev.ALLOC)[marks]
        per = np.diff(np.concatenate(([0], allocs_before)))
        out.update(allocs_per_iteration_median=float(np.median(per)), allocs_per_iteration_min=int(per.min()),
                   allocs_per_iteration_max=int(per.max()),
                   allocs_after_last_mark=int(np.count_nonzero(kind[marks[-1]:] == ev.ALLOC)))
    return out


def upstream_segments(trace) -> dict:
    """SEGMENT_* counts and the reserved-bytes peak they imply (0 when none were recorded)."""
    kind = np.asarray(trace.kind)
    seg = np.isin(kind, list(_SEGMENT_SIGN))
    out = {ev.KIND_NAMES[k].lower(): int(np.count_nonzero(kind == k)) for k in _SEGMENT_SIGN}
    peak = 0
    if seg.any():
        sign = np.vectorize(_SEGMENT_SIGN.get, otypes=[np.int64])(kind[seg])
        sizes = np.asarray(trace.size[seg]).astype(object)   # Python ints: no overflow on corrupt sizes
        peak = max(0, max(np.cumsum(sign.astype(object) * sizes).tolist()))
    out["peak_reserved_bytes"] = int(peak)
    return out


def summarize(trace) -> dict:
    """Everything `allocsim info` reports, as a JSON-ready dict."""
    kind = np.asarray(trace.kind)
    counts = np.bincount(kind, minlength=max(ev.KIND_NAMES) + 1)
    by_kind = {name: int(counts[k]) for k, name in ev.KIND_NAMES.items() if counts[k]}
    a = kind == ev.ALLOC
    sizes = np.sort(np.asarray(trace.size[a]))
    n = len(sizes)
    distinct = int(np.count_nonzero(np.diff(sizes))) + 1 if n else 0
    gc = kind == ev.GC
    used_streams = np.unique(np.asarray(trace.stream[a | (kind == ev.FREE)]))
    t = np.asarray(trace.time_ns)
    meta = trace.meta
    return {
        "path": trace.path,
        "finished": bool(trace.finished),
        "events": int(len(trace)),
        "events_by_kind": by_kind,
        "allocs": int(n),
        "frees": int(counts[ev.FREE]),
        "pre_existing": int(np.count_nonzero(np.asarray(trace.flags[a]) & ev.PRE_EXISTING)),
        "distinct_sizes": distinct,
        "median_alloc_bytes": int(sizes[(n - 1) // 2]) if n else 0,   # lower median: an actual request
        "max_alloc_bytes": int(sizes[-1]) if n else 0,
        "total_alloc_bytes": int(sizes.sum(dtype=np.uint64)) if n else 0,
        "load_bytes": int(trace.load_bytes),
        "size_histogram": size_histogram(sizes),
        **iterations(kind),
        "streams": [trace.streams[s] if s < len(trace.streams) else f"#{s}" for s in used_streams.tolist()],
        "duration_ns": int(t.max() - t.min()) if len(t) else 0,
        "gc_events": {"incremental": int(np.count_nonzero(gc & (np.asarray(trace.aux) == 0))),
                      "full": int(np.count_nonzero(gc & (np.asarray(trace.aux) != 0)))},
        "oom_events": int(counts[ev.OOM]),
        "upstream_segments": upstream_segments(trace),
        "metadata": {k: meta.get(k) for k in ("producer", "framework", "framework_version", "device",
                                               "allocator_settings", "command", "iterations")},
    }


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
    lines.append(f"  GC events incr / full {gc['incremental']:,} / {gc['full']:,}   OOM events {d['oom_events']:,}")
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
