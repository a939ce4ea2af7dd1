"""`allocsim plot`: memory over time, comparison bars, capacity frontier, latency CDF, GC calls."""
from __future__ import annotations

import os

from ..errors import InputError, UsageError
from ..outputs import add_force_argument, claim_outputs
from ..sweep import Cell, Settings, parse_policy_spec, policy_label, run_cell, run_cells, split_top
from ..units import parse_size
from ._common import cost_model_arg, load_trace, split_list

NAME = "plot"
HELP = "draw pictures of replays (PNG, or SVG); --report writes them all plus index.html"
EXAMPLE = ("allocsim plot traces/resnet50.bin --policies split,binned,torch --caps none,4GB --report plots/")

KINDS = ["memory", "bars", "frontier", "latency", "gc"]


def add_arguments(p):
    p.add_argument("trace", help="trace file (.bin)")
    p.add_argument("--policies", "-p", default="split,binned,torch,cupy,bestfit")
    p.add_argument("--caps", default="none", help="caps for the bars and GC pictures, e.g. none,4GB")
    p.add_argument("--kind", choices=KINDS, default="memory", help="which picture (default memory)")
    p.add_argument("-o", "--output", help="output file (.png or .svg) for one picture")
    p.add_argument("--report", metavar="DIR", help="write every picture and an index.html into DIR")
    add_force_argument(p)
    p.add_argument("--svg", action="store_true", help="SVG instead of PNG in --report")
    p.add_argument("--cost-model", metavar="FILE")
    p.add_argument("-j", "--jobs", type=int, default=min(4, os.cpu_count() or 1))


def _timeline_results(trace_path, specs, settings, cap=None, runtime="eager"):
    s = Settings(**{**settings.__dict__, "timeline": True})
    out = {}
    for name, opts in specs:
        _, res = run_cell(Cell(trace_path, name, cap, runtime, opts), s, full=True)
        out[policy_label(name, opts)] = res
    return out


def _rows(trace_path, specs, caps, runtime, settings, jobs):
    cells = [Cell(trace_path, n, c, runtime, o) for n, o in specs for c in caps]
    return run_cells(cells, settings, jobs=jobs)


def _report_is_foreign(index: str) -> bool:
    """True if ``index`` exists and is not an index.html that `allocsim plot --report` wrote."""
    try:
        with open(index, "rb") as f:
            return b"<title>allocsim report" not in f.read(512)
    except FileNotFoundError:
        return False


def claim(args, ext: str) -> None:
    """Refuse, before any replay, a picture or report file that would replace an input, a trace or a page
    allocsim did not write (unless --force)."""
    inputs = [args.trace, args.cost_model]
    if not args.report:
        return claim_outputs([("-o", args.output)], inputs, force=args.force)
    if not os.path.exists(args.report):
        return                                   # a new folder holds nothing to lose
    if not os.path.isdir(args.report):
        raise InputError("is not a folder", path=args.report, position="--report")
    index = os.path.join(args.report, "index.html")
    claim_outputs([("--report", os.path.join(args.report, k + ext)) for k in KINDS] + [("--report", index)],
                  inputs, force=args.force)
    if not args.force and _report_is_foreign(index):
        raise InputError("exists and is not an allocsim report; pass --force to replace it", path=index,
                         position="--report")


def run(args) -> int:
    from .. import plots, policies
    from .fit import frontier
    if not args.report and not args.output:
        raise UsageError("say -o FILE.png for one picture or --report DIR for all")
    ext = ".svg" if args.svg else ".png"
    claim(args, ext)
    trace = load_trace(args.trace)
    specs = [parse_policy_spec(s) for s in split_top(args.policies)]
    for name, opts in specs:
        policies.get(name).parse_options(list(opts))
    caps = [parse_size(c, what="--caps", allow_none=True) for c in split_list(args.caps, "--caps")]
    costs = cost_model_arg(args.cost_model)
    settings = Settings(costs=costs.to_dict() if costs else None)

    def draw(kind, path):
        if kind == "memory":
            return plots.memory_timeline(trace, _timeline_results(args.trace, specs, settings, caps[0]), path)
        if kind == "latency":
            return plots.latency_cdf(trace, _timeline_results(args.trace, specs, settings, caps[0]), path)
        if kind == "bars":
            return plots.comparison_bars(trace, _rows(args.trace, specs, caps, "eager", settings, args.jobs), path)
        if kind == "gc":
            return plots.gc_plot(trace, _rows(args.trace, specs, caps, "gc", settings, args.jobs), path)
        if kind == "frontier":
            return plots.frontier_plot(trace, frontier(args.trace, specs, jobs=args.jobs, settings=settings), path)
        raise AssertionError(kind)

    if not args.report:
        print(draw(args.kind, args.output))
        return 0
    os.makedirs(args.report, exist_ok=True)
    timeline = _timeline_results(args.trace, specs, settings, caps[0])
    rows = _rows(args.trace, specs, caps, "eager", settings, args.jobs)
    gc_rows = _rows(args.trace, specs, caps, "gc", settings, args.jobs)
    fit = frontier(args.trace, specs, jobs=args.jobs, settings=settings)
    J = lambda n: os.path.join(args.report, n + ext)
    images = [
        ("Memory over time", plots.memory_timeline(trace, timeline, J("memory"))),
        ("Policies side by side", plots.comparison_bars(trace, rows, J("bars"))),
        ("Capacity frontier", plots.frontier_plot(trace, fit, J("frontier"))),
        ("Malloc latency CDF", plots.latency_cdf(trace, timeline, J("latency"))),
        ("GC calls and time (gc runtime)", plots.gc_plot(trace, gc_rows, J("gc"))),
    ]
    images = [(t, os.path.basename(p)) for t, p in images]
    idx = plots.index_html(args.report, trace, images, rows + gc_rows, fit)
    for _, p in images:
        print(os.path.join(args.report, p))
    print(idx)
    return 0
