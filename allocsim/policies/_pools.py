"""Mechanisms the Julia pools share (`binned`, `knet`, `simple`).

- `FreeLists`: cached blocks kept in one LIFO list per exact block size, and the
  release of cached blocks "largest size first until a target" that both
  CuArrays' BinnedPool ``reclaim`` and ``Knet.gc()`` perform.
- `HotStep`: a timed section on a path too hot for push/pop (a device malloc on
  a pool miss); it counts inline and reports its totals once at ``finish``.

Handles of these pools are plain tuples whose first two fields are
``(addr, block bytes)``, so `block` (and, over `FreeLists`, `largest_free`) is
shared too: `block_of`, `FreeListReporting`.
"""
from __future__ import annotations


class FreeLists:
    """Cached device blocks by exact block size: ``lists[size]`` is a LIFO stack of addresses.

    Costs: push/pop O(1) (list append/pop on the dict entry, which policies bind
    and use inline on their hot paths); `largest` is O(distinct sizes);
    `release` is O(distinct sizes · log + blocks released).
    """

    __slots__ = ("lists",)

    def __init__(self):
        self.lists: dict[int, list[int]] = {}

    def stack(self, size: int) -> list[int]:
        """The LIFO list for ``size``, created empty on first use."""
        lst = self.lists.get(size)
        if lst is None:
            lst = self.lists[size] = []
        return lst

    def largest(self) -> int:
        """Largest cached block size (0 when nothing is cached)."""
        return max((s for s, lst in self.lists.items() if lst), default=0)

    def cached_bytes(self) -> int:
        return sum(s * len(lst) for s, lst in self.lists.items())

    def count(self) -> int:
        return sum(len(lst) for lst in self.lists.values())

    def release(self, ctx, counts: dict[int, int] | None = None, target: int | None = None) -> tuple[int, int]:
        """cudaFree cached blocks, largest size first, the most recently cached first within a size.

        ``counts[size]`` limits how many of each size may go (None: all of them);
        the release stops as soon as ``target`` bytes are freed (None: no target).
        Returns ``(bytes freed, blocks freed)``.
        """
        freed = n = 0
        free = ctx.free
        for size in sorted(self.lists, reverse=True):
            lst = self.lists[size]
            k = len(lst) if counts is None else min(counts.get(size, 0), len(lst))
            for _ in range(k):
                free(lst.pop(), size)
                freed += size
                n += 1
                if target is not None and freed >= target:
                    return freed, n
        return freed, n


class HotStep:
    """A section on a hot path (e.g. ``1. try alloc``): counted inline, added to the table at finish."""

    __slots__ = ("name", "calls", "seconds")

    def __init__(self, name: str):
        self.name = name
        self.calls = 0
        self.seconds = 0.0

    def malloc(self, ctx, n: int):
        """``ctx.malloc(n)``, counted and timed under this section."""
        t0 = ctx.clock
        addr = ctx.malloc(n)
        self.calls += 1
        self.seconds += ctx.clock - t0
        return addr

    def report(self, ctx) -> None:
        if self.calls:
            ctx.add_section(self.name, self.seconds, self.calls)


def block_of(handle) -> tuple[int, int]:
    """``(addr, size)`` of a handle whose first two fields are the address and the block bytes."""
    return handle[0], handle[1]


class FreeListReporting:
    """`Policy.block` and `largest_free` for a pool whose cache is a `FreeLists` named ``_bins``."""

    def block(self, handle):
        return block_of(handle)

    def largest_free(self):
        return self._bins.largest()
