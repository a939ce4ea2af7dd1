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
import shutil
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
def _write(name, data=b"ALLOCSIM"):
    """A setup that writes ``data`` to ``name`` (folders made as needed)."""
    def setup(d):
        p = os.path.join(d, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
    return setup


def _link(kind):
    """A setup that makes ``link.bin``, a symbolic or hard link to the case's trace."""
    return lambda d: (os.symlink if kind == "sym" else os.link)(os.path.join(d, "t.bin"), os.path.join(d, "link.bin"))


def _copy_fixture(name):
    return lambda d: shutil.copy(os.path.join(ROOT, "tests", "fixtures", name), d)


_TORCH_SCRIPT = _write("train.py", "import torch\n")
_OVER_INPUT = "would overwrite the input"
_OVER_TRACE = "pass --force"

DATA_LOSS: list[Case] = [
    Case("plot-o-input", ["plot", "{trace}", "-p", "none", "-o", "{trace}"], expect=_OVER_INPUT),
    Case("plot-o-input-dot-spelling", ["plot", "{trace}", "-p", "none", "-o", "./t.bin"], expect=_OVER_INPUT),
    Case("compare-csv-input", ["compare", "{trace}", "-p", "none", "--csv", "{trace}"], expect=_OVER_INPUT,
         stdout_empty=True),
    Case("compare-csv-symlink-to-input", ["compare", "{trace}", "-p", "none", "--csv", "{d}/link.bin"],
         setup=_link("sym"), expect=_OVER_INPUT, stdout_empty=True),
    Case("compare-csv-hardlink-to-input", ["compare", "{trace}", "-p", "none", "--csv", "{d}/link.bin"],
         setup=_link("hard"), expect=_OVER_INPUT, stdout_empty=True),
    Case("compare-csv-cost-model", ["compare", "{trace}", "-p", "none", "--cost-model", "{d}/c.json",
                                    "--csv", "{d}/c.json"], setup=_write("c.json", "{}"), expect=_OVER_INPUT),
    Case("compare-csv-other-trace", ["compare", "{trace}", "-p", "none", "--csv", "{d}/o.bin"],
         setup=_write("o.bin"), expect=_OVER_TRACE, stdout_empty=True),
    Case("sweep-o-input-csv", ["sweep", "{trace}", "-p", "none", "-o", "{trace}", "--format", "csv"],
         expect=_OVER_INPUT),
    Case("sweep-o-second-input", ["sweep", "{trace}", "{d}/u.bin", "-p", "none", "-o", "{d}/u.bin",
                                  "--format", "jsonl"], setup=_write("u.bin"), expect=_OVER_INPUT),
    Case("sweep-o-other-trace", ["sweep", "{trace}", "-p", "none", "-o", "{d}/o.bin", "--format", "csv"],
         setup=_write("o.bin"), expect=_OVER_TRACE, outputs=["o.bin.partial"]),
    Case("synth-o-existing-trace", ["synth", "mlp", "-o", "{trace}"], expect=_OVER_TRACE),
    Case("import-o-input", ["import", "{d}/log.csv", "-o", "{d}/log.csv"], setup=_copy_fixture("log.csv"),
         expect=_OVER_INPUT),
    Case("import-o-existing-trace", ["import", "{d}/log.csv", "-o", "{trace}"], setup=_copy_fixture("log.csv"),
         expect=_OVER_TRACE),
    Case("record-o-its-script", ["record", "-o", "{d}/train.py", "{d}/train.py"], setup=_TORCH_SCRIPT,
         expect=_OVER_INPUT),
    Case("record-o-the-programs-input", ["record", "-o", "{d}/data.npy", "{d}/train.py", "--data={d}/data.npy"],
         setup=lambda d: (_TORCH_SCRIPT(d), _write("data.npy", b"\x93NUMPY")(d)), expect=_OVER_INPUT),
    Case("record-o-existing-trace", ["record", "-o", "{trace}", "{d}/train.py"], setup=_TORCH_SCRIPT,
         expect=_OVER_TRACE),
    Case("record-stats-over-trace", ["record", "-o", "{d}/r", "{d}/train.py"],
         setup=lambda d: (_TORCH_SCRIPT(d), _write("r.stats.json")(d)), expect=_OVER_TRACE, outputs=["r"]),
    Case("calibrate-o-trace", ["calibrate", "-o", "{trace}"], expect=_OVER_TRACE),
    Case("plot-report-over-input", ["plot", "{d}/rep/memory.png", "-p", "none", "--report", "{d}/rep"],
         setup=lambda d: (os.mkdir(os.path.join(d, "rep")), shutil.copy(os.path.join(d, "t.bin"),
                                                                         os.path.join(d, "rep", "memory.png"))),
         expect=_OVER_INPUT),
    Case("plot-report-over-trace", ["plot", "{trace}", "-p", "none", "--report", "{d}/rep"],
         setup=_write("rep/gc.png"), expect=_OVER_TRACE),
    Case("plot-report-foreign-index", ["plot", "{trace}", "-p", "none", "--report", "{d}/rep"],
         setup=_write("rep/index.html", "<html>my notes</html>"), expect="not an allocsim report",
         outputs=["rep/memory.png"]),
    Case("compare-csv-empty-name", ["compare", "{trace}", "-p", "none", "--csv", ""], expect="file name is empty",
         stdout_empty=True),
    Case("sweep-o-empty-name", ["sweep", "{trace}", "-p", "none", "-o", "", "--format", "csv"],
         expect="file name is empty"),
    Case("plot-o-under-a-file", ["plot", "{trace}", "-p", "none", "-o", "{trace}/x.png"], expect="is a file"),
    Case("compare-csv-to-a-device", ["compare", "{trace}", "-p", "none", "--csv", os.devnull],
         expect="not a file", stdout_empty=True),
    Case("info-device-not-file", ["info", os.devnull], expect="not a file"),
    Case("import-device-not-file", ["import", os.devnull, "-o", "{d}/x.bin"], expect="not a file",
         outputs=["x.bin"]),
    Case("plot-report-is-a-file", ["plot", "{trace}", "-p", "none", "--report", "{trace}"],
         expect="not a folder"),
]


# ---------------------------------------------------------------------------------------------
# malformed files: header, metadata, footer, import formats
MALFORMED: list[Case] = [
]


# ---------------------------------------------------------------------------------------------
# nonsense options accepted silently before
NONSENSE: list[Case] = [
    Case("unknown-policy", ["replay", "{trace}", "--policy", "nosuch"], expect="nosuch"),
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
