"""`Param`: one declared, typed parameter — of a policy (``--policy-opt``) or a synth preset (``--param``).

Declaring parameters once lets the command line, the listings (`allocsim policies`,
`allocsim synth --list`) and the docs all come from the same place.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable

from .errors import UsageError
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


#: Exact units a size is written back in (``8GB`` stays ``8GB``), largest first.
_SIZE_UNITS = (("TiB", 1 << 40), ("TB", 10**12), ("GiB", 1 << 30), ("GB", 10**9), ("MiB", 1 << 20), ("MB", 10**6),
               ("KiB", 1 << 10))


def _fmt_size(n: int) -> str:
    return next((f"{n // k}{unit}" for unit, k in _SIZE_UNITS if n and n % k == 0), str(n))


def number(text: str, kind: str = "int"):
    """``text`` as an int (or a float): a ValueError that names what was expected, not Python's
    "invalid literal for int() with base 10". Written as people and PyTorch's parser write numbers: ASCII, no
    ``1_000`` (which Python's int() reads as 1000 and PyTorch as 1)."""
    try:
        if "_" in str(text) or not str(text).isascii():
            raise ValueError
        return int(text) if kind == "int" else float(text)
    except ValueError:
        raise ValueError(f"expected {'an integer' if kind == 'int' else 'a number'}, got {text!r}") from None


PARSERS: dict[str, Callable[[str], Any]] = {"int": number, "float": lambda t: number(t, "float"), "bool": _bool,
                                            "size": _size, "str": str}


def kind_of(value) -> str:
    """numpy's kind letter of a scalar, Python's or numpy's: ``b`` a bool, ``i``/``u`` an integer, ``f`` a float
    (else ``""``)."""
    if isinstance(value, bool):
        return "b"
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return dtype.kind if getattr(value, "ndim", 1) == 0 else ""
    if isinstance(value, numbers.Integral):
        return "i"
    return "f" if isinstance(value, numbers.Real) else ""


def count_argument(name: str, value, least: int) -> int:
    """A Python caller's count or trace index (``jobs``, ``max_replays``, ``Replay.run``'s ``until``): an integer,
    Python's or numpy's, of at least ``least``; a TypeError or ValueError naming it (``jobs="2"`` failed inside the
    pool, ``jobs=0`` ran, ``run(until='5')`` walked nothing)."""
    if kind_of(value) not in ("i", "u"):
        raise TypeError(f"{name}: an integer, not {value!r}")
    if value < least:
        raise ValueError(f"{name}={int(value)} (at least {least})")
    return int(value)


@dataclass(frozen=True)
class Param:
    """One parameter: name, kind (int, float, bool, size, str or a choice list), default, help, and
    optionally its own ``parser`` (text -> value, ValueError when wrong) where the kind's is not enough."""

    name: str
    kind: str | tuple
    default: Any
    help: str
    parser: Callable[[str], Any] | None = None

    def parse(self, text: str):
        if self.default is None and str(text).strip().lower() == "none":
            return None                      # "none": the parameter's unset default
        if isinstance(self.kind, tuple):
            if text not in self.kind:
                raise ValueError(f"expected one of {', '.join(self.kind)}, got {text!r}")
            return text
        value = (self.parser or PARSERS[self.kind])(text)
        if value is None and self.default is not None:      # a size's "no limit", which this one has not
            raise ValueError(f"expected a size (such as its default {self.format(self.default)}), got {text!r} (no "
                             f"limit is for the options whose default is none)")
        return value

    def text_of(self, value) -> str:
        """A typed value a Python caller gives (`allocsim.engine.spec.PolicySpec.with_values`) as the text `parse`
        reads, its type checked first -- a bool for a bool, an integer for an int or a size, a number for a float,
        None for "none" -- so that it meets the command line's checks: ``{"max_split_size_mb": -5}`` replayed where
        ``-O max_split_size_mb=-5`` is refused. A choice takes its text only."""
        if value is None:
            return "none"
        kind = kind_of(value)
        if self.kind == "bool" and kind == "b":
            return str(bool(value))
        if self.kind in ("int", "size") and kind in ("i", "u"):
            return str(int(value))
        if self.kind == "float" and kind in ("i", "u", "f"):
            try:
                return repr(float(value))
            except OverflowError:       # (an integer past any float: 10**400)
                raise ValueError(f"expected a number, got an integer of {len(str(int(value)))} digits") from None
        what = {"bool": "true or false", "int": "an integer", "size": "a size in bytes (an integer)",
                "float": "a number"}.get(self.kind, "text") if isinstance(self.kind, str) else "one of the choices"
        raise ValueError(f"expected {what}, got {value!r}")

    def format(self, value) -> str:
        """``value`` as text that `parse` reads back to it."""
        if value is None:
            return "none"
        if self.kind == "size":
            return _fmt_size(value)
        return repr(value) if self.kind == "float" else str(value)


def split_top(text: str, what: str | None = None) -> list[str]:
    """Split on commas outside brackets: ``"split,torch[a:1,b:[1,2]]"`` -> two items. Given ``what`` (the option, as
    the user knows it), an empty item (``none,``, ``a=1,,b=2``) is refused with its number, not skipped: a stray
    comma often marks a value that went missing."""
    out, depth, cur = [], 0, []
    for ch in str(text):
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
            continue
        depth += (ch == "[") - (ch == "]")
        cur.append(ch)
    out.append("".join(cur).strip())
    if what is not None and "" in out and any(out):
        raise UsageError(f"{what} {str(text)!r}: item {out.index('') + 1} of {len(out)} is empty (a comma too many, "
                         f"or a value missing)")
    return [x for x in out if x]


def split_conf(text: str, what: str | None = None) -> list[tuple[str, str]]:
    """``"k:v,k2=[a:1,b:2]"`` -> ``[(k, v), (k2, "[a:1,b:2]")]``: options as ``key:value`` or ``key=value``; an
    empty item refused as `split_top` refuses it, given ``what``."""
    out = []
    for item in split_top(text, what):
        cut = min((i for i in (item.find(":"), item.find("=")) if i >= 0), default=-1)
        if cut < 0:
            raise UsageError(f"option {item!r}: expected key=value (or key:value)")
        out.append((item[:cut].strip(), item[cut + 1:].strip()))
    return out
