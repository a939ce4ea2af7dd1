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

import gzip
import hashlib
import json
import lzma
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Callable

import pytest

from conftest import ROOT, random_trace

from allocsim.commands.sweep import PARTIAL_MARK  # noqa: E402


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
    stderr_lines: int = 1          # 0 for a careless input that must simply work (with status 0)
    then: Callable | None = None   # then(d, stdout): checks what a case that works wrote
    stdout_json: bool = False      # stdout must be one JSON document (what a program reads from --json)
    env: dict | None = None        # environment variables set for the case (it then runs in a child process)
    room: int | None = None        # a disk that fills: no file may grow past this many bytes, stdout to a file
    stdout_closed: bool = False    # started with stdout closed (>&-), in a child process


def _digest(d):
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.isfile(p):       # a FIFO a case made: reading it would wait forever
                continue
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def _run(argv, cwd, *, child, env=None, room=None, stdout_closed=False):
    if child or env or room or stdout_closed:
        env = dict(os.environ, **(env or {}), PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with tempfile.TemporaryFile() as out:
            p = subprocess.run([sys.executable, "-m", "allocsim", *argv], stdout=out if room else subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=cwd, env=env, timeout=120,
                               errors="surrogateescape",      # a file name's bytes, as printed
                               preexec_fn=_limited(room, stdout_closed) if room or stdout_closed else None)
            out.seek(0)
            return p.returncode, out.read().decode() if room else p.stdout, p.stderr
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


def _limited(room, stdout_closed):
    """What the child does before it starts allocsim: a disk with ``room`` bytes left (RLIMIT_FSIZE: a write past
    it is cut short, the next fails, as on a disk that fills), a stdout closed (``>&-``)."""
    def limit():
        if room:
            import resource
            resource.setrlimit(resource.RLIMIT_FSIZE, (room, room))
        if stdout_closed:
            os.close(1)
    return limit


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
    Case("synth-o-dash", ["synth", "mlp", "-o", "-"], expect="-: cannot write: allocsim does not take - for standard",
         outputs=["-"]),
    Case("compare-csv-dash", ["compare", "{trace}", "-p", "none", "--csv", "-"], expect="does not take -",
         outputs=["-"], stdout_empty=True),
    Case("info-dash", ["info", "-"], expect="-: cannot read: allocsim does not take - for standard input"),
    Case("info-device-not-file", ["info", os.devnull], expect="not a file"),
    Case("import-device-not-file", ["import", os.devnull, "-o", "{d}/x.bin"], expect="not a file",
         outputs=["x.bin"]),
    Case("plot-report-is-a-file", ["plot", "{trace}", "-p", "none", "--report", "{trace}"],
         expect="not a folder"),
    Case("replay-snapshot-input", ["replay", "{d}/t.pkl", "-p", "torch", "--snapshot", "{d}/t.pkl"],
         lambda d: shutil.copy(os.path.join(d, "t.bin"), os.path.join(d, "t.pkl")), expect=_OVER_INPUT,
         stdout_empty=True),            # (a name ending in .bin is refused by its name first: HUNT_51)
    Case("replay-snapshot-over-trace", ["replay", "{trace}", "-p", "torch", "--snapshot", "{d}/old.pickle"],
         setup=_write("old.pickle"), expect=_OVER_TRACE, stdout_empty=True),
    Case("replay-snapshot-dir-missing", ["replay", "{trace}", "-p", "torch", "--snapshot", "{d}/no/s.pickle"],
         expect="does not exist", stdout_empty=True),
]


# ---------------------------------------------------------------------------------------------
# malformed files: header, metadata, footer, import formats
from hostile_files import DEEP, FIXTURES, fixture_line, snapshot_with, text_file, trace_with  # noqa: E402

EXAMPLE_POLICIES = os.path.join(ROOT, "examples", "policies")


def _plugin(raising: str):
    """A setup writing ``p.py``: a first-fit plug-in whose method ``raising`` raises RuntimeError('boom')."""
    return text_file("p.py", f"import sys\nsys.path.append({EXAMPLE_POLICIES!r})\nfrom first_fit import FirstFit\n"
                             f"class Pool(FirstFit):\n    def {raising}(self, *a, **k): raise RuntimeError('boom')\n")


_COSTS = '{"malloc_points": [[0, 1e-6], [1073741824, 1e-3]], "pool_hit_s": %s}'
_ROW = {"cell": "x", "policy": "split"}
_MARK = PARTIAL_MARK.decode()       # what a sweep's partial table starts with

MALFORMED: list[Case] = [
    Case("meta-total-memory-string-info", ["info", "{d}/bad.bin"], trace_with({"device": {"total_memory": "lots"}}),
         expect="bad.bin: metadata: device.total_memory: expected a size in bytes", stdout_empty=True),
    Case("meta-total-memory-string-replay", ["replay", "{d}/bad.bin"],
         trace_with({"device": {"total_memory": "lots"}}), expect="metadata: device.total_memory", stdout_empty=True),
    Case("meta-total-memory-negative", ["replay", "{d}/bad.bin"], trace_with({"device": {"total_memory": -5}}),
         expect="metadata: device.total_memory", stdout_empty=True),
    Case("meta-total-memory-zero", ["compare", "{d}/bad.bin", "-j", "1"], trace_with({"device": {"total_memory": 0}}),
         expect="metadata: device.total_memory", stdout_empty=True),
    Case("meta-total-memory-true", ["fit", "{d}/bad.bin", "-j", "1"], trace_with({"device": {"total_memory": True}}),
         expect="got True", stdout_empty=True),
    Case("meta-rank-negative", ["info", "{d}/bad.bin"], trace_with({"rank": -1}),
         expect="bad.bin: metadata: rank: expected an integer >= 0, got -1", stdout_empty=True),
    Case("meta-world-size-zero", ["validate", "{d}/bad.bin"], trace_with({"framework": "torch", "world_size": 0}),
         expect="metadata: world_size: expected an integer >= 1", stdout_empty=True),
    Case("meta-outside-string-tune", ["tune", "{d}/bad.bin"], trace_with({"device_memory": {"outside_peak": "1GB"}}),
         expect="metadata: device_memory.outside_peak: expected a size in bytes", stdout_empty=True),
    Case("meta-device-memory-end-negative", ["info", "{d}/run.bin"],
         lambda d: [trace_with({"rank": r, "device_memory": {"end": {"free": -r}}}, name=f"run.rank{r}.bin")(d)
                    for r in (0, 1)],
         expect="run.rank1.bin: metadata: device_memory.end.free", stdout_empty=True),
    Case("footer-meta-not-object", ["info", "{d}/bad.bin"], trace_with(footer={"meta": [1]}),
         expect="footer: meta: expected a JSON object", stdout_empty=True),
    Case("footer-meta-rank-string", ["replay", "{d}/bad.bin"], trace_with(footer={"meta": {"rank": "one"}}),
         expect="metadata: rank: expected an integer >= 0, got 'one'", stdout_empty=True),
    Case("meta-device-not-object", ["replay", "{d}/bad.bin"], trace_with({"device": "H100"}),
         expect="metadata: device: expected a JSON object"),
    Case("meta-framework-number", ["validate", "{d}/bad.bin"], trace_with({"framework": 5}),
         expect="metadata: framework: expected a string"),
    Case("meta-allocator-settings-list", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with({"framework": "torch", "allocator_settings": [1]}), expect="metadata: allocator_settings"),
    Case("meta-allocator-settings-infinite", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with({"allocator_settings": {"max_split_size": 1e999}}), expect="allocator_settings"),
    Case("meta-initial-segment-size", ["validate", "{d}/bad.bin"],
         trace_with({"framework": "torch", "initial_segments": [{"total_size": "big"}]}),
         expect="metadata: initial_segments[0].total_size"),
    Case("meta-initial-segment-not-object", ["info", "{d}/bad.bin"], trace_with({"initial_segments": [{}, 3]}),
         expect="metadata: initial_segments[1]: expected a JSON object, got 3"),
    Case("meta-nested-too-deeply", ["info", "{d}/bad.bin"], trace_with(nested="metadata"),
         expect="metadata is not valid JSON (nested too deeply)"),
    Case("footer-nested-too-deeply", ["replay", "{d}/bad.bin"], trace_with(nested="footer"),
         expect="footer is not valid JSON (nested too deeply)"),
    Case("footer-fewer-streams", ["replay", "{d}/bad.bin"], trace_with(footer={"streams": [0]}, streams=3),
         expect="stream index 1 is beyond the footer's table of 1 streams"),
    Case("footer-streams-not-a-list", ["info", "{d}/bad.bin"], trace_with(footer={"streams": False}),
         expect="footer: streams: expected a non-empty list"),
    Case("footer-streams-strings", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with(footer={"streams": ["a", "b"]}), expect="footer: streams"),
    Case("footer-stream-twice", ["info", "{d}/bad.bin"], trace_with(footer={"streams": [7, 7]}),
         expect="a stream is named twice"),
    Case("footer-labels-numbers", ["info", "{d}/bad.bin"], trace_with(footer={"labels": [1, 2]}),
         expect="footer: labels: expected a list of strings"),
    Case("cupy-jsonl-nested-too-deeply", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin", "--format", "cupy"],
         text_file("hooks.jsonl", DEEP + "\n"), expect="hooks.jsonl: line 1: bad JSON (nested too deeply)",
         outputs=["o.bin"]),
    Case("cupy-jsonl-nested-second-line", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin"],
         fixture_line("hooks.jsonl", 2, '{"a":' * 100_000), expect="hooks.jsonl: line 2: bad JSON",
         outputs=["o.bin"]),
    Case("cupy-jsonl-hook-list", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin"],
         fixture_line("hooks.jsonl", 2, '{"hook": ["malloc"]}'), expect="line 2: unknown hook", outputs=["o.bin"]),
    Case("rmm-csv-negative-pointer", ["import", "{d}/log.csv", "-o", "{d}/o.bin"],
         fixture_line("log.csv", 2, "1,23:59:59.100000,allocate,-0x10,256,0"), expect="line 2: negative pointer",
         outputs=["o.bin"]),
    Case("rmm-csv-pointer-past-64-bits", ["import", "{d}/log.csv", "-o", "{d}/o.bin"],
         fixture_line("log.csv", 2, "1,23:59:59.100000,allocate,0x1ffffffffffffffff,256,0"),
         expect="log.csv: line 2: pointer '0x1ffffffffffffffff' does not fit in 64 bits", outputs=["o.bin"]),
    Case("rmm-csv-negative-stream", ["import", "{d}/log.csv", "-o", "{d}/o.bin"],
         fixture_line("log.csv", 2, "1,23:59:59.100000,allocate,0x10,256,-1"), expect="line 2: negative stream",
         outputs=["o.bin"]),
    Case("rmm-csv-too-many-streams", ["import", "{d}/log.csv", "-o", "{d}/o.bin"],
         text_file("log.csv", "Thread,Time,Action,Pointer,Size,Stream\n" + "".join(
             f"1,10:00:00.{i:06d},allocate,{16 * (i + 1):#x},16,{i:#x}\n" for i in range(66_000))),
         expect="log.csv: cannot be a trace: more than 65535 streams", outputs=["o.bin"]),
    Case("import-empty-file", ["import", "{d}/log.csv", "-o", "{d}/o.bin"], text_file("log.csv", ""),
         expect="log.csv: byte 0: the file is empty; nothing to import", outputs=["o.bin"]),
    Case("import-csv-header-only", ["import", "{d}/log.csv", "-o", "{d}/o.bin"],
         text_file("log.csv", "Thread,Time,Action,Pointer,Size,Stream\n"),
         expect="log.csv: holds no allocation events; nothing to import", outputs=["o.bin"]),
    Case("import-jsonl-empty-as-cupy", ["import", "{d}/h.jsonl", "-o", "{d}/o.bin", "--format", "cupy"],
         text_file("h.jsonl", "\n"), expect="h.jsonl: holds no allocation events", outputs=["o.bin"]),
    Case("torch-snapshot-time-infinite", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["device_traces"][0][1].update(time_us=float("inf"))),
         expect="snap.pickle: device_traces[0][1]: time_us is inf", outputs=["o.bin"]),
    Case("torch-snapshot-action-list", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["device_traces"][0][1].update(action=["alloc"])),
         expect="device_traces[0][1]: action is ['alloc']", outputs=["o.bin"]),
    Case("torch-snapshot-settings", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["allocator_settings"].update(max_split_size="big")),
         expect="snap.pickle: metadata: allocator_settings", outputs=["o.bin"]),
    Case("cost-model-true", ["replay", "{trace}", "--cost-model", "{d}/c.json"], text_file("c.json", _COSTS % "true"),
         expect="c.json: key 'pool_hit_s': expected a number of seconds from 0 to 3600", stdout_empty=True),
    Case("cost-model-infinite", ["replay", "{trace}", "--cost-model", "{d}/c.json"],
         text_file("c.json", _COSTS % "1e999"), expect="key 'pool_hit_s'"),
    Case("cost-model-nested", ["compare", "{trace}", "--cost-model", "{d}/c.json"], text_file("c.json", DEEP),
         expect="c.json: line 1: not valid JSON: nested too deeply"),
    Case("cost-model-binary", ["fit", "{trace}", "--cost-model", "{d}/c.json"], text_file("c.json", b"\xff\xfe{}"),
         expect="c.json: byte 0: not UTF-8"),
    Case("sweep-partial-foreign-row", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o", "{d}/r.csv"],
         text_file("r.csv.partial", _MARK + json.dumps(_ROW) + "\n"),
         expect="r.csv.partial: line 2: not a row of this sweep",
         outputs=["r.csv"]),
    Case("sweep-partial-row-list", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o", "{d}/r.csv"],
         text_file("r.csv.partial", _MARK + "[1, 2]\n[3]\n"), expect="line 2: not a row of this sweep",
         outputs=["r.csv"]),
    Case("plugin-raises-in-init", ["replay", "{trace}", "-p", "./p.py:Pool"], _plugin("__init__"),
         expect="policy './p.py:Pool' failed while being set up: RuntimeError: boom (raised at", stdout_empty=True),
    Case("plugin-malloc-raises-replay", ["replay", "{trace}", "-p", "p.py:Pool"], _plugin("malloc"),
         expect="policy 'p.py:Pool' failed while replaying: RuntimeError: boom", stdout_empty=True),
    Case("plugin-malloc-raises-compare-workers", ["compare", "{trace}", "-p", "split,p.py:Pool", "-j", "2"],
         _plugin("malloc"), expect="p.py:5); --debug shows the traceback", stdout_empty=True, subprocess=True),
    Case("plugin-free-raises-fit", ["fit", "{trace}", "-p", "p.py:Pool", "-j", "1"], _plugin("free"),
         expect="failed while replaying: RuntimeError: boom"),
    Case("plugin-malloc-raises-sweep", ["sweep", "{trace}", "-p", "p.py:Pool", "-j", "1", "-o", "{d}/r.csv"],
         _plugin("malloc"), expect="failed while replaying", outputs=["r.csv", "r.csv.partial"]),
]


# ---------------------------------------------------------------------------------------------
# nonsense options accepted silently before
_HOOKS = os.path.join(ROOT, "tests", "fixtures", "hooks.jsonl")
_HOOK_LINES = pathlib.Path(_HOOKS).read_text().splitlines()
_SYNTH = ["synth", "-o", "{d}/s.bin"]

