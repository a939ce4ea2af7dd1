"""`binned`: CuArrays' BinnedPool, the default pool of CuArrays 1.x.

Source: `docs/models/cuarrays.md`, section "binned: BinnedPool"
(`src/memory/binned.jl` @ a6fc8af, identical in v1.3.0), followed step for step:

- Requests up to ``max_pool`` (MAX_POOL = 2^27; ``max_pool=100MiB`` gives v1.2.1)
  are rounded up to a power of two and served from that exact bin only, LIFO;
  there is no fallback to a larger bin and no splitting.
- A miss escalates through the TimerOutputs sections ``1. try alloc``,
  ``2. gc(false)`` (then retry the bin), ``3. reclaim unused``, ``4. try alloc``,
  ``5. gc(true)`` (retry the bin), ``6. reclaim unused``, ``7. try alloc``,
  ``8. reclaim everything``, ``9. try alloc``, then OOM. The pool grows before it
  collects: without a cap the GC runs only once the device is full.
- Larger requests are unpooled: exact size, ``cudaFree``'d on free, same steps
  without the bin retries.
- ``reclaim(full, target)`` has the sub-sections ``scan`` (how many free blocks
  each bin may give back) and ``reclaim`` (cudaFree, largest bin first, until
  ``target`` bytes counted in bin sizes).
- The background task (option ``background``, on by default as
  ``CUARRAYS_MANAGED_POOL`` was): every ``delay`` seconds of *trace* time it runs
  ``GC.gc(false)``, shifts each bin's usage window (USAGE_WINDOW = 5), and
  releases ``floor((1 - max usage over the window) * blocks)`` free blocks per bin;
  ``delay`` is 1 s after a tick where some bin's usage changed, else doubles up to
  5 s. It is driven by the trace's timestamps through ``tick``; a synthetic
  trace's timestamps are synthetic, and a trace with all timestamps 0 sees only
  the first tick. Section ``background task`` > ``pooled free`` / ``scan`` /
  ``reclaim``.

Knowing differences: bins are keyed by their size in bytes rather than
``ceil(log2 n) + 1``; the ``used`` sets are counts (only their sizes matter);
the usage update on free is kept (it matters after a reclaim). The hash-free
LIFO order, the float usage arithmetic and the reclaim order are the real ones.
"""
from __future__ import annotations

import math

from .registry import register
from ._pools import FreeListReporting, FreeLists, HotStep
from .base import Param, Policy

MAX_POOL = 1 << 27
USAGE_WINDOW = 5
MIN_DELAY_NS = 1_000_000_000
MAX_DELAY_NS = 5_000_000_000
INITIAL_USAGE = (1.0,) * USAGE_WINDOW
BACKGROUND = "background task"
#: idle background iterations stepped one by one before the steady rest is added at once
FAST_FORWARD_AFTER = 16

# the escalation after "1. try alloc": (section, action); actions are "gc(false)",
# "gc(true)", "reclaim" (target: the request) and "flush" (no target), and "alloc"
ESCALATION = (
    ("2. gc(false)", "gc(false)"),
    ("3. reclaim unused", "reclaim"),
    ("4. try alloc", "alloc"),
    ("5. gc(true)", "gc(true)"),
    ("6. reclaim unused", "reclaim"),
    ("7. try alloc", "alloc"),
    ("8. reclaim everything", "flush"),
    ("9. try alloc", "alloc"),
)


