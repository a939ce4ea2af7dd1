"""The Julia CuArrays pools' settings: which pool, and its limit.

Source: `docs/models/cuarrays.md`. CuArrays reads ``CUARRAYS_MEMORY_POOL`` (the pool:
``split``, ``binned``, ...) and ``CUARRAYS_MEMORY_LIMIT`` (bytes) at start-up; CUDA.jl
from v2.0 renamed them ``JULIA_CUDA_MEMORY_*``.
"""
from __future__ import annotations


def conf_lines(pool: str, limit: int | None) -> dict:
    """The environment lines that select ``pool`` under ``limit`` bytes (None: none), ready to paste:
    ``{"conf", "legacy_conf", "note"}``."""
    conf = f"CUARRAYS_MEMORY_POOL={pool}"
    if limit is not None:
        conf += f" CUARRAYS_MEMORY_LIMIT={limit}"
    return {"conf": conf, "legacy_conf": "", "note": "JULIA_CUDA_MEMORY_* from CUDA.jl v2.0"}
