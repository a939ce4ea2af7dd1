"""Outputs: never over an input, never over a trace without --force; temporaries gone after a signal,
stale ones named on the next run; a closed pipe ends quietly; --version and --help."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.errors import InputError
from allocsim.trace import Trace
from allocsim.outputs import TEMP_NAME, claim_outputs, same_file, stale_temporaries, temp_path
from conftest import ROOT, random_trace, run_cli

TESTS = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS, os.environ.get("PYTHONPATH", "")]))


def _temporaries(d) -> list[str]:
    return [n for n in os.listdir(d) if TEMP_NAME.match(n)]


def _writing(d) -> list[str]:
    """Temporaries with bytes in them: a file being written (a trace's header is written as it opens). Not the
    empty probe that `claim_outputs` makes and removes at once: a signal sent on seeing that one can land just
    after it, before the write, where a signal keeps its default action and the process dies of it (-15)."""
    def size(n):
        try:
            return os.path.getsize(os.path.join(d, n))
        except OSError:
            return 0
    return [n for n in _temporaries(d) if size(n)]


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# ---- claim_outputs ------------------------------------------------------------------------------
@pytest.fixture
def trace(tmp_path):
    p = str(tmp_path / "a.bin")
    random_trace(50, seed=2).save(p)
    return p


def test_an_input_is_never_an_output_even_with_force(trace):
    for force in (False, True):
        with pytest.raises(InputError, match="would overwrite the input"):
            claim_outputs([("-o", trace)], [trace], force=force)


def test_a_trace_is_replaced_only_with_force(trace, tmp_path):
    with pytest.raises(InputError, match="--force"):
        claim_outputs([("-o", trace)])
    claim_outputs([("-o", trace)], force=True)
    other = tmp_path / "rows.csv"
    other.write_text("policy\n")
    claim_outputs([("-o", str(other))])               # not a trace: a results table may be rewritten


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["./", "sub/../", "link/", "hard"]), max_size=4))
def test_every_spelling_of_one_file_is_the_same_file(tmp_path_factory, hops):
    """``./a``, ``sub/../a``, a symlinked folder and a hard link all name the input."""
    d = tmp_path_factory.mktemp("spell")
    os.mkdir(d / "sub")
    os.symlink(d, d / "link")
    (d / "a.bin").write_bytes(b"ALLOCSIM")
    name, prefix = "a.bin", ""
    for h in hops:
        if h == "hard":
            os.link(d / name, d / f"h{len(os.listdir(d))}.bin")
            name = sorted(n for n in os.listdir(d) if n.startswith("h"))[-1]
        else:
            prefix += h
    path = str(d / (prefix + name))
    assert same_file(path, str(d / "a.bin"))
    with pytest.raises(InputError, match="input"):
        claim_outputs([("-o", path)], [str(d / "a.bin")], force=True)
    assert not same_file(str(d / "other.bin"), str(d / "a.bin"))


def test_sweep_over_its_existing_table_still_resumes(tmp_path, small_trace_path):
    out = str(tmp_path / "rows.csv")
    first = run_cli("sweep", small_trace_path, "-p", "none", "-o", out, "-j", "1")
    assert first.returncode == 0, first.stderr
    again = run_cli("sweep", small_trace_path, "-p", "none,bestfit", "-o", out, "-j", "1")
    assert again.returncode == 0, again.stderr
    assert len(open(out).read().splitlines()) == 3


# ---- signals: a killed write leaves no temporaries -----------------------------------------------
def _kill_when(proc, ready, signum, timeout=60):
    """Send ``signum`` to ``proc`` once ``ready()`` holds; return (status, stderr, seconds it took to end)."""
    t0 = time.time()
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < timeout, "never got ready"
        time.sleep(0.02)
    proc.send_signal(signum)
    t1 = time.time()
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err, time.time() - t1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_killed_atomic_write_leaves_no_temporaries(tmp_path, signum):
    out = tmp_path / "x.bin"
    p = subprocess.Popen([sys.executable, "-m", "allocsim", "synth", "alloc-heavy", "-o", str(out),
                          "--param", "n_allocs=1500000"], cwd=tmp_path, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    status, err, _ = _kill_when(p, lambda: _writing(tmp_path), signum)
    assert status == (130 if signum == signal.SIGINT else 128 + signum), err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert os.listdir(tmp_path) == []                  # no temporary, no half-written x.bin


def test_a_signal_during_the_claims_probe_leaves_no_temporary(tmp_path, monkeypatch):
    """`claim_outputs` makes and removes the output's temporary to learn it can be made: a Ctrl-C landing while
    it exists (here raised by the close) must not leave it behind, as it did under load."""
    from allocsim import outputs
    real_close = os.close

    def interrupted_close(fd):
        real_close(fd)
        raise KeyboardInterrupt
    monkeypatch.setattr(outputs.os, "close", interrupted_close)
    with pytest.raises(KeyboardInterrupt):
        outputs.check_can_create(str(tmp_path / "x.bin"))
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []


FAKE_DRIVER = """
    import sys
    from allocsim.formats import recorders
    from allocsim.cli import main
    from test_record import FakeRecorder
    recorders.recorder_class = lambda fw: FakeRecorder
    recorders.check_available = lambda fw: None
    sys.exit(main(["record", "-o", sys.argv[1], "--framework", "torch", sys.argv[2]]))
"""

FAKE_TRAINING = """
    import time
    from test_record import FakeRecorder
    w = FakeRecorder.live.writer
    for k in range(10 ** 9):
        w.free(w.alloc(4096 + k))
        if k == 5000:
            open("started", "w").close()
        time.sleep(0.0001)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGINT])
