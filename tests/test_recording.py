"""Recording from inside Python (`allocsim.recording`, `start_recording` / `stop_recording`, docs/recording.md),
on the CPU with the stand-in torch of tests/fixtures/fake_torch: each program runs in its own interpreter."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from allocsim.formats.recorders import session
from allocsim.trace import Trace
from allocsim.trace import events as ev

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE_TORCH = os.path.join(ROOT, "tests", "fixtures", "fake_torch")


def _run(tmp_path, body: str):
    """Run ``body`` (after ``import torch, allocsim``) in a fresh interpreter in ``tmp_path``."""
    (tmp_path / "prog.py").write_text("import sys, torch, allocsim\nOUT = 'run.bin'\n" + textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE_TORCH, ROOT]))
    return subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=60)


def _stats(tmp_path):
    return json.load(open(tmp_path / "run.bin.stats.json"))


MiB = 1 << 20


def test_with_recording_writes_the_trace_record_writes(tmp_path):
    r = _run(tmp_path, """
        with allocsim.recording(OUT) as rec:
            a = torch.cuda.fake_alloc(4 << 20)
            torch.optim.fake_step()
            torch.cuda.fake_free(a, 4 << 20)
        print(type(rec).__name__)
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "TorchRecorder"
    t = Trace.load(str(tmp_path / "run.bin"))
    assert t.n_allocs == 1 and [lab for _, lab in t.marks()] == ["step 1"]
    assert t.meta["started_from"] == "python" and "started_late" not in t.meta
    assert _stats(tmp_path)["optimizer_steps"] == 1
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_the_body_raising_still_leaves_a_whole_trace(tmp_path):
    r = _run(tmp_path, """
        with allocsim.recording(OUT):
            torch.cuda.fake_alloc(4 << 20)
            raise ValueError("the program's own error")
    """)
    assert r.returncode == 1 and "ValueError: the program's own error" in r.stderr
    assert Trace.load(str(tmp_path / "run.bin")).n_allocs == 1
    stats = _stats(tmp_path)
    assert stats["exit_status"] == 1 and any("ValueError" in n for n in stats["notes"])


def test_a_second_recording_is_one_line(tmp_path):
    r = _run(tmp_path, """
        with allocsim.recording(OUT):
            try:
                allocsim.start_recording("other.bin")
            except allocsim.errors.AllocsimError as e:
                print("refused:", e)
            try:
                with allocsim.recording("other.bin"):
                    pass
            except allocsim.errors.AllocsimError as e:
                print("refused:", e)
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("refused: a recording is already running") for line in lines)
    assert "run.bin" in lines[0] and not (tmp_path / "other.bin").exists()


def test_start_and_stop(tmp_path):
    r = _run(tmp_path, """
        try:
            allocsim.stop_recording()
        except allocsim.errors.AllocsimError as e:
            print("refused:", e)
        allocsim.start_recording(OUT)
        torch.cuda.fake_alloc(2 << 20)
        stats = allocsim.stop_recording()
        print(stats["trace_summary"]["allocs"])
        allocsim.start_recording("second.bin")       # one after the other is fine
        allocsim.stop_recording()
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["refused: no recording started by allocsim.start_recording() is running", "1"]
    second = Trace.load(str(tmp_path / "second.bin"))        # the first's block is still live: seeded
    assert second.n_allocs == 1 and second.meta["pre_existing"] == 1


@pytest.mark.parametrize("ending,status,note", [("", 0, None), ("raise RuntimeError('late')", 1, "uncaught RuntimeError"),
                                                ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 143,
                                                 "signal SIGTERM")])
def test_a_recording_never_stopped_is_finished_at_exit(tmp_path, ending, status, note):
    r = _run(tmp_path, f"""
        allocsim.start_recording(OUT)
        torch.cuda.fake_alloc(2 << 20)
        {ending}
    """)
    assert r.returncode == status, r.stderr
    assert Trace.load(str(tmp_path / "run.bin")).n_allocs == 1
    stats = _stats(tmp_path)
    assert stats["exit_status"] == status
    assert (note is None and not stats["notes"]) or any(note in n for n in stats["notes"])


