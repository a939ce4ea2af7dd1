"""Free lists with best fit, shared by the `split` and `bestfit` policies.

`SizeBuckets` holds free blocks named by an integer key (a block id, an address)
as one sorted plain list of ints ``size << KEY_BITS | key``: best fit is one
``bisect`` for ``n << KEY_BITS`` (the smallest size >= n, ties to the lowest key:
the oldest block id, the lowest address) and a ``del`` at that index.

Deletion is lazy. The owner keeps its own map ``size_of(key)``: the size of the
free block ``key`` while it is free, anything else once it is not. An entry
``size << KEY_BITS | key`` counts only while ``size_of(key) == size``; the owner
removes a block from the free lists (a merge, a reclaim) by changing its map
alone, in O(1). A key pushed twice under the same size is harmless: the first
fit takes the block, and the owner's map then voids the other copy. A best-fit
search drops the void entries it meets.

Costs (k = entries, void ones included): `push` O(log k) plus O(k) memmove (in
C); `pop_fit` the same, amortised over the void entries it discards; `members`
and `largest` O(k), for the rare paths (reclaim, metrics). The allocators keep
few free blocks (tens to hundreds), so the memmoves are short; one list of ints
also costs fewer interpreter steps than a heap per size plus a list of sizes.
The policies' hot paths inline `push` and `pop_fit` (a call costs as much as
the work).
"""
from __future__ import annotations

from bisect import bisect_left, insort

KEY_BITS = 64                   # keys (block ids, device addresses) are below 2**64
KEY_MASK = (1 << KEY_BITS) - 1


class SizeBuckets:
    """Best-fit free lists: a sorted list of ``size << KEY_BITS | key``.

    `push` and `pop_fit` are closures over the list, made once, so a policy's
    hot path calls them with no attribute lookups.
    """

    __slots__ = ("entries", "size_of", "push", "pop_fit")

    #: Fewest entries before `compact` is worth its pass.
    COMPACT_MIN = 64

    def __init__(self, size_of):
        self.entries: list[int] = []        # sorted ``size << KEY_BITS | key`` (some may be void)
        self.size_of = size_of              # owner's map: key -> current free size
        entries = self.entries

        def push(key: int, size: int) -> None:
            """Add free block ``key`` of ``size`` (the owner has set ``size_of(key) == size``)."""
            insort(entries, size << KEY_BITS | key)

        def pop_fit(n: int, limit: int = 1 << 62) -> int:
            """Take the smallest block of size >= ``n`` (and <= ``limit``), lowest key first; 0 if none.

            The owner must then mark the key as no longer free in its map. Void
            entries met on the way are dropped.
            """
            i = bisect_left(entries, n << KEY_BITS)
            while i < len(entries):
                e = entries[i]
                s = e >> KEY_BITS
                if s > limit:
                    return 0
                del entries[i]
                k = e & KEY_MASK
                if size_of(k) == s:
                    return k
            return 0

        self.push = push
        self.pop_fit = pop_fit

    def compact(self) -> int:
        """Drop the void entries, in place and in order (best fit finds the same blocks); return how many remain.

        The hot paths call it when the list has grown past twice its live size since
        the last call, so void entries never outnumber the live ones for long (amortised O(1) per push).
        """
        size_of = self.size_of
        self.entries[:] = [e for e in self.entries if size_of(e & KEY_MASK) == e >> KEY_BITS]
        return len(self.entries)

    def members(self) -> list[tuple[int, int]]:
        """Every free block as ``(size, key)`` in ascending order; drops void and repeated entries on the way."""
        size_of, live = self.size_of, []
        for e in self.entries:
            s, k = e >> KEY_BITS, e & KEY_MASK
            if size_of(k) == s and (not live or live[-1] != e):
                live.append(e)
        self.entries[:] = live
        return [(e >> KEY_BITS, e & KEY_MASK) for e in live]

    def largest(self) -> int:
        """Size of the largest free block, 0 if none."""
        entries, size_of = self.entries, self.size_of
        while entries:
            s = entries[-1] >> KEY_BITS
            if size_of(entries[-1] & KEY_MASK) == s:
                return s
            entries.pop()
        return 0
