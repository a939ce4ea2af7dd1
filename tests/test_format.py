"""The `.bin` trace format: round trips, memory-mapped access, crash-safe streaming, and
every malformed input reported as one `InputError` line (file, position, what), in
Python and through the CLI. The layout constants are checked against
docs/trace-format.md, whose numpy example is run as written."""
from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from allocsim import cli
from allocsim.errors import InputError
from allocsim.trace import events as ev
from allocsim.trace.format import HEADER, MAGIC, TraceFileWriter, _align8, read_trace_file
from allocsim.trace.trace import Trace, TraceWriter

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "trace-format.md"
META = {"producer": "test_format", "framework": "torch", "framework_version": "2.3.1",
        "device": {"name": "NVIDIA H100 80GB HBM3", "total_memory": 85031714816},
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
        "command": ["train.py", "--batch-size", "32"], "iterations": 3}


# ---- building traces ---------------------------------------------------------------------
def drive(w: TraceWriter, n_iter: int = 3, per_iter: int = 40, seed: int = 0) -> None:
    """A small training-like trace on two streams, with marks, segments, GC and OOM events."""
    rng = np.random.default_rng(seed)
    live: list[int] = []
    t = 0
    w.segment(ev.SEGMENT_ALLOC, 0x7000_0000, 2 << 20, t=t)
    for it in range(n_iter):
        for k in range(per_iter):
            t += int(rng.integers(1, 1000))
            live.append(w.alloc(int(rng.integers(0, 1 << 20)), stream=[0, 0xBEEF][k % 2], t=t,
                                site=f"model.py:{k % 5}", addr=0x7000_0000 + 512 * k))
            if len(live) > 6:
                w.free(live.pop(int(rng.integers(0, len(live)))), t=t + 1)
        w.gc(full=bool(it % 2), t=t + 2)
        w.mark(f"iteration {it + 1}", t=t + 3)
    w.oom(1 << 40, device_free=12345, t=t + 4)
    for i in live:
        w.free(i, t=t + 5)
    w.segment(ev.SEGMENT_FREE, 0x7000_0000, 2 << 20, t=t + 6)


def make_trace(**kw) -> Trace:
    w = TraceWriter(meta=META)
    drive(w, **kw)
    return w.finish()


def raw_trace(rows) -> np.ndarray:
    """Records from ``(kind, id, size)`` rows, for hand-made event streams."""
    rec = np.zeros(len(rows), ev.RECORD_DTYPE)
    for i, (kind, id_, size) in enumerate(rows):
        rec[i] = (kind, 0, 0, id_, ev.NO_SITE, 0, size, i, 0)
    return rec


def write_raw(path, *, magic=MAGIC, version=1, rec_size=40, meta=b"{}", records=b"", n=None, footer=b"{}",
              footer_off=None, rec_off=None) -> str:
    """Write a file byte by byte, with any header field overridable (for malformed cases)."""
    if isinstance(records, np.ndarray):
        records = records.tobytes()
    ro = _align8(64 + len(meta)) if rec_off is None else rec_off
    n = len(records) // 40 if n is None else n
    fo = ro + len(records) if footer_off is None else footer_off
    data = HEADER.pack(magic, version, rec_size, len(meta), n, fo, ro) + meta
    data += b"\0" * (ro - len(data)) + records + footer
    Path(path).write_bytes(data)
    return str(path)


def write_bytes(path, data: bytes) -> str:
    Path(path).write_bytes(data)
    return str(path)


def same_trace(a: Trace, b: Trace) -> None:
    assert np.array_equal(np.asarray(a.records), np.asarray(b.records))
    assert a.meta == b.meta and a.streams == b.streams and a.sites == b.sites and a.labels == b.labels


# ---- round trips -------------------------------------------------------------------------
def test_round_trip_in_memory(tmp_path):
    t = make_trace()
    p = tmp_path / "t.bin"
    t.save(str(p))
    u = Trace.load(str(p))
    same_trace(t, u)
    assert u.finished and u.streams == [0, 0xBEEF] and u.labels == ["iteration 1", "iteration 2", "iteration 3"]
    assert u.marks()[0][1] == "iteration 1"
    assert os.listdir(tmp_path) == ["t.bin"]          # no temporary left behind


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_round_trip_streamed_equals_in_memory(tmp_path, chunk):
    p = str(tmp_path / "s.bin")
    w = TraceWriter(meta=META, path=p, chunk=chunk)
    drive(w)
    streamed = w.finish()
    assert streamed.finished
    same_trace(streamed, make_trace())
    same_trace(Trace.load(p, mmap=False), make_trace())


