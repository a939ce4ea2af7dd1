"""`allocsim tune`'s search spaces: the settings worth trying, one module per framework.

Each module says, for a trace its framework recorded: the policy that replays it
(``POLICY``), the recorded settings as a spec (`recorded`), the settings to try
(`settings`: ``(spec, pool cap)`` pairs), what its rules read of the trace once per search
(`facts`), the canonical form of a setting's option values (`canonical`: equal for settings
whose replays of this trace are equal), a setting's name in the tables (`label`), the settings
expected to be good (`promise`), lower bounds of a replay (`least_costs`, `least_peak`, and
`live_ahead` and `largest_device_call`, None where none is known), the counters a row's retries read (``RETRIES``),
which settings share a head's replay (``FAMILIES``, a `allocsim.search.spaces.family.FamilyRule`)
and the lines a user pastes to run one (`conf_lines`, and `python_lines`, None where the
framework has no Python form). `allocsim.search.tune` keeps the search itself, which is the same for every
framework and names none of their options (docs/tune.md, "The search and its spaces"); a trace
of no known framework gets `julia`'s space (the CuArrays pools, which any trace can be replayed
under).

The spaces read the models' rules (`allocsim.policies`) and the settings' syntax
(`allocsim.frameworks`); they live apart from both so that neither imports the search.
"""
from __future__ import annotations

from . import cupy, julia, torch


def space_of(framework: str | None):
    """The module of the search space for a trace that ``framework`` recorded."""
    return {"torch": torch, "cupy": cupy}.get(framework, julia)
