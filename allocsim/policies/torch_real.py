"""`torch-real`: PyTorch's own caching allocator on this GPU, through
`torch.cuda.caching_allocator_alloc` / `caching_allocator_delete`, measured.

Settings: the `conf` option (PYTORCH_CUDA_ALLOC_CONF syntax), else those recorded
in the trace, applied with `torch.cuda.memory._set_allocator_settings` after an
`empty_cache()`. PyTorch cannot put settings back to their defaults inside a process,
so a second `torch-real` replay in one process must ask for the same settings as the
first (the CLI runs one replay per process; `compare`/`sweep` run one per cell with -j).
The cap (``--cap``, or a recorded SET_LIMIT) becomes `set_per_process_memory_fraction`, with
the fraction whose allowed memory is the cap to the byte (`allocsim.frameworks.torch.fraction_for`), kept up
to date before each request.
Reserved and allocated figures come from `torch.cuda.memory_stats()` — read once
at the end (peaks are reset at the start), because reading them per call costs
more than the call; so the engine's per-event reserved curve is not available.
"""
from __future__ import annotations

from ..errors import UsageError
from ..machine.gpu import require_torch
from .registry import register
from ._real import RealPolicy, now_ns
from .base import Param
from ..frameworks.torch import fraction_for


_APPLIED: list[str] = []     # the settings this process's allocator was given


@register
class TorchReal(RealPolicy):
    name = "torch-real"
    summary = "PyTorch's CUDA caching allocator on this GPU (measured)"
    models = "torch.cuda caching allocator, run for real"
    params = (Param("conf", "str", "", "PYTORCH_CUDA_ALLOC_CONF settings; default: the trace's"),)

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        torch = self.torch = require_torch()
        conf = self.conf or (self.ctx.meta.get("allocator_settings") or {}).get("PYTORCH_CUDA_ALLOC_CONF") or ""
        if _APPLIED and _APPLIED[0] != conf:
            raise UsageError(f"torch-real: this process's allocator already runs with settings {_APPLIED[0]!r}; "
                             f"PyTorch cannot reset them to replay with {conf!r} — run it in a fresh process")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if conf and not _APPLIED:
            setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) \
                or torch.cuda.memory._set_allocator_settings
            setter(conf)
        _APPLIED[:] = [conf]
        self.applied_conf = conf
        self._total = torch.cuda.get_device_properties(0).total_memory
        self._cap = None
        self._follow_cap()
        torch.cuda.reset_peak_memory_stats()
        self._base = torch.cuda.memory_stats()
        self._stats: dict = {}              # memory_stats() at finish
        self._streams = {0: torch.cuda.current_stream()}

    def _stream(self, s):
        st = self._streams.get(s)
        if st is None:
            st = self._streams[s] = self.torch.cuda.Stream()
        return st

    def _follow_cap(self):
        """The allowed memory follows the device's cap (``--cap``, or a recorded SET_LIMIT mid-run)."""
        cap = self.ctx.cap
        if cap != self._cap:
            self.torch.cuda.set_per_process_memory_fraction(fraction_for(cap, self._total))
            self._cap = cap

    def malloc(self, size, stream):
        torch = self.torch
        self._follow_cap()
        t0 = now_ns()
        try:
            ptr = torch.cuda.caching_allocator_alloc(size, 0, self._stream(stream))
        except torch.cuda.OutOfMemoryError:
            self.ctx.charge((now_ns() - t0) * 1e-9)
            return None
        self.ctx.charge((now_ns() - t0) * 1e-9)
        self.allocated += size
        return [ptr, ptr, size]

    def free(self, handle):
        t0 = now_ns()
        self.torch.cuda.caching_allocator_delete(handle[1])
        self.ctx.charge((now_ns() - t0) * 1e-9)
        self.allocated -= handle[2]

    def release_cache(self):
        """``torch.cuda.empty_cache()`` on the real allocator, timed."""
        t0 = now_ns()
        self.torch.cuda.empty_cache()
        self.ctx.charge((now_ns() - t0) * 1e-9)

    def finish(self):
        s, b, dev = self.torch.cuda.memory_stats(), self._base, self.ctx.measured_device
        dev.reserved = s.get("reserved_bytes.all.current", 0)
        dev.peak_reserved = s.get("reserved_bytes.all.peak", 0)
        since = lambda key: s.get(key, 0) - b.get(key, 0)      # noqa: E731 — the counters run for the process
        dev.n_malloc, dev.n_free = since("num_device_alloc"), since("num_device_free")
        # the bytes of those calls: what the reserved bytes gained and lost (cudaMalloc, cudaFree; maps alike)
        dev.bytes_malloc, dev.bytes_free = since("reserved_bytes.all.allocated"), since("reserved_bytes.all.freed")
        self.peak_allocated_override = s.get("allocated_bytes.all.peak", 0)
        self._stats = s

    def counters(self):
        s, b = self._stats, self._base
        return {"num_alloc_retries": s.get("num_alloc_retries", 0) - b.get("num_alloc_retries", 0),
                "num_ooms": s.get("num_ooms", 0) - b.get("num_ooms", 0),
                "cache_flushes": s.get("num_alloc_retries", 0) - b.get("num_alloc_retries", 0),
                "segments_allocated": s.get("segment.all.allocated", 0) - b.get("segment.all.allocated", 0),
                "settings": self.applied_conf}

    def close(self):
        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0)
