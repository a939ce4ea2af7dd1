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

from .device import SimulatedDevice
from ..errors import GPUUnavailable

_now = time.perf_counter_ns


def require_cupy():
    """Import CuPy and check that it sees a GPU, or raise `GPUUnavailable`."""
    if importlib.util.find_spec("cupy") is None:
        raise GPUUnavailable("this needs CuPy and an NVIDIA GPU: CuPy is not installed (pip install 'allocsim[cupy]' for "
                             "CUDA 12, 'allocsim[cupy-cuda13]' for CUDA 13)")
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


class CudaDevice(SimulatedDevice):
    """The simulated device's accounting over real `cudaMalloc`/`cudaFree`, measured.

    `--backend cuda` replays a simulated policy with its segment allocations made
    on the GPU, so the latency of device calls is measured, not modeled. The cap
    is enforced in software; the capacity is the GPU's (or ``capacity`` if smaller).
    """

    measured = True

    def __init__(self, capacity: int | None = None, cap: int | None = None, costs=None):
        self.cp = require_cupy()
        self.rt = self.cp.cuda.runtime
        total = self.rt.memGetInfo()[1]
        super().__init__(min(capacity, total) if capacity else total, cap, costs)

    def _obtain(self, n: int):
        t0 = _now()
        try:
            addr = self.rt.malloc(n)
        except self.rt.CUDARuntimeError:
            return None
        return addr, (_now() - t0) * 1e-9

    def _release(self, addr: int, n: int) -> float:
        t0 = _now()
        self.rt.free(addr)
        return (_now() - t0) * 1e-9

    def reserve_address_range(self, n: int) -> int:
        raise GPUUnavailable("--backend cuda cannot model expandable segments (virtual ranges); use the simulated device")
