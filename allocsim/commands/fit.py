"""`allocsim fit`: the smallest device capacity each policy survives (the capacity frontier)."""
from __future__ import annotations

from contextlib import nullcontext

from ..filenames import shown_name
from ..fit import MAX_REPLAYS, MiB, fit_many
from ..report.tables import dump_json
from ..report.text import fit_table
from ..sweep import Settings, process_pool
from ._ranks import each_rank
from ._common import (PhaseReport, add_cost_model_argument, add_fold_argument, add_jobs_argument, add_policies_argument, load_trace,
                      count, plural, policy_specs, positive_size, progress_bar, replay_settings)

NAME = "fit"
HELP = "find each policy's safe capacity (no OOM from it up), and smaller passing islands, beside LOAD and the oracle"
EXAMPLE = "allocsim fit traces/resnet50.bin --policies binned,split,torch,cupy,bestfit -j 2"


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
             quiet=True, max_replays=MAX_REPLAYS) -> dict:
    from .. import policies
    from ..spec import PolicySpec
    from ..sweep import Cell, run_cell
    t = load_trace(trace, quiet)
    fits_args = [dict(trace=trace, policy=spec, runtime=runtime, settings=settings, resolution=resolution,
                      max_replays=max_replays) for spec in specs]
    with_oracle = oracle and "oracle" in policies.names()
    update, close = progress_bar(None, f"fit {plural(len(specs), 'policy')}", quiet, unit=" replays")
    phases = PhaseReport("fit", len(specs) + with_oracle, "policy", quiet=quiet)    # off a terminal: a line each
    done = [0]

    def replayed():
        done[0] += 1
        update(done[0])

    oracle_cell = Cell(trace, PolicySpec.parse("oracle"), None, runtime, capacity=None) if with_oracle else None
    try:
        with nullcontext() if jobs <= 1 else process_pool(jobs) as ex:   # the oracle's replay beside the walks
            oracle_row = ex.submit(run_cell, oracle_cell, settings) if ex is not None and with_oracle else None
            fits = fit_many(fits_args, ex, jobs, on_replay=None if quiet else replayed,
                            on_fit=lambda i, f: phases.end(f"{specs[i].label}: {plural(f['replays'], 'replay')}"))
            if with_oracle:
                oracle_peak = (oracle_row.result() if oracle_row else run_cell(oracle_cell, settings))[
                    "peak_reserved_bytes"]
                phases.end("oracle: its peak")
    finally:
        close()
    out = {"trace": shown_name(trace), "load_bytes": t.load_bytes, "resolution_bytes": resolution, "fits": fits}
    if with_oracle:
        out["oracle_peak_bytes"] = oracle_peak
    return out


def run(args) -> int:
    return each_rank(args, run_one)


def run_one(args) -> int:
    specs = policy_specs(args.policies)
    resolution = positive_size(args.resolution, "--resolution")
    res = frontier(args.trace, specs, runtime=args.runtime, resolution=resolution, max_replays=args.max_replays,
                   jobs=args.jobs, settings=Settings(replay_settings(args)),
                   oracle=not args.no_oracle, quiet=args.quiet or args.json)
    if args.json:
        dump_json(res)
        return 0
    print(fit_table(res, args.max_replays))
    return 0
