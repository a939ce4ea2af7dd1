"""The capacity frontier: the smallest pool cap from which a policy is safe.

OOM is not monotone in the cap (a smaller cap can make a pool flush or collect
earlier and so pass where a larger one fails), so a bisection finds a passing
cap, not a threshold. `fit_capacity` reports the **safe** cap: the smallest
point of its grid (multiples of ``resolution``, and the unlimited peak on top)
from which every grid point up to the unlimited peak replays without OOM —
each one certified by a replay, none assumed.

Certification: a replay depends on the cap only through the comparisons of
``reserved + n`` with the device's limit (device mallocs, `fits`, and a
policy's own comparisons reported by `SimulatedDevice.note`): the replay at C
goes exactly the same way at every C' from the largest granted need S to the
smallest refused need F minus one, so one replay certifies the grid points of
[S, F − 1] (`ReplayResult.certified_limits`). The walk starts from the
unlimited replay (which certifies its peak and up), probes the grid point just
below the lowest certified one, and stops at the first OOM: every replay
certifies at least its own cap, and usually many more.

The rule for policies that read the cap otherwise (checked module by module):
`cupy`'s limit (``min(limit, cap)``) and `knet`'s soft-limit cap (device memory
− headroom) report their comparisons through ``note``, so they certify like
the rest, and so does `torch`'s allowed memory (the cap, checked before cudaMalloc);
`torch` pins the device where it reads the cap's value itself: a GC threshold with
the cap as allowed memory, or ``per_process_memory_fraction`` with no device capacity
(a replay certifies only its own cap: the walk then probes every grid point it passes); the oracle
makes one device malloc of its planned heap; the real GPU policies are not fitted.

Budget: a policy that fills its pool up to the cap behaves differently at almost every
grid point (its replays certify a MiB or less), so its walk costs about one replay per
grid point — tens of thousands under ``--runtime gc``, where the pools grow to the
device. The walk therefore stops after ``max_replays`` replays (0: no limit): the cap
it reached is still safe (everything above it is certified) but may not be the
threshold, and ``threshold`` is then False.

Islands: below the safe cap, a bisection between LOAD − 1 (always fails:
reserved ≥ allocated ≥ live) and the safe cap looks for a smaller passing cap;
one found is reported as ``island_bytes`` (a cap that passes, below one that
fails), never as the answer.
"""
from __future__ import annotations

from .spec import PolicySpec
from .sweep import Cell, Settings, run_cell

MiB = 1 << 20
MAX_REPLAYS = 1000      # per policy, for the walk down from the peak


def fit_capacity(trace: str, policy, *, runtime: str = "eager", options: tuple = (),
                 settings: Settings | None = None, resolution: int = MiB, islands: bool = True,
                 on_replay=None, max_replays: int = MAX_REPLAYS) -> dict:
    """The safe capacity of ``policy`` (a `PolicySpec` or its text, ``options`` added) on ``trace`` (see
    the module docstring), and any island below it.

    ``on_replay()`` is called after each replay (progress: a policy that fills its pool up to
    the cap behaves differently at every grid point, so its walk takes one replay per point)."""
    if resolution < 1:
        from .errors import UsageError
        raise UsageError(f"fit resolution must be at least 1 byte, got {resolution}")
    spec = PolicySpec.of(policy, options)
    replays = 0

    def probe(cap):
        """Replay at ``cap``: (passed, lowest cap certified to behave the same)."""
        nonlocal replays
        replays += 1
        row, res = run_cell(Cell(trace, spec, cap, runtime), settings, full=True)
        if on_replay is not None:
            on_replay()
        return not row["ooms"], res.certified_limits[0], row

    passed, lowest, unlimited = probe(None)
    load, peak = unlimited["load_bytes"], unlimited["peak_reserved_bytes"]
    out = {"policy": spec.name, "options": spec.option_text, "runtime": runtime, "capacity_bytes": None,
           "threshold": True, "island_bytes": None, "load_bytes": load, "unlimited_peak_bytes": peak}
    if not passed:              # it runs out even with no cap: no capacity is safe
        return {**out, "replays": replays}
    floor_cap = max(load, 1)    # below LOAD every replay fails; a cap of 0 means none
    safe = peak
    while True:
        cap = (safe - 1) // resolution * resolution
        if cap < floor_cap:
            break
        if max_replays and replays >= max_replays:
            out["threshold"] = False        # safe from here; a lower safe capacity may exist
            break
        passed, lowest, _ = probe(cap)
        if not passed:
            break
        safe = -(-lowest // resolution) * resolution      # the lowest grid point certified
    island = None
    if islands:
        lo, hi = floor_cap - 1, safe
        while True:
            mid = (lo + hi) // 2 // resolution * resolution
            if mid <= lo or mid >= hi:
                break
            passed, lowest, _ = probe(mid)
            if passed:
                hi = island = max(-(-lowest // resolution) * resolution, floor_cap)
            else:
                lo = mid
    return {**out, "capacity_bytes": safe, "island_bytes": island, "replays": replays}


def fit_job(args):
    """One policy's fit in a worker; a queue in ``args[3]``, if any, hears of each replay."""
    queue = args[3] if len(args) > 3 else None
    return fit_capacity(*args[:2], **args[2], on_replay=None if queue is None else (lambda: queue.put(1)))
