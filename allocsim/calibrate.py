"""Measure this GPU's device-call and pool latencies and build a `CostModel` from them.

`cudaMalloc`/`cudaFree` medians at the sizes of the H100 table in ``docs/metrics.md``
(512 B … 4 GiB, skipping sizes that do not fit in free memory), the CuPy pool's
hit and free latency (1 MiB, cached) and `cudaMallocAsync` through CuPy's
`MemoryAsyncPool`. GC pauses are not a property of the GPU and keep their defaults.
"""
from __future__ import annotations

import statistics
import time

from .costs import CostModel
from .gpu import require_cupy

MiB, GiB = 1 << 20, 1 << 30
SIZES = [512, 2 * MiB, 20 * MiB, 256 * MiB, GiB, 4 * GiB]


def _median_ns(fn, reps):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t0)
    return statistics.median(out)


def measure(reps: int = 20, sizes=SIZES) -> tuple[CostModel, dict]:
    cp = require_cupy()
    rt = cp.cuda.runtime
    cp.cuda.Device(0).use()
    free_mem = rt.memGetInfo()[0]
    table = {}
    for n in sizes:
        if n > free_mem * 0.8:
            continue
        mallocs, frees = [], []
        for _ in range(reps if n < GiB else max(3, reps // 4)):
            t0 = time.perf_counter_ns()
            p = rt.malloc(n)
            t1 = time.perf_counter_ns()
            rt.free(p)
            t2 = time.perf_counter_ns()
            mallocs.append(t1 - t0)
            frees.append(t2 - t1)
        table[n] = (statistics.median(mallocs) * 1e-9, statistics.median(frees) * 1e-9)
    pool = cp.cuda.MemoryPool()
    pool.malloc(MiB)            # one cached 1 MiB block

    def hit():
        m = pool.malloc(MiB)
        del m
    hit_s = _median_ns(hit, 200) * 1e-9
    blocks = [pool.malloc(MiB) for _ in range(1)]
    t0 = time.perf_counter_ns()
    blocks.clear()
    free_s = (time.perf_counter_ns() - t0) * 1e-9
    pool.free_all_blocks()
    async_s = None
    try:
        apool = cp.cuda.MemoryAsyncPool()

        def amalloc():
            m = apool.malloc(MiB)
            del m
        amalloc()
        async_s = _median_ns(amalloc, 200) * 1e-9
    except Exception:            # noqa: BLE001 — no stream-ordered allocator on this GPU/driver
        pass
    name = rt.getDeviceProperties(0)["name"].decode()
    sizes_ok = sorted(table)
    model = CostModel(malloc_points=[[n, table[n][0]] for n in sizes_ok],
                      free_points=[[n, table[n][1]] for n in sizes_ok],
                      pool_hit_s=hit_s, pool_free_s=max(free_s, 1e-8),
                      source=f"allocsim calibrate on {name}, {time.strftime('%Y-%m-%d')}")
    extra = {"device": name, "cupy_pool_hit_s": hit_s, "cupy_async_malloc_s": async_s,
             "table": {str(n): {"cudaMalloc_s": m, "cudaFree_s": f} for n, (m, f) in table.items()}}
    return model, extra
