"""Setup helpers of the MALFORMED and NONSENSE rows of `test_hostile`: each returns ``setup(d)``
writing one malformed file into the case's directory."""
from __future__ import annotations

import json
import os
import pickle

import numpy as np

from allocsim.trace.events import NO_ID, NO_SITE, RECORD_DTYPE
from allocsim.trace.format import TraceFileWriter
from conftest import ROOT, random_trace

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
DEEP = "[" * 100_000        # JSON nested past Python's recursion limit


def trace_with(meta=None, footer=None, *, name="bad.bin", streams=1, nested: str | None = None,
               long_number: str | None = None):
    """A small valid trace whose metadata and footer are replaced (``footer`` keys update the real one).

    ``nested="metadata"`` or ``"footer"`` then overwrites that JSON with ``[[[...``, nested
    past Python's recursion limit, keeping every length and offset as it was; ``long_number`` so
    gives that JSON a number of 100,002 digits (past what Python converts to an int).
    """
    def setup(d):
        t = random_trace(60, seed=2, streams=streams)
        path = os.path.join(d, name)
        m = {"pad": "x" * 100_000} if "metadata" in (nested, long_number) else meta or {}
        foot = {**t._footer(), **(footer or {})}
        if "footer" in (nested, long_number):
            foot["pad"] = "x" * 100_000
        w = TraceFileWriter(path, m)
        w.write(t.records)
        w.close(foot)
        if long_number:
            with open(path, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(data.replace(b'"' + b"x" * 100_000 + b'"', b"9" * 100_002))
        if nested:
            start = 64 if nested == "metadata" else os.path.getsize(path) - len(json.dumps(foot, sort_keys=True))
            length = len(json.dumps(m if nested == "metadata" else foot, sort_keys=True))
            with open(path, "r+b") as f:
                f.seek(start)
                f.write(b"[" * length)
    return setup


def text_file(name: str, text: str | bytes):
    def setup(d):
        with open(os.path.join(d, name), "wb") as f:
            f.write(text.encode() if isinstance(text, str) else text)
    return setup


def snapshot_with(edit):
    """The fixture snapshot pickle after ``edit(snapshot)`` changed it."""
    def setup(d):
        with open(os.path.join(FIXTURES, "snapshot.pickle"), "rb") as f:
            snap = pickle.load(f)
        edit(snap)
        with open(os.path.join(d, "snap.pickle"), "wb") as f:
            pickle.dump(snap, f, protocol=2)
    return setup


def fixture_line(name: str, line: int, text: str):
    """Fixture ``name`` with its line ``line`` (1-based) replaced by ``text``."""
    with open(os.path.join(FIXTURES, name)) as f:
        lines = f.read().splitlines()
    lines[line - 1] = text
    return text_file(name, "\n".join(lines) + "\n")


def trace_events(*events, name="bad.bin", meta=None, footer=None):
    """A small valid trace with ``events`` appended: each a dict of `RECORD_DTYPE` fields (``kind`` at least;
    ``id`` and ``site`` default to none). ``footer`` keys update the real footer."""
    def setup(d):
        t = random_trace(60, seed=2)
        extra = np.zeros(len(events), RECORD_DTYPE)
        extra["id"], extra["site"] = NO_ID, NO_SITE
        for row, fields in zip(extra, events):
            for k, v in fields.items():
                row[k] = v
        w = TraceFileWriter(os.path.join(d, name), meta or {})
        w.write(np.concatenate([np.asarray(t.records), extra]))
        w.close({**t._footer(), **(footer or {})})
    return setup
