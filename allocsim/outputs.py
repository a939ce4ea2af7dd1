"""Output files that appear whole or not at all."""
from __future__ import annotations

import os
from contextlib import contextmanager


@contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside ``path``; rename it to ``path`` only if the block succeeds."""
    d = os.path.dirname(os.path.abspath(path))
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