NONSENSE: list[Case] = [
    Case("unknown-policy", ["replay", "{trace}", "--policy", "nosuch"], expect="nosuch"),
    Case("policy-misspelled", ["replay", "{trace}", "--policy", "trch"], stdout_empty=True,
         expect="allocsim: unknown policy 'trch': did you mean 'torch'? (known: bestfit, "),
    Case("policy-in-capitals", ["compare", "{trace}", "--policies", "split,Torch"],
         expect="allocsim: unknown policy 'Torch': did you mean 'torch'? (known: bestfit, "),
    Case("jobs-zero", ["compare", "{trace}", "-j", "0"], expect="-j/--jobs: expected a positive integer, got 0"),
    Case("jobs-negative", ["fit", "{trace}", "-j", "-3"], expect="expected a positive integer, got -3"),
    Case("jobs-not-a-number", ["plot", "{trace}", "-j", "many", "-o", "{d}/p.png"], expect="got 'many'",
         outputs=["p.png"]),
    Case("jobs-zero-sweep", ["sweep", "{trace}", "-j", "0", "-o", "{d}/r.csv"], expect="-j/--jobs",
         outputs=["r.csv", "r.csv.partial"]),
    Case("jobs-capped-at-cores", ["compare", "{trace}", "-p", "split", "-j", "1000"], status=0,
         expect="note: -j 1000 is more than the"),
    Case("dask-local-zero", ["sweep", "{trace}", "--dask-local", "0", "-o", "{d}/r.csv"],
         expect="--dask-local: expected a positive integer, got 0", outputs=["r.csv", "r.csv.partial"]),
    Case("dask-local-negative", ["sweep", "{trace}", "--dask-local", "-2", "-o", "{d}/r.csv"],
         expect="--dask-local", outputs=["r.csv", "r.csv.partial"]),
    Case("policies-comma", ["compare", "{trace}", "--policies", ","], expect="--policies: empty list"),
    Case("policies-empty", ["fit", "{trace}", "--policies", ""], expect="--policies: empty list"),
    Case("policies-empty-plot", ["plot", "{trace}", "--policies", "", "-o", "{d}/p.png"], expect="--policies: empty",
         outputs=["p.png"]),
    Case("policies-twice", ["compare", "{trace}", "--policies", "split,torch,split"],
         expect="--policies: split is named twice"),
    Case("caps-empty", ["compare", "{trace}", "--caps", ""], expect="--caps: empty list"),
    Case("caps-same-size-twice", ["compare", "{trace}", "--caps", "4GB,none,4000MB"],
         expect="--caps: 4000MB is named twice"),
    Case("caps-zero", ["plot", "{trace}", "--caps", "0", "-o", "{d}/p.png"], expect="--caps: expected at least 1 byte",
         outputs=["p.png"]),
    Case("runtime-twice", ["compare", "{trace}", "--runtime", "gc,eager,gc"], expect="--runtime: gc is named twice"),
    Case("sweep-trace-twice", ["sweep", "{trace}", "{d}/./t.bin", "-o", "{d}/r.csv"], expect="is named twice",
         outputs=["r.csv", "r.csv.partial"]),
    Case("gc-every-zero", ["replay", "{trace}", "--runtime", "gc", "--gc-every", "0"],
         expect="--gc-every: expected at least 1 byte", stdout_empty=True),
    Case("gc-every-negative", ["compare", "{trace}", "--runtime", "gc", "--gc-every", "-5MB"], expect="--gc-every"),
    Case("capacity-zero", ["replay", "{trace}", "--capacity", "0"], expect="--capacity: expected at least 1 byte",
         stdout_empty=True),
    Case("capacity-negative", ["validate", "{trace}", "--capacity", "-1GB"], expect="--capacity"),
    Case("capacity-past-1-pib", ["replay", "{trace}", "--capacity", "2PB"], expect="at most 1 PiB"),
    Case("cap-zero", ["replay", "{trace}", "--cap", "0"], expect="--cap: expected at least 1 byte"),
    Case("cap-above-capacity", ["replay", "{trace}", "--capacity", "1GB", "--cap", "2GB"],
         expect="--cap 1.86 GiB is larger than --capacity 953.67 MiB"),
    Case("caps-above-capacity", ["compare", "{trace}", "--capacity", "1GB", "--caps", "none,2GB"],
         expect="--caps 1.86 GiB is larger than --capacity"),
    Case("resolution-zero", ["fit", "{trace}", "--resolution", "0"], expect="--resolution: expected at least 1 byte"),
    Case("resolution-words", ["fit", "{trace}", "--resolution", "fine"], expect="--resolution: cannot parse size"),
    Case("import-total-memory-zero", ["import", _HOOKS, "-o", "{d}/o.bin", "--total-memory", "0"],
         expect="--total-memory: expected at least 1 byte", outputs=["o.bin"]),
    Case("import-total-memory-past-1-pib", ["import", _HOOKS, "-o", "{d}/o.bin", "--total-memory", "2PB"],
         expect="--total-memory", outputs=["o.bin"]),
    Case("import-no-line-for-device", ["import", _HOOKS, "-o", "{d}/o.bin", "--device", "5"],
         expect="hooks.jsonl: none of its 9 hook lines is for device 5", outputs=["o.bin"]),
    Case("policy-option-twice", ["replay", "{trace}", "-p", "torch", "-O", "max_split_size_mb=200", "-O",
                                 "max_split_size_mb:300"], expect="option max_split_size_mb is given twice"),
    Case("policy-option-twice-in-brackets", ["compare", "{trace}", "-p", "torch[max_split_size_mb:200]", "-O",
                                             "max_split_size_mb:300"], expect="is given twice"),
    Case("sweep-scheduler-empty", ["sweep", "{trace}", "--scheduler", "", "-o", "{d}/r.csv"],
         expect="--scheduler: empty address", outputs=["r.csv", "r.csv.partial"]),
    Case("calibrate-reps-zero", ["calibrate", "--reps", "0", "-o", "{d}/c.json"], expect="--reps",
         outputs=["c.json"]),
    Case("synth-seed-negative", _SYNTH + ["mlp", "--seed", "-1"], outputs=["s.bin"],
         expect="argument --seed: expected a non-negative integer, got -1"),
    Case("synth-iterations-zero", _SYNTH + ["mlp", "-n", "0"], outputs=["s.bin"],
         expect="argument --iterations/-n: expected a positive integer, got 0"),
    Case("synth-scale-zero", _SYNTH + ["cnn", "--scale", "0"], expect="scale must be a number above 0",
         outputs=["s.bin"]),
    Case("synth-scale-huge", _SYNTH + ["mlp", "--scale", "1e300"],
         expect="scale must be a number above 0 and below 1e6", outputs=["s.bin"]),
    Case("synth-param-zero", _SYNTH + ["transformer", "-P", "layers=0"], expect="parameter layers",
         outputs=["s.bin"]),
    Case("synth-param-infinite", _SYNTH + ["mlp", "-P", "iter_ms=inf"], expect="parameter iter_ms", outputs=["s.bin"]),
    Case("synth-min-above-max", _SYNTH + ["alloc-heavy", "-P", "min_size=10MB"],
         expect="min_size 10000000 is larger than max_size", outputs=["s.bin"]),
    Case("synth-param-twice", _SYNTH + ["mlp", "-P", "batch=8", "-P", "batch=16"], expect="--param batch is given twice",
         outputs=["s.bin"]),
    Case("synth-sizes-past-1-pib", _SYNTH + ["mlp", "-P", "hidden=100000000000"], expect="out of range",
         outputs=["s.bin"]),
    Case("synth-times-past-64-bits", _SYNTH + ["alloc-heavy", "-P", "event_ns=100000000000000000", "-P",
                                               "n_allocs=1000"], expect="out of range", outputs=["s.bin"]),
    Case("fit-negative-max-replays", ["fit", "{trace}", "--policies", "none", "--max-replays", "-1"],
         expect="--max-replays"),
    Case("info-trace-name-empty", ["info", ""], expect="'': cannot read: the file name is empty", stdout_empty=True),
    Case("replay-trace-name-empty", ["replay", "", "--json"], expect="the file name is empty", stdout_empty=True),
    Case("sweep-trace-name-empty", ["sweep", "", "-p", "none", "-o", "{d}/r.csv"], expect="the file name is empty",
         outputs=["r.csv", "r.csv.partial"]),
    Case("replay-cost-model-name-empty", ["replay", "{trace}", "--cost-model", ""], expect="the file name is empty",
         stdout_empty=True),
    Case("plugin-file-is-a-folder", ["replay", "{trace}", "-p", "p.py:Pool"],
         lambda d: os.mkdir(os.path.join(d, "p.py")), expect="p.py is a folder, not a file"),
    Case("plugin-file-is-a-device", ["compare", "{trace}", "-p", f"{os.devnull}:Pool"], expect="is not a regular file"),
    Case("plugin-file-without-class", ["fit", "{trace}", "-p", "split,p.py"], _plugin("malloc"),
         expect="policy 'p.py': name the class in the file too: p.py:ClassName"),
    Case("plugin-two-colons", ["replay", "{trace}", "-p", "p.py:Pool:X"], _plugin("malloc"),
         expect="policy 'p.py:Pool:X': expected file.py:Class or module:Class"),
    Case("policies-name-empty", ["policies", ""], expect="policy '': expected name", stdout_empty=True),
    Case("policy-given-twice", ["replay", "{trace}", "--policy", "split", "-p", "torch"],
         expect="argument --policy/-p: given twice (split, then torch)", stdout_empty=True),
    Case("cap-given-twice", ["replay", "{trace}", "--cap", "4GB", "--cap=8GB"], expect="--cap: given twice"),
    Case("output-given-twice", ["sweep", "{trace}", "-o", "{d}/a.csv", "--output", "{d}/b.csv"],
         expect="given twice", outputs=["a.csv", "b.csv", "a.csv.partial", "b.csv.partial"]),
    Case("plugin-params-not-params", ["replay", "{trace}", "-p", "p.py:Pool"],
         text_file("p.py", "from allocsim.policies import Policy\nclass Pool(Policy):\n    params = 5\n"),
         expect="Pool.params must be a tuple of allocsim.params.Param, got 5"),
    Case("plugin-param-kind-unknown", ["policies", "p.py:Pool"],
         text_file("p.py", "from allocsim.policies import Policy\nfrom allocsim.params import Param\n"
                           "class Pool(Policy):\n    params = (Param('seg', 'weird', 1, 'h'),)\n"),
         expect="Pool.params: seg: kind 'weird' is not one of int, float", stdout_empty=True),
    Case("plugin-without-malloc", ["replay", "{trace}", "-p", "p.py:Pool"],
         text_file("p.py", "from allocsim.policies import Policy\nclass Pool(Policy):\n    pass\n"),
         expect="NotImplementedError: Pool does not implement malloc(), which every policy must"),
    Case("sweep-csv-is-compares", ["sweep", "{trace}", "-p", "none", "-o", "{d}/r.csv", "--csv", "{d}/x.csv"],
         expect="allocsim sweep: error: unrecognized arguments: --csv {d}/x.csv (--csv is an option of compare, not "
                "of sweep)", outputs=["r.csv", "x.csv", "r.csv.partial"]),
    # an option of the other number, or another command's: the line names the command and what was meant
    Case("replay-policies", ["replay", "{trace}", "--policies", "torch,cupy"], stdout_empty=True,
         expect="allocsim replay: error: unrecognized arguments: --policies torch,cupy (did you mean --policy?)"),
    Case("replay-caps", ["replay", "{trace}", "--caps=8GB"], stdout_empty=True,
         expect="allocsim replay: error: unrecognized arguments: --caps=8GB (did you mean --cap?)"),
    Case("compare-policy", ["compare", "{trace}", "--policy", "torch"],
         expect="allocsim compare: error: unrecognized arguments: --policy torch (did you mean --policies?)"),
    Case("compare-cap", ["compare", "{trace}", "--cap", "8GB"],
         expect="allocsim compare: error: unrecognized arguments: --cap 8GB (did you mean --caps?)"),
    Case("fit-policy", ["fit", "{trace}", "--policy", "torch"],
         expect="allocsim fit: error: unrecognized arguments: --policy torch (did you mean --policies?)"),
    Case("validate-policy", ["validate", "{trace}", "--policy", "torch"],
         expect="allocsim validate: error: unrecognized arguments: --policy torch (--policy is an option of replay, "
                "not of validate)"),
    Case("option-misspelled", ["info", "{trace}", "--Json"],
         expect="allocsim info: error: unrecognized arguments: --Json (did you mean --json?)"),
    Case("policies-two-names", ["policies", "split", "torch"], stdout_empty=True,
         expect="allocsim policies: error: unrecognized arguments: torch (policies takes at most one policy)"),
    Case("main-option-misspelled", ["--debg", "replay", "{trace}"], stdout_empty=True,
         expect="allocsim: error: unrecognized arguments: --debg (did you mean --debug?)"),
    Case("torch-option-not-a-number", ["replay", "{trace}", "-p", "torch", "-O", "max_split_size_mb=abc"],
         expect="policy 'torch': option max_split_size_mb: expected an integer, got 'abc'"),
    Case("torch-divisions-key-not-a-number", ["replay", "{trace}", "-p", "torch[roundup_power2_divisions:[a:1]]"],
         expect="option roundup_power2_divisions: expected an integer, got 'a'"),
    Case("option-for-one-of-several-policies",
         ["compare", "{trace}", "-p", "split,torch", "-O", "max_split_size_mb=128"],
         expect="unknown option 'max_split_size_mb' (known: huge_exact) (-O applies to every policy of --policies; "
                "give one policy its options in brackets"),
    Case("sweep-o-json-is-not-json", ["sweep", "{trace}", "-p", "none", "-o", "{d}/r.json"],
         expect="sweep writes JSON lines (one object per line), not one JSON document; name it .jsonl",
         outputs=["r.json", "r.json.partial"]),
    Case("sweep-format-contradicts-name", ["sweep", "{trace}", "-p", "none", "-o", "{d}/r.csv", "--format", "jsonl"],
         expect="--format jsonl contradicts the .csv name", outputs=["r.csv", "r.csv.partial"]),
    Case("gc-every-empty", ["replay", "{trace}", "--runtime", "gc", "--gc-every", ""],
         expect="--gc-every: cannot parse size ''", stdout_empty=True),
    Case("import-total-memory-empty", ["import", _HOOKS, "-o", "{d}/o.bin", "--total-memory", ""],
         expect="--total-memory: cannot parse size ''", outputs=["o.bin"]),
    Case("compare-gc-every-zero", ["compare", "{trace}", "--policies", "none", "--gc-every", "0B"],
         expect="--gc-every"),
    Case("torch-fraction-without-capacity", ["replay", "{trace}", "-p", "torch", "-O", "per_process_memory_fraction=0.5"],
         expect="per_process_memory_fraction needs a device capacity (--capacity)", stdout_empty=True),
    Case("torch-fraction-zero", ["replay", "{trace}", "-p", "torch", "-O", "per_process_memory_fraction=0",
                                 "--capacity", "1GB"],
         expect="option per_process_memory_fraction: must lie in (0.0, 1.0]", stdout_empty=True),
    Case("tune-capacity-below-load", ["tune", "{trace}", "--capacity", "1KB"],
         expect="--capacity 1000 B is below the trace's LOAD", stdout_empty=True),
    Case("tune-cap-below-load", ["tune", "{trace}", "--cap", "1KB"], expect="--cap 1000 B is below the trace's LOAD",
         stdout_empty=True),
    # a capacity less the memory the recording saw outside the allocator (LOAD 28.73 MiB): quoted as given, with the sum
    Case("tune-capacity-less-outside-below-load", ["tune", "{d}/bad.bin", "--capacity", "40MB"],
         trace_with({"device_memory": {"total": 1 << 30, "outside_peak": 20 << 20}}), stdout_empty=True,
         expect="--capacity 40MB (38.15 MiB) less the 20.00 MiB the recording saw outside the caching allocator (CUDA "
                "context, NCCL, other processes) leaves 18.15 MiB, below the trace's LOAD 28.73 MiB (its peak live "
                "bytes): no allocator setting fits"),
    Case("tune-capacity-within-outside", ["tune", "{d}/bad.bin", "--capacity", "16MB"],
         trace_with({"device_memory": {"total": 1 << 30, "outside_peak": 20 << 20}}), stdout_empty=True,
         expect="--capacity 16MB (15.26 MiB) is no more than the 20.00 MiB the recording saw outside the caching "
                "allocator (CUDA context, NCCL, other processes): nothing is left for the trace's LOAD 28.73 MiB"),
    Case("tune-recorded-device-less-outside-below-load", ["tune", "{d}/bad.bin"],
         trace_with({"device": {"name": "test", "total_memory": 40 << 20},
                     "device_memory": {"total": 40 << 20, "outside_peak": 20 << 20}}), stdout_empty=True,
         expect="the recorded device's memory (40.00 MiB) less the 20.00 MiB the recording saw outside the caching "
                "allocator (CUDA context, NCCL, other processes) leaves 20.00 MiB, below the trace's LOAD 28.73 MiB"),
    Case("tune-run-rank-within-outside", ["tune", "{d}/run.bin", "--capacity", "16MB"],
         lambda d: [trace_with({"rank": r, "world_size": 2,
                                "device_memory": {"total": 1 << 30, "outside_peak": r << 25}},
                               name=f"run.rank{r}.bin")(d) for r in (0, 1)], stdout_empty=True,
         expect="rank 1 of 2 ({d}/run.rank1.bin): --capacity 16MB (15.26 MiB) is no more than the 32.00 MiB the "
                "recording saw outside the caching allocator"),
    Case("tune-cap-above-capacity", ["tune", "{trace}", "--capacity", "1GB", "--cap", "2GB"],
         expect="is larger than --capacity", stdout_empty=True),
    Case("tune-unknown-objective", ["tune", "{trace}", "--objective", "fast"],
         expect="argument --objective: invalid choice: 'fast'", stdout_empty=True),
    Case("tune-plot-not-a-picture", ["tune", "{trace}", "--plot", "{d}/front.txt"],
         expect="expected a .png, .svg or .pdf path", outputs=["front.txt"], stdout_empty=True),
    Case("tune-top-zero", ["tune", "{trace}", "--top", "0"], stdout_empty=True,
         expect="argument --top: expected a positive integer, got 0"),
    Case("replay-snapshot-policy-without-layout", ["replay", "{trace}", "-p", "split", "--snapshot", "{d}/s.pickle"],
         expect="--snapshot: policy 'split' keeps no segment layout", outputs=["s.pickle"], stdout_empty=True),
    Case("replay-snapshot-gc-runtime", ["replay", "{trace}", "-p", "torch", "--runtime", "gc",
                                        "--snapshot", "{d}/s.pickle"],
         expect="export an eager replay (--runtime eager)", outputs=["s.pickle"], stdout_empty=True),
    Case("tune-snapshot-not-torch", ["tune", "{trace}", "--snapshot", "{d}/s.pickle"],
         expect="was not recorded under PyTorch", outputs=["s.pickle"], stdout_empty=True),
    Case("empty-policy-option", ["replay", "{trace}", "-p", "split", "-O", ""],
         expect="argument --policy-opt/-O: expected key=value, got an empty option", stdout_empty=True),
    Case("tune-neither-trace-nor-log", ["tune", "{d}/junk.txt"], setup=_write("junk.txt", "hello\n"),
         expect="junk.txt: byte 0: neither an allocsim trace nor a log allocsim imports", stdout_empty=True),
]


# ---------------------------------------------------------------------------------------------
# plots and reports
REPORTS: list[Case] = [
    Case("plot-output-not-a-picture", ["plot", "{trace}", "-o", "{d}/k.txt"], expect="k.txt", outputs=["k.txt"],
         stdout_empty=True),
    Case("plot-output-no-extension", ["plot", "{trace}", "-o", "{d}/k"], expect=".png", outputs=["k"]),
    Case("plot-output-checked-before-the-trace", ["plot", "{d}/nosuch.bin", "-o", "{d}/k.txt"], expect="k.txt"),
    Case("plot-output-dir-missing", ["plot", "{trace}", "-o", "{d}/no/k.png"], expect="does not exist"),
    Case("plot-output-and-report", ["plot", "{trace}", "-o", "{d}/k.png", "--report", "{d}/rep"], expect="not both",
         outputs=["k.png", "rep/index.html"]),
    Case("plot-no-output", ["plot", "{trace}"], expect="--report"),
    Case("plot-svg-with-output", ["plot", "{trace}", "-o", "{d}/k.png", "--svg"], expect="--svg",
         outputs=["k.png"]),
    Case("plot-kind-with-report", ["plot", "{trace}", "--kind", "gc", "--report", "{d}/rep"], expect="--kind",
         outputs=["rep/index.html"]),
    Case("plot-unknown-kind", ["plot", "{trace}", "--kind", "pie", "-o", "{d}/k.png"], expect="pie",
         outputs=["k.png"]),
    Case("plot-report-is-a-plain-file", ["plot", "{trace}", "--report", "{d}/rep"],
         setup=lambda d: open(os.path.join(d, "rep"), "w").close(), expect="not a folder"),
    Case("plot-zero-jobs", ["plot", "{trace}", "-o", "{d}/k.png", "-j", "0"], expect="-j/--jobs: expected a positive integer, got 0", outputs=["k.png"]),
    Case("plot-cap-twice", ["plot", "{trace}", "-o", "{d}/k.png", "--caps", "none,4GB,4000000000"],
         expect="named twice", outputs=["k.png"]),
    Case("plot-bad-cap", ["plot", "{trace}", "-o", "{d}/k.png", "--caps", "4XB"], expect="4XB", outputs=["k.png"]),
    Case("plot-empty-policies", ["plot", "{trace}", "-o", "{d}/k.png", "--policies", ","], expect="--policies",
         outputs=["k.png"]),
    Case("plot-policy-twice", ["plot", "{trace}", "-o", "{d}/k.png", "--policies", "split,torch,split"],
         expect="split is named twice", outputs=["k.png"]),
]


# ---------------------------------------------------------------------------------------------
# issue 18, careless and malformed inputs: every record field range-checked where the trace is read
from hostile_files import trace_events  # noqa: E402
from allocsim.trace import events as ev  # noqa: E402

from allocsim.trace import TraceWriter  # noqa: E402


def _zero_byte_trace(d):
    """``e.bin``: a trace whose only object is 0 bytes (LOAD 0 B)."""
    w = TraceWriter()
    w.free(w.alloc(0))
    w.finish().save(os.path.join(d, "e.bin"))


