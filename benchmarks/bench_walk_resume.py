"""How much of each capacity-walk probe a resume from an earlier probe's state could skip (issue 19, item 3).

A replay under cap C' goes exactly as one under a larger C up to the first limit comparison that comes out
otherwise: while the largest need the replay at C has granted so far is at most C' (and the smallest it
refused is above C'), its state is that of the replay at C'. For each probe of a walk (the exact walk of
`allocsim fit`, a MiB at a time, and tune's bisection to 3 significant figures, `allocsim.search.fit`), this takes
the longest such prefix of any earlier probe of the walk, read at checkpoints every 1/64 of the trace, as a
share of the probe's driving events: what a resume from the last checkpoint before the divergence would skip.
Nothing is resumed here; it measures whether building the resume pays, and what a checkpoint would cost
made the one way a `Replay` can be copied today: `copy.deepcopy` half-way (the trace and its chunks shared),
as a share of one full replay's CPU time.

    python3 benchmarks/bench_walk_resume.py [TRACE[:CAP] ...]

Measured 2026-11-26 (2-core machine, shared): the exact walk 25 / 23 / 25 % on pressure-maxsplit-cap (under
its cap), resnet50 and gpt2-maxsplit; the bisection 5 / 23 / 17 % of 9 / 7 / 5 probes; a deep copy half-way
62–69 % and 64–78 % of a full replay (pressure-maxsplit-cap, resnet50; the least of three, in three runs).
A resume that pays needs a cheaper snapshot than a deep copy (the policies' own state copied by the policies).
"""
from __future__ import annotations

import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from allocsim.search import fit  # noqa: E402
from allocsim.engine.replay import Replay, driving_count  # noqa: E402
from allocsim.search.sweep import Settings, cached_trace  # noqa: E402
from allocsim.search.tune import FIT_DIGITS, Space, Target  # noqa: E402

TRACES = ["traces/pressure-maxsplit-cap.bin:3767323852", "traces/resnet50.bin", "traces/gpt2-maxsplit128-rp2div4.bin"]


def checkpoints(path: str, spec, cap: int) -> tuple[int, list[tuple[int, int, int | None, bool]]]:
    """The driving events of ``path`` and, every 1/64 of them, ``(events done, largest need granted so far,
    smallest refused so far, pinned)`` of its replay under ``cap``."""
    t = cached_trace(path)
    r = Replay(t, spec, Settings().replay, cap=cap)
    n = driving_count(t)
    out = []
    while not r.at_end:
        d = r.device
        out.append((r.events_done, max(d.peak_reserved, d.granted_max), d.refused_min, d.pinned))
        r.step(max(n // 64, 1))
    r.close()
    return n, out


def resumable(cap: int, earlier: dict) -> int:
    """The most driving events an earlier probe (``earlier``: cap -> `checkpoints`) went as one at ``cap`` would."""
    best = 0
    for _, points in earlier.values():
        for done, granted, refused, pinned in points:
            if pinned or not granted <= cap < (refused if refused is not None else 1 << 63):
                break
            best = max(best, done)
    return best


def measure(path: str, cap: int | None, digits: int | None) -> list[float]:
    """The share of each probe's events (the unlimited replay left out) a resume could skip."""
    spec = Space(cached_trace(path), Target(None, cap)).candidates()[0].spec
    w = fit.walk_of(path, spec, islands=False, top=cap, digits=digits, max_replays=fit.MAX_REPLAYS)
    caps = []
    while not w.done:
        caps.append(w.need)
        w.take(fit.probe(w.task(w.need)))
    earlier, shares = {}, []
    for c in caps[1:]:
        skip = resumable(c, earlier)
        earlier[c] = checkpoints(path, spec, c)
        shares.append(skip / earlier[c][0])
    return shares


def copy_cost(path: str, cap: int | None) -> float:
    """CPU seconds of a deep copy of the recorded settings' replay half-way, over those of one full replay (the
    least of three each)."""
    import copy
    import time
    from allocsim.engine.replay import kept_chunks
    t = cached_trace(path)
    spec = Space(t, Target(None, cap)).candidates()[0].spec
    def took(fn) -> float:
        """The least CPU seconds of three runs of ``fn`` (the machine is shared)."""
        out = []
        for _ in range(3):
            c0 = time.process_time()
            fn()
            out.append(time.process_time() - c0)
        return min(out)
    full = took(lambda: Replay(t, spec, Settings().replay, cap=cap, fold=False).run())
    r = Replay(t, spec, Settings().replay, cap=cap, fold=False)
    r.step(driving_count(t) // 2)
    kept = kept_chunks(t, False) or ([], [])
    shared = {id(x): x for x in (t, kept[0], *kept[0])}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(100_000)          # a pool's blocks are linked lists: the copy recurses along them
    try:
        return took(lambda: copy.deepcopy(r, dict(shared))) / full
    finally:
        sys.setrecursionlimit(limit)


def main(argv=None) -> int:
    for arg in (argv if argv is not None else sys.argv[1:]) or [os.path.join(ROOT, t) for t in TRACES]:
        path, _, cap = arg.partition(":")
        for digits, walk in ((None, "exact walk"), (FIT_DIGITS, f"bisection to {FIT_DIGITS} figures")):
            s = measure(path, int(cap) if cap else None, digits)
            q = [round(100 * x) for x in statistics.quantiles(s, n=4)] if len(s) > 1 else [round(100 * x) for x in s]
            print(f"{os.path.basename(path)} {walk}: {len(s)} probes, a resume would skip "
                  f"{100 * statistics.mean(s):.0f} % of their events on average (quartiles {q} %)", flush=True)
        print(f"{os.path.basename(path)}: a checkpoint by deep copy half-way costs "
              f"{100 * copy_cost(path, int(cap) if cap else None):.0f} % of a full replay", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
