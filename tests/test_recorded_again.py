"""One process recorded more than once (issue 21, DDP's rank 0): the frees that land elsewhere, and `tune` on all
the recordings (allocsim.trace.analysis.moved_frees, allocsim.search.tune_ranks.recorded_again; traces/README.md)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import ROOT, random_trace
from allocsim.cli import main
from allocsim.engine.replay import replay
from allocsim.engine.spec import PolicySpec
from allocsim.trace import Trace
from allocsim.trace import events as ev
from allocsim.trace.analysis import free_points, moved_frees

RUNS = os.path.join(ROOT, "traces", "runs")
#: tune's recommendation for traces/runs/ddp.bin (traces/README.md), the setting the re-run measured
RECOMMENDED = "torch[expandable_segments:True,roundup_power2_divisions:[256:4,>:1]]"


def _move_free(trace: Trace, alloc: int, after: int) -> Trace:
    """``trace`` with the FREE (and FREE_REQUESTED) of its ``alloc``-th object moved to just before its ALLOC number
    ``after`` (to the end when ``after`` is the number of ALLOCs): the same program, that object let go elsewhere."""
    r = np.asarray(trace.records).copy()
    oid = r["id"][np.flatnonzero(r["kind"] == ev.ALLOC)[alloc]]
    mine = np.flatnonzero(np.isin(r["kind"], (ev.FREE, ev.FREE_REQUESTED)) & (r["id"] == oid))
    moved, rest = r[mine], np.delete(r, mine)
    allocs = np.flatnonzero(rest["kind"] == ev.ALLOC)
    at = int(allocs[after]) if after < len(allocs) else len(rest)
    moved["time_ns"] = rest["time_ns"][at] if at < len(rest) else rest["time_ns"][-1]
    return Trace(np.concatenate([rest[:at], moved, rest[at:]]), trace.meta, streams=trace.streams, sites=trace.sites,
                 labels=trace.labels)


# ---- the shipped recordings of DDP ---------------------------------------------------------------------------------
def test_ddp_rank0_recordings_differ_in_one_free_which_explains_the_rerun(tmp_path):
    """ddp.rank0.bin and ddp-expandable.rank0.bin record the same allocations; one free lands elsewhere, and
    moving it there in ddp.rank0.bin makes the recommended setting replay it as it replays the other recording
    (the re-run's 8,246,001,664 B and 88 device mallocs, traces/README.md), where before it did not."""
    a = Trace.load(os.path.join(RUNS, "ddp.rank0.bin"))
    b = Trace.load(os.path.join(RUNS, "ddp-expandable.rank0.bin"))
    moved = moved_frees(a, b)
    assert len(moved) == 1
    (m,) = moved
    assert m["after"][0] < m["after"][1] and m["size"] == free_points(a)[0][m["alloc"]]
    path = str(tmp_path / "moved.bin")
    _move_free(a, m["alloc"], m["after"][1]).save(path)
    assert moved_frees(Trace.load(path), b) == []
    spec = PolicySpec.parse(RECOMMENDED)
    got = {p: replay(p, spec) for p in (path, b.path, a.path)}
    figures = {p: (r.peak_reserved_bytes, r.device_mallocs) for p, r in got.items()}
    assert figures[path] == figures[b.path] != figures[a.path]
    assert figures[path][0] > figures[a.path][0]


def test_ddp_rank1_recordings_agree_and_other_programs_are_not_compared():
    r1 = [Trace.load(os.path.join(RUNS, f"{n}.rank1.bin")) for n in ("ddp", "ddp-expandable")]
    assert moved_frees(*r1) == []
    assert moved_frees(Trace.load(os.path.join(RUNS, "ddp.rank0.bin")), r1[0]) is None      # rank 1 allocates less
    assert moved_frees(Trace.load(os.path.join(RUNS, "fsdp.rank0.bin")), r1[0]) is None


def _recorded_peak(t: Trace) -> int:
    """The recorded allocator's peak reserved: the running sum of the trace's segment events."""
    sign = {ev.SEGMENT_ALLOC: 1, ev.SEGMENT_MAP: 1, ev.SEGMENT_FREE: -1, ev.SEGMENT_UNMAP: -1}
    kind, size = np.asarray(t.kind), np.asarray(t.size).astype(np.int64)
    return int(np.cumsum(sum(np.where(kind == k, v * size, 0) for k, v in sign.items())).max())


@pytest.mark.parametrize("first, again", [("runs/ddp.rank0.bin", "raw/defer/d-probe.rank0.bin"),
                                          ("runs/ddp-expandable.rank0.bin", "raw/defer/x-probe.rank0.bin")])
def test_under_one_setting_the_bucket_went_to_different_points(first, again):
    """Two recordings of the same command under the same setting (traces/raw/defer/, benchmarks/gpu_defer.sh) free
    DDP's first bucket at different points, and the allocator reserved more at its peak in the one that freed it
    later: the point is the run's timing, not the setting (traces/README.md)."""
    a, b = (Trace.load(os.path.join(ROOT, "traces", p)) for p in (first, again))
    assert a.meta["allocator_settings"]["expandable_segments"] == b.meta["allocator_settings"]["expandable_segments"]
    (m,) = moved_frees(a, b)
    later, sooner = (b, a) if m["after"][1] > m["after"][0] else (a, b)
    assert _recorded_peak(later) > _recorded_peak(sooner)
    rerun_miss = moved_frees(*(Trace.load(os.path.join(RUNS, f"{n}.rank0.bin")) for n in ("ddp", "ddp-expandable")))
    assert [m["alloc"]] == [x["alloc"] for x in rerun_miss]                  # the object of the re-run's miss


# ---- moved_frees on any trace --------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), pick=st.integers(0, 10**6), later=st.integers(1, 50))
def test_moved_frees_names_exactly_the_free_moved(seed, pick, later):
    t = random_trace(400, seed=seed)
    sizes, after = free_points(t)
    n = len(sizes)
    freed = np.flatnonzero(after < n)
    assert moved_frees(t, t) == []
    if not len(freed):
        return
    i = int(freed[pick % len(freed)])
    to = min(n, int(after[i]) + later)
    u = _move_free(t, i, to)
    assert np.array_equal(free_points(u)[0], sizes)
    expect = [] if to == after[i] else [{"alloc": i, "size": int(sizes[i]), "after": [int(after[i]), to]}]
    assert moved_frees(t, u) == expect
    assert moved_frees(u, t, t) == [{**e, "after": [e["after"][1], e["after"][0], e["after"][0]]} for e in expect]
    r = np.asarray(t.records).copy()
    r["size"][np.flatnonzero(r["kind"] == ev.ALLOC)[i]] += 1                 # one request of another size
    assert moved_frees(t, Trace(r, t.meta)) is None


def test_frees_after_the_last_allocation_or_never_change_no_peak_and_are_left_out():
    t = random_trace(300, seed=7)
    sizes, after = free_points(t)
    n = len(sizes)
    i = int(np.flatnonzero(after < n)[0])
    at_end = _move_free(t, i, n)
    assert moved_frees(t, at_end) == [{"alloc": i, "size": int(sizes[i]), "after": [int(after[i]), n]}]
    r = np.asarray(at_end.records)
    never = Trace(r[~((r["kind"] == ev.FREE) & (r["id"] == r["id"][np.flatnonzero(r["kind"] == ev.ALLOC)[i]]))],
                  t.meta)
    assert free_points(never)[1][i] == n and moved_frees(at_end, never) == []


# ---- tune on the recordings ------------------------------------------------------------------------------------------
def _rank0(t: Trace, path: str) -> str:
    t.meta = {"framework": "torch", "rank": 0, "world_size": 1, "device": {"name": "t", "total_memory": 1 << 34}}
    t.save(path)
    return path


@pytest.fixture
def recordings(tmp_path):
    """Two recordings of one process (a random program): the largest block freed early in one, at the end of its
    life's double in the other; named so that the later one sorts first."""
    t = random_trace(600, seed=11, max_size=8 << 20)
    sizes, after = free_points(t)
    n = len(sizes)
    i = int(np.argmax(np.where(after < n // 2, sizes, 0)))
    late = _move_free(t, i, n)
    return (_rank0(late, str(tmp_path / "a-late.bin")), _rank0(t, str(tmp_path / "b-early.bin")), i)


def test_tune_checks_every_recording_and_says_which_free_moved(recordings, capsys):
    from allocsim.search.tune_ranks import tune_run
    from allocsim.report.tune import recorded_again_lines
    late, early, i = recordings
    res = tune_run([early, late], max_replays=4, fit=False)
    assert res.chosen is not None
    spec = PolicySpec.parse(res.chosen["spec"])
    own = [replay(p, spec, cap=res.chosen["cap_bytes"]).peak_reserved_bytes for p in (early, late)]
    assert [r["peak_reserved_bytes"] for r in res.rank_rows] == own       # each row is its own trace's replay
    (v,) = res.variants
    assert v["traces"] == [early, late] and [m["alloc"] for m in v["moved"]] == [i]
    assert v["peak_reserved_bytes"] == own
    from allocsim.report.tune import run_report
    assert run_report(res, 0.0).startswith("run of 1 process (2 recordings);")   # one process, recorded twice
    text = "\n".join(recorded_again_lines(res))
    assert "recorded 2 times" in text and f"after allocation {v['moved'][0]['after'][0]:,}" in text
    assert main(["tune", late, early, "--max-replays", "4", "--no-fit", "-j", "1", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [m["alloc"] for m in d["recorded_again"][0]["moved"]] == [i]
    assert [r["trace"] for r in d["ranks"]] == [late, early]


def test_rows_follow_the_traces_in_the_order_given(tmp_path):
    """tune on a run checks each setting on every rank; each rank's row is that rank's own replay whatever order
    the traces come in (the rows of the replays come back sorted by path: ranks 10 and up sort before rank 2)."""
    from allocsim.search.tune_ranks import tune_run
    paths = []
    for k, seed in enumerate((3, 4, 5)):
        t = random_trace(300, seed=seed, max_size=(k + 1) << 21)
        paths.append(_rank0(t, str(tmp_path / f"{'zyx'[k]}.bin")))
    res = tune_run(paths, max_replays=3, fit=False)
    spec = PolicySpec.parse(res.rank_rows[res.worst]["spec"])
    assert [r["peak_reserved_bytes"] for r in res.rank_rows] == \
        [replay(p, spec, cap=res.rank_rows[res.worst]["cap_bytes"]).peak_reserved_bytes for p in paths]
    assert res.variants == []


def test_two_ranks_that_allocate_alike_are_two_processes(tmp_path):
    from allocsim.search.tune_ranks import recorded_again
    t = random_trace(200, seed=9)
    ranks = []
    for rank in (0, 1):
        t.meta = {"framework": "torch", "rank": rank, "world_size": 2}
        t.save(str(tmp_path / f"run.rank{rank}.bin"))
        ranks.append(Trace.load(str(tmp_path / f"run.rank{rank}.bin")))
    assert recorded_again(ranks) == []
    assert [g["positions"] for g in recorded_again(ranks + ranks[:1])] == [[0, 2]]


def test_a_run_recorded_once_says_how_to_see_the_range(tmp_path):
    from allocsim.report.tune import recorded_again_lines
    from allocsim.search.tune_ranks import tune_run
    paths = [_rank0(random_trace(200, seed=s), str(tmp_path / f"r{s}.bin")) for s in (1, 2)]
    lines = recorded_again_lines(tune_run(paths, max_replays=2, fit=False))
    assert len(lines) == 1 and "recorded once" in lines[0] and "RERUN.bin" in lines[0]
