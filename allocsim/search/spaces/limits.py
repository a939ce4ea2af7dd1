"""What the CuPy and Julia pool spaces share: the pool limits worth trying, and the answers of a space that knows\nnothing of a trace beyond its settings (`allocsim.search.tune.Space`, `Bound`)."""
from __future__ import annotations

MiB = 1 << 20
LIMIT_FACTORS = (1.1, 1.25, 1.5)          # CuPy limits and Julia pool caps, times LOAD


def pool_limits(load: int, limit: int | None) -> list[int]:
    """A few multiples of LOAD, whole MiB, below the target's ``limit`` (so they all differ)."""
    return [int(load * f) // MiB * MiB for f in LIMIT_FACTORS if load >= MiB and (limit is None or load * f < limit)]


def facts(space) -> None:
    """Nothing read of the trace beyond the space's own (`allocsim.search.tune.Space`)."""
    return None


def canonical(space, values: dict) -> dict:
    return values


def promise(values: dict) -> int:
    """No setting is expected to be better (`allocsim.search.tune.Space.order`)."""
    return 0


def least_peak(trace, values: dict) -> int:
    """The least peak reserved a replay reaches (`allocsim.search.tune.Bound`): nothing known beyond what it reached."""
    return 0
