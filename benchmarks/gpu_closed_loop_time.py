"""The closed loop with time (issue 17): record, tune, then run the recommendation and its rivals on the GPU.

For each workload: record it unconstrained; for the capped one find a cap under which the recorded
(default) settings run out (`gpu_closed_loop.rescue_cap`); run `allocsim tune` (its default objective:
fit with headroom, then the fastest); then record the script again under each of the recorded settings,
``expandable_segments:True``, the recommendation and the other finalists that fit, and compare what tune
predicted (peak reserved, cudaMalloc/cudaFree, OOMs, modeled time) with what the allocator reports and the
median step the script measured. The recommendation passes when its measured step is within 5 % of the
fastest measured setting that ran without an OOM.

    OUT=dir python3 benchmarks/gpu_closed_loop_time.py [WORKLOAD ...]     # on a GPU machine, repo root

Writes ``$OUT/closed_loop_time.json`` and prints a table.
"""
from __future__ import annotations

import json
import os
import sys
import time

from gpu_closed_loop import best_row, fraction_for, record, rescue_cap, tune

WORKLOADS = [
    # name, script and its arguments, capped (a cap where the defaults run out)
    ("resnet50", ["examples/resnet50_train.py", "--iters", "12", "--warmup", "4"], False),
    ("gpt2_variable", ["examples/gpt2_variable.py", "--iters", "12", "--warmup", "4"], False),
    ("maskrcnn_variable", ["examples/maskrcnn_variable.py", "--iters", "24", "--warmup", "4", "--batch", "2"],
     True),
]
RIVALS = 2          # finalists run besides the recommendation, the recorded settings and expandable segments


def settings_to_run(res: dict) -> list[dict]:
    """The rows to run: recorded, expandable segments, the recommendation, a few other finalists; each once."""
    rows = res["finalists"] + res["candidates"]
    best = best_row(res)
    expandable = next((r for r in rows if r.get("setting") == "expandable_segments:True"), None)
    others = [r for r in res["finalists"] if r is not best and not r.get("ooms")][:RIVALS]
    out: dict[str, dict] = {}           # conf -> the row, with every role it plays
    for role, r in [("recorded", res["recorded"]), ("expandable", expandable), ("recommended", best)] + \
            [("finalist", r) for r in others]:
        if r is not None:
            out.setdefault(r.get("conf", ""), {**r, "role": ""})["role"] += ("+" if out[r.get("conf", "")]["role"]
                                                                            else "") + role
    return list(out.values())


def main() -> int:
    only = sys.argv[1:]            # workload names to run (default: all)
    out = os.environ.get("OUT", "/tmp/closed_loop_time")
    os.makedirs(out, exist_ok=True)
    report = []
    for name, script, capped in WORKLOADS:
        if only and name not in only:
            continue
        t0 = time.time()
        base = os.path.join(out, f"{name}.bin")
        measured0 = record(base, script)
        fraction, cap = 0.0, None
        if capped:
            cap, res = rescue_cap(base, measured0["peak_reserved_bytes"])
            total = json.load(open(base + ".stats.json"))["device"]["total_memory"]
            fraction = fraction_for(cap, total)
            res = tune(base, "--cap", str(cap), "--no-fit")
        else:
            res = tune(base, "--no-fit")
        runs = []
        for k, row in enumerate(settings_to_run(res)):
            conf = row.get("conf") or ""
            m = record(os.path.join(out, f"{name}-{k}.bin"), script, conf, fraction)
            runs.append({"role": row["role"], "setting": row["setting"], "conf": conf,
                         "predicted": {f: row.get(f) for f in ("peak_reserved_bytes", "device_mallocs", "device_frees",
                                                               "ooms", "total_time_seconds")},
                         "measured": m})
        ran = [r for r in runs if not r["measured"]["ooms"] and r["measured"]["exit_status"] == 0
               and r["measured"]["median_step_ms"]]
        fastest = min((r["measured"]["median_step_ms"] for r in ran), default=None)
        best = next(r for r in runs if "recommended" in r["role"].split("+"))
        step = best["measured"]["median_step_ms"]
        report.append({"workload": name, "cap_bytes": cap, "fraction": fraction, "unconstrained": measured0,
                       "runs": runs, "fastest_ms": fastest, "recommended_ms": step,
                       "within_5_percent": bool(step and fastest and step <= 1.05 * fastest),
                       "seconds": round(time.time() - t0, 1)})
        print(json.dumps(report[-1], indent=1), flush=True)
        with open(os.path.join(out, "closed_loop_time.json"), "w") as f:
            json.dump(report, f, indent=1)
    print(f"{'workload':18} {'role':22} {'setting':44} {'peak pred':>14} {'peak real':>14} {'mallocs':>11} "
          f"{'frees':>11} {'OOM':>5} {'model ms':>9} {'step ms':>8}")
    for w in report:
        for r in w["runs"]:
            p, m = r["predicted"], r["measured"]
            print(f"{w['workload']:18} {r['role']:22} {r['setting'][:44]:44} {p['peak_reserved_bytes'] or 0:14,} "
                  f"{m['peak_reserved_bytes']:14,} {p['device_mallocs']:>5}/{m['device_mallocs']:<5} "
                  f"{p['device_frees']:>5}/{m['device_frees']:<5} {p['ooms']}/{m['ooms']:<3} "
                  f"{1e3 * (p['total_time_seconds'] or 0):9.1f} {m['median_step_ms'] or float('nan'):8.1f}")
        print(f"{'':18} recommended {w['recommended_ms']} ms, fastest that ran {w['fastest_ms']} ms: "
              f"within 5 %: {w['within_5_percent']}")
    return 0 if all(w["within_5_percent"] for w in report) else 1


if __name__ == "__main__":
    sys.exit(main())
