"""`cuda-direct`: raw `cudaMalloc`/`cudaFree` per request on this GPU, measured — the real `none`."""
from __future__ import annotations

from ..machine.gpu import CudaDevice
from .registry import register
from ._real import RealPolicy


@register
class CudaDirect(RealPolicy):
    name = "cuda-direct"
    summary = "cudaMalloc/cudaFree per request on this GPU (measured)"
    models = "the CUDA runtime, no pool"

    def __init__(self, ctx, *a, **k):
        self.gpu = CudaDevice(capacity=ctx.capacity, cap=ctx.cap, costs=ctx.costs)
        super().__init__(ctx, *a, **k)

    def malloc(self, size, stream):
        g, dev = self.gpu, self.ctx.measured_device
        addr = g.malloc(size)
        for k in ("clock", "malloc_time", "reserved", "peak_reserved", "n_malloc", "bytes_malloc"):
            setattr(dev, k, getattr(g, k))
        if addr is None:
            return None
        self.allocated += size
        return [addr, addr, size]

    def free(self, handle):
        g, dev = self.gpu, self.ctx.measured_device
        g.free(handle[1], handle[2])
        for k in ("clock", "free_time", "reserved", "n_free", "bytes_free"):
            setattr(dev, k, getattr(g, k))
        self.allocated -= handle[2]
