"""`none`: CuArrays' DummyPool — a device malloc per request, a device free per free.

Source: `docs/models/cuarrays.md`, section "none: DummyPool" (`src/memory/dummy.jl` @ a6fc8af).
Phases: ``1.1 alloc``; ``2.0 gc(false)`` + ``2.1 alloc``; ``3.0 gc(true)`` + ``3.1 alloc``.
With no caching the GC runs only when the device (or cap) is full.
"""
from __future__ import annotations

from .registry import register
from .base import Policy


@register
class DummyPool(Policy):
    name = "none"
    summary = "no pool: cudaMalloc/cudaFree per request (CuArrays DummyPool)"
    models = "CuArrays DummyPool (docs/models/cuarrays.md)"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._n_first = 0
        self._t_first = 0.0

    def malloc(self, size, stream):
        ctx = self.ctx
        t0 = ctx.clock
        addr = ctx.malloc(size)
        self._n_first += 1
        self._t_first += ctx.clock - t0
        for phase, full in ((2, False), (3, True)):
            if addr is not None:
                break
            ctx.push_section(f"{phase}.0 gc({'true' if full else 'false'})")
            ctx.collect(full)
            ctx.pop_section()
            ctx.push_section(f"{phase}.1 alloc")
            addr = ctx.malloc(size)
            ctx.pop_section()
        if addr is None:
            return None
        self.allocated += size
        return (addr, size)

    def free(self, handle):
        self.ctx.free(*handle)
        self.allocated -= handle[1]

    def block(self, handle):
        return handle

    def largest_free(self):
        return 0            # no pool: nothing free inside reserved memory

    def finish(self):
        self.ctx.add_section("1.1 alloc", self._t_first, self._n_first)
