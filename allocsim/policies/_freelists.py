"""Free lists by exact size with best fit, shared by the `split` and `bestfit` policies.

`SizeBuckets` holds free blocks named by an integer key (a block id, an address):
one min-heap of keys per exact size, and a sorted plain list of the sizes that
have a heap. Best fit is ``bisect`` on the size list, then ``heappop`` on that
size's heap, so ties go to the lowest key (the oldest block id, the lowest
address).

Deletion is lazy. The owner keeps its own map ``size_of(key)``: the size of the
free block ``key`` while it is free, anything else once it is not. An entry
``key`` in the heap of size ``s`` counts only while ``size_of(key) == s``; the
owner removes a block from the free lists (a merge, a reclaim) by changing its
map alone, in O(1). A key pushed twice under the same size is harmless: the
first pop takes the block, and the owner's map then voids the other copy. A heap
emptied by a pop stays (the next free block of that size reuses it); a best-fit
search that meets an empty or all-void heap drops it.

Costs (k = sizes with a heap, h = entries in one size's heap, void ones
included): `push` O(log h), plus O(k) memmove (in C) when it opens a new size;
`pop_fit` O(log k + log h), amortised over the void entries and empty heaps it
discards; `members` and `largest` O(entries), for the rare paths (reclaim,
metrics). Sizes are quantised by the allocators (512 B and up), so k stays in
the thousands while the number of free blocks can be far larger. The policies'
hot paths inline `push` and `pop_fit` (a call costs as much as the work).
"""
from __future__ import annotations

from bisect import bisect_left, insort
from heapq import heappop, heappush


class SizeBuckets:
    """Best-fit free lists: ``{size: heap of keys}`` and a sorted list of those sizes.

    `push` and `pop_fit` are closures over the two containers, made once, so a
    policy's hot path calls them with no attribute lookups.
    """

    __slots__ = ("sizes", "heaps", "size_of", "push", "pop_fit")

    def __init__(self, size_of):
        self.sizes: list[int] = []          # sorted sizes that have a heap (possibly empty)
        self.heaps: dict[int, list] = {}    # size -> min-heap of keys (some may be void)
        self.size_of = size_of              # owner's map: key -> current free size
        sizes, heaps = self.sizes, self.heaps

        def push(key: int, size: int) -> None:
            """Add free block ``key`` of ``size`` (the owner has set ``size_of(key) == size``)."""
            h = heaps.get(size)
            if h is None:
                heaps[size] = [key]
                insort(sizes, size)
            else:
                heappush(h, key)

        def pop_fit(n: int, limit: int = 1 << 62) -> int:
            """Take the smallest block of size >= ``n`` (and <= ``limit``), lowest key first; 0 if none.

            The owner must then mark the key as no longer free in its map. A heap
            emptied by the pop stays (the next free of that size reuses it); one
            found empty or void is dropped.
            """
            i = bisect_left(sizes, n)
            while i < len(sizes):
                s = sizes[i]
                if s > limit:
                    return 0
                h = heaps[s]
                while h:
                    k = heappop(h)
                    if size_of(k) == s:
                        return k
                del heaps[s], sizes[i]
            return 0

        self.push = push
        self.pop_fit = pop_fit

    def members(self) -> list[tuple[int, int]]:
        """Every free block as ``(size, key)`` in ascending order; drops void entries on the way."""
        size_of, out = self.size_of, []
        for s in list(self.sizes):
            keys = sorted({k for k in self.heaps[s] if size_of(k) == s})
            if keys:
                self.heaps[s][:] = keys         # a sorted list is a valid heap
                out.extend((s, k) for k in keys)
            else:
                self._drop(s)
        return out

    def largest(self) -> int:
        """Size of the largest free block, 0 if none."""
        size_of = self.size_of
        while self.sizes:
            s = self.sizes[-1]
            if any(size_of(k) == s for k in self.heaps[s]):
                return s
            self._drop(s)
        return 0

    def _drop(self, s: int) -> None:
        del self.heaps[s]
        del self.sizes[bisect_left(self.sizes, s)]
