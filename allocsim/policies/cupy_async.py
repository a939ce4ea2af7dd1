"""`cupy-async`: CuPy's `MemoryAsyncPool` (the driver's `cudaMallocAsync` pool), measured.

The driver's sub-allocation is invisible, so this policy can only be measured on
a GPU, never simulated: reserved bytes are the pool's `total_bytes()` (driver
attribute `cudaMemPoolAttrReservedMemCurrent`); device malloc/free counts are not
visible and stay 0. `--cap` is enforced here on the pool's used bytes (CuPy's own
software `set_limit` did not stop a request over the cap on an H200 with CuPy 14.2).
See `docs/models/cupy.md`, section "The real policies".
"""
from __future__ import annotations

from ..machine.gpu import require_cupy
from .registry import register
from .cupy_real import CupyRealPool


@register
class CupyAsyncPool(CupyRealPool):
    name = "cupy-async"
    summary = "CuPy MemoryAsyncPool (cudaMallocAsync) on this GPU (measured; driver internals invisible)"
    models = "cupy.cuda.MemoryAsyncPool, run for real"

    def __init__(self, *a, **k):
        super(CupyRealPool, self).__init__(*a, **k)
        cp = self.cp = require_cupy()
        self.pool = cp.cuda.MemoryAsyncPool()
        self._streams = {0: None}

    def malloc(self, size, stream):
        if self._over_cap(size):
            return None
        return self._measured_malloc(size, stream)

    def counters(self):
        return {"pool_total_bytes": int(self.pool.total_bytes())}
