"""The Julia CuArrays pools' search space: the ``split`` and ``binned`` pools, each with no cap and a few
pool caps (multiples of LOAD below the target)."""
from __future__ import annotations

from ..frameworks import julia
from ..spec import PolicySpec
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


def conf_lines(spec: PolicySpec, cap: int | None) -> dict:
    return julia.conf_lines(spec.ref, cap)
