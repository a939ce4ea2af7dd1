"""How often folding is given up on a real run, replay after replay, alone or beside busy processes.

The folder's budget (allocsim/engine/fold.py, `Budget`) gives folding up where it does not pay; it is measured in
time, so a machine's load can make it give up a fold that pays. Each of ``--runs`` replays of a real run of
``traces/fold/`` (its steps read afresh, as `allocsim replay` reads them) is counted as folded to the end, given up
after folding (at which step), or never folded; ``--busy N`` runs N processes that only spin meanwhile.

    python3 benchmarks/bench_give_up.py [--trace gpt-fixed] [--policies torch,split] [--runs 20] [--busy 2]
"""
from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_fold import timed, unpacked  # noqa: E402
from allocsim.trace import Trace  # noqa: E402


def spin(stop) -> None:
    while not stop.is_set():
        sum(range(10000))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", default="gpt-fixed", help="a run of traces/fold/ (default gpt-fixed)")
    ap.add_argument("--policies", default="torch,split")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile (default 0)")
    a = ap.parse_args(argv)
    trace = Trace.load(unpacked(os.path.join(ROOT, "traces", "fold", a.trace + ".bin.xz")))
    stop = multiprocessing.Event()
    busy = [multiprocessing.Process(target=spin, args=(stop,), daemon=True) for _ in range(a.busy)]
    for p in busy:
        p.start()
    time.sleep(0.5 if busy else 0)
    try:
        print(f"{a.trace}: {a.runs} replays each, beside {a.busy} busy processes")
        for policy in a.policies.split(","):
            counts = collections.Counter()
            for _ in range(a.runs):
                how = timed(trace, policy, True)[2]
                counts["never folded" if how is None else
                       f"gave up at step {how['gave_up_at_step']}" if how.get("gave_up_at_step") else "folded"] += 1
            print(f"  {policy:<8}" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    finally:
        stop.set()
        for p in busy:
            p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
