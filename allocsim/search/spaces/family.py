"""How a search space lets settings share one replay: its family rule (docs/tune.md, "Families").

Some settings replay exactly as another one, figure for figure, up to a point that the other's replay can tell
(PyTorch's GC threshold until the GC acts, and more: `allocsim.search.spaces.torch`). `allocsim.search.tune`
replays such a setting (the family's *head*) once for its *members*: before each window of events where a member
could start to differ it takes a checkpoint of the replay, and each member resumes from the checkpoint before the
window where it did, or takes the head's row where that never came. Which settings form a family, what a member
watches, and where it parts are the space's rule (a `FamilyRule`, the space module's ``FAMILIES``); the search reads
no policy member itself. A space whose settings share nothing declares `NO_FAMILIES`: each is replayed alone.
"""
from __future__ import annotations


class Watcher:
    """A head's replay watched for its members (by position in the family): which could part in a window, which
    did. ``pending``: the members that have not parted yet (a member still pending at the end takes the head's row)."""

    pending: dict

    def begin(self, replay) -> None:
        """The head's replay ``replay`` starts (or resumes): read what the watches compare with."""

    def could_part(self, k: int) -> bool:
        """Whether a pending member could start to differ in window ``k`` (the search checkpoints before it)."""
        raise NotImplementedError

    def parted(self) -> list[int]:
        """After a window: the pending members that have started to differ in it, no longer pending."""
        raise NotImplementedError


class FamilyRule:
    """A space's rule for settings that share a head's replay; this one shares nothing. ``alike``: which settings
    behave as another, until when; ``taken``: why a member takes its head's figures (`allocsim tune`'s report)."""

    alike = "none"
    taken = "none"

    def shares(self, trace) -> bool:
        """Whether settings may share a head's replay on ``trace`` at all."""
        return False

    def heads(self, values: dict) -> list:
        """The settings (`PolicySpec`) a setting of option ``values`` may be watched from, the widest family first
        (the search takes the first it replays)."""
        return []

    def watch(self, head: dict, member: dict):
        """What tells where a replay under ``member``'s option values first differs from one under ``head``'s, read
        off the head's replay (opaque to the search; the `Watcher`'s); None where it cannot be watched."""
        return None

    def order(self, values: dict):
        """Sort key of members resumed from one checkpoint: the first can head the rest (`watch`), not the
        reverse (the search groups them into families again)."""
        return 0

    def alike_throughout(self, head: dict, watch) -> bool:
        """Whether a member watched so replays as the head whatever happens (it takes the head's row unwatched)."""
        return False

    def watcher(self, trace, head: dict, watches: list, window: int) -> Watcher:
        """The `Watcher` of a replay of ``trace`` under ``head``'s option values for members watched so
        (``watches``), checked every ``window`` driving events."""
        raise NotImplementedError


NO_FAMILIES = FamilyRule()
