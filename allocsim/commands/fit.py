"""`allocsim fit`: the smallest device capacity each policy survives (the capacity frontier)."""
from __future__ import annotations

import sys
import time
from contextlib import nullcontext

from ..filenames import shown_name
from ..search.fit import MAX_REPLAYS, MiB, fit_many
from ..report.tables import dump_json
from ..report.text import fit_table
from ..search.sweep import Settings, process_pool
from ._command import Command
from ._ranks import each_rank
from ._common import (add_cost_model_argument, add_fold_argument, add_jobs_argument, add_policies_argument, load_trace,
                      count, plural, policy_specs, positive_size, progress_bar, recorded_settings, replay_settings)

COMMAND = Command(
    name="fit",
    help=("find each policy's safe capacity (no OOM from it up), and smaller passing islands, beside LOAD and "
          "the oracle"),
    example="allocsim fit traces/resnet50.bin --policies binned,split,torch,cupy,bestfit -j 2")


@COMMAND.arguments
def add_arguments(p):
    p.add_argument("trace", help="trace file (.bin), or a run's name (run.bin for run.rank0.bin, ...: each rank)")
    add_policies_argument(p, "binned,split,knet,torch,cupy,bestfit")
    p.add_argument("--runtime", default="eager", choices=["eager", "gc"],
                   help="eager: frees reach the pool at once; gc: frees wait for a collection (default eager)")
    p.add_argument("--resolution", default="1MiB", help="capacity grid (default 1MiB)")
    p.add_argument("--max-replays", type=count(0, " (0: no limit)"), default=MAX_REPLAYS,
                   metavar="N",
                   help=f"stop a policy's walk down from its peak after N replays (default {MAX_REPLAYS}; 0: no limit); "
                        "the answer is then safe but marked *, a lower safe capacity may exist")
    add_cost_model_argument(p)
    add_fold_argument(p)
    add_jobs_argument(p)
    p.add_argument("--no-oracle", action="store_true", help="skip the offline oracle's peak")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def frontier(trace: str, specs, *, runtime="eager", resolution=MiB, jobs=1, settings=None, oracle=True,
             quiet=True, max_replays=MAX_REPLAYS, loaded=None) -> dict:
    """The capacity frontier of ``specs`` on the trace at path ``trace`` (``loaded``: that trace, where the caller
    has read it already; the walks read it by its path)."""
    from .. import policies
    from ..engine.spec import PolicySpec
    from ..search.sweep import Cell, run_cell
    t = loaded if loaded is not None else load_trace(trace, quiet)
    fits_args = [dict(trace=trace, policy=spec, runtime=runtime, settings=settings, resolution=resolution,
                      max_replays=max_replays) for spec in specs]
    with_oracle = oracle and "oracle" in policies.names()
    update, close = progress_bar(None, f"fit {plural(len(specs), 'policy')}", quiet, unit=" replays")
    progress = _FitProgress(specs, with_oracle, jobs, quiet, update)
    oracle_cell = Cell(trace, PolicySpec.parse("oracle"), None, runtime, capacity=None) if with_oracle else None
    try:
        with nullcontext() if jobs <= 1 else process_pool(jobs) as ex:   # the oracle's replay beside the walks
            oracle_row = None
            if ex is not None and with_oracle:
                sent = time.perf_counter()
                oracle_row = ex.submit(run_cell, oracle_cell, settings)
                oracle_row.add_done_callback(lambda f: progress.oracle_ran(time.perf_counter() - sent))
            fits = fit_many(fits_args, ex, jobs, on_replay=progress.replayed, on_fit=progress.fitted)
            if with_oracle:
                sent = time.perf_counter()
                row = oracle_row.result() if oracle_row else run_cell(oracle_cell, settings)
                if oracle_row is None:
                    progress.oracle_ran(time.perf_counter() - sent)
                oracle_peak = row["peak_reserved_bytes"]
                progress.line("oracle: its peak", progress.oracle_seconds)
    finally:
        close()
    out = {"trace": shown_name(trace), "load_bytes": t.load_bytes, "resolution_bytes": resolution, "fits": fits}
    if with_oracle:
        out["oracle_peak_bytes"] = oracle_peak
    return out


class _FitProgress:
    """fit's progress: the replays counted on a terminal's bar; elsewhere a line as each policy's walk ends, with
    the time its own replays took (under -j the walks run side by side: the wall time since the line before
    would be the others' too), and about how long the rest will take: the replays the walks still need
    (`fit.Walk.left`; a walk not started yet, as many as a finished one took on average) at the mean replay time
    so far, over the processes."""

    def __init__(self, specs, with_oracle: bool, jobs: int, quiet: bool, update):
        self.labels, self.with_oracle, self.jobs, self.update = [s.label for s in specs], with_oracle, jobs, update
        self.lines = not quiet and not sys.stderr.isatty()
        self.walks: list = []
        self.seconds = [0.0] * len(specs)           # per walk: its replays' time
        self.replays = [0] * len(specs)
        self.ended = 0
        self.oracle_seconds = None

    def replayed(self, walks, i: int, seconds: float) -> None:
        self.walks = walks
        self.seconds[i] += seconds
        self.replays[i] += 1
        self.update(sum(self.replays))

    def oracle_ran(self, seconds: float) -> None:
        self.oracle_seconds = seconds

    def fitted(self, i: int, fit: dict) -> None:
        self.line(f"{self.labels[i]}: {plural(fit['replays'], 'replay')}", self.seconds[i])

    def _left(self) -> float:
        """About the seconds the walks (and the oracle, if it runs last) still take."""
        from math import isfinite
        per_replay = sum(self.seconds) / max(1, sum(self.replays))
        done = [w.replays for w in self.walks if w.done]
        unstarted = sum(done) / len(done) if done else 0.0
        left = sum(w.left() if isfinite(w.left()) else unstarted for w in self.walks if not w.done)
        oracle = per_replay if self.with_oracle and self.oracle_seconds is None and self.jobs <= 1 else 0.0
        return per_replay * left / max(1, self.jobs) + oracle

    def line(self, what: str, seconds: float) -> None:
        self.ended += 1
        if not self.lines:
            return
        total = len(self.labels) + self.with_oracle
        text = f"allocsim fit: {what} in {seconds or 0.0:.1f}s ({self.ended} of {plural(total, 'policy')}"
        text += f"; about {self._left():.0f}s left)" if self.ended < total else ")"
        print(text, file=sys.stderr, flush=True)


@COMMAND.runs
def run(args) -> int:
    return each_rank(args, run_one)


def run_one(args) -> int:
    specs = policy_specs(args.policies)
    resolution = positive_size(args.resolution, "--resolution")
    trace = load_trace(args.trace, args.quiet or args.json)
    res = frontier(args.trace, specs, runtime=args.runtime, resolution=resolution, max_replays=args.max_replays,
                   jobs=args.jobs, settings=Settings(replay_settings(args)),
                   oracle=not args.no_oracle, quiet=args.quiet or args.json, loaded=trace)
    if args.json:
        dump_json(res)
        return 0
    print(fit_table(res, args.max_replays, recorded_settings(specs, trace)))
    return 0
