"""`oracle`: offline placement of the whole trace, a near-lower bound on peak reserved.

Source: `docs/models/bestfit-oracle.md`, section "oracle" (XLA's
``GlobalDecreasingSizeBestFitHeap`` and ``ChooseBestHeapAlgorithm``).

Model. Every non-empty ALLOC is a buffer living from its ALLOC to its FREE, in
driving-event order (objects never freed live to the end of the trace). Sizes are
rounded up to 512 B (option ``unit``), CuPy's and PyTorch's small unit, so that the
bound compares with the allocators' own rounding; a policy that does not round
(``none``) can then sit below it by the rounding slack, and ``unit=1`` gives the
bound on exact bytes. Buffers are placed one by one, each at the
best-fit offset among the address ranges free over its whole lifetime: the
smallest gap between the buffers already placed that overlap it in time (ties: the
lowest offset), else just above the highest of them. The placement is tried in
several orders and the smallest heap is kept (``ChooseBestHeapAlgorithm``):

- ``spatial``: size decreasing, then lifetime decreasing (XLA ``kSpatial``);
- ``temporal``: lifetime decreasing, then size decreasing (XLA ``kTemporal``);
- ``arrival``: allocation order, which is exactly online best fit over an
  unbounded address space, so the oracle is never worse than that.

At ``__init__`` the heap is taken from the device as ONE segment; ``malloc``
returns the precomputed offset (handle ``(addr, size)``) and ``free`` is
bookkeeping. LOAD <= oracle peak always holds (the live buffers lie disjoint in
the heap, and rounding only grows them). With a cap (or capacity) smaller than
the heap the segment cannot be taken and every malloc is an OOM, the first one
at the first ALLOC. Streams are ignored (one address space for all). Placement
follows the trace's own lifetimes; under the ``gc`` runtime, where a dead object
returns only at a collection, a malloc whose planned slot is still held by
objects dead in the trace first runs one full collection (counted in
``planned_collections``; never under ``eager``). The planning time is kept in
``plan_seconds`` (it runs at ``__init__``, outside the replay's own time).

Cost. Finding the buffers that overlap a buffer [s, e) in time uses two arrays
built once: per time block (W driving events) the buffers alive in that block,
which gives those alive in s's block; and all buffers sorted by start, a slice of
which gives those starting after that block and before e. Each placement is then
a few numpy passes over its m candidates (O(m log m) for the gap sort), so a pass
is O(sum m log m) plus O(n + B * mean live) memory for the blocks. In practice
~100k buffers take seconds per order; ``max_buffers`` refuses larger traces
with a clear message instead of running for minutes.
"""
from __future__ import annotations

import time
from bisect import bisect_right

import numpy as np

from ..errors import UsageError
from ..trace.events import ALLOC, FREE
from .registry import register
from .base import Param, Policy

UNIT = 512
ORDERS = ("spatial", "temporal", "arrival")
_BLOCK_ENTRIES = 20_000_000      # cap on the block index's size (int64 entries)
MIN_BLOCK = 256                  # narrowest time block, in driving events
PROGRESS_EVERY = 4096            # buffers placed between progress reports


def buffer_lifetimes(trace):
    """``(start, end, size)`` int64 arrays of the trace's non-empty ALLOCs, in allocation order.

    ``start``/``end`` are driving-event positions (``end`` is the FREE's position, or
    the number of driving events for objects never freed); ``size`` is requested bytes.
    """
    kind = np.asarray(trace.kind)
    drive = np.flatnonzero((kind == ALLOC) | (kind == FREE))
    dk = kind[drive]
    ids = np.asarray(trace.id)[drive].astype(np.int64)
    sizes = np.asarray(trace.size)[drive].astype(np.int64)
    n_drive = len(drive)
    a = np.flatnonzero(dk == ALLOC)
    f = np.flatnonzero(dk == FREE)
    end_of_id = np.full(trace.n_ids, n_drive, np.int64)
    end_of_id[ids[f]] = f
    a = a[sizes[a] > 0]
    return a.astype(np.int64), end_of_id[ids[a]], sizes[a]


