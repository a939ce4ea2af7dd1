"""`allocsim plot`: memory over time, comparison bars, capacity frontier, malloc latency, GC calls."""
from __future__ import annotations

import os

from ..errors import InputError, UsageError
from ..outputs import add_force_argument, atomic_folder, check_named, claim_outputs
from ..search.sweep import Cell, Settings, result_row, run_cell, run_cells
from ._command import Command
from ._common import (PhaseReport, add_cost_model_argument, add_jobs_argument, add_policies_argument, inputs_of,
                      load_trace, parse_caps, plural, policy_specs, replay_settings)
from ._ranks import one_trace

COMMAND = Command(
    name="plot",
    help="draw pictures of replays (PNG, SVG or PDF); --report writes them all plus index.html",
    example="allocsim plot traces/resnet50.bin --policies split,binned,torch --caps none,4GB --report plots/")

KINDS = ["memory", "bars", "frontier", "latency", "gc", "breakdown"]
TITLES = {"memory": "Memory over time", "bars": "Policies side by side", "frontier": "Capacity frontier",
          "latency": "Malloc latency: how many mallocs are at least this slow",
          "gc": "GC calls and pause time (gc runtime)",
          "breakdown": "Why reserved > live at the reserved peak: hard, soft, stream, rounding"}


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("trace", help="trace file (.bin)")
    add_policies_argument(p, "split,binned,torch,cupy,bestfit")
    p.add_argument("--caps", default="none",
                   help="caps for the bars and GC pictures, e.g. none,4GB,1.2x,90%%; the first also for memory and "
                        "latency")
    p.add_argument("--kind", choices=KINDS, help="which picture with -o (default memory)")
    p.add_argument("-o", "--output", help="output file (.png, .svg or .pdf) for one picture")
    p.add_argument("--report", metavar="DIR", help="write every picture and an index.html into DIR")
    add_force_argument(p)
    p.add_argument("--svg", action="store_true", help="SVG instead of PNG in --report")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress (a bar, or a line per phase)")
    add_cost_model_argument(p)
    add_jobs_argument(p)


def check_arguments(args) -> None:
    """Refuse contradictory or unusable plotting options at once, before any replay."""
    from ..report.plots import FORMATS, picture_format
    if args.output and args.report:
        raise UsageError("give -o FILE for one picture or --report DIR for all, not both")
    for name in (args.report, args.output):
        if name is not None:
            check_named(name, "write")      # (an empty name, or ``-``: no file or folder a picture goes to)
    if not args.report and not args.output:
        raise UsageError("say -o FILE.png for one picture or --report DIR for all")
    if args.report and os.path.exists(args.report) and not os.path.isdir(args.report):
        raise UsageError(f"--report {args.report}: exists and is not a folder")
    claim(args, ".svg" if args.svg else ".png")     # an input or a trace in the way says so first
    if args.output and not picture_format(args.output):
        raise UsageError(f"-o {args.output}: not a picture name; end it in {', '.join(FORMATS[:-1])} or {FORMATS[-1]}")
    if args.output and args.svg:
        raise UsageError("--svg is for --report; for one SVG picture name it -o FILE.svg")
    if args.report and args.kind:
        raise UsageError("--kind is for -o; --report draws every kind")


def _timeline_results(trace_path, specs, settings, cap=None, runtime="eager"):
    s = Settings(settings.replay.with_(timeline=True), settings.sections)
    out = {}
    for spec in specs:
        _, res = run_cell(Cell(trace_path, spec, cap, runtime), s, full=True)
        out[spec.label] = res
    return out


def _rows(trace_path, specs, caps, runtime, settings, jobs, replayed=None):
    """The rows of every policy × cap, in cell order; ``replayed`` ({label: result} at the first cap under
    ``runtime``: the timeline replays) gives its rows as they are instead of replaying them again."""
    cells = [Cell(trace_path, spec, c, runtime) for spec in specs for c in caps]
    rows = {c: result_row(replayed[c.policy.label], c) for c in cells if replayed and c.cap == caps[0]}
    todo = sorted((c for c in cells if c not in rows), key=Cell.sort_key)
    rows.update(zip(todo, run_cells(todo, settings, jobs=jobs)))
    return [rows[c] for c in sorted(cells, key=Cell.sort_key)]


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
    inputs = inputs_of(args)
    if not args.report:
        return claim_outputs([("-o", args.output)], inputs, force=args.force)
    if not os.path.exists(args.report):
        _check_can_make(args.report)             # a new folder holds nothing to lose, if it can be made
        return
    index = os.path.join(args.report, "index.html")
    ours = [os.path.join(args.report, k + ext) for k in KINDS] + [index]
    claim_outputs([("--report", p) for p in ours], inputs, force=args.force)
    if args.force:
        return
    if _report_is_foreign(index):
        raise InputError("exists and is not an allocsim report; pass --force to replace it", path=index,
                         position="--report")
    there = [os.path.basename(p) for p in ours if os.path.exists(p)]
    if there and not os.path.exists(index):
        raise InputError(f"is a folder allocsim did not make (no index.html of a report) and holds "
                         f"{', '.join(there)}, which the report would replace; pass --force to replace them, or "
                         f"name a new folder", path=args.report, position="--report")