def test_header_matches_the_documented_layout(tmp_path):
    t = make_trace()
    p = tmp_path / "t.bin"
    t.save(str(p))
    data = p.read_bytes()
    meta_len = struct.unpack_from("<I", data, 12)[0]
    n, footer_off, rec_off = struct.unpack_from("<QQQ", data, 16)
    assert data[:8] == b"ALLOCSIM" and struct.unpack_from("<HH", data, 8) == (1, 40)
    assert rec_off == (64 + meta_len + 7) & ~7 and rec_off % 8 == 0
    assert data[40:64] == b"\0" * 24 and data[64 + meta_len:rec_off] == b"\0" * (rec_off - 64 - meta_len)
    assert json.loads(data[64:64 + meta_len]) == META
    assert n == len(t) and footer_off == rec_off + 40 * n
    footer = json.loads(data[footer_off:])
    assert footer["streams"] == [0, 0xBEEF] and footer["summary"] == {"events": len(t), "allocs": t.n_allocs}
    # field offsets of the record table in the doc
    doc = DOC.read_text()
    for name in ev.RECORD_DTYPE.names:
        off = ev.RECORD_DTYPE.fields[name][1]
        assert re.search(rf"^\| {off} \| \w+ \| `{name}` \|", doc, re.M), f"doc offset of {name}"
    for k, name in ev.KIND_NAMES.items():
        assert f"| {k} | `{name}` |" in doc


def test_memmap_column_access(tmp_path):
    t = make_trace()
    p = str(tmp_path / "t.bin")
    t.save(p)
    u = Trace.load(p)
    assert isinstance(u.records, np.memmap) and not u.records.flags.writeable
    assert u.size.dtype == np.uint64 and u.kind.dtype == np.uint8
    kinds = u.kind.tolist()
    assert kinds.count(ev.ALLOC) == u.n_allocs == 120 and kinds.count(ev.FREE) == 120
    # LOAD and the live curve against a plain Python walk of the events
    live = peak = 0
    sizes = {}
    for r in u.records.tolist():
        if r[0] == ev.ALLOC:
            sizes[r[3]] = r[6]
            live += r[6]
        elif r[0] == ev.FREE:
            live -= sizes[r[3]]
        peak = max(peak, live)
    assert u.load_bytes == peak and u.live_curve[-1] == 0


def test_iteration_yields_indexed_events():
    t = make_trace(n_iter=1, per_iter=5)
    evs = list(t)
    assert [e.index for e in evs] == list(range(len(t)))
    assert evs[0].kind == ev.SEGMENT_ALLOC and evs[1].kind == ev.ALLOC and evs[1].id == 0
    assert evs[1].stream == 0 and evs[2].stream == 1          # stream table indices
    assert t.streams[evs[2].stream] == 0xBEEF
    assert t.sites[evs[2].site] == "model.py:1"
    mark = next(e for e in evs if e.kind == ev.MARK)
    assert t.labels[mark.aux] == "iteration 1"


def test_doc_numpy_example_runs_as_written(tmp_path, capsys):
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    t = make_trace()
    p = str(tmp_path / "t.bin")
    t.save(p)
    exec(compile(block, "trace-format.md", "exec"), {"path": p})
    want = f"torch {len(t)} events, {t.n_allocs} allocs, {int(t.size[t.kind == ev.ALLOC].sum())} bytes requested"
    assert capsys.readouterr().out.strip() == want


