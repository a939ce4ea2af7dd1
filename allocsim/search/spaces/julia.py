"""The Julia CuArrays pools' search space: the ``split`` and ``binned`` pools, each with no cap and a few
pool caps (multiples of LOAD below the target)."""
from __future__ import annotations

from ...frameworks import julia
from ...engine.spec import PolicySpec
from .family import NO_FAMILIES
from .labels import pool_label as label  # noqa: F401  (a setting's name: the pool and its cap)
from .limits import canonical, facts, least_peak, pool_limits, promise  # noqa: F401  (a pool space's answers)

POLICY = "split"
POOLS = ("split", "binned")
FAMILIES = NO_FAMILIES                  # each setting replayed alone (`allocsim.search.spaces.family`)
RETRIES = ("cache_flushes",)            # a row's retries: the pool's cache flushes, each followed by a retry
live_ahead = largest_device_call = None     # no bound known on the device calls still to come
python_lines = None                     # no Python form of the setting for a running process


def recorded(trace) -> PolicySpec:
    """The baseline: the ``split`` pool, CuArrays' default."""
    return PolicySpec.parse(POLICY)


def settings(space) -> list[tuple[PolicySpec, int | None]]:
    caps = [None] + pool_limits(space.trace.load_bytes, space.target.limit)
    return [(PolicySpec.parse(p), cap) for p in POOLS for cap in caps]





def least_costs(ref: str, costs) -> tuple[float, float]:
    """Nothing (`allocsim.search.tune.Bound`): the ``binned`` pool charges a hit only where CuArrays times it, ``split``
    a free only at the next malloc; the clock so far is the bound."""
    return 0.0, 0.0



def conf_lines(spec: PolicySpec, cap: int | None) -> dict:
    return julia.conf_lines(spec.ref, cap)
