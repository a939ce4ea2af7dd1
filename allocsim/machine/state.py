"""What the pieces of a replay share in declaring their state (docs/architecture.md, "Folding": who declares what).

Each piece of a replay (the policy, the device with its driver placement, the runtime, the walk) declares what
a copy of its state is (``checkpoint``/``restore``, a named record), how two states are compared (the fingerprint
folding compares) and which integer totals a period adds to (``COUNTS``). `Counted` is the last: a snapshot of
the totals and the growth of ``k`` more periods like one walked.
"""
from __future__ import annotations


def snapshot(obj, names) -> tuple:
    """The integer attributes ``names`` of ``obj`` now: what a fold takes before and after the window it walks."""
    return tuple(getattr(obj, name) for name in names)


def add_growth(obj, names, before: tuple, after: tuple, k: int) -> None:
    """Add to ``obj``'s attributes ``names`` ``k`` times their growth from the `snapshot` ``before`` to ``after``
    (a fold skipped ``k`` more windows like the one walked)."""
    for name, b, a in zip(names, before, after):
        setattr(obj, name, getattr(obj, name) + k * (a - b))


class Counted:
    """A piece whose ``COUNTS`` (names of integer attributes) only count: a fold snapshots them (`counts`) before
    and after the window it walks and adds ``k`` times the growth for the windows it skips (`advance`)."""

    COUNTS: tuple[str, ...] = ()

    def counts(self) -> tuple:
        """The `COUNTS` now. Twice per fold."""
        return snapshot(self, self.COUNTS)

    def advance(self, before: tuple, after: tuple, k: int) -> None:
        """A fold skipped ``k`` more windows like the one walked between the `counts` snapshots ``before`` and
        ``after``: add ``k`` times its growth. Once per fold."""
        add_growth(self, self.COUNTS, before, after, k)
