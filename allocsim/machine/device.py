"""The memory below the pool: a simulated GPU with a capacity and an optional cap.

`malloc(n)` fails (returns None) when the pool cap or the device capacity would be
exceeded, as CuArrays' `actual_alloc` does: the pools cannot tell the two apart.
For a policy without a framework (``address_hints`` None) addresses come from a bump
pointer (256-byte aligned, never reused), so blocks of different device allocations
never overlap; their results do not depend on where a segment lies.

Best fit in PyTorch and CuPy breaks ties by address, so their models get addresses as the
real ones would: ``address_hints`` (a list, empty when the trace has none for this
framework) are the recorded allocator's segment allocations, ``(size, address)`` in
order. While the replay's segment calls follow the recording, each gets its recorded
address; from the first one that departs from it (another size, or a recorded range a
live one still holds) the recording says nothing more, and the driver model
(`allocsim.machine.placement`, which reuses freed ranges as the driver does) places every
segment from then on. It has seen the recorded ones, so it continues from their layout.

For `allocsim fit` the device records which limits would have let the replay go
the same way: every request it granted (``reserved + n``, by `malloc` or `fits`,
or reported by a policy's own comparison with the limit through `note`) and the
smallest it refused. `certified()` turns them into the interval of limits under
which every outcome, and so the whole replay, would be the same; a policy whose
behaviour reads the limit's exact value calls `pin()` (the interval is then just
this limit).

The device also carries the replay's modeled clock (`clock`, seconds), to which
every device call, pool operation and GC pause adds its modeled cost.
Each call is O(1), but for the driver model's own costs (`allocsim.machine.placement`).
"""
from __future__ import annotations

from .costs import CostModel
from ..errors import UsageError
from .placement import REGION, DriverPlacement, SpaceFull
from ..units import fmt_bytes

ALIGN = 256
BASE_ADDR = 0x7F0000000000
#: Every range the model holds ends below this: the compiled build keeps addresses in signed 64-bit words, and
#: both builds refuse alike what would pass it (docs/models/driver.md, "Address space").
ADDRESS_END = 1 << 63
#: A recorded segment must end at or below this (a GPU's addresses lie below 2**57): the model's own ranges go
#: above the recorded ones, below `ADDRESS_END`.
RECORDED_END = 1 << 62


