"""What the real-allocator policies share: measured calls and the reserved-bytes ledger.

A real policy hands each request to an allocator on the GPU, times the call and
reads the allocator's own counters, and writes them into the (simulated) device
object the engine reads, so the same metrics come out as for a simulated replay:
``device.reserved`` is the allocator's reserved bytes (CuPy ``total_bytes``,
PyTorch ``memory_reserved``), ``device.clock`` the measured time.
Handles are one-element lists, so that dropping the block (``box.clear()``)
frees it at once even while the engine still holds the handle.
"""
from __future__ import annotations

import time

from .base import Policy

now_ns = time.perf_counter_ns


class RealPolicy(Policy):
    real_gpu = True

    def _account(self, dt_ns: int, reserved: int, allocated: int | None = None) -> None:
        self.ctx.charge(dt_ns * 1e-9)
        dev = self.ctx.measured_device
        dev.reserved = reserved
        if reserved > dev.peak_reserved:
            dev.peak_reserved = reserved
        if allocated is not None:
            self.allocated = allocated

    def _over_cap(self, size: int) -> bool:
        """The engine's --cap for allocators with no limit of their own (checked on live bytes)."""
        cap = self.ctx.cap
        return cap is not None and self.allocated + size > cap

    def block(self, handle):
        return handle[1], handle[2]

    def largest_free(self):
        return None           # the real allocator does not show its free blocks
