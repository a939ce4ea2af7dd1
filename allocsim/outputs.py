"""Output files that appear whole or not at all."""
from __future__ import annotations

import os
from contextlib import contextmanager

from .errors import InputError


def check_writable(path: str) -> str:
    """Raise `InputError` now if ``path`` cannot be written; return its directory."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise InputError("cannot write: its directory does not exist", path=path)
    if not os.access(d, os.W_OK):
        raise InputError("cannot write: its directory is not writable", path=path)
    if os.path.isdir(path):
        raise InputError("cannot write: it is a directory", path=path)
    return d


@contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds."""
    d = check_writable(path)
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_open(path: str, mode: str = "w"):
    """Open a temporary file beside ``path``; it becomes ``path`` only if the block succeeds."""
    with atomic_path(path) as tmp:
        with open(tmp, mode) as f:
            yield f
