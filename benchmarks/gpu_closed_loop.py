"""The closed loop on a real GPU: record, tune, re-run with the recommendation, record again, compare.

For each workload: ``allocsim record`` the example script as it is (no limit, default settings), run
``allocsim tune`` on that trace, then record the same script again with the recommended
``PYTORCH_ALLOC_CONF`` (and under the tuned cap as a per-process memory fraction, where the workload has
one) and compare what tune predicted with what the allocator itself reports (``memory_stats()`` in the
recording's ``.stats.json``): peak reserved, device mallocs, OOMs. The last workload is the rescue: a cap
under which the default settings run out; the script is recorded once more with the default settings
under that cap, to show the OOM tune predicted really happens.

    OUT=dir python3 benchmarks/gpu_closed_loop.py [--quick]      # on a GPU machine, repo root

Writes ``$OUT/closed_loop.json`` and prints a table. ``--quick`` runs one small workload (the GPU test).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from allocsim.frameworks.torch import fraction_for  # noqa: E402

PY = sys.executable
WORKLOADS = [
    # name, script and its arguments, cap as a fraction of the unconstrained run's peak reserved (None: no cap)
    ("resnet50", ["examples/resnet50_train.py", "--iters", "4"], None),
    ("gpt2", ["examples/gpt2_train.py", "--iters", "4"], None),
    ("bert_mlm", ["examples/bert_mlm.py", "--iters", "4"], None),
    ("gpt2-capped", ["examples/gpt2_train.py", "--iters", "4"], "rescue"),
]
QUICK = [("resnet50-small", ["examples/resnet50_train.py", "--iters", "2", "--batch", "16"], None)]


def sh(args, env=None, check=True) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=ROOT)
    for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run(args, cwd=ROOT, env=e, capture_output=True, text=True)
    if check and p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(args)}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def record(out: str, script: list, conf: str = "", fraction: float = 0.0) -> dict:
    """Record the script (under the conf line and fraction); the allocator's own figures and the exit status."""
    env = dict(kv.split("=", 1) for kv in conf.split() if "=" in kv) if conf.startswith("PYTORCH") else {}
    p = sh([PY, "-m", "allocsim", "record", "--force", "-o", out, "benchmarks/_with_fraction.py", repr(fraction)]
           + script, env=env, check=False)
    with open(out + ".stats.json") as f:
        stats = json.load(f)
    ms = stats["memory_stats"]
    step = re.search(r"median step ([\d.]+) ms", p.stdout)
    return {"exit_status": p.returncode, "allocator_settings": stats.get("allocator_settings"),
            "peak_reserved_bytes": ms["reserved_bytes.all.peak"], "device_mallocs": ms["num_device_alloc"],
            "device_frees": ms["num_device_free"], "ooms": ms["num_ooms"], "retries": ms["num_alloc_retries"],
            "median_step_ms": float(step.group(1)) if step else None}


def tune(trace: str, *args) -> dict:
    return json.loads(sh([PY, "-m", "allocsim", "tune", trace, "--json", "-j", str(min(8, os.cpu_count())),
                          *args]).stdout)


def predicted(res: dict, row: dict) -> dict:
    return {"setting": row["setting"], "peak_reserved_bytes": row["peak_reserved_bytes"],
            "device_mallocs": row["device_mallocs"], "device_frees": row["device_frees"], "ooms": row["ooms"],
            "first_oom_event": row.get("first_oom_event")}


def best_row(res: dict) -> dict:
    conf = res["recommended"]["conf"]
    return next(r for r in res["finalists"] + res["candidates"] if r.get("conf") == conf)


def rescue_cap(trace: str, peak: int) -> tuple[int, dict]:
    """A cap (a multiple of 2 MiB below the unconstrained peak) under which the recorded settings run out
    and tune's recommendation fits."""
    step = 2 << 20
    for frac in (0.97, 0.94, 0.91, 0.88, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6):
        cap = int(peak * frac) // step * step
        res = tune(trace, "--cap", str(cap), "--no-fit")
        if res["recorded"]["ooms"] and res["recommended"] and not best_row(res)["ooms"]:
            return cap, res
    sys.exit(f"{trace}: no cap found where the defaults run out and a setting fits")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    out = os.environ.get("OUT", "/tmp/closed_loop")
    os.makedirs(out, exist_ok=True)
    rows = []
    for name, script, cap_rule in (QUICK if a.quick else WORKLOADS):
        t0 = time.time()
        base = os.path.join(out, f"{name}.bin")
        measured0 = record(base, script)
        row = {"workload": name, "script": " ".join(script), "unconstrained": measured0}
        if cap_rule == "rescue":
            cap, res = rescue_cap(base, measured0["peak_reserved_bytes"])
            total = json.load(open(base + ".stats.json"))["device"]["total_memory"]
            fraction = fraction_for(cap, total)
            row["cap_bytes"], row["fraction"] = cap, fraction
            row["default_predicted"] = predicted(res, res["recorded"])
            row["default_measured"] = record(os.path.join(out, f"{name}-default.bin"), script, fraction=fraction)
        else:
            res, fraction = tune(base, "--no-fit"), 0.0
        best = best_row(res)
        row["recommended"] = res["recommended"]
        row["replays"] = res["replays"]
        row["predicted"] = predicted(res, best)
        row["measured"] = record(os.path.join(out, f"{name}-tuned.bin"), script, res["recommended"]["conf"],
                                 fraction)
        keys = ("peak_reserved_bytes", "device_mallocs", "ooms")
        row["exact"] = all(row["predicted"][k] == row["measured"][k] for k in keys) and (
            cap_rule != "rescue" or bool(row["default_measured"]["ooms"]) == bool(row["default_predicted"]["ooms"]))
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
    with open(os.path.join(out, "closed_loop.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"{'workload':16} {'recommended':48} {'peak pred':>14} {'peak real':>14} {'mallocs':>11} {'OOM':>7} exact")
    for r in rows:
        p, m = r["predicted"], r["measured"]
        print(f"{r['workload']:16} {r['recommended']['conf'][:48]:48} {p['peak_reserved_bytes']:14,} "
              f"{m['peak_reserved_bytes']:14,} {p['device_mallocs']:>5}/{m['device_mallocs']:<5} "
              f"{p['ooms']:>3}/{m['ooms']:<3} {r['exact']}")
        if "default_measured" in r:
            print(f"{'':16} defaults under the cap {r['cap_bytes']:,}: predicted OOMs {r['default_predicted']['ooms']}, "
                  f"real {r['default_measured']['ooms']} (exit {r['default_measured']['exit_status']})")
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
