"""Which requests depend on the allocator? Mask R-CNN (variable image sizes) with C++ stacks, on a GPU.

Runs ``examples/maskrcnn_variable.py`` in a fresh process twice — unconstrained and under a memory fraction
where the defaults catch OOMs — with ``torch.cuda.memory._record_memory_history(stacks="all")`` (C++ frames),
and writes, for every OOM the allocator raised and every allocation made from a frame that names cuDNN or
cuBLAS, the requested size, the free device memory the allocator saw and the innermost frames that say
who asked. The output (``$OUT/workspace_probe.json``) is what docs/allocator-dependent.md (requests that
depend on the allocator) is drawn from.

    OUT=dir python3 benchmarks/gpu_workspace_probe.py [--iters 6] [--allowed 5.82e9]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

KEYS = ("cudnn", "cublas", "workspace", "Workspace", "conv", "Conv", "plan")


def child(a) -> None:
    """One run: record with C++ stacks, run the example, summarise the allocator's history."""
    import runpy

    import torch
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    if a.allowed:
        torch.cuda.set_per_process_memory_fraction(a.allowed / total)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=a.stacks,
                                             max_entries=a.max_entries)
    sys.argv = ["maskrcnn_variable.py", "--iters", str(a.iters), "--batch", "2", "--warmup", "1"]
    died = None
    t = time.time()
    try:
        runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "examples", "maskrcnn_variable.py"),
                       run_name="__main__")
    except torch.OutOfMemoryError as e:
        died = str(e).splitlines()[0]
    ran = time.time() - t
    t = time.time()
    snap = torch.cuda.memory._snapshot()
    symbolised = time.time() - t
    trace = snap["device_traces"][0]
    rows, ooms, step = [], 0, 0
    for i, e in enumerate(trace):
        act = e.get("action")
        frames = e.get("frames") or []
        names = [f.get("name", "") for f in frames]
        who = [n for n in names if any(k in n for k in KEYS)][:6]
        if act == "oom":
            ooms += 1
            rows.append({"i": i, "action": "oom", "size": e.get("size"), "device_free": e.get("device_free"),
                         "who": who, "top": names[:12]})
        elif act == "alloc" and who:
            rows.append({"i": i, "action": "alloc", "size": e.get("size"), "who": who})
        elif act == "segment_alloc" and who:
            rows.append({"i": i, "action": "segment_alloc", "size": e.get("size"), "who": who})
    stats = torch.cuda.memory_stats()
    json.dump({"allowed": a.allowed, "total": total, "iters": a.iters, "died": died, "ooms_in_history": ooms,
               "num_ooms": stats.get("num_ooms"), "num_alloc_retries": stats.get("num_alloc_retries"),
               "entries": len(trace), "run_s": ran, "snapshot_s": symbolised,
               "cudnn_version": torch.backends.cudnn.version(), "torch": torch.__version__,
               "benchmark": torch.backends.cudnn.benchmark, "rows": rows}, open(a.json, "w"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--allowed", type=float, default=5.82e9, help="allowed bytes of the capped run")
    p.add_argument("--stacks", default="all")
    p.add_argument("--max-entries", type=int, default=400_000)
    p.add_argument("--timeout", type=int, default=200)
    p.add_argument("--json", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.json:
        return child(a)
    out = os.environ.get("OUT", ".")
    report = {}
    for name, allowed in (("capped", a.allowed), ("unconstrained", 0.0)):
        path = os.path.join(out, f"probe-{name}.json")
        cmd = [sys.executable, __file__, "--iters", str(a.iters), "--allowed", str(allowed), "--stacks", a.stacks,
               "--max-entries", str(a.max_entries), "--json", path]
        print("+", " ".join(cmd), flush=True)
        try:
            r = subprocess.run(cmd, timeout=a.timeout, capture_output=True, text=True)
            print(r.stdout[-2000:], r.stderr[-3000:], flush=True)
            report[name] = json.load(open(path)) if os.path.exists(path) else {"rc": r.returncode}
        except subprocess.TimeoutExpired:
            report[name] = {"timeout": a.timeout}
            print(f"{name}: timed out after {a.timeout} s", flush=True)
    with open(os.path.join(out, "workspace_probe.json"), "w") as f:
        json.dump(report, f)
    for name, r in report.items():
        rows = r.get("rows", [])
        print(name, {k: r.get(k) for k in ("died", "ooms_in_history", "num_ooms", "entries", "run_s", "snapshot_s")})
        for row in [x for x in rows if x["action"] == "oom"][:40]:
            print("  OOM", row["size"], row["device_free"], row["who"][:3])


if __name__ == "__main__":
    main()
