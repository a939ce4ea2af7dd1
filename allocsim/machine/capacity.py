"""The device a replay runs on, named as the user named it, and the one rule for a pool cap above it.

A cap above the device's memory means nothing (the device runs out first), so `replay`,
`compare` and `tune` refuse it alike, naming what the user gave: ``--capacity``, or, when
they gave none, the recorded device's memory (the trace's metadata) that stands for it.
"""
from __future__ import annotations

from ..errors import UsageError
from ..units import fmt_bytes


def trace_capacity(trace) -> int | None:
    """The recorded device's total memory, if the trace's metadata names it."""
    dev = trace.meta.get("device") or {}
    total = dev.get("total_memory") if isinstance(dev, dict) else None
    return int(total) if total else None


def device_capacity(capacity, trace) -> tuple[int | None, str]:
    """``(bytes, name)`` of the device memory: ``capacity`` as given (``"trace"``: the recorded device's; None:
    unlimited, bytes None), and how to name it to the user."""
    if capacity == "trace":
        return (trace_capacity(trace) if trace is not None else None), "the recorded device's memory"
    return capacity, "--capacity"


def check_caps(caps, capacity, trace, what: str = "--cap") -> None:
    """Refuse a pool cap above the device's memory (`device_capacity`), in the user's terms."""
    total, name = device_capacity(capacity, trace)
    if total is None:
        return
    hint = "lower the cap or raise the capacity" if capacity != "trace" else "lower the cap, or give --capacity"
    for cap in caps:
        if cap is not None and cap > total:
            raise UsageError(f"{what} {fmt_bytes(cap)} is larger than {name} {fmt_bytes(total)}: "
                             f"the device runs out first; {hint}")
