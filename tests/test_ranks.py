"""Programs of several processes (docs/several-processes.md): `allocsim record -- LAUNCHER ...` writes one trace per
rank with the launcher's environment intact, and info / replay / compare / validate / tune take a run's traces
together. On the CPU, a stand-in torch (tests/fixtures/fake_torch) and a fake launcher of two Python children; on a
GPU (marked gpu), two DDP processes with the gloo backend sharing one device, under torchrun and under
torch.multiprocessing.spawn."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from allocsim.cli import main
from allocsim.machine.ranks import fit_capacity, process_name, run_files, run_traces
from allocsim.trace import Trace, TraceWriter
from allocsim.trace import events as ev

from conftest import ROOT

FAKE_TORCH = os.path.join(ROOT, "tests", "fixtures", "fake_torch")
MiB = 1 << 20

LAUNCHER = """
    import os, subprocess, sys
    here = os.path.dirname(os.path.abspath(__file__))
    procs = [subprocess.Popen([sys.executable, os.path.join(here, "worker.py"), str(r)],
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2")) for r in range(2)]
    sys.exit(max(p.wait() for p in procs))
"""

# Each rank allocates on its own device what PyTorch's allocator would give a segment of its own, and says what
# it saw of its environment.
WORKER = """
    import json, os, sys
    import torch
    r = int(sys.argv[1])
    json.dump({"path": sys.path, "PYTHONPATH": os.environ.get("PYTHONPATH"), "user": os.environ.get("USER_VAR"),
               "sitecustomize": os.environ.get("USER_SITECUSTOMIZE_RAN")}, open(f"env{r}.json", "w"))
    torch.cuda.set_device(r)
    a = torch.cuda.fake_alloc((20 << 20) * (r + 1))
    torch.optim.fake_step()
    b = torch.cuda.fake_alloc(24 << 20)
    torch.cuda.fake_free(a, (20 << 20) * (r + 1))
    torch.optim.fake_step()
"""


def _write(folder, name, body):
    p = folder / name
    p.write_text(textwrap.dedent(body))
    return str(p)


def _record(tmp_path, *program, extra_path=(), env=None):
    """``allocsim record -o run.bin -- PROGRAM`` in ``tmp_path`` with the stand-in torch first on PYTHONPATH."""
    path = os.pathsep.join([FAKE_TORCH, ROOT, *extra_path])
    return subprocess.run([sys.executable, "-m", "allocsim", "record", "-o", "run.bin", "--", *program],
                          cwd=tmp_path, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path, **(env or {})))


@pytest.fixture
def launcher(tmp_path):
    _write(tmp_path, "launch.py", LAUNCHER)
    _write(tmp_path, "worker.py", WORKER)
    return tmp_path


def test_launcher_records_each_rank_with_its_environment(launcher):
    user = launcher / "userlib"
    user.mkdir()
    _write(user, "sitecustomize.py", "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    r = _record(launcher, sys.executable, "launch.py", extra_path=[str(user)], env={"USER_VAR": "kept"})
    assert r.returncode == 0, r.stderr
    assert "2 process traces of the run run.bin: run.rank0.bin, run.rank1.bin" in r.stderr
    assert run_files(str(launcher / "run.bin")) == [str(launcher / f"run.rank{k}.bin") for k in range(2)]
    for rank in range(2):
        t = Trace.load(str(launcher / f"run.rank{rank}.bin"))
        m = t.meta
        assert (m["rank"], m["local_rank"], m["world_size"], m["device"]["index"]) == (rank, rank, 2, rank)
        assert m["run"] == {"output": "run.bin", "command": [sys.executable, "launch.py"]}
        assert t.n_allocs == 2 and [lab for _, lab in t.marks()] == ["step 1", "step 2"]
        mem = m["device_memory"]            # the stand-in's context: 300 MiB beside the allocator
        assert mem["outside_peak"] == 300 * MiB and mem["end"]["reserved"] == (20 * (rank + 1) + 24) * MiB
        stats = json.load(open(launcher / f"run.rank{rank}.bin.stats.json"))
        assert stats["trace"] == f"run.rank{rank}.bin" and stats["device_memory"] == mem
        assert stats["exit_status"] == 0 and stats["notes"] == []
        seen = json.load(open(launcher / f"env{rank}.json"))
        assert seen["user"] == "kept" and seen["sitecustomize"] == "1"       # the user's own sitecustomize ran
        assert str(user) in seen["path"] and not any("bootstrap" in p for p in seen["path"])
        assert seen["PYTHONPATH"].split(os.pathsep)[1:] == [FAKE_TORCH, ROOT, str(user)]
    assert not [f for f in os.listdir(launcher) if f.endswith(".tmp")]


def test_rank_learnt_from_torch_distributed(tmp_path):
    """A worker started without RANK (torch.multiprocessing.spawn) is named by the rank it joins its group with."""
    _write(tmp_path, "spawned.py", """
        import torch, torch.distributed as dist
        torch.cuda.fake_alloc(20 << 20)
        dist.init_process_group(rank=1, world_size=3)
        torch.optim.fake_step()
    """)
    r = _record(tmp_path, sys.executable, "spawned.py")
    assert r.returncode == 0, r.stderr
    m = Trace.load(str(tmp_path / "run.rank1.bin")).meta
    assert (m["rank"], m["world_size"]) == (1, 3) and "local_rank" not in m
    assert os.listdir(tmp_path).count("run.rank1.bin") == 1


@pytest.mark.parametrize("env,name,meta", [
    ({"RANK": "-1", "WORLD_SIZE": "2"}, None, {"world_size": 2}),
    ({"RANK": "1_0", "LOCAL_RANK": "+1", "WORLD_SIZE": "0"}, None, {}),
    ({"RANK": "3", "WORLD_SIZE": "2"}, "run.rank3.bin", {"rank": 3}),
    ({"RANK": " 1 ", "WORLD_SIZE": "2"}, "run.rank1.bin", {"rank": 1, "world_size": 2}),
    ({"RANK": "9" * 5000, "WORLD_SIZE": "2"}, None, {"world_size": 2})])       # int() refuses 4,300 digits
def test_a_rank_environment_the_reader_would_refuse_is_left_out(tmp_path, env, name, meta):
    """RANK, LOCAL_RANK and WORLD_SIZE are counts in ASCII digits, WORLD_SIZE at least 1 and above RANK: anything
    else is left out of the trace's metadata (a trace that says rank -1 or world_size 0 could not be read back)."""
    _write(tmp_path, "w.py", "import torch\ntorch.cuda.fake_alloc(20 << 20)\ntorch.optim.fake_step()\n")
    r = _record(tmp_path, sys.executable, "w.py", env=env)
    assert r.returncode == 0, r.stderr
    [trace] = run_files(str(tmp_path / "run.bin"))
    assert name is None or os.path.basename(trace) == name, trace
    m = Trace.load(trace).meta
    assert {k: m[k] for k in ("rank", "local_rank", "world_size") if k in m} == meta, m


def test_a_process_that_never_starts_cuda_records_nothing(tmp_path):
    _write(tmp_path, "cpu_only.py", "import sys, torch\nsys.exit(3)\n")
    r = _record(tmp_path, sys.executable, "cpu_only.py")
    assert r.returncode == 3                     # the program's own status
    assert "nothing recorded" in r.stderr and "Traceback" not in r.stderr
    assert not run_files(str(tmp_path / "run.bin"))


def test_sigterm_still_finishes_the_trace(tmp_path):
    """torchrun stops the other workers with SIGTERM when one fails: their traces are finished all the same."""
    _write(tmp_path, "stopped.py", """
        import os, signal, time, torch
        torch.cuda.fake_alloc(20 << 20)
        torch.optim.fake_step()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    """)
    r = _record(tmp_path, sys.executable, "stopped.py")
    assert r.returncode == 128 + 15
    (path,) = run_files(str(tmp_path / "run.bin"))
    assert path.endswith(f".pid{Trace.load(path).meta['pid']}.bin")
    t = Trace.load(path)
    assert t.finished and t.n_allocs == 1
    stats = json.load(open(path + ".stats.json"))
    assert stats["exit_status"] == 143 and stats["notes"] == ["the process ended by signal SIGTERM"]


def test_a_process_that_raises_still_finishes_and_says_so(tmp_path):
    _write(tmp_path, "raises.py", """
        import torch
        torch.cuda.fake_alloc(20 << 20)
        raise ValueError("boom")
    """)
    r = _record(tmp_path, sys.executable, "raises.py")
    assert r.returncode == 1 and "ValueError: boom" in r.stderr
    (path,) = run_files(str(tmp_path / "run.bin"))
    stats = json.load(open(path + ".stats.json"))
    assert Trace.load(path).n_allocs == 1 and stats["exit_status"] == 1
    assert stats["notes"] == ["the process ended by an uncaught ValueError"]


def test_a_child_forked_from_a_recorded_process_leaves_its_trace_alone(tmp_path):
    _write(tmp_path, "forks.py", """
        import os, torch
        torch.cuda.fake_alloc(20 << 20)
        pid = os.fork()
        if pid == 0:
            raise SystemExit(0)          # the child exits through atexit, with a copy of the recorder
        os.waitpid(pid, 0)
        torch.cuda.fake_alloc(30 << 20)
        torch.optim.fake_step()
    """)
    r = _record(tmp_path, sys.executable, "forks.py")
    assert r.returncode == 0, r.stderr
    (path,) = run_files(str(tmp_path / "run.bin"))
    t = Trace.load(path)
    assert t.finished and t.n_allocs == 2 and r.stderr.count("wrote ") == 1


def test_an_earlier_run_is_refused_then_replaced_with_force(launcher):
    assert _record(launcher, sys.executable, "launch.py").returncode == 0
    r = _record(launcher, sys.executable, "launch.py")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "run.rank0.bin, run.rank1.bin" in r.stderr
    assert "--force" in r.stderr and "Traceback" not in r.stderr
    (launcher / "run.rank7.bin").write_bytes((launcher / "run.rank0.bin").read_bytes())
    path = os.pathsep.join([FAKE_TORCH, ROOT])
    r = subprocess.run([sys.executable, "-m", "allocsim", "record", "--force", "-o", "run.bin", "--", sys.executable,
                        "launch.py"], cwd=launcher, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path))
    assert r.returncode == 0, r.stderr
    assert [os.path.basename(p) for p in run_files(str(launcher / "run.bin"))] == ["run.rank0.bin", "run.rank1.bin"]


def test_program_mode_is_chosen_for_programs_not_scripts(tmp_path, monkeypatch):
    from allocsim.cli import make_parser
    from allocsim.commands.record import program_argv
    monkeypatch.chdir(tmp_path)

    def argv(*line):
        return program_argv(make_parser().parse_args(["record", *line]))
    python = os.path.basename(sys.executable)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert argv("--", python, "train.py", "--iters", "2") == [python, "train.py", "--iters", "2"]
    assert argv("-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py")[1:] == \
        ["-m", "torch.distributed.run", "--nproc-per-node", "2", "t.py"]
    (tmp_path / "train.py").write_text("import torch\n")
    assert argv("train.py") is None and argv("-m", "pkg.train") is None       # run inside allocsim, as before
    from allocsim.formats.recorders.processes import default_output
    assert default_output(["torchrun", "--nproc-per-node", "2", "train.py"]) == "train.bin"
    assert default_output(["bash", "run.sh"]) == "bash.bin"


# ---- the commands on a run ---------------------------------------------------------------------------------------
def _rank_trace(path, rank, sizes, *, outside=0, total=1 << 30, world=2):
    """A rank's trace as the recorder writes it: segments of the sizes allocated, held to the end."""
    meta = {"framework": "torch", "producer": "test", "rank": rank, "local_rank": rank, "world_size": world,
            "pid": 1000 + rank, "device": {"name": "Fake", "index": rank, "total_memory": total},
            "allocator_settings": {"expandable_segments": False}}
    w = TraceWriter(meta, path=str(path))
    for k, size in enumerate(sizes):
        w.record(ev.SEGMENT_ALLOC, size=size, addr=(k + 1) << 32)      # as PyTorch's first request of a size
        w.alloc(size, addr=(k + 1) << 32)
        w.mark(f"step {k + 1}")
    w.finish({"device_memory": {"total": total, "outside_peak": outside}} if outside else None)
    return str(path)


@pytest.fixture
def run(tmp_path):
    """run.bin: rank 0 holds 100 MiB, rank 1 300 MiB; each saw 200 MiB outside its allocator on a 1 GiB device."""
    for rank, sizes in ((0, [60 * MiB, 40 * MiB]), (1, [200 * MiB, 100 * MiB])):
        _rank_trace(tmp_path / f"run.rank{rank}.bin", rank, sizes, outside=200 * MiB)
    return str(tmp_path / "run.bin")


def test_info_shows_every_rank_and_the_run(run, capsys):
    assert main(["info", run, "-q"]) == 0
    out = capsys.readouterr().out
    assert out.count("== rank ") == 2 and "process rank 1 of 2, local rank 1, device cuda:1" in out
    assert "outside the caching allocator 200.00 MiB at most" in out
    table = out[out.index("run of 2 processes"):].splitlines()
    assert "rank 0 of 2" in table[3] and "100.00 MiB" in table[3] and "300.00 MiB" in table[3]
    assert "rank 1 of 2" in table[4] and "500.00 MiB" in table[4]          # 300 MiB reserved + 200 MiB beside it
    assert main(["info", run, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["run"] == run and [r["result"]["process"]["rank"] for r in d["ranks"]] == [0, 1]
    assert d["ranks"][1]["result"]["device_memory"]["outside_peak"] == 200 * MiB


def test_several_files_and_run_names(run, tmp_path, capsys):
    files = run_files(run)
    assert run_traces(run) == files and run_traces(files[0]) == [files[0]]
    assert run_traces(str(tmp_path / "missing.bin")) == [str(tmp_path / "missing.bin")]
    assert main(["validate", *files, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [r["trace"] for r in d["ranks"]] == files and all(r["result"]["match"] for r in d["ranks"])


def test_replay_and_compare_per_rank_outputs(run, tmp_path, capsys):
    assert main(["replay", run, "-p", "torch", "--no-sections", "-q"]) == 0
    out = capsys.readouterr().out
    assert out.count("peak reserved") == 2 and "300.00 MiB" in out
    csv = str(tmp_path / "rows.csv")
    assert main(["compare", run, "-p", "torch,bestfit", "-j", "1", "-q", "--csv", csv]) == 0
    assert os.path.exists(str(tmp_path / "rows.rank0.csv")) and os.path.exists(str(tmp_path / "rows.rank1.csv"))
    assert not os.path.exists(csv)


def test_replay_of_a_run_fails_when_a_rank_runs_out(run, capsys):
    assert main(["replay", run, "-p", "torch", "--cap", "200MiB", "-q", "--no-sections"]) == 1
    err = capsys.readouterr().err
    assert "run.rank1.bin: out of memory" in err and "run.rank0.bin: out of memory" not in err


def test_tune_fits_the_worst_rank_beside_the_memory_outside(run, capsys):
    from allocsim.search.tune_ranks import tune_run
    res = tune_run(run_files(run), max_replays=4, fit=False)
    assert res.paths[res.worst].endswith("run.rank1.bin")            # 1 GiB - 200 MiB - 300 MiB: the least room
    assert res.capacities == [(1 << 30) - 200 * MiB] * 2 and res.outside == [200 * MiB] * 2
    assert res.chosen is not None and len(res.rank_rows) == 2 and not any(r["ooms"] for r in res.rank_rows)
    assert [r["peak_reserved_bytes"] for r in res.rank_rows] == [100 * MiB, 300 * MiB]
    assert main(["tune", run, "--max-replays", "4", "--no-fit", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "the least room is rank 1 of 2's" in out and "recommended for the run" in out
    assert out.count(" yes") >= 2 and "824.00 MiB" in out


def test_tune_on_a_run_too_big_for_its_gpu_says_so(tmp_path, capsys):
    for rank in range(2):
        _rank_trace(tmp_path / f"big.rank{rank}.bin", rank, [600 * MiB], outside=500 * MiB)
    assert main(["tune", str(tmp_path / "big.bin"), "--max-replays", "3", "--no-fit", "-j", "1", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rank 0 of 2 (" in err[0] and "big.rank0.bin" in err[0]
    assert ("the recorded device's memory (1.00 GiB) less the 500.00 MiB the recording saw outside the caching "
            "allocator (CUDA context, NCCL, other processes) leaves 524.00 MiB, below its LOAD 600.00 MiB") in err[0]


def test_single_trace_outputs_are_unchanged(tmp_path, capsys):
    """A trace of one process, recorded before runs existed, reads as before: no process or outside lines."""
    path = _rank_trace(tmp_path / "one.bin", 0, [30 * MiB])
    t = Trace.load(path)
    assert fit_capacity("trace", t) == ("trace", 0)
    main(["info", "traces/gpt2.bin" if os.path.exists("traces/gpt2.bin") else os.path.join(ROOT, "traces", "gpt2.bin"),
          "-q"])
    out = capsys.readouterr().out
    assert "process" not in out and "outside" not in out and "==" not in out


def test_late_metadata_and_its_checks(tmp_path):
    w = TraceWriter({"framework": "torch"}, path=str(tmp_path / "t.bin"))
    w.alloc(10)
    w.finish({"rank": 3, "device_memory": {"total": 100, "outside_peak": 7}})
    assert Trace.load(str(tmp_path / "t.bin")).meta["rank"] == 3
    from allocsim.errors import InputError
    for late, where in (({"rank": -1}, "metadata: rank"), ({"device_memory": {"outside_peak": "1GB"}},
                                                            "metadata: device_memory.outside_peak"),
                        ({"device_memory": {"end": {"free": -5}}}, "metadata: device_memory.end.free")):
        w = TraceWriter({"framework": "torch"}, path=str(tmp_path / "bad.bin"))
        w.alloc(10)
        w.finish(late)
        with pytest.raises(InputError, match=where):
            Trace.load(str(tmp_path / "bad.bin"))


@settings(max_examples=40, deadline=None)
@given(ranks=st.sets(st.integers(0, 200), max_size=6), pids=st.sets(st.integers(1, 10**6), max_size=3),
       stem=st.sampled_from(["run", "a.b", "r[1]", "x-y.rank0"]))
def test_run_files_finds_exactly_the_runs_processes_in_order(tmp_path_factory, ranks, pids, stem):
    d = tmp_path_factory.mktemp("run")
    out = str(d / f"{stem}.bin")
    made = [process_name(out, f"rank{r}") for r in sorted(ranks)] + [process_name(out, f"pid{p}") for p in sorted(pids)]
    others = [str(d / f"{stem}x.rank0.bin"), str(d / f"{stem}.rank0.bin.stats.json"), str(d / f"{stem}.rankA.bin"),
              str(d / f"other.{stem}.rank1.bin")]
    for p in made + others:
        open(p, "w").close()
    assert run_files(out) == made


# ---- on a GPU: two DDP processes with gloo sharing one device ------------------------------------------------------
def _gpu_ok() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:       # noqa: BLE001 - any failure to import means no GPU here
        return False


SPAWN = """
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

    def work(rank, world):
        os.environ.update(MASTER_ADDR="localhost", MASTER_PORT="29512")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(512, 512).cuda(), device_ids=[0])
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(3):
            m(torch.randn(64 * (rank + 1), 512, device="cuda")).square().mean().backward()
            opt.step(); opt.zero_grad()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(work, args=(2,), nprocs=2)
"""


def _record_gpu(tmp_path, *program):
    """Record ``program`` with its processes on one GPU (the first visible), as on a one-GPU machine: on a machine
    of several, torchrun's rank 1 would take the second (examples/dist_train.py picks LOCAL_RANK's device)."""
    first = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CUDA_VISIBLE_DEVICES=first)
    return subprocess.run([sys.executable, "-m", "allocsim", "record", "-o", "run.bin", "--", *program], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=240)


def _check_gpu_run(tmp_path, world):
    files = run_files(str(tmp_path / "run.bin"))
    assert [os.path.basename(f) for f in files] == [f"run.rank{r}.bin" for r in range(world)]
    for rank, path in enumerate(files):
        t = Trace.load(path)
        assert (t.meta["rank"], t.meta["world_size"], t.meta["device"]["index"]) == (rank, world, 0)
        assert t.meta["device_memory"]["outside_peak"] > 0 and t.n_allocs > 0
        assert main(["validate", path]) == 0, path


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs torch with a CUDA GPU")
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun on PATH")
def test_gpu_torchrun_gloo_ranks_share_one_device(tmp_path):
    r = _record_gpu(tmp_path, "torchrun", "--standalone", "--nproc-per-node", "2",
                    os.path.join(ROOT, "examples", "dist_train.py"), "--backend", "gloo", "--iters", "3",
                    "--layers", "2", "--dim", "256", "--seq", "128")
    assert r.returncode == 0, r.stderr[-3000:]
    _check_gpu_run(tmp_path, 2)
    assert Trace.load(str(tmp_path / "run.rank0.bin")).meta["local_rank"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs torch with a CUDA GPU")
def test_gpu_spawned_gloo_ranks_are_named_by_their_group_rank(tmp_path):
    _write(tmp_path, "spawn.py", SPAWN)
    r = _record_gpu(tmp_path, sys.executable, "spawn.py")
    assert r.returncode == 0, r.stderr[-3000:]
    _check_gpu_run(tmp_path, 2)


# ---- a rank's snapshot: its events are on the rank's device ------------------------------------------------------
def _snapshot_on(tmp_path, traces_by_device):
    """The fixture snapshot with its device 1 history moved to the devices named (``{device: entries}``)."""
    import pickle
    from allocsim.formats.importers import safe_pickle
    snap = safe_pickle.load(os.path.join(ROOT, "tests", "fixtures", "snapshot.pickle"))
    one = snap["device_traces"][1]
    n = max(traces_by_device) + 1
    segs = [s for s in snap["segments"] if s.get("device") == 1]
    snap = {**snap, "device_traces": [one if d in traces_by_device else [] for d in range(n)], "segments": segs}
    p = tmp_path / "rank.pickle"
    p.write_bytes(pickle.dumps(snap))
    return str(p)


def test_a_rank_snapshot_imports_the_device_that_holds_its_events(tmp_path, capsys):
    p = _snapshot_on(tmp_path, {1})
    assert main(["import", p, "-o", str(tmp_path / "r1.bin")]) == 0
    t = Trace.load(str(tmp_path / "r1.bin"))
    assert t.meta["device"]["index"] == 1 and t.n_allocs == 1
    assert main(["import", p, "-o", str(tmp_path / "r0.bin"), "--device", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no allocation events for device 0" in err[0] and "--device 1" in err[0]


def test_a_snapshot_with_events_on_several_other_devices_names_them(tmp_path, capsys):
    p = _snapshot_on(tmp_path, {1, 2})
    assert main(["import", p, "-o", str(tmp_path / "r.bin")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "devices 1, 2" in err[0] and "--device N" in err[0]
    assert not os.path.exists(tmp_path / "r.bin")
    assert main(["import", p, "-o", str(tmp_path / "r.bin"), "--device", "2"]) == 0
    assert "device 1 also holds 2 trace entries: --device 1 imports them" in capsys.readouterr().err


@settings(max_examples=6, deadline=None)
@given(seeds=st.lists(st.integers(0, 10**6), min_size=2, max_size=3),
       outside=st.lists(st.integers(0, 64), min_size=3, max_size=3), total=st.integers(96, 160))
def test_tune_run_recommends_only_what_fits_every_rank(tmp_path_factory, seeds, outside, total):
    """Whatever the ranks hold and whatever lay beside their allocators, a recommended setting replays on every
    rank, at the GPU less that rank's outside memory, without running out; the rank tuned has the least room."""
    from conftest import random_trace
    from allocsim.engine.replay import replay
    from allocsim.engine.spec import PolicySpec
    from allocsim.errors import UsageError
    d = tmp_path_factory.mktemp("tunerun")
    paths = []
    for rank, seed in enumerate(seeds):
        t = random_trace(300, seed=seed, max_size=4 * MiB)
        t.meta = {"framework": "torch", "rank": rank, "world_size": len(seeds),
                  "device": {"name": "t", "total_memory": total * MiB},
                  "device_memory": {"total": total * MiB, "outside_peak": outside[rank] * MiB}}
        paths.append(str(d / f"run.rank{rank}.bin"))
        t.save(paths[-1])
    from allocsim.search.tune_ranks import tune_run
    try:
        res = tune_run(paths, max_replays=6, fit=False)
    except UsageError as e:            # a rank whose LOAD is more than its capacity: named, nothing tuned
        assert "no allocator setting fits the run" in str(e)
        return
    assert res.capacities == [(total - o) * MiB if o else "trace" for o in outside[:len(seeds)]]
    rooms = [(total - o) * MiB - Trace.load(p).load_bytes for p, o in zip(paths, outside)]
    assert rooms[res.worst] == min(rooms)
    if res.chosen is None:
        return
    spec = PolicySpec.parse(res.chosen["spec"])
    for path, cap, row in zip(paths, res.capacities, res.rank_rows):
        r = replay(path, spec, cap=res.chosen["cap_bytes"], capacity=cap)
        assert r.completed and not r.oom_events and r.peak_reserved_bytes == row["peak_reserved_bytes"]


def test_tune_on_a_run_where_a_rank_survived_an_oom_says_it_would_again(tmp_path, capsys):
    """A rank that caught an OOM under its memory fraction fails that request under every setting: no setting
    fits the run, and the table says it is the recorded OOM again."""
    from allocsim.trace.events import TORCH_AUX, fraction_bits
    _rank_trace(tmp_path / "oom.rank0.bin", 0, [60 * MiB, 40 * MiB], outside=100 * MiB)
    meta = {"framework": "torch", "rank": 1, "world_size": 2, "device": {"name": "Fake", "index": 1,
                                                                         "total_memory": 1 << 30}}
    w = TraceWriter(meta, path=str(tmp_path / "oom.rank1.bin"))
    w.record(ev.SET_LIMIT, aux=TORCH_AUX, addr=fraction_bits(0.25), size=(1 << 30) // 4)
    w.record(ev.SEGMENT_ALLOC, size=100 * MiB, addr=1 << 32)
    w.alloc(100 * MiB, addr=1 << 32)
    w.oom(300 * MiB)                       # over the 256 MiB the fraction allows: caught by the program
    w.mark("step 1")
    w.finish({"device_memory": {"total": 1 << 30, "outside_peak": 100 * MiB}})
    assert main(["tune", str(tmp_path / "oom.bin"), "--max-replays", "4", "--no-fit", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "the least room is rank 1 of 2's" in out        # its own fraction: 256 MiB, 100 MiB of it reserved
    assert "no setting of the 4 replayed fits this target" in out and "no setting fits the worst rank" in out
    _rank_trace(tmp_path / "oom.rank0.bin", 0, [400 * MiB, 400 * MiB], outside=100 * MiB)     # now the least room
    assert main(["tune", str(tmp_path / "oom.bin"), "--max-replays", "4", "--no-fit", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "the least room is rank 0 of 2's" in out and "no finalist of rank 0 of 2 fits every rank" in out
    assert "no: the recorded OOM at event 3 again" in out