# ---- crash safety ------------------------------------------------------------------------
WRITER = textwrap.dedent("""
    import os, signal, sys, time
    from allocsim.trace.trace import TraceWriter
    w = TraceWriter(meta={"producer": "dying writer"}, path=sys.argv[1], chunk=100)
    n = int(sys.argv[2])
    for i in range(n):
        w.alloc(1000 + i, t=i)
        w.free(i, t=i)
    if sys.argv[3] == "exit":
        os._exit(0)
    print("written", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("how, n", [("exit", 1234), ("kill", 450)])
def test_killed_writer_leaves_a_readable_prefix(tmp_path, how, n):
    p = str(tmp_path / "dying.bin")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, p, str(n), how], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        if how == "kill":
            assert proc.stdout.readline().strip() == "written"
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stdout.close()
    t = Trace.load(p)                       # validates: the prefix is a valid trace
    assert not t.finished and t.meta == {"producer": "dying writer"}
    # whole chunks of 100 records reached the file; at most the last chunk was lost
    assert len(t) % 100 == 0 and 0 <= 2 * n - len(t) <= 100 and len(t) > 0
    kinds = np.tile([ev.ALLOC, ev.FREE], n)[:len(t)]
    assert np.array_equal(t.kind, kinds)
    assert np.array_equal(t.size[::2], 1000 + np.arange(len(t) // 2))
    # a torn last record is ignored
    with open(p, "ab") as f:
        f.write(b"\x01" * 17)
    assert len(Trace.load(p)) == len(t)
    rc, out, err = run_cli(["info", p])
    assert rc == 0 and "UNFINISHED" in out


def test_scopes_nest_and_may_stay_open(tmp_path):
    """Tries and phases nest apart (a phase may close inside a try opened before it) and a trace cut short may
    leave scopes open; the writer marks the file version 3 only when a scope is written."""
    p = _scoped([(_A, 0, 8), (_TB, _N, 1), (_PB, _N, 2), (_TE, _N, 1), (_PE, _N, 2), (_PB, _N, 3), (_F, 0, 0)])(
        str(tmp_path / "ok.bin"))
    t = Trace.load(p)
    assert t.version == 3 and (t.kind == ev.PHASE_BEGIN).sum() == 2
    w = TraceWriter({}, path=str(tmp_path / "w.bin"))
    w.alloc(8)
    w.finish()
    assert Trace.load(str(tmp_path / "w.bin")).version == 1
    w = TraceWriter({}, path=str(tmp_path / "s.bin"))
    serial = w.begin(ev.TRY_BEGIN, "user")
    w.alloc(8)
    w.end(ev.TRY_END, "user", serial)
    w.finish()
    t = Trace.load(str(tmp_path / "s.bin"))
    assert t.version == 3 and t.labels == ["user"] and t.records["size"][[0, 2]].tolist() == [serial, serial]


def test_unfinished_file_with_no_records(tmp_path):
    p = str(tmp_path / "empty.bin")
    TraceFileWriter(p, {"producer": "x"}).abort()
    meta, records, footer, finished, _ = read_trace_file(p)
    assert (meta, len(records), footer, finished) == ({"producer": "x"}, 0, {}, False)


# ---- malformed input ---------------------------------------------------------------------
def _events(rows):
    return lambda p: write_raw(p, records=raw_trace(rows))


def _scoped(rows, version=3):
    """Rows with scope events (label 0, "user"), in a file of ``version``."""
    return lambda p: write_raw(p, version=version, records=raw_trace(rows), footer=b'{"labels": ["user"]}')


_A, _F, _FR = ev.ALLOC, ev.FREE, ev.FREE_REQUESTED
_TB, _TE, _PB, _PE, _N = ev.TRY_BEGIN, ev.TRY_END, ev.PHASE_BEGIN, ev.PHASE_END, ev.NO_ID
BAD = {
    # name: (writer, position, message fragment)
    "empty file": (lambda p: write_bytes(p, b""), "byte 0", "bad magic"),
    "wrong magic": (lambda p: write_raw(p, magic=b"PYTORCH!"), "byte 0", "bad magic"),
    "unsupported version": (lambda p: write_raw(p, version=4), "byte 8", "unsupported trace version 4"),
    "pool kind in version 1": (_events([(ev.POOL_BEGIN, _N, 0)]), "event 0", "in a version-1 file: it needs version 2"),
    "scope kind in version 2": (_scoped([(_A, 0, 8), (_TB, _N, 1), (_TE, _N, 1)], version=2), "event 1",
                                "TRY_BEGIN (flags 0) in a version-2 file: it needs version 3"),
    "scope end closing nothing": (_scoped([(_TB, _N, 1), (_TE, _N, 1), (_TE, _N, 1)]), "event 2",
                                  "TRY_END (serial 1) closes no open TRY_BEGIN"),
    "scope end of another pair": (_scoped([(_TB, _N, 1), (_PE, _N, 1)]), "event 1",
                                  "PHASE_END (serial 1) closes no open PHASE_BEGIN"),
    "scope ends crossed": (_scoped([(_TB, _N, 1), (_TB, _N, 2), (_TE, _N, 1)]), "event 2",
                           "does not close the innermost open TRY_BEGIN (serial 2"),
    "scope serial not new": (_scoped([(_PB, _N, 2), (_TB, _N, 2)]), "event 1", "serial 2 is not above the last"),
    "scope label beyond the table": (lambda p: write_raw(p, version=3, records=raw_trace([(_PB, _N, 1)]),
                                                         footer=b'{"labels": []}'), "event 0",
                                     "PHASE_BEGIN label index 0 is beyond the footer's table of 0 labels"),
    "wrong record size": (lambda p: write_raw(p, rec_size=48), "byte 10", "record size 48"),
    "truncated header": (lambda p: write_bytes(p, HEADER.pack(MAGIC, 1, 40, 2, 0, 0, 72)[:30]),
                         "byte 30", "truncated header"),
    "inconsistent records offset": (lambda p: write_raw(p, rec_off=64), "byte 32", "records offset"),
    "truncated metadata": (lambda p: write_bytes(
        p, HEADER.pack(MAGIC, 1, 40, 100, 0, 168, 168) + b'{"producer": "x"'), "byte 80", "metadata is 100 bytes"),
    "bad metadata JSON": (lambda p: write_raw(p, meta=b'{"producer": '), "byte 64", "metadata is not valid JSON"),
    "metadata not an object": (lambda p: write_raw(p, meta=b"[1, 2]"), "byte 64", "not a JSON object"),
    "truncated records": (lambda p: write_raw(p, records=raw_trace([(_A, 0, 8)] * 3), n=5,
                                              footer_off=_align8(66) + 200), "byte", "header says 5 records, file holds 3"),
    "bad footer JSON": (lambda p: write_raw(p, records=raw_trace([(_A, 0, 8)]), footer=b"{oops"),
                        "byte 112", "footer is not valid JSON"),
    "unknown kind": (_events([(_A, 0, 8), (42, ev.NO_ID, 0)]), "event 1", "unknown event kind 42"),
    "free of unknown id": (_events([(_A, 0, 8), (_F, 0, 0), (_F, 1, 0)]), "event 2", "free of unknown id 1"),
    "free before its alloc": (_events([(_F, 1, 0), (_A, 0, 8), (_A, 1, 8)]), "event 0", "free of unknown id 1"),
    "double free": (_events([(_A, 0, 8), (_A, 1, 8), (_F, 0, 0), (_F, 1, 0), (_F, 0, 0)]), "event 4",
                    "double free of id 0"),
    "double free_requested": (_events([(_A, 0, 8), (_FR, 0, 0), (_FR, 0, 0)]), "event 2",
                              "double free_requested of id 0"),
    "alloc id reused": (_events([(_A, 0, 8), (_A, 1, 8), (_F, 0, 0), (_A, 0, 16)]), "event 3",
                        "id 0 allocated twice"),
    "absurd size": (_events([(_A, 0, 8), (_A, 1, 2**60)]), "event 1", "absurd allocation size"),
    "alloc without id": (_events([(_A, ev.NO_ID, 8)]), "event 0", "without an object id"),
    "sparse id": (_events([(_A, 0, 8), (_A, 0xFFFF_FFF0, 8)]), "event 1", "out of range"),
}


def _bad(tmp_path, name) -> str:
    return str(BAD[name][0](str(tmp_path / "bad.bin")))


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_raises_input_error_with_file_and_position(tmp_path, name):
    path = _bad(tmp_path, name)
    _, position, what = BAD[name]
    with pytest.raises(InputError) as e:
        Trace.load(path)
    assert e.value.path == path and e.value.position.startswith(position) and what in e.value.what
    assert str(e.value).startswith(f"{path}: {position}")


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError) as e:
        Trace.load(str(tmp_path / "nope.bin"))
    assert e.value.path.endswith("nope.bin") and "No such file" in e.value.what


# ---- the same through the CLI -------------------------------------------------------------
def run_cli(argv, capsys=None):
    """``allocsim ARGV`` in a subprocess: (exit status, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "allocsim", *argv], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


def main_in_process(argv, capsys):
    """``allocsim ARGV`` in this process (fast): (exit status, stdout, stderr)."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:       # argparse errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *, contains=""):
    assert rc == 2
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert "Traceback" not in err and contains in lines[0]


@pytest.mark.parametrize("name", sorted(BAD))
def test_cli_info_on_bad_trace_is_one_line_exit_2(tmp_path, capsys, name):
    path = _bad(tmp_path, name)
    rc, out, err = main_in_process(["info", path], capsys)
    assert_one_line_error(rc, err, contains=f"allocsim: {path}: {BAD[name][1]}")
    assert out == ""


def test_cli_subprocess_bad_trace_and_debug_traceback(tmp_path):
    path = _bad(tmp_path, "double free")
    rc, out, err = run_cli(["info", path])
    assert_one_line_error(rc, err, contains=f"allocsim: {path}: event 4: double free of id 0")
    rc, out, err = run_cli(["--debug", "info", path])       # the traceback, then the line; the status is the error's
    assert rc == 2 and "Traceback" in err and "InputError" in err, (rc, err)
    assert err.rstrip().splitlines()[-1] == f"allocsim: {path}: event 4: double free of id 0", err
    rc, out, err = run_cli(["info", path, "--debug"])
    assert "Traceback" in err


@pytest.fixture
def good_trace(tmp_path):
    p = str(tmp_path / "good.bin")
    make_trace().save(p)
    return p


@pytest.mark.parametrize("argv, contains", [
    (["--policy", "no-such-policy"], "unknown policy 'no-such-policy'"),
    (["--policy", "none", "-O", "bogus=1"], "policy 'none': unknown option 'bogus'"),
    (["--policy", "none", "-O", "bogus"], "expected key=value"),
    (["--policy", "none", "--cap", "8XB"], "--cap: cannot parse size '8XB'"),
    (["--policy", "none", "--cap=-1GB"], "--cap: negative size '-1GB'"),
    (["--policy", "none", "--capacity", "lots"], "--capacity: cannot parse size"),
    (["--policy", "none", "--gc-every", "1e999999GB"], "--gc-every"),
    (["--policy", "none", "--runtime", "refcount"], "invalid choice"),
])
def test_cli_replay_usage_errors_are_one_line(good_trace, capsys, argv, contains):
    rc, out, err = main_in_process(["replay", good_trace, *argv], capsys)
    assert_one_line_error(rc, err, contains=contains)


def test_cli_replay_unknown_policy_subprocess(good_trace):
    rc, out, err = run_cli(["replay", good_trace, "--policy", "nope"])
    assert_one_line_error(rc, err, contains="allocsim: unknown policy 'nope'")


def test_cli_info_reports_the_trace(good_trace, capsys):
    t = Trace.load(good_trace)
    rc, out, err = main_in_process(["info", good_trace, "--json"], capsys)
    assert rc == 0 and err == ""
    d = json.loads(out)
    sizes = np.sort(t.size[t.kind == ev.ALLOC].astype(np.int64))
    assert d["finished"] and d["allocs"] == 120 and d["frees"] == 120 and d["events"] == len(t)
    assert d["events_by_kind"] == {"ALLOC": 120, "FREE": 120, "SEGMENT_ALLOC": 1, "SEGMENT_FREE": 1, "GC": 3,
                                   "OOM": 1, "MARK": 3}
    assert d["distinct_sizes"] == len(set(sizes.tolist())) and d["max_alloc_bytes"] == sizes[-1]
    assert d["load_bytes"] == t.load_bytes and d["marks"] == 3
    assert d["allocs_per_iteration_median"] == 40 and d["allocs_per_iteration_min"] == 40
    assert d["streams"] == [0, 0xBEEF] and d["gc_events"] == {"incremental": 2, "full": 1}
    assert d["upstream_segments"]["segment_alloc"] == 1 and d["upstream_segments"]["peak_reserved_bytes"] == 2 << 20
    assert d["duration_ns"] == int(t.time_ns.max())
    assert d["metadata"]["device"]["total_memory"] == 85031714816 and d["metadata"]["command"] == META["command"]
    # histogram: power-of-two buckets that partition the allocations
    h = d["size_histogram"]
    assert sum(b["count"] for b in h) == 120 and sum(b["bytes"] for b in h) == int(sizes.sum())
    for b in h:
        inside = sizes[(sizes >= b["lo"]) & (sizes < b["hi"])]
        assert len(inside) == b["count"] and (b["lo"] == 0 or b["hi"] == 2 * b["lo"])
        assert b["lo"] == 0 or b["lo"] & (b["lo"] - 1) == 0
    rc, out, err = main_in_process(["info", good_trace], capsys)
    assert rc == 0 and "LOAD" in out and "H100" in out and "UNFINISHED" not in out and "[512 KiB, 1 MiB)" in out


def test_info_on_empty_trace(tmp_path, capsys):
    p = str(tmp_path / "e.bin")
    TraceWriter().finish().save(p)
    rc, out, err = main_in_process(["info", p, "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["events"] == 0 and d["size_histogram"] == [] and d["median_alloc_bytes"] == 0


def test_info_reads_as_a_person_reads_it(tmp_path, capsys):
    """A per-size settings table (PyTorch reports roundup_power2_divisions as a dict of interval -> divisions) is
    one number where all are equal and its sizes in order where not; the per-iteration median has thousands
    separators as its min and max do; each stream is named by its id."""
    from allocsim.commands.info import _setting
    assert _setting({"1": 4, "1024": 4, "128": 4}) == "4"
    assert _setting({"1024": 8, "2": 1, "256": 1}) == "[2:1,256:1,1024:8]"
    assert _setting({"max_split_size_mb": 1}) == "{'max_split_size_mb': 1}" and _setting(134217728) == "134217728"
    w = TraceWriter(meta={"allocator_settings": {"roundup_power2_divisions": {"1": 4, "16": 4}}})
    for step in range(3):
        w.mark(f"step {step}")
        ids = [w.alloc(1 << 10, stream=7 if step == 2 else 0) for _ in range(1234)]
        for i in ids:
            w.free(i)
    p = str(tmp_path / "s.bin")
    w.finish().save(p)
    rc, out, err = main_in_process(["info", p], capsys)
    assert rc == 0 and "roundup_power2_divisions=4" in out, out
    assert re.search(r"allocs per iteration median 1,234 \(min [\d,]+, max 1,234\)", out), out
    assert "streams 2 (ids 0, 7)" in out, out


# ---- no half-written output --------------------------------------------------------------
def test_failed_save_leaves_no_file(tmp_path):
    t = make_trace()
    t.records = np.zeros(3, [("x", "<u8")])      # cannot become records: the write fails midway
    p = tmp_path / "out.bin"
    with pytest.raises(Exception):
        t.save(str(p))
    assert os.listdir(tmp_path) == []


def _output_commands():
    """Subcommands with an ``-o/--output`` option (they land as other modules are written)."""
    parser = cli.make_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(name for name, sp in sub.choices.items()
                  if any("-o" in a.option_strings or "--output" in a.option_strings for a in sp._actions))


@pytest.mark.parametrize("command", _output_commands())
def test_failing_command_leaves_no_output_file(tmp_path, capsys, command):
    bad = _bad(tmp_path, "double free")
    out_path = tmp_path / "result.out"
    rc, out, err = main_in_process([command, bad, "-o", str(out_path)], capsys)
    assert rc == 2 and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["bad.bin"]


@pytest.mark.parametrize("name", ["gpt2", "cupy_mlp", "pools-capture", "cudnn-benchmark-resnet50"])
def test_kinds_present_are_the_kinds_the_records_hold(name, monkeypatch):
    """`Trace.kinds_present` counts the kinds chunk by chunk (a small chunk here: several of them)."""
    from allocsim.trace import trace as trace_module
    t = Trace.load(str(Path(__file__).resolve().parent.parent / "traces" / f"{name}.bin"))
    monkeypatch.setattr(trace_module, "CHUNK", 4096)
    assert t.kinds_present == frozenset(int(k) for k in set(t.records["kind"].tolist()))


def test_an_unknown_kind_is_reported_from_the_chunk_it_is_in_without_reading_the_rest(monkeypatch):
    """An unknown event kind is the first defect `validate` reports whatever follows it, so the walk stops at the chunk
    that holds one: a file of zeros claiming 400 GiB (sparse: no room on disk) was read whole, minutes and memory in
    proportion, before its one line. A defect of a later check does not stop it (an unknown kind after it comes
    first)."""
    import allocsim.trace.trace as trace_module
    from conftest import random_trace
    monkeypatch.setattr(trace_module, "CHUNK", 100)
    records = np.array(random_trace(2000, seed=3).records)
    read = []
    original = Trace.chunks

    def counted(self):
        for start, rec in original(self):
            read.append(start)
            yield start, rec
    monkeypatch.setattr(Trace, "chunks", counted)
    bad = records.copy()
    bad[150]["kind"] = 0                    # (no kind is 0)
    with pytest.raises(InputError, match="event 150: unknown event kind 0"):
        Trace(bad, {}).validate()
    assert read == [0, 100], read
    read.clear()
    later = records.copy()
    later[150]["size"], later[1500]["kind"] = 1 << 61, 0      # an absurd size first, then an unknown kind
    with pytest.raises(InputError, match="event 1500: unknown event kind 0"):
        Trace(later, {}).validate()
    assert read[-1] == 1500, read
