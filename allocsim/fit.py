"""The capacity frontier: the smallest device capacity each policy survives.

`fit_capacity` bisects the device capacity between LOAD − 1 (which always fails:
reserved ≥ allocated ≥ live) and the policy's peak reserved with no limit (which
always succeeds) until the bracket is within ``resolution`` bytes, so the answer
is exact to that resolution for policies whose success is monotone in capacity.
Cost: about log2((peak − LOAD) / resolution) replays.
"""
from __future__ import annotations

from .spec import PolicySpec
from .sweep import Cell, Settings, run_cell

MiB = 1 << 20


def fit_capacity(trace: str, policy, *, runtime: str = "eager", options: tuple = (),
                 settings: Settings | None = None, resolution: int = MiB) -> dict:
    """Bisect the smallest capacity at which ``trace`` replays under ``policy`` (a `PolicySpec` or its
    text, ``options`` added) without OOM."""
    if resolution < 1:
        from .errors import UsageError
        raise UsageError(f"fit resolution must be at least 1 byte, got {resolution}")
    spec = PolicySpec.of(policy, options)
    unlimited = run_cell(Cell(trace, spec, None, runtime, capacity=None), settings)
    load = unlimited["load_bytes"]
    hi = unlimited["peak_reserved_bytes"]
    lo = max(0, load - 1)
    replays = 1
    if hi <= lo:        # nothing is live, or the policy holds no more than LOAD
        return {"policy": spec.name, "options": spec.option_text, "runtime": runtime, "capacity_bytes": hi,
                "load_bytes": load, "unlimited_peak_bytes": hi, "replays": replays}
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        row = run_cell(Cell(trace, spec, None, runtime, capacity=mid), settings)
        replays += 1
        if row["ooms"]:
            lo = mid
        else:
            hi = mid
    return {"policy": spec.name, "options": spec.option_text, "runtime": runtime, "capacity_bytes": hi,
            "load_bytes": load, "unlimited_peak_bytes": unlimited["peak_reserved_bytes"], "replays": replays}


def _fit_job(args):
    return fit_capacity(*args[:2], **args[2])