def test_killed_recording_finishes_its_trace_and_leaves_no_temporaries(tmp_path, signum):
    """The recorder's own writer path, driven as `allocsim record` drives it (a stand-in recorder, no GPU)."""
    from allocsim.trace import Trace
    driver, script = tmp_path / "driver.py", tmp_path / "train.py"
    driver.write_text(textwrap.dedent(FAKE_DRIVER))
    script.write_text(textwrap.dedent(FAKE_TRAINING))
    out = tmp_path / "t.bin"
    p = subprocess.Popen([sys.executable, str(driver), str(out), str(script)], cwd=tmp_path, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status, err, _ = _kill_when(p, (tmp_path / "started").exists, signum)
    assert status == (130 if signum == signal.SIGINT else 128 + signum), err
    assert "Traceback" not in err, err
    assert _temporaries(tmp_path) == []
    t = Trace.load(str(out))
    assert t.finished and t.n_allocs > 5000
    assert os.path.exists(f"{out}.stats.json")


def _torch_gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _torch_gpu(), reason="needs torch with a CUDA GPU")
def test_killed_real_recording_leaves_a_whole_trace_and_no_temporaries(tmp_path):
    from allocsim.trace import Trace
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        for k in range(10 ** 9):
            x = torch.empty(1 << 20, device="cuda"); del x
            if k == 200:
                torch.cuda.synchronize(); open("started", "w").close()
    """))
    out = tmp_path / "t.bin"
    p = subprocess.Popen([sys.executable, "-m", "allocsim", "record", "-o", str(out), str(script)], cwd=tmp_path,
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    status, err, _ = _kill_when(p, (tmp_path / "started").exists, signal.SIGTERM, timeout=240)
    assert status == 143, err
    assert _temporaries(tmp_path) == []
    assert Trace.load(str(out)).n_allocs > 200


def _children(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return f.read().split()
    except OSError:
        return []


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"), reason="needs Linux /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_a_parallel_compare_and_its_workers_at_once(tmp_path, signum):
    """Before: Ctrl-C waited for every queued replay; SIGTERM left the workers running, holding the pipe."""
    big = str(tmp_path / "big.bin")
    assert run_cli("synth", "alloc-heavy", "-o", big, "--param", "n_allocs=300000").returncode == 0
    p = subprocess.Popen([sys.executable, "-m", "allocsim", "compare", big, "-p", "binned,split,torch,cupy,bestfit",
                          "--caps", "none,55MB,60MB,65MB,70MB,75MB,80MB,90MB", "-j", "2"], env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.time()
    status, err, took = _kill_when(p, lambda: len(_children(p.pid)) >= 2 and time.time() - t0 > 1.5, signum)
    assert took < 4, took                             # not after the 40 queued replays (~10 s)
    assert status == (130 if signum == signal.SIGINT else 128 + signum), err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    time.sleep(0.5)
    with pytest.raises(ProcessLookupError):           # no worker left in the process group
        os.killpg(p.pid, 0)


def _alive(pid: str) -> bool:
    """True while ``pid`` runs (a zombie, dead and not yet reaped, is not alive)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"), reason="needs Linux /proc")
