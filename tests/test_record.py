"""`allocsim record`: argument handling, refusal without a GPU, the recorder lifecycle,
torch-history conversion, the recorded traces in traces/, and (marked gpu) end-to-end
recordings checked against the real allocators' own counters."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from allocsim.formats import recorders
from allocsim.cli import main
from allocsim.formats.recorders._base import Recorder
from allocsim.formats.recorders.torch import EntryConverter
from allocsim.trace import Trace, TraceWriter
from allocsim.trace import events as ev

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES = sorted(p for p in glob.glob(os.path.join(REPO, "traces", "*.bin")) if os.path.exists(p + ".stats.json"))


def _script(tmp_path, name, body):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return str(p)


# ---- argument handling and refusals (CPU) ----------------------------------------------------
def test_plain_script_is_refused_and_leaves_nothing(tmp_path, capsys):
    s = _script(tmp_path, "plain.py", "open('ran', 'w').write('x')\n")
    out = tmp_path / "t.bin"
    assert main(["record", "-o", str(out), s]) == 2
    err = capsys.readouterr().err
    assert "plain.py" in err and "framework" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["plain.py"]          # not run, nothing written


@pytest.mark.parametrize("fw", ["torch", "cupy"])
def test_missing_framework_or_gpu_is_one_line_exit_2(tmp_path, capsys, fw):
    if importlib.util.find_spec(fw) is not None and _gpu_ok(fw):
        pytest.skip(f"{fw} with a GPU is available here")
    s = _script(tmp_path, "train.py", f"import {fw}\n")
    assert main(["record", "-o", str(tmp_path / "t.bin"), s]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot record" in err[0] and fw in err[0]
    assert sorted(os.listdir(tmp_path)) == ["train.py"]


@pytest.mark.parametrize("argv,msg", [
    ([], "no script"), (["missing.py"], "no such script"), (["-m"], "module name"),
    (["-m", "no_such_module_xyz"], "no module named"), (["--max-events", "0", "x.py"], "--max-events"),
    (["--stacks", "all"], "needs the script after it"),
    (["-o", "", "x.py"], "the file name is empty"),           # (-o "" wrote the default x.bin)
    (["--framework", "cupy", "--stacks", "x.py"], "--stacks: for PyTorch's recorder, not --framework cupy"),
    (["--framework", "cupy", "--max-events", "5", "x.py"], "--max-events: for PyTorch's recorder"),
    (["-m", "allocsim.trace"], "is a package with no __main__ module: python -m cannot run it"),
])
def test_bad_command_lines(argv, msg, capsys):
    try:
        status = main(["record", *argv])
    except SystemExit as e:         # argparse refusing an option's value (--max-events 0)
        status = e.code
    assert status == 2
    assert msg in capsys.readouterr().err


def test_a_package_with_no_main_is_told_without_running_its_init(tmp_path, monkeypatch, capsys):
    """``record -m pkg`` of a package with no ``__main__``: one line, and its ``__init__`` never runs in allocsim
    (finding ``pkg.__main__`` by `importlib.util.find_spec` imported the package: a traceback, exit 1)."""
    (tmp_path / "badpkg").mkdir()
    (tmp_path / "badpkg" / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w')\nraise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["record", "-o", str(tmp_path / "r.bin"), "-m", "badpkg"]) == 2
    assert "badpkg is a package with no __main__ module" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists()


def test_script_arguments_pass_through_untouched():
    from allocsim.cli import make_parser
    from allocsim.commands.record import parse_target
    a = make_parser().parse_args(["record", "-o", "x.bin", "train.py", "--iters", "3", "-o", "y"])
    t, default = parse_target(a)
    assert (a.output, t.script, t.args, default) == ("x.bin", "train.py", ["--iters", "3", "-o", "y"], "train.bin")
    a = make_parser().parse_args(["record", "--stacks", "-m", "pkg.train", "--iters", "3"])
    t, default = parse_target(a)
    assert (a.stacks, t.module, t.args, default) == ("python", "pkg.train", ["--iters", "3"], "train.bin")


@pytest.mark.parametrize("argv,stacks,script,args,out", [
    (["--stacks", "train.py", "--iters", "3"], "python", "train.py", ["--iters", "3"], None),   # as before
    (["--stacks", "all", "train.py", "--iters", "3"], "all", "train.py", ["--iters", "3"], None),
    (["--stacks=all", "-o", "a.bin", "train.py", "-o", "b"], "all", "train.py", ["-o", "b"], "a.bin"),
    (["--framework", "torch", "--stacks", "all", "-o", "a.bin", "train.py"], "all", "train.py", [], "a.bin"),
    (["--stacks", "python", "train.py", "all"], "python", "train.py", ["all"], None),
    (["train.py", "--stacks", "all"], None, "train.py", ["--stacks", "all"], None),    # the script's own
    (["--stacks=python", "train.py"], "python", "train.py", [], None),     # (argparse: "ignored explicit argument")
])
def test_stacks_all_or_python(argv, stacks, script, args, out):
    from allocsim.cli import make_parser
    from allocsim.commands.record import parse_target
    a = make_parser().parse_args(["record", *argv])
    t, _ = parse_target(a)
    assert (a.stacks, t.script, t.args, a.output) == (stacks, script, args, out)
    assert a.framework == ("torch" if "torch" in argv else "auto")


def test_detect_framework(tmp_path):
    assert recorders.detect_framework(_script(tmp_path, "a.py", "import torch.nn as nn\n")) == "torch"
    assert recorders.detect_framework(_script(tmp_path, "b.py", "from transformers import X\n")) == "torch"
    assert recorders.detect_framework(_script(tmp_path, "c.py", "import cupy as cp\n")) == "cupy"
    assert recorders.detect_framework(_script(tmp_path, "c2.py", "import gc, numpy as np, cupy\n")) == "cupy"
    with pytest.raises(Exception, match="both"):
        recorders.detect_framework(_script(tmp_path, "d.py", "import torch\nimport cupy\n"))
    with pytest.raises(Exception, match="cannot tell"):
        recorders.detect_framework(_script(tmp_path, "e.py", "# import torch (a comment)\n"))


# ---- the lifecycle, with a stand-in recorder (CPU) --------------------------------------------
class FakeRecorder(Recorder):
    """Records one ALLOC per `fake_alloc()` call the script makes, and marks."""

    framework = "fake"

    @classmethod
    def check_gpu(cls):
        pass

    def start(self):
        self.open_trace(self.base_meta())
        FakeRecorder.live = self

    def mark(self, label):
        self.writer.mark(label)

    def finish(self, exit_status=0):
        trace = self.close_trace()
        return self.write_stats({"exit_status": exit_status, "trace_summary": self.trace_summary(trace)})


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(recorders, "recorder_class", lambda fw: FakeRecorder)
    monkeypatch.setattr(recorders, "check_available", lambda fw: None)
    return FakeRecorder


BODY = """
    import sys, allocsim
    from test_record import FakeRecorder
    w = FakeRecorder.live.writer
    ids = [w.alloc(100 * (k + 1)) for k in range(3)]
    w.free(ids[0])
    allocsim.mark("half")
    assert sys.argv[1:] == ["--flag", "v"], sys.argv
    assert __name__ == "__main__"
