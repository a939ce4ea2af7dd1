"""FirstFit: an address-ordered first-fit pool over device segments — an allocsim plug-in.

Written only against the public API (`allocsim.policies.Policy`, `allocsim.params.Param`) and the
policy context ``self.ctx`` (device memory, pool time, the runtime's collections).
Run it with::

    allocsim replay traces/resnet50.bin --policy examples/policies/first_fit.py:FirstFit
    allocsim compare traces/resnet50.bin --policies split,examples/policies/first_fit.py:FirstFit[segment=64MiB]

and test it with ``allocsim.testing.check_policy(FirstFit)``.
"""
from __future__ import annotations

from bisect import bisect_left, insort

from allocsim.params import Param
from allocsim.policies import Policy


class FirstFit(Policy):
    """Requests rounded to ``align``; the lowest-addressed free range that fits is split; a miss takes a
    new segment of at least ``segment`` bytes; when the device refuses, empty segments are returned and
    the runtime collects before one retry."""

    name = "first_fit"
    summary = "address-ordered first fit over segments (example plug-in)"
    params = (
        Param("segment", "size", 32 << 20, "smallest segment taken from the device"),
        Param("align", "int", 512, "requests are rounded up to a multiple of this"),
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.free_ranges: list[tuple[int, int]] = []     # (addr, size), sorted by address
        self.segments: dict[int, int] = {}               # segment address -> size

    def malloc(self, size, stream):
        n = -(-size // self.align) * self.align
        addr = self._find(n)
        if addr is None:                  # the device is full: collect, give back empty segments, retry
            self.ctx.collect(True)
            self._release_empty()
            addr = self._find(n)
        if addr is None:
            return None
        self.ctx.charge(self.costs.pool_hit_s)
        self.allocated += n
        return addr, n

    def free(self, handle):
        addr, n = handle
        self.allocated -= n
        self.ctx.charge(self.costs.pool_free_s)
        self._give(addr, n)

    def block(self, handle):
        return handle

    def release_cache(self):
        """A cache release gives back every wholly free segment."""
        self._release_empty()

    def largest_free(self):
        return max((s for _, s in self.free_ranges), default=0)

    def counters(self):
        return {"segments": len(self.segments)}

    # ---- the free list ----------------------------------------------------------------------
    def _take(self, n):
        """Split the first free range (lowest address) of at least ``n`` bytes."""
        for i, (addr, size) in enumerate(self.free_ranges):
            if size >= n:
                if size == n:
                    del self.free_ranges[i]
                else:
                    self.free_ranges[i] = (addr + n, size - n)
                return addr
        return None

    def _give(self, addr, n):
        """Return a range, merged with its free neighbours inside the same segment."""
        i = bisect_left(self.free_ranges, (addr, 0))
        if i < len(self.free_ranges) and self.free_ranges[i][0] == addr + n and addr + n not in self.segments:
            n += self.free_ranges.pop(i)[1]
        if i > 0:
            pa, ps = self.free_ranges[i - 1]
            if pa + ps == addr and addr not in self.segments:
                del self.free_ranges[i - 1]
                addr, n = pa, ps + n
        insort(self.free_ranges, (addr, n))

    def _find(self, n):
        """A range of ``n`` bytes from the free list, else from a new segment; None if the device refuses."""
        addr = self._take(n)
        if addr is None:
            size = max(n, self.segment)
            seg = self.ctx.malloc(size)
            if seg is None:
                return None
            self.segments[seg] = size
            insort(self.free_ranges, (seg, size))
            addr = self._take(n)
        return addr

    def _release_empty(self):
        """Give every wholly free segment back to the device."""
        for addr, size in list(self.free_ranges):
            if self.segments.get(addr) == size:
                self.free_ranges.remove((addr, size))
                del self.segments[addr]
                self.ctx.free(addr, size)
