"""Replay speed: driving events per second for every simulated policy on an alloc-heavy trace.

The trace is `allocsim.formats.synth.generate("alloc-heavy", seed=...)` (1 M small and
medium short-lived allocations, 2 M driving events), or a local generator of the
same shape when the synth module is missing. Each policy replays it once (eager
runtime, the trace's 80 GiB device); the table gives driving events per second
(wall clock, the engine's own `replay_seconds`, setup and metrics included) and
the ratio of that time to a bare Python loop over the same events that only
tracks live ids (``x bare``; ``x cpu``: the same ratio of CPU times, steadier on a shared
machine), plus the engine floor: a policy that does nothing.
`split`, `torch`, `bestfit` and `cupy` run their fused loop (``walk_chunk``, docs/architecture.md "The fast
path"); ``--plain`` adds a row per policy that has one, walked through ``malloc``/``free`` instead.
Real-GPU policies are skipped; ``--policies`` picks others (``oracle`` and any
policy slower than ``--budget`` seconds on a probe prefix are skipped unless named).

    python3 benchmarks/bench_replay.py [--allocs 1000000] [--policies split,bestfit] [--plain] [--repeat 5]
                                       [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from allocsim import policies  # noqa: E402
from allocsim.engine.replay import replay  # noqa: E402
from allocsim.outputs import atomic_open  # noqa: E402
from allocsim.policies.base import Policy  # noqa: E402
from allocsim.engine.replay import Replay  # noqa: E402
from allocsim.trace import ALLOC, FREE, RECORD_DTYPE, Trace  # noqa: E402

FLOOR = "(engine floor)"
OFFLINE = {"oracle"}        # place the whole trace up front: not an online replay speed


def alloc_heavy(n: int, seed: int) -> Trace:
    """The synth preset if it is there, else the same recipe here (log-uniform 16 B-4 MiB, lifetime ~64)."""
    try:
        from allocsim.formats import synth
    except ImportError:
        synth = None
    if synth is not None:
        return synth.generate("alloc-heavy", seed=seed, n_allocs=n)
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(16), np.log(4 << 20), n)).astype(np.int64) // 4 * 4 + 4
    life = rng.geometric(1 / 64, n)
    order = np.argsort(np.concatenate([np.arange(n, dtype=np.float64), np.arange(n) + life + 0.5]), kind="stable")
    rec = np.zeros(2 * n, RECORD_DTYPE)
    is_alloc = order < n
    rec["kind"] = np.where(is_alloc, ALLOC, FREE)
    rec["id"] = np.where(is_alloc, order, order - n)
    rec["size"] = np.where(is_alloc, sizes[np.minimum(order, n - 1)], 0)
    rec["site"] = 0xFFFFFFFF
    rec["time_ns"] = np.arange(2 * n) * 20_000
    return Trace(rec, {"producer": "bench_replay", "device": {"name": "synthetic", "total_memory": 80 << 30}})


class _Floor(Policy):
    """Does nothing but keep `allocated`: what the engine alone costs per event."""

    name = FLOOR

    def malloc(self, size, stream):
        self.allocated += size
        return size

    def free(self, handle):
        self.allocated -= handle


def bare_loop(trace: Trace) -> tuple[float, float]:
    """Seconds (wall, CPU) for a plain loop over the driving events that only tracks which ids are live."""
    t0, c0 = time.perf_counter(), time.process_time()
    kind = np.asarray(trace.kind)
    drive = np.flatnonzero((kind == ALLOC) | (kind == FREE))
    kinds, ids, sizes = kind[drive].tolist(), trace.id[drive].tolist(), trace.size[drive].tolist()
    live = [0] * trace.n_ids
    for k, i, s in zip(kinds, ids, sizes):
        if k == ALLOC:
            live[i] = s
        else:
            live[i] = 0
    return time.perf_counter() - t0, time.process_time() - c0


def has_fused_loop(trace: Trace, name: str, runtime: str) -> bool:
    r = Replay(trace, name, runtime=runtime)
    r.close()
    return r.fast_path


def run_one(trace: Trace, name: str, runtime: str, plain: bool = False) -> dict:
    """One replay's figures; ``plain``: through ``malloc``/``free``, never the policy's fused loop."""
    c0 = time.process_time()
    if plain:
        t0 = time.perf_counter()
        r = Replay(trace, name, runtime=runtime, fast_path=False).run()
        r.replay_seconds = time.perf_counter() - t0
    else:
        r = replay(trace, name, runtime=runtime, guard=False)     # the floor is a plug-in: no contract checks
    cpu = time.process_time() - c0
    return {"policy": name + (" (plain)" if plain else ""), "seconds": r.replay_seconds, "cpu_seconds": cpu,
            "driving_events": r.driving_events,
            "events_per_s": r.driving_events / r.replay_seconds, "completed": r.completed,
            "peak_reserved_bytes": r.peak_reserved_bytes, "peak_allocated_bytes": r.peak_allocated_bytes,
            "device_mallocs": r.device_mallocs, "cache_flushes": r.cache_flushes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--allocs", type=int, default=1_000_000, help="allocations in the trace (default 1M)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runtime", default="eager", choices=["eager", "gc"])
    ap.add_argument("--policies", help="comma-separated policy names (default: every simulated online policy)")
    ap.add_argument("--budget", type=float, default=120.0,
                    help="skip a default policy whose 2%% probe predicts more than this many seconds")
    ap.add_argument("--plain", action="store_true",
                    help="also replay each policy that has a fused loop through malloc/free (fast_path=False)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds, each the bare loop and every policy once, alternated; the best of each (a shared "
                         "machine's noise is one-sided)")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)

    policies.register(_Floor)
    t0 = time.perf_counter()
    trace = alloc_heavy(args.allocs, args.seed)
    gen_s = time.perf_counter() - t0
    n_drive = int(np.count_nonzero(np.isin(np.asarray(trace.kind), (ALLOC, FREE))))
    bares = [bare_loop(trace) for _ in range(2)]
    bare, bare_cpu = min(b[0] for b in bares), min(b[1] for b in bares)

    named = args.policies.split(",") if args.policies else None
    names = named or [n for n in policies.names() if n != FLOOR and not policies.get(n).real_gpu
                      and n not in OFFLINE]
    probe = Trace(np.asarray(trace.records)[: max(1000, len(trace) // 50)], trace.meta) if not named else None
    runs = [(FLOOR, False)]
    for name in names:
        if probe is not None:
            t = time.perf_counter()
            replay(probe, name, runtime=args.runtime)
            guess = (time.perf_counter() - t) * len(trace) / len(probe)
            if guess > args.budget:
                print(f"skip {name}: about {guess:.0f} s predicted (> --budget {args.budget:g})")
                continue
        runs.append((name, False))
        if args.plain and has_fused_loop(trace, name, args.runtime):
            runs.append((name, True))
    rows = [run_one(trace, name, args.runtime, plain=plain) for name, plain in runs]
    for _ in range(args.repeat - 1):        # again, alternated: the best seconds and CPU seconds of each
        b = bare_loop(trace)
        bare, bare_cpu = min(bare, b[0]), min(bare_cpu, b[1])
        for row, (name, plain) in zip(rows, runs):
            again = run_one(trace, name, args.runtime, plain=plain)
            for key in ("seconds", "cpu_seconds"):
                row[key] = min(row[key], again[key])
            row["events_per_s"] = row["driving_events"] / row["seconds"]
    print(f"trace: alloc-heavy, {args.allocs:,} allocations, {n_drive:,} driving events "
          f"(generated in {gen_s:.2f} s); bare loop {bare:.3f} s ({bare_cpu:.3f} s CPU) = {n_drive / bare / 1e6:.2f} M events/s"
          + (f"; best of {args.repeat} rounds" if args.repeat > 1 else ""))
    for r in rows:
        r["ratio_to_bare"] = r["seconds"] / bare
        r["cpu_ratio_to_bare"] = r["cpu_seconds"] / bare_cpu

    print(f"{'policy':18} {'M ev/s':>7} {'wall s':>7} {'cpu s':>7} {'x bare':>7} {'x cpu':>7} {'peak reserved':>14} "
          f"{'dev mallocs':>11}")
    for r in rows:
        print(f"{r['policy']:18} {r['events_per_s'] / 1e6:7.3f} {r['seconds']:7.2f} {r['cpu_seconds']:7.2f} "
              f"{r['ratio_to_bare']:7.2f} {r['cpu_ratio_to_bare']:7.2f} {r['peak_reserved_bytes'] / 2**20:11.1f} MiB {r['device_mallocs']:11,}"
              + ("" if r["completed"] else "  (OOM)"))
    if args.json:
        out = {"trace": {"preset": "alloc-heavy", "allocs": args.allocs, "seed": args.seed,
                         "driving_events": n_drive, "load_bytes": trace.load_bytes},
               "runtime": args.runtime, "python": sys.version.split()[0], "bare_loop_seconds": bare,
               "bare_loop_cpu_seconds": bare_cpu,
               "results": rows}
        with atomic_open(args.json) as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
