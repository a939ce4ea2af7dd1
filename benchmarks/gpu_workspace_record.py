"""Requests that depend on the allocator (issue 17 item 5): Mask R-CNN recorded with C++ stacks, free and capped.

1. ``allocsim record --stacks all`` of ``examples/maskrcnn_variable.py`` (batch 2, ``--iters`` steps),
   unconstrained: the trace flags the requests PyTorch survives failing (CATCHES_OOM, the cuDNN workspace tries).
2. From that trace, the peak of the bytes live (each request rounded up to 512 B, as PyTorch does) with the
   flagged requests; four caps 6-18 % above it (``--caps`` names others) are recorded at once, each in its own
   process under ``set_per_process_memory_fraction`` (``benchmarks/_with_fraction.py``, so the trace holds the
   SET_LIMIT). The first run (H200, 2026-11-25) tried caps between the peak without the flagged requests and
   with them: every one died in step 4 (one of them after catching 28 OOMs in one convolution's config
   tries); the program needs room for the allocator's fragmentation too.
3. For each capped run: what the program did (caught OOMs = ``num_ooms`` of a run that finished, peak reserved,
   device calls, from its ``.stats.json``), ``allocsim validate`` of its trace, and ``allocsim replay`` of the
   unconstrained trace under ``--cap`` = its allowed bytes (``--json``).

Everything goes to ``$OUT``: ``summary.txt`` (the table), ``log.txt`` (every command and its output) and
``wsprobe.tgz`` (the traces, their stats, the JSON of every replay and validate). Each step has a time limit; a
failed step is logged and the rest goes on.

    OUT=dir PYTHONPATH=$PWD python3 benchmarks/gpu_workspace_record.py [--iters 12] [--caps 5.45e9,5.6e9]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLE = os.path.join(ROOT, "examples", "maskrcnn_variable.py")
LOG: list[str] = []


def say(text: str) -> None:
    print(text, flush=True)
    LOG.append(text)


def run(cmd: list[str], timeout: int, out_json: str | None = None) -> tuple[int, str]:
    """Run ``cmd`` (logged); its stdout to ``out_json`` when given. (exit status, stdout + stderr tail)."""
    t = time.time()
    env = {**os.environ, "PYTHONPATH": ROOT}
    try:
        r = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True, env=env, cwd=ROOT)
        rc, text = r.returncode, r.stdout[-3000:] + r.stderr[-3000:]
        if out_json:
            with open(out_json, "w") as f:
                f.write(r.stdout)
    except subprocess.TimeoutExpired:
        rc, text = 124, f"timed out after {timeout} s"
    say(f"+ {' '.join(cmd)}\n  rc {rc} in {time.time() - t:.1f} s\n{text.strip()}")
    return rc, text


def record(out: str, name: str, iters: int, fraction: float, timeout: int) -> str:
    path = os.path.join(out, f"{name}.bin")
    program = [EXAMPLE] if not fraction else [os.path.join(HERE, "_with_fraction.py"), repr(fraction), EXAMPLE]
    run([sys.executable, "-m", "allocsim", "record", "--stacks", "all", "--force", "-o", path, *program,
         "--iters", str(iters), "--batch", "2", "--warmup", "1"], timeout)
    return path


def window(path: str) -> tuple[int, int, int]:
    """(peak live bytes without the flagged requests, with them, number flagged) of the trace at ``path``."""
    import numpy as np

    from allocsim.trace import Trace
    from allocsim.trace import events as ev
    t = Trace.load(path)
    kind, flags = np.asarray(t.kind), np.asarray(t.flags)
    ids, size = np.asarray(t.records["id"]).astype(np.int64), np.asarray(t.records["size"]).astype(np.int64)
    rounded = (size + 511) // 512 * 512
    alloc, free = kind == ev.ALLOC, kind == ev.FREE
    n = int(ids[alloc].max()) + 1 if alloc.any() else 0
    by_id, flagged_id = np.zeros(n, np.int64), np.zeros(n, bool)
    by_id[ids[alloc]] = rounded[alloc]
    flagged_id[ids[alloc]] = (flags[alloc] & ev.CATCHES_OOM) != 0
    delta = np.zeros(len(kind), np.int64)
    delta[alloc] = rounded[alloc]
    delta[free] = -by_id[ids[free]]
    flagged = np.zeros(len(kind), bool)
    flagged[alloc] = flagged_id[ids[alloc]]
    flagged[free] = flagged_id[ids[free]]
    with_all = int(np.cumsum(delta).max())
    without = int(np.cumsum(np.where(flagged, 0, delta)).max())
    return without, with_all, int(flagged_id.sum())


def stats_of(path: str) -> dict:
    try:
        s = json.load(open(path + ".stats.json"))
    except (OSError, ValueError):
        return {}
    ms = s.get("memory_stats", {})
    return {"exit_status": s.get("exit_status"), "num_ooms": ms.get("num_ooms"),
            "num_alloc_retries": ms.get("num_alloc_retries"), "peak_reserved": ms.get("reserved_bytes.all.peak"),
            "device_mallocs": ms.get("num_device_alloc", ms.get("segment.all.allocated")),
            "device_frees": ms.get("num_device_free", ms.get("segment.all.freed")),
            "catches_oom": s.get("conversion", {}).get("catches_oom"), "wall_s": s.get("wall_s"),
            "steps": s.get("optimizer_steps")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--timeout", type=int, default=150, help="seconds per recording")
    p.add_argument("--caps", help="the allowed bytes to record under, comma-separated (default: from the window)")
    a = p.parse_args()
    out = os.environ.get("OUT", ".")
    work = os.path.join(out, "work")
    os.makedirs(work, exist_ok=True)
    t0 = time.time()
    free = record(work, "maskrcnn-free", a.iters, 0.0, a.timeout)
    rows = [("unconstrained", 0, stats_of(free))]
    total = 80 * 10**9
    try:
        from allocsim.trace import Trace
        meta = Trace.load(free).meta
        total = meta["device"]["total_memory"]
        say(f"{meta['device'].get('name')}, {total} B; torch {meta.get('framework_version')}")
    except Exception as e:                       # noqa: BLE001 - the caps below are bytes: 80 GB assumed
        say(f"no unconstrained trace ({type(e).__name__}: {e}); assuming {total} B of device memory")
    try:
        without, with_all, flagged = window(free)
        say(f"flagged requests {flagged}; peak live without them {without} B, with them {with_all} B")
    except Exception as e:                       # noqa: BLE001 - keep going with caps from the stats
        say(f"window: {type(e).__name__}: {e}")
        without = with_all = 0
    if a.caps:
        caps = [int(float(c)) for c in a.caps.split(",")]
    elif with_all:
        caps = [int(with_all * f) for f in (1.06, 1.09, 1.13, 1.18)]
    else:
        peak = rows[0][2].get("peak_reserved") or 6 * 2**30
        caps = [int(peak * f) for f in (0.95, 0.9, 0.85, 0.8)]
    say(f"caps to try: {caps}")
    with ThreadPoolExecutor(len(caps)) as ex:
        paths = list(ex.map(lambda c: record(work, f"maskrcnn-cap{c}", a.iters, c / total, a.timeout), caps))
    jobs = []                                    # (allocsim arguments, file for its stdout): run at once
    for cap, path in zip(caps, paths):
        rows.append((f"capped {cap}", cap, stats_of(path)))
        if os.path.exists(path):
            jobs.append((["validate", path, "--json"], path + ".validate.json"))
            jobs.append((["info", path], path + ".info.txt"))
        if os.path.exists(free):
            jobs.append((["replay", free, "-p", "torch", "--cap", str(cap), "--json"],
                         os.path.join(work, f"replay-free-cap{cap}.json")))
    if os.path.exists(free):
        jobs.append((["info", free], free + ".info.txt"))
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda j: run([sys.executable, "-m", "allocsim", *j[0]], 150, j[1]), jobs))
    if time.time() - t0 < 200:
        run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/test_caught_oom.py"],
            60)
    lines = [f"{'run':<22} {'exit':>4} {'steps':>5} {'OOMs':>5} {'retries':>7} {'peak reserved':>15} "
             f"{'mallocs':>7} {'frees':>6} {'flagged':>7}"]
    for name, cap, s in rows:
        lines.append(f"{name:<22} {s.get('exit_status')!s:>4} {s.get('steps')!s:>5} {s.get('num_ooms')!s:>5} "
                     f"{s.get('num_alloc_retries')!s:>7} {s.get('peak_reserved')!s:>15} "
                     f"{s.get('device_mallocs')!s:>7} {s.get('device_frees')!s:>6} {s.get('catches_oom')!s:>7}")
    lines.append("replay of the unconstrained recording under each cap (allocsim replay -p torch --cap):")
    for _, cap, _ in rows[1:]:
        try:
            r = json.load(open(os.path.join(work, f"replay-free-cap{cap}.json")))
        except (OSError, ValueError):
            continue
        first = (r.get("oom_events") or [{}])[0]
        lines.append(f"  cap {cap}: completed {r.get('completed')}, caught OOMs {r.get('caught_ooms')}, OOMs "
                     f"{r.get('ooms')} (first at event {first.get('event')}), peak reserved "
                     f"{r.get('peak_reserved_bytes')}, device mallocs {r.get('device_mallocs')}, frees "
                     f"{r.get('device_frees')}")
    say("\n".join(lines))
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "log.txt"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    with tarfile.open(os.path.join(out, "wsprobe.tgz"), "w:gz") as tar:
        tar.add(work, arcname="wsprobe")
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    say(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
