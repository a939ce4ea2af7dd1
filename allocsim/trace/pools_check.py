"""A trace's pool numbers: one pool (``MempoolId``) per number and one number per pool.

A pool event (``POOL_BEGIN`` … ``POOL_RELEASE``, ``GRAPH_REPLAY``) carries the pool's ``MempoolId`` as
``first << 32 | second`` in ``addr`` and the pool's number in ``aux`` (docs/trace-format.md). A replay keys
pools by number: two pools under one number would share one cache, and one pool under two numbers would be
two caches, each replayed without a word. `PoolNumbers` finds the first event that breaks the pairing, a
chunk of records at a time, as the trace's validator walks them.
"""
from __future__ import annotations

import numpy as np

from ..errors import InputError
from . import events as ev

#: The kinds whose ``addr`` is a pool's ``MempoolId`` and ``aux`` its number.
POOL_NUMBERED = (*ev.POOL, ev.GRAPH_REPLAY)


def mempool_id(bits: int) -> str:
    """``addr`` of a pool event as PyTorch prints a ``MempoolId_t``: ``(first, second)``."""
    return f"({bits >> 32}, {bits & 0xFFFFFFFF})"


class PoolNumbers:
    """The pairing of pool numbers and pools seen so far, over a walk of a trace's records in order."""

    def __init__(self):
        self.pool_of: dict[int, tuple[int, int]] = {}      # number -> (MempoolId, the event that paired them)
        self.number_of: dict[int, tuple[int, int]] = {}    # MempoolId -> (number, the event that paired them)

    def first_clash(self, rec: np.ndarray, start: int = 0) -> tuple[int, str] | None:
        """The first event of ``rec`` (records of the trace from event ``start`` on) that names a pool under
        another number than before, or a number of another pool: ``(event, what)``; None if there is none."""
        at = np.flatnonzero(np.isin(rec["kind"], POOL_NUMBERED))
        for j, kind, pool, number in zip(at.tolist(), rec["kind"][at].tolist(), rec["addr"][at].tolist(),
                                         rec["aux"][at].tolist()):
            i = start + j
            had_pool, since = self.pool_of.setdefault(number, (pool, i))
            if had_pool != pool:
                return i, (f"{ev.KIND_NAMES[kind]} names pool number {number} for pool {mempool_id(pool)}, but event "
                           f"{since} gave that number to pool {mempool_id(had_pool)}: one number, two pools")
            had_number, since = self.number_of.setdefault(pool, (number, i))
            if had_number != number:
                return i, (f"{ev.KIND_NAMES[kind]} numbers pool {mempool_id(pool)} {number}, but event {since} "
                           f"numbered it {had_number}: one pool, two numbers")
        return None


def check_pool_numbers(rec: np.ndarray, path: str | None = None) -> None:
    """Raise `InputError` (naming ``path`` and the event) at the first pool event that breaks the pairing of
    pool numbers and pools; ``rec`` are all of a trace's records."""
    clash = PoolNumbers().first_clash(rec)
    if clash:
        raise InputError(clash[1], path=path, position=f"event {clash[0]}")
