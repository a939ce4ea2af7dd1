"""`allocsim info`: what a trace holds, without replaying it.

The analysis is `allocsim.trace.analysis` (`summarize`); this command loads the trace
(feeding the analysis's `Tally` the validating pass), and prints it as a report or JSON.
"""
from __future__ import annotations

from ..trace.analysis import Tally, summarize
from ..units import fmt_bytes, fmt_count, fmt_seconds
from ..report.tables import dump_json
from ..filenames import printable, shown_name
from ..machine.ranks import process_words, rank_label
from ..report.text import aligned_table, phase_lines
from ._command import Command
from ._common import load_trace, progress_bar
from ._ranks import each_rank

COMMAND = Command(
    name="info",
    help="summarise a trace: events, sizes, LOAD, iterations, streams, upstream segments, metadata",
    example="allocsim info traces/resnet50.bin --json")

@COMMAND.arguments
def add_arguments(p):
    p.add_argument("trace", nargs="+", help="trace file (.bin); several, or a run's name (run.bin for run.rank0.bin, "
                                            "run.rank1.bin, ...): each rank, then a table of the run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def _limit_text(lim: dict) -> str:
    size = fmt_bytes(lim["bytes"]) if lim["bytes"] else "none"
    return size + (f" (fraction {lim['fraction']:.4g})" if "fraction" in lim else "") + f" at event {lim['event']:,}"


def _bucket_label(lo: int, hi: int) -> str:
    if lo == 0:
        return "0 B"
    return f"[{fmt_bytes(lo, 0)}, {fmt_bytes(hi, 0)})"


def catches_oom_line(n: int | None, largest: int) -> str:
    """What a torch trace says of the requests the program survives failing (docs/allocator-dependent.md)."""
    if n is None:
        return ("  requests the program survives failing (cuDNN workspace tries): the trace cannot tell (no C++ "
                "stacks: record with --stacks all)")
    if not n:
        return "  requests the program survives failing: none (C++ stacks recorded)"
    return (f"  requests the program survives failing: {n:,} (cuDNN workspace tries, up to {fmt_bytes(largest)}); "
            f"a replay that fails one counts a caught OOM and goes on without it")


def _escaped(value):
    """``value`` (`summarize`'s dict) with every string's control characters written ``\\xNN`` (`printable`), line
    breaks too: a device name or command line of the trace's cannot clear the terminal, nor add a line of its own
    to the report (``"H100\\nverdict: MATCH"``)."""
    if isinstance(value, str):
        return printable(value, keep="")
    if isinstance(value, dict):
        return {_escaped(k): _escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_escaped(v) for v in value)
    return value


def _setting(value) -> str:
    """One recorded allocator setting as a person reads it: a per-size table (PyTorch reports
    ``roundup_power2_divisions`` as a dict of interval -> divisions) by its sizes in order, as one number where every
    interval has the same; anything else as recorded."""
    if isinstance(value, dict) and value and all(str(k).isdigit() for k in value):
        vals = set(map(str, value.values()))
        if len(vals) == 1:
            return vals.pop()
        return "[" + ",".join(f"{k}:{value[k]}" for k in sorted(value, key=int)) + "]"
    return str(value)


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
    if d.get("process"):
        lines.append(f"  process {rank_label(d['process'])}" + (f", local rank {d['process']['local_rank']}"
                                                                if "local_rank" in d["process"] else "")
                     + (f", device cuda:{dev['index']}" if dev.get("index") is not None else ""))
    mem = d.get("device_memory") or {}
    seen = [(at, mem[at]["outside"]) for at in ("start", "end") if "outside" in (mem.get(at) or {})]
    if mem.get("outside_peak") is not None or seen:
        lines.append("  outside the caching allocator "
                     + ", ".join(([f"{fmt_bytes(mem['outside_peak'])} at most"] if mem.get("outside_peak") is not None
                                  else []) + [f"{fmt_bytes(b)} at {at}" for at, b in seen])
                     + " (CUDA context, NCCL, other processes on the device: the trace cannot see it)")
    if m.get("command"):
        cmd = m["command"]
        lines.append(f"  command {' '.join(map(str, cmd)) if isinstance(cmd, list) else cmd}")
    if m.get("allocator_settings"):
        s = m["allocator_settings"]
        lines.append("  allocator settings " + (", ".join(f"{k}={_setting(v)}" for k, v in s.items())
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
        med = d["allocs_per_iteration_median"]
        median = f"{int(med):,}" if med == int(med) else f"{med:,.1f}"
        it += (f"   allocs per iteration median {median}"
               f" (min {d['allocs_per_iteration_min']:,}, max {d['allocs_per_iteration_max']:,})")
    if m.get("iterations") is not None:
        it += f"   iterations recorded {m['iterations']}"
    lines.append(it)
    ids = ", ".join(map(str, d["streams"]))
    named = "" if not ids else f" (ids {ids})" if len(d["streams"]) > 1 else f" (id {ids})"
    lines.append(f"  streams {len(d['streams'])}{named}   duration {fmt_seconds(d['duration_ns'] / 1e9)}")
    gc = d["gc_events"]
    lines.append(f"  GC events incr / full {gc['incremental']:,} / {gc['full']:,}   OOM events {d['oom_events']:,}"
                 f"   cache releases {d['cache_releases']:,}")
    if d["limits"]:
        lines.append(f"  limits set {len(d['limits'])} ({d['limits'][0]['by']}): "
                     + ", ".join(_limit_text(lim) for lim in d["limits"][:5])
                     + (", ..." if len(d["limits"]) > 5 else ""))
    pools = d.get("private_pools")
    if pools:
        lines.append("  private pools: " + ", ".join(f"{k} {v:,}" for k, v in pools.items())
                     + (f"; {d['private_pool_segments']:,} segment allocations in them"
                        if d.get("private_pool_segments") else ""))
    elif d.get("private_pool_segments"):
        lines.append(f"  CUDA graph private pools: {d['private_pool_segments']:,} segment allocations (not modelled: "
                     f"the trace holds no pool events; allocsim validate says which figures cannot be trusted)")
    if d.get("frees_in_request"):
        lines.append(f"  frees inside a request: {d['frees_in_request']:,} (arrays the pool's gc.collect() freed on its "
                     f"limit or OOM path; replayed at that collection)")
    if d.get("phases"):
        lines += phase_lines(d["phases"], d["allocs"], "the LOAD peak")
    if "catches_oom" in d:
        lines.append(catches_oom_line(d["catches_oom"], d["catches_oom_max_bytes"]))
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


def run_table(paths: list[str]) -> None:
    """The run in one table: each rank's LOAD, the peak the recorded allocator reserved, and what lay beside it."""
    from ..machine.ranks import shared_devices
    rows, metas = [], []
    for path in paths:
        trace = load_trace(path)
        d = summarize(trace)
        metas.append(trace.meta)
        dev = d["metadata"].get("device") or {}
        peak = d["upstream_segments"]["peak_reserved_bytes"]
        outside = (d.get("device_memory") or {}).get("outside_peak")
        rows.append([rank_label(trace.meta), shown_name(path),
                     f"cuda:{dev['index']}" if dev.get("index") is not None else "-",
                     fmt_bytes(d["load_bytes"]), fmt_bytes(peak) if peak else "-",
                     fmt_bytes(outside) if outside is not None else "-",
                     fmt_bytes(peak + outside) if peak and outside is not None else "-"])
    print(f"run of {len(paths)} processes (outside: the most device memory seen beside the caching allocator)")
    print(aligned_table(["process", "trace", "device", "LOAD", "peak reserved", "outside", "peak+outside"], rows, 3))
    for group in shared_devices(metas):
        names = ", ".join(process_words(rank_label(metas[k]), paths[k]) for k in group)
        print(f"  {names} share one device: each one's outside holds the others' memory")


@COMMAND.runs
def run(args) -> int:
    return each_rank(args, run_one, summary=run_table)


def run_one(args) -> int:
    quiet = args.quiet or args.json
    tally = Tally()
    trace = load_trace(args.trace, quiet, walkers=[tally], say_unfinished=False)     # its header says UNFINISHED
    _, close = progress_bar(None, "summarise", quiet, unit=None)
    try:
        d = summarize(trace, tally)
    finally:
        close()
    if args.json:
        dump_json(d)
    else:
        print(format_summary(_escaped(d)))      # the metadata's strings are the recorder's, or anyone's
    return 0
