"""`allocsim replay`: one trace, one policy, one cap; a summary and the section table."""
from __future__ import annotations

import sys
import time

from ..machine.capacity import check_caps
from ..formats.exporters.torch_snapshot import check_exportable, write_snapshot
from ..outputs import add_force_argument, claim_outputs
from ..engine.replay import replay
from ..formats.exporters.torch_snapshot import replay_snapshot
from ..report.tables import dump_json
from ..filenames import shown_name
from ..report.text import oom_line, phase_lines, replay_summary, section_table
from ..engine.spec import PolicySpec
from ._command import Command
from ._common import (DEFAULT_TRACE, add_replay_arguments, add_warm_cache_argument, lazy_progress_bar, load_trace,
                      check_snapshot_name, inputs_of, progress_bar, replay_settings, say_snapshot_written,
                      warm_cache_trace)
from ._ranks import each_rank

COMMAND = Command(
    name="replay",
    help="replay a trace against one allocator policy",
    example="allocsim replay traces/resnet50.bin --policy split --cap 8GB --runtime gc")


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("trace", nargs="?", help="trace file (.bin), or a run's name (run.bin for run.rank0.bin, ...: each "
                                          "rank); default: the embedded ResNet-50 trace (traces/resnet50.bin, "
                                          "recorded on an H100)")
    p.add_argument("--policy", "-p", default="split", help="allocator policy (see `allocsim policies`), "
                   "name[key:value,...], or a plug-in: file.py:Class or module:Class")
    add_replay_arguments(p)
    add_warm_cache_argument(p)
    p.add_argument("--backend", choices=["sim", "cuda"], default="sim",
                   help="cuda: make the policy's device calls real cudaMalloc/cudaFree on this GPU (measured)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    p.add_argument("--snapshot", metavar="FILE", help="also write the simulated run as a PyTorch memory snapshot "
                   "(a pickle, as torch.cuda.memory._dump_snapshot writes) for https://pytorch.org/memory_viz; "
                   "policies with a segment layout (torch)")
    add_force_argument(p)
    p.add_argument("--no-sections", action="store_true", help="omit the section table")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


@COMMAND.runs
def run(args) -> int:
    check_snapshot_name(args.snapshot)
    return each_rank(args, run_one)


def replay_phases(trace, res) -> dict | None:
    """The phases' shares of the requests and of the live bytes where the replay's reserved peak was first
    reached (where the policy says; else at the LOAD peak: ``at_reserved_peak`` False); None without phases."""
    from ..trace.events import PHASE_BEGIN
    from ..trace.phases import phase_shares
    if PHASE_BEGIN not in trace.kinds_present:
        return None
    peak = res.breakdown_at_peak
    shares = phase_shares(trace, peak["event"] if peak else None)
    return {**shares, "at_reserved_peak": bool(peak)}


def run_one(args) -> int:
    with warm_cache_trace(args.trace, args.warm_cache, COMMAND.name) as path:
        return _replay(args, path)


def _replay(args, path: str | None) -> int:
    """`run_one` of the trace at ``path`` (``args.trace`` itself, or its warm view)."""
    spec = PolicySpec.parse(args.policy).with_options(args.policy_opt)
    if args.snapshot is not None:
        check_exportable(spec, args.runtime)
        claim_outputs([("--snapshot", args.snapshot)], inputs_of(args), force=args.force)
    quiet = args.quiet or args.json
    t0 = time.perf_counter()
    trace = load_trace(path, quiet)
    loaded = time.perf_counter() - t0
    planned, close_plan = lazy_progress_bar(f"plan {args.policy}", quiet, unit="buffer")
    update, close = progress_bar(trace.n_allocs * 2, f"replay {args.policy}", quiet)
    settings = replay_settings(args, trace, runtime=args.runtime)
    check_caps([settings.cap], settings.capacity, trace)
    try:
        res = (replay if args.snapshot is None else replay_snapshot)(trace, spec, settings, progress=update,
                                                                     plan_progress=planned)
    finally:
        close_plan()
        close()
    if args.snapshot is not None:
        res, snapshot = res
        write_snapshot(snapshot, args.snapshot)     # an OOMed run too: its oom entry is what a user looks for
        say_snapshot_written(snapshot, args.snapshot, f"the replay under {spec.label}")
    res.load_seconds = loaded
    if path != args.trace:
        res.trace = shown_name(args.trace)
    phases = replay_phases(trace, res)
    if args.json:
        dump_json({**res.to_dict(), **({"folded": res.folded} if res.folded else {}),
                   **({"phases": phases} if phases else {}),
                   **({"warm_cache": trace.meta["warm_cache"]} if args.warm_cache else {})})
    else:
        print(replay_summary(res, trace.n_allocs))
        if phases:
            print("\n".join(phase_lines(phases, trace.n_allocs, "the reserved peak" if phases["at_reserved_peak"]
                                         else "the LOAD peak")))
        if not args.no_sections:
            print()
            print(section_table(res.sections))
    name = args.trace or '<embedded>/' + DEFAULT_TRACE
    again = [o for o in res.oom_events if o.recorded]
    if again and not args.keep_going:      # the program survived them, and so does the replay
        print(f"allocsim: {name}: {len(again)} recorded OOM{'s' if len(again) > 1 else ''} happened again, as in "
              f"the recorded run (the replay went on, as the program did), the first at {oom_line(again[0])}",
              file=sys.stderr)
    flagged = [o for o in res.caught_oom_events if o.scope is None]
    if flagged:
        print(f"allocsim: {name}: {len(flagged)} request{'s' if len(flagged) > 1 else ''} that the program "
              f"survives failing (cuDNN workspace tries) failed, the first at {oom_line(flagged[0])}: "
              f"the replay went on without them, as the program goes on to its next config, whose request the "
              f"trace does not hold (none assumed; a benchmark-mode plan search asks again for half, as cuDNN "
              f"does; docs/allocator-dependent.md)", file=sys.stderr)
    tried = [o for o in res.caught_oom_events if o.scope is not None]
    if tried:
        print(f"allocsim: {name}: {len(tried)} OOM{'s' if len(tried) > 1 else ''} inside code that catches "
              f"{'them' if len(tried) > 1 else 'it'} (try scopes), survived, the first at {oom_line(tried[0])} "
              f"(\"{tried[0].scope}\"): each try unwound as the exception would ({res.unwound_blocks:,} blocks freed, "
              f"{res.skipped_allocs:,} later requests of the tries skipped; docs/allocator-dependent.md)",
              file=sys.stderr)
    if not res.completed:                  # the walk stops at the OOM it just recorded
        print(f"allocsim: {name}: out of memory at "
              f"{oom_line(res.oom_events[-1])} (replay stopped; --keep-going counts OOMs and goes on)", file=sys.stderr)
        return 1
    return 0
