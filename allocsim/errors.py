"""Errors that reach the user as one line and exit status 2.

`InputError` names the file, the position in it (event index, row, line or byte
offset) and what is wrong. The CLI prints ``allocsim: <file>: <position>: <what>``
and exits 2; the traceback is shown only with ``--debug``.
"""
from __future__ import annotations

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


class GPUUnavailable(AllocsimError):
    """A GPU feature was asked for on a machine (or install) that cannot serve it."""
