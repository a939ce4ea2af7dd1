"""`Param`: one declared, typed parameter — of a policy (``--policy-opt``) or a synth preset (``--param``).

Declaring parameters once lets the command line, the listings (`allocsim policies`,
`allocsim synth --list`) and the docs all come from the same place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .units import parse_size


def _bool(v: str) -> bool:
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {v!r}")


def _size(v: str) -> int | None:
    return parse_size(v, allow_none=True)


PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "bool": _bool, "size": _size, "str": str}


@dataclass(frozen=True)
class Param:
    """One parameter: name, kind (int, float, bool, size, str or a choice list), default, help."""

    name: str
    kind: str | tuple
    default: Any
    help: str

    def parse(self, text: str):
        if isinstance(self.kind, tuple):
            if text not in self.kind:
                raise ValueError(f"expected one of {', '.join(self.kind)}, got {text!r}")
            return text
        return PARSERS[self.kind](text)
