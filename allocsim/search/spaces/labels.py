"""How a setting is named in `allocsim tune`'s tables and ``--json`` rows (`allocsim.search.tune.Candidate.label`)."""
from __future__ import annotations

from ...engine.spec import PolicySpec
from ...units import fmt_bytes


def option_text(spec: PolicySpec, left_out: tuple = ()) -> str:
    """``k:v,...`` as the policy's option parser takes it, the options ``left_out`` left out."""
    pcls = spec.policy_class()
    return ",".join(f"{k}:{pcls.format_option(k, v)}" for k, v in spec.options if k not in left_out)


def pool_label(spec: PolicySpec, cap: int | None) -> str:
    """A pool's setting: its name, the options that differ from the defaults and its pool cap (None: the
    target's)."""
    opts = option_text(spec)
    return (f"{spec.name}[{opts}]" if opts else spec.name) + (f" cap {fmt_bytes(cap)}" if cap is not None else "")