#: ``tr\xffce.bin``: a name the file system allows and UTF-8 cannot spell (Python holds it with a surrogate)
_NON_UTF8 = os.fsdecode(b"tr\xffce.bin")


def _non_utf8_copy(d):
    shutil.copy(os.path.join(d, "t.bin"), os.path.join(d, _NON_UTF8))


def _holds(name, text):
    """A ``then`` check: the output ``name`` holds ``text`` (the name, its bad byte written ``\\xff``)."""
    def then(d, out):
        with open(os.path.join(d, name), encoding="utf-8") as f:
            assert text in f.read(), name
    return then


def _json_names_trace(d, out):
    assert json.loads(out)["trace"] == "tr\\xffce.bin", out


def _made(name):
    def then(d, out):
        assert os.path.isfile(os.path.join(d, name)), sorted(os.listdir(d))
    return then


_SEG = {"kind": ev.SEGMENT_ALLOC, "addr": 0x200000, "size": 2 << 20}
_TORCH = {"framework": "torch"}

INPUTS_18: list[Case] = [
    Case("segment-size-2-63-validate", ["validate", "{d}/bad.bin"], trace_events({**_SEG, "size": 2**63}, meta=_TORCH),
         expect="bad.bin: event 60: absurd SEGMENT_ALLOC size 9223372036854775808 bytes (> 1 PiB)", stdout_empty=True),
    Case("segment-size-2-62-twice", ["validate", "{d}/bad.bin"],
         trace_events({**_SEG, "size": 2**62}, {**_SEG, "size": 2**62, "addr": 1 << 40}, meta=_TORCH),
         expect="event 60: absurd SEGMENT_ALLOC size", stdout_empty=True),
    Case("segment-map-size-absurd", ["info", "{d}/bad.bin"], trace_events({**_SEG, "kind": ev.SEGMENT_MAP,
                                                                          "size": 2**51}),
         expect="event 60: absurd SEGMENT_MAP size", stdout_empty=True),
    Case("oom-size-absurd", ["replay", "{d}/bad.bin"], trace_events({"kind": ev.OOM, "size": 2**64 - 1}),
         expect="event 60: absurd OOM size 18446744073709551615 bytes", stdout_empty=True),
    Case("oom-device-free-absurd", ["replay", "{d}/bad.bin"], trace_events({"kind": ev.OOM, "size": 8,
                                                                           "addr": 2**63}),
         expect="event 60: absurd OOM device free bytes", stdout_empty=True),
    Case("limit-size-absurd", ["replay", "{d}/bad.bin"],
         trace_events({"kind": ev.SET_LIMIT, "aux": 1, "size": 2**60}), expect="event 60: absurd SET_LIMIT size",
         stdout_empty=True),
    Case("free-size-absurd", ["info", "{d}/bad.bin"], trace_events({"kind": ev.FREE, "id": 0, "size": 2**60}),
         expect="event 60: absurd FREE size", stdout_empty=True),
    Case("limit-fraction-nan", ["replay", "{d}/bad.bin"],
         trace_events({"kind": ev.SET_LIMIT, "size": 1 << 30, "addr": ev.fraction_bits(float("nan"))}),
         expect="event 60: SET_LIMIT memory fraction nan is not a number from 0 to 1", stdout_empty=True),
    Case("limit-fraction-inf", ["compare", "{d}/bad.bin", "-p", "none"],
         trace_events({"kind": ev.SET_LIMIT, "size": 1 << 30, "addr": ev.fraction_bits(float("inf"))}),
         expect="SET_LIMIT memory fraction inf", stdout_empty=True),
    Case("limit-fraction-negative", ["info", "{d}/bad.bin"],
         trace_events({"kind": ev.SET_LIMIT, "size": 1 << 30, "addr": ev.fraction_bits(-0.5)}),
         expect="SET_LIMIT memory fraction -0.5", stdout_empty=True),
    Case("limit-fraction-above-one", ["info", "{d}/bad.bin"],
         trace_events({"kind": ev.SET_LIMIT, "size": 1 << 30, "addr": ev.fraction_bits(1.5)}),
         expect="SET_LIMIT memory fraction 1.5", stdout_empty=True),
    Case("limit-aux-unknown", ["replay", "{d}/bad.bin"], trace_events({"kind": ev.SET_LIMIT, "aux": 7}),
         expect="event 60: SET_LIMIT aux 7 is neither 0 (torch) nor 1 (CuPy)", stdout_empty=True),
    Case("cache-release-aux-unknown", ["replay", "{d}/bad.bin"], trace_events({"kind": ev.CACHE_RELEASE, "aux": 2}),
         expect="event 60: CACHE_RELEASE aux 2 is neither", stdout_empty=True),
    Case("gc-aux-unknown", ["info", "{d}/bad.bin"], trace_events({"kind": ev.GC, "aux": 9}),
         expect="event 60: GC aux 9 is neither 0 (incremental) nor 1 (full)", stdout_empty=True),
    Case("mark-label-beyond-table", ["info", "{d}/bad.bin"], trace_events({"kind": ev.MARK, "aux": 3}),
         expect="event 60: MARK label index 3 is beyond the footer's table of 0 labels", stdout_empty=True),
    Case("site-beyond-table", ["replay", "{d}/bad.bin"], trace_events({"kind": ev.ALLOC, "id": 60, "size": 8,
                                                                      "site": 5}),
         expect="event 60: site index 5 is beyond the footer's table of 0 sites", stdout_empty=True),
    Case("stream-beyond-table", ["validate", "{d}/bad.bin"], trace_events({**_SEG, "stream": 4}, meta=_TORCH),
         expect="event 60: stream index 4 is beyond the footer's table of 1 streams", stdout_empty=True),
    Case("flags-misplaced-64", ["replay", "{d}/bad.bin"], trace_events({**_SEG, "flags": 0x40}),
         expect="event 60: flag 64 (IN_REQUEST) on a SEGMENT_ALLOC: it marks FREEs only", stdout_empty=True),
    Case("flags-catches-oom-not-alloc", ["replay", "{d}/bad.bin"], trace_events({**_SEG, "flags": 0x80}),
         expect="event 60: flag 128 (CATCHES_OOM) on a SEGMENT_ALLOC: it marks ALLOCs only", stdout_empty=True),
    Case("segment-free-never-allocated", ["validate", "{d}/bad.bin"],
         trace_events(_SEG, {**_SEG, "kind": ev.SEGMENT_FREE, "addr": 0x400000}, meta=_TORCH),
         expect="bad.bin: event 61: SEGMENT_FREE of a segment never allocated (address 0x400000, 2097152 bytes)",
         stdout_empty=True),
    Case("segment-freed-twice", ["info", "{d}/bad.bin"],
         trace_events(_SEG, {**_SEG, "kind": ev.SEGMENT_FREE}, {**_SEG, "kind": ev.SEGMENT_FREE}),
         expect="event 62: SEGMENT_FREE of a segment never allocated", stdout_empty=True),
    Case("segment-unmap-more-than-mapped", ["validate", "{d}/bad.bin"],
         trace_events({**_SEG, "kind": ev.SEGMENT_MAP}, {**_SEG, "kind": ev.SEGMENT_UNMAP, "size": 4 << 20},
                      meta=_TORCH),
         expect="event 61: SEGMENT_UNMAP of 4194304 bytes takes the recorded reserved bytes below zero",
         stdout_empty=True),
] + [   # every file the user names is checked before it is opened: a FIFO nobody writes is refused, not waited on
    Case(f"{argv[0]}-{name}-fifo", argv, lambda d, name=name: os.mkfifo(os.path.join(d, name)),
         expect=f"{name}: is a pipe or a device, not a file", stdout_empty=True, subprocess=True)
    for name, argv in (("f.bin", ["tune", "{d}/f.bin"]),
                       ("c.json", ["replay", "{trace}", "--cost-model", "{d}/c.json"]),
                       ("c.json", ["compare", "{trace}", "-p", "none", "--cost-model", "{d}/c.json"]),
                       ("c.json", ["sweep", "{trace}", "-p", "none", "--cost-model", "{d}/c.json", "-o", "{d}/r.csv"]),
                       ("c.json", ["tune", "{trace}", "--cost-model", "{d}/c.json"]),
                       ("c.json", ["fit", "{trace}", "-p", "none", "--cost-model", "{d}/c.json"]),
                       ("f.py", ["record", "-o", "{d}/r.bin", "{d}/f.py"]),
                       ("f.pickle", ["import", "{d}/f.pickle", "-o", "{d}/r.bin"]))
] + [   # a size option: inf and nan are not "no limit" (none says that), negative and 0 are refused
    Case(name, argv, expect=expect, stdout_empty=True) for name, argv, expect in (
        ("replay-cap-inf", ["replay", "{trace}", "--cap", "inf"], "--cap: 'inf' is not a size; write none"),
        ("replay-cap-minus-inf", ["replay", "{trace}", "--cap=-inf"], "--cap: '-inf' is not a size"),
        ("tune-cap-infinity", ["tune", "{trace}", "--cap", "Infinity"], "--cap: 'Infinity' is not a size"),
        ("compare-caps-nan", ["compare", "{trace}", "-p", "none", "--caps", "none,nan"], "--caps: 'nan' is not a size"),
        ("replay-capacity-inf", ["replay", "{trace}", "--capacity", "inf"], "--capacity: 'inf' is not a size"),
        ("replay-cap-negative", ["replay", "{trace}", "--cap=-1GB"], "--cap: negative size '-1GB'"),
        ("replay-cap-1e400", ["replay", "{trace}", "--cap", "1e400"], "--cap: size '1e400' is out of range"),
        ("replay-cap-zero", ["replay", "{trace}", "--cap", "0"], "--cap: expected at least 1 byte"),
        ("replay-cap-hex", ["replay", "{trace}", "--cap", "0x10"], "--cap: cannot parse size '0x10'"),
        ("gc-every-nan", ["replay", "{trace}", "--runtime", "gc", "--gc-every", "nan"],
         "--gc-every: 'nan' is not a size"))
] + [
    Case("plot-caps-inf", ["plot", "{trace}", "-o", "{d}/k.png", "--caps", "4GB,inf"], expect="--caps: 'inf'",
         outputs=["k.png"]),
    Case("tune-empty-trace", ["tune", "{d}/e.bin"], lambda d: TraceWriter().finish().save(os.path.join(d, "e.bin")),
         expect="e.bin: holds no allocation of a byte or more (LOAD 0 B): nothing to tune", stdout_empty=True),
    Case("tune-only-zero-byte-allocs", ["tune", "{d}/e.bin", "--plot", "{d}/f.png"], _zero_byte_trace,
         expect="nothing to tune", outputs=["f.png"], stdout_empty=True),
    Case("import-protocol-0-pickle-naming-a-global", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         text_file("snap.pickle", b"(dp0\nS'x'\ncos\nsystem\n(S'touch pwned'\ntRs."),
         expect="snap.pickle: refusing to load global os.system", outputs=["o.bin", "pwned"]),
    Case("compare-csv-non-utf8-trace-name", ["compare", "{d}/" + _NON_UTF8, "-p", "none", "--csv", "{d}/o.csv"],
         _non_utf8_copy, status=0, stderr_lines=0, then=_holds("o.csv", "tr\\xffce.bin,none,")),
    Case("sweep-o-non-utf8-trace-name", ["sweep", "{d}/" + _NON_UTF8, "-p", "none", "-j", "1", "-o", "{d}/r.csv"],
         _non_utf8_copy, status=0, stderr_lines=0, outputs=["r.csv.partial"], then=_holds("r.csv", "tr\\xffce.bin,")),
    Case("plot-non-utf8-trace-name", ["plot", "{d}/" + _NON_UTF8, "-p", "none", "-o", "{d}/k.svg"], _non_utf8_copy,
         status=0, stderr_lines=0, then=_holds("k.svg", "tr\\xffce.bin")),
    Case("replay-json-non-utf8-names-child", ["replay", _NON_UTF8, "--json"], _non_utf8_copy, status=0,
         stderr_lines=0, subprocess=True, then=_json_names_trace),
    Case("synth-o-non-utf8-name-child", ["synth", "mlp", "-o", "o\udcff.bin"], status=0, stderr_lines=0,
         subprocess=True, then=_made("o\udcff.bin")),
    Case("replay-a-compressed-trace", ["replay", "{d}/run.bin.gz"], _write("run.bin.gz", gzip.compress(b"ALLOCSIM" * 8)),
         expect="run.bin.gz: byte 0: not an allocsim trace", stdout_empty=True),
    Case("info-an-xz-trace-says-how-to-unpack", ["info", "{d}/run.bin.xz"], _write("run.bin.xz", lzma.compress(b"x")),
         expect="it is xz-compressed; unpack it first (xz -dk ", stdout_empty=True),
    Case("info-non-utf8-name-error-line", ["info", "{d}/" + _NON_UTF8], text_file(_NON_UTF8, "hello"),
         expect="tr\\xffce.bin: byte 0: not an allocsim trace", stdout_empty=True),
    Case("import-total-memory-inf", ["import", _HOOKS, "-o", "{d}/o.bin", "--total-memory", "inf"],
         expect="--total-memory: 'inf' is not a size", outputs=["o.bin"]),
]


# issue 18: plug-ins that misbehave, process pools and signals, outputs that must not be lost
def _plugin_body(method: str, body: str, name: str = "p.py"):
    """A setup writing ``name``: a first-fit plug-in whose ``method`` runs ``body`` (one line)."""
    return text_file(name, f"import sys\nsys.path.append({EXAMPLE_POLICIES!r})\nfrom first_fit import FirstFit\n"
                           f"class Pool(FirstFit):\n    def {method}(self, *a, **k):\n        {body}\n")


_EXITS = _plugin_body("malloc", "sys.exit(0)")


def _replay_breaks(id_: str, method: str, body: str, expect: str) -> Case:
    """A row: `replay` of a plug-in whose ``method`` runs ``body`` and so breaks the policy contract."""
    return Case(id_, ["replay", "{trace}", "-p", "p.py:Pool"], _plugin_body(method, body), expect=expect,
                stdout_empty=True)
_HELD: list = []        # files a setup holds locked while the case runs


def _sweep_running(name):
    """A setup standing for a sweep of ``-o name`` still running: its partial table held locked."""
    def setup(d):
        import fcntl
        f = open(os.path.join(d, name + ".partial"), "a")
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        _HELD[:] = [f]
    return setup

#: a torch model whose malloc raises from its 50th call on: `--snapshot` replays it through the same one-line rule
_TORCH_RAISES = text_file("t.py", "from allocsim.policies.torch import TorchCachingAllocator\n"
                                  "class Bad(TorchCachingAllocator):\n    name = 'bad'\n    n = 0\n"
                                  "    def malloc(self, size, stream=0):\n        self.n += 1\n"
                                  "        if self.n > 50:\n            raise ValueError('boom')\n"
                                  "        return super().malloc(size, stream)\n")

PLUGINS_18: list[Case] = [
    Case("plugin-raises-under-snapshot", ["replay", "{trace}", "-q", "-p", "t.py:Bad", "--snapshot", "{d}/s.pickle"],
         _TORCH_RAISES, expect="failed while replaying: ValueError: boom", outputs=["s.pickle"], stdout_empty=True),
    Case("plugin-file-not-py", ["replay", "{trace}", "--policy", "/etc/passwd:X"],
         expect="/etc/passwd is not a Python file", stdout_empty=True),
    Case("plugin-file-nul-bytes", ["replay", "{trace}", "--policy", "nul.py:X"], text_file("nul.py", b"x = 1\0\n"),
         expect="loading it failed at {d}/nul.py: SyntaxError", stdout_empty=True),
    Case("plugin-exits-while-loading", ["compare", "{trace}", "-p", "x.py:X", "-j", "1"],
         text_file("x.py", "import sys\nsys.exit(0)\n"), expect="x.py:2: SystemExit: the plug-in called sys.exit(0)",
         stdout_empty=True),
    Case("plugin-malloc-base-exception", ["replay", "{trace}", "-p", "p.py:Pool"],
         _plugin_body("malloc", "raise BaseException('b')"), expect="failed while replaying: BaseException: b",
         stdout_empty=True),
    Case("plugin-malloc-sys-exit-replay", ["replay", "{trace}", "-p", "p.py:Pool"], _EXITS,
         expect="SystemExit: the plug-in called sys.exit(0), which cannot end allocsim", stdout_empty=True),
    Case("plugin-malloc-system-exit-3", ["replay", "{trace}", "-p", "p.py:Pool", "--json"],
         _plugin_body("malloc", "raise SystemExit(3)"), expect="called sys.exit(3)", stdout_empty=True),
    Case("plugin-malloc-sys-exit-compare-1", ["compare", "{trace}", "-p", "split,p.py:Pool", "-j", "1"], _EXITS,
         expect="called sys.exit(0)", stdout_empty=True),
    Case("plugin-malloc-sys-exit-compare-2", ["compare", "{trace}", "-p", "split,p.py:Pool", "-j", "2"], _EXITS,
         expect="called sys.exit(0)", stdout_empty=True, subprocess=True),
    Case("plugin-malloc-sys-exit-sweep", ["sweep", "{trace}", "-p", "p.py:Pool", "-j", "1", "-o", "{d}/r.csv"],
         _EXITS, expect="called sys.exit(0)", outputs=["r.csv", "r.csv.partial"]),
    _replay_breaks("plugin-negative-address", "malloc", "h = super().malloc(*a, **k); return h and (-h[0], h[1])",
                   "broke the policy contract: malloc("),
    _replay_breaks("plugin-ctx-malloc-negative", "malloc", "self.ctx.malloc(-5); return super().malloc(*a, **k)",
                   "ctx.malloc(-5): expected a positive number of bytes"),
    Case("plugin-ctx-free-unknown", ["compare", "{trace}", "-p", "p.py:Pool", "-j", "1"],
         _plugin_body("free", "self.ctx.free(12345, 4096)"),
         expect="ctx.free(12345, 4096): not a segment ctx.malloc gave", stdout_empty=True),
    _replay_breaks("plugin-allocated-negative", "free", "super().free(*a, **k); self.allocated -= 1 << 40",
                   "after a free, allocated is -"),
    _replay_breaks("plugin-blocks-overlap", "malloc",
                   "h = super().malloc(*a, **k); return h and (min(self.segments), h[1])", "that overlaps a live block"),
    Case("plugin-block-smaller-than-request", ["sweep", "{trace}", "-p", "p.py:Pool", "-j", "1", "-o", "{d}/r.csv"],
         _plugin_body("malloc", "h = super().malloc(*a, **k); return h and (h[0], 1)"),
         expect="smaller than the request", outputs=["r.csv", "r.csv.partial"]),
    _replay_breaks("plugin-block-outside-segments", "malloc",
                   "h = super().malloc(*a, **k); return h and (h[0] + (1 << 44), h[1])",
                   "outside every segment taken from the device"),
    Case("sweep-same-output-twice", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o", "{d}/r.csv"],
         _sweep_running("r.csv"), expect="r.csv: -o: another allocsim sweep is writing this table now",
         outputs=["r.csv"], stdout_empty=True),
    Case("replay-snapshot-over-a-snapshot", ["replay", "{trace}", "-p", "torch", "--snapshot", "{d}/s.pickle"],
         _write("s.pickle", b"\x80\x04K\x01."), expect="s.pickle: --snapshot: exists and is a pickle (a PyTorch memory "
         "snapshot", stdout_empty=True),
    Case("plot-report-folder-not-allocsims", ["plot", "{trace}", "-p", "split", "--report", "{d}/rep"],
         _write("rep/memory.png", b"my picture"), expect="rep: --report: is a folder allocsim did not make",
         outputs=["rep/index.html", "rep/bars.png"], stdout_empty=True),
    Case("plot-report-cannot-be-made-checked-first", ["plot", "{d}/nosuch.bin", "--report", "{trace}/rep"],
         expect="rep: --report: cannot make it: Not a directory", stdout_empty=True),
    Case("synth-name-too-long", ["synth", "mlp", "-o", "{d}/" + "n" * 300 + ".bin"],
         expect="n.bin: cannot write: the file name is longer than the", stdout_empty=True),
    Case("plugin-prints-json-stays-valid", ["replay", "{trace}", "-p", "p.py:Pool", "--json"],
         _plugin_body("__init__", "print('hello from the plug-in'); super().__init__(*a, **k)"), status=0,
         expect="hello from the plug-in", stdout_json=True, subprocess=True),
]


