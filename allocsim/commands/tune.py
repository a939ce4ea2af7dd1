"""`allocsim tune`: the allocator settings that make a trace fit, searched offline (`allocsim.search.tune`)."""
from __future__ import annotations

import os
import sys
import tempfile
import time
from contextlib import contextmanager

from ..filenames import shown_name
from ..outputs import add_force_argument, check_input_file, claim_outputs, is_trace
from ..engine.replay import ReplaySettings
from ..search.sweep import Settings, cached_trace
from ..search.tune import HEADROOM, OBJECTIVES, TOP, load_words, tune
from ..report.tables import dump_json
from ..engine.spec import PolicySpec
from ..trace import Trace
from ..trace.schema import check_meta
from ..report.tune import tune_report
from ..machine.capacity import device_capacity
from ..machine.ranks import check_room, fit_capacity, given_capacity
from ..trace.scopes import may_survive, sure_load
from ..trace.events import MAX_SIZE
from ..units import fmt_bytes, parse_size
from ._command import Command
from ._common import (WARNINGS, PhaseReport, add_cost_model_argument, add_dask_arguments, add_fold_argument, add_jobs_argument,
                      add_warm_cache_argument, cap_arg, capacity_arg, check_scheduler, check_snapshot_name,
                      cost_model_arg, count, dask_cluster, inputs_of, say_snapshot_written, warm_cache_trace)
from ._ranks import traces_of

COMMAND = Command(
    name="tune",
    help=("search the allocator's settings for the ones that make this run fit (PYTORCH_ALLOC_CONF, CuPy limit, "
          "pool caps)"),
    example="allocsim tune traces/gpt2.bin --capacity 8.5GiB -j 2 --plot frontier.png")


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("trace", nargs="+",
                   help="trace file (.bin), or a PyTorch memory snapshot, RMM CSV or CuPy JSONL log "
                        "(imported on the fly); or a run's name (run.bin for run.rank0.bin, ...): its worst "
                        "rank tuned, the setting checked on every rank; or several traces (.bin) or runs (the run and its "
                        "re-run: a process recorded again is checked on each recording, and the frees that moved "
                        "between them are named)")
    p.add_argument("--capacity", default="trace",
                   help="the GPU's memory to fit in, e.g. 24GB (default: the recorded device's; none: unlimited)")
    p.add_argument("--cap", help="the allocator's allowed memory within it (torch: the per-process memory fraction): "
                   "a size, 1.2x (of the trace's LOAD) or 90%% (of the device's memory)")
    p.add_argument("--objective", default="fastest", choices=OBJECTIVES,
                   help="fastest: fit with --headroom to spare, then the least modeled time; reserved: least peak "
                        "reserved; time: least modeled time; both: the best balance on their Pareto frontier "
                        "(default fastest)")
    p.add_argument("--headroom",
                   help="what fastest keeps free under the limit (the cap, else the capacity): a share such as "
                        f"5%% or a size such as 2GiB (default {100 * HEADROOM:.0f}%%); for --objective fastest only")
    p.add_argument("--top", type=count(1), default=TOP, metavar="N", help=f"candidates in the table (default {TOP})")
    p.add_argument("--max-replays", type=count(0, " (0: no limit)"), default=0, metavar="N",
                   help="replay at most N distinct settings, those nearest the recorded ones first (default 0: all)")
    p.add_argument("--no-fit", action="store_true", help="skip the smallest-GPU walk for the finalists")
    add_warm_cache_argument(p, "tune for")
    add_jobs_argument(p)
    add_dask_arguments(p)
    add_cost_model_argument(p)
    add_fold_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress (a bar, or a line per phase)")
    p.add_argument("--plot", metavar="OUT", help="draw the Pareto frontier of peak reserved vs allocation time "
                                                 "(.png, .svg or .pdf)")
    p.add_argument("--snapshot", metavar="FILE", help="also write the replay under the recommended setting as a "
                   "PyTorch memory snapshot (torch traces; open it in https://pytorch.org/memory_viz)")
    add_force_argument(p)


@COMMAND.runs
def run(args) -> int:
    check_snapshot_name(args.snapshot)
    paths = traces_of(args)
    if args.headroom is not None and args.objective != "fastest":
        from ..errors import UsageError     # (the other objectives rank by peak or time alone: it would change nothing)
        raise UsageError(f"--headroom is for --objective fastest; {args.objective} does not keep any")
    if len(paths) > 1:
        return _tune_run(args, paths)
    args.trace = args.trace[0]
    _check_options(args)            # before a log is imported: a refusal is then the one line
    with _as_trace(paths[0]) as imported, warm_cache_trace(imported, args.warm_cache, COMMAND.name, args.trace) as path:
        return _tune(args, path)