def test_started_late_the_live_blocks_are_seeded(tmp_path):
    """A notebook that built its model before recording: the blocks live then become PRE_EXISTING ALLOCs and the
    segments the trace's initial segments, as the importer seeds a snapshot; their frees pair with them."""
    r = _run(tmp_path, """
        import warnings
        warnings.simplefilter("always")
        weights = torch.cuda.fake_alloc(6 << 20)
        cached = torch.cuda.fake_alloc(2 << 20)
        torch.cuda.fake_free(cached, 2 << 20)
        with allocsim.recording(OUT):
            act = torch.cuda.fake_alloc(4 << 20)
            torch.cuda.fake_free(weights, 6 << 20)
    """)
    assert r.returncode == 0, r.stderr
    assert "recording began with 1 blocks (6,291,456 bytes) live in 2 segments" in r.stderr
    t = Trace.load(str(tmp_path / "run.bin"))
    kind, flags = np.asarray(t.kind), np.asarray(t.flags)
    allocs = np.flatnonzero(kind == ev.ALLOC)
    assert [bool(flags[i] & ev.PRE_EXISTING) for i in allocs] == [True, False]
    assert t.meta["pre_existing"] == 1 and len(t.meta["initial_segments"]) == 2
    assert t.meta["started_late"]["reserved_bytes"] == 8 * MiB
    stats = _stats(tmp_path)
    assert stats["conversion"].get("unmatched_free", 0) == 0 and stats["conversion"]["free_completed"] == 1
    assert not any("the allocator counted" in n for n in stats["notes"])       # counted from the start
    assert any("pre-existing blocks" in n for n in stats["notes"])


def test_recording_does_not_import_torch_until_entered():
    r = subprocess.run([sys.executable, "-c", "import sys, allocsim; allocsim.recording('x.bin'); "
                        "print('torch' in sys.modules)"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert r.stdout.strip() == "False", r.stderr


def test_choose_framework(monkeypatch):
    import types
    for name in ("torch", "cupy"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert session.choose_framework("cupy") == "cupy"
    with pytest.raises(Exception, match="unknown"):
        session.choose_framework("jax")
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    assert session.choose_framework(None) == "cupy"
    started = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", started)
    assert session.choose_framework(None) == "torch"          # both imported: the one whose CUDA started
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(
        is_initialized=lambda: False)))
    with pytest.raises(Exception, match="both torch and cupy"):
        session.choose_framework("auto")


# ---- launchers: the command lines recorded process by process (docs/several-processes.md) ---------------------
def _program_argv(*line):
    from allocsim.cli import make_parser
    from allocsim.commands.record import program_argv
    return program_argv(make_parser().parse_args(["record", *line]))


def _console_script(folder, name):
    """A launcher's console script as pip installs it: a Python script on a ``#!.../python`` line."""
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text(f"#!{sys.executable}\nimport sys\nsys.exit(0)\n")
    p.chmod(0o755)
    return p


def test_launchers_are_programs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bin_ = tmp_path / "bin"
    _console_script(bin_, "accelerate")
    _console_script(bin_, "torchrun")
    monkeypatch.setenv("PATH", os.pathsep.join([str(bin_), os.path.dirname(sys.executable), os.environ["PATH"]]))
    line = ["accelerate", "launch", "--num_processes", "2", "train.py", "--lr", "1"]
    assert _program_argv("--", *line) == line
    python = os.path.basename(sys.executable)
    dist = [python, "-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"]
    assert _program_argv("--", *dist) == dist
    assert _program_argv("-m", "accelerate.commands.launch", "train.py") == \
        [sys.executable, "-m", "accelerate.commands.launch", "train.py"]
    # a launcher named by its script's path: started as a program, not run inside allocsim as a Python script
    assert _program_argv("--", "bin/torchrun", "--nproc-per-node", "2", "t.py") == \
        ["bin/torchrun", "--nproc-per-node", "2", "t.py"]
    _console_script(tmp_path, "tool")
    assert _program_argv("--", "./tool") is None           # any other Python script still runs inside allocsim


def test_a_launcher_beside_this_python_is_found(tmp_path, monkeypatch):
    """A virtual environment that is not activated: its ``bin/accelerate`` is not on PATH, but beside its python."""
    monkeypatch.chdir(tmp_path)
    venv_bin = tmp_path / "venv" / "bin"
    launcher = _console_script(venv_bin, "accelerate")
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _program_argv("--", "accelerate", "launch", "train.py") == [str(launcher), "launch", "train.py"]


def test_default_names_of_launched_runs():
    from allocsim.formats.recorders.processes import default_output
    assert default_output(["accelerate", "launch", "--num_processes", "2", "train.py"]) == "train.bin"
    assert default_output(["accelerate", "launch", "-m", "pkg.finetune", "--lr", "1"]) == "finetune.bin"
    assert default_output(["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "pkg.train"]) \
        == "train.bin"
    assert default_output(["python", "-m", "torch.distributed.run"]) == "python.bin"


def test_under_allocsim_records_program_mode_the_program_does_not_start_its_own(tmp_path):
    """``allocsim record -- python prog.py``: the process is recorded from CUDA's start; a recording of the program's
    own would take the same allocator history, so it is refused in one line (a trainer's callback only marks)."""
    (tmp_path / "prog.py").write_text(textwrap.dedent("""
        import os, allocsim
        os.environ["ALLOCSIM_RECORD_RUN"] = "{}"
        try:
            allocsim.start_recording("own.bin")
        except allocsim.errors.AllocsimError as e:
            print("refused:", e)
        from allocsim.integrations import RunRecording
        r = RunRecording("own.bin")
        r.start()
        print(r.recorder)
    """))
    r = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE_TORCH, ROOT])))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["refused: this process is recorded by allocsim record (ALLOCSIM_RECORD_RUN is "
                                     "set), from when CUDA starts: let allocsim.mark() label that recording", "None"]


