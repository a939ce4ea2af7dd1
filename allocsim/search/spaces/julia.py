"""The Julia CuArrays pools' search space: the ``split`` and ``binned`` pools, each with no cap and a few
pool caps (multiples of LOAD below the target)."""
from __future__ import annotations

from ...frameworks import julia
from ...engine.spec import PolicySpec
from .limits import pool_limits

POLICY = "split"
POOLS = ("split", "binned")


def recorded(trace) -> PolicySpec:
    """The baseline: the ``split`` pool, CuArrays' default."""
    return PolicySpec.parse(POLICY)


def settings(space) -> list[tuple[PolicySpec, int | None]]:
    caps = [None] + pool_limits(space.trace.load_bytes, space.target.limit)
    return [(PolicySpec.parse(p), cap) for p in POOLS for cap in caps]


def canonical(space, values: dict) -> dict:
    return values


def promise(values: dict) -> int:
    """No setting is expected to be better (`allocsim.search.tune.Space.order`)."""
    return 0


def least_costs(ref: str, costs) -> tuple[float, float]:
    """Nothing (`allocsim.search.tune.Bound`): the ``binned`` pool charges a hit only where CuArrays times it, ``split``
    a free only at the next malloc; the clock so far is the bound."""
    return 0.0, 0.0


def least_peak(trace, values: dict) -> int:
    """The least peak reserved a replay reaches (`allocsim.search.tune.Bound`): nothing known beyond what it reached."""
    return 0


def conf_lines(spec: PolicySpec, cap: int | None) -> dict:
    return julia.conf_lines(spec.ref, cap)
