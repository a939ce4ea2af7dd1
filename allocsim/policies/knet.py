"""`knet`: Knet.jl's own GPU memory manager (v1.1.1, "new GPU memory manager").

Source: `docs/models/knet.md` (Knet.jl `src/kptr.jl`).

- Blocks come in geometric bins, three per octave:
  ``blocksize(n) = floor(b^ceil(log_b n))`` with ``b = cbrt(2)``, at most ~26 %
  rounding. There is one LIFO free list per exact block size.
- A soft limit starts at KNETMEMINIT = 16 MiB. The allocation order is
  1. reuse from the size's free list (a hit, untimed);
  ``2. alloc (under limit)``: cudaMalloc if bytes held + block <= limit;
  ``3. GC.gc() (size seen before)``: if this size was allocated before, a full
  ``GC.gc()``, the limit ×6/5, and retry the list;
  ``4. raise limit + alloc``: limit = max(limit, bytes + 2·block), capped at the
  device's total memory − 500 MB, then cudaMalloc (regardless of the limit);
  ``5a. Knet.gc()``: ``GC.gc()``, cudaFree every cached block of every size,
  ``GC.gc()``; ``5b. alloc``: one more cudaMalloc; then OOM ("Out of gpu memory").
  So memory grows in +20 % steps, with a full GC whenever the soft limit is
  reached for a size seen before.
- ``GC.gc()`` is the runtime's full collection. Knet frees arrive early (gcnode,
  at last use): Knet traces replay under the ``eager`` runtime, or ``gc``.

``blocksize`` is computed in integers — k is the least integer with
``2^k >= n^3`` (i.e. ``b^k >= n``), and the block is the integer cube root of
``2^k`` — so it does not depend on floating-point ``log``/``^`` rounding.
The "total GPU memory" of the cap is the memory the pool can get: the smaller
of the device capacity and ``--cap``; with neither, the soft limit is uncapped.
"""
from __future__ import annotations

from .registry import register
from ._pools import FreeListReporting, FreeLists, HotStep
from .base import Param, Policy

KNETMEMINIT = 1 << 24
HEADROOM = 500_000_000