# issue 18: settings PyTorch's own parser refuses, and a cap above the device's memory, refused in the user's terms
_ON_1GIB = trace_with({"framework": "torch", "device": {"name": "test", "total_memory": 1 << 30}})
SETTINGS_18 = [
    Case("recorded-max-split-below-pytorchs-least", ["fit", "{d}/m.bin", "-j", "1", "--policies", "torch"],
         trace_with({"framework": "torch", "allocator_settings": {"max_split_size": 1 << 20}}, name="m.bin"),
         expect="allocator_settings: max_split_size 1048576 bytes is below the 20 MiB PyTorch allows",
         stdout_empty=True),
    Case("torch-max-split-1e30", ["replay", "{trace}", "-p", "torch", "-O", "max_split_size_mb=1e30"],
         expect="option max_split_size_mb: expected an integer, got '1e30'", stdout_empty=True),
    Case("torch-max-split-past-size-t", ["replay", "{trace}", "-p", "torch", "-O", f"max_split_size_mb={10 ** 30}"],
         expect="option max_split_size_mb: too large, must be <= 17592186044415", stdout_empty=True),
    Case("torch-non-split-past-size-t", ["compare", "{trace}", "-p", "torch", "-O",
                                         "max_non_split_rounding_mb=17592186044416"],
         expect="option max_non_split_rounding_mb: too large", stdout_empty=True),
    Case("torch-divisions-empty-list", ["replay", "{trace}", "-p", "torch", "-O", "roundup_power2_divisions:[]"],
         expect="option roundup_power2_divisions: the list [] names no interval", stdout_empty=True),
    Case("torch-divisions-only-commas", ["replay", "{trace}", "-p", "torch[roundup_power2_divisions:[,]]"],
         expect="the list [,] names no interval", stdout_empty=True),
    Case("torch-divisions-past-size-t", ["replay", "{trace}", "-p", "torch", "-O",
                                         f"roundup_power2_divisions={2 ** 64}"],
         expect="divisions 18446744073709551616 is outside 0 .. 2**64 - 1", stdout_empty=True),
    Case("torch-divisions-key-past-size-t", ["replay", "{trace}", "-p", "torch", "-O",
                                             f"roundup_power2_divisions=[{2 ** 64}:2]"],
         expect="interval 18446744073709551616 is outside", stdout_empty=True),
    Case("replay-cap-above-recorded-device", ["replay", "{d}/bad.bin", "--cap", "2GB"], _ON_1GIB,
         expect="--cap 1.86 GiB is larger than the recorded device's memory 1.00 GiB", stdout_empty=True),
    Case("compare-caps-above-recorded-device", ["compare", "{d}/bad.bin", "--caps", "none,2GB"], _ON_1GIB,
         expect="--caps 1.86 GiB is larger than the recorded device's memory 1.00 GiB", stdout_empty=True),
    Case("tune-cap-above-recorded-device", ["tune", "{d}/bad.bin", "--cap", "2GB"], _ON_1GIB,
         expect="--cap 1.86 GiB is larger than the recorded device's memory 1.00 GiB", stdout_empty=True),
    Case("tune-recorded-device-below-load", ["tune", "{d}/bad.bin"],
         trace_with({"framework": "torch", "device": {"name": "test", "total_memory": 1024}}),
         expect="the recorded device's memory 1.00 KiB is below the trace's LOAD", stdout_empty=True),
]


# the hunt on runs, tune of several traces, dask and record (tune's own checks skipped on a run; dask's own
# traceback for an address it cannot read; a rank's output file written twice; an empty script name)
def _run_of(*ranks, world=2, name="run.rank{k}.bin"):
    """A setup writing ``run.rank<k>.bin`` for each position k (or ``name`` with ``{r}``), its metadata naming rank
    ``ranks[k]`` of ``world`` processes (one world size, or one for each)."""
    worlds = world if isinstance(world, tuple) else (world,) * len(ranks)
    return lambda d: [trace_with({"framework": "torch", "rank": r, "world_size": w}, name=name.format(k=k, r=r))(d)
                      for k, (r, w) in enumerate(zip(ranks, worlds))]


def _run_of_devices(*memories):
    """A setup writing a run of one rank per device memory in ``memories`` (bytes)."""
    return lambda d: [trace_with({"framework": "torch", "rank": r, "world_size": len(memories),
                                  "device": {"name": "test", "total_memory": m}}, name=f"run.rank{r}.bin")(d)
                      for r, m in enumerate(memories)]


_ONE_RANK_TWICE = "run.rank0.bin and {d}/run.rank1.bin are both rank 0 of 1"
HUNT: list[Case] = [
    Case("tune-run-top-zero", ["tune", "{d}/run.bin", "--top", "0"], _run_of(0, 1),
         expect="argument --top: expected a positive integer, got 0", stdout_empty=True),
    Case("tune-two-traces-max-replays-negative", ["tune", "{trace}", "{trace}", "--max-replays", "-1"],
         stdout_empty=True, expect="argument --max-replays: expected a non-negative integer (0: no limit), got -1"),
    Case("tune-scheduler-garbage", ["tune", "{trace}", "--scheduler", "garbage"],
         expect="--scheduler garbage: missing port number", stdout_empty=True, subprocess=True),
    Case("sweep-scheduler-garbage", ["sweep", "{trace}", "-p", "split", "--scheduler", "garbage", "-o", "{d}/r.csv"],
         expect="--scheduler garbage:", outputs=["r.csv", "r.csv.partial"], stdout_empty=True, subprocess=True),
    Case("sweep-scheduler-no-port", ["sweep", "{trace}", "-p", "split", "--scheduler", "tcp://127.0.0.1:99999",
                                     "-o", "{d}/r.csv"],
         expect="--scheduler tcp://127.0.0.1:99999: port 99999 is no port (1 to 65535)",
         outputs=["r.csv", "r.csv.partial"], stdout_empty=True),
    Case("tune-log-beside-a-trace", ["tune", "{d}/log.pickle", "{trace}", "--no-fit", "-j", "1"],
         setup=_write("log.pickle", b"\x80\x04N."), expect="not an allocsim trace: to tune a snapshot or log beside",
         stdout_empty=True),
    Case("tune-scheduler-scheme-without-its-library", ["tune", "{trace}", "--scheduler", "ucx://127.0.0.1:1"],
         expect="--scheduler ucx://127.0.0.1:1: ", stdout_empty=True),
    Case("compare-run-one-rank-twice-csv", ["compare", "{d}/run.bin", "-p", "split", "-j", "1", "--csv", "{d}/o.csv"],
         _run_of(0, 0, world=1), expect=_ONE_RANK_TWICE, outputs=["o.rank0.csv"], stdout_empty=True),
    Case("replay-run-one-rank-twice-snapshot", ["replay", "{d}/run.bin", "-p", "torch", "--snapshot", "{d}/s.pickle"],
         _run_of(0, 0, world=1), expect=_ONE_RANK_TWICE, outputs=["s.rank0.pickle"], stdout_empty=True),
    Case("import-snapshot-pool-id-past-32-bits", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["segments"][0].update(segment_pool_id=[2 ** 40, 1])),
         expect="snap.pickle: segments[0]: segment_pool_id (1099511627776, 1): a pool id's halves must be below",
         outputs=["o.bin"]),
    Case("import-snapshot-pool-id-second-half-past-32-bits", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: [g.update(segment_pool_id=[3, 2 ** 33]) for g in s["segments"]]),
         expect="segments[0]: segment_pool_id (3, 8589934592)", outputs=["o.bin"]),
    Case("info-run-world-sizes-disagree", ["info", "{d}/run.bin"], _run_of(0, 1, world=(2, 4)),
         expect="run.bin: its traces disagree on the world size: {d}/run.rank0.bin says 2, {d}/run.rank1.bin says 4",
         stdout_empty=True),
    Case("meta-rank-not-below-world-size", ["replay", "{d}/bad.bin"], trace_with({"rank": 3, "world_size": 2}),
         expect="bad.bin: metadata: rank: 3 is not below world_size 2", stdout_empty=True),
    Case("tune-run-missing-rank-warns", ["tune", "{d}/run.bin", "--max-replays", "2", "--no-fit", "--json"],
         _run_of(0, 2, world=3, name="run.rank{r}.bin"), status=0, stdout_json=True,
         expect="run.bin: no trace of rank 1 of its 3 ({d}/run.rank1.bin does not exist)"),
    Case("tune-torch-run-beside-a-cupy-trace", ["tune", "{d}/run.bin", "{d}/c.bin"],
         lambda d: (_run_of(0, 1)(d), trace_with({"framework": "cupy"}, name="c.bin")(d)),
         expect="run.rank0.bin was recorded under torch, {d}/c.bin under cupy: tune the processes of one framework",
         stdout_empty=True),
    Case("record-empty-module-name", ["record", "-m", "", "-o", "{d}/r.bin"], expect="-m needs a module name",
         outputs=["r.bin", ".bin"], stdout_empty=True),
    Case("compare-run-later-rank-fails-csv", ["compare", "{d}/run.bin", "--caps", "2GB", "-p", "split", "-j", "1",
                                              "--csv", "{d}/o.csv"], _run_of_devices(4 << 30, 1 << 30),
         expect="--caps 1.86 GiB is larger than the recorded device's memory 1.00 GiB", outputs=["o.rank0.csv"],
         stdout_empty=True),
    Case("replay-run-later-rank-bad-settings", ["replay", "{d}/run.bin", "-p", "torch"],
         lambda d: [trace_with({"framework": "torch", "rank": r, "world_size": 2, "allocator_settings":
                                {"max_split_size": 1 if r else 1 << 30}}, name=f"run.rank{r}.bin")(d) for r in (0, 1)],
         expect="run.rank1.bin: metadata: allocator_settings: max_split_size 1 bytes", stdout_empty=True),
    Case("record-empty-script-name", ["record", "-o", "{d}/r.bin", "--", ""], expect="no script given",
         outputs=["r.bin"], stdout_empty=True),
]