@contextmanager
def _as_trace(path: str):
    """``path`` itself if it is a trace; else (a PyTorch snapshot — one taken in an OOM handler too —, an RMM
    or CuPy log) the same run imported into a temporary trace for the length of the command."""
    check_input_file(path)          # a FIFO is neither, and reading it to find out would wait forever
    if is_trace(path):
        yield path
        return
    from ..errors import InputError
    from ..formats.importers import detect, import_file
    from .import_ import show_warnings
    try:
        fmt = detect(path)
    except InputError as e:
        raise InputError(f"neither an allocsim trace nor a log allocsim imports: {e.what.split('; pass --format')[0]}",
                         path=e.path, position=e.position) from None
    with tempfile.TemporaryDirectory(prefix="allocsim-tune-") as d:
        out = os.path.join(d, os.path.basename(path) + ".bin")
        show_warnings(path, import_file(path, out, format=fmt))
        print(f"allocsim tune: {path}: a {fmt} log, imported for the search (allocsim import {path} -o run.bin "
              f"keeps it)", file=sys.stderr)
        yield out


def _check_options(args) -> None:
    """The scheduler's address and the outputs of a one-trace tune, checked before any work."""
    from ..errors import UsageError
    check_scheduler(args)
    claim_outputs([("--plot", args.plot), ("--snapshot", args.snapshot)], inputs_of(args),
                  force=args.force)
    if args.plot:
        from ..report.plots import picture_format
        if not picture_format(args.plot):
            raise UsageError(f"--plot {args.plot}: expected a .png, .svg or .pdf path")


def _load_once(path: str) -> Trace:
    """The trace, loaded and checked once per tune: the search's own copy (`allocsim.search.sweep.cached_trace`, which
    the replays and capacity walks made in this process read too), an unfinished one said when the command is done,
    as `load_trace` says it."""
    trace = cached_trace(path)
    if not trace.finished:
        WARNINGS.setdefault(os.path.abspath(path), f"{shown_name(path)}: unfinished (its writer died, or is still "
                                                   f"writing): the figures are of the {len(trace):,} events read")
    return trace


def _tune(args, path: str) -> int:
    from ..errors import UsageError
    trace = _load_once(path)
    if trace.load_bytes == 0:       # every setting ties at 0 B: a "recommendation" would be the first one listed
        from ..errors import InputError
        raise InputError("holds no allocation of a byte or more (LOAD 0 B): nothing to tune", path=args.trace)
    if args.snapshot is not None and trace.meta.get("framework") != "torch":
        raise UsageError(f"--snapshot: {args.trace} was not recorded under PyTorch; only torch settings export "
                         f"as a PyTorch memory snapshot")
    cap = cap_arg(args.cap, "--cap", trace, capacity_arg(args.capacity)) if args.cap is not None else None
    need = sure_load(trace)
    check_room(capacity_arg(args.capacity), trace, need, load_words(need, may_survive(trace)), given=args.capacity)
    capacity, outside = fit_capacity(capacity_arg(args.capacity), trace)
    if outside:
        say_outside(args.trace, capacity, outside, args.capacity, trace)
    t0 = time.perf_counter()
    progress = PhaseReport("tune", quiet=args.json or args.quiet)
    try:
        with dask_cluster(args) as (executor, workers):
            res = tune(path, capacity=capacity, cap=cap, progress=progress, executor=executor,
                       **search_options(args, workers))
    finally:
        progress.close()
    res.trace = shown_name(args.trace)      # as the user named it (an imported log's temporary trace is gone after)
    res.run = run_tuned_for(trace, args.warm_cache)
    took = time.perf_counter() - t0
    if res.rescue and res.target.capacity is None and res.target.cap is None:
        print("allocsim tune: the trace holds a recorded OOM but does not say the device's memory: every setting "
              "serves it without a limit; give --capacity (the GPU's memory) or --cap", file=sys.stderr)
    if args.plot:
        from ..report.plots import save, tune_frontier_figure
        save(tune_frontier_figure(res), args.plot)
    if args.snapshot is not None:
        _write_snapshot(trace, res, args.snapshot)
    if args.json:
        dump_json({**res.to_dict(), **({"run_tuned_for": res.run} if res.run else {})})
        return 0
    print(tune_report(res, took))
    return 0


def run_tuned_for(trace, warm: bool) -> str | None:
    """Which run of the program the search is for (docs/compile.md), None for a trace without phases; off
    ``--warm-cache``, one stderr line when the recording peaked inside compilation or autotuning."""
    from ..trace.phases import COLD_PHASES, cold_spans, recorded_peak
    if warm:
        return "a later run with warm compile caches (--warm-cache: the recording less what its compile and " \
               "autotune phases allocated for their step only)"
    spans = cold_spans(trace)
    if not len(spans):
        return None
    what, at = recorded_peak(trace)
    if ((spans[:, 0] <= at) & (at < spans[:, 1])).any():
        print(f"allocsim tune: {shown_name(trace.path)}: the recording's {what} (event {at:,}) lies inside "
              f"{'/'.join(COLD_PHASES)}: a later run with warm caches peaks elsewhere; --warm-cache tunes for that "
              f"run", file=sys.stderr)
    return "the recorded run: a first run, which compiled (cold caches); --warm-cache tunes for the later runs"


