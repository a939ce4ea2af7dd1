"""`cupy-real`: the real CuPy `MemoryPool` on this GPU, every call measured.

The pool's upstream is a `PythonFunctionAllocator` around `cudaMalloc`/`cudaFree`,
so device allocations and releases (including `free_all_blocks` on the OOM path)
are counted and timed; reserved bytes are the pool's own `total_bytes()`.
`--cap`, or the limit the program set (SET_LIMIT events move the device's cap), is
the pool's `set_limit`, brought up to date before each request. Streams map to CuPy streams (index 0 is
the null stream). The frees a recording made inside a request (flag IN_REQUEST, arrays the recorded pool's
``gc.collect()`` collected) are made when this pool's own ``gc.collect()`` on its limit or OOM path starts
(a ``gc.callbacks`` entry, full collections inside a request only), as a replay's collection makes them.
See `docs/models/cupy.md`, section "The real policies".
"""
from __future__ import annotations

import gc

from ..machine.gpu import require_cupy
from .registry import register
from ._real import RealPolicy, now_ns


@register
class CupyRealPool(RealPolicy):
    name = "cupy-real"
    summary = "the real CuPy MemoryPool on this GPU (latency measured)"
    models = "cupy.cuda.MemoryPool, run for real"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        cp = self.cp = require_cupy()
        rt, dev, sizes = cp.cuda.runtime, self.ctx.measured_device, {}

        def upstream_malloc(size, device_id):
            t0 = now_ns()
            ptr = rt.malloc(size)
            dev.malloc_time += (now_ns() - t0) * 1e-9
            dev.n_malloc += 1
            dev.bytes_malloc += size
            sizes[ptr] = size
            return ptr

        def upstream_free(ptr, device_id):
            t0 = now_ns()
            rt.free(ptr)
            dev.free_time += (now_ns() - t0) * 1e-9
            dev.n_free += 1
            dev.bytes_free += sizes.pop(ptr)

        self.pool = cp.cuda.MemoryPool(cp.cuda.memory.PythonFunctionAllocator(upstream_malloc, upstream_free).malloc)
        self._limit = 0                 # the pool's set_limit (0: none)
        self._streams = {0: None}
        self.flushes_seen = 0
        self._in_request = False
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase, info) -> None:
        """The pool's ``gc.collect()`` inside a request: the replay's collection, which frees what the recorded
        run's freed there."""
        if self._in_request and phase == "start" and info.get("generation") == 2:
            self._in_request = False    # the frees below run no request of their own
            try:
                self.ctx.collect(True)
            finally:
                self._in_request = True

    def _stream(self, s):
        st = self._streams.get(s, False)
        if st is False:
            st = self._streams[s] = self.cp.cuda.Stream(non_blocking=True)
        return st

    def malloc(self, size, stream):
        cap = self.ctx.cap or 0
        if cap != self._limit:
            self.pool.set_limit(size=cap)
            self._limit = cap
        return self._measured_malloc(size, stream)

    def _measured_malloc(self, size, stream):
        """The pool's malloc on the stream, timed; None when it raises OutOfMemoryError."""
        pool, st = self.pool, self._stream(stream)
        t0 = now_ns()
        self._in_request = True
        try:
            if st is None:
                mem = pool.malloc(size)
            else:
                with st:
                    mem = pool.malloc(size)
        except self.cp.cuda.memory.OutOfMemoryError:
            self._account(now_ns() - t0, pool.total_bytes(), pool.used_bytes())
            return None
        finally:
            self._in_request = False
        self._account(now_ns() - t0, pool.total_bytes(), pool.used_bytes())
        return [mem, mem.ptr, size]

    def free(self, handle):
        t0 = now_ns()
        handle[0] = None              # the PooledMemory's last reference: the chunk returns to its arena
        self._account(now_ns() - t0, self.pool.total_bytes(), self.pool.used_bytes())

    def release_cache(self):
        """``MemoryPool.free_all_blocks()`` on the real pool, timed."""
        t0 = now_ns()
        self.pool.free_all_blocks()
        self._account(now_ns() - t0, self.pool.total_bytes(), self.pool.used_bytes())

    def counters(self):
        return {"pool_total_bytes": int(self.pool.total_bytes()), "pool_n_free_blocks": int(self.pool.n_free_blocks())}

    def close(self):
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self.pool.free_all_blocks()
