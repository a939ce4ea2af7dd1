"""The CuPy MLP of issue 11 under pressure: a pool limit, free_all_blocks every three steps, one oversized batch.

A 3-layer MLP (hidden 4096) trained with plain CuPy on random data, its default pool limited with
``set_limit`` (1.5 GB by default); every third step ends with ``free_all_blocks()``, and one step's batch is
32 times the others, so it raises ``OutOfMemoryError``, which is caught: the program goes on. Writes the
pool's own figures (the largest ``total_bytes()`` seen after a step, ``total_bytes``/``used_bytes`` at the
end, the OOMs caught) to FIGURES, so a plain run and one under ``allocsim record`` can be compared.

Usage: python3 benchmarks/gpu_cupy_pressure.py FIGURES.json [--limit BYTES] [--steps N]
"""
import argparse
import json

import cupy as cp


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("figures")
    p.add_argument("--limit", type=int, default=1_500_000_000)
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--oversized-step", type=int, default=4)
    a = p.parse_args()
    pool = cp.get_default_memory_pool()
    pool.set_limit(size=a.limit)
    rs = cp.random.RandomState(0)
    sizes = [1024, 4096, 4096, 100]
    W = [rs.standard_normal((i, o), dtype=cp.float32) * (2.0 / i) ** 0.5 for i, o in zip(sizes, sizes[1:])]
    ooms, peak = [], 0
    for step in range(a.steps):
        batch = a.batch * (32 if step == a.oversized_step else 1)
        try:
            acts = [rs.standard_normal((batch, sizes[0]), dtype=cp.float32)]
            for k, w in enumerate(W):
                z = acts[-1] @ w
                acts.append(cp.maximum(z, 0) if k < len(W) - 1 else z)
            grad = acts[-1] / batch
            for k in reversed(range(len(W))):
                gW = acts[k].T @ grad
                if k > 0:
                    grad = (grad @ W[k].T) * (acts[k] > 0)
                W[k] -= 1e-3 * gW
            del acts, grad, gW, z
        except cp.cuda.memory.OutOfMemoryError as e:
            ooms.append({"step": step, "batch": batch, "message": str(e).splitlines()[0]})
            acts = grad = gW = z = None
        cp.cuda.Device().synchronize()
        peak = max(peak, pool.total_bytes())
        if step % 3 == 2:
            pool.free_all_blocks()
    figures = {"limit": pool.get_limit(), "peak_total_bytes_after_steps": peak, "total_bytes": pool.total_bytes(),
               "used_bytes": pool.used_bytes(), "ooms": len(ooms), "oom_list": ooms}
    with open(a.figures, "w") as f:
        json.dump(figures, f, indent=1)
    print(json.dumps({k: v for k, v in figures.items() if k != "oom_list"}))


if __name__ == "__main__":
    main()
