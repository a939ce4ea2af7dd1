"""CuPy's memory pool settings: the pool's limit as a user sets it.

Source: `docs/models/cupy.md`. The recorded limit is not metadata but the trace's
``SET_LIMIT`` events (the model reads them through the device's cap).
"""
from __future__ import annotations


def conf_lines(limit: int | None) -> dict:
    """The environment line that sets the pool's limit (bytes; None: none), ready to paste:
    ``{"conf", "legacy_conf", "note"}``."""
    if not limit:
        return {"conf": "unset CUPY_GPU_MEMORY_LIMIT", "legacy_conf": "", "note": ""}
    return {"conf": f"CUPY_GPU_MEMORY_LIMIT={limit}", "legacy_conf": "",
            "note": "or cupy.get_default_memory_pool().set_limit(size=...)"}
