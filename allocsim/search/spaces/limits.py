"""Pool limits worth trying, shared by the CuPy and Julia spaces."""
from __future__ import annotations

MiB = 1 << 20
LIMIT_FACTORS = (1.1, 1.25, 1.5)          # CuPy limits and Julia pool caps, times LOAD


def pool_limits(load: int, limit: int | None) -> list[int]:
    """A few multiples of LOAD, whole MiB, below the target's ``limit`` (so they all differ)."""
    return [int(load * f) // MiB * MiB for f in LIMIT_FACTORS if load >= MiB and (limit is None or load * f < limit)]
