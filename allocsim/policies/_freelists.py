"""Free lists with best fit, as the `split` policy keeps them (`bestfit` keeps its own, exact, ending with `END`).

`SizeBuckets` holds free blocks named by an integer key (a block id, an address)
as one sorted plain list of int entries ``size >> unit_shift << key_bits | key``
(``unit_shift``: the sizes are multiples of ``2**unit_shift`` bytes, so nothing is
lost): best fit is one ``bisect`` for the entry of ``n`` with key 0 (the smallest
size >= n, ties to the lowest key: the oldest block id, the lowest address) and a
``del`` at that index. The list always ends with `END`, larger than any entry, so
a search never runs off the end (no length test in the loop).

An owner that can keep its entries within 63 bits does (`split`: sizes in 512-byte
units above 32-bit block ids, for blocks below 1 TiB), so every key operation is
a one-machine-word operation to a compiler; a larger block only makes a larger
int, never a wrong order.

Deletion is lazy. The owner says which entries still count: ``live(entry)`` is
True while the block ``key`` is free with that size (the owner keeps its own map,
e.g. block id -> its current entry); it removes a block from the free lists (a
merge, a reclaim) by changing its map alone, in O(1). An entry pushed twice is
harmless: the first fit takes the block, and the owner's map then voids the
other copy. A best-fit search drops the void entries it meets. `END` is never live.

Costs (k = entries, void ones included): `push` O(log k) plus O(k) memmove (in
C); `pop_fit` the same, amortised over the void entries it discards; `compact`,
`members` and `largest` O(k), for the rare paths (reclaim, metrics). The
allocators keep few free blocks (tens to hundreds), so the memmoves are short;
one list of ints also costs fewer interpreter steps than a heap per size plus a
list of sizes. The policies' hot paths inline `push` and `pop_fit` with their
own constants (a call costs as much as the work).
"""
from __future__ import annotations

from bisect import bisect_left, insort

#: The last entry of every free list: above any entry (a block below 2**63 units of 2**64 keys).
END = 1 << 127


class SizeBuckets:
    """Best-fit free lists: a sorted list of ``size >> unit_shift << key_bits | key``, ending with `END`.

    An owner whose entries all stay below a smaller bound may end the list with that bound instead (``end``,
    never live) and keep it in another sequence type (``column``, made from a list: `split` keeps its entries
    within 63 bits in a C array in the compiled build)."""

    __slots__ = ("entries", "live", "key_bits", "unit_shift", "end", "column")

    #: Fewest entries before `compact` is worth its pass.
    COMPACT_MIN = 64

    def __init__(self, live, key_bits: int, unit_shift: int = 0, end: int = END, column=list):
        self.entries = column([end])        # sorted entries (some may be void), then `end`
        self.live = live                    # owner's test: entry -> is the block still free at that size
        self.key_bits = key_bits
        self.unit_shift = unit_shift
        self.end, self.column = end, column

    def entry(self, size: int, key: int) -> int:
        """The entry of free block ``key`` of ``size`` bytes (a multiple of ``2**unit_shift``)."""
        return size >> self.unit_shift << self.key_bits | key

    def key_of(self, entry: int) -> int:
        return entry & ((1 << self.key_bits) - 1)

    def size_of(self, entry: int) -> int:
        return entry >> self.key_bits << self.unit_shift

    def push(self, key: int, size: int) -> int:
        """Add free block ``key`` of ``size``; return its entry (the owner's map must make it live)."""
        e = self.entry(size, key)
        insort(self.entries, e)
        return e

    def pop_fit(self, n: int, limit: int | None = None) -> int:
        """Take the smallest block of size >= ``n`` (and <= ``limit``), lowest key first; 0 if none.

        The owner must then mark the key as no longer free in its map. Void entries met on the way are dropped.
        """
        entries, live = self.entries, self.live
        stop = self.end if limit is None else min((limit >> self.unit_shift) + 1 << self.key_bits, self.end)
        i = bisect_left(entries, self.entry(n, 0))
        e = entries[i]
        while e < stop:
            del entries[i]
            if live(e):
                return self.key_of(e)
            e = entries[i]
        return 0

    def compact(self) -> int:
        """Drop the void entries, in place and in order (best fit finds the same blocks); return how many remain.

        The hot paths call it when the list has grown past twice its live size since
        the last call, so void entries never outnumber the live ones for long (amortised O(1) per push).
        """
        live = self.live
        self.entries[:] = self.column([e for e in self.entries if live(e)] + [self.end])
        return len(self.entries) - 1

    def members(self) -> list[tuple[int, int]]:
        """Every free block as ``(size, key)`` in ascending order; drops void and repeated entries on the way."""
        live, kept = self.live, []
        for e in self.entries:
            if live(e) and (not kept or kept[-1] != e):
                kept.append(e)
        self.entries[:] = self.column(kept + [self.end])
        return [(self.size_of(e), self.key_of(e)) for e in kept]

    def largest(self) -> int:
        """Size of the largest free block, 0 if none (drops the void entries at the top)."""
        entries, live = self.entries, self.live
        while len(entries) > 1:
            if live(entries[-2]):
                return self.size_of(entries[-2])
            del entries[-2]
        return 0
