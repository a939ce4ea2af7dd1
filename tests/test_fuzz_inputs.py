"""Fuzzing the readers: corrupt a valid input, run the CLI, no exception may escape.

Each test starts from a small valid input (a `.bin` trace, an RMM CSV, a CuPy
JSONL, a torch snapshot pickle, a cost model, a sweep's partial rows), corrupts
either its bytes or one field of its structure, and runs ``allocsim.cli.main``
in-process. Whatever the corruption, the command must end with exit status 0, 1
or 2; a failure is one line on stderr that names the user's file, never an
internal temporary one, and never a traceback.
"""
from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.trace.format import TraceFileWriter
from conftest import ROOT, random_trace
from test_hostile import _run

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
FUZZ = settings(max_examples=int(os.environ.get("ALLOCSIM_FUZZ_EXAMPLES", 40)), deadline=None,
               suppress_health_check=[HealthCheck.too_slow])

#: Values a careless or hostile writer puts where a field belongs.
HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, -1, -5, 2**64, 2**63 - 1]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.sampled_from(["lots", "", "0x10"]),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(-3, 3), max_size=2),
)


def _paths(obj, prefix=()):
    """Every place in a JSON-like tree: the container paths and the leaf paths."""
    yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


def _replace(obj, path, value):
    """A copy of ``obj`` with the thing at ``path`` replaced (tuples become lists on the way)."""
    if not path:
        return value
    if obj is None:
        obj = {}
    out = dict(obj) if isinstance(obj, dict) else list(obj)
    out[path[0]] = _replace(out.get(path[0]) if isinstance(out, dict) else out[path[0]], path[1:], value)
    return out


@st.composite
def mutated(draw, obj):
    """``obj`` with one place in it replaced by a hostile value (or a key added to a dict)."""
    places = list(_paths(obj))[1:]        # the whole input replaced says little
    path = places[draw(st.integers(0, len(places) - 1))]
    value = draw(HOSTILE)
    target = obj
    for k in path:
        target = target[k]
    if isinstance(target, dict) and draw(st.booleans()):
        return _replace(obj, path + (draw(st.sampled_from(["total_memory", "streams", "x", "device"])),), value)
    return _replace(obj, path, value)


@st.composite
def corrupted_bytes(draw, data: bytes):
    """``data`` with a few bytes overwritten, a slice cut out or the tail cut off."""
    b = bytearray(data)
    how = draw(st.sampled_from(["flip", "cut", "truncate"]))
    if how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            b[draw(st.integers(0, len(b) - 1))] = draw(st.integers(0, 255))
    elif how == "cut":
        i = draw(st.integers(0, len(b) - 1))
        del b[i:i + draw(st.integers(1, 64))]
    else:
        del b[draw(st.integers(0, len(b) - 1)):]
    return bytes(b)


def _cli(argv, d):
    """Run the CLI in ``d``; return (status, stderr). Any escaping exception fails the test."""
    status, _, text = _run(argv, d, child=False)
    assert status in (0, 1, 2), (argv, status, text)
    assert "Traceback" not in text, text
    if status == 2:
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("warning")]
        assert len(lines) >= 1, text
        assert ".tmp" not in lines[-1], lines[-1]
    return status, text


@contextlib.contextmanager
def _workdir():
    d = tempfile.mkdtemp(prefix="fuzz")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


_TRACE = random_trace(120, seed=5, streams=2, marks_every=40, total_memory=1 << 34)
_META = {"producer": "test", "framework": "torch", "device": {"name": "test", "total_memory": 1 << 34, "index": 0},
         "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128", "max_split_size": 1 << 27,
                                "expandable_segments": False, "garbage_collection_threshold": 0.0,
                                "roundup_power2_divisions": {"1": 0, "2": 0}},
         "initial_segments": [{"total_size": 1 << 21, "address": 1 << 28, "stream": 0}]}
