"""Real-GPU plumbing shared by the real-allocator policies, `--backend cuda` and `calibrate`.

Nothing here imports CuPy or PyTorch until a GPU feature is used; without a GPU
(or without the library) `require_cupy` / `require_torch` raise `GPUUnavailable`,
which the CLI prints as one line (exit 2).

Latency is host wall time around each call (`time.perf_counter_ns`), which
includes the Python call (~0.1-0.3 µs); `cudaMalloc` is synchronous and
`cudaFree` synchronizes the device, so host time is the call's cost.
"""
from __future__ import annotations

import importlib.util
import time

from .errors import GPUUnavailable

_now = time.perf_counter_ns


def require_cupy():
    """Import CuPy and check that it sees a GPU, or raise `GPUUnavailable`."""
    if importlib.util.find_spec("cupy") is None:
        raise GPUUnavailable("this needs CuPy and an NVIDIA GPU: CuPy is not installed (pip install 'allocsim[cupy]')")
    import cupy
    try:
        ok = cupy.cuda.is_available()
    except Exception:          # noqa: BLE001 — any driver failure means "no GPU"
        ok = False
    if not ok:
        raise GPUUnavailable("this needs an NVIDIA GPU: CuPy is installed but sees no usable GPU")
    return cupy


def require_torch():
    """Import PyTorch and check that it sees a CUDA GPU, or raise `GPUUnavailable`."""
    if importlib.util.find_spec("torch") is None:
        raise GPUUnavailable("this needs PyTorch and an NVIDIA GPU: PyTorch is not installed")
    import torch
    if not torch.cuda.is_available():
        raise GPUUnavailable("this needs an NVIDIA GPU: PyTorch sees no CUDA device")
    return torch


def gpu_available() -> tuple[bool, str]:
    """(True, device name) or (False, why) — for skipping GPU tests with a reason."""
    try:
        cp = require_cupy()
        return True, cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except GPUUnavailable as e:
        return False, str(e)


class CudaDevice:
    """The `SimulatedDevice` interface over real `cudaMalloc`/`cudaFree`, measured.

    `--backend cuda` replays a simulated policy with its segment allocations made
    on the GPU, so the latency of device calls is measured, not modeled. The cap
    is enforced in software; the capacity is the GPU's (or ``capacity`` if smaller).
    """

    def __init__(self, capacity: int | None = None, cap: int | None = None, costs=None):
        from .costs import CostModel
        self.cp = require_cupy()
        self.rt = self.cp.cuda.runtime
        total = self.rt.memGetInfo()[1]
        self.capacity = min(capacity, total) if capacity else total
        self.cap = cap
        self.costs = costs or CostModel()
        self.limit = min(x for x in (self.capacity, cap) if x is not None)
        self.reserved = self.peak_reserved = 0
        self.n_malloc = self.n_free = self.bytes_malloc = self.bytes_free = self.n_failed = 0
        self.clock = self.malloc_time = self.free_time = 0.0
        self.measured = True
        self._ranges = {}

    def malloc(self, n: int):
        if self.reserved + n > self.limit:
            self.n_failed += 1
            return None
        t0 = _now()
        try:
            addr = self.rt.malloc(n)
        except self.rt.CUDARuntimeError:
            self.n_failed += 1
            return None
        dt = (_now() - t0) * 1e-9
        self.clock += dt
        self.malloc_time += dt
        self.reserved += n
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.n_malloc += 1
        self.bytes_malloc += n
        return addr

    def free(self, addr: int, n: int) -> None:
        t0 = _now()
        self.rt.free(addr)
        dt = (_now() - t0) * 1e-9
        self.clock += dt
        self.free_time += dt
        self.reserved -= n
        self.n_free += 1
        self.bytes_free += n

    def fits(self, n: int) -> bool:
        return self.reserved + n <= self.limit

    def reserve_address_range(self, n: int) -> int:
        raise GPUUnavailable("--backend cuda cannot model expandable segments (virtual ranges); use the simulated device")
