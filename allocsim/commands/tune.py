"""`allocsim tune`: the allocator settings that make a trace fit, searched offline (`allocsim.tune`)."""
from __future__ import annotations

import time

from ..outputs import add_force_argument, claim_outputs
from ..sweep import Settings
from ..tune import OBJECTIVES, TOP, tune
from ..units import fmt_bytes, fmt_seconds
from ._common import (add_cost_model_argument, add_jobs_argument, capacity_arg, cost_model_arg, dump_json,
                      load_trace, positive_size)

NAME = "tune"
HELP = "search the allocator's settings for the ones that make this run fit (PYTORCH_ALLOC_CONF, CuPy limit, pool caps)"
EXAMPLE = "allocsim tune traces/gpt2.bin --capacity 8.5GiB -j 2 --plot frontier.png"


def add_arguments(p):
    p.add_argument("trace", help="trace file (.bin)")
    p.add_argument("--capacity", default="trace",
                   help="the GPU's memory to fit in, e.g. 24GB (default: the recorded device's; none: unlimited)")
    p.add_argument("--cap", help="the allocator's allowed memory within it (torch: the per-process memory fraction)")
    p.add_argument("--objective", default="reserved", choices=OBJECTIVES,
                   help="reserved: least peak reserved; time: least modeled allocation time; both: the best balance "
                        "on their Pareto frontier (default reserved)")
    p.add_argument("--top", type=int, default=TOP, metavar="N", help=f"candidates in the table (default {TOP})")
    p.add_argument("--max-replays", type=int, default=0, metavar="N",
                   help="replay at most N distinct settings, those nearest the recorded ones first (default 0: all)")
    p.add_argument("--no-fit", action="store_true", help="skip the smallest-GPU walk for the finalists")
    add_jobs_argument(p)
    add_cost_model_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.add_argument("--plot", metavar="OUT", help="draw the Pareto frontier of peak reserved vs allocation time "
                                                 "(.png, .svg or .pdf)")
    add_force_argument(p)


def run(args) -> int:
    from ..errors import UsageError
    claim_outputs([("--plot", args.plot)], [args.trace, args.cost_model], force=args.force)
    if args.plot:
        from ..plots import picture_format
        if not picture_format(args.plot):
            raise UsageError(f"--plot {args.plot}: expected a .png, .svg or .pdf path")
    for flag, n in (("--top", args.top), ("--max-replays", args.max_replays)):
        if n < (1 if flag == "--top" else 0):
            raise UsageError(f"{flag}: expected {'1' if flag == '--top' else '0 (no limit)'} or more, got {n}")
    load_trace(args.trace)
    cap = positive_size(args.cap, "--cap") if args.cap is not None else None
    costs = cost_model_arg(args.cost_model)
    t0 = time.perf_counter()
    res = tune(args.trace, capacity=capacity_arg(args.capacity), cap=cap, objective=args.objective, jobs=args.jobs,
               top=args.top, fit=not args.no_fit, max_replays=args.max_replays,
               settings=Settings(costs=costs.to_dict() if costs else None))
    took = time.perf_counter() - t0
    if args.plot:
        from ..tune import frontier_figure
        from ..plots import save
        save(frontier_figure(res), args.plot)
    if args.json:
        dump_json(res.to_dict())
        return 0
    print(report(res, took))
    return 0


def report(res, took: float) -> str:
    """The text report: target, search figures, the line to paste, the table, the OOM rescue."""
    tgt = res.target
    where = (f"capacity {fmt_bytes(tgt.capacity)}" if tgt.capacity is not None else "no capacity limit") + \
        (f", cap {fmt_bytes(tgt.cap)}" if tgt.cap is not None else "")
    lines = [f"{res.trace}: LOAD {fmt_bytes(res.load_bytes)}; target {where}; objective {res.objective}",
             f"searched {res.settings_total} settings, {res.settings_distinct} distinct on this trace"
             + (f", the first {len(res.rows)} replayed (--max-replays)" if res.bounded else "")
             + f"; {res.replays} replays in {took:.1f}s", ""]
    best = res.best
    if best is None:
        lines.append("no setting fits this target; the table shows the ones that got furthest")
    else:
        lines.append("recommended:" + (f" ({best['setting']}: already the best)" if best["recorded"] else ""))
        lines += [f"  {best[k]}" for k in ("conf", "legacy_conf") if best.get(k)]
        if best.get("note"):
            lines.append(f"  ({best['note']})")
    lines += ["", table([res.recorded] + [r for r in res.finalists if r is not res.recorded], res.load_bytes)]
    lines.append("fits on: the smallest device capacity from which every capacity up replays without OOM "
                 "(certified walk; * bounded); dominated: another setting is as good in reserved and time")
    if res.rescue and res.recorded["ooms_avoided"] is None:
        lines.append("(the replays and capacity walks do not drive the recorded OOM requests; the rescue walk "
                     "below gives them to each setting)")
    for o in res.rescue:
        lines.append(f"recorded OOM at event {o['event']} ({fmt_bytes(o['size'])} request): under the recorded "
                     f"settings {rescued(o['recorded'])}; served by {len(o['served_by'])} of {len(res.rows)} settings"
                     + (f", most headroom under {o['served_by'][0]['setting']}"
                        + _headroom(o["served_by"][0]["headroom_bytes"]) if o["served_by"] else ""))
    return "\n".join(lines)


def rescued(o: dict) -> str:
    """What one setting does with a recorded failed request."""
    if not o["reached"]:
        return "it runs out earlier"
    return "it is served" + _headroom(o["headroom_bytes"]) if o["served"] else "it fails again"


def _headroom(room) -> str:
    return f" ({fmt_bytes(room)} headroom left)" if room is not None else ""


def table(rows: list[dict], load: int) -> str:
    head = ["setting", "peak reserved", "over LOAD", "OOM", "dev mallocs/frees", "retries", "alloc time", "fits on"]
    body = []
    for r in rows:
        if "fit_capacity_bytes" in r:
            fits = r["fit_capacity_bytes"]
            fits = "none" if fits is None else fmt_bytes(fits) + ("" if r["fit_threshold"] else "*")
        else:
            fits = "-" if r["pareto"] or r["recorded"] else "dominated"
        body.append([r["setting"], fmt_bytes(r["peak_reserved_bytes"]), f"{100 * r['overhead_vs_load']:+.1f}%",
                     "-" if r["first_oom_event"] is None else f"@{r['first_oom_event']}",
                     f"{r['device_mallocs']:,} / {r['device_frees']:,}", f"{r['retries']:,}",
                     fmt_seconds(r["alloc_time_seconds"]), fits])
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    fmt = lambda cols: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cols, widths)))
    return "\n".join([fmt(head), fmt(["─" * w for w in widths])] + [fmt(b) for b in body])