def test_workers_end_when_their_parent_is_killed(tmp_path):
    """Before: `kill -9` of `allocsim tune -j 2` left its workers computing on, orphaned, for minutes."""
    big = str(tmp_path / "big.bin")
    assert run_cli("synth", "alloc-heavy", "-o", big, "--param", "n_allocs=300000").returncode == 0
    p = subprocess.Popen([sys.executable, "-m", "allocsim", "tune", big, "-j", "2"], env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    workers = []
    try:
        t0 = time.time()
        while len(workers) < 2 and time.time() - t0 < 60:
            workers = _children(p.pid)
            time.sleep(0.05)
        assert len(workers) == 2, workers
        time.sleep(0.5)                             # computing
        p.kill()
        p.wait()
        t1 = time.time()
        while any(map(_alive, workers)) and time.time() - t1 < 5:
            time.sleep(0.05)
        assert not any(map(_alive, workers)), f"orphaned workers {workers} still running"
    finally:
        for w in workers:                           # none left behind, even when the test fails
            with contextlib.suppress(OSError):
                os.kill(int(w), signal.SIGKILL)


@pytest.mark.skipif(importlib.util.find_spec("distributed") is None, reason="needs dask.distributed")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_dask_sweep_with_its_two_lines(tmp_path, signum):
    """Before: SIGTERM ended `sweep --dask-local 2` with only a resource_tracker warning (exit 143, no word of
    the rows kept); Ctrl-C printed 71 lines of worker tracebacks and warnings before the two proper ones."""
    big = str(tmp_path / "big.bin")
    assert run_cli("synth", "alloc-heavy", "-o", big, "--param", "n_allocs=100000").returncode == 0
    out = tmp_path / "sw.csv"
    p = subprocess.Popen([sys.executable, "-m", "allocsim", "sweep", big, "-p", "split,torch,cupy,bestfit,binned",
                          "--caps", "none,20MB,30MB", "--dask-local", "2", "-q", "-o", str(out)], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    partial = tmp_path / "sw.csv.partial"
    try:
        t0 = time.time()
        from allocsim.commands.sweep import PARTIAL_MARK
        while not (partial.exists() and partial.stat().st_size > len(PARTIAL_MARK)) and p.poll() is None \
                and time.time() - t0 < 90:              # a row after the sweep's mark
            time.sleep(0.05)
        os.killpg(p.pid, signum)                    # as a terminal's Ctrl-C, or a shutdown, reaches the group
        _, err = p.communicate(timeout=60)
        assert p.returncode == (130 if signum == signal.SIGINT else 128 + signum), err
        lines = err.splitlines()
        assert len(lines) == 2 and "cells kept in" in lines[0], err
        assert lines[1] == ("allocsim: interrupted" if signum == signal.SIGINT else "allocsim: stopped by SIGTERM")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_a_stopped_pool_prints_no_invalid_state_error():
    """Before: Ctrl-C during `tune -j 2` printed `InvalidStateError: CANCELLED` from the pool's thread in 4 of
    18 runs: the pool failed a future `Executor.map` had cancelled. A cancelled future now stays cancelled."""
    from allocsim.search.sweep import process_pool
    with pytest.raises(KeyboardInterrupt):
        with process_pool(1) as ex:
            for _ in range(4):      # the pool hands a worker's call queue one more than it runs: these fill it
                ex.submit(time.sleep, 1)
            queued = ex.submit(time.sleep, 1)
            assert queued.cancel()
            queued.set_exception(RuntimeError("worker gone"))     # what the pool's thread does on a stop
            assert queued.cancelled()
            raise KeyboardInterrupt


# ---- outputs not lost to another run, nor to a long name --------------------------------------------
def test_a_trace_another_run_wrote_meanwhile_is_kept(tmp_path):
    """Before: of two `synth -o same.bin` at once, the later finisher replaced the other's fresh trace."""
    from allocsim.outputs import atomic_path
    out = str(tmp_path / "same.bin")
    claim_outputs([("-o", out)])
    with pytest.raises(InputError, match="appeared there while this run worked"):
        with atomic_path(out) as tmp:
            random_trace(20, seed=1).save(tmp)
            random_trace(30, seed=2).save(out)          # the other run finishes first
    assert Trace.load(out).n_allocs == random_trace(30, seed=2).n_allocs and _temporaries(tmp_path) == []


def test_an_atomic_write_inside_another_uses_one_temporary(tmp_path):
    """Before: a killed `synth` left `..big.bin.allocsim-PID.tmp.allocsim-PID.tmp`, the temporary's name doubled."""
    from allocsim.outputs import atomic_path
    with atomic_path(str(tmp_path / "big.bin")) as tmp:
        with atomic_path(tmp) as inner:
            assert inner == tmp
            open(inner, "w").close()
    assert os.listdir(tmp_path) == ["big.bin"]


def test_a_long_output_name_is_written(tmp_path):
    """Before: a 250-character output name failed, naming the internal temporary (too long with its additions)."""
    out = tmp_path / ("x" * 246 + ".bin")
    r = run_cli("synth", "mlp", "-o", str(out))
    assert r.returncode == 0 and out.exists() and _temporaries(tmp_path) == [], r.stderr


def test_closed_stderr_still_exits_2_on_bad_input(tmp_path):
    """Before: with stderr closed, a bad input exited 1 (the error line itself failed), not 2."""
    r = subprocess.run(f"{shlex.quote(sys.executable)} -m allocsim replay {tmp_path}/nosuch.bin 2>&-", shell=True,
                       env=ENV, capture_output=True, timeout=60)
    assert r.returncode == 2 and r.stdout == b""


def test_full_stdout_is_named(trace):
    """Before: `> /dev/full` said "No space left on device" without naming what was full."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    r = subprocess.run(f"{shlex.quote(sys.executable)} -m allocsim replay {shlex.quote(trace)} > /dev/full", shell=True,
                       env=ENV, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr == "allocsim: standard output: No space left on device\n", r.stderr


# ---- stale temporaries: named on the next run -----------------------------------------------------
def test_next_run_names_stale_temporaries_and_how_to_remove_them(tmp_path):
    stale = tmp_path / f".old.bin.allocsim-{_dead_pid()}.tmp"
    random_trace(30).save(str(stale))                               # e.g. a recording killed with SIGKILL
    live = tmp_path / f".busy.bin.allocsim-{os.getpid()}.tmp"      # its writer still runs: not stale
    live.write_bytes(b"y")
    assert stale_temporaries(str(tmp_path)) == [str(stale)]
    r = run_cli("synth", "mlp", "-o", str(tmp_path / "new.bin"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "killed run" in lines[0] and "Traceback" not in r.stderr
    assert lines[0].endswith(f"rm -- {stale}") and str(live) not in lines[0]
    assert f"unfinished trace, readable: allocsim info {stale}" in lines[0]
    subprocess.run(lines[0].split("remove with: ", 1)[1], shell=True, check=True)
    assert not stale.exists() and live.exists()


def test_temporaries_are_hidden_and_carry_the_pid(tmp_path):
    t = temp_path(str(tmp_path / "x.bin"))
    assert os.path.dirname(t) == str(tmp_path) and os.path.basename(t).startswith(".x.bin")
    assert int(TEMP_NAME.match(os.path.basename(t)).group(1)) == os.getpid()


@pytest.mark.parametrize("argv", [["info", "{fifo}"], ["import", "{fifo}", "-o", "{d}/x.bin"],
                                  ["replay", "{fifo}"], ["synth", "mlp", "-o", "{fifo}"]])
def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path, argv):
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "allocsim", *[a.format(fifo=fifo, d=tmp_path) for a in argv]],
                       env=ENV, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "not a file" in r.stderr, r.stderr
    assert os.listdir(tmp_path) == ["fifo"] and not os.path.isfile(fifo)


# ---- pipes, --version, --help, the OOM line ------------------------------------------------------
@pytest.mark.parametrize("argv", [["info", "{trace}"], ["compare", "{trace}", "-p", "none,bestfit", "-j", "1"],
                                  ["--version"], ["--help"]])
def test_closed_pipe_ends_quietly_with_141(trace, argv):
    p = subprocess.Popen([sys.executable, "-m", "allocsim", *[a.format(trace=trace) for a in argv]], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()                                    # the reader goes away before a line is written
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and err == "", err


def test_closed_stdout_is_no_traceback(trace):
    """A report with nowhere to go is one line and exit 2 (issue 29: it was exit 0, nothing written)."""
    r = subprocess.run(f"{shlex.quote(sys.executable)} -m allocsim info {shlex.quote(trace)} >&-", shell=True,
                       env=ENV, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "standard output is closed" in r.stderr, r.stderr


def test_version():
    r = run_cli("--version")
    from allocsim import __version__
    from allocsim.compiled import build
    assert r.returncode == 0 and r.stdout.strip() == f"allocsim {__version__} ({build()})"


def test_help_ends_with_the_main_path():
    last = run_cli("--help").stdout.strip().splitlines()[-3:]
    assert [ln.split()[1] for ln in last] == ["record", "replay", "compare"]


def test_every_command_that_writes_has_force():
    from allocsim.cli import make_parser
    sub = next(a for a in make_parser()._actions if a.dest == "command")
    writers = [n for n, p in sub.choices.items() if any(a.dest in ("output", "csv", "report") for a in p._actions)]
    assert sorted(writers) == ["calibrate", "compare", "import", "plot", "record", "sweep", "synth"]
    for n in writers:
        assert any(a.dest == "force" for a in sub.choices[n]._actions), n


def test_replay_oom_goes_to_stderr_too(small_trace_path):
    r = run_cli("replay", small_trace_path, "--policy", "bestfit", "--capacity", "1MB", "--no-sections")
    assert r.returncode == 1
    err = r.stderr.splitlines()
    assert len(err) == 1 and "out of memory at event" in err[0]
    report_line = next(ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("event "))
    assert report_line in err[0]


def test_a_forked_child_dies_of_the_signal_and_never_unwinds_its_parents_stack():
    """A pool's worker is forked while the parent's signals unwind; a SIGTERM before its initializer resets
    them must end the child (exit 128 + 15), not raise `Terminated` into the copy of the parent's stack (which
    ran the rest of a pytest session twice, and could run the rest of a command)."""
    from allocsim.outputs import signals_unwind
    with signals_unwind():
        pid = os.fork()
        if pid == 0:                        # the child: its own SIGTERM, as a pool's terminate() sends it
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
                os._exit(0)
            except BaseException:
                os._exit(7)                 # it unwound: the bug
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGTERM


def test_the_command_line_in_process_leaves_the_callers_stdout_open(tmp_path, monkeypatch):
    """`cli.main` called in a process whose stdout someone else put there (pytest's fd capture, a notebook): the
    guard of `outputs.guard_stdout` wraps only the process's own stdout; a wrapper of the caller's stream closed it
    when collected ("I/O operation on closed file" at the caller's next write; seen on a GPU test of test_ranks)."""
    import gc
    import io
    from allocsim.cli import main
    raw = open(tmp_path / "out.txt", "wb", buffering=0)
    theirs = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stdout", theirs)
    for _ in range(2):
        assert main(["policies", "split"]) == 0
        sys.stdout = theirs         # as a caller's capture puts its stream back (monkeypatch would keep the other)
        gc.collect()
    theirs.write("still open\n")
    assert not raw.closed and (tmp_path / "out.txt").read_text().endswith("still open\n")