"""


@pytest.mark.parametrize("ending,status", [("", 0), ("raise RuntimeError('boom')", 1),
                                           ("sys.exit(3)", 3), ("raise KeyboardInterrupt", 130),
                                           ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 143)])
def test_trace_is_written_however_the_script_ends(tmp_path, fake, ending, status, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    s = _script(tmp_path, "train.py", textwrap.dedent(BODY) + ending + "\n")
    out = str(tmp_path / "t.bin")
    before = signal.getsignal(signal.SIGTERM)
    argv = sys.argv[:]
    got, stats = recorders.record(recorders.Target(script=s, args=["--flag", "v"]), out, "torch")
    assert got == status
    assert signal.getsignal(signal.SIGTERM) == before and sys.argv == argv
    t = Trace.load(out)
    assert t.n_allocs == 3 and [lab for _, lab in t.marks()] == ["half"]
    assert t.load_bytes == 600
    saved = json.load(open(out + ".stats.json"))
    assert saved["exit_status"] == status and saved["trace_summary"]["events"] == 5
    assert not os.path.exists(out + ".partial")


def test_failed_start_leaves_nothing(tmp_path, fake, monkeypatch):
    def start(self):
        self.open_trace({})
        raise RuntimeError("allocator refused")
    monkeypatch.setattr(FakeRecorder, "start", start)
    s = _script(tmp_path, "train.py", "open('ran', 'w')\n")
    with pytest.raises(RuntimeError):
        recorders.record(recorders.Target(script=s), str(tmp_path / "t.bin"), "torch")
    assert sorted(os.listdir(tmp_path)) == ["train.py"]


# ---- torch history conversion (CPU, synthetic entries) --------------------------------------
def _e(action, addr, size, t, **kw):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, **kw}


def test_entry_converter_pairs_addresses_across_chunks():
    w = TraceWriter()
    c = EntryConverter(w)
    c.feed([_e("segment_alloc", 0x1000, 2 << 20, 10), _e("alloc", 0x1000, 512, 11), _e("alloc", 0x1200, 100, 12),
            _e("free_requested", 0x1000, 512, 13)])
    w.mark("step 1")
    c.feed([_e("free_completed", 0x1000, 512, 20), _e("alloc", 0x1000, 700, 21),    # address reused
            _e("snapshot", 0, 0, 22), _e("free_completed", 0x9999, 8, 23),           # unseen block
            _e("oom", 0, 4096, 24, device_free=77), _e("free_requested", 0x1000, 700, 25),
            _e("free_completed", 0x1000, 700, 26)])
    t = w.finish()
    t.validate()
    kinds = [ev.KIND_NAMES[k] for k in t.kind]
    assert kinds == ["SEGMENT_ALLOC", "ALLOC", "ALLOC", "FREE_REQUESTED", "MARK", "FREE", "ALLOC", "OOM",
                     "FREE_REQUESTED", "FREE"]
    assert list(t.id[t.kind == ev.FREE]) == [0, 2] and list(t.size[t.kind == ev.ALLOC]) == [512, 100, 700]
    assert t.time_ns[1] == 1000 and t.time_ns[-1] == 16000
    assert t.addr[t.kind == ev.OOM][0] == 77
    assert c.counts["unmatched_free"] == 1 and c.counts["snapshot"] == 1
    assert t.load_bytes == 800                # 100 + 700 live together, after the first block's free


# ---- traces recorded on a GPU, kept in traces/ ----------------------------------------------
@pytest.mark.skipif(not TRACES, reason="no recorded traces in traces/")
@pytest.mark.parametrize("path", TRACES, ids=[os.path.basename(p) for p in TRACES])
def test_recorded_trace_loads_and_agrees_with_its_allocator(path):
    t = Trace.load(path)                    # validates: ids, frees, sizes
    assert t.finished and t.n_allocs > 0 and t.meta["device"]["total_memory"] > 0
    stats = json.load(open(path + ".stats.json"))
    # a rank's trace of a run recorded before its process's end was noted says None (docs/several-processes.md)
    assert stats["exit_status"] in ((0, None) if "rank" in t.meta else (0,)) and \
        stats["trace_summary"]["events"] == len(t)
    if t.meta["framework"] == "torch":
        _check_torch(t, stats["memory_stats"])
        assert len(t.marks()) >= max(1, stats["optimizer_steps"])     # steps, or the program's own marks
    else:
        _check_cupy(t, stats["pool"])


def _segment_curve(t):
    k = t.kind
    sign = np.where(np.isin(k, [ev.SEGMENT_ALLOC, ev.SEGMENT_MAP]), 1,
                    np.where(np.isin(k, [ev.SEGMENT_FREE, ev.SEGMENT_UNMAP]), -1, 0))
    return np.cumsum(sign * t.size.astype(np.int64))


def _check_torch(t, ms):
    """The allocator's own counters, computed independently by PyTorch, against the events."""
    k = t.kind
    assert int((k == ev.ALLOC).sum()) == ms["allocation.all.allocated"]
    # PyTorch counts a block freed when the free is requested; a block used on another stream
    # (record_stream) completes its free when its events do, possibly after the end
    assert int((k == ev.FREE_REQUESTED).sum()) == ms["allocation.all.freed"] >= int((k == ev.FREE).sum())
    assert int((k == ev.SEGMENT_ALLOC).sum()) == ms["segment.all.allocated"]
    assert int((k == ev.SEGMENT_FREE).sum()) == ms["segment.all.freed"]
    assert int(_segment_curve(t).max()) == ms["reserved_bytes.all.peak"]
    assert int(_segment_curve(t)[-1]) == ms["reserved_bytes.all.current"]
    assert t.load_bytes == ms["requested_bytes.all.peak"]


