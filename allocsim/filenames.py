"""File names as text: a name the file system allows but UTF-8 cannot spell.

On POSIX a file name is bytes; Python hands a name that is not valid UTF-8
(``tr\\xffce.bin``) over as a str holding lone surrogates, which no UTF-8 file,
picture or terminal can take (``UnicodeEncodeError``). `shown_name` is the one
place a file name becomes text for output (CSV and JSON fields, text reports,
plot titles, error lines): valid UTF-8 is kept as it is, each undecodable byte
is written ``\\xNN``, as Python writes it.
"""
from __future__ import annotations

import io
import os
import sys


def shown_name(path: str | None) -> str | None:
    """``path`` as printable text: its undecodable bytes as ``\\xNN`` (None stays None)."""
    if path is None:
        return None
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def let_stdout_write_names() -> None:
    """Let stdout write any file name: the messages naming an output (``sweep: 12 rows -> o\\xff.csv``)
    print the name as given. Python already does so under the C locale; under a UTF-8 one its stdout
    is strict and would raise `UnicodeEncodeError` after the work is done. A name's undecodable bytes
    go out as they came in (``surrogateescape``), as ``ls`` prints them."""
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper) and out.errors == "strict":
        out.reconfigure(errors="surrogateescape")
