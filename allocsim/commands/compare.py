"""`allocsim compare`: policies × caps × runtimes side by side, one replay per cell, in parallel."""
from __future__ import annotations

import os

from ..machine.capacity import check_caps
from ..errors import UsageError
from ..filenames import shown_name
from ..outputs import add_force_argument, claim_outputs
from ..report.tables import dump_json, write_rows
from ..report.text import breakdown_table, compare_table, row_sections, survived_note, trace_heading
from ..search.sweep import Cell, Settings, run_cells
from ._command import Command
from ._common import (add_jobs_argument, add_policies_argument, add_replay_arguments, add_warm_cache_argument,
                      capacity_arg, caps_arg, inputs_of, load_trace, parse_caps, policy_specs, recorded_settings,
                      replay_settings, split_list, warm_cache_trace)
from ._progress import count_progress
from ._ranks import each_rank

COMMAND = Command(
    name="compare",
    help="replay one trace under several policies, caps and runtimes; one table (its columns: docs/metrics.md)",
    example=("allocsim compare traces/resnet50.bin --policies binned,split,knet,torch,cupy,bestfit "
             "--caps none,8GB,12GB --runtime eager,gc -j 2"))


@COMMAND.arguments
def add_arguments(p, *, many_traces: bool = False):
    """compare's arguments; ``many_traces`` (sweep): traces as a list, and no --csv or --sections, which
    only compare's printed table has (sweep writes its table to -o)."""
    if many_traces:
        p.add_argument("trace", nargs="+", help="trace files (.bin)")
    else:
        p.add_argument("trace", help="trace file (.bin), or a run's name (run.bin for run.rank0.bin, ...: each rank)")
    add_policies_argument(p, "binned,split,knet,torch,cupy,bestfit")
    p.add_argument("--caps", default="none", help="comma-separated pool caps, e.g. none,8GB,1.2x,90%% (x: of the "
                                                  "trace's LOAD; %%: of the device's memory)")
    p.add_argument("--runtime", default="eager", help="comma-separated runtimes: eager,gc")
    add_jobs_argument(p)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    if not many_traces:
        p.add_argument("--csv", metavar="OUT", help="also write the rows as CSV to OUT")
    add_force_argument(p)
    if not many_traces:
        p.add_argument("--sections", action="store_true", help="print each run's section table")
        p.add_argument("--breakdown", action="store_true",
                       help="also print why reserved > live at each run's reserved peak (hard, soft, stream, rounding)")
        add_warm_cache_argument(p, "compare the settings on")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_replay_arguments(p, multi=True)


def build_cells(args, path: str | None = None) -> tuple[list[Cell], Settings]:
    """The cells of ``args`` on the trace at ``path`` (default ``args.trace``; `compare --warm-cache`: its warm
    view)."""
    path = args.trace if path is None else path
    trace = load_trace(path)              # validate once, up front
    specs = policy_specs(args.policies, options=args.policy_opt)
    runtimes = split_list(args.runtime, "--runtime")
    from ..machine.runtime import RUNTIMES
    for r in runtimes:
        if r not in RUNTIMES:
            raise UsageError(f"unknown runtime {r!r} (known: {', '.join(RUNTIMES)})")
    capacity = capacity_arg(args.capacity)
    caps = caps_arg(args.caps, trace, capacity)
    check_caps(caps, capacity, trace, "--caps")
    settings = Settings(replay_settings(args), sections=getattr(args, "sections", False))
    cells = [Cell(path, spec, cap, rt, capacity=capacity) for spec in specs for cap in caps for rt in runtimes]
    return cells, settings


def _shown(args, trace, cells) -> tuple[str, dict]:
    """The lines above the table -- the trace (``trace``: ``args.trace`` or its warm view) and, where its rows' plain
    labels hide them, the allocator settings it recorded (`recorded_settings`) -- and the caps as the user wrote
    them, as plot labels them (``8GB (7.45 GiB)``: a decimal size is not mistaken for the GiB the table prints)."""
    note = recorded_settings({c.policy for c in cells}, trace)
    heading = (trace_heading(args.trace, trace) + (" (its warm view: --warm-cache)" if args.warm_cache else "")
               + (f"\n{note}" if note else ""))
    return heading, parse_caps(args.caps, trace, capacity_arg(args.capacity))


@COMMAND.runs
def run(args) -> int:
    return each_rank(args, run_one)


def run_one(args) -> int:
    claim_outputs([("--csv", args.csv)], inputs_of(args), force=args.force)
    if args.csv and os.path.splitext(args.csv)[1].lower() in (".json", ".jsonl"):   # (as sweep refuses it)
        raise UsageError(f"--csv {args.csv}: --csv writes CSV, which its {os.path.splitext(args.csv)[1]} name "
                         f"contradicts; name it .csv (--json prints JSON to stdout)")
    with warm_cache_trace(args.trace, args.warm_cache, COMMAND.name) as path:
        cells, settings = build_cells(args, path)
        update, close = count_progress("compare", len(cells), "replays", args.quiet or args.json)  # off a terminal: lines
        finished = [0]

        def on_row(cell, row):
            finished[0] += 1
            update(finished[0])
        try:
            rows = run_cells(cells, settings, jobs=args.jobs, on_row=on_row)
        finally:
            close()
        heading, cap_text = (None, None) if args.json else _shown(args, load_trace(path), cells)
    for r in rows:
        r["trace"] = shown_name(args.trace)     # not the warm view's temporary file
    if args.csv:
        write_rows(rows, args.csv, "csv")
    if args.json:
        dump_json(rows)
        return 0
    print(heading)
    print(compare_table(rows, cap_text))
    note = survived_note(rows)
    if note:
        print(note)
    if args.breakdown:
        print("\nreserved - live requested bytes at the reserved peak (docs/metrics.md, the free breakdown)")
        print(breakdown_table(rows, cap_text))
    if args.sections:
        for r in rows:
            print(row_sections(r))
    return 0