def test_the_programs_own_history_is_taken_over_and_said(tmp_path):
    r = _run(tmp_path, """
        torch.cuda.memory._record_memory_history(enabled="all")
        torch.cuda.fake_alloc(2 << 20)
        with allocsim.recording(OUT):
            pass
    """)
    assert r.returncode == 0, r.stderr
    assert any("_record_memory_history) was on" in n for n in _stats(tmp_path)["notes"])


def test_stacks_takes_what_record_takes(tmp_path):
    """``stacks=True`` is Python frames (torch's history takes only 'python' or 'all': True reached it and raised
    a TypeError inside the recorder); anything else is one line."""
    import allocsim
    from allocsim.errors import UsageError
    for bad in ("everything", [], 1.0):     # ([]: a bare "unhashable type" TypeError; 1.0 was taken for True)
        with pytest.raises(UsageError, match=re.escape(f"stacks={bad!r}")):
            allocsim.start_recording(str(tmp_path / "r.bin"), stacks=bad)
    assert not (tmp_path / "r.bin").exists()


def test_a_start_that_fails_undoes_what_it_installed(tmp_path):
    """A start that fails part way (here the compile hooks') leaves torch as it found it and no file, so that the
    notebook can start again: before, the empty_cache/fraction wrappers and the pool hooks stayed in place."""
    r = _run(tmp_path, """
        from allocsim.formats.recorders import torch_compile
        original = torch.cuda.empty_cache
        install = torch_compile.Hooks.install
        def broken(self):
            raise RuntimeError("hooks failed")
        torch_compile.Hooks.install = broken
        try:
            allocsim.start_recording(OUT)
        except RuntimeError:
            pass
        assert torch.cuda.empty_cache is original and torch.cuda.memory.empty_cache is original
        torch_compile.Hooks.install = install
        with allocsim.recording(OUT):
            torch.cuda.fake_alloc(1 << 20)
        print("again ok")
    """)
    assert r.returncode == 0 and "again ok" in r.stdout, r.stderr[-2000:]
    assert Trace.load(str(tmp_path / "run.bin")).n_allocs == 1
