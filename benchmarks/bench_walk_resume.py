"""How much of each capacity-walk probe a resume from an earlier probe's state could skip (issue 19, item 3).

A replay under cap C' goes exactly as one under a larger C up to the first limit comparison that comes out
otherwise: while the largest need the replay at C has granted so far is at most C' (and the smallest it
refused is above C'), its state is that of the replay at C'. For each probe of a walk (the exact walk of
`allocsim fit`, a MiB at a time, and tune's bisection to 3 significant figures, `allocsim.fit`), this takes
the longest such prefix of any earlier probe of the walk, read at checkpoints every 1/64 of the trace, as a
share of the probe's driving events: what a resume from the last checkpoint before the divergence would skip.
Nothing is resumed here; it measures whether building the resume pays.

    python3 benchmarks/bench_walk_resume.py [TRACE[:CAP] ...]
"""
from __future__ import annotations

import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from allocsim import fit  # noqa: E402
from allocsim.replay import Replay, driving_count  # noqa: E402
from allocsim.sweep import Settings, cached_trace  # noqa: E402
from allocsim.tune import FIT_DIGITS, Space, Target  # noqa: E402

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


def main(argv=None) -> int:
    for arg in (argv if argv is not None else sys.argv[1:]) or [os.path.join(ROOT, t) for t in TRACES]:
        path, _, cap = arg.partition(":")
        for digits, walk in ((None, "exact walk"), (FIT_DIGITS, f"bisection to {FIT_DIGITS} figures")):
            s = measure(path, int(cap) if cap else None, digits)
            q = [round(100 * x) for x in statistics.quantiles(s, n=4)] if len(s) > 1 else [round(100 * x) for x in s]
            print(f"{os.path.basename(path)} {walk}: {len(s)} probes, a resume would skip "
                  f"{100 * statistics.mean(s):.0f} % of their events on average (quartiles {q} %)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
