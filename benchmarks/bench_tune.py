"""Tune's wall time as a ratio to single replays of the same trace, and how busy ``-j N`` keeps its workers.

For each trace: the single replay under the recorded settings (the median of ``--singles`` runs, taken in this
run, before and after the tunes), then ``allocsim.search.tune`` at each ``--jobs`` (``-j 1`` in this process, more on a
local process pool). Per tune: wall seconds, the ratio to one single replay (issue 17 asks for ≤ 100), the
speed-up over ``-j 1``, the replays the answer counts, and per worker its CPU-busy fraction (its tasks' CPU
seconds over the tune's wall time), its held fraction (the wall seconds it spent in tasks, over the same) and
the tasks it ran (a task is one replay of a capacity walk, or a chunk of the settings replays): on a machine
shared with other work the speed-up and the CPU fraction hide behind the load (a worker holding a task gets
part of a core), the held fraction and task counts show whether the workers had work. Every ``-j`` must give the same
answer (which replays the bound stops depends on the order they end in, so only the rows replayed to the end in both
are compared); the benchmark checks it. ``cpu`` is the tune's CPU seconds (this process and every worker) over one
single replay's: the cost a busy machine does not distort.

``--cap`` is the allowed memory (a size, or ``1.2x``: that multiple of each trace's LOAD); ``--capacity`` the device's
memory (default: the recorded device's). ``--synth ITERATIONS`` adds a generated variable-length transformer
(`allocsim.formats.synth`, about 1,050 events an iteration) recorded as a PyTorch run, for a trace of 10^5 events and more;
``--recorded-conf`` gives it the ``PYTORCH_CUDA_ALLOC_CONF`` it was recorded with (issue 17's first case: 49
iterations, ``--recorded-conf max_split_size_mb:128,roundup_power2_divisions:4 --capacity 22GB``).

    python3 benchmarks/bench_tune.py [traces/resnet50.bin ...] [--jobs 1,2] [--cap 1.2x] [--capacity 22GB]
                                     [--synth 100 [--recorded-conf CONF]] [--no-fit] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import Future, ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from allocsim.outputs import atomic_open  # noqa: E402
from allocsim.search.sweep import Cell, cached_trace, run_cell  # noqa: E402
from allocsim.search.tune import Space, Target, tune  # noqa: E402


def _tagged(fn, *args):
    """``fn(*args)`` in a worker, with the worker's pid and the CPU and wall seconds it took."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn(*args)
    return os.getpid(), time.process_time() - c0, time.perf_counter() - t0, out


class CountingPool(ProcessPoolExecutor):
    """A process pool that counts each worker's tasks and CPU seconds (`_tagged`), results unchanged."""

    def __init__(self, jobs: int):
        super().__init__(max_workers=jobs)
        self.tasks: dict[int, int] = defaultdict(int)
        self.cpu: dict[int, float] = defaultdict(float)
        self.held: dict[int, float] = defaultdict(float)

    def submit(self, fn, /, *args, **kwargs):
        outer = Future()
        inner = super().submit(_tagged, fn, *args)

        def done(f):
            if outer.cancelled():       # given up by the caller: a replay ahead that no walk needed
                return
            if f.cancelled():
                outer.cancel()
                outer.set_running_or_notify_cancel()
            elif f.exception() is not None:
                outer.set_exception(f.exception())
            else:
                pid, cpu, held, out = f.result()
                self.tasks[pid] += 1
                self.cpu[pid] += cpu
                self.held[pid] += held
                outer.set_result(out)
        inner.add_done_callback(done)
        outer.add_done_callback(lambda o: o.cancelled() and inner.cancel())
        return outer


def single_replay_s(path: str, n: int, cap: int | None = None, capacity="trace") -> tuple[float, float]:
    """Median wall and CPU seconds of ``n`` replays under the recorded settings (the trace already loaded)."""
    t = cached_trace(path)
    spec = Space(t, Target(None, None)).candidates()[0].spec
    cell = Cell(path, spec, cap, capacity=capacity)
    times, cpu = [], []
    for _ in range(n):
        c0, t0 = time.process_time(), time.perf_counter()
        run_cell(cell)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(times), statistics.median(cpu)


def answer(res) -> tuple[str, dict]:
    """What must not depend on ``-j``: the ``--json`` object but the wall times of its replays and the search's
    counts of its own work, the rows apart (by setting) and those the bound stopped left out (which ones it stops,
    and which settings share a replay, depends on the order replays end in)."""
    def timeless(v):
        if isinstance(v, dict):
            return {k: timeless(x) for k, x in v.items() if k != "replay_seconds"}
        return [timeless(x) for x in v] if isinstance(v, list) else v
    d = timeless(res.to_dict())
    rows = {r["setting"]: json.dumps(r, sort_keys=True, default=str) for r in d.pop("candidates") if not r["pruned"]}
    for k in ("settings_pruned", "settings_shared", "settings_resumed", "replays"):     # the search's own effort
        d.pop(k)
    return json.dumps(d, sort_keys=True, default=str), rows


def same_answers(answers: list[tuple[str, dict]]) -> bool:
    """Every run's `answer` alike: the same object, and the same figures for each row two runs replayed to the end."""
    first, rows = answers[0]
    return all(a == first and all(rows[k] == v for k, v in r.items() if k in rows) for a, r in answers[1:])


