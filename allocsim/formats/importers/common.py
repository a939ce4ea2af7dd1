"""What the importers share: trace metadata and line-oriented logs whose tail may be cut off."""
from __future__ import annotations

import re

from ...errors import InputError

_DECIMAL = re.compile(r"-?[0-9]+\Z")
_HEX = re.compile(r"-?(0[xX])?[0-9a-fA-F]+\Z")


def base_meta(fmt: str, framework: str, source: str, *, device: int = 0, device_name: str | None = None,
              total_memory: int | None = None, time_source: str) -> dict:
    """Trace metadata common to every import: producer, format, source file, device."""
    dev = {"index": device}
    if device_name:
        dev["name"] = device_name
    if total_memory:
        dev["total_memory"] = int(total_memory)
    return {"producer": "allocsim import", "framework": framework, "format": fmt, "source_file": source,
            "device": dev, "time_source": time_source}


#: A byte that is not UTF-8, as ``surrogateescape`` reads it (a log is UTF-8 text: JSON and RMM's CSV are).
_UNDECODED = re.compile("[\udc80-\udcff]")


class LineLog:
    """A text log read line by line, each line parsed by the caller.

    Logs written through a buffer (RMM's Python API) lose their tail when the
    process dies, so the last line may be cut short. `each(handle)` calls
    ``handle(text)`` per non-blank line; the handler checks everything before it
    writes anything and reports a defect with `bad(what)`: on an unterminated
    last line that is a warning and the line is dropped, anywhere else it is an
    `InputError` naming the line. Reading is O(1) memory per line.
    """

    def __init__(self, path: str):
        self.path = path
        self.warnings: list[str] = []
        self.dropped_line: int | None = None
        self._cut = False
        self._line = 0
        self._resized: tuple | None = None      # (line, what) of the first free of another size, and the count

    def each(self, handle) -> None:
        try:
            f = open(self.path, encoding="utf-8-sig", errors="surrogateescape", newline="")
        except OSError as e:
            raise InputError(e.strerror or str(e), path=self.path)
        with f:
            for n, line in enumerate(f, 1):
                self._line = n
                self._cut = not line.endswith("\n")
                text = line.rstrip("\r\n")
                if text.strip():
                    try:
                        undecoded = _UNDECODED.search(text)
                        if undecoded:       # (a torn last line is dropped with a warning, as any other defect)
                            self.bad(f"not UTF-8 text (a byte 0x{ord(undecoded.group()) - 0xDC00:02x} at "
                                     f"character {undecoded.start() + 1})")
                        handle(text)
                    except _Dropped:
                        break
        if self._resized:
            line, what, n = self._resized
            self.warnings.append(f"line {line}: {what}" + (f" ({n} frees of another size than their allocation in "
                                                           f"all)" if n > 1 else "")
                                 + "; the allocation's size is the one replayed")

    @property
    def line(self) -> int:
        return self._line

    def error(self, what: str) -> InputError:
        return InputError(what, path=self.path, position=f"line {self._line}")

    def bad(self, what: str):
        """Report a defect in the current line: raises `InputError`, or `_Dropped` for a cut-off last line."""
        if self._cut:
            self.dropped_line = self._line
            self.warnings.append(f"line {self._line}: last line is cut short ({what}); dropped it, kept the rest")
            raise _Dropped
        raise self.error(what)

    def free_of_another_size(self, what: str) -> None:
        """Note a free whose size is not its allocation's (a torn or edited log: the caller must free what it
        allocated); `each` ends by warning of the first, with the count."""
        line, first, n = self._resized or (self._line, what, 0)
        self._resized = (line, first, n + 1)

    def parse_int(self, text: str, what: str, base: int = 10, expect: str = "a whole number") -> int:
        """An integer field: ASCII digits (base 16: with or without 0x), nothing else Python's int() takes (``1_000``,
        ``+1``, other scripts' digits); a negative one or one past 64 bits is refused (sizes, handles, pointers)."""
        if not (_HEX if base == 16 else _DECIMAL).match(text):
            self.bad(f"bad {what} {text!r}: expected {expect}" + (" (hexadecimal)" if base == 16 else ""))
        v = int(text, base) if len(text) <= 40 else 2**64      # int() refuses 4,300 digits: past 64 bits anyway
        if v < 0:
            self.bad(f"negative {what} {v}")
        if v >= 2**64:
            self.bad(f"{what} {text!r} does not fit in 64 bits")
        return v


class _Dropped(Exception):
    """Raised by `LineLog.bad` for a cut-off last line; `LineLog.each` then stops."""
