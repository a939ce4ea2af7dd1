"""Compilation as a phase (docs/compile.md): the recorder's scopes around torch.compile's work, what `info` and
`replay` say of the phases, and ``--warm-cache``. On the CPU: the stand-in torch (tests/fixtures/fake_torch),
whose dynamo and inductor allocate where the real ones do, and traces written by hand."""
import importlib
import os
import subprocess
import sys
import textwrap

import pytest

from allocsim.recorders import torch_compile
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
