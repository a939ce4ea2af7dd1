"""Requests the program survives failing (CATCHES_OOM, docs/allocator-dependent.md): the converter flags them
from C++ frames; a replay that fails one counts a caught OOM, skips its FREE and goes on, where an unflagged
one stops it, on the plain walk and every fused loop alike; validate and info say what the trace shows;
`allocsim record --stacks all` records them on a GPU (marked gpu)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocsim.trace.trace as trace_module
from allocsim.cli import main
from allocsim.errors import InputError
from allocsim.formats.importers.torch_snapshot import SnapshotConversion, catches_oom, stacks_of
from allocsim.engine.replay import Replay, replay
from allocsim.trace import Trace, TraceWriter
from allocsim.trace import events as ev
from allocsim.trace.analysis import summarize
from allocsim.search.validate import validate

from test_fast_path import FUSED, FUSED_IDS, assert_fused_is_plain, pressured_traces
from test_record import _gpu_ok, _script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
POLICIES = ["torch", "torch[expandable_segments:True]", "split", "bestfit", "cupy", "simple", "binned", "knet"]


def workspace_trace(flag: int, meta=None) -> Trace:
    """12 MiB live, a 30 MiB request (a cuDNN workspace try when ``flag``) freed at once, then 4 MiB: under a
    40 MiB cap the 30 MiB request fails and the rest fits."""
    w = TraceWriter({"framework": "torch", **(meta or {})})
    a = w.alloc(12 * MiB)
    b = w.alloc(30 * MiB, flags=flag)
    w.free(b)
    c = w.alloc(4 * MiB)
    w.free(a)
    w.free(c)
    return w.finish()


# ---- the replay ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("fast_path", [True, False])
def test_a_flagged_request_that_fails_is_caught_and_the_walk_goes_on(policy, fast_path):
    r = replay(workspace_trace(ev.CATCHES_OOM), policy, cap=40 * MiB, capacity=None, fast_path=fast_path)
    assert r.completed and r.ooms == 0 and r.oom_events == []
    assert r.caught_ooms == 1 and [(o.event, o.size, o.caught) for o in r.caught_oom_events] == [(1, 30 * MiB, True)]
    assert (r.allocs, r.frees) == (3, 2)           # the failed request's FREE is skipped, not counted
    assert r.caught_oom_events[0].live_bytes == 12 * MiB


@pytest.mark.parametrize("policy", POLICIES)
def test_an_unflagged_request_that_fails_still_stops_the_walk(policy):
    r = replay(workspace_trace(0), policy, cap=40 * MiB, capacity=None)
    assert not r.completed and r.ooms == 1 and r.caught_ooms == 0 and r.oom_events[0].event == 1


def test_a_flagged_request_that_fits_is_an_ordinary_request():
    flagged, plain = (replay(workspace_trace(f), "torch", cap=80 * MiB, capacity=None).to_dict()
                      for f in (ev.CATCHES_OOM, 0))
    for r in (flagged, plain):
        r.pop("replay_seconds")
    assert flagged == plain and flagged["caught_ooms"] == 0 and flagged["frees"] == 3


def test_keep_going_counts_caught_and_uncaught_apart():
    w = TraceWriter({"framework": "torch"})
    a = w.alloc(30 * MiB)
    b = w.alloc(30 * MiB, flags=ev.CATCHES_OOM)     # fails: caught
    c = w.alloc(30 * MiB)                           # fails: an OOM
    for i in (b, c, a):
        w.free(i)
    r = replay(w.finish(), "split", cap=40 * MiB, capacity=None, keep_going=True)
    assert (r.ooms, r.caught_ooms, r.oom_events[0].event, r.caught_oom_events[0].event) == (1, 1, 2, 1)
    assert r.frees == 1


def test_the_fused_loop_is_taken_on_flagged_traces():
    """The fast path handles the flag (the engine's `served` callback decides, as for --keep-going): a trace with
    flagged requests keeps its fused loop."""
    for policy in ("torch", "split", "bestfit", "cupy"):
        assert Replay(workspace_trace(ev.CATCHES_OOM), policy, cap=40 * MiB, capacity=None).fast_path


@st.composite
def flagged_traces(draw):
    """`pressured_traces` (allocs and frees on three streams, cache releases, recorded OOMs, limits) with some
    of their ALLOCs flagged CATCHES_OOM."""
    t = draw(pressured_traces())
    rec = t.records.copy()
    alloc = np.flatnonzero(rec["kind"] == ev.ALLOC)
    flagged = draw(st.lists(st.booleans(), min_size=len(alloc), max_size=len(alloc)))
    rec["flags"][alloc[np.array(flagged, bool)]] |= ev.CATCHES_OOM
    return Trace(rec, {**t.meta, "framework": "torch"}, streams=t.streams, sites=t.sites, labels=t.labels)


@pytest.mark.parametrize("policy, options", FUSED, ids=FUSED_IDS)
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(trace=flagged_traces(), chunk=st.sampled_from([3, 17, 1 << 16]), tight=st.sampled_from([0.5, 0.8]),
       keep_going=st.booleans(), steps=st.sampled_from([None, 1, 5]))
def test_caught_ooms_fused_is_plain_and_only_flagged_requests_are_caught(policy, options, trace, chunk, tight,
                                                                         keep_going, steps, monkeypatch):
    monkeypatch.setattr(trace_module, "CHUNK", chunk)
    out = assert_fused_is_plain(trace, policy, options, cap=int(max(trace.load_bytes, MiB) * tight),
                                keep_going=keep_going, steps=steps)["result"]
    flagged = set(np.flatnonzero((trace.kind == ev.ALLOC) & (trace.flags & ev.CATCHES_OOM != 0)).tolist())
    assert {o["event"] for o in out["caught_oom_events"]} <= flagged
    assert not {o["event"] for o in out["oom_events"]} & flagged
    assert out["caught_ooms"] == len(out["caught_oom_events"])


# ---- validate, info, the command line -----------------------------------------------------------------------
def test_info_says_what_the_trace_can_tell():
    assert summarize(workspace_trace(0))["catches_oom"] is None                       # no C++ stacks
    assert summarize(workspace_trace(0, {"stacks": "all"}))["catches_oom"] == 0
    d = summarize(workspace_trace(ev.CATCHES_OOM))
    assert (d["catches_oom"], d["catches_oom_max_bytes"]) == (1, 30 * MiB)
    w = TraceWriter({"framework": "cupy"})
    w.alloc(10)
    assert "catches_oom" not in summarize(w.finish())


def test_info_and_replay_on_the_command_line(tmp_path, capsys):
    path = str(tmp_path / "ws.bin")
    workspace_trace(ev.CATCHES_OOM).save(path)
    assert main(["info", path]) == 0
    assert "requests the program survives failing: 1 (cuDNN workspace tries, up to 30.00 MiB)" in capsys.readouterr().out
    assert main(["replay", path, "-p", "torch", "--cap", "40MiB", "--no-sections"]) == 0
    out, err = capsys.readouterr()
    assert "OOMs survived                       1" in out
    assert len(err.strip().splitlines()) == 1 and "survives failing" in err and "none assumed" in err
    workspace_trace(0).save(path)
    assert main(["info", path]) == 0
    assert "the trace cannot tell (no C++ stacks" in capsys.readouterr().out


def segment_trace(flag: int, limit: int) -> Trace:
    """A torch trace with the recorded allocator's segments: 12 MiB and 30 MiB (flagged) requests, each in a
    segment of its own, under a recorded limit of ``limit`` bytes."""
    w = TraceWriter({"framework": "torch", "stacks": "all", "allocator_settings": {},
                     "device": {"total_memory": 80 << 30}})
    w.record(ev.SET_LIMIT, size=limit, addr=ev.fraction_bits(limit / (80 << 30)))
    w.segment(ev.SEGMENT_ALLOC, 1 << 32, 12 * MiB)
    a = w.alloc(12 * MiB, addr=1 << 32)
    w.segment(ev.SEGMENT_ALLOC, 2 << 32, 30 * MiB)
    b = w.alloc(30 * MiB, addr=2 << 32, flags=flag)
    w.free(b)
    w.free(a)
    return w.finish()


def test_validate_counts_the_flagged_requests_and_checks_none_failed():
    v = validate(segment_trace(ev.CATCHES_OOM, 64 * MiB))
    assert v.match and v.catches_oom == 1
    assert {"name": "OOMs survived", "recorded": 0, "model": 0, "ok": True} in v.checks
    v = validate(segment_trace(ev.CATCHES_OOM, 40 * MiB))      # the model fails what the recording served
    assert not v.match and next(c for c in v.checks if c["name"] == "OOMs survived")["model"] == 1
    v = validate(segment_trace(0, 64 * MiB))
    assert v.match and v.catches_oom == 0 and all(c["name"] != "OOMs survived" for c in v.checks)


def test_a_flag_of_another_kind_on_an_alloc_is_refused(tmp_path):
    """Every bit of the flags byte is defined now; each marks its own kinds (8: a POOL_BEGIN's capture)."""
    w = TraceWriter({"framework": "torch"})
    w.alloc(10, flags=ev.POOL_CAPTURE | ev.CATCHES_OOM)
    path = str(tmp_path / "bad.bin")
    w.finish().save(path)
    with pytest.raises(InputError, match=r"event 0: flag 8 \(POOL_CAPTURE\) on an ALLOC: it marks POOL_BEGINs only"):
        Trace.load(path)


# ---- the converter --------------------------------------------------------------------------------------
def _cpp(name):
    return {"name": name, "filename": "??", "line": 0}


ALLOCATOR = _cpp("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, "
                 "unsigned long, CUstream_st*)")
PY = {"name": "forward", "filename": "/home/u/train.py", "line": 3}
WORKSPACE = [ALLOCATOR, _cpp("at::native::run_conv_plan(cudnnContext*, at::Tensor const&, at::Tensor const&, "
                             "at::Tensor const&, cudnn_frontend::ExecutionPlan_v8 const&, "
                             "cudnnBackendDescriptorType_t)"),
             _cpp("at::native::try_configs(std::vector<>&, std::string const&)"), PY]
CACHED_PLAN = [ALLOCATOR, _cpp("at::native::run_conv_plan_fused(cudnnContext*)"),
               _cpp("at::native::run_fused_conv(at::Tensor const&)"), PY]
FIND = [ALLOCATOR, _cpp("at::native::generate_and_filter_plans(cudnnContext*, cudnn_frontend::OperationGraph&)"), PY]
OUTPUT = [ALLOCATOR, _cpp("at::native::empty_cuda(c10::ArrayRef<long>)"),
          _cpp("at::native::raw_cudnn_convolution_forward_out(at::Tensor const&)"), PY]
LOOKALIKE = [ALLOCATOR, _cpp("my::run_conv_plan_cache_lookup(int)"), PY]     # a name that only starts alike


def _entry(action, addr, size, frames=None):
    return {"action": action, "addr": addr, "size": size, "stream": 0, **({"frames": frames} if frames else {})}


def test_the_converter_flags_the_requests_made_where_pytorch_catches_their_oom():
    stacks = [WORKSPACE, CACHED_PLAN, FIND, OUTPUT, LOOKALIKE, [PY], None]
    entries = [_entry("segment_alloc", 0, 20 * MiB)]
    for k, frames in enumerate(stacks):
        entries.append(_entry("alloc", k * 4096, 4096, frames))
    for k in range(len(stacks)):
        entries += [_entry("free_requested", k * 4096, 4096), _entry("free_completed", k * 4096, 4096)]
    conv = SnapshotConversion({"segments": [], "device_traces": [entries]})
    w = TraceWriter(conv.meta)
    stats = conv.emit(w)
    t = w.finish()
    alloc_flags = [int(f) for k, f in zip(t.kind, t.flags) if k == ev.ALLOC]
    assert alloc_flags == [ev.CATCHES_OOM] * 3 + [0] * 4
    assert stats["catches_oom"] == 3 and t.meta["stacks"] == "all"
    assert [catches_oom(f) for f in (WORKSPACE, OUTPUT, ["not a frame", 3])] == [True, False, False]


def test_which_stacks_a_snapshot_holds():
    assert stacks_of([_entry("segment_alloc", 0, 1), _entry("alloc", 0, 8, OUTPUT)]) == "all"
    assert stacks_of([_entry("alloc", 0, 8, [PY]), _entry("alloc", 8, 8, OUTPUT)]) == "python"
    assert stacks_of([_entry("alloc", 0, 8), "junk", {"action": "alloc", "frames": "junk"}]) is None

CONV_NET = """
    import torch
    torch.backends.cudnn.benchmark = False
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(32, 64, 5, padding=2), torch.nn.ReLU(),
                              torch.nn.Conv2d(64, 8, 3)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for side in (64, 96, 64, 128):        # a new shape: cuDNN tries configs; a seen one: the cached plan
        opt.zero_grad()
        net(torch.rand(4, 3, side, side, device="cuda")).sum().backward()
        opt.step()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok("torch"), reason="needs torch with a CUDA GPU")
def test_a_conv_net_recorded_with_cpp_stacks_has_flagged_workspace_requests(tmp_path):
    s = _script(tmp_path, "conv.py", CONV_NET)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = str(tmp_path / "conv.bin")
    r = subprocess.run([sys.executable, "-m", "allocsim", "record", "--stacks", "all", "-o", out, s],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    t = Trace.load(out)
    stats = json.load(open(out + ".stats.json"))
    flagged = np.count_nonzero((t.kind == ev.ALLOC) & (t.flags & ev.CATCHES_OOM != 0))
    assert t.meta["stacks"] == "all"
    assert flagged >= 1 and flagged == stats["conversion"]["catches_oom"], (flagged, stats["conversion"])
