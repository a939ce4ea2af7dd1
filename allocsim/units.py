"""Parsing and printing of byte sizes and durations.

Sizes accept ``8GB`` (10^9), ``8GiB`` (2^30), ``512MiB``, ``1.5TB``, ``4k``/``4K``
(taken as KiB, as PyTorch and Julia users write it), plain bytes, and
``none``/``unlimited``/``off``/``no`` for "no limit" where a limit is expected. ``inf`` and
``nan`` are refused, not read as "no limit": a number that is not a size is a mistake (an
unset or mis-computed variable), and "no limit" is said in words. A count of bytes is whole:
``1.5`` or ``1.5B`` is refused, not rounded (``1.5KB`` is 1500 bytes). An exponent may carry a sign (``8e3``,
``8e+3``, ``1e-3GB``); a size with a unit is rounded to the nearest byte (``0.1GiB``), but one more than 0 that
rounds to 0 bytes (``1e-12GB``) is refused, not read as 0.

A cap (`parse_cap`) is also written relative to what it caps: ``1.2x`` (1.2 × the trace's LOAD, its peak
live bytes) or ``90%`` (of the device's memory, as ``torch.cuda.set_per_process_memory_fraction(0.9)``
allows); docs/cli.md.
"""
from __future__ import annotations

import re
from fractions import Fraction

from .errors import UsageError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
    "p": 1024**5, "pb": 1000**5, "pib": 1024**5,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([a-zA-Z]*)\s*$")
_NO_LIMIT = {"none", "unlimited", "off", "no"}
_NOT_A_NUMBER = re.compile(r"^[+-]?(inf|infinity|nan)$", re.I)


def parse_size(text: str | int, *, what: str = "size", allow_none: bool = False) -> int | None:
    """Parse a byte size; ``None`` for "no limit" when ``allow_none``."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"{what}: negative size {text}")
        return text
    s = str(text).strip()
    if allow_none and s.lower() in _NO_LIMIT:
        return None
    if _NOT_A_NUMBER.match(s):
        raise UsageError(f"{what}: {text!r} is not a size" + ("; write none for no limit" if allow_none else ""))
    if s.startswith("-"):
        raise UsageError(f"{what}: negative size {text!r}")
    m = _SIZE.match(s)
    if not m or m.group(3).lower() not in _UNITS:
        raise UsageError(f"{what}: cannot parse size {text!r} (examples: 8GB, 8GiB, 512MiB, 1.5TB, 1048576)")
    mantissa, exponent = m.group(1), (m.group(2) or "").lstrip("+")
    digits = exponent.lstrip("-").lstrip("0")
    # lengths first: int() and Fraction() raise a ValueError on 4,300 digits; the value exact, no float rounding
    if len(mantissa) > 100 or len(digits) > 2 or int(exponent or 0) > 30 \
            or (value := Fraction(mantissa) * Fraction(10) ** int(exponent or 0) * _UNITS[m.group(3).lower()]) > 2**62:
        raise UsageError(f"{what}: size {text!r} is out of range")
    if value.denominator != 1 and _UNITS[m.group(3).lower()] == 1:
        raise UsageError(f"{what}: {text!r} is not a whole number of bytes (a byte count is an integer; "
                         f"or give a unit: 1.5KB)")
    if value and not round(value):
        raise UsageError(f"{what}: {text!r} is {float(value):.3g} bytes, less than one byte (a size is a whole "
                         f"number of bytes; 0 is written 0)")
    return round(value)


_SHARE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([xX%])\s*$")


def parse_cap(text: str, *, what: str = "--cap", load: int | None = None, device: int | None = None,
              device_name: str = "the device's memory") -> int | None:
    """A cap in bytes (None: no cap): a size or ``none`` (`parse_size`), ``1.2x`` (that multiple of ``load``, the
    trace's LOAD) or ``90%`` (that share of ``device``, its memory, named ``device_name`` to the user; at most
    100 %), rounded down to a byte as PyTorch rounds a memory fraction."""
    s = str(text).strip()
    if not s.endswith(("x", "X", "%")) or s.startswith(("-", "+")):
        return parse_size(text, what=what, allow_none=True)
    m = _SHARE.match(s)
    if not m:
        raise UsageError(f"{what}: cannot parse cap {text!r} (examples: 8GB, none, 1.2x: 1.2 × the trace's LOAD, "
                         f"90%: of the device's memory)")
    mantissa, exponent, unit = m.group(1), (m.group(2) or "").lstrip("+"), m.group(3).lower()
    if len(mantissa) > 100 or len(exponent.lstrip("-").lstrip("0")) > 2:
        raise UsageError(f"{what}: {text!r} is out of range")
    factor = Fraction(mantissa) * Fraction(10) ** int(exponent or 0)
    if factor <= 0:
        raise UsageError(f"{what}: {text!r} caps at 0 bytes; a cap is more than 0 (none: no cap)")
    if unit == "%":
        if factor > 100:
            raise UsageError(f"{what}: {text!r} is more than all of {device_name}; a share is at most 100%")
        if device is None:
            raise UsageError(f"{what}: {text!r} is a share of the device's memory, which is not known here (no "
                             f"--capacity, none recorded in the trace); give --capacity")
        return int(float(factor) / 100 * device)       # as PyTorch: int(fraction * total), in doubles
    if load is None:
        raise UsageError(f"{what}: {text!r} is a multiple of a trace's LOAD; here give a size")
    if factor * load > 2**62:
        raise UsageError(f"{what}: {text!r} is out of range")
    return int(factor * load)


def fmt_bytes(n: float | None, digits: int = 2) -> str:
    """Binary-prefixed size, e.g. ``6.58 GiB``; ``none`` for None."""
    if n is None:
        return "none"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    raise AssertionError


def fmt_seconds(t: float) -> str:
    """TimerOutputs-style duration with 3 significant digits: ``282ms``, ``8.29μs``, ``48.3s``."""
    t = float(t)
    if t == 0:
        return "0ns"
    units = ((1, "s"), (1e-3, "ms"), (1e-6, "μs"), (1e-9, "ns"))
    for k, (scale, unit) in enumerate(units):
        if abs(t) >= scale or unit == "ns":
            text = f"{t / scale:.3g}"
            if k == 0 and "e" in text:
                return f"{t:.0f}s"
            if "e" in text or (float(text) >= 1000 and k > 0):      # 999.7μs rounds to 1.00ms
                scale, unit = units[k - 1]
                text = f"{t / scale:.3g}"
            return text + unit
    raise AssertionError


def fmt_count(n: float) -> str:
    """TimerOutputs-style count: ``1.01M``, ``58.3k``, ``127``."""
    n = float(n)
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{int(n)}"
