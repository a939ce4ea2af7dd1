"""Hostile input, table-driven: every careless or malformed input gets one line.

Each case builds its inputs in a fresh directory, runs ``allocsim ARGV`` and
checks what the project promises for bad input: the expected exit status, one
line on stderr naming the problem (``expect`` is a substring of it), no
traceback, every input file's bytes unchanged, and no output file left behind
(``outputs`` lists the names that must not exist afterwards unless they
existed before).

A case is ``Case(id, argv, setup=..., status=2, expect=..., outputs=...)``;
``argv`` may use ``{d}`` for the case's directory and ``{trace}`` for a small
valid trace written there by default. ``setup(d)`` may write more files.
Cases are grouped by the class of problem; add a row to the right group.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable

import pytest

from conftest import ROOT, random_trace


@dataclass
class Case:
    id: str
    argv: list
    setup: Callable | None = None
    status: int = 2
    expect: str = ""
    outputs: list = field(default_factory=list)
    stdout_empty: bool = False     # an error must not also print a partial report
    subprocess: bool = False       # run in a child process (signals, pipes, --version)


def _digest(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _run(argv, cwd, *, child):
    if child:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, "-m", "allocsim", *argv], capture_output=True, text=True, cwd=cwd,
                           env=env, timeout=120)
        return p.returncode, p.stdout, p.stderr
    import contextlib
    import io

    from allocsim.cli import main
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as e:         # argparse's own exits
                status = e.code if isinstance(e.code, int) else 2
    finally:
        os.chdir(old)
    return status, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------------------------
# data loss: outputs never replace an input, nor a trace without --force
DATA_LOSS: list[Case] = [
]


# ---------------------------------------------------------------------------------------------
# malformed files: header, metadata, footer, import formats
MALFORMED: list[Case] = [
]


# ---------------------------------------------------------------------------------------------
# nonsense options accepted silently before
NONSENSE: list[Case] = [
    Case("unknown-policy", ["replay", "{trace}", "--policy", "nosuch"], expect="nosuch"),
    Case("gc-every-zero", ["replay", "{trace}", "--runtime", "gc", "--gc-every", "0"], expect="--gc-every"),
    Case("fit-negative-max-replays", ["fit", "{trace}", "--policies", "none", "--max-replays", "-1"],
         expect="--max-replays"),
    Case("compare-gc-every-zero", ["compare", "{trace}", "--policies", "none", "--gc-every", "0B"],
         expect="--gc-every"),
]


# ---------------------------------------------------------------------------------------------
# plots and reports
REPORTS: list[Case] = [
]


CASES = DATA_LOSS + MALFORMED + NONSENSE + REPORTS


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile(case, tmp_path):
    d = str(tmp_path)
    trace = os.path.join(d, "t.bin")
    random_trace(400, seed=7, marks_every=100).save(trace)
    if case.setup:
        case.setup(d)
    before = _digest(d)
    argv = [a.format(d=d, trace=trace) for a in case.argv]
    status, out, err = _run(argv, d, child=case.subprocess)
    assert status == case.status, (status, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    assert case.expect in lines[0], lines[0]
    if case.stdout_empty:
        assert out == "", out
    after = _digest(d)
    for name, h in before.items():
        assert after.get(name) == h, f"input {name} changed or vanished"
    for name in case.outputs:
        assert name in before or name not in after, f"output {name} left behind"
    leftovers = [n for n in after if n not in before and ".tmp" in n]
    assert not leftovers, leftovers


def test_table_is_not_empty():
    assert len(CASES) >= 1