def icbrt(x: int) -> int:
    """The integer cube root: the largest m with m^3 <= x (x >= 0)."""
    if x < 0:
        raise ValueError("icbrt of a negative number")
    if x == 0:
        return 0
    m = 1 << -(-x.bit_length() // 3)          # 2^ceil(bits/3) > cbrt(x): start above the root
    while True:                               # Newton's method, decreasing to the floor
        y = (2 * m + x // (m * m)) // 3
        if y >= m:
            return m
        m = y


def blocksize(n: int) -> int:
    """Knet's block size ``floor(cbrt(2)^ceil(log_cbrt(2) n))``, exactly, for ``n >= 1``."""
    k = (n * n * n - 1).bit_length()          # least k with 2^k >= n^3
    return icbrt(1 << k)


@register
class KnetPool(FreeListReporting, Policy):
    name = "knet"
    summary = "cube-root-of-2 bins, per-size free lists, soft limit grown x6/5 after a full GC (Knet v1.1.1)"
    models = "Knet.jl v1.1.1 KnetPtr allocator (docs/models/knet.md)"
    params = (
        Param("meminit", "size", KNETMEMINIT, "initial soft limit (KNETMEMINIT = 16 MiB)"),
        Param("headroom", "size", HEADROOM, "the soft limit stays below device memory minus this (500 MB)"),
    )

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.limit = self.meminit or 0
        total = self.ctx.limit                     # the memory Knet can get
        self._max_limit = None if total is None else total - (self.headroom or 0)
        self._at_max = False                       # the soft limit has reached _max_limit
        self._bins = FreeLists()
        self._free = self._bins.lists              # block size -> LIFO list of addresses
        self._nptr: dict[int, int] = {}            # block size -> blocks held (in use + cached)
        self._bytes = 0                            # bytes held (in use + cached): mem.bytes
        self._blocksize: dict[int, int] = {}       # request -> block size, memoised
        self._alloc2 = HotStep("2. alloc (under limit)")
        self._hit_s = self.costs.pool_hit_s
        self._free_s = self.costs.pool_free_s
        self._charge = self.ctx.charge            # bound once: the hot path calls it per event
        self.cache_flushes = 0
        self.limit_raises = 0
        self.gc_retries = 0
        self.gc_retry_hits = 0

    def _inclimit(self, minlimit: int) -> None:
        """Knet's ``inclimit!``: raise the soft limit to ``minlimit`` (capped), never lower it.

        The cap is the device's memory less the headroom, so each comparison with it is
        one with the device's limit, told to the device (`SimulatedDevice.note`); once the
        soft limit sits at the cap (``_at_max``) it moves with the device's limit.
        """
        if self._at_max:
            return
        top = self._max_limit
        clamped = top is not None and minlimit > top
        if top is not None:
            self.ctx.note(minlimit + (self.headroom or 0), not clamped)
        if not clamped:
            if self.limit < minlimit:
                self._raise(minlimit)
            return
        below = self.limit < top
        self.ctx.note(self.limit + (self.headroom or 0) + 1, below)
        if below:
            self._raise(top)
            self._at_max = True

    def _raise(self, limit: int) -> None:
        self.limit = limit
        self.limit_raises += 1

    def malloc(self, size, stream):
        b = self._blocksize.get(size)
        if b is None:
            b = self._blocksize[size] = blocksize(size)
        lst = self._free.get(b)
        if lst:                                    # 1. reuse
            self._charge(self._hit_s)
            self.allocated += b
            return (lst.pop(), b)
        addr = self._new_block(b)
        if addr is None:
            return None
        self.allocated += b
        return (addr, b)

    def _new_block(self, b: int):
        """Steps 2-5 after a free-list miss; the address, or None (out of gpu memory)."""
        ctx = self.ctx
        under = self._bytes + b <= self.limit
        if self._at_max:                           # the soft limit is the device's limit less the headroom
            ctx.note(self._bytes + b + (self.headroom or 0), under)
        if under:
            addr = self._alloc2.malloc(ctx, b)
            if addr is not None:
                return self._grant(addr, b)
        if self._nptr.get(b, 0) > 0:
            self.gc_retries += 1
            with ctx.section("3. GC.gc() (size seen before)"):
                ctx.collect(True)
                self._inclimit(self.limit * 6 // 5)
            lst = self._free[b]
            if lst:
                self.gc_retry_hits += 1
                ctx.charge(self._hit_s)
                return lst.pop()
        with ctx.section("4. raise limit + alloc"):
            self._inclimit(self._bytes + 2 * b)
            addr = ctx.malloc(b)
        if addr is None:
            with ctx.section("5a. Knet.gc()"):
                self._knet_gc()
            with ctx.section("5b. alloc"):
                addr = ctx.malloc(b)
        return None if addr is None else self._grant(addr, b)

    def _grant(self, addr: int, b: int) -> int:
        self._bytes += b
        self._nptr[b] = self._nptr.get(b, 0) + 1
        self._bins.stack(b)
        return addr

    def _knet_gc(self) -> None:
        """``Knet.gc()``: GC.gc(), cudaFree every cached block of every size, GC.gc()."""
        self.cache_flushes += 1
        self.ctx.collect(True)
        for size, lst in self._free.items():
            self._nptr[size] -= len(lst)
        freed, _ = self._bins.release(self.ctx)
        self._bytes -= freed
        self.ctx.collect(True)

    def release_cache(self) -> None:
        """The program called ``Knet.gc()``."""
        self._knet_gc()

    def free(self, handle):
        addr, b = handle
        self._free[b].append(addr)
        self.allocated -= b
        self._charge(self._free_s)

    def counters(self):
        return {"cache_flushes": self.cache_flushes, "soft_limit_bytes": self.limit,
                "limit_raises": self.limit_raises, "gc_retries": self.gc_retries,
                "gc_retry_hits": self.gc_retry_hits, "cached_bytes": self._bins.cached_bytes()}

    def finish(self):
        self._alloc2.report(self.ctx)