class SimulatedDevice:
    measured = False          # device-call latency comes from the cost model

    def __init__(self, capacity: int | None = None, cap: int | None = None, costs: CostModel | None = None,
                 address_hints=None):
        self.capacity = capacity
        self.set_cap(cap)
        self.costs = costs or CostModel()
        self.reserved = 0
        self.peak_reserved = 0
        self.n_malloc = self.n_free = 0
        self.bytes_malloc = self.bytes_free = 0
        self.n_failed = 0
        self.granted_max = 0                     # largest reserved + n granted outside malloc (fits, note)
        self.refused_min = None                  # smallest reserved + n refused
        self.pinned = False
        self.clock = 0.0
        self.malloc_time = self.free_time = 0.0
        self._next = BASE_ADDR                   # bump pointer: no framework; expandable segments' ranges
        self._hints = list(address_hints or ())
        self._hint = 0                           # the next recorded segment, while the replay follows them
        if self._hints:
            self._next = max(BASE_ADDR, max(a + n for n, a in self._hints) + ALIGN)
        self._driver = None if address_hints is None else DriverPlacement(top=self._next)

    def charge(self, seconds: float) -> None:
        """Add ``seconds`` of modeled work above the device (a pool's own operations) to the clock."""
        self.clock += seconds

    def set_cap(self, cap: int | None) -> None:
        """The program set its allocator's limit (a SET_LIMIT event): the pool cap from now on (None: none)."""
        self.cap = cap
        self.limit = min(x for x in (self.capacity, cap, 2**63) if x is not None)

    def malloc(self, n: int) -> int | None:
        """Reserve ``n`` bytes; return the address, or None if cap or capacity is reached."""
        if self.reserved + n > self.limit:
            self.n_failed += 1
            self.note(self.reserved + n, False)
            return None
        got = self._obtain(n)
        if got is None:
            self.n_failed += 1
            return None
        addr, c = got
        self._reserve(n, c)
        return addr

    def map(self, n: int) -> bool:
        """Map ``n`` bytes of pages into a range `reserve_address_range` gave (expandable segments): the
        accounting and modeled cost of a `malloc` of ``n`` bytes, but no placement, since the pages go where the
        caller says; False, as a malloc's None, if cap or capacity is reached. O(1): the driver model keeps no
        region per map (docs/models/driver.md: it places cudaMalloc ranges, not mapped pages)."""
        if self.reserved + n > self.limit:
            self.n_failed += 1
            self.note(self.reserved + n, False)
            return False
        self._reserve(n, self._malloc_seconds(n))
        return True

    def _reserve(self, n: int, seconds: float) -> None:
        """Account a granted malloc or map of ``n`` bytes that took ``seconds``."""
        self.clock += seconds
        self.malloc_time += seconds
        self.reserved += n
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        self.n_malloc += 1
        self.bytes_malloc += n

    def free(self, addr: int, n: int) -> None:
        """Release ``n`` bytes obtained at ``addr``."""
        if self._driver is not None and addr in self._driver:    # not an expandable segment's unmapped pages
            self._driver.free(addr)
        c = self._release(addr, n)
        self.clock += c
        self.free_time += c
        self.reserved -= n
        self.n_free += 1
        self.bytes_free += n

    # What a device does below the accounting: here, where the range lies and the cost model.
    def _obtain(self, n: int):
        """``(address, seconds)`` for a new range of ``n`` bytes, or None if the device refuses."""
        if self._driver is None:
            addr = self._bump(n)
        else:
            addr = self._hinted(n)
            while addr is None:
                try:
                    addr = self._driver.malloc(n)
                except SpaceFull as full:       # a device larger than the space below the top: more above it
                    lo = self._bump(full.args[0] + REGION, bounded=True)
                    self._driver.extend(lo, self._next)
        return addr, self._malloc_seconds(n)

    def _malloc_seconds(self, n: int) -> float:
        """The cost model's time for a device malloc (or map) of ``n`` bytes."""
        costs = self.costs
        return costs.malloc_flat if n <= costs.malloc_flat_end else costs.malloc_cost(n)

    def _hinted(self, n: int) -> int | None:
        """The next recorded address, placed, while the replay follows the recording; else None for good."""
        if self._hint < len(self._hints):
            size, addr = self._hints[self._hint]
            if size == n and self._driver.take(addr, n) is not None:
                self._hint += 1
                return addr
            self._hints = []                 # diverged: the recorded addresses belong to another history
        return None

    def _release(self, addr: int, n: int) -> float:
        costs = self.costs
        return costs.free_flat if n <= costs.free_flat_end else costs.free_cost(n)

    def fits(self, n: int) -> bool:
        """Whether a malloc of ``n`` bytes would succeed now; the comparison is recorded (`note`)."""
        ok = self.reserved + n <= self.limit
        self.note(self.reserved + n, ok)
        return ok

    def note(self, need: int, granted: bool) -> None:
        """Record that a limit comparison for ``need`` bytes came out ``granted`` (see `certified`)."""
        if granted:
            if need > self.granted_max:
                self.granted_max = need
        elif self.refused_min is None or need < self.refused_min:
            self.refused_min = need

    def pin(self) -> None:
        """The replay read the limit's exact value: it certifies no other limit."""
        self.pinned = True

    def certified(self) -> tuple[int, int | None]:
        """``(lo, hi)``: every limit in [lo, hi] (hi None: unbounded) grants and refuses as this one did."""
        if self.pinned:
            return self.limit, self.limit
        lo = max(self.peak_reserved, self.granted_max)
        return lo, None if self.refused_min is None else self.refused_min - 1

    #: What a walk changes (`checkpoint`): a SET_LIMIT the trace holds sets the cap; the capacity, costs and
    #: ``pinned`` are the replay's own.
    _WALKED = ("cap", "limit", "reserved", "peak_reserved", "n_malloc", "n_free", "bytes_malloc", "bytes_free",
               "n_failed", "granted_max", "refused_min", "clock", "malloc_time", "free_time", "_next", "_hints",
               "_hint")

    def checkpoint(self) -> tuple:
        """What the walk so far changed, copied (`restore` puts it in a device of the same capacity and cap):
        a replay's checkpoint (`allocsim.engine.replay.Replay.checkpoint`)."""
        return tuple(getattr(self, k) for k in self._WALKED), None if self._driver is None else self._driver.copy()

    def restore(self, state: tuple) -> None:
        """Take a `checkpoint`'s state (copied again: one checkpoint may be restored more than once). Whether the
        limit is pinned stays this device's (its policy's options pin it, or not, from the start)."""
        values, driver = state
        for k, v in zip(self._WALKED, values):
            setattr(self, k, v)
        self._driver = None if driver is None else driver.copy()

    def reserve_address_range(self, n: int) -> int:
        """A fresh virtual range of ``n`` bytes that holds no memory (expandable segments)."""
        return self._bump(n, bounded=True)

    def _bump(self, n: int, bounded: bool = False) -> int:
        """``n`` bytes from the bump pointer: 256-byte aligned, never reused. A ``bounded`` range (one a framework's
        model keeps: `ADDRESS_END`) past the model's address space is refused in one line; a policy without a
        framework never reads its addresses."""
        addr = self._next
        self._next += (n + ALIGN - 1) // ALIGN * ALIGN or ALIGN
        if bounded and self._next >= ADDRESS_END:
            raise UsageError(f"the replay's device ranges reach past address 2**63, the end of the model's address "
                             f"space ({fmt_bytes(self._next - BASE_ADDR)} of ranges taken, none given back, the last "
                             f"one {fmt_bytes(n)}): give a smaller --capacity or cap")
        return addr
