"""Where the CUDA driver puts a `cudaMalloc` allocation: a model fitted to measurements.

PyTorch's and CuPy's best fit break ties by address, so a replay that makes segment calls the
recording never made needs the addresses the driver would have returned. Measured on an H100
(`traces/raw/driver_placement-h100.jsonl`, docs/models/driver.md), the driver works in two levels:

- **Regions.** A request that fits in no region gets a new one: its size rounded up to a
  32 MiB multiple, placed at the top of the *highest* hole of the address space that is
  strictly larger than the region (an exact fit is passed over), start aligned down to 32 MiB;
  below every region the space is unbounded, so the heap grows downward. A region whose last
  allocation is freed goes back to the address space (holes merge).
- **Allocations in a region.** A request takes whole units of its region: 2 MiB granules,
  512 B in a small region. Regions are tried newest first; in the first one with a free run
  big enough, the request takes the smallest such run (best fit, lowest address on ties), from
  its bottom.
- **Small requests** (under 1 MiB) go only to small regions: 2 MiB, packed at 512 B, made at
  the top of the highest hole when none has room, and kept when empty.

The driver's own ranges made before the first call are not modelled (docs/models/driver.md
says what else the data leave open). Costs: ``malloc`` O(regions + allocations in the regions it scans), ``free``
O(log regions + allocations in the region), ``take`` a ``malloc`` plus, when the recorded
address differs, O(log regions + allocations in one region).
"""
from __future__ import annotations

from sortedcontainers import SortedDict

GRANULE = 2 << 20          # allocations take whole 2 MiB granules
REGION = 32 << 20          # regions are whole 32 MiB multiples, 32 MiB aligned
SMALL = 1 << 20            # requests below this go to small regions
SMALL_UNIT = 512           # a small region's unit; a small region is one granule
TOP = 0x7F0000000000       # the top of the modelled heap when nothing else says where it is


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


class Region:
    """A range the driver took from the address space, holding allocations (address -> bytes in units)."""
    __slots__ = ("start", "end", "unit", "live", "used")

    def __init__(self, start: int, end: int, unit: int):
        self.start, self.end, self.unit = start, end, unit
        self.live = SortedDict()
        self.used = 0

    def best_run(self, n: int) -> int | None:
        """Start of the smallest free run that holds ``n`` bytes (lowest on ties), or None. O(allocations)."""
        m = _up(max(n, 1), self.unit)
        if self.end - self.start - self.used < m:
            return None
        best = None
        cur = self.start
        for a, k in [*self.live.items(), (self.end, 0)]:
            gap = a - cur
            if gap >= m and (best is None or gap < best[0]):
                best = (gap, cur)
            cur = a + k
        return None if best is None else best[1]

    def add(self, addr: int, n: int) -> None:
        m = _up(max(n, 1), self.unit)
        self.live[addr] = m
        self.used += m


class DriverPlacement:
    """The driver's placement state: regions by address and by age, and which region holds each allocation."""

    def __init__(self, top: int = TOP):
        self.top = top
        self._by_addr: SortedDict = SortedDict()     # region start -> Region
        self._by_age: dict[Region, None] = {}        # regions in creation order (newest last)
        self._owner: dict[int, Region] = {}          # allocation address -> its region

    def malloc(self, n: int) -> int:
        """The address the driver returns for ``n`` bytes (never fails: capacity is the device's business)."""
        small = n < SMALL
        for r in reversed(self._by_age):
            if small and r.unit != SMALL_UNIT:
                continue
            addr = r.best_run(n)
            if addr is not None:
                return self._place(r, addr, n)
        size, align, unit = (GRANULE, GRANULE, SMALL_UNIT) if small else (_up(n, REGION), REGION, GRANULE)
        start = self._highest_hole(size, align)
        return self._place(self._new_region(start, start + size, unit), start, n)

    def free(self, addr: int, undo: bool = False) -> None:
        """Release the allocation at ``addr``; its region goes back to the address space once empty
        (a small one only when ``undo`` takes back the call that made it)."""
        r = self._owner.pop(addr)
        r.used -= r.live.pop(addr)
        if not r.live and (r.unit != SMALL_UNIT or undo):
            del self._by_addr[r.start]
            del self._by_age[r]

    def take(self, addr: int, n: int) -> int | None:
        """Place ``n`` bytes at ``addr`` (a recorded address) and return where `malloc` would have put
        them; None, placing nothing, if a live range holds ``addr``.

        The model's own choice is tried first: when it is ``addr``, the regions stay the driver's
        own; otherwise the allocation joins the region around ``addr`` or gets one of its own,
        aligned as a new one would be and cut short by its neighbours.
        """
        regions = len(self._by_age)
        got = self.malloc(n)
        if got == addr:
            return got
        self.free(got, undo=len(self._by_age) > regions)
        below = self._region_below(addr + n)
        if below is not None and below.end > addr:
            m = _up(max(n, 1), below.unit)
            if addr < below.start or addr + m > below.end or self._overlaps_live(below, addr, m):
                return None
            self._place(below, addr, n)
            return got
        align, unit = (GRANULE, SMALL_UNIT) if n < SMALL else (REGION, GRANULE)
        lo = addr // align * align
        if below is not None:
            lo = max(lo, below.end)
        hi = _up(addr + _up(max(n, 1), unit), align)
        i = self._by_addr.bisect_right(addr)
        if i < len(self._by_addr):
            hi = min(hi, self._by_addr.keys()[i])
        self._place(self._new_region(lo, hi, unit), addr, n)
        return got

    def _overlaps_live(self, r: Region, addr: int, m: int) -> bool:
        i = r.live.bisect_left(addr + m)
        if i == 0:
            return False
        a = r.live.keys()[i - 1]
        return a + r.live[a] > addr

    def _region_below(self, end: int) -> Region | None:
        """The region with the highest start below ``end``. O(log regions)."""
        i = self._by_addr.bisect_left(end)
        return self._by_addr.values()[i - 1] if i else None

    def _highest_hole(self, size: int, align: int) -> int:
        """Start of a new ``size``-byte region: the top of the highest hole it does not fill. O(regions)."""
        ceiling = self.top
        for r in reversed(self._by_addr.values()):
            if r.end <= ceiling:
                start = (ceiling - size) // align * align
                if start > r.end:
                    return start
            ceiling = min(ceiling, r.start)
        return (ceiling - size) // align * align

    def _new_region(self, start: int, end: int, unit: int) -> Region:
        r = Region(start, end, unit)
        self._by_addr[start] = r
        self._by_age[r] = None
        return r

    def _place(self, r: Region, addr: int, n: int) -> int:
        r.add(addr, n)
        self._owner[addr] = r
        return addr
