"""What resuming a capacity walk's probes from the previous probe's checkpoints saves (issue 19, item 3;
`allocsim.search.fit`, module docstring: resumed probes).

In this process, for each trace: the `torch` walk of the recorded settings (the exact walk of `allocsim fit`, and
tune's bisection to 3 significant figures, under the trace's ``:CAP`` when given) with probes resumed and with every
probe replayed from event 0, alternated ``--rounds`` times, the least CPU seconds of each, the answers checked equal;
and how many probes resumed. With ``--before DIR`` (a checkout of the code before, e.g. ``git archive main | tar -x
-C DIR``), ``allocsim fit TRACE -q --json`` run from there and from here, alternated, CPU seconds of the command and
its workers (the least of the rounds), the JSON checked equal. With ``--tune``: ``tune`` under the cap at ``-j 1`` in this
process, both ways alternated, its CPU seconds and those of its capacity walks' probes (the least round by total),
the rows' "fits on" checked equal.

    python3 benchmarks/bench_fit_resume.py [TRACE[:CAP] ...] [--rounds 3] [--before DIR] [--fit-args "-p torch"]
    python3 benchmarks/bench_fit_resume.py --tune [TRACE[:CAP] ...]     (the cap: 1.2 x LOAD if none)
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from allocsim.search import fit  # noqa: E402
from allocsim.search.sweep import cached_trace  # noqa: E402
from allocsim.search.tune import FIT_DIGITS  # noqa: E402

TRACES = ["traces/bert_mlm.bin", "traces/gpt2.bin", "traces/resnet50.bin", "traces/pressure-maxsplit-cap.bin:3767323852",
          "traces/pressure-empty-cache.bin", "traces/pressure-fraction-retry.bin", "traces/pressure-side-stream.bin"]


def counting(counts: list):
    """`fit._Trail.start_for` that counts in ``counts[0]`` the probes that resumed."""
    real = fit._Trail.start_for

    def start_for(trail, limit, below):
        b = real(trail, limit, below)
        counts[0] += b > 0
        return b
    return start_for


def walk_cpu(path: str, cap: int | None, digits: int | None, resume: bool) -> tuple[float, dict, int]:
    """CPU seconds of the walk, its answer and how many probes resumed (trails emptied first)."""
    counts, real, resumable = [0], fit._Trail.start_for, fit._resumable
    fit._TRAILS.clear()
    fit._Trail.start_for = counting(counts)
    if not resume:
        fit._resumable = lambda cell, settings: None
    try:
        c0 = time.process_time()
        out = fit.fit_capacity(path, "torch", islands=digits is None, top=cap, digits=digits)
        return time.process_time() - c0, out, counts[0]
    finally:
        fit._Trail.start_for, fit._resumable = real, resumable


def tune_cpu(path: str, cap: int | None, resume: bool) -> tuple[float, float, list]:
    """CPU seconds of ``tune`` at ``-j 1`` in this process and of the capacity walks' probes in it (`fit.probe`),
    and the rows' "fits on" (trails emptied first)."""
    from allocsim.search.tune import tune
    real, resumable, walked = fit.probe, fit._resumable, [0.0]

    def timed(args):
        c0 = time.process_time()
        try:
            return real(args)
        finally:
            walked[0] += time.process_time() - c0
    fit._TRAILS.clear()
    fit.probe = timed
    if not resume:
        fit._resumable = lambda cell, settings: None
    try:
        c0 = time.process_time()
        res = tune(path, cap=cap, jobs=1)
        return time.process_time() - c0, walked[0], [(r["setting"], r.get("fit_capacity_bytes")) for r in res.rows]
    finally:
        fit.probe, fit._resumable = real, resumable


def cli_cpu(where: str, args: list[str]) -> tuple[float, float, str]:
    """CPU seconds (the command and its workers) and wall seconds of ``allocsim ARGS`` run from ``where``, and its
    standard output."""
    env = dict(os.environ, PYTHONPATH=where, PYTHONDONTWRITEBYTECODE="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "allocsim", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", default=TRACES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tune", action="store_true", help="`tune --cap 1.2x` at -j 1 instead: its walks' CPU share")
    ap.add_argument("--before", help="a checkout of the code before: `allocsim fit` from there against here")
    ap.add_argument("--fit-args", default="", help="more arguments for `allocsim fit` (with --before)")
    a = ap.parse_args(argv)
    if a.tune:
        for arg in a.traces:
            path, _, cap = arg.partition(":")
            path = os.path.join(ROOT, path)
            cap = int(cap) if cap else int(1.2 * cached_trace(path).load_bytes)
            took = {True: [], False: []}
            answers = set()
            for _ in range(a.rounds):
                for resume in (False, True):
                    total, walks, rows = tune_cpu(path, cap, resume)
                    took[resume].append((total, walks))
                    answers.add(repr(rows))
            (t0, w0), (t1, w1) = min(took[False]), min(took[True])
            same = "the same rows" if len(answers) == 1 else "ROWS DIFFER"
            print(f"{os.path.basename(path)} `tune --cap {cap} -j 1`: CPU {t0:.2f} s, walks {w0:.2f} s "
                  f"({100 * w0 / t0:.0f} %) from event 0; {t1:.2f} s, walks {w1:.2f} s ({100 * w1 / t1:.0f} %) "
                  f"resumed; walks {w1 / w0:.2f}x, {same}", flush=True)
        return 0
    for arg in a.traces:
        path, _, cap = arg.partition(":")
        path = os.path.join(ROOT, path)
        walk_cpu(path, int(cap) if cap else None, FIT_DIGITS, False)     # the trace loaded, its chunks made
        name = os.path.basename(path)
        for digits, walk in ((None, "exact walk"), (FIT_DIGITS, f"bisection to {FIT_DIGITS} figures")):
            took = {True: [], False: []}
            answers, resumed = set(), 0
            for _ in range(a.rounds):
                for resume in (False, True):
                    s, out, n = walk_cpu(path, int(cap) if cap else None, digits, resume)
                    took[resume].append(s)
                    answers.add(repr(sorted(out.items())))
                    resumed = max(resumed, n)
            same = "the same answer" if len(answers) == 1 else "ANSWERS DIFFER"
            print(f"{name} torch {walk}: {out['replays']} replays, {resumed} resumed; CPU {min(took[False]):.3f} s "
                  f"from event 0, {min(took[True]):.3f} s resumed ({min(took[True]) / min(took[False]):.2f}x), "
                  f"{same}", flush=True)
        if a.before:
            args = ["fit", path, "-q", "--json", *a.fit_args.split()]
            took = {"before": [], "after": []}
            walls = {"before": [], "after": []}
            outs = set()
            for _ in range(a.rounds):
                for which, where in (("before", os.path.abspath(a.before)), ("after", ROOT)):
                    cpu, wall, out = cli_cpu(where, args)
                    took[which].append(cpu)
                    walls[which].append(wall)
                    outs.add(out)
            same = "the same JSON" if len(outs) == 1 else "JSON DIFFERS"
            print(f"{name} `allocsim {' '.join(args[:1] + args[2:])}`: CPU {min(took['before']):.2f} -> "
                  f"{min(took['after']):.2f} s ({min(took['after']) / min(took['before']):.2f}x), wall "
                  f"{min(walls['before']):.2f} -> {min(walls['after']):.2f} s, {same}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