def search_options(args, workers: int = 0) -> dict:
    """`tune`'s options from the command line, the target's capacity and cap aside (``workers``: a Dask
    cluster's, which stand for ``-j``)."""
    return dict(objective=args.objective, headroom=HEADROOM if args.headroom is None else headroom_arg(args.headroom),
                jobs=workers or args.jobs, top=args.top, fit=not args.no_fit, max_replays=args.max_replays,
                settings=Settings(ReplaySettings(costs=cost_model_arg(args.cost_model), fold=not args.no_fold)))


def say_outside(name: str, capacity: int, outside: int, given: str, trace) -> None:
    """One stderr line: the capacity a trace is fitted in, the GPU (as the user gave it: ``given``, `given_capacity`)
    less what lay outside its allocator."""
    total, _ = device_capacity(capacity_arg(given), trace)
    print(f"allocsim tune: {shown_name(name)}: {fmt_bytes(outside)} of the device lay outside the caching allocator "
          f"when recorded (CUDA context, NCCL, other processes): fitting in the {fmt_bytes(capacity)} that "
          f"{given_capacity(given, total)} leaves beside it", file=sys.stderr)


def _tune_run(args, paths: list[str]) -> int:
    """A run of several ranks (`allocsim.search.tune_ranks`): the worst rank tuned, its answer checked on every rank."""
    from ..errors import UsageError
    from ..report.tune import run_report
    from ..search.tune_ranks import tune_run
    if args.warm_cache:
        raise UsageError(f"--warm-cache: tune one trace at a time for its warm run ({shown_name(paths[0])}, ...); "
                         f"the run's worst rank is the one to start with")
    for flag, value in (("--plot", args.plot), ("--snapshot", args.snapshot)):
        if value is not None:
            raise UsageError(f"{flag}: tune the run's worst rank's trace by itself to draw or export it "
                             f"({shown_name(paths[0])}, ...)")
    for path in paths:          # a log is imported on the fly for one trace; beside others it is named by its trace
        check_input_file(path)
        if not is_trace(path):
            from ..errors import InputError
            raise InputError("not an allocsim trace: to tune a snapshot or log beside other traces, import it first "
                             f"(allocsim import {path} -o NAME.bin)", path=path)
    frameworks = {}
    for path in paths:          # one framework's settings are tuned: another's process would not read them
        meta = Trace.load(path, validate=False).meta
        check_meta(meta, path)
        frameworks.setdefault(meta.get("framework"), path)
    if len(frameworks) > 1:
        (one, first), (other, second) = list(frameworks.items())[:2]
        raise UsageError(f"{first} was recorded under {one or 'no framework'}, {second} under "
                         f"{other or 'no framework'}: tune the processes of one framework together")
    cap = None
    if args.cap is not None:    # 1.2x: of the largest rank's LOAD (the setting must fit every rank)
        largest = max((Trace.load(p, validate=False) for p in paths), key=lambda t: t.load_bytes)
        cap = cap_arg(args.cap, "--cap", largest, capacity_arg(args.capacity))
    t0 = time.perf_counter()
    progress = PhaseReport("tune", quiet=args.json or args.quiet)
    try:
        with dask_cluster(args) as (executor, workers):
            res = tune_run(paths, capacity=capacity_arg(args.capacity), cap=cap, progress=progress, executor=executor,
                           given=args.capacity, **search_options(args, workers))
    finally:
        progress.close()
    if args.json:
        dump_json(res.to_dict())
    else:
        print(run_report(res, time.perf_counter() - t0))
    return 0


def headroom_arg(text: str) -> float | int:
    """``--headroom``: a share of the limit (``5%``, below 100 %) or a size (``2GiB``; 0 keeps none)."""
    from ..errors import UsageError
    if text.strip().endswith("%"):
        try:
            share = float(text.strip()[:-1]) / 100
        except ValueError:
            share = -1.0
        if not 0 <= share < 1:
            raise UsageError(f"--headroom: expected a share from 0% to below 100% or a size, got {text!r}")
        return share
    n = parse_size(text, what="--headroom")        # 0 (0B, 0GiB) keeps none
    if n > MAX_SIZE:
        raise UsageError(f"--headroom: expected a size of at most 1 PiB, got {text!r}")
    return n


def _write_snapshot(trace, res, path: str) -> None:
    """The recommended setting's replay (the recorded one's when none fits) as a PyTorch memory snapshot."""
    from ..formats.exporters.torch_snapshot import write_snapshot
    from ..formats.exporters.torch_snapshot import replay_snapshot
    row = res.best or res.recorded
    _, snapshot = replay_snapshot(trace, PolicySpec.parse(row["spec"]), cap=row["cap_bytes"],
                                  capacity=res.target.capacity)
    write_snapshot(snapshot, path)
    under = "the recorded settings" if row["setting"] == "recorded" else row["setting"]
    say_snapshot_written(snapshot, path, f"the replay under {under}")