_FOOTER = _TRACE._footer()
TRACE_COMMANDS = [["info"], ["info", "--json"], ["replay", "--policy", "torch", "--no-sections"],
                  ["replay", "--policy", "split", "--no-sections"], ["validate"],
                  ["fit", "-j", "1", "--policies", "torch"], ["compare", "-j", "1", "--policies", "torch,cupy"]]


def _write_trace(path, meta, footer):
    w = TraceFileWriter(path, meta)
    w.write(_TRACE.records)
    w.close(footer)


def _run_trace(meta, footer, command):
    with _workdir() as d:
        p = os.path.join(d, "t.bin")
        _write_trace(p, meta, footer)
        _cli([command[0], p, *command[1:]], d)


@FUZZ
@given(meta=mutated(_META), command=st.sampled_from(TRACE_COMMANDS))
def test_trace_metadata_fields(meta, command):
    _run_trace(meta, _FOOTER, command)


@FUZZ
@given(footer=mutated(_FOOTER), command=st.sampled_from(TRACE_COMMANDS))
def test_trace_footer_fields(footer, command):
    _run_trace(_META, footer, command)


def _valid_trace_bytes():
    with _workdir() as d:
        p = os.path.join(d, "t.bin")
        _write_trace(p, _META, _FOOTER)
        with open(p, "rb") as f:
            return f.read()


@FUZZ
@given(data=corrupted_bytes(_valid_trace_bytes()), command=st.sampled_from(TRACE_COMMANDS))
def test_trace_bytes(data, command):
    with _workdir() as d:
        p = os.path.join(d, "t.bin")
        with open(p, "wb") as f:
            f.write(data)
        _cli([command[0], p, *command[1:]], d)


_HEADER_FIELDS = [(8, 2), (10, 2), (12, 4), (16, 8), (24, 8), (32, 8)]     # version .. records offset


@FUZZ
@given(field=st.sampled_from(_HEADER_FIELDS), command=st.sampled_from(TRACE_COMMANDS),
       value=st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 63, 64])))
def test_trace_header_fields(field, value, command):
    offset, width = field
    data = bytearray(_valid_trace_bytes())
    data[offset:offset + width] = (value % 2**(8 * width)).to_bytes(width, "little")
    with _workdir() as d:
        p = os.path.join(d, "t.bin")
        with open(p, "wb") as f:
            f.write(data)
        _cli([command[0], p, *command[1:]], d)


def _read(name, mode="rb"):
    with open(os.path.join(FIXTURES, name), mode) as f:
        return f.read()


def _import(data: bytes, name: str):
    with _workdir() as d:
        p = os.path.join(d, name)
        with open(p, "wb") as f:
            f.write(data)
        status, err = _cli(["import", p, "-o", os.path.join(d, "out.bin")], d)
        if status == 2:
            assert os.path.basename(p) in err or "cannot tell" in err or "--format" in err, err
        assert status != 0 or os.path.exists(os.path.join(d, "out.bin"))
        assert [n for n in os.listdir(d) if ".tmp" in n] == []


@FUZZ
@given(data=corrupted_bytes(_read("log.csv")))
def test_rmm_csv_bytes(data):
    _import(data, "log.csv")


@FUZZ
@given(data=corrupted_bytes(_read("hooks.jsonl")))
def test_cupy_jsonl_bytes(data):
    _import(data, "hooks.jsonl")


_HOOKS = [json.loads(line) for line in _read("hooks.jsonl", "r").splitlines() if line.strip()]


@FUZZ
@given(lines=mutated(_HOOKS))
def test_cupy_jsonl_fields(lines):
    _import("".join(json.dumps(x) + "\n" for x in lines).encode(), "hooks.jsonl")


_CSV_ROWS = [line.split(",") for line in _read("log.csv", "r").splitlines()]


@FUZZ
@given(rows=mutated(_CSV_ROWS))
def test_rmm_csv_fields(rows):
    text = "".join(",".join(map(str, r)) + "\n" if isinstance(r, list) else f"{r}\n" for r in rows)
    _import(text.encode(), "log.csv")