@register
class BinnedPool(FreeListReporting, Policy):
    name = "binned"
    summary = "power-of-two bins, exact-bin LIFO reuse, GC before reclaim, usage-window background reclaim"
    models = "CuArrays BinnedPool @ a6fc8af / v1.3.0 (docs/models/cuarrays.md)"
    params = (
        Param("max_pool", "size", MAX_POOL, "largest pooled request; larger ones are exact-size and unpooled "
              "(2^27 = 128 MiB; 100MiB models v1.2.1)"),
        Param("background", "bool", True, "run the background task (GC.gc(false) + usage-window reclaim every "
              "1-5 s of trace time), as CUARRAYS_MANAGED_POOL=true"),
    )

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        if not self.max_pool or self.max_pool < 1:
            self.max_pool = 0                      # max_pool=none or 0: nothing is pooled
        self._bins = FreeLists()
        self._avail = self._bins.lists            # bin size -> LIFO list of addresses
        self._nused: dict[int, int] = {}          # bin size -> blocks handed out
        self._usage: dict[int, float] = {}        # bin size -> max used/(used+avail) this tick
        self._history: dict[int, tuple] = {}      # bin size -> the last USAGE_WINDOW tick maxima
        self._try_alloc = HotStep("1. try alloc")
        self._hit_s = self.costs.pool_hit_s
        self._free_s = self.costs.pool_free_s
        self._charge = self.ctx.charge            # bound once: the hot path calls it per event
        self.cache_flushes = 0
        self.unpooled_allocs = 0
        self.background_ticks = 0
        self.background_released = 0
        self._next_tick = 0
        self._delay = MIN_DELAY_NS
        if self.background:
            self.tick = self._tick

    # ---- allocation ---------------------------------------------------------------------
    def malloc(self, size, stream):
        if size <= self.max_pool:
            n = 1 << (size - 1).bit_length()       # poolsize(poolidx(size))
            avail = self._avail.get(n)
            if avail:                               # untimed, as in CuArrays
                addr = avail.pop()
                self._charge(self._hit_s)
            else:
                addr = self._escalate(n, True)
                if addr is None:
                    return None
                avail = self._avail[n]
            nused = self._nused[n] + 1
            self._nused[n] = nused
            u = nused / (nused + len(avail))
            if u > self._usage[n]:
                self._usage[n] = u
            self.allocated += n
            return (addr, n, True)
        addr = self._escalate(size, False)
        if addr is None:
            return None
        self.unpooled_allocs += 1
        self.allocated += size
        return (addr, size, False)

    def _escalate(self, n: int, pooled: bool):
        """`pool_alloc` after a bin miss: steps 1-9; the address, or None (OOM)."""
        ctx = self.ctx
        if pooled and n not in self._nused:
            self._bins.stack(n)
            self._nused[n] = 0
            self._usage[n] = 1.0
            self._history[n] = INITIAL_USAGE
        addr = self._try_alloc.malloc(ctx, n)
        if addr is not None:
            return addr
        for name, action in ESCALATION:
            with ctx.section(name):
                if action == "alloc":
                    addr = ctx.malloc(n)
                elif action == "reclaim":
                    self._reclaim(True, n)
                elif action == "flush":
                    self.cache_flushes += 1
                    self._reclaim(True, None)
                else:
                    ctx.collect(action == "gc(true)")
            if addr is not None:
                return addr
            if pooled and action.startswith("gc") and self._avail[n]:
                ctx.charge(self._hit_s)
                return self._avail[n].pop()
        return None

    def free(self, handle):
        addr, n, pooled = handle
        self.allocated -= n
        if not pooled:
            self.ctx.free(addr, n)
            return
        avail = self._avail[n]
        avail.append(addr)
        nused = self._nused[n] - 1
        self._nused[n] = nused
        u = nused / (nused + len(avail))
        if u > self._usage[n]:
            self._usage[n] = u
        self._charge(self._free_s)

    # ---- reclaim and the background task -------------------------------------------------
    def _reclaim(self, full: bool, target: int | None) -> int:
        """CuArrays ``reclaim(full, target)``: sections ``scan`` then ``reclaim``; blocks released."""
        ctx = self.ctx
        with ctx.section("scan"):
            if full:
                counts = None
            else:
                counts = {}
                for n, avail in self._avail.items():
                    if avail:
                        nused = self._nused[n]
                        recent = max(max(self._history[n]), self._usage[n])
                        counts[n] = math.floor((1.0 - recent) * (nused + len(avail)))
        with ctx.section("reclaim"):
            _, released = self._bins.release(ctx, counts, target)
        return released

    def release_cache(self) -> None:
        """``CuArrays.reclaim(true)``: every cached block of every bin back to the device."""
        self._reclaim(True, None)

    def _scan_usage(self) -> bool:
        """The background ``scan()`` after its GC: shift each bin's window; whether any usage changed."""
        active = False
        for n, avail in self._avail.items():
            nused = self._nused[n]
            total = nused + len(avail)
            if total:
                usage = self._usage[n]
                current = nused / total
                self._history[n] = self._history[n][1:] + (usage,)
                self._usage[n] = current
                if usage != current:
                    active = True
            else:
                self._usage[n] = 1.0
                self._history[n] = INITIAL_USAGE
        return active

    def _tick(self, time_ns: int) -> None:
        if time_ns >= self._next_tick:
            self._background(time_ns)

    def _background(self, time_ns: int) -> None:
        """Run every background iteration due by ``time_ns`` (the task sleeps ``delay`` between them)."""
        ctx = self.ctx
        with ctx.top_level():
            while self._next_tick <= time_ns:
                due = (time_ns - self._next_tick) // MAX_DELAY_NS + 1     # iterations left if the delay stays 5 s
                if due <= FAST_FORWARD_AFTER or self._delay != MAX_DELAY_NS:
                    self._iteration()
                    continue
                state, totals = self._pool_state(), ctx.totals(BACKGROUND)
                if self._iteration() == 0 and self._pool_state() == state:
                    ctx.repeat(due - 1, totals, ctx.totals(BACKGROUND))
                    self.background_ticks += due - 1
                    self._next_tick += (due - 1) * MAX_DELAY_NS

    def _iteration(self) -> int:
        """One background iteration: GC.gc(false), scan, reclaim, sleep; blocks released."""
        ctx = self.ctx
        with ctx.section(BACKGROUND):
            ctx.collect(False)
            if self._scan_usage():
                self._delay = MIN_DELAY_NS
            else:
                self._delay = min(2 * self._delay, MAX_DELAY_NS)
            released = self._reclaim(False, None)
        self.background_released += released
        self.background_ticks += 1
        self._next_tick += self._delay
        return released

    def _pool_state(self) -> tuple:
        """What decides the next background iteration: the delay and every bin's blocks and usage."""
        return (self._delay, [(n, len(a), self._nused[n], self._usage[n], self._history[n])
                              for n, a in self._avail.items()])

    # ---- reporting --------------------------------------------------------------------------
    def counters(self):
        return {"cache_flushes": self.cache_flushes, "unpooled_allocs": self.unpooled_allocs,
                "cached_bytes": self._bins.cached_bytes(), "background_ticks": self.background_ticks,
                "background_released": self.background_released}

    def finish(self):
        self._try_alloc.report(self.ctx)
