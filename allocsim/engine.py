"""The one-call replay: `replay(trace, policy, ...)` -> `ReplayResult`.

The replay itself — device, runtime, policy context and the walk over the events —
is `allocsim.replay.Replay`; this wrapper loads a trace file, times the replay and
turns a plug-in's exception into one `PluginError` line.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

from .costs import CostModel
from .metrics import ReplayResult
from .replay import Replay, recorded_segments, trace_capacity
from .spec import PolicySpec, plugin_errors
from .trace import Trace

__all__ = ["Replay", "recorded_segments", "replay", "trace_capacity"]


def replay(trace: Trace | str, policy="split", *, runtime: str = "eager", cap=None, capacity="trace",
           options=None, costs: CostModel | None = None, keep_going: bool = False, gc_every=None,
           timeline: bool = False, progress=None, device=None, observer=None, backend: str = "sim",
           log_events: bool = False, plan_progress=None, guard: bool | None = None) -> ReplayResult:
    """Replay ``trace`` (a `Trace` or a path) against ``policy`` to the end; return its `ReplayResult`.

    The arguments are `Replay`'s. ``load_seconds`` is the time loading the file; ``replay_seconds``
    the replay's, the policy's set-up (an oracle's plan) included.
    """
    loaded = 0.0
    if isinstance(trace, str):
        t_load = time.perf_counter()
        trace = Trace.load(trace)
        loaded = time.perf_counter() - t_load
    t_start = time.perf_counter()
    spec = PolicySpec.of(policy, options)
    r = Replay(trace, spec, runtime=runtime, cap=cap, capacity=capacity, costs=costs, gc_every=gc_every,
               device=device, backend=backend, keep_going=keep_going, timeline=timeline, observer=observer,
               progress=progress, log_events=log_events, plan_progress=plan_progress, guard=guard)
    # an observer's own assertions (allocsim.testing) pass through as they are
    with plugin_errors(type(r.policy), spec.name, "replaying") if observer is None else nullcontext():
        try:
            res = r.run()
        finally:
            r.close()
    res.load_seconds = loaded
    res.replay_seconds = time.perf_counter() - t_start
    return res