class _Placer:
    """Best-fit placement of buffers (start, end, size) in a given order; see the module docstring."""

    def __init__(self, start, end, size, min_block=MIN_BLOCK):
        self.start, self.end, self.size = start, end, size
        n = len(start)
        total_life = int((end - start).sum()) if n else 0
        # Block width: small enough that a block holds few buffers beyond the live
        # ones, large enough that the block index stays under _BLOCK_ENTRIES.
        w = max(min_block, -(-total_life // max(1, _BLOCK_ENTRIES - n)))
        self.w = w
        bs, be = start // w, (end - 1) // w
        span = be - bs + 1
        n_blocks = int(be.max()) + 1 if n else 1
        owner = np.repeat(np.arange(n, dtype=np.int64), span)
        first = np.repeat(np.cumsum(span) - span, span)
        block = bs[owner] + (np.arange(len(owner), dtype=np.int64) - first)
        order = np.argsort(block, kind="stable")
        # block index (CSR): the buffers alive in each block, with their lifetimes beside
        self.blk_ids = owner[order]
        self.blk_ptr = np.searchsorted(block[order], np.arange(n_blocks + 1)).tolist()
        self.blk_start = start[self.blk_ids]
        self.blk_end = end[self.blk_ids]
        self.by_start = np.argsort(start, kind="stable")
        starts_sorted = start[self.by_start]
        # per buffer: the slice of by_start holding the buffers that start after
        # its start's block and before its end
        self.lo = np.searchsorted(starts_sorted, (bs + 1) * w).tolist()
        self.hi = np.searchsorted(starts_sorted, end).tolist()

    def place(self, order, progress=None) -> tuple[np.ndarray, int]:
        """Offsets (bytes, by buffer) and the heap size for placing in ``order``.

        A buffer placed before the current one has a smaller rank; the rank arrays
        laid out like the block index and ``by_start`` make "placed, and alive
        during [s, e)" a few comparisons on contiguous slices, and only those
        buffers' offsets are gathered. The free gaps of the union of their
        intervals come from the sorted starts S and sorted ends E alone: the
        gaps are [E[i-1], S[i]) where E[i-1] < S[i] (cover count is zero there).
        ``progress(placed)`` is called every `PROGRESS_EVERY` buffers.
        """
        start, end, size = self.start, self.end, self.size
        n = len(start)
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n)
        blk_rank = rank[self.blk_ids]
        start_rank = rank[self.by_start]
        off = np.full(n, -1, np.int64)
        off_end = np.zeros(n, np.int64)
        blk_ids, blk_ptr, blk_start, blk_end = self.blk_ids, self.blk_ptr, self.blk_start, self.blk_end
        by_start, w = self.by_start, self.w
        lo_all, hi_all = self.lo, self.hi
        starts, ends, sizes = start.tolist(), end.tolist(), size.tolist()
        concatenate, sort, flatnonzero, argmin = np.concatenate, np.sort, np.flatnonzero, np.argmin
        zero = np.zeros(1, np.int64)
        heap = 0
        for r, b in enumerate(order.tolist()):
            if progress is not None and r % PROGRESS_EVERY == 0:
                progress(r)
            s, e, need = starts[b], ends[b], sizes[b]
            k = s // w
            p0, p1 = blk_ptr[k], blk_ptr[k + 1]
            m1 = (blk_rank[p0:p1] < r) & (blk_start[p0:p1] < e) & (blk_end[p0:p1] > s)
            ids = blk_ids[p0:p1][m1]
            lo, hi = lo_all[b], hi_all[b]
            if hi > lo:
                ids = concatenate((ids, by_start[lo:hi][start_rank[lo:hi] < r]))
            if len(ids) == 0:
                at = 0
            else:
                so = sort(off[ids])
                eo = sort(off_end[ids])
                gap_at = concatenate((zero, eo[:-1]))
                gaps = so - gap_at
                fit = flatnonzero(gaps >= need)
                at = int(gap_at[fit[argmin(gaps[fit])]]) if len(fit) else int(eo[-1])
            off[b] = at
            off_end[b] = at + need
            if at + need > heap:
                heap = at + need
        return off, heap


def plan(start, end, size, orders=ORDERS, min_block=MIN_BLOCK, progress=None):
    """Place the buffers in each order; return ``(offsets, heap, order name, {name: heap})``.

    ``min_block`` changes only the speed, never the placement (tests vary it);
    ``progress(done, total)`` counts buffers placed over all the orders."""
    n = len(start)
    if n == 0:
        return np.zeros(0, np.int64), 0, orders[0], {o: 0 for o in orders}
    placer = _Placer(start, end, size, min_block)
    life = end - start
    idx = np.arange(n)
    keys = {
        "spatial": lambda: np.lexsort((idx, -life, -size)),
        "temporal": lambda: np.lexsort((idx, -size, -life)),
        "arrival": lambda: idx,
    }
    best = None
    heaps = {}
    for k, name in enumerate(orders):
        report = None if progress is None else (lambda r, k=k: progress(k * n + r, len(orders) * n))
        off, heap = placer.place(keys[name](), report)
        heaps[name] = heap
        if best is None or heap < best[1]:
            best = (off, heap, name)
    if progress is not None:
        progress(len(orders) * n, len(orders) * n)
    return best[0], best[1], best[2], heaps


@register
class OraclePool(Policy):
    name = "oracle"
    offline = True
    summary = "offline best fit over known lifetimes (XLA decreasing-size heap), one segment: a near-lower bound"
    models = "XLA GlobalDecreasingSizeBestFitHeap + ChooseBestHeapAlgorithm (docs/models/bestfit-oracle.md)"
    params = (
        Param("orders", "str", ",".join(ORDERS),
              "placement orders tried, smallest heap kept: any of spatial, temporal, arrival (several in brackets "
              "on the command line: orders=[spatial,temporal])"),
        Param("unit", "size", UNIT, "round every size up to a multiple of this (512: CuPy/PyTorch; 1: exact bytes, "
                                    "a bound also below policies that do not round, such as none)"),
        Param("max_buffers", "int", 1_500_000, "refuse traces with more non-empty allocations than this (at least 1)"),
    )

    def __init__(self, *a, progress=None, **k):
        """Plan the whole trace; ``progress(done, total)`` follows the placement (minutes on 1M buffers)."""
        super().__init__(*a, **k)
        if self.ctx.trace is None:
            raise UsageError("policy 'oracle' needs the whole trace (it places buffers offline)")
        text = str(self.orders).strip()
        if text.startswith("[") and text.endswith("]"):     # (a list's brackets keep its commas from -O's)
            text = text[1:-1]
        orders = tuple(o.strip() for o in text.split(",") if o.strip())
        bad = [o for o in orders if o not in ORDERS]
        if bad or not orders:
            raise UsageError(f"policy 'oracle' option orders: expected some of {', '.join(ORDERS)}, "
                             f"got {self.orders!r}")
        if self.max_buffers < 1:
            raise UsageError(f"policy 'oracle' option max_buffers: expected an integer of at least 1, got "
                             f"{self.max_buffers!r}")
        start, end, req = buffer_lifetimes(self.ctx.trace)
        if len(start) > self.max_buffers:
            raise UsageError(f"policy 'oracle': the trace has {len(start):,} allocations, more than "
                             f"max_buffers={self.max_buffers:,} (raise it with --policy-opt max_buffers=N; "
                             f"placement time grows faster than linearly)")
        unit = UNIT if self.unit is None else int(self.unit)
        if unit < 1:
            raise UsageError(f"policy 'oracle' option unit: expected a positive size, got {self.unit!r}")
        rounded = (req + unit - 1) // unit * unit
        t0 = time.perf_counter()
        off, heap, chosen, heaps = plan(start, end, rounded, orders, progress=progress)
        self.plan_seconds = time.perf_counter() - t0       # not part of the replay's own time
        self.heap = heap
        self.chosen_order = chosen
        self.heaps = heaps
        self._off = off.tolist()
        self._req = req.tolist()
        self._size = rounded.tolist()
        self._next = 0
        self._live: dict[int, int] = {}          # address -> size of the live blocks
        self._start = start.tolist()
        self._ends_sorted = np.sort(end).tolist()
        self._n_freed = 0
        self.collections = 0
        self.base = self.ctx.malloc(heap) if heap else 0

    def malloc(self, size, stream):
        i = self._next
        self._next = i + 1
        if self.base is None:
            return None
        if i >= len(self._req) or self._req[i] != size:
            raise RuntimeError(f"oracle: malloc #{i} of {size} bytes does not match the trace it was planned on")
        n = self._size[i]
        addr = self.base + self._off[i]
        if bisect_right(self._ends_sorted, self._start[i]) > self._n_freed and self._held(addr, n):
            # gc runtime: objects dead in the trace still hold the planned slot; the
            # oracle schedules the full collection that returns them (eager: never)
            self.collections += 1
            with self.ctx.section("0.1 gc(true) (planned)"):
                self.ctx.collect(True)
        self.allocated += n
        self._live[addr] = n
        return addr, n

    def _held(self, addr, n) -> bool:
        return any(a < addr + n and addr < a + m for a, m in self._live.items())

    def free(self, handle):
        del self._live[handle[0]]
        self._n_freed += 1
        self.allocated -= handle[1]

    def largest_free(self):
        """Largest gap between live blocks inside the heap (O(live log live); the engine asks rarely)."""
        if not self.base:
            return 0
        top, best = self.base, 0
        for addr, n in sorted(self._live.items()):
            best = max(best, addr - top)
            top = max(top, addr + n)
        return max(best, self.base + self.heap - top)

    def block(self, handle):
        return handle

    def counters(self):
        c = {"heap_bytes": self.heap, "order": self.chosen_order, "planned_collections": self.collections}
        c.update({f"heap_{k}_bytes": v for k, v in self.heaps.items()})
        return c
