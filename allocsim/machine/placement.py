"""Where the CUDA driver puts a `cudaMalloc` allocation: a model fitted to measurements.

PyTorch's and CuPy's best fit break ties by address, so a replay that makes segment calls the
recording never made needs the addresses the driver would have returned. Measured on an H100
(`traces/raw/driver_placement-h100.jsonl`, docs/models/driver.md), the driver works in two levels:

- **Regions.** A request that fits in no region gets a new one: its size rounded up to a
  32 MiB multiple, start aligned down to 32 MiB, at the top of the *highest* hole of the address
  space where it leaves some of the hole free below it (an exact fit is passed over). Below every
  region the space is unbounded, so the heap grows downward. A region whose last allocation is
  freed goes back to the address space (holes merge).
- **Allocations in a region.** A request takes whole units of its region: 2 MiB granules,
  512 B in a small region. Regions are tried newest first; in the first one with a free run
  big enough, the request takes the smallest such run (best fit, lowest address on ties), from
  its bottom.
- **Small requests** (under 1 MiB) go only to small regions: 2 MiB, packed at 512 B, made at
  the top of the highest hole when none has room, and kept when empty.

A replay first feeds the model the recorded addresses (`take`); space it never saw used between
them and the lowest range seen is taken to be held by ranges the trace does not show (the
context, libraries' workspaces). Costs, with R regions, H holes and k allocations in a region:
``malloc`` O(log R + k + H), ``free`` O(log R + k) (a region's free runs are plain sorted lists: k is small),
``take`` a ``malloc`` and a ``free`` plus, when the recorded address differs, O(log R + k) and O(k²) for the
regions it merges.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
import pickle

from sortedcontainers import SortedDict

GRANULE = 2 << 20          # allocations take whole 2 MiB granules
REGION = 32 << 20          # regions are whole 32 MiB multiples, 32 MiB aligned
SMALL = 1 << 20            # requests below this go to small regions
SMALL_UNIT = 512           # a small region's unit; a small region is one granule
TOP = 0x7F0000000000       # the top of the modelled heap when nothing else says where it is


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


class SpaceFull(MemoryError):
    """No hole of the address space below the top holds a new region (a device larger than the ~127 TiB below
    the default top): ``args[0]`` bytes of fresh space above every range would (`DriverPlacement.extend`)."""


class Region:
    """A range the driver took from the address space: its allocations (address -> bytes, whole units)
    and its free runs, by address (``starts``/``ends``, sorted) and by (length, address) for best fit.

    Plain sorted lists, not sorted containers: a region holds a few runs (one, free, when it is made: most
    segments get a region of their own), and making two sorted containers per region was most of a
    device malloc's cost in the first events of a replay, where a pool grows (`allocsim tune`'s replays
    that stop early)."""
    __slots__ = ("start", "end", "unit", "live", "starts", "ends", "by_len")

    def __init__(self, start: int, end: int, unit: int):
        self.start, self.end, self.unit = start, end, unit
        self.live: dict[int, int] = {}
        self.starts, self.ends = [start], [end]
        self.by_len = [(end - start, start)]

    def copy(self) -> "Region":
        """An equal region that shares no list or dict with this one (`DriverPlacement.copy`)."""
        r = Region.__new__(Region)
        r.start, r.end, r.unit = self.start, self.end, self.unit
        r.live, r.starts, r.ends, r.by_len = dict(self.live), self.starts[:], self.ends[:], self.by_len[:]
        return r

    @property
    def runs(self) -> dict[int, int]:
        """The free runs, start -> end, by address."""
        return dict(zip(self.starts, self.ends))

    def best_run(self, n: int) -> int | None:
        """Start of the smallest free run that holds ``n`` bytes (lowest on ties), or None. O(log runs)."""
        i = bisect_left(self.by_len, (_up(max(n, 1), self.unit), 0))
        return self.by_len[i][1] if i < len(self.by_len) else None

    def largest(self) -> int:
        """The longest free run (0 when full). O(1)."""
        return self.by_len[-1][0] if self.by_len else 0

    def is_free(self, lo: int, hi: int) -> bool:
        """Whether no allocation holds any of [lo, hi) within this region. O(log runs)."""
        lo, hi = max(lo, self.start), min(hi, self.end)
        i = bisect_right(self.starts, lo) - 1
        return lo >= hi or (i >= 0 and self.ends[i] >= hi)

    def add(self, addr: int, m: int) -> None:
        """Hold [addr, addr + m), which lies in one free run. O(runs)."""
        starts, ends, by_len = self.starts, self.ends, self.by_len
        i = bisect_right(starts, addr) - 1
        lo, hi = starts[i], ends[i]
        del by_len[bisect_left(by_len, (hi - lo, lo))]
        del starts[i], ends[i]
        for a, b in ((addr + m, hi), (lo, addr)):       # the upper part first: both go in at ``i``
            if a < b:
                starts.insert(i, a)
                ends.insert(i, b)
                insort(by_len, (b - a, a))
        self.live[addr] = m

    def remove(self, addr: int) -> None:
        """Free the allocation at ``addr``, merging its range with the free runs beside it. O(runs)."""
        starts, ends, by_len = self.starts, self.ends, self.by_len
        lo = addr
        hi = lo + self.live.pop(addr)
        i = bisect_left(starts, lo)
        if i and ends[i - 1] == lo:                     # the run below ends where it starts: merged
            i -= 1
            lo = starts[i]
            del by_len[bisect_left(by_len, (addr - lo, lo))]
            del starts[i], ends[i]
        if i < len(starts) and starts[i] == hi:         # the run above starts where it ends: merged
            end = ends[i]
            del by_len[bisect_left(by_len, (end - hi, hi))]
            del starts[i], ends[i]
            hi = end
        starts.insert(i, lo)
        ends.insert(i, hi)
        insort(by_len, (hi - lo, lo))


class _Newest:
    """Regions in creation order under a max-tree of their longest free runs: the newest region with a
    run of ``m`` bytes is found in O(log regions made)."""

    def __init__(self):
        self.size = 64
        self.tree = [-1] * (2 * self.size)
        self.regions: list[Region | None] = []       # by creation, None once dropped
        self.seq: dict[Region, int] = {}

    def add(self, r: Region) -> None:
        self.seq[r] = len(self.regions)
        self.regions.append(r)
        if self.seq[r] == self.size:                       # full: double, leaves moved, inner nodes rebuilt
            leaves = self.tree[self.size:] + [-1] * self.size
            self.size *= 2
            self.tree = [-1] * self.size + leaves
            for i in range(self.size - 1, 0, -1):
                self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])
        self.update(r)

    def update(self, r: Region) -> None:
        i = self.seq[r] + self.size
        self.tree[i] = r.largest() if self.regions[self.seq[r]] is not None else -1
        while i > 1:
            i //= 2
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])

    def remove(self, r: Region) -> None:
        self.regions[self.seq[r]] = None
        self.update(r)
        del self.seq[r]

    def copy(self, regions: dict) -> "_Newest":
        """This index over the copies ``regions`` (id of a region -> its copy)."""
        n = _Newest.__new__(_Newest)
        n.size, n.tree = self.size, self.tree[:]
        n.regions = [None if r is None else regions[id(r)] for r in self.regions]
        n.seq = {regions[id(r)]: i for r, i in self.seq.items()}
        return n

    def newest(self, m: int) -> Region | None:
        """The newest region whose longest free run is ``m`` bytes or more."""
        if self.tree[1] < m:
            return None
        i = 1
        while i < self.size:
            i = 2 * i + 1 if self.tree[2 * i + 1] >= m else 2 * i
        return self.regions[i - self.size]


class DriverPlacement:
    """The driver's placement state: regions by address and by age, and which region holds each allocation."""

    def __init__(self, top: int = TOP):
        self.top = top
        self._by_addr: SortedDict = SortedDict()     # region start -> Region (unit 0: ranges never seen)
        self._holes: SortedDict = SortedDict({0: top})  # free address space below the top: start -> end
        self._newest = _Newest()                     # every region, for requests of 1 MiB and more
        self._newest_small = _Newest()               # small regions, for smaller requests
        self._owner: dict[int, Region] = {}          # allocation address -> its region
        self._frontier = top                         # the lowest address any region has reached
        self._fingerprint = None                     # `fingerprint`, kept until a call changes the placement

    def copy(self) -> "DriverPlacement":
        """An equal placement state that shares nothing mutable with this one (a replay's checkpoint,
        `allocsim.machine.device.SimulatedDevice.checkpoint`): O(regions + allocations)."""
        regions = {}
        for r in (*self._by_addr.values(), *self._newest.regions, *self._newest_small.regions, *self._owner.values()):
            if r is not None and id(r) not in regions:
                regions[id(r)] = r.copy()
        d = DriverPlacement.__new__(DriverPlacement)
        d.top, d._frontier = self.top, self._frontier
        d._by_addr = SortedDict((a, regions[id(r)]) for a, r in self._by_addr.items())
        d._holes = self._holes.copy()
        d._newest, d._newest_small = self._newest.copy(regions), self._newest_small.copy(regions)
        d._owner = {a: regions[id(r)] for a, r in self._owner.items()}
        d._fingerprint = self._fingerprint
        return d

    def fingerprint(self) -> bytes:
        """The placement's state, canonical, pickled: what decides where the next segments go (the frontier,
        the holes, every region's range, unit, allocations and free runs, the regions by age, and which
        addresses are allocations), for folding (`allocsim.machine.device.SimulatedDevice.fingerprint`).
        O(regions + allocations) where a call changed the placement since the last one (`malloc`, `free`, `take`
        and `extend` forget it), else O(1): in a steady run the segments, and so the driver, stay as they are.
        Kept pickled: the folder pickles every look's fingerprint, and these nested tuples were most of that
        pickle's time (85 of 90 us on GPT-2 small)."""
        if self._fingerprint is None:
            self._fingerprint = self._make_fingerprint()
        return self._fingerprint

    def _make_fingerprint(self) -> bytes:
        return pickle.dumps((self._frontier, tuple(self._holes.items()),
                             tuple((r.start, r.end, r.unit, tuple(sorted(r.live.items())), tuple(r.runs.items()))
                                   for r in self._by_addr.values()),
                             tuple(r.start for r in self._newest.regions if r is not None),
                             tuple(r.start for r in self._newest_small.regions if r is not None),
                             tuple(sorted(self._owner))), protocol=5)

    def malloc(self, n: int) -> int:
        """The address the driver returns for ``n`` bytes (never fails: capacity is the device's business)."""
        self._fingerprint = None
        small = n < SMALL
        regions = self._newest_small if small else self._newest
        r = regions.newest(_up(max(n, 1), SMALL_UNIT))
        addr = r.best_run(n) if r is not None else None
        if r is not None and addr is None:           # a run long in 512 B units, short in granules: look on
            r, addr = next(((q, a) for q in reversed(regions.regions) if q is not None
                            for a in [q.best_run(n)] if a is not None), (None, None))
        if r is not None:
            return self._place(r, addr, n)
        size, align, unit = (GRANULE, GRANULE, SMALL_UNIT) if small else (_up(n, REGION), REGION, GRANULE)
        start = self._highest_hole(size, align)
        return self._place(self._new_region(start, start + size, unit), start, n)

    def __contains__(self, addr: int) -> bool:
        """Whether an allocation starts at ``addr``."""
        return addr in self._owner

    def free(self, addr: int, undo: bool = False) -> None:
        """Release the allocation at ``addr``; its region goes back to the address space once empty
        (a small one only when ``undo`` takes back the call that made it)."""
        self._fingerprint = None
        r = self._owner.pop(addr)
        r.remove(addr)
        if not r.live and (r.unit != SMALL_UNIT or undo):
            self._drop(r)
        else:
            self._reindex(r)

    def take(self, addr: int, n: int) -> int | None:
        """Place ``n`` bytes at ``addr`` (a recorded address) and return where `malloc` would have put
        them; None, placing nothing, if a live allocation holds part of the range.

        The model's own choice is tried first: when it is ``addr``, the regions stay the driver's
        own. Otherwise the allocation joins the region around it; if it lies outside every region or
        runs past one (ranges the trace does not show, such as a library's workspace, were there),
        the regions it touches and the range, aligned as a new region would be and cut short by the
        other neighbours, become one region.
        """
        self._fingerprint = None
        regions, frontier = len(self._newest.regions), self._frontier
        got = self.malloc(n)
        if got == addr:
            return got
        self.free(got, undo=len(self._newest.regions) > regions)
        self._frontier = frontier
        align, unit = (GRANULE, SMALL_UNIT) if n < SMALL else (REGION, GRANULE)
        end = addr + _up(max(n, 1), unit)
        i = self._by_addr.bisect_left(end)              # regions from index j to i - 1 touch the range
        j = i
        while j and self._by_addr.values()[j - 1].end > addr:
            j -= 1
        hit = list(self._by_addr.values()[j:i])
        if not all(r.is_free(addr, end) for r in hit):
            return None
        if len(hit) == 1 and hit[0].unit and hit[0].start <= addr and end <= hit[0].end:
            self._place(hit[0], addr, n)
            return got
        lo, hi = addr // align * align, _up(end, align)
        if j:
            lo = max(lo, self._by_addr.values()[j - 1].end)
        if i < len(self._by_addr):
            hi = min(hi, self._by_addr.keys()[i])
        if addr < self.top:                             # a region below the top stays below it
            hi = min(hi, max(self.top, end))
        seen = [r for r in hit if r.unit]
        lo, hi = min([lo, *(r.start for r in seen)]), max([hi, end, *(r.end for r in seen)])
        for r in hit:
            self._drop(r)
            if not r.unit:                              # an unseen range keeps what lies outside the region
                if r.start < lo:
                    self._unseen(r.start, lo)
                if r.end > hi:
                    self._unseen(hi, r.end)
        if hi < self._frontier:                         # what lies between it and the lowest range seen so far
            self._unseen(hi, self._frontier)
        region = self._new_region(lo, hi, unit)
        for r in seen:                                  # merged: their allocations move to the new region
            for a, m in r.live.items():
                region.add(a, m)
                self._owner[a] = region
        self._place(region, addr, n)
        return got

    def _reindex(self, r: Region) -> None:
        self._newest.update(r)
        if r.unit == SMALL_UNIT:
            self._newest_small.update(r)

    def _highest_hole(self, size: int, align: int) -> int:
        """Start of a new ``size``-byte region: the top of the highest hole it does not fill. O(holes)."""
        for lo, hi in reversed(self._holes.items()):
            start = (hi - size) // align * align
            if start > lo:
                return start
        unseen = [r for r in self._by_addr.values() if not r.unit]
        if not unseen:
            raise SpaceFull(size + align)
        for r in unseen:                     # only a guess (recorded addresses low down): given back
            self._drop(r)
        return self._highest_hole(size, align)

    def extend(self, lo: int, hi: int) -> None:
        """Fresh address space [lo, hi), at or above the top, for regions (after `SpaceFull`): the top moves to
        ``hi``; what lies between the old top and ``lo`` (the device's own ranges) stays out of the holes."""
        self._fingerprint = None
        assert lo >= self.top, (lo, self.top)
        self.top = hi
        self._release(lo, hi)

    def _new_region(self, start: int, end: int, unit: int) -> Region:
        r = Region(start, end, unit)
        self._by_addr[start] = r
        self._occupy(start, end)
        self._newest.add(r)
        if unit == SMALL_UNIT:
            self._newest_small.add(r)
        self._frontier = min(self._frontier, start)
        return r

    def _unseen(self, start: int, end: int) -> None:
        """Mark [start, end) as held by ranges the model never saw (unit 0: no allocation goes there)."""
        self._by_addr[start] = Region(start, end, 0)
        self._occupy(start, end)

    def _drop(self, r: Region) -> None:
        del self._by_addr[r.start]
        if r.unit:
            self._newest.remove(r)
            if r.unit == SMALL_UNIT:
                self._newest_small.remove(r)
        self._release(r.start, r.end)

    def _occupy(self, start: int, end: int) -> None:
        """Take [start, end) out of the hole holding it (ranges above the top are not tracked). O(log H)."""
        end = min(end, self.top)
        i = self._holes.bisect_right(start) - 1
        if start >= end or i < 0 or self._holes.values()[i] < end:
            return
        lo = self._holes.keys()[i]
        hi = self._holes.pop(lo)
        if lo < start:
            self._holes[lo] = start
        if end < hi:
            self._holes[end] = hi

    def _release(self, start: int, end: int) -> None:
        """Give [start, end) back as a hole, merged with its neighbours. O(log H)."""
        if start >= self.top:
            return
        end = min(end, self.top)
        i = self._holes.bisect_left(start)
        if i and self._holes.values()[i - 1] == start:
            start = self._holes.keys()[i - 1]
        if end in self._holes:
            end = self._holes.pop(end)
        self._holes[start] = end

    def _place(self, r: Region, addr: int, n: int) -> int:
        r.add(addr, _up(max(n, 1), r.unit))
        self._owner[addr] = r
        self._reindex(r)
        return addr
