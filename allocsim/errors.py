"""Errors that reach the user as one line and exit status 2.

`InputError` names the file, the position in it (event index, row, line or byte
offset) and what is wrong. The CLI prints ``allocsim: <file>: <position>: <what>``
and exits 2; the traceback is shown only with ``--debug``.
"""
from __future__ import annotations

import difflib
import json
import sys

from .filenames import shown_name


class AllocsimError(Exception):
    """Base class of the errors allocsim reports as one line."""

    exit_status = 2


class InputError(AllocsimError):
    """A malformed input: trace, CSV, pickle, JSONL, cost model, option or size."""

    def __init__(self, what: str, *, path: str | None = None, position: str | None = None):
        self.what = what
        self.path = path
        self.position = position
        super().__init__(self.line())

    def line(self) -> str:
        parts = [p for p in (shown_name(self.path), self.position) if p]
        return ": ".join(parts + [self.what])


class UsageError(AllocsimError):
    """A bad command line: unknown policy, unknown option, bad value."""


class PluginError(AllocsimError):
    """A plug-in policy's own code raised: one line naming the plug-in and the exception."""


class WorkerDied(AllocsimError):
    """A worker process of a local pool (``-j N``) died before it answered: one line, not the pool's traceback."""


class GPUUnavailable(AllocsimError):
    """A GPU feature was asked for on a machine (or install) that cannot serve it."""


def json_why(e: Exception) -> str:
    """What is wrong with a JSON text that `json.loads` refused, in the user's words: its own message for a syntax
    error, and for what Python raises beyond `json.JSONDecodeError` -- nesting past the interpreter's stack, bytes
    that are not UTF-8, an integer of more digits than Python converts (`sys.get_int_max_str_digits`: a
    ``ValueError`` a caller catching only the first two let through as a traceback)."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    if isinstance(e, UnicodeDecodeError):       # (where: the caller's position, which knows the text's offset)
        return f"not UTF-8 text ({e.reason})"
    if isinstance(e, ValueError) and not isinstance(e, json.JSONDecodeError) and "digits" in str(e):
        most = getattr(sys, "get_int_max_str_digits", lambda: 4300)()     # (Python 3.10.7 and later)
        return f"a number of more than {most} digits"
    return str(e)


def closest(word: str, known) -> str | None:
    """The one of ``known`` that ``word`` was most likely meant to be, for a refusal's "did you mean": the same
    letters in another case first (``Torch``), then the nearest spelling (`difflib.get_close_matches`, ``trch``);
    None where nothing is near."""
    known = list(known)
    same = [k for k in known if k.lower() == word.lower()]
    near = same or difflib.get_close_matches(word, known, n=1)
    return near[0] if near else None
