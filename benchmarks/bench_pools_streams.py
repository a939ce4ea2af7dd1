"""Replay cost against pools: many short-lived private pools, and allocations each on a stream of its own.

The torch model keeps a pool per stream and per private pool, and each holds its cached segment to the end, so
the reserved bytes reach a new peak at every new pool. Taking the free breakdown and largest free block there
(`Replay._new_peak`) reads every pool: a replay cost pools x peaks (issue 29: 4,000 pools 11.7 s, 20,000 over
100 s). Since the peak's state is taken as the replay can afford it and otherwise read again by a second bounded
walk (docs/architecture.md, "The state at the reserved peak"), the cost grows with the events.

Two traces made with allocsim's `TraceWriter`, each replayed once per policy (the trace's 80 GiB device, eager):

- ``pools``: N CUDA-graph private pools, each begun, given one 1 MiB allocation, ended, freed and released;
- ``streams``: N allocations of 1 MiB, each on its own stream, then all freed.

    python3 benchmarks/bench_pools_streams.py [--n 4000,8000] [--policies torch,split] [--json out.json]

Prints wall seconds per (trace, N, policy) and the torch/split ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from allocsim.outputs import atomic_open  # noqa: E402
from allocsim.engine.replay import replay  # noqa: E402
from allocsim.trace import TraceWriter  # noqa: E402
from allocsim.trace import events as ev  # noqa: E402

MiB = 1 << 20
META = {"framework": "torch", "producer": "bench_pools_streams", "device": {"name": "synthetic",
                                                                         "total_memory": 80 << 30}}


def private_pools(n: int):
    """N short-lived private pools, one 1 MiB allocation each."""
    w = TraceWriter(meta=META)
    for pool in range(1, n + 1):
        w.record(ev.POOL_BEGIN, aux=pool, flags=ev.POOL_CAPTURE, addr=pool)
        i = w.alloc(MiB)
        w.record(ev.POOL_END, aux=pool, addr=pool)
        w.free(i)
        w.record(ev.POOL_RELEASE, aux=pool, addr=pool)
    return w.finish()


def own_streams(n: int):
    """N allocations of 1 MiB, each on a stream of its own, then freed."""
    w = TraceWriter(meta=META)
    ids = [w.alloc(MiB, stream=s + 1) for s in range(n)]
    for i, s in zip(ids, range(n)):
        w.free(i, stream=s + 1)
    return w.finish()


TRACES = {"pools": private_pools, "streams": own_streams}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", default="4000,8000", help="pools or streams, comma-separated (default 4000,8000)")
    ap.add_argument("--policies", default="split,torch")
    ap.add_argument("--traces", default="pools,streams")
    ap.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    a = ap.parse_args(argv)
    rows = []
    print(f"{'trace':<9}{'N':>7}{'policy':>8}{'seconds':>10}{'x split':>9}")
    for name in a.traces.split(","):
        for n in map(int, a.n.split(",")):
            trace = TRACES[name](n)
            split_s = None
            for p in a.policies.split(","):
                t0 = time.perf_counter()
                replay(trace, p)
                s = time.perf_counter() - t0
                split_s = s if p == "split" else split_s
                rows.append({"trace": name, "n": n, "policy": p, "seconds": s})
                print(f"{name:<9}{n:>7}{p:>8}{s:>10.2f}" + (f"{s / split_s:>9.1f}" if split_s else ""), flush=True)
    if a.json:
        with atomic_open(a.json) as f:
            f.write(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
