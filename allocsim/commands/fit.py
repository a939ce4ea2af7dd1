"""`allocsim fit`: the smallest device capacity each policy survives (the capacity frontier)."""
from __future__ import annotations

import sys

from ..fit import MiB, _fit_job
from ..sweep import Settings, process_pool
from ..units import fmt_bytes
from ._common import add_jobs_argument, cost_model_arg, dump_json, load_trace, policy_specs, positive_size

NAME = "fit"
HELP = "find each policy's smallest capacity without OOM (bisection), beside LOAD and the oracle"
EXAMPLE = "allocsim fit traces/resnet50.bin --policies binned,split,torch,cupy,bestfit -j 2"


def add_arguments(p):
    p.add_argument("trace", help="trace file (.bin)")
    p.add_argument("--policies", "-p", default="binned,split,knet,torch,cupy,bestfit")
    p.add_argument("--runtime", default="eager", choices=["eager", "gc"])
    p.add_argument("--resolution", default="1MiB", help="bisection resolution (default 1MiB)")
    p.add_argument("--cost-model", metavar="FILE")
    add_jobs_argument(p)
    p.add_argument("--no-oracle", action="store_true", help="skip the offline oracle's peak")
    p.add_argument("--json", action="store_true")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")


def frontier(trace: str, specs, *, runtime="eager", resolution=MiB, jobs=1, settings=None, oracle=True,
             quiet=True) -> dict:
    from .. import policies
    from ..spec import PolicySpec
    from ..sweep import Cell, run_cell
    t = load_trace(trace)
    jobs_args = [(trace, spec, {"runtime": runtime, "settings": settings, "resolution": resolution})
                 for spec in specs]
    bar = None
    if not quiet and sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=len(jobs_args), desc="fit", unit="policy", leave=False)
    if jobs > 1:
        with process_pool(jobs) as ex:
            fits = []
            for f in ex.map(_fit_job, jobs_args):
                fits.append(f)
                if bar:
                    bar.update()
    else:
        fits = []
        for a in jobs_args:
            fits.append(_fit_job(a))
            if bar:
                bar.update()
    if bar:
        bar.close()
    out = {"trace": trace, "load_bytes": t.load_bytes, "resolution_bytes": resolution, "fits": fits}
    if oracle and "oracle" in policies.names():
        oracle_cell = Cell(trace, PolicySpec.parse("oracle"), None, runtime, capacity=None)
        out["oracle_peak_bytes"] = run_cell(oracle_cell, settings)["peak_reserved_bytes"]
    return out


def run(args) -> int:
    specs = policy_specs(args.policies)
    resolution = positive_size(args.resolution, "--resolution")
    costs = cost_model_arg(args.cost_model)
    res = frontier(args.trace, specs, runtime=args.runtime, resolution=resolution,
                   jobs=args.jobs, settings=Settings(costs=costs.to_dict() if costs else None),
                   oracle=not args.no_oracle, quiet=args.quiet or args.json)
    if args.json:
        dump_json(res)
        return 0
    load = res["load_bytes"]
    print(f"{args.trace}: LOAD {fmt_bytes(load)}" + (f", oracle peak {fmt_bytes(res['oracle_peak_bytes'])}"
                                                     if "oracle_peak_bytes" in res else ""))
    labels = [f["policy"] + (f"[{f['options']}]" if f["options"] else "") for f in res["fits"]]
    w = max([len("policy")] + [len(x) for x in labels]) + 2
    print(f"{'policy':<{w}}{'smallest capacity':>18}{'vs LOAD':>10}{'no-limit peak':>16}{'replays':>9}")
    for f in sorted(res["fits"], key=lambda f: f["capacity_bytes"]):
        label = f["policy"] + (f"[{f['options']}]" if f["options"] else "")
        print(f"{label:<{w}}{fmt_bytes(f['capacity_bytes']):>18}{100 * (f['capacity_bytes'] / load - 1) if load else 0:>+9.1f}%"
              f"{fmt_bytes(f['unlimited_peak_bytes']):>16}{f['replays']:>9}")
    return 0
