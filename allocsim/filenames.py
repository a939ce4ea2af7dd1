"""File names as text: a name the file system allows but UTF-8 cannot spell.

On POSIX a file name is bytes; Python hands a name that is not valid UTF-8
(``tr\\xffce.bin``) over as a str holding lone surrogates, which no UTF-8 file,
picture or terminal can take (``UnicodeEncodeError``). `shown_name` is the one
place a file name becomes text for output (CSV and JSON fields, text reports,
plot titles, error lines): valid UTF-8 is kept as it is, each undecodable byte
is written ``\\xNN``, as Python writes it. `printable` writes control characters so too
(a name or a trace's metadata holding ESC sequences would otherwise drive the terminal
that shows the report).
"""
from __future__ import annotations

import codecs
import io
import os
import re
import sys


def shown_name(path: str | None) -> str | None:
    """``path`` as printable text: its undecodable bytes and control characters as ``\\xNN`` (None stays None)."""
    if path is None:
        return None
    return printable(os.fsencode(path).decode("utf-8", "backslashreplace"), keep="")


#: The control characters (C0, DEL, C1) `printable` writes as escapes: a terminal acts on them.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(text: str, keep: str = "\n") -> str:
    """``text`` with its control characters but those in ``keep`` (the line breaks of a report) written
    ``\\xNN``: text read from a trace (a device name, a command line, a label) shown on a terminal cannot clear
    it, retitle it or move its cursor."""
    return _CONTROLS.sub(lambda m: m.group() if m.group() in keep else f"\\x{ord(m.group()):02x}", text)


#: The longest error or warning line the command line prints whole (`clipped`).
LINE_MOST = 1000


def clipped(text: str, most: int = LINE_MOST) -> str:
    """``text`` cut in its middle to about ``most`` characters: an error line quotes what it read (a CSV field, a
    metadata value), which a hostile or broken input can make 200,000 characters long; its start (file, position)
    and end (what was expected) stay."""
    if len(text) <= most:
        return text
    head, tail = most * 3 // 4, most // 4
    return f"{text[:head]} ... ({len(text) - head - tail:,} characters left out) ... {text[-tail:]}"


def let_stdout_write_names() -> None:
    """Let stdout write any file name and any report: the messages naming an output (``sweep: 12 rows ->
    o\\xff.csv``) print the name as given, and a report's own characters (``μs``, a table's rule, a device's
    name) go to a stdout that cannot encode them (``LC_ALL=C`` without Python's UTF-8 mode, ``PYTHONIOENCODING=ascii``)
    in ASCII (`_IN_ASCII`: ``us``, ``-``; others as ``\\uNNNN``), where they raised `UnicodeEncodeError` after the
    work was done (exit 1). A name's undecodable bytes go out as they came in, as ``ls`` prints them
    (`_writes_anything`)."""
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper) and out.errors in ("strict", "surrogateescape"):
        out.reconfigure(errors=_WRITES_ANYTHING)


def _writes_anything(e: UnicodeEncodeError):
    """The encoding error handler stdout writes with: an undecodable byte of a name (a lone surrogate
    ``\\udc80``-``\\udcff``) as the byte itself, a character `_IN_ASCII` spells so, any other the encoding lacks
    as Python's escape."""
    out = bytearray()
    for c in e.object[e.start:e.end]:       # (character by character: a name's byte may stand beside a "μ")
        if "\udc80" <= c <= "\udcff":
            out.append(ord(c) - 0xDC00)
        else:
            ascii_ = _IN_ASCII.get(c)
            out += ascii_.encode() if ascii_ is not None else c.encode("ascii", "backslashreplace")
    return bytes(out), e.end


#: Characters of the reports and messages (and a few like them) as ASCII spells them (a table's rule stays a rule,
#: ``μs`` reads ``us``).
_IN_ASCII = {"─": "-", "—": "--", "–": "-", "−": "-", "µ": "u", "μ": "u", "×": "x", "…": "...", "≥": ">=",
             "≤": "<=", "·": ".", "→": "->", "²": "^2"}


_WRITES_ANYTHING = "allocsim-writes-anything"
codecs.register_error(_WRITES_ANYTHING, _writes_anything)