def _check_can_make(folder: str) -> None:
    """Refuse now, before any replay, a report folder that cannot be made: the first missing folder of
    its path is made and removed again (a permission test alone passes for root, also on /proc)."""
    first = os.path.abspath(folder)
    while not os.path.exists(os.path.dirname(first)):
        first = os.path.dirname(first)
    try:
        os.mkdir(first)
        os.rmdir(first)
    except OSError as e:
        raise InputError(f"cannot make it: {e.strerror or e} ({first})", path=folder, position="--report") from None


@COMMAND.runs
def run(args) -> int:
    from ..search.fit import MAX_REPLAYS
    from ..report import plots
    from ..report.html import index_html
    from .fit import frontier
    check_arguments(args)                           # before the replays, not after
    args.trace = one_trace(args.trace, "plot")
    trace = load_trace(args.trace)
    specs = policy_specs(args.policies)
    labels = [spec.label for spec in specs]
    cap_text = parse_caps(args.caps, trace)
    caps = list(cap_text)
    settings = Settings(replay_settings(args))
    style = {"styles": plots.policy_styles(labels)}
    first = f"eager runtime, {plots.cap_label(caps[0], cap_text)}"
    compute = {"timeline": lambda: _timeline_results(args.trace, specs, settings, caps[0]),
               "rows": lambda: _rows(args.trace, specs, caps, "eager", settings, args.jobs, data.get("timeline")),
               "gc_rows": lambda: _rows(args.trace, specs, caps, "gc", settings, args.jobs),
               "fit": lambda: frontier(args.trace, specs, jobs=args.jobs, settings=settings,
                                       quiet=args.quiet or not args.report)}
    data = {}

    def need(what):
        if what not in data:
            data[what] = compute[what]()
        return data[what]

    def draw(kind, path):
        if kind == "memory":
            return plots.memory_timeline(trace, need("timeline"), path, setting=first, cap_text=cap_text, **style)
        if kind == "latency":
            return plots.latency_plot(trace, need("timeline"), path, setting=first, **style)
        if kind == "bars":
            return plots.comparison_bars(trace, need("rows"), path, cap_text=cap_text, **style)
        if kind == "gc":
            return plots.gc_plot(trace, need("gc_rows"), path, cap_text=cap_text, **style)
        if kind == "breakdown":
            return plots.breakdown_plot(trace, need("rows"), path, cap_text=cap_text, **style)
        return plots.frontier_plot(trace, need("fit"), path, **style)

    if not args.report:
        print(draw(args.kind or "memory", args.output))
        return 0
    cells = len(specs) * len(caps)
    phases = PhaseReport("plot", len(compute) + 1, quiet=args.quiet)
    steps = {"timeline": f"timelines: {plural(len(specs), 'replay')}",
             "rows": f"eager runtime: {plural(cells - len(specs), 'replay')}",
             "gc_rows": f"gc runtime: {plural(cells, 'replay')}",
             "fit": f"capacity frontier: {plural(len(specs), 'policy')}"}
    for what in compute:        # every replay before the first picture is written; the timelines first, for the rows
        if what != "fit":       # (the frontier shows its own bar, and a line per policy)
            phases.start(steps[what])
        need(what)
        phases.end(steps[what])
    phases.start(f"{len(KINDS)} pictures")
    ext = ".svg" if args.svg else ".png"
    with atomic_folder(args.report) as folder:      # the whole report or none of it (a disk that fills)
        images = [(TITLES[kind], os.path.basename(draw(kind, os.path.join(folder, kind + ext)))) for kind in KINDS]
        index_html(folder, trace, images, need("rows") + need("gc_rows"), need("fit"), MAX_REPLAYS, cap_text)
    phases.end(f"{len(KINDS)} pictures and index.html")
    for _, name in images:
        print(os.path.join(args.report, name))
    print(os.path.join(args.report, "index.html"))
    return 0
