"""The CuPy pool's search space: its ``set_limit``, a few multiples of LOAD below the target."""
from __future__ import annotations

from ...frameworks import cupy
from ...engine.spec import PolicySpec
from .family import NO_FAMILIES
from .labels import pool_label as label  # noqa: F401  (a setting's name: the pool and its cap)
from .limits import canonical, facts, least_peak, pool_limits, promise  # noqa: F401  (a pool space's answers)

POLICY = "cupy"
FAMILIES = NO_FAMILIES                  # each setting replayed alone (`allocsim.search.spaces.family`)
RETRIES = ("cache_flushes",)            # a row's retries: the pool's cache flushes, each followed by a retry
live_ahead = largest_device_call = None     # no bound known on the device calls still to come
python_lines = None                     # no Python form of the setting for a running process


def recorded(trace) -> PolicySpec:
    """The pool as recorded: its limit is the trace's own SET_LIMIT events, replayed as they come."""
    return PolicySpec.parse(POLICY)


def settings(space) -> list[tuple[PolicySpec, int | None]]:
    """No limit, then each of `pool_limits` (they all differ, so each replays)."""
    spec = PolicySpec.parse(POLICY)
    return [(spec, None)] + [(spec.with_values({"limit": lim}), None)
                             for lim in pool_limits(space.trace.load_bytes, space.target.limit)]





def least_costs(ref: str, costs) -> tuple[float, float]:
    """The least each ALLOC and each FREE adds to the clock (`allocsim.search.tune.Bound`): the pool charges
    ``pool_hit_s`` at every malloc and ``pool_free_s`` at every free (`tests/test_tune_bound.py`)."""
    return costs.pool_hit_s, costs.pool_free_s



def conf_lines(spec: PolicySpec, cap: int | None) -> dict:
    return cupy.conf_lines(spec.values().get("limit"))
