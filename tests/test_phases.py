"""Compilation as a phase (docs/compile.md): the recorder's scopes around torch.compile's work, what `info` and
`replay` say of the phases, and ``--warm-cache``. On the CPU: the stand-in torch (tests/fixtures/fake_torch),
whose dynamo and inductor allocate where the real ones do, and traces written by hand."""
import importlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from allocsim.formats.recorders import torch_compile
from allocsim.trace import Trace
from allocsim.trace import events as ev

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_TORCH = os.path.join(ROOT, "tests", "fixtures", "fake_torch")
MiB = 1 << 20


def _record(tmp_path, body: str):
    """``allocsim record -o t.bin prog.py`` of ``body`` under the stand-in torch; the trace and what it printed."""
    (tmp_path / "prog.py").write_text(textwrap.dedent(body))
    r = subprocess.run([sys.executable, "-m", "allocsim", "record", "-o", "t.bin", "prog.py"], cwd=tmp_path,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE_TORCH, ROOT])))
    assert r.returncode == 0, r.stderr
    return Trace.load(str(tmp_path / "t.bin")), r.stdout


def _story(trace):
    """The trace's allocations, frees and scopes, in order: ``("ALLOC", MiB)``, ``("FREE", id)``, ``("PHASE_BEGIN",
    label)``, ..."""
    out = []
    for e in trace:
        if e.kind == ev.ALLOC:
            out.append(("ALLOC", e.size // MiB))
        elif e.kind == ev.FREE:
            out.append(("FREE", e.id))
        elif e.kind in ev.SCOPE_KINDS:
            out.append((ev.KIND_NAMES[e.kind], trace.labels[e.aux]))
    return out


def test_recorder_writes_compile_autotune_and_try_scopes_where_the_calls_are(tmp_path):
    """The stand-in's dynamo compiles a frame, its inductor a graph (a scratch buffer freed, a constant kept) and
    benchmarks two candidates, the second failing: each call lies inside its scope, nested as the calls are."""
    trace, _ = _record(tmp_path, """
        import torch
        a = torch.cuda.fake_alloc(4 << 20)
        from torch._dynamo import convert_frame
        kept = convert_frame._compile(8 << 20)
        torch.cuda.fake_free(a, 4 << 20)
    """)
    assert _story(trace) == [
        ("ALLOC", 4), ("PHASE_BEGIN", "compile"), ("PHASE_BEGIN", "compile"), ("ALLOC", 8), ("ALLOC", 4),
        ("PHASE_BEGIN", "autotune"), ("TRY_BEGIN", "inductor autotune"), ("ALLOC", 8), ("FREE", 3),
        ("TRY_END", "inductor autotune"), ("TRY_BEGIN", "inductor autotune"), ("TRY_END", "inductor autotune"),
        ("PHASE_END", "autotune"), ("FREE", 1), ("PHASE_END", "compile"), ("PHASE_END", "compile"), ("FREE", 0)]
    kind, size = trace.kind, trace.size
    for begin, end in ev.SCOPES.items():        # each END carries its BEGIN's serial
        assert sorted(size[kind == begin].tolist()) == sorted(size[kind == end].tolist())


def test_a_program_that_does_not_compile_imports_nothing_of_dynamo_or_inductor(tmp_path):
    trace, out = _record(tmp_path, """
        import sys, torch
        torch.cuda.fake_free(torch.cuda.fake_alloc(4 << 20), 4 << 20)
        print(sorted(m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor"))))
    """)
    assert out.strip() == "[]"
    assert not set(trace.kind.tolist()) & set(ev.SCOPE_KINDS)


class _Rec:
    """A recorder's scope calls, written down; ``fail`` makes them raise."""

    def __init__(self, fail=False):
        self.log, self.notes, self.fail, self.serial = [], [], fail, 0

    def scope_begin(self, kind, label):
        if self.fail:
            raise RuntimeError("no drain")
        self.serial += 1
        self.log.append((ev.KIND_NAMES[kind], label))
        return self.serial

    def scope_end(self, kind, label, serial):
        self.log.append((ev.KIND_NAMES[kind], label))

    def note(self, text):
        self.notes.append(text)


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``phasepkg`` of two modules: ``early`` (imported before the hooks) and ``late``."""
    pkg = tmp_path / "phasepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("early", "late"):
        (pkg / f"{name}.py").write_text(textwrap.dedent("""
            def work(x):
                return x + 1

            class Tuner:
                @classmethod
                def bench(cls, x):
                    return cls.__name__, x

            class Sub(Tuner):
                pass
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "phasepkg"
    for m in [m for m in sys.modules if m.startswith("phasepkg")]:
        del sys.modules[m]


HOOKS = [("phasepkg.early", "work", ev.PHASE_BEGIN, "compile"),
         ("phasepkg.late", "work", ev.PHASE_BEGIN, "compile"),
         ("phasepkg.late", "Sub.bench", ev.TRY_BEGIN, "tries"),
         ("phasepkg.late", "absent", ev.PHASE_BEGIN, "compile")]


def test_hooks_patch_at_once_or_at_import_and_remove_restores_everything(package):
    early = importlib.import_module("phasepkg.early")
    original = early.work
    rec = _Rec()
    hooks = torch_compile.Hooks(rec, HOOKS)
    hooks.install()
    assert early.work is not original and "phasepkg.late" not in sys.modules     # nothing imported by the hooks
    assert early.work(1) == 2 and rec.log == [("PHASE_BEGIN", "compile"), ("PHASE_END", "compile")]
    late = importlib.import_module("phasepkg.late")
    rec.log.clear()
    assert late.Sub.bench(3) == ("Sub", 3) and late.Tuner.bench(4) == ("Tuner", 4)     # still a classmethod
    assert rec.log == [("TRY_BEGIN", "tries"), ("TRY_END", "tries")]     # the base class's own is not patched
    assert hooks.summary()["missing"] == ["phasepkg.late.absent"]
    hooks.remove()
    assert early.work is original and "bench" not in vars(late.Sub) and late.work(1) == 2
    assert not any(isinstance(f, torch_compile._Watch) for f in sys.meta_path)
    rec.log.clear()
    early.work(1), late.work(1), late.Sub.bench(1)
    assert rec.log == []


def test_a_failing_hook_leaves_the_call_alone(package):
    rec = _Rec(fail=True)
    hooks = torch_compile.Hooks(rec, HOOKS)
    hooks.install()
    try:
        late = importlib.import_module("phasepkg.late")
        assert late.work(1) == 2 and hooks.errors == 1 and "compile hook failed" in rec.notes[0]
    finally:
        hooks.remove()


def test_the_scope_closes_when_the_call_raises(package):
    rec = _Rec()
    hooks = torch_compile.Hooks(rec, HOOKS)
    hooks.install()
    try:
        late = importlib.import_module("phasepkg.late")
        with pytest.raises(TypeError):
            late.Sub.bench()
        assert rec.log == [("TRY_BEGIN", "tries"), ("TRY_END", "tries")]
    finally:
        hooks.remove()


# ---- the phases' shares and the warm view, against a plain walk of the events ------------------------------------

from hypothesis import example, given, settings
from hypothesis import strategies as st

from allocsim.trace import TraceWriter
from allocsim.trace import trace as trace_module
from allocsim.trace.phases import PhaseTally, phase_shares, warm_view

LABELS = ("compile", "autotune", "eval")
OPS = st.lists(st.one_of(st.tuples(st.just("alloc"), st.integers(1, 64)), st.tuples(st.just("free"), st.integers(0, 99)),
                         st.tuples(st.just("begin"), st.sampled_from(LABELS)), st.tuples(st.just("end"), st.just(0)),
                         st.tuples(st.just("oom"), st.integers(1, 64)), st.tuples(st.just("segment"), st.integers(1, 64)),
                         st.tuples(st.just("mark"), st.just(0))),
               max_size=60)


def _build(ops, close=True):
    """A trace of ``ops``: allocations, frees (of the k-th live object), phases opened and closed (the innermost),
    OOMs, segment allocations and marks; also returns, per ALLOC, its size, the stack of phase labels open at it,
    the outermost compile/autotune phase open (its begin event, None) and whether a warm run leaves it out (freed
    before the step its cold phase ends in is over: no MARK since that phase closed)."""
    w = TraceWriter({"framework": "torch"})
    live, stack, cold = [], [], []      # stack: (label, serial); cold: the outermost cold phase's begin event
    allocs = {}                         # id -> [size, labels open, cold phase, left out]
    stepped = set()                     # the cold phases closed with a MARK after them
    for op, x in ops:
        if op == "alloc":
            i = w.alloc(x)
            live.append(i)
            allocs[i] = [x, [lab for lab, _ in stack], cold[0] if cold else None, False]
        elif op == "free" and live:
            i = live.pop(x % len(live))
            w.free(i)
            allocs[i][3] = allocs[i][2] is not None and allocs[i][2] not in stepped
        elif op == "mark":
            w.mark("step")
            stepped.update(v[2] for v in allocs.values() if isinstance(v, list) and v[2] is not None
                           and not (cold and cold[0] == v[2]))
        elif op == "begin":
            if x in ("compile", "autotune") and not cold:
                cold.append(w.count)
            stack.append((x, w.begin(ev.PHASE_BEGIN, x)))
        elif op == "end" and stack:
            lab, serial = stack.pop()
            w.end(ev.PHASE_END, lab, serial)
            if cold and not any(label in ("compile", "autotune") for label, _ in stack):
                cold.clear()            # the outermost cold phase ended
        elif op == "oom":
            w.oom(x)
            allocs.setdefault("cold ooms", 0)
            allocs["cold ooms"] += bool(cold)
        elif op == "segment":
            w.segment(ev.SEGMENT_ALLOC, 0, x << 20)
    while close and stack:
        lab, serial = stack.pop()
        w.end(ev.PHASE_END, lab, serial)
    return w.finish(), allocs


def _objects(allocs):
    return [v for k, v in allocs.items() if k != "cold ooms"]


def _live_by_label(trace, allocs, at):
    """Live bytes after event ``at`` of the objects allocated inside each innermost label, by a walk."""
    held, alive = {}, {}
    for e in list(trace)[:at + 1]:
        if e.kind == ev.ALLOC:
            alive[e.id] = allocs[e.id]
        elif e.kind == ev.FREE:
            alive.pop(e.id)
    for size, labels, _, _ in alive.values():
        if labels:
            held[labels[-1]] = held.get(labels[-1], 0) + size
    return held


@settings(max_examples=60, deadline=None, derandomize=True)
@given(OPS, st.integers(1, 9))
def test_phase_shares_match_a_plain_walk(ops, chunk):
    trace, allocs = _build(ops)
    old, trace_module.CHUNK = trace_module.CHUNK, chunk      # the chunked walk, across chunk borders
    try:
        got = phase_shares(trace)
        at = len(trace) // 2
        got_at = phase_shares(trace, at)
    finally:
        trace_module.CHUNK = old
    if not any(op == "begin" for op, _ in ops):
        assert got is None
        return
    want = {}
    for size, labels, _, _ in _objects(allocs):
        if labels:
            n, b = want.get(labels[-1], (0, 0))
            want[labels[-1]] = (n + 1, b + size)
    assert {k: (p["requests"], p["request_bytes"]) for k, p in got["phases"].items() if p["requests"]} == want
    curve = trace.live_curve
    peak = int(np.argmax(curve)) if len(curve) else None
    assert (got["event"], got["live_bytes"]) == (peak, int(curve[peak]))
    for shares, where in ((got, peak), (got_at, at)):
        held = _live_by_label(trace, allocs, where)
        assert {k: p["live_bytes"] for k, p in shares["phases"].items() if p["live_bytes"]} == held


def _warm_reference(trace, allocs):
    """The warm view's (kind, size) sequence of ALLOCs and FREEs, by a plain walk: an object allocated inside a
    cold phase and freed before the step that phase ends in is over is left out."""
    out = []
    for e in trace:
        if e.kind in (ev.ALLOC, ev.FREE) and not allocs[e.id][3]:
            out.append((e.kind, allocs[e.id][0]))
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(OPS)
@example([("begin", "compile"), ("alloc", 8), ("alloc", 4), ("end", 0), ("free", 0), ("mark", 0), ("free", 0)])
def test_warm_view_leaves_out_what_dies_inside_cold_phases(ops):
    trace, allocs = _build(ops)
    view = warm_view(trace)
    view.validate()                     # dense ids, every FREE of a live object
    sizes = view.id_size
    got = [(int(k), int(sizes[i])) for k, i in zip(view.kind.tolist(), view.id.tolist()) if k in (ev.ALLOC, ev.FREE)]
    assert got == _warm_reference(trace, allocs)
    assert view.load_bytes <= trace.load_bytes
    kinds = view.kind.tolist()
    assert ev.SEGMENT_ALLOC not in kinds
    assert kinds.count(ev.OOM) == trace.kind.tolist().count(ev.OOM) - allocs.get("cold ooms", 0)
    assert kinds.count(ev.PHASE_BEGIN) == trace.kind.tolist().count(ev.PHASE_BEGIN)     # the phases are kept
    again = warm_view(view)
    assert np.array_equal(again.records, view.records)     # nothing more to leave out


# ---- the commands -----------------------------------------------------------------------------------------------

import json

from allocsim.engine.replay import replay

from allocsim.cli import main


def run_cli(*args):
    """``allocsim ARGS`` in this process: its status, stdout and stderr (`main`, as the console script runs it)."""
    import contextlib
    import io
    import types
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    return types.SimpleNamespace(returncode=status, stdout=out.getvalue(), stderr=err.getvalue())


def _compiled_run(path):
    """A first run of a compiled program, written by hand: 4 MiB of weights, a compilation whose autotuning
    allocates and frees 64 MiB (the recording's peak) and keeps a 2 MiB constant, then three steps of 16 MiB of
    activations; the recorded allocator's segment calls beside them."""
    w = TraceWriter({"framework": "torch", "device": {"name": "test", "total_memory": 1 << 30}})
    w.segment(ev.SEGMENT_ALLOC, 1 << 32, 20 * MiB)
    weights = w.alloc(4 * MiB)
    c = w.begin(ev.PHASE_BEGIN, "compile")
    a = w.begin(ev.PHASE_BEGIN, "autotune")
    w.segment(ev.SEGMENT_ALLOC, 2 << 32, 64 * MiB)
    scratch = w.alloc(64 * MiB)
    w.free(scratch)
    w.end(ev.PHASE_END, "autotune", a)
    const = w.alloc(2 * MiB)
    w.end(ev.PHASE_END, "compile", c)
    for step in range(3):
        act = w.alloc(16 * MiB)
        w.free(act)
        w.mark(f"step {step + 1}")
    w.free(const)
    w.free(weights)
    w.finish().save(path)
    return path


def test_info_and_replay_report_the_phases(tmp_path):
    path = _compiled_run(str(tmp_path / "run.bin"))
    info = json.loads(run_cli("info", path, "--json").stdout)
    assert info["phases"]["phases"] == {
        "compile": {"scopes": 1, "requests": 1, "request_bytes": 2 * MiB, "live_bytes": 0},
        "autotune": {"scopes": 1, "requests": 1, "request_bytes": 64 * MiB, "live_bytes": 64 * MiB}}
    assert info["phases"]["live_bytes"] == info["load_bytes"] == 68 * MiB
    r = run_cli("replay", path, "--policy", "torch", "--no-sections")
    assert r.returncode == 0, r.stderr
    assert "autotune" in r.stdout and "64.00 MiB live" in r.stdout
    plain = str(tmp_path / "plain.bin")
    TraceWriter({"framework": "torch"}).finish().save(plain)
    assert "phases" not in json.loads(run_cli("info", plain, "--json").stdout)


def test_warm_cache_is_one_view_for_every_command(tmp_path):
    """replay, compare and tune --warm-cache all run on `warm_view`: the same figures as a replay of it here."""
    path = _compiled_run(str(tmp_path / "run.bin"))
    want = replay(warm_view(Trace.load(path)), "torch")
    assert want.load_bytes == 22 * MiB
    r = run_cli("replay", path, "--policy", "torch", "--warm-cache", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["peak_reserved_bytes"], got["device_mallocs"], got["trace"]) == \
        (want.peak_reserved_bytes, want.device_mallocs, path)
    assert got["warm_cache"]["allocs"] == 1 and "left out 1 allocations (64.00 MiB)" in r.stderr
    rows = json.loads(run_cli("compare", path, "-p", "torch", "--warm-cache", "--json", "-j", "1").stdout)
    assert [(row["peak_reserved_bytes"], row["trace"]) for row in rows] == [(want.peak_reserved_bytes, path)]
    cold = run_cli("tune", path, "--no-fit", "-j", "1", "--json")
    assert cold.returncode == 0, cold.stderr
    assert "lies inside compile/autotune" in cold.stderr
    assert json.loads(cold.stdout)["run_tuned_for"].startswith("the recorded run")
    warm = run_cli("tune", path, "--no-fit", "-j", "1", "--json", "--warm-cache")
    assert "lies inside" not in warm.stderr and json.loads(warm.stdout)["load_bytes"] == 22 * MiB
    assert json.loads(warm.stdout)["run_tuned_for"].startswith("a later run with warm compile caches")


def test_warm_cache_refusals_are_one_line(tmp_path):
    plain = str(tmp_path / "plain.bin")
    w = TraceWriter({"framework": "torch"})
    w.free(w.alloc(MiB))
    w.finish().save(plain)
    r = run_cli("replay", plain, "--warm-cache")
    assert r.returncode == 2 and "no compile or autotune phase" in r.stderr and len(r.stderr.splitlines()) == 1
    # validate's first run too (it validated the recording less its segment calls against the warm run: MATCH)
    bert = os.path.join(ROOT, "traces", "bert_mlm.bin")
    r = run_cli("validate", bert, "--warm-cache", bert)
    assert r.returncode == 2 and "no compile or autotune phase" in r.stderr and len(r.stderr.splitlines()) == 1, \
        r.stderr
    assert "bert_mlm.bin" in r.stderr
    path = _compiled_run(str(tmp_path / "run.bin"))
    r = run_cli("validate", path, path, "--warm-cache", path)
    assert r.returncode == 2 and "give one trace" in r.stderr and len(r.stderr.splitlines()) == 1


def test_validate_warm_cache_compares_the_prediction_with_the_warm_recording(tmp_path):
    """Against the first run itself the requests differ (a warm run makes fewer): MISMATCH, exit status 1."""
    path = _compiled_run(str(tmp_path / "run.bin"))
    r = run_cli("validate", path, "--warm-cache", path, "--json")
    assert r.returncode == 1, r.stderr
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert (checks["requests"]["recorded"], checks["requests"]["model"]) == (6, 5)
    assert checks["peak reserved"]["recorded"] == 84 * MiB
