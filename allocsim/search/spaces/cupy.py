"""The CuPy pool's search space: its ``set_limit``, a few multiples of LOAD below the target."""
from __future__ import annotations

from ...frameworks import cupy
from ...engine.spec import PolicySpec
from .limits import pool_limits

POLICY = "cupy"


def recorded(trace) -> PolicySpec:
    """The pool as recorded: its limit is the trace's own SET_LIMIT events, replayed as they come."""
    return PolicySpec.parse(POLICY)


def settings(space) -> list[tuple[PolicySpec, int | None]]:
    """No limit, then each of `pool_limits` (they all differ, so each replays)."""
    spec = PolicySpec.parse(POLICY)
    return [(spec, None)] + [(spec.with_values({"limit": lim}), None)
                             for lim in pool_limits(space.trace.load_bytes, space.target.limit)]


def canonical(space, values: dict) -> dict:
    return values


def promise(values: dict) -> int:
    """No setting is expected to be better (`allocsim.search.tune.Space.order`)."""
    return 0


def least_costs(ref: str, costs) -> tuple[float, float]:
    """The least each ALLOC and each FREE adds to the clock (`allocsim.search.tune.Bound`): the pool charges
    ``pool_hit_s`` at every malloc and ``pool_free_s`` at every free (`tests/test_tune_bound.py`)."""
    return costs.pool_hit_s, costs.pool_free_s


def least_peak(trace, values: dict) -> int:
    """The least peak reserved a replay reaches (`allocsim.search.tune.Bound`): nothing known beyond what it reached."""
    return 0


def conf_lines(spec: PolicySpec, cap: int | None) -> dict:
    return cupy.conf_lines(spec.values().get("limit"))
