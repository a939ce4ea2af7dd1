"""CuPy programs under memory pressure (issues 11 and 20): pool limits, releases, caught OOMs, reference cycles.

Plain CuPy, no allocsim: each workload trains a small MLP (hidden 4096) on random data with its default pool
under pressure, and prints the pool's own figures after every step as one JSON line (``step``, ``batch``,
``total`` = ``total_bytes()``, ``used``, ``free_blocks``, ``ooms`` so far), so a plain run and one under
``allocsim record`` (or two plain runs) can be compared step by step. FIGURES gets the same, plus the largest
``total_bytes()`` after a step, the final figures and the OOMs caught.

Workloads (``--workload``):

- ``issue11`` (default; `traces/pressure-cupy-limit.bin`): batch 1024, ``set_limit(1.5 GB)``,
  ``free_all_blocks()`` after every third step, step 4's batch 32 times larger (its OOM is caught).
- ``variable`` (issue 20's program): the same, but every step's batch is drawn from 256..2048 (seeded), and
  the oversized batch (32768) comes at step 5.
- ``cycles``: each step's activations are kept by a tape object that refers to itself (a reference cycle)
  and the program turns Python's automatic collector off (``gc.disable()``): only the pool's own
  ``gc.collect()`` on its limit path (``_try_malloc``) frees them, inside a request. Limit 1 GB.
- ``cycles-auto``: the same cycles with the collector on (its own thresholds decide when they go).
- ``cycles-fixed``: cycles, the collector off, every batch 1024 and no oversized one, limit 600 MB: the
  request that meets the limit finds, among the arrays the pool's ``gc.collect()`` frees, some of its own size
  (which its lookup did not see).
- ``oom-backoff``: variable batches under a limit that the program lowers (to 0.9 GB) and later lifts
  (``set_limit(0)``) then sets again; an OOM halves the batch and the step is tried again (many caught).
- ``streams``: two non-default streams take turns per step (an arena each), ``free_all_blocks()`` every
  third step, under 1.2 GB.

Usage: python3 benchmarks/gpu_cupy_pressure.py FIGURES.json [--workload NAME] [--limit BYTES] [--steps N]
"""
import argparse
import gc
import json

import cupy as cp

SIZES = [1024, 4096, 4096, 100]
DEFAULT_STEPS = {"issue11": 9, "variable": 12, "cycles": 12, "cycles-auto": 12, "cycles-fixed": 12, "oom-backoff": 12,
                 "streams": 12}
DEFAULT_LIMIT = {"cycles": 1_000_000_000, "cycles-auto": 1_000_000_000, "cycles-fixed": 600_000_000,
                 "streams": 1_200_000_000}


class Tape:
    """A step's activations, kept in a reference cycle (the tape refers to itself)."""

    def __init__(self):
        self.acts = []
        self.me = self


def step_mlp(W, rs, batch, tape=None):
    """One forward/backward/SGD step; the activations go to ``tape`` (a cycle) when given."""
    acts = tape.acts if tape is not None else []
    acts.append(rs.standard_normal((batch, SIZES[0]), dtype=cp.float32))
    for k, w in enumerate(W):
        z = acts[-1] @ w
        acts.append(cp.maximum(z, 0) if k < len(W) - 1 else z)
    grad = acts[-1] / batch
    for k in reversed(range(len(W))):
        gW = acts[k].T @ grad
        if k > 0:
            grad = (grad @ W[k].T) * (acts[k] > 0)
        W[k] -= 1e-3 * gW


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("figures")
    p.add_argument("--workload", default="issue11", choices=sorted(DEFAULT_STEPS))
    p.add_argument("--limit", type=int, default=None, help="pool limit, bytes (default 1.5 GB; cycles 1 GB)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--oversized-step", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    wl = a.workload
    steps = a.steps or DEFAULT_STEPS[wl]
    limit = a.limit or DEFAULT_LIMIT.get(wl, 1_500_000_000)
    oversized = a.oversized_step if a.oversized_step is not None else (4 if wl == "issue11" else 5)
    pool = cp.get_default_memory_pool()
    pool.set_limit(size=limit)
    if wl in ("cycles", "cycles-fixed"):
        gc.disable()
    rs = cp.random.RandomState(a.seed)
    import random
    pick = random.Random(a.seed)
    W = [rs.standard_normal((i, o), dtype=cp.float32) * (2.0 / i) ** 0.5 for i, o in zip(SIZES, SIZES[1:])]
    streams = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)] if wl == "streams" else None
    ooms, peak, per_step = [], 0, []
    for step in range(steps):
        batch = a.batch
        if wl not in ("issue11", "cycles-fixed"):
            batch = pick.choice([256, 384, 512, 768, 1024, 1536, 2048])
        if wl in ("issue11", "variable", "cycles", "cycles-auto") and step == oversized:
            batch = a.batch * 32
        if wl == "oom-backoff":
            if step == 4:
                pool.set_limit(size=900_000_000)
            elif step == 8:
                pool.set_limit(size=0)
            elif step == 10:
                pool.set_limit(size=limit)
            if step in (3, 7):
                batch = 16384
        tries = 0
        while True:
            try:
                if streams is not None:
                    with streams[step % 2]:
                        step_mlp(W, rs, batch)
                elif wl.startswith("cycles"):
                    step_mlp(W, rs, batch, Tape())
                else:
                    step_mlp(W, rs, batch)
                break
            except cp.cuda.memory.OutOfMemoryError as e:
                ooms.append({"step": step, "batch": batch, "message": str(e).splitlines()[0]})
                if wl != "oom-backoff" or batch <= 256 or tries >= 6:
                    break
                batch //= 2
                tries += 1
        if streams is not None:
            streams[step % 2].synchronize()
        cp.cuda.Device().synchronize()
        row = {"step": step, "batch": batch, "total": pool.total_bytes(), "used": pool.used_bytes(),
               "free_blocks": pool.n_free_blocks(), "ooms": len(ooms)}
        per_step.append(row)
        print(json.dumps(row), flush=True)
        peak = max(peak, pool.total_bytes())
        if step % 3 == 2:
            pool.free_all_blocks()
    figures = {"workload": wl, "limit": pool.get_limit(), "peak_total_bytes_after_steps": peak,
               "total_bytes": pool.total_bytes(), "used_bytes": pool.used_bytes(), "ooms": len(ooms),
               "oom_list": ooms, "steps": per_step, "cupy": cp.__version__}
    with open(a.figures, "w") as f:
        json.dump(figures, f, indent=1)
    print(json.dumps({k: v for k, v in figures.items() if k not in ("oom_list", "steps")}))


if __name__ == "__main__":
    main()