def tune_run(path: str, jobs: int, fit: bool, cap: int | None = None, capacity="trace") -> dict:
    """One tune at ``jobs``; its wall time and CPU seconds (this process and the workers), answer and workers'
    tasks and busy fractions."""
    if jobs <= 1:
        c0, t0 = time.process_time(), time.perf_counter()
        res = tune(path, cap=cap, capacity=capacity, jobs=1, fit=fit)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"wall_s": wall, "cpu_s": cpu, "res": res, "workers": [{"tasks": None, "busy": cpu / wall, "held": 1.0}]}
    with CountingPool(jobs) as ex:
        c0, t0 = time.process_time(), time.perf_counter()
        res = tune(path, cap=cap, capacity=capacity, jobs=jobs, fit=fit, executor=ex)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    workers = [{"tasks": ex.tasks[pid], "busy": ex.cpu[pid] / wall, "held": ex.held[pid] / wall}
               for pid in sorted(ex.tasks)]
    return {"wall_s": wall, "cpu_s": cpu + sum(ex.cpu.values()), "res": res, "workers": workers}


def synth_transformer(iterations: int, folder: str, conf: str | None = None) -> str:
    """A generated variable-length transformer of ``iterations`` steps, saved as a PyTorch recording (the torch
    space: the caching allocator's settings) on an 80 GiB device, recorded under ``conf`` (a
    ``PYTORCH_CUDA_ALLOC_CONF``; None: the defaults); its path."""
    from allocsim.formats.synth import generate
    from allocsim.trace import Trace
    t = generate("transformer", variable=True, iterations=iterations)
    path = os.path.join(folder, f"transformer-variable-{iterations}.bin")
    meta = {**t.meta, "framework": "torch"}
    if conf:
        meta["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": conf}
    Trace(t.records, meta, streams=t.streams, sites=t.sites, labels=t.labels).save(path)
    return path


def cap_of(text: str | None, path: str) -> int | None:
    """``--cap`` for ``path``: a size, or ``1.2x`` (that multiple of its LOAD); None without one."""
    if text is None:
        return None
    if text.endswith("x"):
        return int(float(text[:-1]) * cached_trace(path).load_bytes)
    from allocsim.units import parse_size
    return parse_size(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="*", default=[os.path.join(ROOT, "traces", "resnet50.bin")])
    ap.add_argument("--jobs", default="1,2", help="comma-separated -j values (default 1,2)")
    ap.add_argument("--singles", type=int, default=5, help="single replays timed before and after (default 5)")
    ap.add_argument("--no-fit", action="store_true", help="tune without the capacity walks")
    ap.add_argument("--cap", help="the allowed memory: a size, or 1.2x (that multiple of each trace's LOAD)")
    ap.add_argument("--capacity", default="trace", help="the device's memory (default: the recorded device's)")
    ap.add_argument("--synth", type=int, metavar="ITERATIONS",
                    help="add a generated variable-length transformer of that many steps, as a PyTorch recording")
    ap.add_argument("--recorded-conf", metavar="CONF", help="the PYTORCH_CUDA_ALLOC_CONF --synth's trace is recorded with")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = ap.parse_args(argv)
    jobs = [int(j) for j in args.jobs.split(",")]
    if args.capacity != "trace":
        from allocsim.units import parse_size
        args.capacity = parse_size(args.capacity, what="--capacity")
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as folder:
        traces = args.traces + ([synth_transformer(args.synth, folder, args.recorded_conf)] if args.synth else [])
        for path in traces:
            cap = cap_of(args.cap, path)
            before = single_replay_s(path, args.singles, cap, args.capacity)
            runs = {j: tune_run(path, j, not args.no_fit, cap, args.capacity) for j in jobs}
            after = single_replay_s(path, args.singles, cap, args.capacity)
            single, single_cpu = statistics.median([before[0], after[0]]), statistics.median([before[1], after[1]])
            if not same_answers([answer(r["res"]) for r in runs.values()]):
                print(f"{path}: the answer depends on -j", file=sys.stderr)
                return 1
            base, res = runs[jobs[0]]["wall_s"], runs[jobs[0]]["res"]
            print(f"{os.path.basename(path)} ({len(cached_trace(path)):,} events" + (f", --cap {cap:,}" if cap else "")
                  + f"): single replay {single * 1e3:.1f} ms ({single_cpu * 1e3:.1f} ms cpu); {res.replays} replays "
                  f"counted, {res.pruned} of {len(res.rows)} settings stopped early")
            for j, r in runs.items():
                busy = " ".join(f"{w['busy']:.0%}/{w['held']:.0%}" + (f"/{w['tasks']}" if w["tasks"] is not None
                                                                      else "") for w in r["workers"])
                print(f"  -j {j}: {r['wall_s']:7.2f} s = {r['wall_s'] / single:6.1f} single replays "
                      f"(cpu {r['cpu_s'] / single_cpu:6.1f}); speed-up {base / r['wall_s']:.2f}x; "
                      f"workers cpu/held/tasks: {busy}")
                out.append({"trace": os.path.basename(path), "cap": cap, "jobs": j, "wall_s": r["wall_s"],
                            "single_s": single, "ratio": r["wall_s"] / single, "cpu_ratio": r["cpu_s"] / single_cpu,
                            "speedup": base / r["wall_s"], "replays": r["res"].replays, "pruned": r["res"].pruned,
                            "workers": r["workers"]})
    if args.json:
        with atomic_open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