def _installed(**points):
    """A setup installing, in the case's folder (on a child's path as its working folder), a distribution whose
    entry points of ``allocsim.policies`` are ``points`` (name -> module:Class), ``x.py``, which exits, and ``y.py``,
    which holds no class."""
    def setup(d):
        info = os.path.join(d, "hostile-0.1.dist-info")
        os.mkdir(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: hostile\nVersion: 0.1\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write("[allocsim.policies]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))
        text_file("x.py", "import sys\nsys.exit(0)\n")(d)
        text_file("y.py", "z = 1\n")(d)
    return setup


def _partial_row(policy, runtime, **edit):
    """A setup leaving ``r.csv.partial`` as a sweep stopped after its cell of ``policy`` × ``runtime`` on the case's
    trace (default options) leaves it; ``edit``: columns changed by hand after."""
    def setup(d):
        from allocsim.commands.sweep import shared_key
        from allocsim.search.sweep import Cell, Settings, run_cells
        cell = Cell(os.path.join(d, "t.bin"), policy, None, runtime)
        row = {k: v for k, v in run_cells([cell], Settings())[0].items() if k not in ("replay_seconds", "sections")}
        row.update(edit)
        with open(os.path.join(d, "r.csv.partial"), "w") as f:
            f.write(_MARK + json.dumps(dict(row, cell=cell.key(), shared=shared_key(Settings()),
                                    trace_bytes=os.path.getsize(cell.trace)), sort_keys=True) + "\n")
    return setup


def _unfinished(d):
    """``u.bin``: the first 200 events of a trace whose writer died before its footer."""
    from allocsim.trace.format import TraceFileWriter
    w = TraceFileWriter(os.path.join(d, "u.bin"), {})
    w.write(random_trace(200, seed=3).records)     # written through to the file; no footer follows


def _one_event(d):
    """``one.bin``: a trace of one ALLOC, every event at one instant."""
    w = TraceWriter()
    w.alloc(100)
    w.finish().save(os.path.join(d, "one.bin"))


def _ranks_in_json(*names):
    """A ``then`` check: the ``--json`` output of a run holds one result per rank, of ``names`` in order."""
    def then(d, out):
        assert [os.path.basename(r["trace"]) for r in json.loads(out)["ranks"]] == list(names), out
    return then


#: ``run.rank0.bin`` and ``run.rank2.bin``, the second's metadata rank 1 of 2 (a copy under another rank's name)
def _misnamed(d):
    for rank, named in ((0, 0), (1, 2)):
        trace_with({"framework": "torch", "rank": rank, "world_size": 2}, name=f"run.rank{named}.bin")(d)


# session 5: the environment switches, a run named where one trace is taken, a rank's file under another's name
HUNT_5: list[Case] = [
    Case("env-interpreted-unknown-value", ["info", "{trace}"], env={"ALLOCSIM_INTERPRETED": "maybe"},
         expect="allocsim: ALLOCSIM_INTERPRETED='maybe': expected 1, true, yes or on (on), or 0, false, no, off or "
                "empty (off)", stdout_empty=True),
    Case("env-interpreted-number-two", ["replay", "{trace}", "-p", "none"], env={"ALLOCSIM_INTERPRETED": "2"},
         expect="ALLOCSIM_INTERPRETED='2'", stdout_empty=True),
    Case("fit-run-name", ["fit", "{d}/run.bin", "-p", "none", "-j", "1", "--no-oracle", "--json"], _run_of(0, 1),
         status=0, stderr_lines=0, stdout_json=True, then=_ranks_in_json("run.rank0.bin", "run.rank1.bin")),
    Case("sweep-run-name", ["sweep", "{d}/run.bin", "-p", "none", "-j", "1", "-o", "{d}/r.csv"], _run_of(0, 1),
         status=0, stderr_lines=0, outputs=["r.csv.partial"],
         then=lambda d, out: [_holds("r.csv", f"run.rank{k}.bin,none")(d, out) for k in (0, 1)]),
    Case("plot-run-name", ["plot", "{d}/run.bin", "-p", "none", "-o", "{d}/k.png"], _run_of(0, 1),
         expect="run.bin: no such file; it names a run of 2 traces ({d}/run.rank0.bin, {d}/run.rank1.bin): plot "
                "takes one; give one rank's trace, e.g. allocsim plot {d}/run.rank0.bin", outputs=["k.png"],
         stdout_empty=True),
    Case("info-run-rank-misnamed", ["info", "{d}/run.bin"], _misnamed, status=0,
         expect="allocsim: warning: {d}/run.rank2.bin: its name says rank 2, its metadata rank 1"),
    Case("replay-one-trace-misnamed", ["replay", "{d}/run.rank2.bin", "-p", "none", "--json"], _misnamed, status=0,
         stdout_json=True, expect="run.rank2.bin: its name says rank 2, its metadata rank 1 (a copy under another "
                                  "rank's name?); it is reported as rank 1"),
    Case("tune-plot-where-nothing-can-be-made", ["tune", "{trace}", "--no-fit", "-j", "1", "--plot", "/proc/a.png"],
         expect="/proc/a.png: cannot write: No such file or directory", stdout_empty=True),
    Case("compare-csv-where-nothing-can-be-made", ["compare", "{trace}", "-p", "none", "--csv", "/proc/a.csv"],
         expect="/proc/a.csv: cannot write:", stdout_empty=True),
    Case("sweep-o-where-nothing-can-be-made", ["sweep", "{trace}", "-p", "none", "-o", "/proc/a.csv"],
         expect="/proc/a.csv: cannot write:", stdout_empty=True),
    Case("plot-memory-of-one-instant-child", ["plot", "{d}/one.bin", "-p", "none", "-o", "{d}/k.png"], _one_event,
         status=0, stderr_lines=0, subprocess=True, then=_made("k.png")),
    Case("module-plugin-exits-while-loading-child", ["replay", "{trace}", "-p", "x:Pool"],
         text_file("x.py", "import sys\nsys.exit(0)\n"), subprocess=True, stdout_empty=True,
         expect="policy 'x:Pool': loading it failed at {d}/x.py:2: SystemExit: the plug-in called sys.exit(0), which "
                "cannot end allocsim"),
    Case("module-plugin-prints-json-stays-valid-child", ["replay", "{trace}", "-p", "pr:Pool", "--json"],
         text_file("pr.py", f"import sys\nsys.path.append({EXAMPLE_POLICIES!r})\nprint('hello from pr')\n"
                            "from first_fit import FirstFit as Pool\n"),
         status=0, subprocess=True, stdout_json=True, expect="hello from pr"),
    Case("entry-point-exits-while-loading-child", ["replay", "{trace}", "-p", "exits"], _installed(exits="x:Pool"),
         subprocess=True, stdout_empty=True, expect="policy 'exits': loading it failed at {d}/x.py:2: SystemExit"),
    Case("entry-point-exits-listing-goes-on-child", ["policies"], _installed(exits="x:Pool"), subprocess=True,
         then=lambda d, out: (None if "split " in out and "torch " in out else pytest.fail(out)),
         expect="policy 'exits': loading it failed at {d}/x.py:2: SystemExit"),
    Case("entry-point-names-a-missing-module-child", ["compare", "{trace}", "-p", "split,gone", "-j", "1"],
         _installed(gone="nosuch_module_xyz:Pool"), subprocess=True, stdout_empty=True,
         expect="policy 'gone': its installed entry point nosuch_module_xyz:Pool cannot be loaded: "
                "ModuleNotFoundError"),
    Case("entry-point-names-a-missing-class-child", ["replay", "{trace}", "-p", "gone"], _installed(gone="y:Nope"),
         subprocess=True, stdout_empty=True,
         expect="policy 'gone': its installed entry point y:Nope cannot be loaded: AttributeError: module 'y' has no "
                "attribute 'Nope'"),
    Case("entry-point-shadowed-by-a-built-in-child", ["policies"], _installed(split="x:Pool"), subprocess=True,
         status=0, then=lambda d, out: (None if out.count("\nsplit ") == 1 else pytest.fail(out)),
         expect="allocsim: note: the installed entry point split (x:Pool) has a built-in policy's name; -p split is "
                "the built-in"),
    Case("cap-negative-as-its-own-word", ["replay", "{trace}", "--cap", "-1GB"], stdout_empty=True,
         expect="argument --cap: expected one argument ('-1GB' starts with -, so it reads as an option; to give it as "
                "the value: --cap=-1GB)"),
    Case("output-name-starting-with-dash", ["synth", "mlp", "-o", "-x.bin"], stdout_empty=True, outputs=["-x.bin"],
         expect="to give it as the value: -o-x.bin)"),
    Case("tune-log-snapshot-over-itself", ["tune", "{d}/snapshot.pickle", "--no-fit", "--snapshot",
                                           "{d}/snapshot.pickle"], _copy_fixture("snapshot.pickle"),
         expect="snapshot.pickle: --snapshot: would overwrite the input", stdout_empty=True),
    Case("tune-log-plot-not-a-picture", ["tune", "{d}/log.csv", "--plot", "{d}/f.txt"], _copy_fixture("log.csv"),
         expect="--plot {d}/f.txt: expected a .png, .svg or .pdf path", outputs=["f.txt"], stdout_empty=True),
    Case("info-an-rmm-log-says-to-import-it", ["info", "{d}/log.csv"], _copy_fixture("log.csv"), stdout_empty=True,
         expect="log.csv: byte 0: not an allocsim trace (bad magic b'Thread,T'; expected b'ALLOCSIM'): it is an RMM "
                "log; import it first (allocsim import {d}/log.csv -o NAME.bin)"),
    Case("replay-a-snapshot-says-to-import-it", ["replay", "{d}/my snap.pickle"],
         lambda d: shutil.copy(os.path.join(FIXTURES, "snapshot.pickle"), os.path.join(d, "my snap.pickle")),
         stdout_empty=True,
         expect="it is a PyTorch memory snapshot; import it first (allocsim import '{d}/my snap.pickle' -o NAME.bin)"),
    Case("compare-a-cupy-log-says-to-import-it", ["compare", "{d}/hooks.jsonl", "-p", "none"],
         _copy_fixture("hooks.jsonl"), stdout_empty=True, expect="it is a CuPy DebugPrintHook log; import it first"),
    Case("sweep-resumed-under-other-options", ["sweep", "{trace}", "-p", "split", "--runtime", "gc", "--gc-every",
                                               "1MB", "-j", "1", "-o", "{d}/r.csv"], _partial_row("split", "gc"),
         expect="r.csv.partial: line 2: a row of a sweep under other options (--cost-model, --gc-every, --keep-going "
                "or --backend differ", outputs=["r.csv"], stdout_empty=True),
    Case("info-metadata-escape-sequences", ["info", "{d}/bad.bin"],
         trace_with({"device": {"name": "H100\x1b]0;pwned\x07", "total_memory": 1 << 30}, "command": "a\rb\x1b[2J"}),
         status=0, stderr_lines=0, then=lambda d, out: None if "\x1b" not in out and "\r" not in out and
         "H100\\x1b]0;pwned\\x07" in out and "a\\x0db\\x1b[2J" in out else pytest.fail(out)),
    Case("replay-name-with-an-escape-sequence", ["replay", "{d}/e\x1b[2Jx.bin", "-p", "none"],
         lambda d: shutil.copy(os.path.join(d, "t.bin"), os.path.join(d, "e\x1b[2Jx.bin")), status=0,
         stderr_lines=0, then=lambda d, out: None if "\x1b" not in out and "e\\x1b[2Jx.bin" in out else pytest.fail(out)),
    Case("plugin-error-message-of-several-lines", ["replay", "{trace}", "-p", "p.py:Pool"],
         _plugin_body("malloc", "raise RuntimeError('first\\nsecond\\x1b[2J')"), stdout_empty=True,
         expect="failed while replaying: RuntimeError: first\\x0asecond\\x1b[2J (raised at"),
    Case("rmm-csv-free-of-another-size", ["import", "{d}/log.csv", "-o", "{d}/o.bin"],
         fixture_line("log.csv", 4, "2342730,23:59:59.900000,free,0x7f0000000000,5,0"), status=0,
         expect="allocsim: warning: {d}/log.csv: line 4: a free of 5 bytes at 0x7f0000000000, allocated with "
                "1,048,576 bytes; the allocation's size is the one replayed", then=_made("o.bin")),
    Case("tune-headroom-zero-bytes", ["tune", "{trace}", "--headroom", "0B", "--no-fit", "-j", "1", "--json"],
         status=0, stderr_lines=0, stdout_json=True),
    Case("tune-headroom-past-1-pib", ["tune", "{trace}", "--headroom", "2PB"], stdout_empty=True,
         expect="--headroom: expected a size of at most 1 PiB, got '2PB'"),
    Case("cost-model-is-the-trace", ["replay", "{trace}", "--cost-model", "{trace}"], stdout_empty=True,
         expect="t.bin: byte 0: is an allocsim trace, not a cost model (a JSON object, as allocsim calibrate writes)"),
    Case("cost-model-is-a-snapshot", ["compare", "{trace}", "-p", "none", "--cost-model", "{d}/snapshot.pickle"],
         _copy_fixture("snapshot.pickle"), stdout_empty=True, expect="snapshot.pickle: byte 0: is a pickle"),
    Case("replay-an-unfinished-trace", ["replay", "{d}/u.bin", "-p", "none", "--json"], _unfinished, status=0,
         stdout_json=True, expect="allocsim: warning: {d}/u.bin: unfinished (its writer died, or is still writing): "
                                  "the figures are of the 200 events read"),
    Case("sweep-an-unfinished-trace", ["sweep", "{d}/u.bin", "{trace}", "-p", "none", "-j", "1", "-o", "{d}/r.csv"],
         _unfinished, status=0, outputs=["r.csv.partial"], expect="u.bin: unfinished"),
    Case("replay-run-missing-rank-then-an-error", ["replay", "{d}/run.bin", "-p", "nosuch"],
         _run_of(0, 2, world=3, name="run.rank{r}.bin"), expect="unknown policy 'nosuch'", stdout_empty=True),
    Case("sweep-run-rank-misnamed", ["sweep", "{d}/run.bin", "-p", "none", "-j", "1", "-o", "{d}/r.csv"], _misnamed,
         status=0, outputs=["r.csv.partial"], expect="run.rank2.bin: its name says rank 2"),
]


#: ``b.py``: a plug-in whose class attribute ``summary`` raises when read (a property of its metaclass)
_RAISING_SUMMARY = text_file("b.py", "from allocsim.policies import Policy\nclass Meta(type(Policy)):\n    @property\n"
                                     "    def summary(cls): raise ValueError('no summary')\n"
                                     "class Pool(Policy, metaclass=Meta):\n    pass\n")

#: Line 3 of the fixture RMM log, field by field.
_RMM_LINE_3 = {"thread": "2342727", "time": "23:59:59.200000", "action": "allocate", "pointer": "0x7f0000100000",
               "size": "256", "stream": "0x5603b2c0"}


def _rmm_line_3(expect: str, **fields) -> dict:
    """A case's arguments: import the fixture RMM log with ``fields`` of its line 3 changed; the line says
    ``expect`` and no trace is left."""
    line = ",".join({**_RMM_LINE_3, **fields}.values())
    return {"argv": ["import", "{d}/log.csv", "-o", "{d}/o.bin"], "setup": fixture_line("log.csv", 3, line),
            "expect": expect, "outputs": ["o.bin"]}


def _strict_json(d, out):
    """A ``then`` check: stdout is JSON as jq or JavaScript read it (no NaN, Infinity: only Python takes those)."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    json.loads(out, parse_constant=refuse)


def _shared_list(depth: int) -> list:
    """``[a, a]`` with ``a = [b, b]``, ... ``depth`` times: a few bytes pickled (each list once, then referenced),
    2**depth strings when printed or written out as JSON."""
    a = ["lol"]
    for _ in range(depth):
        a = [a, a]
    return a


# session 6: what fills the disk, sizes of a fraction of a byte, loose numbers, frees the CuPy log never allocated
HUNT_6: list[Case] = [
    Case("synth-iterations-past-a-million", _SYNTH + ["mlp", "-n", "1000000000"], stdout_empty=True,
         expect="iterations: at most 1,000,000 (one MARK and label each), got 1,000,000,000", outputs=["s.bin"]),
    Case("synth-trace-larger-than-the-disk", _SYNTH + ["mlp", "-n", "1000000", "-P", "layers=10000", "-P",
                                                      "hidden=16", "-q"], stdout_empty=True,
         expect="s.bin: cannot write: the trace would take about ", outputs=["s.bin"]),
    Case("cap-a-fraction-of-a-byte", ["replay", "{trace}", "--cap", "1.5"], stdout_empty=True,
         expect="--cap: '1.5' is not a whole number of bytes (a byte count is an integer; or give a unit: 1.5KB)"),
    Case("cap-of-5000-digits", ["replay", "{trace}", "--cap", "9" * 5000], stdout_empty=True,
         expect="is out of range"),        # int() and Fraction() refuse more than 4,300 digits with a ValueError
    Case("cap-with-an-exponent-of-5000-digits", ["replay", "{trace}", "--cap", "1e" + "9" * 5000],
         stdout_empty=True, expect="is out of range"),
    Case("headroom-a-fraction-of-a-byte", ["tune", "{trace}", "--headroom", "0.5B"], stdout_empty=True,
         expect="--headroom: '0.5B' is not a whole number of bytes"),
    Case("synth-size-parameter-a-fraction", _SYNTH + ["alloc-heavy", "-P", "min_size=16.5"],
         expect="parameter min_size: size: '16.5' is not a whole number of bytes", outputs=["s.bin"]),
    Case("rmm-csv-size-a-fraction", **_rmm_line_3("log.csv: line 3: bad size '1.5': expected a whole number of bytes",
                                                   size="1.5")),
    Case("rmm-csv-size-of-5000-digits", **_rmm_line_3("line 3: size '99999", size="9" * 5000)),
    Case("rmm-csv-time-of-5000-digits", **_rmm_line_3("line 3: bad time '", time="9" * 5000 + ":59:59.2")),
    Case("rmm-csv-size-with-underscores", **_rmm_line_3("log.csv: line 3: bad size '1_000': expected a whole number "
                                                        "of bytes", size="1_000")),
    Case("rmm-csv-size-with-a-plus", **_rmm_line_3("line 3: bad size '+256'", size="+256")),
    Case("rmm-csv-size-in-other-digits", **_rmm_line_3("line 3: bad size '\u0662\u0665\u0666'",
                                                       size="\u0662\u0665\u0666")),
    Case("rmm-csv-stream-with-underscores", **_rmm_line_3("line 3: bad stream '0x5603_b2c0': expected a whole number "
                                                          "(hexadecimal)", stream="0x5603_b2c0")),
    Case("rmm-csv-pointer-with-underscores", **_rmm_line_3("line 3: bad pointer '0x7f00_0010_0000'",
                                                           pointer="0x7f00_0010_0000")),
    Case("rmm-csv-time-with-underscores", **_rmm_line_3("line 3: bad time '2_3:59:59.200000'",
                                                        time="2_3:59:59.200000")),
    Case("cupy-jsonl-size-a-fraction", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin"],
         fixture_line("hooks.jsonl", 2, '{"hook":"malloc","device_id":0,"size":1.5,"mem_size":512,'
                                        '"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}'),
         expect="hooks.jsonl: line 2: size is 1.5, expected a non-negative integer (a whole number of bytes)",
         outputs=["o.bin"]),
    Case("bestfit-segment-none", ["replay", "{trace}", "-p", "bestfit[segment=none]"], stdout_empty=True,
         expect="policy 'bestfit': option segment: expected a size (such as its default 2MiB), got 'none' (no limit "
                "is for the options whose default is none)"),
    Case("binned-max-pool-unlimited", ["compare", "{trace}", "-p", "binned", "-O", "max_pool=unlimited"],
         stdout_empty=True, expect="option max_pool: expected a size (such as its default 128MiB), got 'unlimited'"),
    Case("synth-max-size-none", _SYNTH + ["alloc-heavy", "-P", "max_size=none"], outputs=["s.bin"],
         expect="parameter max_size: expected a size (such as its default 4MiB), got 'none'"),
    Case("tune-log-warns-as-import-does", ["tune", "{d}/log.csv", "--no-fit", "-j", "1", "--json"],
         fixture_line("log.csv", 4, "2342730,23:59:59.900000,free,0x7f0000000000,5,0"), status=0, stderr_lines=3,
         stdout_json=True, expect="allocsim: warning: {d}/log.csv: line 4: a free of 5 bytes at 0x7f0000000000, "
                                  "allocated with 1,048,576 bytes; the allocation's size is the one replayed"),
    Case("tune-cupy-log-cut-short-warns", ["tune", "{d}/h.jsonl", "--no-fit", "-j", "1", "--json"],
         text_file("h.jsonl", pathlib.Path(_HOOKS).read_text() + '{"hook":"mal'), status=0, stderr_lines=3,
         stdout_json=True, expect="allocsim: warning: {d}/h.jsonl: line 10: last line is cut short"),
    Case("cupy-jsonl-double-free", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin"],
         text_file("hooks.jsonl", "\n".join(_HOOK_LINES + [_HOOK_LINES[8]]) + "\n"), outputs=["o.bin"],
         expect="hooks.jsonl: line 10: free of unknown pmem_id '0x7f39200c52b0' at mem_ptr 0x230a4c0200 (no open malloc "
                "with it: never allocated, or already freed)"),
    Case("cupy-jsonl-free-at-another-pointer", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin"],
         fixture_line("hooks.jsonl", 9, _HOOK_LINES[8].replace("150496608768", "150496609280")), outputs=["o.bin"],
         expect="hooks.jsonl: line 9: free of pmem_id '0x7f39200c52b0' at mem_ptr 0x230a4c0400, but its open malloc "
                "is at 0x230a4c0200"),
    Case("cupy-jsonl-malloc-at-an-open-pointer", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin"],
         fixture_line("hooks.jsonl", 5, _HOOK_LINES[4].replace("150496608256", "150496608768")), outputs=["o.bin"],
         expect="hooks.jsonl: line 5: malloc at mem_ptr 0x230a4c0200, where the malloc of line 3 is not freed yet"),
    Case("cupy-jsonl-free-of-another-size", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin"],
         fixture_line("hooks.jsonl", 9, _HOOK_LINES[8].replace('"mem_size":1024', '"mem_size":2048')), status=0,
         then=_made("o.bin"), expect="allocsim: warning: {d}/hooks.jsonl: line 9: a free of 2,048 bytes at mem_ptr "
                                     "0x230a4c0200, malloc'd with mem_size 1,024; the allocation's size is the one "
                                     "replayed"),
    Case("torch-snapshot-divisions-list-short", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["allocator_settings"].update(roundup_power2_divisions=[1, 2])), outputs=["o.bin"],
         expect="snap.pickle: metadata: allocator_settings: roundup_power2_divisions: a list of 2 entries, expected "
                "one per interval (16)"),
    Case("torch-snapshot-divisions-not-a-power-of-two", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["allocator_settings"].update(roundup_power2_divisions={"1": 3, "2": 0})),
         outputs=["o.bin"], expect="allocator_settings: roundup_power2_divisions entry 3 is neither 0 nor a power of 2"),
    Case("meta-divisions-list-short-replay", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with({"framework": "torch", "allocator_settings": {"roundup_power2_divisions": [1, 2]}}),
         stdout_empty=True, expect="bad.bin: metadata: allocator_settings: roundup_power2_divisions: a list of 2"),
    # the note comes as the arguments are read: the unknown policy then stops the sweep before any worker starts
    Case("dask-local-capped-at-cores", ["sweep", "{trace}", "-p", "nosuch", "--dask-local", "99999", "-o", "{d}/r.csv"],
         stderr_lines=2, expect=f"allocsim: note: --dask-local 99999 is more than the {os.cpu_count()} cores here; "
                                f"using {os.cpu_count()}", outputs=["r.csv", "r.csv.partial"], subprocess=True),
    Case("sweep-format-csv-contradicts-a-json-name", ["sweep", "{trace}", "-p", "none", "-o", "{d}/r.json", "--format",
                                                      "csv"], expect="-o {d}/r.json: --format csv contradicts the .json "
                                                                     "name", outputs=["r.json", "r.json.partial"]),
    Case("plugin-declaration-raises", ["replay", "{trace}", "-p", "b.py:Pool"], _RAISING_SUMMARY, stdout_empty=True,
         expect="policy 'b.py:Pool' failed while its declaration (name, summary, params) was read: ValueError: no "
                "summary (raised at {d}/b.py:4)"),
    Case("entry-point-declaration-raises-child", ["compare", "{trace}", "-p", "split,bad", "-j", "1"],
         lambda d: (_installed(bad="b:Pool")(d), _RAISING_SUMMARY(d)), subprocess=True, stdout_empty=True,
         expect="policy 'bad' failed while its declaration (name, summary, params) was read: ValueError: no summary"),
    Case("torch-option-with-underscores", ["replay", "{trace}", "-p", "torch", "-O", "max_split_size_mb=1_000"],
         stdout_empty=True, expect="policy 'torch': option max_split_size_mb: expected an integer, got '1_000'"),
    Case("torch-threshold-in-other-digits", ["compare", "{trace}", "-p", "torch[garbage_collection_threshold:0.\u0665]"],
         stdout_empty=True, expect="option garbage_collection_threshold: expected a number, got '0.\u0665'"),
    Case("synth-param-with-underscores", _SYNTH + ["mlp", "-P", "batch=1_6"], outputs=["s.bin"],
         expect="preset 'mlp' parameter batch: expected an integer, got '1_6'"),
    Case("meta-alloc-conf-with-underscores", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with({"framework": "torch", "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:2_00"}}),
         stdout_empty=True, expect="bad.bin: metadata: allocator_settings: "),
    Case("torch-snapshot-settings-shared-list", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["allocator_settings"].update(x=_shared_list(40))), outputs=["o.bin"],
         expect="snap.pickle: metadata: allocator_settings: more than 10,000 values (with the lists the pickle shares "
                "expanded, as the trace's JSON metadata would hold them): not a PyTorch allocator's settings"),
    Case("torch-snapshot-action-shared-list", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["device_traces"][0][0].update(action=_shared_list(40))), outputs=["o.bin"],
         expect="snap.pickle: device_traces[0][0]: action is [[[[...], [...]], [[...], [...]]], [[[...], [...]], "
                "[[...], [...]]]], expected a string"),
    Case("torch-snapshot-time-shared-list", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["device_traces"][0][1].update(time_us=_shared_list(40))), outputs=["o.bin"],
         expect="device_traces[0][1]: time_us is [[[[...]"),
    Case("torch-snapshot-frames-and-segment-type-shared-lists", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: [s["segments"][0].update(segment_type=_shared_list(40))] +
                       [e.update(frames=[{"filename": _shared_list(40), "name": _shared_list(40)}])
                        for e in s["device_traces"][0]]), status=0, stderr_lines=2, then=_made("o.bin"),
         expect="snap.pickle: ignored unknown actions: annotate x1"),
    Case("torch-snapshot-stream-of-5000-digits", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["device_traces"][0][1].update(stream=10**5000)), outputs=["o.bin"],
         expect="snap.pickle: device_traces[0][1]: stream is an integer of 16,610 bits, expected a non-negative "
                "integer"),         # repr() refuses an int of 4,300 digits with a ValueError
    Case("torch-snapshot-setting-of-5000-digits", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["allocator_settings"].update(pinned_num_register_threads=10**5000)),
         outputs=["o.bin"], expect="snap.pickle: metadata: allocator_settings: an integer of 16,610 bits (JSON "
                                   "metadata holds none past 64): not a PyTorch allocator's settings"),
    Case("torch-snapshot-frame-line-of-5000-digits", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: [e.update(frames=[{"filename": "x.py", "line": 10**5000, "name": "f"}])
                                  for e in s["device_traces"][0]]), status=0, stderr_lines=2, then=_made("o.bin"),
         expect="snap.pickle: ignored unknown actions: annotate x1"),
    Case("cupy-jsonl-device-id-a-string", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin"],
         fixture_line("hooks.jsonl", 2, _HOOK_LINES[1].replace('"device_id":0', '"device_id":"0"')), outputs=["o.bin"],
         expect="hooks.jsonl: line 2: device_id is '0', expected an integer (the device's index)"),
    Case("cupy-jsonl-device-id-true", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin", "--device", "1"],
         fixture_line("hooks.jsonl", 2, _HOOK_LINES[1].replace('"device_id":0', '"device_id":true')), outputs=["o.bin"],
         expect="hooks.jsonl: line 2: device_id is True, expected an integer"),
    Case("torch-snapshot-segment-device-a-string", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["segments"][0].update(device="0")), outputs=["o.bin"],
         expect="snap.pickle: segments[0]: device is '0', expected a non-negative integer"),
    Case("torch-snapshot-no-events-segment-device-a-list", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: (s.update(device_traces=[[], []]), s["segments"][0].update(device=[1]))),
         outputs=["o.bin"], expect="snap.pickle: segments[0]: device is [1], expected a non-negative integer"),
    Case("torch-snapshot-is-expandable-a-string", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         snapshot_with(lambda s: s["segments"][0].update(is_expandable="False")), outputs=["o.bin"],
         expect="snap.pickle: segments[0]: is_expandable is 'False', expected True or False"),
    Case("meta-max-split-a-fraction-of-a-byte", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with({"framework": "torch", "allocator_settings": {"max_split_size": (1 << 30) + 0.5}}),
         stdout_empty=True, expect="bad.bin: metadata: allocator_settings: max_split_size 1073741824.5: expected a "
                                   "whole number of bytes"),
    Case("meta-expandable-segments-a-string", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with({"framework": "torch", "allocator_settings": {"expandable_segments": "False"}}), stdout_empty=True,
         expect="bad.bin: metadata: allocator_settings: expandable_segments 'False': expected true or false"),
    Case("meta-gc-threshold-a-string", ["compare", "{d}/bad.bin", "-p", "torch"],
         trace_with({"framework": "torch", "allocator_settings": {"garbage_collection_threshold": "0.5"}}),
         stdout_empty=True, expect="allocator_settings: garbage_collection_threshold '0.5': expected a number"),
    Case("meta-initial-segment-address-a-fraction", ["info", "{d}/bad.bin"],
         trace_with({"initial_segments": [{"address": 1.5, "total_size": 2 << 20}]}), stdout_empty=True,
         expect="bad.bin: metadata: initial_segments[0].address: expected an address (an integer >= 0), got 1.5"),
    Case("info-json-of-metadata-holding-nan", ["info", "{d}/bad.bin", "--json"],
         trace_with({"framework_version": float("nan"), "pool": float("inf")}), status=0, stderr_lines=0,
         then=_strict_json),
    Case("plot-under-an-unknown-mplbackend", ["plot", "{trace}", "-p", "none", "-o", "{d}/k.png"],
         env={"MPLBACKEND": "nonsense"}, status=0, stderr_lines=0, then=_made("k.png")),
    # counts on the command line: ASCII digits (Python's int() reads 1_0 as 10 and other scripts' digits as ours)
    Case("synth-iterations-with-underscores", _SYNTH + ["mlp", "-n", "1_0"], outputs=["s.bin"],
         expect="argument --iterations/-n: expected a positive integer, got '1_0'"),
    Case("synth-seed-in-other-digits", _SYNTH + ["mlp", "--seed", "\u0663"], outputs=["s.bin"],
         expect="argument --seed: expected a non-negative integer, got '\u0663'"),
    Case("tune-top-with-a-plus", ["tune", "{trace}", "--top", "+3"], stdout_empty=True,
         expect="argument --top: expected a positive integer, got '+3'"),
    Case("tune-max-replays-with-underscores", ["tune", "{trace}", "--max-replays", "1_0"], stdout_empty=True,
         expect="argument --max-replays: expected a non-negative integer (0: no limit), got '1_0'"),
    Case("fit-max-replays-negative", ["fit", "{trace}", "--max-replays", "-1"], stdout_empty=True,
         expect="argument --max-replays: expected a non-negative integer (0: no limit), got -1"),
    Case("import-device-in-other-digits", ["import", "{d}/hooks.jsonl", "-o", "{d}/o.bin", "--device", "\u0661"],
         fixture_line("hooks.jsonl", 1, _HOOK_LINES[0]), outputs=["o.bin"],
         expect="argument --device: expected a non-negative integer, got '\u0661'"),
    Case("calibrate-reps-with-underscores", ["calibrate", "--reps", "2_0", "-o", "{d}/c.json"], outputs=["c.json"],
         expect="argument --reps: expected a positive integer, got '2_0'"),
    Case("record-max-events-with-underscores", ["record", "--max-events", "1_000", "{d}/train.py"],
         setup=_TORCH_SCRIPT, expect="argument --max-events: expected a positive integer, got '1_000'"),
    Case("jobs-in-other-digits", ["compare", "{trace}", "-p", "split", "-j", "\u0662"], stdout_empty=True,
         expect="argument -j/--jobs: expected a positive integer, got '\u0662'"),
    Case("synth-seed-minus-zero", _SYNTH + ["mlp", "--seed", "-0"], outputs=["s.bin"],
         expect="argument --seed: expected a non-negative integer, got -0"),
    Case("synth-seed-of-5000-digits", _SYNTH + ["mlp", "--seed", "9" * 5000], outputs=["s.bin"],
         expect="argument --seed: expected a non-negative integer below 10**18, got a number of 5000 digits"),
    Case("dask-local-with-underscores", ["sweep", "{trace}", "--dask-local", "1_0", "-o", "{d}/r.csv"],
         expect="argument --dask-local: expected a positive integer, got '1_0'", outputs=["r.csv", "r.csv.partial"]),
]

# issue 29 (helper hard2): outputs that vanish or land on the user's files. A disk that fills is a limit on a file's
# size (RLIMIT_FSIZE: "File too large", as "No space left on device" would be); PYTHONUNBUFFERED=1 (python -u, common
# in containers) has stdout's text layer write straight to the file, where a short write went unnoticed
_UNBUFFERED = {"PYTHONUNBUFFERED": "1"}
_BUFFERED = {"PYTHONUNBUFFERED": ""}
_STDOUT_FULL = "allocsim: standard output: File too large"
_STDOUT_CLOSED = "allocsim: standard output is closed (started with >&-): the report could not be written"


def _stdout_full(id_: str, argv: list, env=_UNBUFFERED) -> Case:
    """A report to a stdout on a disk with 256 bytes left: one line, exit 2, and no half report in the file."""
    return Case(id_, argv, room=256, env=env, expect=_STDOUT_FULL, stdout_empty=True)


def _stdout_closed(id_: str, argv: list) -> Case:
    return Case(id_, argv, stdout_closed=True, expect=_STDOUT_CLOSED)


FILLS: list[Case] = [
    _stdout_full("replay-json-to-a-full-disk", ["replay", "{trace}", "-p", "split", "--json"]),
    _stdout_full("info-json-to-a-full-disk", ["info", "{trace}", "--json"]),
    _stdout_full("compare-json-to-a-full-disk", ["compare", "{trace}", "-p", "split,none", "-j", "1", "--json"]),
    _stdout_full("tune-json-to-a-full-disk", ["tune", "{trace}", "--no-fit", "-j", "1", "--json"]),
    _stdout_full("fit-json-to-a-full-disk", ["fit", "{trace}", "-p", "none", "-j", "1", "--json"]),
    _stdout_full("policies-to-a-full-disk", ["policies"]),
    _stdout_full("replay-text-to-a-full-disk", ["replay", "{trace}", "-p", "split"]),
    _stdout_full("replay-json-to-a-full-disk-buffered", ["replay", "{trace}", "-p", "split", "--json"], env=_BUFFERED),
    _stdout_full("help-to-a-full-disk", ["replay", "--help"]),
    _stdout_closed("replay-json-to-a-closed-stdout", ["replay", "{trace}", "-p", "split", "--json"]),
    _stdout_closed("info-json-to-a-closed-stdout", ["info", "{trace}", "--json"]),
    _stdout_closed("compare-json-to-a-closed-stdout", ["compare", "{trace}", "-p", "split", "-j", "1", "--json"]),
    _stdout_closed("tune-json-to-a-closed-stdout", ["tune", "{trace}", "--no-fit", "-j", "1", "--json"]),
    _stdout_closed("replay-text-to-a-closed-stdout", ["replay", "{trace}", "-p", "split"]),
    _stdout_closed("version-to-a-closed-stdout", ["--version"]),
    # a sweep's partial table beside the output is the sweep's only if it says so: the user's is refused, left as it is
    Case("sweep-beside-the-users-partial-file", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o", "{d}/r.csv"],
         text_file("r.csv.partial", "my notes on r.csv\n"), outputs=["r.csv"],
         expect="allocsim: {d}/r.csv.partial: line 1: exists and is not a partial table a sweep wrote"),
    Case("sweep-beside-the-users-one-line-partial-file", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o",
                                                          "{d}/r.csv"], text_file("r.csv.partial", "{\"draft"),
         outputs=["r.csv"], expect="r.csv.partial: line 1: exists and is not a partial table a sweep wrote"),
    Case("sweep-beside-the-users-empty-partial-file", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o",
                                                       "{d}/r.csv"], text_file("r.csv.partial", ""),
         outputs=["r.csv"], expect="r.csv.partial: line 1: exists and is not a partial table a sweep wrote"),
    Case("sweep-partial-a-link-to-the-users-notes", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o", "{d}/q.csv"],
         lambda d: (_write("notes.txt", "notes\n")(d), os.symlink("notes.txt", os.path.join(d, "q.csv.partial"))),
         outputs=["q.csv"],
         expect="allocsim: {d}/q.csv.partial: is a symbolic link, not a partial table a sweep wrote"),
    Case("sweep-partial-a-link-to-a-sweeps-partial", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o",
                                                      "{d}/q.csv"],
         lambda d: (_write("r.csv.partial", _MARK)(d), os.symlink("r.csv.partial", os.path.join(d, "q.csv.partial"))),
         outputs=["q.csv"], expect="q.csv.partial: is a symbolic link"),
    Case("sweep-partial-a-fifo", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o", "{d}/q.csv"],
         lambda d: os.mkfifo(os.path.join(d, "q.csv.partial")), outputs=["q.csv"],
         expect="q.csv.partial: -o: is a pipe"),
    # every file output on the same disk: one line naming the file, exit 2, nothing half-written left
    Case("compare-csv-on-a-full-disk", ["compare", "{trace}", "-p", "split,none", "-j", "1", "--csv", "{d}/c.csv"],
         room=256, expect="allocsim: {d}/c.csv: cannot write: File too large", outputs=["c.csv"]),
    Case("sweep-on-a-full-disk", ["sweep", "{trace}", "-p", "split,none", "-j", "1", "-o", "{d}/x.csv"], room=256,
         expect="allocsim: {d}/x.csv.partial: cannot write: File too large", outputs=["x.csv", "x.csv.partial"]),
    Case("sweep-jsonl-on-a-full-disk", ["sweep", "{trace}", "-p", "split", "-j", "1", "-o", "{d}/x.jsonl"], room=256,
         expect="allocsim: {d}/x.jsonl.partial: cannot write: File too large",
         outputs=["x.jsonl", "x.jsonl.partial"]),
    Case("plot-on-a-full-disk", ["plot", "{trace}", "-p", "split", "-o", "{d}/m.png"], room=4096,
         expect="allocsim: {d}/m.png: cannot write: File too large", outputs=["m.png"], stdout_empty=True),
    Case("replay-snapshot-on-a-full-disk", ["replay", "{trace}", "-p", "torch", "--snapshot", "{d}/s.pickle"],
         room=256, expect="allocsim: {d}/s.pickle: cannot write: File too large", outputs=["s.pickle"],
         stdout_empty=True),
    Case("synth-on-a-full-disk", ["synth", "mlp", "-q", "-o", "{d}/s.bin"], room=256,
         expect="allocsim: {d}/s.bin: cannot write: File too large", outputs=["s.bin"], stdout_empty=True),
    Case("import-on-a-full-disk", ["import", "{d}/log.csv", "-o", "{d}/o.bin"], setup=_copy_fixture("log.csv"),
         room=256, expect="allocsim: {d}/o.bin: cannot write: File too large", outputs=["o.bin"], stdout_empty=True),
]


def _cap_is(expected):
    """A ``then`` check: the JSON of a replay, tune (one object) or compare (rows) was run under the cap
    ``expected(trace)`` bytes, from the case's trace."""
    def then(d, out):
        from allocsim.trace import Trace
        doc = json.loads(out)
        caps = {r["cap_bytes"] for r in doc} if isinstance(doc, list) else {doc["cap_bytes"]}
        assert caps == {expected(Trace.load(os.path.join(d, "t.bin")))}, caps
    return then


_RELATIVE_CAPS = [      # --cap as a user types it: 1.2x of the trace's LOAD, 90% of the device (as PyTorch's fraction)
    Case("replay-cap-a-multiple-of-load", ["replay", "{trace}", "-p", "split", "--cap", "1.2x", "--json"], status=0,
         stderr_lines=0, then=_cap_is(lambda t: int(1.2 * t.load_bytes))),
    Case("tune-cap-a-multiple-of-load", ["tune", "{trace}", "--no-fit", "-j", "1", "--cap", "1.5X", "--json"],
         status=0, stderr_lines=0, then=_cap_is(lambda t: int(1.5 * t.load_bytes))),
    Case("compare-caps-a-share-of-the-capacity", ["compare", "{trace}", "-p", "split", "-j", "1", "--capacity", "10GB",
                                                  "--caps", "90%", "--json"], status=0, stderr_lines=0,
         then=_cap_is(lambda t: int(0.9 * 10**9 * 10))),
] + [Case(f"{argv[0]}-cap-{name}", [*argv, f"{flag}={bad}"], stdout_empty=True, expect=f"{flag}: {expect}",
          outputs=["r.csv", "r.csv.partial", "m.png"])
     for *argv, flag in (["replay", "{trace}", "--cap"], ["compare", "{trace}", "-p", "split", "-j", "1", "--caps"],
                         ["tune", "{trace}", "--no-fit", "-j", "1", "--cap"],
                         ["plot", "{trace}", "-p", "split", "-o", "{d}/m.png", "--caps"],
                         ["sweep", "{trace}", "-p", "split", "-j", "1", "-o", "{d}/r.csv", "--caps"])
     for name, bad, expect in (
         ("x-twice", "1.2xx", "cannot parse cap '1.2xx' (examples: 8GB, none, 1.2x: 1.2 × the trace's LOAD, 90%: of "
                              "the device's memory)"),
         ("a-negative-share", "-5%", "negative size '-5%'"),
         ("zero-times-load", "0x", "'0x' caps at 0 bytes; a cap is more than 0 (none: no cap)"),
         ("twice-the-device", "200%", "'200%' is more than all of "),
         ("past-any-float", "1e999x", "'1e999x' is out of range"),
         ("a-share-of-no-device", "90%", "'90%' is a share of the device's memory, which is not known here (no "
                                         "--capacity, none recorded in the trace); give --capacity"))]

# issue 29 (helper hard1): a run's traces that do not belong together, sizes past the model's address space
def _process(name: str, events: int = 40, **meta):
    """A setup writing ``name``, a torch process's trace of ``events`` allocations and frees (1 µs apart) made by
    allocsim's own `TraceWriter`, its metadata ``meta``."""
    def setup(d):
        w = TraceWriter(meta={"framework": "torch", **meta}, path=os.path.join(d, name))
        live = []
        for k in range(events):
            if k % 3 == 2:
                w.free(live.pop(0), t=k * 1000)
            else:
                live.append(w.alloc((k % 7 + 1) << 20, t=k * 1000))
        w.finish()
    return setup


def _processes(*setups):
    return lambda d: [s(d) for s in setups]


#: the two ranks of a run recorded with ``allocsim record -o run.bin -- torchrun ...``, as the recorder writes them
def _rank(rank: int, name: str | None = None, *, at="2026-11-25T22:51:30+0000", command="train.py", output="run.bin",
          **meta):
    return _process(name or f"run.rank{rank}.bin", rank=rank, world_size=2, host="vm", recorded_at=at,
                    run={"output": output, "command": ["torchrun", "--nproc-per-node", "2", command]}, **meta)


_TWO_NAMES = "run.rank01.bin and {d}/run.rank1.bin are both rank 1 of 2: a run holds one trace per process"
HUNT_29_RUNS: list[Case] = [
    Case("info-run-world-size-a-million", ["info", "{d}/run.bin"], _run_of(0, 1, world=10**6), status=0,
         expect="run.bin: no trace of ranks 2\u2013999,999 of its 1,000,000 (999,998 missing; {d}/run.rank2.bin does "
                "not exist): the run's figures leave them out"),
    Case("tune-run-world-size-10-to-the-15", ["tune", "{d}/run.bin", "--max-replays", "2", "--no-fit", "--json"],
         _run_of(0, 1, world=10**15), status=0, stdout_json=True,
         expect="no trace of ranks 2\u2013999,999,999,999,999 of its 1,000,000,000,000,000 (999,999,999,999,998 "
                "missing;"),
    Case("info-run-every-other-rank-missing", ["info", "{d}/run.bin"], _run_of(0, 2, 4, 6, 8, 10, world=100, name="run.rank{r}.bin"),
         status=0, expect="no trace of ranks 1, 3, 5, 7, ... of its 100 (94 missing; {d}/run.rank1.bin"),
    Case("info-run-of-rank-1-alone", ["info", "{d}/m.bin"], _run_of(1, name="m.rank{r}.bin"), status=0,
         expect="m.bin: no trace of rank 0 of its 2 ({d}/m.rank0.bin does not exist): the run's figures leave it out"),
    Case("tune-run-of-rank-1-alone", ["tune", "{d}/m.bin", "--max-replays", "2", "--no-fit", "--json"],
         _run_of(1, name="m.rank{r}.bin"), status=0, stdout_json=True, expect="m.bin: no trace of rank 0 of its 2"),
    Case("plot-run-of-rank-1-alone", ["plot", "{d}/m.bin", "-p", "none", "-o", "{d}/k.png"],
         _run_of(1, name="m.rank{r}.bin"), status=0, then=_made("k.png"), expect="m.bin: no trace of rank 0 of its 2"),
    Case("info-run-one-rank-under-two-names", ["info", "{d}/run.bin"], _processes(_rank(1), _rank(1, "run.rank01.bin")), expect=_TWO_NAMES, stdout_empty=True),
    Case("tune-run-one-rank-under-two-names", ["tune", "{d}/run.bin", "--max-replays", "2", "--no-fit", "--json"],
         _processes(_rank(0), _rank(1), _rank(1, "run.rank01.bin")), expect=_TWO_NAMES, stdout_empty=True),
    Case("info-run-one-pid-under-two-names", ["info", "{d}/run.bin"],
         _processes(_process("run.pid7.bin", pid=7), _process("run.pid07.bin", pid=7)),
         expect="run.pid07.bin and {d}/run.pid7.bin are both pid 7: a run holds one trace per process",
         stdout_empty=True),
    Case("replay-run-of-two-frameworks", ["replay", "{d}/run.bin", "-p", "none"],
         _processes(_rank(0), _rank(1, framework="cupy")), stdout_empty=True,
         expect="run.bin: its traces disagree on the framework: {d}/run.rank0.bin says torch, {d}/run.rank1.bin says "
                "cupy: traces of two runs under one name?"),
    Case("compare-run-ranks-of-two-commands", ["compare", "{d}/run.bin", "-p", "none"],
         _processes(_rank(0), _rank(1, command="eval.py")), stdout_empty=True,
         expect="run.bin: its traces disagree on the run's command: {d}/run.rank0.bin says torchrun --nproc-per-node 2 "
                "train.py, {d}/run.rank1.bin says torchrun --nproc-per-node 2 eval.py"),
    Case("tune-run-ranks-of-two-runs", ["tune", "{d}/run.bin", "--max-replays", "2", "--no-fit"],
         _processes(_rank(0), _rank(1, output="ddp.bin")), stdout_empty=True,
         expect="run.bin: its traces disagree on the run's name: {d}/run.rank0.bin says run.bin, {d}/run.rank1.bin "
                "says ddp.bin"),
    Case("info-run-ranks-recorded-days-apart", ["info", "{d}/run.bin", "--json"],
         _processes(_rank(0), _rank(1, at="2026-11-27T09:00:00+0000")), status=0, stdout_json=True,
         expect="run.bin: {d}/run.rank1.bin was recorded at 2026-11-27T09:00:00+0000, after {d}/run.rank0.bin's "
                "recording (from 2026-11-25T22:51:30+0000) had ended: traces of two runs under one name?"),
    Case("info-run-ranks-recorded-together", ["info", "{d}/run.bin", "--json"],
         _processes(_rank(0), _rank(1, at="2026-11-25T22:51:42+0000")), status=0, stderr_lines=0,
         stdout_json=True),
]

def _sized(*sizes, framework="torch", total=1 << 50, segment=None, **settings):
    """A setup writing ``big.bin``: allocations of ``sizes`` on a device of ``total`` bytes, all live at once, then
    freed; ``segment=(address, bytes)`` a recorded segment first, under the ``settings`` of its allocator."""
    def setup(d):
        meta = {"framework": framework, "device": {"name": "big", "total_memory": total}}
        w = TraceWriter(meta={**meta, **({"allocator_settings": settings} if settings else {})},
                        path=os.path.join(d, "big.bin"))
        if segment:
            w.segment(ev.SEGMENT_ALLOC, *segment, t=0)
        ids = [w.alloc(n, t=k + 1) for k, n in enumerate(sizes)]
        for i in ids:
            w.free(i, t=len(sizes) + 1)
        w.finish()
    return setup


_TOP_OF_64_BITS = (2**64 - (20 << 20), 20 << 20)
_PAST_THE_MODEL = "big.bin: event 0: SEGMENT_ALLOC at 0xfffffffffec00000 of 20,971,520 bytes ends past 2**62"
HUNT_29_SIZES: list[Case] = [
    Case("replay-a-request-past-the-driver-space", ["replay", "{d}/big.bin", "-p", "torch"], _sized(2**47), status=0,
         stderr_lines=0, then=lambda d, out: _holds_line(out, "peak reserved", "128.00 TiB")),
    Case("compare-a-request-past-the-driver-space", ["compare", "{d}/big.bin", "-p", "torch,cupy", "-j", "1"],
         _sized(2**47), status=0, stderr_lines=0),
    Case("tune-a-request-past-the-driver-space", ["tune", "{d}/big.bin", "--max-replays", "3", "--no-fit", "--json"],
         _sized(2**47), status=0, stderr_lines=0, stdout_json=True),
    Case("replay-cupy-requests-past-the-driver-space", ["replay", "{d}/big.bin", "-p", "cupy"],
         _sized(2**46, 2**46, 2**46, framework="cupy"), status=0, stderr_lines=0,
         then=lambda d, out: _holds_line(out, "peak reserved", "192.00 TiB")),
    Case("replay-segment-at-the-top-of-64-bits", ["replay", "{d}/big.bin", "-p", "torch"],
         _sized(1 << 20, segment=_TOP_OF_64_BITS), expect=_PAST_THE_MODEL, stdout_empty=True),
    Case("compare-segment-at-the-top-of-64-bits", ["compare", "{d}/big.bin", "-p", "split,torch", "-j", "1"],
         _sized(1 << 20, segment=_TOP_OF_64_BITS), expect=_PAST_THE_MODEL, stdout_empty=True),
    Case("tune-segment-at-the-top-of-64-bits", ["tune", "{d}/big.bin", "--max-replays", "3", "--no-fit"],
         _sized(1 << 20, segment=_TOP_OF_64_BITS), expect=_PAST_THE_MODEL, stdout_empty=True),
    Case("replay-expandable-segment-below-2-to-the-63", ["replay", "{d}/big.bin", "-p", "torch"],
         _sized(1 << 20, segment=(2**63 - (2 << 20), 2 << 20), expandable_segments=True), stdout_empty=True,
         expect="big.bin: event 0: SEGMENT_ALLOC at 0x7fffffffffe00000 of 2,097,152 bytes ends past 2**62"),
    Case("replay-cupy-segment-at-the-top-of-64-bits", ["replay", "{d}/big.bin", "-p", "cupy"],
         _sized(1 << 20, framework="cupy", segment=_TOP_OF_64_BITS), expect=_PAST_THE_MODEL, stdout_empty=True),
    Case("replay-segment-ending-at-2-to-the-62", ["replay", "{d}/big.bin", "-p", "torch"],
         _sized(1 << 20, segment=(2**62 - (2 << 20), 2 << 20), expandable_segments=True), status=0,
         stderr_lines=0),
]


# ---------------------------------------------------------------------------------------------
# stop 49's hunt: numbers past Python's int conversion, a worker that dies, a plug-in message that fails, and
# inputs that were quoted whole, read as the wrong kind, or taken without a word
_LONG = "9" * 5000          # (past `sys.get_int_max_str_digits`: a ValueError `json.loads` raises beyond its own)
_SETTINGS = "allocator_settings"
_EXITS = text_file("x.py", "import os\nfrom allocsim.policies import Policy\nclass X(Policy):\n"
                           "    def malloc(self, *a): os._exit(3)\n")
_STR_RAISES = text_file("q.py", "from allocsim.policies import Policy\nclass E(Exception):\n"
                                "    def __str__(self): raise ValueError('x')\nclass P(Policy):\n"
                                "    def malloc(self, *a): raise E()\n")
_CSV_HEAD = "Thread,Time,Action,Pointer,Size,Stream\n"


def _append(d, name, data: bytes, fixture: bool = False) -> None:
    """Append ``data`` to ``name`` in the case's folder (first copied from tests/fixtures: ``fixture``)."""
    if fixture:
        _copy_fixture(name)(d)
    with open(os.path.join(d, name), "ab") as f:
        f.write(data)

HUNT_49: list[Case] = [
    Case("meta-number-of-5000-digits", ["info", "{d}/bad.bin"], trace_with(long_number="metadata"),
         expect="bad.bin: byte 64: metadata is not valid JSON (a number of more than", stdout_empty=True),
    Case("footer-number-of-5000-digits", ["replay", "{d}/bad.bin"], trace_with(long_number="footer"),
         expect="footer is not valid JSON (a number of more than", stdout_empty=True),
    Case("cost-model-number-of-5000-digits", ["replay", "{trace}", "--cost-model", "{d}/c.json"],
         text_file("c.json", '{"pool_hit_s": %s}' % _LONG), expect="c.json: line 1: not valid JSON: a number of more than",
         stdout_empty=True),
    Case("cupy-log-number-of-5000-digits", ["import", "{d}/h.jsonl", "--format", "cupy", "-o", "{d}/o.bin"],
         text_file("h.jsonl", '{"hook": "malloc", "device_id": %s}\n' % _LONG),
         expect="h.jsonl: line 1: bad JSON (a number of more than", outputs=["o.bin"]),
    Case("compare-worker-that-dies", ["compare", "{trace}", "-p", "split,x.py:X", "-j", "2"], _EXITS,
         expect="a worker process of the pool (-j 2) died before its replay finished", stdout_empty=True,
         subprocess=True),
    Case("replay-plugin-whose-message-raises", ["replay", "{trace}", "-p", "q.py:P"], _STR_RAISES,
         expect="failed while replaying: E: <its message could not be made: ValueError in its __str__>",
         stdout_empty=True),
    Case("plot-report-dash", ["plot", "{trace}", "-p", "none", "--report", "-"], expect="-: cannot write: allocsim "
         "does not take - for standard output", outputs=["-"], stdout_empty=True),
    Case("plot-o-empty-name", ["plot", "{trace}", "-p", "none", "-o", ""], expect="the file name is empty"),
    Case("replay-gc-threshold-past-1", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with({"framework": "torch", _SETTINGS: {"garbage_collection_threshold": 5.0}}),
         expect="bad.bin: metadata: allocator_settings: garbage_collection_threshold 5.0 must lie in (0.0, 1.0)"),
    Case("replay-divisions-key-not-a-number", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with({"framework": "torch", _SETTINGS: {"roundup_power2_divisions": {"abc": 4}}}),
         expect="roundup_power2_divisions key 'abc' is not a whole number of MiB", stdout_empty=True),
    Case("import-csv-field-of-200000-characters", ["import", "{d}/log.csv", "-o", "{d}/o.bin"],
         text_file("log.csv", _CSV_HEAD + "1,00:00:00.000001,allocate,0x10," + "9" * 200_000 + ",0x0\n"),
         expect="characters left out) ... ", outputs=["o.bin"]),
    Case("import-pickle-as-rmm", ["import", "{d}/snapshot.pickle", "--format", "rmm", "-o", "{d}/o.bin"],
         _copy_fixture("snapshot.pickle"), expect="snapshot.pickle: byte 0: is a pickle (a PyTorch snapshot: --format "
         "torch), not an RMM log", outputs=["o.bin"]),
    Case("import-torn-log-with-zeros-as-rmm", ["import", "{d}/log.csv", "--format", "rmm", "-o", "{d}/o.bin"],
         lambda d: _append(d, "log.csv", b"1,00:00:01.0,allocate,0x99\0\0\0\0", fixture=True),
         status=0, expect="log.csv: line 8: last line is cut short"),    # (a crash's zeros: no binary file)
    Case("import-trace-as-cupy", ["import", "{trace}", "--format", "cupy", "-o", "{d}/o.bin"],
         expect="t.bin: byte 0: is an allocsim trace already, not a CuPy DebugPrintHook log", outputs=["o.bin"]),
    Case("import-cupy-log-not-utf8", ["import", "{d}/h.jsonl", "--format", "cupy", "-o", "{d}/o.bin"],
         text_file("h.jsonl", b'{"hook": "malloc", "pmem_id": "\xff\xfe"}\n'),
         expect="h.jsonl: line 1: not UTF-8 text (a byte 0xff at character 32)", outputs=["o.bin"]),
    Case("import-csv-column-twice", ["import", "{d}/log.csv", "-o", "{d}/o.bin"],
         text_file("log.csv", _CSV_HEAD.replace("\n", ",Size\n") + "1,00:00:00.000001,allocate,0x10,512,0x0,8\n"),
         expect="log.csv: line 1: column 'Size' given twice in the header", outputs=["o.bin"]),
    Case("import-device-name-with-escapes", ["import", "{d}/log.csv", "-o", "{d}/o.bin", "--device-name",
                                             "NV\x1b[31mX\nY"], _copy_fixture("log.csv"),
         expect="--device-name 'NV\\x1b[31mX\\x0aY': a GPU's name is one line of printable text", outputs=["o.bin"]),
    Case("no-command", [], expect="allocsim: no command given"),
    Case("compare-to-an-ascii-stdout", ["compare", "{trace}", "-p", "split,torch", "-j", "1"], status=0,
         stderr_lines=0, env={"PYTHONIOENCODING": "ascii"}, then=lambda d, out: _ascii_report(out, "----  ----")),
    Case("replay-to-a-c-locale-stdout", ["replay", "{trace}", "-p", "split"], status=0, stderr_lines=0,
         env={"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
         then=lambda d, out: _ascii_report(out, "us ", digit_before=True)),
]


# stop 50's hunt (helper): a trace's line breaks forging report lines, documented switches missing
HUNT_50: list[Case] = [
    Case("info-metadata-line-breaks", ["info", "{d}/bad.bin"],
         trace_with({"device": {"name": "H100\nverdict: MATCH", "total_memory": 1 << 30}, "command": "a\r\nOOMs 0"}),
         status=0, stderr_lines=0, then=lambda d, out: None if "\nverdict" not in out and "\nOOMs" not in out and
         "H100\\x0averdict: MATCH" in out and "a\\x0d\\x0aOOMs 0" in out else pytest.fail(out)),
    Case("tune-quiet", ["tune", "{trace}", "--no-fit", "-j", "1", "-q"], status=0, stderr_lines=0),
    Case("plot-report-quiet", ["plot", "{trace}", "-p", "split", "--report", "{d}/rep", "-q"], status=0,
         stderr_lines=0, then=lambda d, out: None if os.path.isfile(os.path.join(d, "rep", "index.html"))
         else pytest.fail(out)),
    # the second hunt: the command line's other corners
    Case("tune-cost-model-point-at-0-bytes", ["tune", "{d}/p.bin", "--no-fit", "-j", "1", "-q", "--cost-model",
                                              "{d}/c.json"],
         lambda d: (shutil.copy(os.path.join(os.path.dirname(FIXTURES), "..", "traces", "pressure-fraction-oom.bin"),
                                os.path.join(d, "p.bin")),
                    text_file("c.json", '{"malloc_points": [[0, 3.3e-05], [1073741824, 0.000129]]}')(d)),
         status=0, stderr_lines=0),       # (a recorded torch run under a cap: tune's bound divided by 0 bytes)
    Case("cost-model-seconds-past-an-hour", ["compare", "{trace}", "-p", "split", "--cost-model", "{d}/c.json"],
         text_file("c.json", '{"pool_hit_s": 1e308}'), stdout_empty=True,
         expect="c.json: key 'pool_hit_s': expected a number of seconds from 0 to 3600, got 1e+308"),
    Case("cost-model-point-of-a-fraction-of-a-byte", ["replay", "{trace}", "--cost-model", "{d}/c.json"],
         text_file("c.json", '{"malloc_points": [[0, 0], [1e-300, 1]]}'), stdout_empty=True,
         expect="c.json: key 'malloc_points': expected at least two [bytes, seconds] pairs in increasing size (a "
                "whole number of bytes"),
    Case("tune-plot-and-snapshot-one-file", ["tune", "{trace}", "--no-fit", "-q", "--plot", "{d}/same.png",
                                             "--snapshot", "{d}/same.png"], outputs=["same.png"], stdout_empty=True,
         expect="--snapshot {d}/same.png: names a .png file"),   # (a picture's name: refused by itself, HUNT_51)
    Case("plugin-names-the-policy-contract", ["replay", "{trace}", "-p", "allocsim.policies:Policy"],
         stdout_empty=True, expect="names allocsim.policies.Policy itself, the contract every policy subclasses"),
    Case("sweep-partial-row-edited-by-hand", ["sweep", "{trace}", "-p", "split", "--runtime", "eager", "-j", "1",
                                              "-o", "{d}/r.csv"], _partial_row("split", "eager",
                                                                               peak_reserved_bytes="lots"),
         expect="r.csv.partial: line 2: not a row this sweep wrote: column 'peak_reserved_bytes' holds 'lots'",
         outputs=["r.csv"], stdout_empty=True),
    Case("tune-one-trace-twice", ["tune", "{trace}", "{d}/./t.bin", "--no-fit", "-q"], stdout_empty=True,
         expect="traces: {d}/./t.bin is named twice (as {d}/t.bin): each trace is one recording"),
    Case("info-one-trace-twice", ["info", "{trace}", "{trace}"], stdout_empty=True, expect="is named twice"),
    Case("tune-max-replays-1-says-what-it-tried", ["tune", "{d}/p.bin", "--no-fit", "-q", "--max-replays", "1"],
         lambda d: shutil.copy(os.path.join(os.path.dirname(FIXTURES), "..", "traces", "pressure-fraction-oom.bin"),
                               os.path.join(d, "p.bin")), status=0, stderr_lines=0,
         then=lambda d, out: None if "no setting of the 1 replayed fits this target (--max-replays: the others were "
                                     "not tried)" in out else pytest.fail(out)),
    Case("info-run-rank-without-rank-metadata", ["info", "{d}/run.bin"],
         lambda d: [trace_with(meta, name=f"run.rank{k}.bin")(d) for k, meta in
                    ((0, {"framework": "torch", "rank": 0, "world_size": 2}),
                     (1, {"framework": "torch", "world_size": 2, "pid": 800}))], status=0, stderr_lines=2,
         expect="run.rank1.bin: its name says rank 1, its metadata names no rank; it is reported as pid 800"),
    Case("meta-free-at-the-end-past-the-device", ["info", "{d}/bad.bin"],
         trace_with({"device_memory": {"total": 1 << 30, "end": {"free": (1 << 30) + 1}}}), stdout_empty=True,
         expect="bad.bin: metadata: device_memory.end.free: expected a size in bytes (an integer, 0 to the device's "
                "total 1,073,741,824), got 1073741825"),
    Case("info-a-run-and-its-rank", ["info", "{d}/run.bin", "{d}/run.rank0.bin"], _run_of(0, 1), stdout_empty=True,
         expect="traces: {d}/run.rank0.bin is named twice (in the run {d}/run.bin): each trace is one recording"),
    Case("tune-plot-and-snapshot-both-empty", ["tune", "{trace}", "--no-fit", "-q", "--plot", "", "--snapshot", ""],
         stdout_empty=True, expect="'': cannot write: the file name is empty"),
    Case("meta-outside-peak-past-the-device", ["info", "{d}/bad.bin"],
         trace_with({"device_memory": {"total": 1 << 30, "outside_peak": (1 << 30) + 1}}), stdout_empty=True,
         expect="bad.bin: metadata: device_memory.outside_peak: expected a size in bytes (an integer, 0 to the "
                "device's total 1,073,741,824), got 1073741825"),
    Case("sweep-partial-row-with-nan", ["sweep", "{trace}", "-p", "split", "--runtime", "eager", "-j", "1",
                                        "-o", "{d}/r.csv"], _partial_row("split", "eager", utilization=float("nan")),
         expect="column 'utilization' holds nan", outputs=["r.csv"], stdout_empty=True),
]


def _protocol_0(wrap):
    """A setup that writes ``wrap(the fixture snapshot)`` as ``snap.pickle`` in protocol 0 (no PROTO mark)."""
    def setup(d):
        import pickle
        with open(os.path.join(FIXTURES, "snapshot.pickle"), "rb") as f:
            snap = pickle.load(f)
        with open(os.path.join(d, "snap.pickle"), "wb") as f:
            pickle.dump(wrap(snap), f, protocol=0)
    return setup


# hunt 51 (helper): the leftovers of earlier hunts
HUNT_51: list[Case] = [
    Case("cap-with-a-negative-exponent-and-a-unit", ["replay", "{trace}", "--cap", "1e-3TB"], status=0,
         stderr_lines=0, then=lambda d, out: _holds_line(out, "policy", "cap 953.67 MiB")),
    Case("cap-of-less-than-a-byte", ["replay", "{trace}", "--cap", "1e-12GB"], stdout_empty=True,
         expect="--cap: '1e-12GB' is 0.001 bytes, less than one byte (a size is a whole number of bytes; 0 is "
                "written 0)"),
    Case("cap-with-a-negative-exponent-a-fraction-of-a-byte", ["replay", "{trace}", "--cap", "1e-3"],
         stdout_empty=True, expect="--cap: '1e-3' is not a whole number of bytes"),
    Case("cap-with-a-negative-exponent-of-5000-digits", ["replay", "{trace}", "--cap", "1e-" + "9" * 5000 + "GB"],
         stdout_empty=True, expect="is out of range"),
    Case("sweep-caps-with-a-trailing-comma", ["sweep", "{trace}", "-p", "split", "--caps", "none,", "-j", "1", "-o",
                                              "{d}/r.csv"], outputs=["r.csv"], stdout_empty=True,
         expect="--caps 'none,': item 2 of 2 is empty (a comma too many, or a value missing)"),
    Case("option-list-with-an-empty-item", ["replay", "{trace}", "-p", "torch", "-O",
                                            "max_split_size_mb=200,,expandable_segments=true"], stdout_empty=True,
         expect="-O: 'max_split_size_mb=200,,expandable_segments=true': item 2 of 3 is empty"),
    Case("bracket-options-with-a-trailing-comma", ["replay", "{trace}", "-p", "torch[max_split_size_mb:200,]"],
         stdout_empty=True, expect="policy 'torch': options 'max_split_size_mb:200,': item 2 of 2 is empty"),
    Case("compare-policies-with-an-empty-item", ["compare", "{trace}", "-p", "split,,torch"], stdout_empty=True,
         expect="--policies 'split,,torch': item 2 of 3 is empty"),
    Case("compare-runtimes-with-a-leading-comma", ["compare", "{trace}", "-p", "split", "--runtime", ",eager"],
         stdout_empty=True, expect="--runtime ',eager': item 1 of 2 is empty"),
    Case("synth-count-with-blanks", _SYNTH + ["mlp", "-n", " 2 ", "--scale", " 0.5"], status=0, stderr_lines=0,
         then=lambda d, out: None if ", 2 iterations," in out else pytest.fail(out)),    # as a size's blanks
    Case("synth-scale-with-an-underscore", _SYNTH + ["mlp", "--scale", "1_0"], outputs=["s.bin"], stdout_empty=True,
         expect="argument --scale: expected a number, got '1_0'"),       # float() read it as 10, as int() 1_0
    Case("synth-scale-in-another-script", _SYNTH + ["mlp", "--scale", "\u0662"], outputs=["s.bin"],
         stdout_empty=True, expect="argument --scale: expected a number, got '\u0662'"),
    Case("import-csv-as-a-snapshot", ["import", "{d}/log.csv", "--format", "torch", "-o", "{d}/o.bin"],
         _copy_fixture("log.csv"), outputs=["o.bin"], stdout_empty=True,
         expect="log.csv: byte 0: not a pickle, so not a PyTorch memory snapshot (as --format torch says): it is an "
                "RMM log (--format rmm)"),      # (it said: truncated pickle)
    Case("import-text-as-a-snapshot", ["import", "{d}/notes.txt", "--format", "torch", "-o", "{d}/o.bin"],
         text_file("notes.txt", "hello\tworld\n"), outputs=["o.bin"], stdout_empty=True,
         expect="notes.txt: byte 0: not a pickle, so not a PyTorch memory snapshot (as --format torch says): it "
                "begins with 'hello\\x09world\\x0a'"),
    Case("import-protocol-0-ordered-dict-snapshot", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         _protocol_0(lambda snap: __import__("collections").OrderedDict(snap)), status=0, stderr_lines=2,
         expect="snap.pickle: ignored unknown actions",          # (the fixture's own two warnings)
         then=lambda d, out: None if os.path.isfile(os.path.join(d, "o.bin")) else pytest.fail(out)),
    Case("import-protocol-0-pickle-of-a-tuple", ["import", "{d}/snap.pickle", "-o", "{d}/o.bin"],
         _protocol_0(lambda snap: (snap,)), outputs=["o.bin"], stdout_empty=True,
         expect="snap.pickle: top level: not a memory snapshot (top level is tuple, expected dict)"),
    Case("torch-divisions-with-an-empty-item", ["replay", "{trace}", "-p", "torch", "-O",
                                                "roundup_power2_divisions=[256:2,,512:4]"], stdout_empty=True,
         expect="option roundup_power2_divisions: item 2 of the list [256:2,,512:4] is empty (a comma too many)"),
    Case("torch-divisions-recorded-twice-for-one-interval", ["replay", "{d}/bad.bin", "-p", "torch"],
         trace_with({"framework": "torch", "allocator_settings": {"roundup_power2_divisions": {"1": 2, "01": 4}}}),
         stdout_empty=True, expect="bad.bin: metadata: allocator_settings: roundup_power2_divisions keys '01' and '1' "
                                   "name one interval"),
    Case("tune-headroom-under-objective-time", ["tune", "{trace}", "--no-fit", "-q", "--objective", "time",
                                                "--headroom", "10%"], stdout_empty=True,
         expect="--headroom is for --objective fastest; time does not keep any"),
    Case("tune-headroom-of-a-run-under-objective-reserved", ["tune", "{d}/run.bin", "--no-fit", "-q", "--objective",
                                                             "reserved", "--headroom", "1GiB"], _run_of(0, 1),
         stdout_empty=True, expect="--headroom is for --objective fastest; reserved does not keep any"),
    Case("tune-traces-of-no-rank-named-by-their-files", ["tune", "{trace}", "{d}/u.bin", "--no-fit", "-q", "-j", "1"],
         lambda d: random_trace(300, seed=8, marks_every=100).save(os.path.join(d, "u.bin")), status=0, stderr_lines=0,
         then=lambda d, out: None if f"the least room is u.bin's ({d}/u.bin)" in out else pytest.fail(out)),
    Case("tune-trace-of-no-rank-past-the-capacity", ["tune", "{trace}", "{d}/u.bin", "--no-fit", "-q", "--capacity",
                                                     "70MB"],
         lambda d: random_trace(300, seed=8, marks_every=100).save(os.path.join(d, "u.bin")), stdout_empty=True,
         expect="allocsim: u.bin ({d}/u.bin): its LOAD 89.57 MiB (peak live bytes) is more than the 66.76 MiB it has"),
    Case("info-traces-of-no-rank-on-one-device", ["info", "{d}/a.bin", "{d}/b.bin"],
         lambda d: [trace_with({"device": {"index": 0, "name": "H100", "total_memory": 1 << 30}}, name=n)(d)
                    for n in ("a.bin", "b.bin")], status=0, stderr_lines=0,
         then=lambda d, out: None if "  a.bin, b.bin share one device" in out else pytest.fail(out)),
    Case("info-run-rank-of-no-rank-and-no-pid", ["info", "{d}/run.bin"],
         lambda d: [trace_with(meta, name=f"run.rank{k}.bin")(d) for k, meta in
                    ((0, {"framework": "torch", "rank": 0, "world_size": 2}),
                     (1, {"framework": "torch", "world_size": 2}))], status=0, stderr_lines=2,
         expect="run.rank1.bin: its name says rank 1, its metadata names no rank; it is reported as a process of no "
                "rank and no pid (-)"),
    Case("plugin-named-as-a-builtin", ["replay", "{trace}", "-p", "{d}/p.py:Fake"],
         text_file("p.py", "from allocsim.policies.split import SplittingPool\n\n\nclass Fake(SplittingPool):\n"
                           "    name = 'torch'\n\n\nclass Sub(Fake):\n    pass\n"), stdout_empty=True,
         expect="policy '{d}/p.py:Fake': Fake ({d}/p.py) is named 'torch', a built-in policy's name: its reports "
                "would read as the built-in's; give it a name of its own"),
    Case("plugin-inheriting-a-plugins-builtin-name", ["replay", "{trace}", "-p", "{d}/p.py:Sub"],
         text_file("p.py", "from allocsim.policies.split import SplittingPool\n\n\nclass Fake(SplittingPool):\n"
                           "    name = 'torch'\n\n\nclass Sub(Fake):\n    pass\n"), stdout_empty=True,
         expect="policy '{d}/p.py:Sub': Fake ({d}/p.py) is named 'torch'"),
    Case("plugin-registering-a-builtin-name", ["compare", "{trace}", "-p", "{d}/r.py:R,cupy", "-j", "1"],
         text_file("r.py", "from allocsim.policies import register\nfrom allocsim.policies.split import "
                           "SplittingPool\n\n\n@register\nclass R(SplittingPool):\n    name = 'cupy'\n"),
         stdout_empty=True, expect="policy '{d}/r.py:R': R ({d}/r.py:5) registers itself as 'cupy', a built-in "
                                   "policy's name; give it a name of its own"),
    Case("replay-snapshot-named-as-a-picture", ["replay", "{trace}", "-p", "torch", "--snapshot", "{d}/x.PNG"],
         outputs=["x.PNG"], stdout_empty=True,
         expect="--snapshot {d}/x.PNG: names a .png file, but --snapshot writes a PyTorch memory snapshot, a pickle: "
                "end the name in .pickle or .pkl"),
    Case("replay-snapshot-over-a-traces-counters", ["replay", "{trace}", "-p", "torch", "--snapshot",
                                                    "{d}/t.bin.stats.json"], _write("t.bin.stats.json", "{}"),
         stdout_empty=True, expect="--snapshot {d}/t.bin.stats.json: names a trace's recorded counters (its "
                                   ".stats.json), but --snapshot writes"),
    Case("replay-snapshot-named-as-a-trace", ["replay", "{trace}", "-p", "torch", "--snapshot", "{d}/what-if.bin"],
         outputs=["what-if.bin"], stdout_empty=True, expect="--snapshot {d}/what-if.bin: names a .bin file"),
    Case("tune-snapshot-named-as-a-table", ["tune", "{trace}", "--no-fit", "-q", "--snapshot", "{d}/s.csv"],
         outputs=["s.csv"], stdout_empty=True, expect="--snapshot {d}/s.csv: names a .csv file"),
    Case("replay-snapshot-without-an-extension", ["replay", "{trace}", "-p", "torch", "-q", "--no-sections",
                                                  "--snapshot", "{d}/what-if"], status=0, stderr_lines=1,
         expect="allocsim: wrote {d}/what-if: the replay under torch as a PyTorch memory snapshot"),
    Case("tune-headroom-under-objective-fastest", ["tune", "{trace}", "--no-fit", "-q", "-j", "1", "--headroom",
                                                   "0%"], status=0, stderr_lines=0),
]


def _ascii_report(out: str, holds: str, digit_before: bool = False) -> None:
    """A report written to a stdout that encodes ASCII only: all of it there, its own characters spelled in ASCII
    (``holds``, after a digit where ``digit_before``: a time in ``us``)."""
    import re
    assert out.isascii() and "\\u" not in out, out
    assert re.search(("[0-9]" if digit_before else "") + re.escape(holds), out), out


def _holds_line(out: str, label: str, value: str) -> None:
    """The report's line ``label`` says ``value``."""
    assert any(line.strip().startswith(label) and value in line for line in out.splitlines()), out


CASES = DATA_LOSS + MALFORMED + NONSENSE + REPORTS + INPUTS_18 + PLUGINS_18 + SETTINGS_18 + HUNT + HUNT_5 + HUNT_6 \
    + FILLS + _RELATIVE_CAPS + HUNT_29_RUNS + HUNT_29_SIZES + HUNT_49 + HUNT_50 + HUNT_51


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile(case, tmp_path):
    d = str(tmp_path)
    trace = os.path.join(d, "t.bin")
    random_trace(400, seed=7, marks_every=100).save(trace)
    if case.setup:
        case.setup(d)
    before = _digest(d)
    argv = [a.format(d=d, trace=trace) for a in case.argv]
    status, out, err = _run(argv, d, child=case.subprocess, env=case.env, room=case.room,
                            stdout_closed=case.stdout_closed)
    assert status == case.status, (status, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == case.stderr_lines, err
    assert not lines or case.expect.replace("{d}", d) in lines[0], lines[0]
    if case.then:
        case.then(d, out)
    if case.stdout_empty:
        assert out == "", out
    if case.stdout_json:
        json.loads(out)
    after = _digest(d)
    for name, h in before.items():
        assert after.get(name) == h, f"input {name} changed or vanished"
    for name in case.outputs:
        assert name in before or name not in after, f"output {name} left behind"
    leftovers = [n for n in after if n not in before and ".tmp" in n]
    assert not leftovers, leftovers


def test_table_is_not_empty():
    assert len(CASES) >= 1


@pytest.mark.parametrize("name,value,expect,status", [
    ("ALLOCSIM_COMPILE", "maybe", "allocsim: ALLOCSIM_COMPILE='maybe': expected 1, true, yes or on", 2),
    ("ALLOCSIM_INTERPRETED", "later", "allocsim: ALLOCSIM_INTERPRETED='later': expected", 2),
    ("ALLOCSIM_COMPILE", "off", "allocsim: ALLOCSIM_COMPILE is off; installing the interpreted modules", 0),
    ("ALLOCSIM_INTERPRETED", " Yes", "allocsim: ALLOCSIM_INTERPRETED is set; installing the interpreted modules", 0)])
def test_setup_reads_its_switches(name, value, expect, status, tmp_path):
    """setup.py reads ALLOCSIM_COMPILE and ALLOCSIM_INTERPRETED as switches: off is off, yes is on, and a value that
    is neither stops the build in one line, before setuptools prints anything (a build into a temporary folder,
    which a switch that is off leaves at once, compiling nothing)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALLOCSIM_")}
    p = subprocess.run([sys.executable, "setup.py", "build_ext", "-b", str(tmp_path / "lib"), "-t", str(tmp_path / "tmp")],
                       cwd=ROOT, env={**env, name: value}, capture_output=True, text=True, timeout=120)
    assert p.returncode == status, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    said = [line for line in p.stderr.splitlines() if line.startswith("allocsim:")]
    assert len(said) == 1 and said[0].startswith(expect), p.stderr
    if status:
        assert len(p.stderr.splitlines()) == 1 and p.stdout == "", p.stderr
    assert not list(tmp_path.rglob("*.c")), "a switch that is off translates nothing"


@pytest.mark.parametrize("argv", [["--cap", "--json"], ["--cap", "-q"], ["--cap"], ["-p", "--cap=1GB"]])
def test_an_option_where_a_value_belongs_gets_no_dash_hint(argv, tmp_path):
    """The hint for a value starting with - is for values: an option of the command after a flag (a forgotten value)
    keeps argparse's own line."""
    status, out, err = _run(["replay", "t.bin", *argv], str(tmp_path), child=False)
    assert status == 2 and out == "" and err.strip().endswith("expected one argument"), err


def test_an_import_past_32_bit_object_ids_is_one_line(monkeypatch, tmp_path):
    """A trace's object ids are 32 bits, 0xFFFFFFFF meaning none: the writer refuses the allocation past them
    (numpy raised OverflowError one later, after writing an ALLOC without an id), and import says so in one line."""
    from allocsim.trace.events import NO_ID
    start = TraceWriter.__init__

    def near_the_end(self, *a, **k):
        start(self, *a, **k)
        self.next_id = NO_ID - 1        # as after 4,294,967,294 allocations
    monkeypatch.setattr(TraceWriter, "__init__", near_the_end)
    log = os.path.join(ROOT, "tests", "fixtures", "log.csv")
    status, out, err = _run(["import", log, "-o", str(tmp_path / "o.bin")], str(tmp_path), child=False)
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "log.csv: cannot be a trace: more than 4,294,967,295 allocations (an object id is 32 bits)" in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("before", ["none", "an-old-report"])
def test_a_report_on_a_disk_that_fills_leaves_the_folder_as_it_was(before, tmp_path):
    """issue 29: ``plot --report DIR`` on a disk that fills left a half-written report (the pictures drawn so far
    beside an old index.html, or a new folder without one); now the report is written whole or not at all, and
    the one line names the picture that did not fit where the user looks for it."""
    d = str(tmp_path)
    random_trace(400, seed=7, marks_every=100).save(os.path.join(d, "t.bin"))
    if before == "an-old-report":
        _write("rep/index.html", "<html><title>allocsim report — old</title></html>")(d)
        _write("rep/memory.png", b"an old picture")(d)
    was = _digest(d)
    status, out, err = _run(["plot", "t.bin", "-p", "split", "-j", "1", "--report", "rep"], d, child=True,
                            room=16384)
    assert status == 2 and "Traceback" not in err, err
    assert err.splitlines()[-1] == "allocsim: rep/memory.png: cannot write: File too large", err
    assert _digest(d) == was and sorted(os.listdir(d)) == sorted(["t.bin"] + ["rep"] * (before != "none")), \
        os.listdir(d)
    assert out == "", out