def _check_cupy(t, pool):
    """CuPy's pool counters at the end against the upstream and client events."""
    assert int(_segment_curve(t)[-1]) == pool["total_bytes"]
    alive = np.ones(t.n_ids, bool)
    alive[t.id[t.kind == ev.FREE].astype(np.int64)] = False
    a = (t.kind == ev.ALLOC) & ((t.flags & ev.FAILED) == 0)
    rounded = np.zeros(t.n_ids, np.int64)
    rounded[t.id[a].astype(np.int64)] = t.aux[a].astype(np.int64) * 512
    assert int(rounded[alive].sum()) == pool["used_bytes"]
    assert (rounded[t.id[a].astype(np.int64)] >= t.size[a]).all()


# ---- end to end on a GPU ------------------------------------------------------------------------
def _gpu_ok(fw):
    if importlib.util.find_spec(fw) is None:
        return False
    try:
        if fw == "torch":
            import torch
            return torch.cuda.is_available()
        import cupy
        return cupy.cuda.is_available()
    except Exception:
        return False


def _record(tmp_path, script, *extra, env=None):
    out = str(tmp_path / "t.bin")
    e = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    r = subprocess.run([sys.executable, "-m", "allocsim", "record", "-o", out, *extra, script],
                       capture_output=True, text=True, env=e, timeout=300)
    return r, out


