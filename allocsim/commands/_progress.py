"""Progress of a long run of like steps (a sweep's cells, a compare's replays) where no bar can be drawn.

Off a terminal (a CI log, ``nohup``, ``2> log``) a bar's redraws would be noise and silence looks like a hang
(a sweep of 600 cells said nothing for 7.7 s): `CountLines` prints one stderr line now and then, how many steps
are done, in how long, and about how long the rest will take (the mean step so far times the steps left). The
lines thin out as the run goes on: the first after `FIRST` seconds, then one each time a tenth more of the time so
far has passed (at least `FIRST`, at most `MOST` seconds apart): a few lines for a short run, one a minute for
a run of hours.
"""
from __future__ import annotations

import sys
import time

FIRST = 5.0     # seconds before the first line, and the least between two
MOST = 60.0     # the most seconds between two lines


class CountLines:
    """``update(done)`` after each step of ``total``; a line when it is due (`FIRST`, `MOST`)."""

    def __init__(self, command: str, total: int, unit: str, *, clock=time.perf_counter, out=None):
        self.command, self.total, self.unit, self.clock = command, total, unit, clock
        self.out = out
        self.started = clock()
        self.due = self.started + FIRST

    def update(self, done: int) -> None:
        now = self.clock()
        if now < self.due or done >= self.total:        # the end says itself (the command's own line)
            return
        took = now - self.started
        self.due = now + min(MOST, max(FIRST, took / 10))
        left = took / done * (self.total - done) if done else None
        print(f"allocsim {self.command}: {done:,} of {self.total:,} {self.unit} in {took:.1f}s"
              + (f" (about {left:.0f}s left)" if left is not None else ""), file=self.out or sys.stderr, flush=True)


def count_progress(command: str, total: int, unit: str, quiet: bool):
    """``(update(done), close)`` for ``total`` steps: a tqdm bar on a terminal, `CountLines` elsewhere, nothing
    with ``quiet``."""
    if quiet:
        return (lambda done: None), (lambda: None)
    if not sys.stderr.isatty():
        return CountLines(command, total, unit).update, (lambda: None)
    from tqdm import tqdm
    bar = tqdm(total=total, desc=command, unit="run", leave=False)

    def update(done):
        bar.update(done - bar.n)
    return update, bar.close
