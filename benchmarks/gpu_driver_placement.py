"""Measure where the CUDA driver places cudaMalloc allocations (for the pressure work, issue 11).

PyTorch's best fit breaks ties by address, so a replay that makes segment calls the recording never
made needs a model of the driver's placement. This probe makes raw cudaMalloc/cudaFree calls (through
CuPy's runtime bindings, no pool) in scripted and random sequences and writes every call with its
address, one JSON object a line, for fitting and testing such a model offline.

Usage (on a GPU machine): python3 benchmarks/gpu_driver_placement.py OUT.jsonl
"""
import json
import random
import sys

import cupy
from cupy.cuda import runtime

MiB = 1 << 20


def main(path):
    dev = runtime.getDeviceProperties(0)
    out = open(path, "w")
    out.write(json.dumps({"kind": "env", "gpu": dev["name"].decode(), "driver": runtime.driverGetVersion(),
                          "runtime": runtime.runtimeGetVersion(), "total": dev["totalGlobalMem"]}) + "\n")
    live = {}

    def malloc(tag, n):
        p = runtime.malloc(n)
        live[p] = n
        out.write(json.dumps({"kind": "malloc", "exp": tag, "size": n, "addr": p}) + "\n")
        return p

    def free(tag, p):
        runtime.free(p)
        n = live.pop(p)
        out.write(json.dumps({"kind": "free", "exp": tag, "size": n, "addr": p}) + "\n")

    def reset(tag):
        for p in list(live):
            free(tag, p)
        runtime.deviceSynchronize()

    # 1. packing and alignment of sequential allocations of assorted sizes
    for n in [512, 4096, MiB, 2 * MiB, 2 * MiB + 512, 3 * MiB, 20 * MiB, 21 * MiB, 64 * MiB, 100 * MiB + 12345,
              1 << 30, 512, 2 * MiB]:
        malloc("seq", n)
    reset("seq")
    # 2. a freed hole: same size, smaller, larger
    for k, second in enumerate([20 * MiB, 10 * MiB, 30 * MiB, 2 * MiB, 18 * MiB]):
        a = malloc(f"hole{k}", 20 * MiB)
        malloc(f"hole{k}", 20 * MiB)
        malloc(f"hole{k}", 20 * MiB)
        free(f"hole{k}", a)
        malloc(f"hole{k}", second)
        reset(f"hole{k}")
    # 3. several holes of different sizes: which one takes a request that fits several
    for k, req in enumerate([8 * MiB, 16 * MiB, 40 * MiB, 2 * MiB]):
        ps = [malloc(f"holes{k}", s) for s in [40 * MiB, 2 * MiB, 16 * MiB, 2 * MiB, 8 * MiB, 2 * MiB,
                                                  64 * MiB, 2 * MiB]]
        for i in (0, 2, 4, 6):
            free(f"holes{k}", ps[i])
        malloc(f"holes{k}", req)
        reset(f"holes{k}")
    # 3b. the same holes freed in the other order (recency vs address)
    for k, req in enumerate([8 * MiB, 16 * MiB]):
        ps = [malloc(f"holesrev{k}", s) for s in [40 * MiB, 2 * MiB, 16 * MiB, 2 * MiB, 8 * MiB, 2 * MiB,
                                                     64 * MiB, 2 * MiB]]
        for i in (6, 4, 2, 0):
            free(f"holesrev{k}", ps[i])
        malloc(f"holesrev{k}", req)
        reset(f"holesrev{k}")
    # 4. random sequences shaped like a caching allocator's segment calls
    rng = random.Random(0)
    sizes = [2 * MiB] * 6 + [20 * MiB] * 4 + [s * 2 * MiB for s in range(11, 200, 7)]
    for seq in range(4):
        ps = []
        for step in range(600):
            if ps and rng.random() < 0.45:
                free(f"rand{seq}", ps.pop(rng.randrange(len(ps))))
            else:
                n = rng.choice(sizes) if rng.random() < 0.8 else rng.randrange(1, 300) * MiB + rng.choice([0, 512])
                ps.append(malloc(f"rand{seq}", n))
        reset(f"rand{seq}")
    out.close()


if __name__ == "__main__":
    main(sys.argv[1])