def _recorded(tmp_path, name, body):
    """Record the script ``body`` (must exit 0); return its trace, its stats and the trace's path."""
    r, out = _record(tmp_path, _script(tmp_path, name, body))
    assert r.returncode == 0, r.stderr
    return Trace.load(out), json.load(open(out + ".stats.json")), out


TORCH_SCRIPT = """
    import torch
    m = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
    opt = torch.optim.Adam(m.parameters())
    for i in range(4):
        x = torch.randn(64 + 32 * i, 512, device="cuda")
        big = torch.empty(int(30e6) * (i + 1), dtype=torch.uint8, device="cuda")   # large pool, new segments
        loss = m(x).square().mean()
        loss.backward(); opt.step(); opt.zero_grad()
        del big
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok("torch"), reason="needs torch with a CUDA GPU")
@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_torch_record_end_to_end(tmp_path, conf):
    s = _script(tmp_path, "tiny_torch.py", TORCH_SCRIPT)
    r, out = _record(tmp_path, s, env={"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else None)
    assert r.returncode == 0, r.stderr
    t = Trace.load(out)
    stats = json.load(open(out + ".stats.json"))
    _check_torch(t, stats["memory_stats"])
    assert [lab for _, lab in t.marks()] == [f"step {i}" for i in range(1, 5)]
    # on a machine of several GPUs one history entry lands on another device (seen on two H200s, cause not known)
    assert stats["chunks"] == 5 and not [n for n in stats["notes"] if "on devices other than" not in n]
    assert t.meta["allocator_settings"].get("expandable_segments", False) == bool(conf)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok("torch"), reason="needs torch with a CUDA GPU")
def test_torch_record_keeps_trace_when_script_fails(tmp_path):
    s = _script(tmp_path, "fails.py", "import torch\nx = torch.ones(1000, device='cuda')\nraise ValueError('boom')\n")
    r, out = _record(tmp_path, s)
    assert r.returncode == 1 and "ValueError: boom" in r.stderr
    assert Trace.load(out).n_allocs >= 1


CUPY_SCRIPT = """
    import gc, cupy as cp, allocsim
    keep = []
    for i in range(5):
        a = cp.ones((1000 + 500 * i, 257), cp.float32)
        b = (a @ a.T).sum(axis=0)
        keep.append(b)
        allocsim.mark(f"iter {i}")
    del a
    cp.get_default_memory_pool().free_all_blocks()      # the program's own pool: the one it allocates from
    gc.collect()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok("cupy"), reason="needs cupy with a CUDA GPU")
def test_cupy_record_end_to_end(tmp_path):
    t, stats, _ = _recorded(tmp_path, "tiny_cupy.py", CUPY_SCRIPT)
    _check_cupy(t, stats["pool"])
    assert len(t.marks()) == 5 and (t.kind == ev.GC).sum() >= 1
    assert (t.kind == ev.SEGMENT_FREE).sum() >= 1          # free_all_blocks, invisible to hooks
    assert (t.kind == ev.CACHE_RELEASE).sum() == 1 and not stats["notes"]
