"""`simple`: CuArrays' SimplePool — exact-size buffers, first fit over one set of cached buffers.

Source: `docs/models/cuarrays.md`, section "simple: SimplePool" (`src/memory/simple.jl` @ a6fc8af).

- Requests are allocated at their exact size: no rounding, no splitting.
- ``scan(sz)`` takes the first cached buffer with ``sz <= size <= max_oversize(sz)``,
  whole. ``max_oversize`` is unbounded for ``sz <= 1 MiB`` and 4 MiB otherwise:
  the duplicated ``sz <= 2^20`` test makes the "≤ 32 MiB → 1 MiB" branch dead,
  and the bound is an absolute size, not an overhead. So a request over 4 MiB
  never reuses anything, a request of 1-4 MiB reuses only buffers of at most
  4 MiB, and a cached buffer over 4 MiB is reused only by a request of at most
  1 MiB (which then holds the whole buffer); otherwise it waits for a reclaim.
- Phases 1 (no GC), 2 (``2.0 gc(false)``), 3 (``3.0 gc(true)``), each
  ``x.1 scan``, ``x.2 alloc``, ``x.3 reclaim + alloc``; reclaim pops cached
  buffers and cudaFrees them until at least ``sz`` bytes are freed. The pool
  reclaims its cache before it runs the GC.
- ``free`` puts the buffer back into the set.

Knowing difference: Julia iterates (and ``pop!``s) a ``Set`` in hash order,
which depends on addresses; the model uses *insertion order* (the buffer
cached longest ago first), which is deterministic and address-independent.

Data structures: the set is kept as three insertion-ordered tiers by buffer
size — ≤ 1 MiB, 1-4 MiB, > 4 MiB — each an ``OrderedDict`` from insertion
sequence number to handle. That yields exactly the insertion-order first fit
while skipping tiers that cannot match: a request over 4 MiB costs O(1); one
of 1-4 MiB scans only the 1-4 MiB tier; one of at most 1 MiB takes the oldest
of the head of the two larger tiers (any of them fits) and the first fit of
the ≤ 1 MiB tier older than that head. Insert, delete and reclaim's pop of the
oldest are O(1); a scan is O(buffers skipped), like the original linear scan.
"""
from __future__ import annotations

from collections import OrderedDict

from .registry import register
from ._pools import HotStep, block_of
from .base import Policy

MiB = 1 << 20
SMALL = MiB                # max_oversize(sz) is unbounded for sz <= 1 MiB
OVERSIZE = 4 * MiB         # ... and 2^22 for every larger sz (the 1 MiB branch is dead)


def max_oversize(sz: int) -> float:
    """The largest cached buffer ``scan`` accepts for a request of ``sz`` bytes, as written."""
    return float("inf") if sz <= SMALL else OVERSIZE


@register
class SimplePool(Policy):
    name = "simple"
    summary = "exact-size buffers, first fit in one cached set; buffers over 4 MiB reused only by requests <= 1 MiB"
    models = "CuArrays SimplePool @ a6fc8af (docs/models/cuarrays.md)"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        # seq -> (addr, size); tiers by buffer size: <= 1 MiB, (1, 4] MiB, > 4 MiB
        self._small: OrderedDict[int, tuple] = OrderedDict()
        self._mid: OrderedDict[int, tuple] = OrderedDict()
        self._large: OrderedDict[int, tuple] = OrderedDict()
        self._tiers = (self._small, self._mid, self._large)
        self._seq = 0
        self._sizes: dict[int, int] = {}      # cached size -> count, for largest_free
        self._scan1 = HotStep("1.1 scan")
        self._alloc1 = HotStep("1.2 alloc")
        self._hit_s = self.costs.pool_hit_s
        self._free_s = self.costs.pool_free_s
        self._charge = self.ctx.charge            # bound once: the hot path calls it per event
        self.reclaims = 0

    # ---- the cached set ---------------------------------------------------------------
    def _take(self, tier, seq):
        h = tier.pop(seq)
        s = h[1]
        c = self._sizes[s] - 1
        if c:
            self._sizes[s] = c
        else:
            del self._sizes[s]
        return h

    def _scan(self, sz: int):
        """First fit in insertion order: the oldest cached buffer with sz <= size <= max_oversize(sz)."""
        if sz > OVERSIZE:
            return None
        if sz > SMALL:
            for seq, h in self._mid.items():
                if h[1] >= sz:
                    return self._take(self._mid, seq)
            return None
        # every buffer of the two larger tiers fits: only their oldest can win
        bound, tier = None, None
        for t in (self._mid, self._large):
            if t:
                seq = next(iter(t))
                if bound is None or seq < bound:
                    bound, tier = seq, t
        for seq, h in self._small.items():
            if bound is not None and seq > bound:
                break
            if h[1] >= sz:
                return self._take(self._small, seq)
        return None if tier is None else self._take(tier, bound)

    def _reclaim(self, sz: int) -> int:
        """cudaFree the oldest cached buffers until at least ``sz`` bytes are freed."""
        freed = 0
        free = self.ctx.free
        while freed < sz:
            heads = [(next(iter(t)), t) for t in self._tiers if t]
            if not heads:
                break
            seq, tier = min(heads, key=lambda x: x[0])
            addr, size = self._take(tier, seq)
            free(addr, size)
            freed += size
        self.reclaims += 1
        return freed

    def release_cache(self) -> None:
        """``reclaim()`` with no target: every cached buffer back to the device."""
        self._reclaim(float("inf"))

    # ---- the interface ----------------------------------------------------------------
    def malloc(self, size, stream):
        self._scan1.calls += 1
        h = self._scan(size)
        if h is not None:
            self._charge(self._hit_s)
            self._scan1.seconds += self._hit_s
            self.allocated += h[1]
            return h
        addr = self._alloc1.malloc(self.ctx, size)
        if addr is None:
            h = self._escalate(size)
            if h is None:
                return None
        else:
            h = (addr, size)
        self.allocated += h[1]
        return h

    def _escalate(self, sz: int):
        """Phase 1's ``1.3 reclaim + alloc``, then phases 2 and 3; the handle, or None (OOM)."""
        ctx = self.ctx
        for phase in (1, 2, 3):
            if phase > 1:
                full = phase == 3
                with ctx.section(f"{phase}.0 gc({'true' if full else 'false'})"):
                    ctx.collect(full)
                with ctx.section(f"{phase}.1 scan"):
                    h = self._scan(sz)
                if h is not None:
                    ctx.charge(self._hit_s)
                    return h
                with ctx.section(f"{phase}.2 alloc"):
                    addr = ctx.malloc(sz)
                if addr is not None:
                    return (addr, sz)
            with ctx.section(f"{phase}.3 reclaim + alloc"):
                self._reclaim(sz)
                addr = ctx.malloc(sz)
            if addr is not None:
                return (addr, sz)
        return None

    def free(self, handle):
        self._seq += 1
        s = handle[1]
        (self._small if s <= SMALL else self._mid if s <= OVERSIZE else self._large)[self._seq] = handle
        self._sizes[s] = self._sizes.get(s, 0) + 1
        self.allocated -= s
        self._charge(self._free_s)

    def block(self, handle):
        return block_of(handle)

    def largest_free(self):
        return max(self._sizes, default=0)

    def counters(self):
        return {"cache_flushes": 0, "reclaims": self.reclaims,
                "cached_buffers": sum(len(t) for t in self._tiers)}

    def finish(self):
        self._scan1.report(self.ctx)
        self._alloc1.report(self.ctx)