@FUZZ
@given(data=corrupted_bytes(_read("snapshot.pickle")))
def test_torch_snapshot_bytes(data):
    _import(data, "snapshot.pickle")


_SNAPSHOT = pickle.loads(_read("snapshot.pickle"))


@FUZZ
@given(snapshot=mutated(_SNAPSHOT))
def test_torch_snapshot_fields(snapshot):
    _import(pickle.dumps(snapshot, protocol=2), "snapshot.pickle")


_COSTS = {"malloc_points": [[0, 1e-6], [1 << 30, 1e-3]], "free_points": [[0, 1e-6], [1 << 30, 1e-4]]}


@FUZZ
@given(costs=mutated(_COSTS))
def test_cost_model_fields(costs):
    with _workdir() as d:
        t, c = os.path.join(d, "t.bin"), os.path.join(d, "costs.json")
        _write_trace(t, _META, _FOOTER)
        with open(c, "w") as f:
            json.dump(costs, f)
        _cli(["replay", t, "--cost-model", c, "--no-sections"], d)


@FUZZ
@given(row=mutated({"cell": "x", "policy": "split"}), torn=st.booleans())
def test_sweep_partial_rows(row, torn):
    with _workdir() as d:
        t = os.path.join(d, "t.bin")
        _write_trace(t, _META, _FOOTER)
        from allocsim.commands.sweep import PARTIAL_MARK
        text = PARTIAL_MARK.decode() + json.dumps(row) + "\n" + ("{\"cell" if torn else "")
        with open(os.path.join(d, "out.csv.partial"), "w") as f:
            f.write(text)
        _cli(["sweep", t, "--policies", "split", "-j", "1", "-o", os.path.join(d, "out.csv")], d)


_U64 = st.sampled_from([0, 1, 4096, 2 << 20, 2**50, 2**50 + 1, 2**62, 2**63, 2**64 - 1])
_FLOAT_BITS = st.floats(allow_nan=True, allow_infinity=True).map(
    lambda x: int.from_bytes(np.float64(x).tobytes(), "little"))


@st.composite
def hostile_records(draw):
    """1 to 4 records of any kind with fields a careless or hostile writer puts there (sizes past 1 PiB,
    addresses of no segment, fractions of NaN, indices past every table), each at a random place."""
    rec = np.asarray(_TRACE.records).copy()
    for _ in range(draw(st.integers(1, 4))):
        r = np.zeros(1, rec.dtype)
        r["kind"] = draw(st.sampled_from(list(range(1, 13)) + [0, 77]))
        r["flags"] = draw(st.sampled_from([0, 1, 2, 4, 8, 255]))
        r["stream"] = draw(st.sampled_from([0, 1, 2, 0xFFFF]))
        r["id"] = draw(st.sampled_from([0, 5, 119, 10_000, 0xFFFFFFFF]))
        r["site"] = draw(st.sampled_from([0, 3, 0xFFFFFFFF]))
        r["aux"] = draw(st.sampled_from([0, 1, 2, 3, 0xFFFFFFFF]))
        r["size"], r["addr"] = draw(_U64), draw(_U64 | _FLOAT_BITS | st.just(1 << 28))
        at = draw(st.integers(0, len(rec)))
        rec = np.concatenate([rec[:at], r, rec[at:]])
    return rec


@FUZZ
@given(rec=hostile_records(), command=st.sampled_from(TRACE_COMMANDS))
def test_trace_record_fields(rec, command):
    """Any corrupted record is refused with one line (exit 2) where the trace is read, or replays: never a traceback."""
    with _workdir() as d:
        p = os.path.join(d, "t.bin")
        w = TraceFileWriter(p, _META)
        w.write(rec)
        w.close(_FOOTER)
        _cli([command[0], p, *command[1:]], d)
