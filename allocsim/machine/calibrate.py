"""Measure this GPU's device-call and pool latencies and build a `CostModel` from them.

`cudaMalloc`/`cudaFree` medians at the sizes of the H100 table in ``docs/metrics.md``
(512 B … 4 GiB, skipping sizes that do not fit in free memory), the CuPy pool's
hit and free latency (1 MiB, cached) and `cudaMallocAsync` through CuPy's
`MemoryAsyncPool`. GC pauses are not a property of the GPU and keep their defaults.

`free_sync_s`, what the synchronisation a cudaFree implies costs a running program
(``docs/metrics.md``, "The cost model"), is measured as the step time it adds to a
training-like step (`measure_free_sync`): kernels queued ahead of a host that does
its own work between launches, with and without one cudaFree mid-step, less the
cudaFree's own cost on an idle device.
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


#: The training-like step `measure_free_sync` times: kernels of this many µs on the device, this many µs of host
#: work between their launches (the host runs ahead, as a GPU-bound training loop does), this many per step.
SYNC_KERNEL_US, SYNC_HOST_US, SYNC_KERNELS = 200, 50, 20

_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def measure_free_sync(cp, reps: int = 20) -> dict:
    """The step time one cudaFree adds (seconds, median over ``reps`` step pairs), less its idle-device cost:
    ``{"free_sync_s", "idle_free_s", "step_s"}``. A cudaFree waits for every queued kernel, so the host's
    lead is lost and the device idles while the host launches again."""
    rt = cp.cuda.runtime
    spin = cp.RawKernel(_SPIN, "spin")
    rate = rt.deviceGetAttribute(rt.cudaDevAttrClockRate, 0) * 1e3     # cycles per second
    cycles = cp.int64(int(SYNC_KERNEL_US * 1e-6 * rate))

    def host_work():
        end = time.perf_counter_ns() + SYNC_HOST_US * 1000
        while time.perf_counter_ns() < end:
            pass

    def step(free_at=None):
        t0 = time.perf_counter_ns()
        for k in range(SYNC_KERNELS):
            spin((1,), (1,), (cycles,))
            if k == SYNC_KERNELS // 2 and free_at is not None:
                rt.free(free_at)
            host_work()
        rt.deviceSynchronize()
        return time.perf_counter_ns() - t0

    step()                                              # compile and warm up
    idle = []
    for _ in range(reps):
        p = rt.malloc(2 * MiB)
        rt.deviceSynchronize()
        t0 = time.perf_counter_ns()
        rt.free(p)
        idle.append(time.perf_counter_ns() - t0)
    plain, freeing = [], []
    for _ in range(reps):
        p = rt.malloc(2 * MiB)
        rt.deviceSynchronize()
        plain.append(step())
        freeing.append(step(p))
    idle_s = statistics.median(idle) * 1e-9
    added = (statistics.median(freeing) - statistics.median(plain)) * 1e-9
    return {"free_sync_s": max(0.0, added - idle_s), "idle_free_s": idle_s, "step_s": statistics.median(plain) * 1e-9}


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
    sync = measure_free_sync(cp, reps)
    name = rt.getDeviceProperties(0)["name"].decode()
    sizes_ok = sorted(table)
    model = CostModel(malloc_points=[[n, table[n][0]] for n in sizes_ok],
                      free_points=[[n, table[n][1]] for n in sizes_ok],
                      pool_hit_s=hit_s, pool_free_s=max(free_s, 1e-8), free_sync_s=sync["free_sync_s"],
                      source=f"allocsim calibrate on {name}, {time.strftime('%Y-%m-%d')}")
    extra = {"device": name, "cupy_pool_hit_s": hit_s, "cupy_async_malloc_s": async_s, "free_sync": sync,
             "table": {str(n): {"cudaMalloc_s": m, "cudaFree_s": f} for n, (m, f) in table.items()}}
    return model, extra
