"""Folding periodic runs (allocsim/engine/fold.py): the folded replay is the full walk, bit for bit, and it folds where
the state repeats, and only there."""
from __future__ import annotations

import glob
import importlib
from array import array
import json
import lzma
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import allocsim.trace.trace as trace_module
from allocsim.engine import fold
from allocsim.policies.base import Policy
from allocsim.machine.metrics import LatencyLog
from allocsim.machine.sections import Sections
from allocsim.policies.split import SplittingPool
from allocsim.engine.replay import Replay
from allocsim.formats.synth import repeat_steps
from allocsim.testing import STREAMS
from allocsim.trace import Trace, TraceWriter
from allocsim.trace.events import ALLOC, CACHE_RELEASE, FREE, SET_LIMIT

from conftest import ROOT, run_cli

MiB = 1 << 20
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "traces", "*.bin")))
#: the policies that declare their state, with options that change it
FOLDING = [("split", []), ("split", ["huge_exact=true"]), ("torch", []), ("torch", ["max_split_size_mb:20"]),
           ("torch", ["expandable_segments:true"]), ("torch", ["garbage_collection_threshold:0.6"]),
           ("bestfit", []), ("bestfit", ["release=true"]), ("cupy", []), ("cupy", ["version=13"]),
           ("cupy", ["track_total=true"])]
IDS = [f"{p}[{','.join(o)}]" for p, o in FOLDING]


def load(name: str) -> Trace:
    return Trace.load(os.path.join(ROOT, "traces", name))


def walk(trace, policy, options=(), *, fold: bool, **kw):
    """Everything one replay yields: the whole result record, the live blocks by id, the device's clock and
    totals, the policy's counters and segment log, and how much was folded."""
    r = Replay(trace, policy, options=list(options), fold=fold, **kw)
    r.run(until=len(trace))         # to the end, still open: read the state below
    dev = r.device
    state = {"live blocks": r.live_blocks(), "counters": r.policy.counters(), "segment log": r.segment_log,
             "clock": dev.clock.hex(), "device": (dev.malloc_time.hex(), dev.free_time.hex(), dev.n_malloc,
                                                  dev.n_free, dev.n_failed), "gc": r.runtime.gc_time.hex()}
    folded = r.folded
    res = r.finish().to_dict(timeline=True)
    res.pop("replay_seconds")
    return {**state, "result": res}, folded


def assert_folded_is_full(trace, policy, options=(), **kw):
    full, none = walk(trace, policy, options, fold=False, **kw)
    assert none is None
    folded, how = walk(trace, policy, options, fold=True, **kw)
    for what in full:
        assert folded[what] == full[what], f"{what} differ: folded {folded[what]!r:.300} full {full[what]!r:.300}"
    return how


# ---- every figure is the full walk's --------------------------------------------------------------------
@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_folding_is_the_full_walk_on_recorded_traces(path):
    trace = Trace.load(path)
    for policy, options in (("torch", []), ("split", []), ("cupy", []), ("bestfit", [])):
        assert_folded_is_full(trace, policy, options, keep_going=True)


@pytest.mark.parametrize("policy, options", FOLDING, ids=IDS)
@pytest.mark.parametrize("name, steps", [("gpt2.bin", 24), ("resnet50.bin", 40), ("pressure-empty-cache.bin", 30),
                                         ("pressure-gc-threshold.bin", 30), ("cupy_mlp.bin", 60)])
def test_folding_is_the_full_walk_on_extended_traces(policy, options, name, steps):
    assert_folded_is_full(repeat_steps(load(name), steps), policy, options, keep_going=True)


@pytest.mark.parametrize("runtime, gc_every", [("gc", None), ("eager", 256 * MiB), ("gc", 64 * MiB)])
@pytest.mark.parametrize("policy", ["split", "bestfit", "torch"])
def test_folding_is_the_full_walk_under_gc_and_periodic_collections(policy, runtime, gc_every):
    assert_folded_is_full(repeat_steps(load("synthetic-transformer.bin"), 30), policy, runtime=runtime,
                          gc_every=gc_every, keep_going=True)


sizes = st.one_of(st.integers(1, 4096), st.integers(4097, 2 * MiB), st.integers(2 * MiB, 48 * MiB),
                  st.sampled_from([512, MiB, MiB + 1, 2 * MiB, 20 * MiB, 33 * MiB]))
ops = st.lists(st.tuples(st.integers(0, 10), sizes, st.integers(0, 2), st.integers(0, 10**6)), min_size=1, max_size=30)


@st.composite
def periodic_traces(draw, evaluations: bool = False):
    """A random prefix, then one random step repeated (its objects freed in it, or in the next step: carried),
    then a random tail: the shape of a training run, with cache releases and limits in the steps. With
    ``evaluations``, more steps, and every few steps another random step (an evaluation) between two of them."""
    w = TraceWriter(meta={"producer": "hypothesis"})
    live: list[int] = []

    def run(program, mine, carried):
        for what, size, stream, pick in program:
            if what == 0:
                w.record(CACHE_RELEASE)
            elif what == 1:
                w.record(SET_LIMIT, size=(pick % 64 + 16) * MiB)
            elif what == 2 and carried:
                w.free(carried.pop(pick % len(carried)))
            elif what <= 7 or not mine:
                mine.append(w.alloc(size, stream=STREAMS[stream]))
            else:
                w.free(mine.pop(pick % len(mine)))

    run(draw(ops), live, [])
    step, carried = draw(ops), []
    evaluation, every = (draw(ops), draw(st.integers(3, 9))) if evaluations else (None, 0)
    for k in range(draw(st.integers(20, 60) if evaluations else st.integers(3, 14))):
        w.mark(f"step {k}")
        mine: list[int] = []
        run(step, mine, carried)
        for i in carried:
            w.free(i)
        carried = mine
        if evaluation and k % every == every - 1:
            scratch: list[int] = []
            run(evaluation, scratch, [])
            for i in scratch:
                w.free(i)
    w.mark("tail")
    run(draw(ops), live, carried)
    for i in live + carried:
        w.free(i)
    return w.finish()


@pytest.mark.parametrize("policy, options", FOLDING, ids=IDS)
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_folding_is_the_full_walk_on_generated_traces(policy, options, data, monkeypatch):
    trace = data.draw(periodic_traces())
    monkeypatch.setattr(trace_module, "CHUNK", data.draw(st.sampled_from([7, 64, 1 << 16])))
    cap = data.draw(st.sampled_from([None, int(max(trace.load_bytes, MiB) * 1.2), 64 * MiB]))
    assert_folded_is_full(trace, policy, options, cap=cap, capacity=None, keep_going=data.draw(st.booleans()),
                          runtime=data.draw(st.sampled_from(["eager", "gc"])))


@pytest.mark.parametrize("policy, options", [("torch", []), ("split", []), ("bestfit", []), ("cupy", [])])
@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=periodic_traces(evaluations=True), cap=st.sampled_from([None, 64 * MiB]))
def test_folding_is_the_full_walk_on_generated_traces_with_evaluations(policy, options, trace, cap):
    """Runs broken by an evaluation every few steps: the folds resumed (a window recorded at once where the state
    is back in a cycle) and the windows reused (added with an earlier recording) give the full walk's result."""
    assert_folded_is_full(trace, policy, options, cap=cap, capacity=None, keep_going=True)


REAL = os.path.join(ROOT, "traces", "fold")


def real_steps(name: str, steps: int) -> Trace:
    """The first ``steps`` steps of a recording in traces/fold/ (shipped xz-compressed): all of it for as many as it
    holds."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name + ".bin")
        with lzma.open(os.path.join(REAL, name + ".bin.xz")) as f, open(path, "wb") as out:
            out.write(f.read())
        trace = Trace.load(path)
        marks = [at for at, _ in trace.marks()]
        end = marks[steps] if steps < len(marks) else len(trace)
        return Trace(np.array(trace.records[:end]), dict(trace.meta), streams=trace.streams, labels=trace.labels)


def test_a_real_run_broken_by_evaluations_folds_again_from_its_cycle(monkeypatch):
    """A real GPT run (traces/fold/gpt-eval50, period 7) with a logging and evaluation step every 50: folded,
    the full walk's result under each policy; and after the second evaluation, whose state comes back to the
    one the recorded window started from, the fold goes on with that recording, within a period's steps."""
    trace = real_steps("gpt-eval50", 130)
    for policy in ("split", "bestfit", "cupy"):
        assert_folded_is_full(trace, policy)
    spans = []
    skip = fold.Folder._skip

    def spy(self, program, k, before, after, start, end, *args, **kw):
        spans.append((int(np.searchsorted(self.marks, start)), int(np.searchsorted(self.marks, end))))
        return skip(self, program, k, before, after, start, end, *args, **kw)
    monkeypatch.setattr(fold.Folder, "_skip", spy)
    how = assert_folded_is_full(trace, "torch")
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]         # steps walked between folds
    assert how["period"] == 7 and len(gaps) == 2 and gaps[1] < how["period"], (how, spans)


def test_a_run_whose_steps_never_repeat_is_walked_with_no_folder():
    """Where no step has the ALLOC counts of the steps a period after it (gpt2_variable: batch and sequence
    change every step), no fold can pay: the replay has no folder (it is not stopped at each boundary, nothing is
    fingerprinted), and a run of fixed shapes has one."""
    variable = load("gpt2_variable.bin")
    assert not fold.steps_of(variable).may_repeat()
    assert Replay(variable, "torch")._folder is None
    assert Replay(load("gpt2.bin"), "torch")._folder is not None
    assert_folded_is_full(variable, "torch")


# ---- it folds where the state repeats, and only there ----------------------------------------------------
@pytest.mark.parametrize("policy", ["torch", "split", "bestfit", "cupy"])
def test_a_fixed_shape_model_folds_at_period_1(policy):
    how = assert_folded_is_full(repeat_steps(load("synthetic-transformer.bin"), 60), policy)
    assert how is not None and how["period"] == 1 and how["steps"] >= 50, how


def test_gpt2_folds_at_period_2_and_resnet50_at_period_10_under_torch():
    gpt2 = assert_folded_is_full(repeat_steps(load("gpt2.bin"), 40), "torch")
    assert gpt2["period"] == 2 and gpt2["from_step"] == 6 and gpt2["steps"] >= 30, gpt2
    resnet = assert_folded_is_full(repeat_steps(load("resnet50.bin"), 60), "torch")
    assert resnet["period"] == 10 and resnet["steps"] >= 20, resnet


def test_a_repeated_step_that_moves_a_block_does_not_fold(monkeypatch):
    """A split pool whose state carries a counter that grows every step never repeats: no fold, and the
    result is still the full walk's."""
    trace = repeat_steps(load("synthetic-transformer.bin"), 30)
    assert assert_folded_is_full(trace, "split") is not None
    steps = iter(range(1 << 30))
    plain = SplittingPool.fold_state
    monkeypatch.setattr(SplittingPool, "fold_state", lambda self, held: (plain(self, held), next(steps)))
    assert assert_folded_is_full(trace, "split") is None


def fingerprint_after(trace, policy, mutate):
    """The folder's fingerprint at the first boundary after the fifth, before and after ``mutate(policy, handles)``."""
    r = Replay(trace, policy)
    r.run(until=trace.marks()[5][0])
    before = r._folder._fingerprint()[0]
    mutate(r.policy, r.handles)
    after = r._folder._fingerprint()
    r.close()
    return before, None if after is None else after[0]


def _moved_free_block(pol, handles):
    block = next(b for pp in pol._pools.values() for pool in pp for b in pool.blocks)
    block.ptr += 512


def _other_stream(pol, handles):
    next(iter(handles.values())).pool.stream += 1


def _older_free_block(pol, handles):
    next(b for pp in pol._pools.values() for pool in pp for b in pool.blocks).gc_base -= 1


def _counter(pol, handles):
    pol.allocated += 512


def _split_tie_order(pol, handles):
    b1, b2 = sorted(handles.values())[:2]         # swap two blocks' ids: best fit's tie order changes
    for lst in (pol._size, pol._addr):
        lst[b1], lst[b2] = lst[b2], lst[b1]


def _bestfit_moved(pol, handles):
    pol._addr[pol._ids[0]] += 512      # a free block 512 bytes further on


def _bestfit_held_moved(pol, handles):
    pol._addr[max(handles.values())] += 512     # a held block elsewhere (its words gathered by numpy)


def _bestfit_held_grown(pol, handles):
    pol._size[max(handles.values())] += 512     # a held block larger


def _cupy_held_moved(pol, handles):
    max(handles.values(), key=lambda c: c.ptr).ptr += 512      # a held chunk elsewhere (its words packed)


def _cupy_held_unlinked(pol, handles):
    c = next(c for c in handles.values() if c.next is not None or c.prev is not None)
    c.next, c.prev = (None, c.prev) if c.next is not None else (c, None)    # a held chunk's neighbours others


def _cupy_free_grown(pol, handles):
    next(c for a in pol._arenas.values() for c in a.chunks).size += 512    # a free chunk larger


@pytest.mark.parametrize("policy, mutate", [("torch", _moved_free_block), ("torch", _other_stream),
                                            ("torch[garbage_collection_threshold:0.6]", _older_free_block),
                                            ("torch", _counter), ("split", _split_tie_order), ("split", _counter),
                                            ("bestfit", _bestfit_moved), ("bestfit", _bestfit_held_moved),
                                            ("bestfit", _bestfit_held_grown), ("cupy", _counter),
                                            ("cupy", _cupy_held_moved), ("cupy", _cupy_held_unlinked),
                                            ("cupy", _cupy_free_grown)])
def test_a_state_that_differs_in_one_block_or_counter_has_another_fingerprint(policy, mutate):
    before, after = fingerprint_after(repeat_steps(load("gpt2.bin"), 10), policy, mutate)
    assert before != after


def test_a_driver_placement_that_moved_gives_another_fingerprint():
    """The device's part of a look holds the driver placement, kept pickled until a call changes it: a segment the
    driver placed since (here one more, outside the policy) gives another fingerprint, and one asked again with
    nothing changed the same."""
    r = Replay(repeat_steps(load("gpt2.bin"), 10), "torch")
    r.run(until=r.trace.marks()[5][0])
    before = r._folder._fingerprint()[0]
    assert r._folder._fingerprint()[0] == before
    r.device._driver.malloc(64 << 20)
    moved = r._folder._fingerprint()[0]
    r.close()
    assert moved != before


def test_splits_state_lists_its_blocks_sorted_as_tuples_whatever_their_addresses():
    """`split`'s state sorts its live blocks by address alone where each address is one block's (an argsort), and
    by the whole row where two share one (a lexsort of address, size, state, rank, neighbours): the rows come out
    as the rows sorted as tuples, here made in the test, before and after two held blocks are put at one address
    in the other order of their sizes."""
    from allocsim.policies import split
    from allocsim.policies._columns import words_of
    r = Replay(repeat_steps(load("gpt2.bin"), 10), "split")
    r.run(until=r.trace.marks()[5][0])
    pol = r.policy

    def as_tuples():
        ids = sorted(set(r.handles.values()) | set(split._free_ids(pol._fsize, pol._next_id)))
        cols = [words_of(c, np.array(ids, np.int64)) for c in (pol._size, pol._addr, pol._prev, pol._next, pol._fsize)]
        rows = sorted((a, s, 2 if f == split.FREED else int(f != 0), k, p != 0, n != 0)
                      for k, (s, a, p, n, f) in enumerate(zip(*[c.tolist() for c in cols])))
        return [(a, s, k, st * 4 + p * 2 + n) for a, s, st, k, p, n in rows]

    def state_rows():
        blocks = pol.fold_state(r.handles.values())[0]
        n = len(blocks) // 21                   # (address, size: 8 bytes; rank: 4; flags: 1)
        cols = [np.frombuffer(blocks, np.int64, n, 0), np.frombuffer(blocks, np.int64, n, 8 * n),
                np.frombuffer(blocks, np.int32, n, 16 * n), np.frombuffer(blocks, np.uint8, n, 20 * n)]
        return list(zip(*[c.tolist() for c in cols]))

    assert state_rows() == as_tuples()
    b1, b2 = sorted(r.handles.values())[:2]     # b1 ranks first; give it the larger size at b2's address
    pol._addr[b1] = pol._addr[b2]
    pol._size[b1], pol._size[b2] = max(pol._size[b1], pol._size[b2]) + 512, min(pol._size[b1], pol._size[b2])
    assert state_rows() == as_tuples()
    r.close()


def test_a_state_with_two_blocks_at_one_address_is_not_fingerprinted():
    """`torch`'s state orders its blocks by address (by numpy): two at one address cannot be told apart, so the
    state is None and the boundary is not folded from."""
    def two_at_one_address(pol, handles):
        a, b = list(handles.values())[:2]
        b.ptr = a.ptr
    before, after = fingerprint_after(repeat_steps(load("gpt2.bin"), 10), "torch", two_at_one_address)
    assert before is not None and after is None


def test_what_cannot_be_folded_is_walked():
    """An observer, a timeline, the event log, a real device of its own, a plug-in: the full walk."""
    trace = repeat_steps(load("synthetic-transformer.bin"), 30)
    assert Replay(trace, "torch")._folder is not None
    assert Replay(trace, "torch", observer=lambda *a: None)._folder is None
    assert Replay(trace, "torch", timeline=True)._folder is None
    assert Replay(trace, "torch", log_events=True)._folder is None
    assert Replay(trace, "torch", fold=False)._folder is None
    assert Replay(trace, "binned")._folder is None          # declares no state

    class Counting(SplittingPool):
        """A subclass made outside allocsim that adds state of its own: never folded on the built-in's word."""
    Counting.__module__ = "elsewhere"
    assert Replay(trace, Counting)._folder is None


def test_stepping_never_skips_past_the_steps_target():
    trace = repeat_steps(load("synthetic-transformer.bin"), 30)
    r = Replay(trace, "split")
    while r.step(1000):
        pass
    assert r.folded is None
    assert r.finish().to_dict()["driving_events"] == Replay(trace, "split", fold=False).run().driving_events


# ---- the command line ----------------------------------------------------------------------------------
def test_replay_says_how_much_it_folded_and_no_fold_walks_it_all(tmp_path):
    path = str(tmp_path / "long.bin")
    repeat_steps(load("synthetic-transformer.bin"), 100).save(path)     # (past `MIN_RECORDS`: a folder is made)
    out = run_cli("replay", path, "-p", "torch", "--no-sections")
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "folded" in x)
    assert "of 100 steps (period 1 from step" in line
    full = run_cli("replay", path, "-p", "torch", "--no-sections", "--no-fold")
    assert full.returncode == 0 and "folded" not in full.stdout
    strip = [x for x in out.stdout.splitlines() if "folded" not in x and "replay " not in x]
    assert strip == [x for x in full.stdout.splitlines() if "replay " not in x]
    folded, walked = (json.loads(run_cli("replay", path, "-p", "split", "--json", *more).stdout)
                      for more in ([], ["--no-fold"]))
    assert folded.pop("folded")["period"] == 1 and "folded" not in walked
    for d in (folded, walked):
        d.pop("replay_seconds"), d.pop("load_seconds")
    assert folded == walked
    for command in (["compare", path, "-p", "torch,split"], ["fit", path, "-p", "split", "--max-replays", "3"]):
        cmd = run_cli(*command, "--no-fold")
        assert cmd.returncode == 0, cmd.stderr


@pytest.mark.parametrize("marks", [0, 1, 2, 3])
def test_a_trace_with_few_steps_replays_as_before(marks):
    w = TraceWriter(meta={"producer": "test"})
    for k in range(marks):
        w.mark(f"step {k}")
        w.free(w.alloc(4096))
    w.free(w.alloc(512))
    assert_folded_is_full(w.finish(), "split")


def test_a_walk_to_targets_folds_only_before_each_and_reads_alike_midway():
    """`run(until=...)` folds only whole periods before its target; a result read midway (while a period is
    being recorded, too) changes nothing; the end is the full walk's."""
    trace = repeat_steps(load("gpt2.bin"), 40)
    marks = [at for at, _ in trace.marks()]
    full = Replay(trace, "torch", fold=False)
    r = Replay(trace, "torch")
    for target in (marks[7], marks[12] + 5, marks[25], marks[33]):
        full.run(until=target)
        r.run(until=target)
        assert r.events_done == full.events_done
        mid, mid_full = r.result().to_dict(), full.result().to_dict()
        for d in (mid, mid_full):
            d.pop("replay_seconds")
        assert mid == mid_full
        assert r.live_blocks() == full.live_blocks()
    assert r.folded is not None
    a, b = r.run().to_dict(), full.run().to_dict()
    a.pop("replay_seconds"), b.pop("replay_seconds")
    assert a == b


def test_every_boundary_is_fingerprinted_where_it_lies_when_a_recorded_period_cannot_repeat(monkeypatch):
    """A recorded period that cannot be repeated (here: every one) folds nothing, and the boundary where it
    ends is still taken at its own place (events before it walked, none after), as every other one."""
    from allocsim.engine import fold
    trace = repeat_steps(load("synthetic-transformer.bin"), 20)
    monkeypatch.setattr(fold.Recorder, "stop", lambda self, stop=fold.Recorder.stop: stop(self) and None)
    taken = []
    boundary = fold.Folder._boundary

    def check(self, at, mark, until):
        taken.append((at, self.r.events_done))
        return boundary(self, at, mark, until)
    monkeypatch.setattr(fold.Folder, "_boundary", check)
    r = Replay(trace, "torch")
    r.run()
    assert r.folded is None and len(taken) >= 10
    for at, done in taken:
        walked = Replay(trace, "torch", fold=False)
        walked.run(until=at)
        assert walked.events_done == done, (at, done, walked.events_done)


@pytest.mark.parametrize("name, policy", [("pools-capture.bin", "torch"), ("pools-mempool.bin", "torch"),
                                          ("pressure-cupy-cycles-fixed.bin", "split")])
def test_what_the_window_cannot_compare_is_not_folded(name, policy):
    """Private-pool events (their pools are not in the policy's fold state) and FREEs held for a request (the
    runtime's hold is not in the window's comparison) make the replay walk in full."""
    trace = Trace.load(os.path.join(ROOT, "traces", name))
    assert Replay(trace, policy, capacity=None)._folder is None
    assert Replay(repeat_steps(Trace.load(os.path.join(ROOT, "traces", "gpt2.bin")), 8), policy,
                  capacity=None)._folder is not None         # the same policy folds a trace without them


# ---- what a long folded run reads, and what it leaves unread ------------------------------------------------
@pytest.mark.parametrize("name", ["__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
                                  "__rtruediv__"])
def test_a_clock_difference_in_other_arithmetic_taints_its_tape_and_gives_the_float(name):
    """A latency (`RecDiff`) added to a total, scaled, divided: the plain float's result and a tainted tape, never
    NotImplemented, on which compiled code raises where Python falls back to the float's own operator (cupy's
    ``_t_malloc += clock - t0`` in a recorded window, compiled)."""
    tape = fold.Tape()
    start = fold.RecFloat.on(1.0, tape, 0)
    d = (start + 0.5) - start
    assert type(d) is fold.RecDiff and not tape.bad
    got = getattr(d, name)(3.0)
    assert type(got) is float and got == getattr(0.5, name)(3.0) and tape.bad
    assert type(-d) is float and -d == -0.5


binades = st.integers(-40, 12)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(e=binades, start=st.sampled_from([1.0, 1 - 2**-52, 1 - 2**-30, 0.75, 1.5, 1.9999999]),
       incs=st.lists(st.one_of(st.floats(0, 1e-3), st.integers(0, 64).map(float), st.just(0.0)), min_size=1,
                     max_size=12),
       shift=st.integers(3, 60), times=st.integers(1, 300))
def test_a_repeat_sums_the_clock_as_the_walk_adds_it(e, start, incs, shift, times):
    """The running totals made in units of the last place (`fold._runs`: whole windows at a time, ties and
    binade crossings among them) are the walk's additions bit for bit, and so is the last of them."""
    start = float(np.ldexp(start, e))
    incs = np.array([x if x < 1 else float(np.ldexp(x, e - shift)) for x in incs])    # ties: multiples of 2**k
    walked = [start]
    for _ in range(times):
        for x in incs.tolist():
            walked.append(walked[-1] + x)
    got = fold._accumulate(start, incs, times)
    assert np.array_equal(np.array(walked).view(np.int64), got.view(np.int64))
    assert fold._total(start, incs, times).hex() == walked[-1].hex()
    memo, totals = {}, [start]      # in two repeats from where the first ended, the second reading the first's memo
    for part in (times // 2, times - times // 2):
        for _, base, offsets in fold._runs(totals[-1], incs, part, memo):
            totals += (offsets[1:] if base is None else (base[:, None] + offsets[None, 1:]).ravel()).tolist()
    assert np.array_equal(np.array(walked).view(np.int64), np.array(totals).view(np.int64))


class _Totals:
    """A device's and a runtime's float totals, as a `Recorder` records them."""

    def __init__(self, clock: float):
        self.clock, self.malloc_time, self.free_time, self.gc_time = clock, 0.0, 0.0, 0.0


def _walk_steps(totals, sections, steps, recorder=None):
    """Walk ``steps`` (each a list of clock increments; after each, its latency and a section's time: the step's
    clock difference) as the engine adds them: the latencies, in order."""
    lat = fold.LatencyTape() if recorder is not None else []
    for incs in steps:
        t0 = totals.clock
        for x in incs:
            totals.clock = totals.clock + x
        lat.append(totals.clock - t0)
        sections.add("step", totals.clock - t0)
    if recorder is not None:
        assert recorder.take_latencies(lat)
    return [float(x) for x in lat]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(steps=st.lists(st.lists(st.one_of(st.floats(0, 1e-3), st.integers(1, 64).map(lambda n: n * 2.0**-40)),
                               min_size=1, max_size=5), min_size=2, max_size=6),
       cut=st.integers(1, 5), k=st.integers(1, 4), e=st.integers(-3, 3), edge=st.sampled_from([0.0, 2**-44, 2**-30]))
def test_a_window_begun_inside_it_adds_what_the_walk_from_there_adds(steps, cut, k, e, edge):
    """`Rotated`: the windows from a boundary inside a recorded window (cut there, `Recorder.pieces`) add, to the
    clock, the latencies and the sections, what the walk from that boundary adds -- the part after the cut, the
    whole window ``k - 1`` times, the part before it, each float as the walk adds it (a clock that crosses a binade
    tells the orders apart); and the counts grow in that order (a segment log's entries)."""
    cut = min(cut, len(steps) - 1)
    start = float(np.ldexp(1.0, e)) - edge
    totals, sections = _Totals(start), Sections()
    recorder = fold.Recorder(totals, totals, sections)
    _walk_steps(totals, sections, steps[:cut], recorder)
    mark = recorder.mark()
    _walk_steps(totals, sections, steps[cut:], recorder)
    window = recorder.stop()
    assume(window is not None)
    rotated = fold.Rotated(recorder, mark, window, middle="middle")
    assert rotated.parts() is not None
    walked, walked_sections = _Totals(totals.clock), Sections()     # the walk from the cut, on from the window's end
    folded, folded_sections, log = _Totals(totals.clock), Sections(), LatencyLog()
    walked_sections.restore(sections.checkpoint()), folded_sections.restore(sections.checkpoint())
    walked_lat = _walk_steps(walked, walked_sections, (steps[cut:] + steps[:cut]) * k)
    rotated.repeat(k, folded, folded, folded_sections, log)
    assert folded.clock.hex() == walked.clock.hex()
    log_walked = LatencyLog()
    log_walked.extend(np.array(walked_lat))
    assert log.count == log_walked.count and log.total().hex() == log_walked.total().hex()
    assert [log.values[c] for c in log._range(0, log.count)] == [log_walked.values[c] for c in
                                                                  log_walked._range(0, log_walked.count)]
    assert folded_sections.stats == walked_sections.stats
    entries = list("abcdef")        # the window's segment log: its counts are positions in it, the cut's among them
    grown = []
    for before, after, times in rotated.advances(0, len(entries), k):
        before, after = (cut if x == "middle" else x for x in (before, after))
        grown += entries[before:after] * times
    assert grown == (entries[cut:] + entries[:cut]) * k


@pytest.mark.parametrize("quiet_first", [False, True])
def test_a_window_begun_at_a_step_without_latencies_adds_what_the_walk_from_there_adds(quiet_first):
    """`Rotated` cut where one side of the cut adds no latency (a step of FREEs only: the clock moves, no malloc is
    timed): both pieces are made (`Recorder.pieces`), and the windows from the cut add the walk's clock and
    latencies."""
    busy, quiet = [[1e-6, 3e-7]], [2.5e-6, 1e-7]
    totals, sections = _Totals(1.0), Sections()
    recorder = fold.Recorder(totals, totals, sections)

    def step(t, part, secs, rec=None):
        if part is quiet:
            for x in quiet:
                t.clock = t.clock + x
            return []
        return _walk_steps(t, secs, part, rec)
    parts = [quiet, busy] if quiet_first else [busy, quiet]
    step(totals, parts[0], sections, recorder)
    mark = recorder.mark()
    step(totals, parts[1], sections, recorder)
    window = recorder.stop()
    rotated = fold.Rotated(recorder, mark, window, middle=None)
    assert window is not None and rotated.parts() is not None
    walked, folded, log = _Totals(totals.clock), _Totals(totals.clock), LatencyLog()
    walked_sections, folded_sections = Sections(), Sections()
    walked_sections.restore(sections.checkpoint()), folded_sections.restore(sections.checkpoint())
    walked_lat = []
    for _ in range(3):
        for part in parts[1:] + parts[:1]:
            walked_lat += step(walked, part, walked_sections)
    rotated.repeat(3, folded, folded, folded_sections, log)
    assert folded.clock.hex() == walked.clock.hex() and folded_sections.stats == walked_sections.stats
    assert [log.values[c] for c in log._range(0, log.count)] == walked_lat


def test_a_run_back_in_its_cycle_at_another_phase_folds_at_once_with_the_window_begun_there(monkeypatch):
    """The small GPT (traces/fold/gpt-fixed, state period 7, a logging step every 50): after the first logging step
    its state comes back at step 55 as one its cycle went through at another phase than its recorded window's start.
    The window recorded from step 15 is kept begun at each of its boundaries (`Folder._rotations`), and the run folds
    from step 55 with it, no window recorded there first; without them it records one there (`_resume`: 7 steps
    walked). Either way the result is the full walk's."""
    trace = real_steps("gpt-fixed", 130)
    runs, reuse, resume = {}, fold.Folder._reuse, fold.Folder._resume
    for rotate in (True, False):
        monkeypatch.setattr(fold, "ROTATE", rotate)
        folds, resumed = [], []

        def reusing(self, here, key, until, folds=folds):
            got = reuse(self, here, key, until)
            if got:
                folds.append((here.mark, type(self.saved[key][0]).__name__))
            return got
        monkeypatch.setattr(fold.Folder, "_reuse", reusing)

        def resuming(self, here, key, until, resumed=resumed):
            got = resume(self, here, key, until)
            if got:
                resumed.append(here.mark)
            return got
        monkeypatch.setattr(fold.Folder, "_resume", resuming)
        r = Replay(trace, "torch")
        runs[rotate] = (r.run().to_dict(), r.folded["steps"], folds, resumed)
    (got, steps, folds, resumed), (plain, plain_steps, plain_folds, plain_resumed) = runs[True], runs[False]
    assert (55, "Rotated") in folds and not resumed, (folds, resumed)
    assert 55 in plain_resumed and all(kind == "Program" for _, kind in plain_folds), (plain_folds, plain_resumed)
    assert steps > plain_steps, (steps, plain_steps)
    got.pop("replay_seconds"), plain.pop("replay_seconds")
    assert got == plain
    assert_folded_is_full(trace, "torch")


def test_the_steps_read_where_asked_answer_as_the_whole_table():
    """`Steps` reads signatures only where a boundary asks: its answers, in any order, are those of the table
    made from every step's signature, and signatures read in pieces are those read at once."""
    rng = np.random.default_rng(3)
    traces = [repeat_steps(load(name), steps) for name, steps in
              [("synthetic-transformer.bin", 200), ("gpt2.bin", 60), ("resnet50.bin", 90), ("cupy_mlp.bin", 60)]]
    traces.append(load("gpt2_variable.bin"))
    for trace in traces:
        whole = fold.Steps(trace)
        sig = whole.read(0, len(whole)).copy()
        table = fold.repeating_steps(sig)
        lazy = fold.Steps(trace)
        for m in rng.permutation(len(lazy)):
            assert lazy.useful(int(m)) == table[m], m
        pieces = fold.Steps(trace)
        for a in rng.permutation(len(pieces)):
            pieces.read(int(a), int(a) + 3)
        assert np.array_equal(pieces.sig, sig)
        assert lazy.known.sum() <= len(lazy)


def test_steps_compared_again_answer_as_compared_afresh():
    """`Steps._equal` keeps the differences it finds, by period, and answers later questions from them: asked in
    any order, every answer is the one the signatures give compared afresh."""
    rng = np.random.default_rng(5)
    for trace in (load("gpt2_variable.bin"), repeat_steps(load("gpt2.bin"), 60)):
        sig = fold.Steps(trace).read(0, len(fold.steps_of(trace))).copy()
        steps, n = fold.Steps(trace), len(sig)
        for _ in range(400):
            p, k = int(rng.integers(1, 9)), int(rng.integers(1, 12))
            a = int(rng.integers(0, n - p - k + 1))
            want = bool((sig[a:a + k] == sig[a + p:a + p + k]).all())
            assert steps._equal(a, a + p, k) == want, (a, p, k)


def shapes_trace(shapes) -> Trace:
    """A trace whose step ``k`` allocates and frees ``shapes[k] // 2 + 1`` objects of ``(shapes[k] + 1)`` pages each:
    shapes 0 and 1 (2 and 3, ...) have one ALLOC count and two signatures."""
    w = TraceWriter(meta={"producer": "test"})
    for s in shapes:
        w.mark("step")
        for i in [w.alloc((s + 1) * 4096) for _ in range(s // 2 + 1)]:
            w.free(i)
    return w.finish()


@settings(max_examples=120, deadline=None)
@given(pattern=st.lists(st.integers(0, 3), min_size=1, max_size=6), laps=st.integers(2, 14),
       changed=st.lists(st.tuples(st.integers(0, 90), st.integers(0, 3)), max_size=4), order=st.randoms())
def test_steps_alike_in_their_counts_answer_as_the_whole_table_read_a_step_at_a_time(pattern, laps, changed, order):
    """Steps alike in their ALLOC counts but not in their signatures, read a step at a time (`SIG_READ` 1: a real
    run's steps are long, and most signatures are not read when a boundary asks), asked in any order: `useful` answers
    as the table of every step's signature (the counts rule no period out: each is compared, `_equal`)."""
    shapes = pattern * laps
    for at, s in changed:
        if at < len(shapes):
            shapes[at] = s
    trace = shapes_trace(shapes)
    whole = fold.Steps(trace)
    table = fold.repeating_steps(whole.read(0, len(whole)).copy())
    asked = order.sample(range(len(shapes)), len(shapes))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fold, "SIG_READ", 1)
        lazy = fold.Steps(trace)
        for m in asked:
            if lazy._table is not None:
                break
            assert lazy.useful(m) == table[m], (m, shapes)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=14))
def test_count_comparisons_answer_as_the_counts_compared(counts):
    """`Steps.counts_repeat` (by the steps where the counts change, kept per period, or directly past
    `COUNT_BREAKS`) and `Steps.counts_repeat_all` (in one gather, or one by one past `COUNTS_AT_ONCE`) say, for
    every ``(q, p, n)``, whether the ``n`` steps from ``q`` have the counts of the ``n`` from ``q + p``, the trace
    holding them."""
    N, c = len(counts), np.array(counts)
    qs = [(q, p, n) for q in range(-2, N + 2) for p in range(1, N + 2) for n in range(1, N + 2)]
    wanted = [q >= 0 and q + n + p <= N and bool((c[q:q + n] == c[q + p:q + p + n]).all()) for q, p, n in qs]
    q, p, n = (np.array(col, np.int64) for col in zip(*qs))
    steps = fold.Steps(steps_trace(counts))
    assert [steps.counts_repeat(*x) for x in qs] == wanted
    for k in range(0, len(qs), 50):        # (in rows of periods and lengths, as `useful` asks)
        assert steps.counts_repeat_all(q[k:k + 50], p[k:k + 50], n[k:k + 50]).tolist() == wanted[k:k + 50]
    def laps(q, p, m):              # whole periods from m whose counts repeat the period before each
        return max(w for w in range((N - m) // p + 1)
                   if not w or all(c[t] == c[t + p] for t in range(q, m + (w - 1) * p)))
    lap_qs = [(q, p, m) for p in range(1, N + 1) for m in range(0, N + 1) for q in range(0, m + 1)]
    assert [steps.repeating_for(*x) for x in lap_qs] == [laps(*x) for x in lap_qs]
    bounded = fold.Steps(steps_trace(counts))
    old = fold.COUNT_BREAKS, fold.COUNTS_AT_ONCE
    try:
        fold.COUNT_BREAKS = fold.COUNTS_AT_ONCE = 0         # nothing kept, nothing gathered at once
        assert [bounded.counts_repeat(*x) for x in qs] == wanted
        assert bounded.counts_repeat_all(q[:50], p[:50], n[:50]).tolist() == wanted[:50]
        assert [bounded.repeating_for(*x) for x in lap_qs] == [laps(*x) for x in lap_qs]
    finally:
        fold.COUNT_BREAKS, fold.COUNTS_AT_ONCE = old


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=10, max_size=60), st.integers(0, 60))
def test_the_period_of_the_steps_breaks_is_the_shortest_their_counts_repeat_with(counts, m):
    """`Steps.long_period` is the shortest period ``p`` whose ``p`` steps from ``m`` hold two ALLOC counts and whose
    ``3p`` steps from ``m`` (at least ``2p``, to the trace's end) have the counts of the steps ``p`` after them."""
    steps = fold.Steps(steps_trace(counts))
    n, want = len(counts), None
    for p in range(1, steps.pmax + 1):
        span = min(3 * p, n - m - p)
        if span < 2 * p:
            break
        if len(set(counts[m:m + p])) > 1 and counts[m:m + span] == counts[m + p:m + p + span]:
            want = p
            break
    assert steps.long_period(m) == want


def steps_trace(counts) -> Trace:
    """A trace whose steps make ``counts`` ALLOCs each."""
    w = TraceWriter(meta={"producer": "test"})
    for c in counts:
        w.mark("step")
        for _ in range(c):
            w.free(w.alloc(512))
    return w.finish()


def test_kind_flags_are_each_records_kind_and_flags():
    """`Trace.kind_flags` (kept by `validate`'s pass, or read when first asked, from records laid out as the file's
    or any other way) is ``kind | flags << 8`` of every record, and the folder's steps read from it what they read
    from the records."""
    trace = Trace.load(os.path.join(ROOT, "traces", "cupy_mlp.bin"))
    assert "kind_flags" in vars(trace)          # kept by the load's validation
    rec = np.asarray(trace.records)
    want = rec["kind"].astype(np.uint16) | (rec["flags"].astype(np.uint16) << 8)
    assert np.array_equal(trace.kind_flags, want)
    other = np.empty(len(rec), dtype=[(n, rec.dtype[n]) for n in reversed(rec.dtype.names)])   # another layout
    for name in rec.dtype.names:
        other[name] = rec[name]
    for records in (rec.copy(), other, rec[::-1][::-1]):
        again = Trace(records, dict(trace.meta), streams=trace.streams, sites=trace.sites, labels=trace.labels)
        assert np.array_equal(again.kind_flags, want)
    flagged = rec.copy()
    flagged["flags"][flagged["kind"] == FREE] |= 64          # IN_REQUEST: what a window's comparison does not see
    for records in (rec, flagged):
        t = Trace(records.copy(), dict(trace.meta), streams=trace.streams, sites=trace.sites, labels=trace.labels)
        both = records["kind"].astype(np.uint16) | (records["flags"].astype(np.uint16) << 8)
        assert np.array_equal(t.kind_flags, both)
        steps = fold.Steps(t)
        assert steps.unseen == bool(((records["kind"] == FREE) & (records["flags"] & 64 != 0)).any())
        assert np.array_equal(steps.marks, np.flatnonzero(records["kind"] == trace_module.ev.MARK))


@pytest.mark.parametrize("kind, unseen", [(trace_module.ev.POOL_BEGIN, True), (trace_module.ev.POOL_RELEASE, True),
                                          (trace_module.ev.GRAPH_REPLAY, False), (trace_module.ev.PHASE_BEGIN, False),
                                          (trace_module.ev.CACHE_RELEASE, False)])
def test_the_steps_see_a_private_pools_kind_in_any_chunk(kind, unseen, monkeypatch):
    """`Steps.unseen` is whether any record is of a private pool's kind (the pools' state is not in a fingerprint),
    in whichever chunk it lies: a kind above the pools' (a graph replay, a phase) is not one, though it passes the
    pass's first, cheaper test (the chunk's largest kind)."""
    monkeypatch.setattr(trace_module, "CHUNK", 64)
    rec = np.asarray(load("cupy_mlp.bin").records).copy()
    marks = np.flatnonzero(rec["kind"] == trace_module.ev.MARK)
    rec["kind"][marks[len(marks) // 2]] = kind          # (a MARK the less: a step joined to the next)
    t = Trace(rec, {})
    assert fold.Steps(t).unseen is unseen


def test_a_long_run_reads_the_steps_it_walks_and_leaves_the_chunks_it_folds(monkeypatch):
    """1,000 steps of a fixed-shape model: the folded replay reads the signatures of the steps near those it
    walks, compares the rest record for record (no event-by-event reading), and converts no chunk it passes. The
    signatures of the steps it passes are known from those comparisons (`Steps.repeated`), each the one read
    afresh."""
    monkeypatch.setattr(trace_module, "CHUNK", 1 << 14)
    replay_module = importlib.import_module("allocsim.engine.replay")      # (the package's `replay` is the function)
    trace = repeat_steps(load("synthetic-transformer.bin"), 1000)
    made, read = [], []
    chunk_init = replay_module._Chunk.__init__
    monkeypatch.setattr(replay_module._Chunk, "__init__", lambda self, *a, **k: made.append(1) or chunk_init(self, *a, **k))
    windows = fold.windows_repeat
    monkeypatch.setattr(fold, "windows_repeat", lambda ev, *a: read.append(len(ev)) or windows(ev, *a))
    full, _ = walk(trace, "torch", fold=False)
    walked = len(made)
    signatures, sig_read = fold.Steps._signatures, []
    monkeypatch.setattr(fold.Steps, "_signatures", lambda self, a, b: sig_read.append(b - a) or signatures(self, a, b))
    folded, how = walk(trace, "torch", fold=True)
    assert folded == full and how["steps"] >= 990
    assert len(made) - walked <= 3 and walked > 60, (len(made), walked)     # the folded walk's: its first, last
    assert sum(read) < 5 * 1100, read                       # the windows before the fold only
    steps = fold.steps_of(trace)
    assert sum(sig_read) < len(steps) // 2, sig_read
    fresh = fold.Steps(trace)
    fresh.read(0, len(fresh))
    assert steps.known.sum() > len(steps) // 2 and (steps.sig[steps.known] == fresh.sig[steps.known]).all()


def test_a_fold_over_0_byte_objects_reads_the_chunks_it_passes(monkeypatch):
    """Steps that allocate 0 bytes: the bypassed requests are counted from the chunks, so a fold does not pass
    them unread, and the counts are the full walk's. (0-byte objects that live past a boundary hold no block
    to be matched by: such a run is not folded.)"""
    monkeypatch.setattr(trace_module, "CHUNK", 64)
    # a small trace's chunks may be kept whole between replays, where a replay keeps them: not here
    monkeypatch.setattr(importlib.import_module("allocsim.engine.replay"), "KEEP_RECORDS", 0, raising=False)
    w = TraceWriter(meta={"producer": "test"})
    carried: list[int] = []
    for k in range(80):
        w.mark(f"step {k}")
        mine = [w.alloc(4096), w.alloc(0), w.alloc(MiB), w.alloc(0)]
        for i in carried:
            w.free(i)
        w.free(mine.pop(1))
        w.free(mine.pop())
        carried = mine
    for i in carried:
        w.free(i)
    trace = w.finish()
    folds = {policy: assert_folded_is_full(trace, policy) for policy in ("split", "torch", "cupy", "bestfit")}
    assert folds["split"] is not None and folds["split"]["steps"] >= 60, folds


@pytest.mark.parametrize("field, at", [("size", 0), ("kind", 3), ("stream", 1), ("id", 2), ("flags", 0), ("id", 0)])
def test_windows_read_record_for_record_end_at_the_first_record_that_differs(field, at):
    """`repeating_records` stops at the first record that is not the one a period before it (kind, flags,
    stream, size; an id a period's ALLOCs more), and reads to the end where every record repeats."""
    trace = repeat_steps(load("synthetic-transformer.bin"), 50)
    rec = np.array(trace.records)
    steps = fold.Steps(trace)
    R, start = int(steps.marks[11] - steps.marks[10]), int(steps.marks[10])
    D = int(steps.counts[10, 0])
    assert fold.repeating_records(fold._words(rec), start + R, R, D, len(rec)) == len(rec)
    x = start + 20 * R + 7 + at
    k = int(rec["kind"][x])
    rec[x][field] = {"size": rec["size"][x] + 512, "kind": FREE if k == ALLOC else ALLOC, "stream": 1,
                     "id": rec["id"][x] + 1, "flags": 1}[field]
    assert fold.repeating_records(fold._words(rec), start + R, R, D, len(rec)) == x


@pytest.mark.parametrize("mutate", ["size", "free"])
@pytest.mark.parametrize("policy", ["torch", "split", "bestfit", "cupy"])
def test_a_step_that_differs_late_in_a_long_run_is_walked(policy, mutate):
    """A step far into the folded run that allocates another size, or frees another object: the fold stops
    there and the result is the full walk's."""
    trace = repeat_steps(load("synthetic-transformer.bin"), 120)
    rec = np.array(trace.records)
    marks = [at for at, _ in trace.marks()]
    lo, hi = marks[80], marks[81]
    kind = rec["kind"][lo:hi]
    if mutate == "size":
        a = lo + int(np.flatnonzero(kind == ALLOC)[5])
        rec["size"][a] += 4096
    else:                   # two FREEs of objects of other sizes swap: each frees the other's object
        frees = lo + np.flatnonzero(kind == FREE)
        sizes = dict(zip(rec["id"][rec["kind"] == ALLOC].tolist(), rec["size"][rec["kind"] == ALLOC].tolist()))
        f0 = int(frees[0])
        f1 = next(int(f) for f in frees if sizes[int(rec["id"][f])] != sizes[int(rec["id"][f0])])
        rec["id"][f0], rec["id"][f1] = rec["id"][f1], rec["id"][f0]
    changed = Trace(rec, dict(trace.meta), streams=trace.streams, labels=trace.labels)
    how = assert_folded_is_full(changed, policy)
    assert how is not None and how["folds"] >= 2, how         # stopped at step 80, folded again after it


def test_a_latency_log_takes_repeated_windows_as_their_sequence():
    rng = np.random.default_rng(1)
    for distinct in (5, 300, 70000):
        values = rng.random(distinct)
        head, window = rng.choice(values, 1000), rng.choice(values, 5000)
        a, b = LatencyLog(), LatencyLog()
        a.extend(head), b.extend(head)
        a.extend_repeated(window, 37)
        b.extend(np.tile(window, 37))
        a.extend(head), b.extend(head)
        assert a.count == b.count and a.summary() == b.summary() and a.total() == b.total()
        assert (a.quantiles([0.1, 0.5, 0.999]) == b.quantiles([0.1, 0.5, 0.999])).all()


# ---- giving up a fold that does not pay (Budget) ----------------------------------------------------------
class Ticks:
    """A clock that moves ``step`` seconds each time it is read."""

    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_the_budget_gives_up_when_the_folder_spends_past_its_slack_and_savings(monkeypatch):
    monkeypatch.setattr(fold, "SLACK", 0.05)
    monkeypatch.setattr(fold, "MIN_EVENTS", 100)
    monkeypatch.setattr(fold, "ALLOWANCE", 250)        # events' walk: 0.25 s at 1 ms an event (below)
    monkeypatch.setattr(fold, "FIRST_LOOKS", 125)      # 0.125 s
    b = fold.Budget(clock=Ticks(1.0), cpu=Ticks(1.0))
    b.leave(b.enter(0), 0, False, 0)            # the folder: 1 s
    for k in range(1, 4):                       # three stretches of 1,000 events walked in 1 s: 1 ms each
        b.walked(1.0, 1000)
        b.leave(b.enter(1000 * k), 1000 * k, False, 0)
    assert not b.over(3000, 0.1)                # three stretches rated: too few to trust the rate
    b.walked(1.0, 1000)
    b.leave(b.enter(4000), 4000, False, 0)      # the folder 5 s so far
    assert b.walk_n == 4000 and b.walk_s == 4.0 and b.spent == 5.0 and b.rate() == 1e-3
    # the whole walk, 4,000 events at a tenth of the steps: 40,000 events, 40 s
    assert b.over(4000, 0.1)                    # 2 s slack + 0.125 s first looks < 5 s spent
    b.saved = 3000                              # folds passed 3,000 events: 3 s saved, + 2.375 s > 5 s
    assert not b.over(4000, 0.1)
    b.saved = 2700                              # 2 s + 2.7 s + 0.25 s < 5 s, but the first looks' stay: + 0.125 s
    assert not b.over(4000, 0.1)
    monkeypatch.setattr(fold, "FIRST_LOOKS", 0)
    assert b.over(4000, 0.1)
    monkeypatch.setattr(fold, "FIRST_LOOKS", 125)
    b.saved = 1                                 # one event passed: 2 s + 1 ms + 0.375 s < 5 s
    assert b.over(4000, 0.1)
    monkeypatch.setattr(fold, "SLACK", 0.12)
    assert not b.over(4000, 0.1)                # 4.8 s slack + 1 ms + 0.375 s allowance > 5 s ...
    b.saved = 0
    assert b.over(4000, 0.1)                    # ... but before the first fold no allowance: 4.8 + 0.125 s < 5 s
    monkeypatch.setattr(fold, "FIRST_LOOKS", 250)
    assert not b.over(4000, 0.1)                # ... only the first looks': 4.8 + 0.25 s > 5 s
    monkeypatch.setattr(fold, "SLACK", 0.05)
    monkeypatch.setattr(fold, "FIRST_LOOKS", 10_000)
    assert not b.over(4000, 0.1)                # ... at most twice the slack: 2 + 4 s > 5 s ...
    b.spent = 6.5
    assert b.over(4000, 0.1)                    # ... and no more: 2 + 4 s < 6.5 s
    b.spent = 5.0
    monkeypatch.setattr(fold, "FIRST_LOOKS", 125)
    b.saved = 1
    monkeypatch.setattr(fold, "ALLOWANCE", 10_000)   # the allowance is at most the slack again: 5 s > 2 + 2.125 s
    assert b.over(4000, 0.1)
    monkeypatch.setattr(fold, "SLACK", None)    # no budget: never
    assert not b.over(4000, 0.1)
    monkeypatch.setattr(fold, "SLACK", 0.05)
    b.walk_n = 99                               # too few events walked to trust the cost of one
    assert not b.over(4000, 0.1)


def test_the_time_another_process_had_the_cpu_is_not_charged_to_the_folder():
    """Each look and each stop is charged the least of the wall time and the thread's CPU time it took: a process
    descheduled in a look (two others busy on two cores) had its folding given up in 7 of 20 runs of a small GPT,
    1 in 20 so (docs/performance.md, 2026-12-03, late night)."""
    wall, cpu = Ticks(1.0), Ticks(1.0)
    b = fold.Budget(clock=wall, cpu=cpu)
    began = b.enter(0)
    wall.now += 5.0                             # another process ran 5 s: the wall clock moved, the thread's did not
    b.leave(began, 0, False, 0)
    assert b.spent == 1.0                       # the look's 1 s of CPU, not its 6 s of wall time
    b.walked(0.5, 500)
    wall.now += 3.0
    began = b.enter(500)                        # a stretch of 4 s wall, 1 s CPU, 0.5 s of it the walk's calls
    assert b.spent == 1.5
    b.leave(began, 500, False, 0)               # (1 s on both clocks)
    assert b.spent == 2.5
    cpu.now += 5.0                              # a CPU clock that ran ahead of the wall: the wall time counts
    b.leave(b.enter(500), 500, False, 0)        # the stop 1 s (not 6), the look 1 s
    assert b.spent == 4.5
    b.walked(3.5, 500, 0.5)                     # the walk's calls descheduled: 3.5 s wall, 0.5 s CPU ...
    wall.now += 3.0
    b.enter(1000)                               # ... of a stretch of 4 s wall, 1 s CPU: the stop is 0.5 s either way
    assert b.spent == 5.0


def test_a_recorded_window_is_charged_beyond_what_walking_it_costs(monkeypatch):
    monkeypatch.setattr(fold, "MIN_EVENTS", 1)
    b = fold.Budget(clock=Ticks(1.0), cpu=Ticks(1.0))
    b.leave(b.enter(0), 0, False, 0)
    b.walked(1.0, 300)
    b.leave(b.enter(300), 300, True, 0)         # 300 events walked plainly in 1 s; then recording
    b.enter(600)                                # 300 events recorded in 1 s: spent, charged back at the rate
    assert (b.walk_n, b.recorded) == (300, 300) and b.spent == 3.0 and b.walk_s == 1.0


def test_stopping_at_a_boundary_is_the_folders_cost_and_the_rate_is_the_steady_walks(monkeypatch):
    """A stretch between two looks costs more than the walk's own calls in it (the stop, the pieces): that is
    charged to the folder, not to the walk's rate; and the rate is the lower quartile of the stretches' (the first
    steps, while the pools grow, cost many times a steady step an event: a mean would credit folds with more
    than they save)."""
    b = fold.Budget(clock=Ticks(1.0), cpu=Ticks(1.0))
    b.leave(b.enter(0), 0, False, 0)            # spent 1 s; the clock reads 2
    b.walked(0.25, 500)                         # the walk's calls: 0.25 s of the 1 s stretch
    b.leave(b.enter(500), 500, False, 0)        # the stretch's other 0.75 s are the folder's, and its own 1 s
    assert b.walk_s == 0.25 and b.walk_n == 500 and b.spent == 2.75
    b.walked(0.1, 100)                          # too short a stretch to be rated alone (short steps) ...
    b.leave(b.enter(600), 600, False, 0)
    assert b.rates == [0.25 / 500]
    b.walked(0.2, 200)                          # ... gathered with the next ones to `STRETCH` events
    b.leave(b.enter(800), 800, False, 0)
    assert b.rates == [0.25 / 500, (0.1 + 0.2) / 300]
    for seconds in (0.01, 0.012, 0.011, 0.5, 0.013, 0.9, 0.014, 0.015):
        b.walked(seconds, 1000)
        b.leave(b.enter(b.walk_n + 1000), b.walk_n + 1000, False, 0)
    assert len(b.rates) == 10 and b.rate() == 0.012 / 1000
    monkeypatch.setattr(fold, "RATES", 4)
    b.walked(0.02, 1000)
    b.leave(b.enter(b.walk_n + 1000), b.walk_n + 1000, False, 0)
    assert len(b.rates) == 4 and b.rate() == 0.015 / 1000          # the last four: 0.9, 0.014, 0.015, 0.02


@pytest.mark.parametrize("policy", ["torch", "split"])
def test_a_folder_that_gives_up_leaves_the_full_walk_and_says_where(monkeypatch, policy):
    """No slack: the folder gives up at its first look past `MIN_EVENTS` and one rated stretch (it spent time and
    saved nothing yet), before its first fold; the replay goes on plainly, and its result is the full walk's."""
    trace = repeat_steps(load("synthetic-transformer.bin"), 30)
    monkeypatch.setattr(fold, "MIN_EVENTS", 1)
    monkeypatch.setattr(fold, "MIN_RATES", 1)
    monkeypatch.setattr(fold, "MIN_RECORDS", 0)         # (a short trace: else it has no folder at all)
    monkeypatch.setattr(fold, "SLACK", 0.0)
    monkeypatch.setattr(fold, "ALLOWANCE", 0)
    r = Replay(trace, policy)
    r.run()
    assert not r._folder.active and r._folder.gave_up_at is not None
    assert r.folded is None and r._folder.gave_up_at < 4      # (unbudgeted, it folds from step 4)
    assert_folded_is_full(trace, policy)
    monkeypatch.setattr(fold, "SLACK", None)
    r = Replay(trace, policy)
    r.run()
    assert r._folder.active and r.folded["steps"] > 20


@pytest.mark.parametrize("policy", ["torch", "cupy"])
def test_a_trace_too_short_for_a_fold_to_pay_has_no_folder_while_the_budget_is_on(monkeypatch, policy):
    """Under `MIN_RECORDS` records a replay makes no folder (its making, looks and stops cost the shipped
    recordings that had one +1 to +103 % over ``--no-fold``, none folding for a gain); at it, and with the budget
    off at any length, one is made and folds. The result is the full walk's either way."""
    short = repeat_steps(load("synthetic-transformer.bin"), 30)
    monkeypatch.setattr(fold, "SLACK", 0.05)
    monkeypatch.setattr(fold, "MIN_RECORDS", len(short) + 1)
    r = Replay(short, policy)
    got = r.run().to_dict()
    assert r._folder is None and r.folded is None
    monkeypatch.setattr(fold, "MIN_RECORDS", len(short))
    assert Replay(short, policy)._folder is not None
    monkeypatch.setattr(fold, "SLACK", None)
    monkeypatch.setattr(fold, "MIN_RECORDS", len(short) + 1)
    folded = Replay(short, policy)
    again = folded.run().to_dict()
    assert folded.folded is not None and folded.folded["steps"] > 20
    for d in (got, again):
        d.pop("replay_seconds"), d.pop("load_seconds")
    assert got == again


def test_the_shipped_recordings_get_no_folder_and_a_long_run_does(monkeypatch):
    """With the budget on and `MIN_RECORDS` as shipped: a shipped recording that folded 3 of its 7 steps, each slower
    for it, gets no folder; 100 steps of the synthetic transformer (about 100k records) get one."""
    monkeypatch.setattr(fold, "SLACK", 0.05)
    assert fold.MIN_RECORDS == 1 << 16
    assert Replay(load("pressure-fraction-oom.bin"), "torch")._folder is None
    assert Replay(repeat_steps(load("synthetic-transformer.bin"), 100), "torch")._folder is not None


def test_a_checkpoint_taken_where_a_recorded_window_ends_holds_plain_floats():
    """`run(until=...)` can stop exactly where a recorded window ends (fit's probes do): the checkpoint then stops
    the recording first, so neither the copy nor a replay resumed from it adds to the recorder's tape."""
    trace = repeat_steps(load("synthetic-transformer.bin"), 60)
    ends = []
    try_ = fold.Folder._try

    def spy(self, i, j, key, until):
        started = try_(self, i, j, key, until)
        if started:
            ends.append(self.rec[1])
        return started
    fold.Folder._try = spy
    try:
        Replay(trace, "torch").run()
    finally:
        fold.Folder._try = try_
    r = Replay(trace, "torch")
    r.run(until=ends[0])
    state = r.checkpoint()
    assert r._folder.rec is None and type(r.device.clock) is float and type(state.device.clock) is float
    resumed = Replay(trace, "torch", fold=False)
    resumed.resume(state)
    assert resumed.run() == Replay(trace, "torch", fold=False).run() == r.run()


def test_stepping_never_looks_at_the_boundaries():
    """`step` never folds: the folder is not asked at each boundary (it was, fingerprinting every one for nothing)."""
    trace = repeat_steps(load("synthetic-transformer.bin"), 20)
    r = Replay(trace, "torch")
    calls = []
    at = r._folder.at
    r._folder.at = lambda *a: calls.append(1) or at(*a)
    while not r.at_end:
        r.step(64)
    assert calls == [] and r.folded is None
    assert r.finish() == Replay(trace, "torch", fold=False).run()


# ---- a window recorded through the policy's fused loop (`Policy.fused_tape`) ------------------------------
def recorded(trace, policy, monkeypatch, *, tape: bool):
    """A folded replay's recorded windows (`Program`s), how many events each kind of walk drove while a window was
    recorded (the fused loop onto the tape; the plain walk), and the replay's result and state. ``tape`` False:
    the windows are recorded plainly, as before the fused loops could record."""
    programs, drove = [], {"fused": 0, "plain": 0}
    fold_window, walk_fused, walk_plain = fold.Folder._fold_window, Replay._walk_fused, Replay._walk_plain

    def spy_window(self, program, rec, until):      # (the windows', not the lap journal's stretches)
        programs.append(program)
        return fold_window(self, program, rec, until)

    def spy_fused(self, c, lo, hi, lat, tape=None):
        if tape is not None:
            drove["fused"] += hi - lo
        return walk_fused(self, c, lo, hi, lat, tape)

    def spy_plain(self, c, lo, hi, lat_append):
        if self._folder is not None and self._folder.rec is not None:
            drove["plain"] += hi - lo
        return walk_plain(self, c, lo, hi, lat_append)
    with monkeypatch.context() as m:
        m.setattr(fold.Folder, "_fold_window", spy_window)
        m.setattr(Replay, "_walk_fused", spy_fused)
        m.setattr(Replay, "_walk_plain", spy_plain)
        if not tape:
            m.setattr(Policy, "fused_tape", lambda self: False)
        got, how = walk(trace, policy, fold=True)
    return programs, drove, got, how


def released_every_step(steps: int) -> Trace:
    """Steps that release the cache at their end: each step's first request misses the pools (a segment again)."""
    w = TraceWriter(meta={"producer": "test"})
    for k in range(steps):
        w.mark(f"step {k}")
        big, small = w.alloc(3 * MiB), w.alloc(4096)
        w.free(big)
        w.free(w.alloc(2 * MiB))
        w.free(small)
        w.record(CACHE_RELEASE)
    return w.finish()


@pytest.mark.parametrize("policy", ["split", "bestfit", "cupy"])
def test_a_loop_records_the_call_out_it_makes_onto_the_tape(policy):
    """`split`'s, `bestfit`'s and `cupy`'s fused loops serve a miss themselves, also on a tape: the call's additions
    (the device's malloc) go onto the tape through the clock, a `RecFloat` around the call, and that request's
    latency is a `RecDiff` from before its first increment to after the call (`Tape.between`); a request served from
    the pools is one increment, its end noted. The window's `Program` gives the untaped loop's clock and latencies.
    `cupy`'s miss path times itself from the clock (``_t_malloc``, as its plain `malloc` does): that taints the tape,
    so such a window is not folded, in the loop as in the plain walk."""
    events = [(0, ALLOC, 1, 3 * MiB, 0), (1, FREE, 1, 0, 0), (2, ALLOC, 2, 4096, 0), (3, ALLOC, 3, 2 * MiB, 0),
              (4, FREE, 3, 0, 0), (5, ALLOC, 4, 2 * MiB, 0)]
    runs = []
    for taped in (False, True):
        r = Replay(released_every_step(1), policy, fold=False)
        dev, loop = r.device, r.policy.fused_loop()
        start = float(dev.clock)
        recorder = fold.Recorder(dev, r.runtime, r.sections) if taped else None
        tape, lat = (recorder.clock_tape, fold.LatencyTape()) if taped else (None, array("d"))
        assert loop(iter(events), {}, lat, 0, dev, lambda j, h: False, *([tape] if taped else []))[0] is None
        runs.append((start, lat, float(dev.clock), recorder))
    (start, plain, clock, _), (_, lat, taped_clock, recorder) = runs
    assert [float(x) for x in lat] == list(plain) and taped_clock == clock
    if policy == "cupy":
        assert recorder.clock_tape.bad and recorder.stop() is None
        return
    calls = [type(x) is fold.RecDiff for x in lat]
    assert calls[0] and calls.count(False) >= 2, calls     # the first request escalates; the last is a hit
    assert recorder.take_latencies(lat)
    program = recorder.stop()
    assert program is not None and program.lat[0][0] == 0 and program.lat[0][1] > 1     # the call's additions
    totals = fold._accumulate(start, program.incs["clock"])
    assert totals[-1] == clock
    assert (totals[program.lat[:, 1]] - totals[program.lat[:, 0]]).tolist() == list(plain)


@pytest.mark.parametrize("policy", ["torch", "split", "bestfit", "cupy"])
@pytest.mark.parametrize("name", ["transformer", "released"])
def test_a_window_the_fused_loop_records_is_the_window_recorded_plainly(name, policy, monkeypatch):
    """The fused loops record a window onto the clock's tape: the same increments, latencies (as positions on it) and
    sections as the plain walk's recording, so the same folds and the full walk's result. The release itself is
    handed back to the plain walk, and so, by `torch`, is a request its pools cannot serve (a miss after each cache
    release); the others serve it in the loop, the call adding onto the tape (`Tape.between`). The recorder follows
    either on the same tape."""
    if name == "released" and policy != "torch":
        pytest.skip(f"{policy} does not fold steps that release its cache (its addresses are never handed out "
                    "again); a call out on a tape: test_a_loop_records_the_call_out_it_makes_onto_the_tape")
    trace = repeat_steps(load("synthetic-transformer.bin"), 30) if name == "transformer" else released_every_step(40)
    with_tape = recorded(trace, policy, monkeypatch, tape=True)
    plainly = recorded(trace, policy, monkeypatch, tape=False)
    assert with_tape[0] and len(with_tape[0]) == len(plainly[0]) and None not in with_tape[0]
    for a, b in zip(with_tape[0], plainly[0]):
        assert a.incs.keys() == b.incs.keys() and all(np.array_equal(a.incs[k], b.incs[k]) for k in a.incs)
        assert np.array_equal(a.lat, b.lat) and a.by_key == b.by_key
    assert with_tape[1]["fused"] > 0 and plainly[1]["fused"] == 0
    assert (with_tape[1]["plain"] > 0) == (name == "released")      # a miss, a release: walked plainly
    assert with_tape[2] == plainly[2] and with_tape[3] == plainly[3] and with_tape[3]["steps"] > 20
    assert_folded_is_full(trace, policy)


@pytest.mark.parametrize("options", [[], ["garbage_collection_threshold:0.6"]])
def test_a_fused_loop_recording_hands_a_miss_back_undone(options):
    """On a tape, a request the pools cannot serve is handed back before anything changes: its index, the clock the
    tape's latest total of the same value, the GC threshold's clocks and ``allocated`` as they were, no latency;
    the requests before it are on the tape, one increment each, and the ALLOC's latency ends on the first."""
    r = Replay(released_every_step(1), "torch", options=options, cap=256 * MiB, fold=False)
    pol, dev = r.policy, r.device
    assert pol.fused_tape() and pol.gc_on() == bool(options)
    handles, loop = {}, pol.fused_loop()
    loop(iter([(0, ALLOC, 1, 4096, 0), (1, FREE, 1, 0, 0)]), handles, array("d"), 0, dev, lambda j, h: False)
    tape, lat = fold.Tape(), fold.LatencyTape()
    dev.clock = tape.at(float(dev.clock))
    start = float(dev.clock)

    def never(j, h):
        pytest.fail("a miss on a tape is handed back, not served")
    assert loop(iter([(2, ALLOC, 2, 4096, 0), (3, FREE, 2, 0, 0)]), handles, lat, 0, dev, never, tape)[0] is None
    served = (float(dev.clock), list(pol.gfb_calls), pol.allocated, dev.n_malloc)
    j, _ = loop(iter([(4, ALLOC, 3, 64 * MiB, 0), (5, FREE, 3, 0, 0)]), handles, lat, 0, dev, never, tape)
    assert j == 4 and not handles
    assert (float(dev.clock), list(pol.gfb_calls), pol.allocated, dev.n_malloc) == served
    assert list(tape.incs) == [pol._hit_s, pol._free_s] and list(tape.latency_ends) == [1.0] and not tape.bad
    assert lat == [(start + pol._hit_s) - start] and type(lat[0]) is float
    assert isinstance(dev.clock, fold.RecFloat) and dev.clock.tape is tape and dev.clock.n == 2


def test_only_the_class_that_defines_the_fused_loop_says_it_records_onto_a_tape():
    """`Policy.fused_tape`: the four fused loops record (`torch`, `split`, `bestfit`, `cupy`); a policy with no fused
    loop does not (`cupy` with ``track_total``); a subclass with a loop of its own is not taken to record because the
    class it derives from says its loop does."""
    trace = released_every_step(2)
    assert all(Replay(trace, p).policy.fused_tape() for p in ("torch", "split", "bestfit", "cupy"))
    assert not Replay(trace, "cupy", options=["track_total=true"]).policy.fused_tape()
    torch_class = type(Replay(trace, "torch").policy)

    class OwnLoop(torch_class):
        def walk_chunk(self, events, handles, lat, peak, dev, served):
            return torch_class.walk_chunk(self, events, handles, lat, peak, dev, served)
        malloc, free = torch_class.malloc, torch_class.free
    OwnLoop.__module__ = "elsewhere"
    own = OwnLoop.__new__(OwnLoop)
    assert own.fused_loop() is not None and not own.fused_tape()


def test_a_fold_that_lands_inside_a_chunk_reads_that_chunk_from_where_it_lands(monkeypatch):
    """A fold passes the records before where it lands unread: the chunks wholly before, and the part before it of
    the chunk it lands in, read from there on in pieces of `LANDING` records, each piece after twice the one before,
    to the chunk's own end; the result is the full walk's."""
    replay_module = importlib.import_module("allocsim.engine.replay")
    monkeypatch.setattr(trace_module, "CHUNK", 1 << 14)
    monkeypatch.setattr(replay_module, "KEEP_RECORDS", 0)      # (a small trace's chunks are kept whole: not here)
    monkeypatch.setattr(replay_module, "LANDING", 1 << 8)      # (pieces of 256, 512, ... records before a chunk's end)
    trace = real_steps("gpt-eval50", 130)
    read, landed = [], []
    driving, move_to = replay_module.driving, Replay.move_to

    def spy_driving(*a, **k):
        for start, rec, local in driving(*a, **k):
            read.append((start, start + len(rec)))
            yield start, rec, local
    monkeypatch.setattr(replay_module, "driving", spy_driving)
    monkeypatch.setattr(Replay, "move_to", lambda self, at, passed=None: (
        passed is not None and landed.append(at)) or move_to(self, at, passed))
    how = assert_folded_is_full(trace, "torch")
    chunk = trace_module.CHUNK
    inside = [(a, b) for a, b in read if a % chunk]
    assert how["folds"] >= 2 and inside, (how, read)
    assert any(a in landed for a, _ in inside)
    for (a0, b0), (a, b) in zip([(0, 0)] + read, read):
        end = min(len(trace), (a // chunk + 1) * chunk)     # the end of the chunk a piece starts in
        assert b <= end, (a, b)
        if a % chunk and a in landed:
            assert b - a == min(replay_module.LANDING, end - a), (a, b)
        elif a % chunk:                                     # the piece after one: twice as long, to the chunk's end
            assert a == b0 and b - a == min(2 * (b0 - a0), end - a), ((a0, b0), (a, b))
        else:
            assert b == end                                 # a chunk not landed in is read whole
    assert any(b - a == 2 * (b0 - a0) for (a0, b0), (a, b) in zip(read, read[1:]) if a == b0 and a % chunk)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n=st.integers(1, 400), chunk=st.sampled_from([16, 64, 100]), landing=st.sampled_from([1, 3, 8]))
def test_a_landing_read_in_pieces_drives_what_the_chunks_rest_read_whole_drives(monkeypatch, data, n, chunk, landing):
    """Records with 0-byte objects (some freed twice, some FREEs of no object), a fold's landing anywhere: `driving`
    reading the records from the landing in pieces gives the driving events and the bypassed 0-byte events that
    reading each chunk's rest whole gives."""
    replay_module = importlib.import_module("allocsim.engine.replay")
    rec = np.zeros(n, fold.RECORD_DTYPE)
    live, nid = [], 0
    for x in range(n):
        r = data.draw(st.integers(0, 9))
        if r < 4 or not live:
            rec[x] = (ALLOC, 0, 0, nid, 0, 0, data.draw(st.sampled_from([0, 512])), 0, 0)
            live.append(nid)
            nid += 1
        elif r < 8:
            i = live[data.draw(st.integers(0, len(live) - 1))]
            if data.draw(st.booleans()):
                live.remove(i)              # (else freed again later: an invalid trace read alike either way)
            rec[x] = (FREE, 0, 0, i, 0, 0, 0, 0, 0)
        else:
            rec[x] = (fold.MARK, 0, 0, fold.NO_ID, 0, 0, 0, 0, 0)
    trace = Trace(rec, {})
    skip = data.draw(st.integers(0, n))
    monkeypatch.setattr(trace_module, "CHUNK", chunk)
    got = {}
    for size in (landing, n + 1):           # pieces; a piece as long as any chunk's rest
        monkeypatch.setattr(replay_module, "LANDING", size)
        zero_counts: list = []
        driven = [(start + local).tolist() for start, _, local in replay_module.driving(trace, zero_counts, [skip])]
        bypassed = [list(zip(at.tolist(), is_alloc.tolist())) for at, is_alloc in zero_counts]
        got[size] = (sum(driven, []), sum(bypassed, []))
    assert got[landing] == got[n + 1]


@pytest.mark.parametrize("policy, tape", [("torch", True), ("split", True), ("bestfit", True), ("split", False)])
def test_a_window_the_fused_loop_records_is_counted_as_walking_and_one_walked_plainly_is_charged(policy, tape,
                                                                                                monkeypatch):
    """The folder's account (`Budget`): a window a fused loop records onto the tape walks at the walk's own pace, its
    pieces counted as walked (rated, nothing charged back); one recorded plainly (a loop that does not record, as a
    plug-in's: here `Policy.fused_tape` made False) has its whole time charged to the folder, less its events at
    the walk's rate."""
    if not tape:
        monkeypatch.setattr(Policy, "fused_tape", lambda self: False)
    trace = repeat_steps(load("synthetic-transformer.bin"), 30)
    marks, pieces = [], []
    leave, walked = fold.Budget.leave, fold.Budget.walked
    monkeypatch.setattr(fold.Budget, "leave", lambda self, began, done, recording, passed: (
        marks.append(recording), leave(self, began, done, recording, passed))[1])
    monkeypatch.setattr(fold.Budget, "walked", lambda self, seconds, events, cpu=None: (
        pieces.append(events), walked(self, seconds, events, cpu))[1])
    r = Replay(trace, policy)
    r.run()
    assert r.folded["steps"] > 20 and r.records_fused == tape
    assert any(marks) == (not tape) and (r._folder.budget.recorded > 0) == (not tape)
    full = Replay(trace, policy, fold=False).run().driving_events
    assert sum(pieces) + r._folder.budget.recorded + r.folded["events"] == full


def test_splits_fold_state_tells_apart_each_field_it_holds():
    """`split`'s `fold_state` (its rows packed into machine words) changes with every field of a block it holds (size,
    free state, whether a piece lies before or after it), with the order the freed blocks wait in and with
    ``allocated``, and comes back when they do."""
    trace = repeat_steps(load("synthetic-transformer.bin"), 6)
    r = Replay(trace, "split", fold=False)
    r.run(until=int(fold.steps_of(trace).marks[4]) + 40)       # (inside a step: some blocks wait in `freed`)
    pol, held = r.policy, list(r.handles.values())
    base = pol.fold_state(held)
    free = [b for b in range(1, pol._next_id) if pol._fsize[b]]
    assert free and held and pol._freed, (len(free), len(pol._freed))
    for b in (free[0], held[0]):
        for column, value in ((pol._size, pol._size[b] + 512), (pol._fsize, -1 if pol._fsize[b] != -1 else 0),
                              (pol._prev, 0 if pol._prev[b] else b), (pol._next, 0 if pol._next[b] else b)):
            old = column[b]
            column[b] = value
            assert pol.fold_state(held) != base, (b, value)
            column[b] = old
    pol._freed.append(pol._freed[0])
    assert pol.fold_state(held) != base
    pol._freed.pop()
    pol.allocated += 512
    assert pol.fold_state(held) != base
    pol.allocated -= 512
    assert pol.fold_state(held) == base


@pytest.mark.parametrize("policy", ["torch", "split"])
def test_the_live_objects_are_named_by_the_addresses_their_blocks_have(policy):
    """`Policy.addresses` where a policy says it itself (torch reads each block's field, split its address column)
    is `block`'s address for
    every held object, and a subclass that says where its blocks lie itself is asked (the others take the default,
    which is `block`'s)."""
    trace = load("synthetic-transformer.bin")
    r = Replay(trace, policy, fold=False)
    r.run(until=len(trace) // 2)
    pol = r.policy
    assert len(r.handles) > 10
    assert pol.addresses(r.handles) == {i: pol.block(h)[0] for i, h in r.handles.items()}

    class Elsewhere(type(pol)):
        def block(self, handle):
            return 4096, 1
    Elsewhere.__module__ = "elsewhere"
    other = Elsewhere.__new__(Elsewhere)
    assert set(other.addresses(r.handles).values()) == {4096}


def test_a_cycle_state_whose_window_differs_at_every_break_is_not_resumed_from_again(monkeypatch):
    """GPT-2 small (traces/fold/gpt2s-fixed, period 2): after each logging step the state is one of the folded
    cycle's, but two old objects lie in each other's blocks, so its window is not the cycle's; the resume from that
    state is tried `RESUME_TRIES` times, then no more (the reuse a step later folds the run); the boundaries where
    the run comes back read no step signature (`Folder._coming_back`: those are read before the first fold only);
    the result is the full walk's. (Without the windows kept from each cycle state, `Folder._rotations`: with them,
    the run comes back to a state saved, and a reuse is asked there before a resume.)"""
    monkeypatch.setattr(fold, "ROTATE", False)
    trace = real_steps("gpt2s-fixed", 160)
    tried, read, folds = [], [], []
    resume, signatures, skip = fold.Folder._resume, fold.Steps._signatures, fold.Folder._skip
    monkeypatch.setattr(fold.Folder, "_resume", lambda self, here, key, until: (
        tried.append((here.mark, key)), resume(self, here, key, until))[1])
    monkeypatch.setattr(fold.Steps, "_signatures", lambda self, a, b: (
        read.append(len(folds)), signatures(self, a, b))[1])
    monkeypatch.setattr(fold.Folder, "_skip", lambda self, *a, **k: (folds.append(1), skip(self, *a, **k))[1])
    r = Replay(trace, "torch")
    r.run()
    assert len(folds) >= 3 and read and set(read) == {0}, (folds, read)
    differed = {key for key, n in r._folder.unlike.items() if n}
    assert r.folded["folds"] >= 3 and differed, (r.folded, r._folder.unlike)
    assert all(r._folder.unlike[key] == sum(k == key for _, k in tried) == fold.RESUME_TRIES for key in differed)
    assert_folded_is_full(trace, "torch")


def both_reuses(monkeypatch) -> list:
    """Make every reuse the records tell (`Folder._reused_by_records`) also be told by the events gathered
    (`Folder._reused_by_events`, the plain comparison kept beside it): the pairs of answers, as the walk goes."""
    answers = []
    by_records, by_events = fold.Folder._reused_by_records, fold.Folder._reused_by_events

    def both(self, here, key, until):
        got = by_records(self, here, key, until)
        if got is not None:
            answers.append((here.mark, got, by_events(self, here, key, until)))
        return got
    monkeypatch.setattr(fold.Folder, "_reused_by_records", both)
    return answers


@pytest.mark.parametrize("name, steps, policy", [("gpt-eval50", 130, "torch"), ("gpt-eval50", 130, "split"),
                                                 ("gpt2s-fixed", 160, "torch"), ("gpt2s-fixed", 160, "cupy")])
def test_a_reuse_told_record_for_record_answers_as_the_events_compared(monkeypatch, name, steps, policy):
    """A reuse asks the records first (`RecordView`: two strided comparisons, the live ids renamed by arithmetic)
    and gathers the events only where those cannot tell: on real runs, at every reuse, the two give the same
    windows, end and new names, or both refuse; the records tell at least one fold; the result is the full
    walk's."""
    answers = both_reuses(monkeypatch)
    assert_folded_is_full(real_steps(name, steps), policy)
    assert any(got for _, got, _ in answers), answers
    for mark, got, plain in answers:
        assert got == plain, (mark, got, plain)


def test_a_reuse_whose_live_object_holds_a_block_nobody_held_after_the_recorded_window_is_refused(monkeypatch):
    """A reuse told by the events gathered (`Folder._reused_by_events`, the records kept out) whose boundary has one
    more live object, in a block no object held at the recorded window's end: its windows repeat, but that object
    cannot be named after them, so the reuse is refused (False, not a crash), and the walk goes on to the full walk's
    result."""
    monkeypatch.setattr(fold.Folder, "_reused_by_records", lambda self, here, key, until: None)
    asked, by_events = [], fold.Folder._reused_by_events

    def stranger(self, here, key, until):
        addr = dict(here.addr)
        addr[max(addr, default=0) + (1 << 20)] = max(addr.values(), default=0) + (1 << 40)
        asked.append(by_events(self, fold.Boundary(here.at, here.mark, addr), key, until))
        return by_events(self, here, key, until)
    monkeypatch.setattr(fold.Folder, "_reused_by_events", stranger)
    assert_folded_is_full(real_steps("gpt-eval50", 130), "torch")
    assert asked and not any(asked), asked


@pytest.mark.parametrize("name, steps, policy", [("gpt-eval50", 130, "torch"), ("gpt2s-fixed", 160, "cupy"),
                                                 ("gpt2s-eval50", 120, "split")])
def test_a_recorded_windows_live_ids_renamed_by_arithmetic_are_those_its_events_give(monkeypatch, name, steps,
                                                                                    policy):
    """Where every window a recorded window's fold skips was told by its records, the live ids are renamed by the
    windows' growth (the ids are one run a window): the names `Folder.renaming` gives from the events gathered,
    at every such fold; and the result is the full walk's."""
    told, end_window, skip = [], fold.Folder._end_window, fold.Folder._skip

    def ending(self, x, until):
        self._ending = True
        try:
            return end_window(self, x, until)
        finally:
            self._ending = False

    def skipping(self, program, k, before, after, start, end, P, how, zero, rename=None):
        if getattr(self, "_ending", False) and rename is not None:
            plain = self.renaming(start, end, P)
            told.append(rename == {i: plain.get(i, i) for i in self.r.handles if plain.get(i, i) != i})
        return skip(self, program, k, before, after, start, end, P, how, zero, rename)
    monkeypatch.setattr(fold.Folder, "_end_window", ending)
    monkeypatch.setattr(fold.Folder, "_skip", skipping)
    assert_folded_is_full(real_steps(name, steps), policy)
    assert told and all(told), told


def test_windows_told_event_by_event_past_the_records_rename_from_the_events(monkeypatch):
    """A recording whose ids jump by one midway (objects allocated from step 30 on take the next id): the records
    stop repeating there (their ids are not a window's growth more), the events go on, so the fold's windows past
    it are told event by event and its live ids cannot be renamed by arithmetic: the result is the full walk's."""
    trace = real_steps("gpt-eval50", 130)
    rec = np.array(trace.records)
    x = int(fold.Steps(trace).marks[30])
    later = rec["kind"][:x] == ALLOC
    jump = int(rec["id"][:x][later].max()) + 1          # ids allocated from step 30 on
    moved = (np.arange(len(rec)) >= x) & (rec["id"] != 0xFFFFFFFF) & (rec["id"] >= jump)
    rec["id"][moved] += 1
    told, windows = [], fold.Folder._windows
    monkeypatch.setattr(fold.Folder, "_windows", lambda self, lo, first, P, k, new_end, until: (
        told.append((k, windows(self, lo, first, P, k, new_end, until)[0])), windows(self, lo, first, P, k, new_end,
                                                                                     until))[1])
    assert_folded_is_full(Trace(rec, dict(trace.meta), streams=trace.streams, labels=trace.labels), "torch")
    assert any(after > before for before, after in told), told


def both_resumes(monkeypatch) -> list:
    """Make every resume the records tell (`RecordView.compare` of a cycle state's window) also be told by the events
    gathered (`Folder._resumed_by_events`): the pairs of answers, the window `Folder._resume` starts to record
    (its events, where it ends, whether it allocates 0 bytes) or False, as the walk goes. (Without the windows kept
    from each cycle state, `Folder._rotations`, which fold where a resume would be asked.)"""
    monkeypatch.setattr(fold, "ROTATE", False)
    answers, told = [], {}
    compare, resume = fold.RecordView.compare, fold.Folder._resume

    def comparing(self, folder, here):
        got = compare(self, folder, here)
        if self.windows == 1:
            told[here.mark] = got
        return got

    def resuming(self, here, key, until):
        told.clear()
        b, p = self.cycles[key]
        started = resume(self, here, key, until)
        if told.get(here.mark) is not None:
            answers.append((here.mark, started and (self.rec[5], self.rec[1], self.rec[7]),
                            self._resumed_by_events(here, b, p)))
        return started
    monkeypatch.setattr(fold.RecordView, "compare", comparing)
    monkeypatch.setattr(fold.Folder, "_resume", resuming)
    return answers


def test_a_state_whose_old_objects_lie_swapped_is_not_resumed_until_its_own_cycle_is_tried(monkeypatch):
    """GPT-2 small under `cupy` (a period of 12 steps): after its logging step the state is a cycle state's but for
    two old objects in each other's blocks, and so is every state after it for a period. The first resume refused so
    (`RecordView.compare`, `Folder.swapped`) stops the resumes until a period later, where the walk's own cycle is
    tried from that boundary and folded; the result is the full walk's."""
    swapped, resumed, tried = [], [], []
    mark, resume, try_ = fold.Folder.swapped, fold.Folder._resume, fold.Folder._try
    monkeypatch.setattr(fold.Folder, "swapped", lambda self, m, p: (swapped.append((m, p)), mark(self, m, p))[1])
    monkeypatch.setattr(fold.Folder, "_resume", lambda self, here, key, until: (
        resumed.append(here.mark), resume(self, here, key, until))[1])
    monkeypatch.setattr(fold.Folder, "_try", lambda self, i, j, key, until: (
        tried.append((i.mark, j.mark)), try_(self, i, j, key, until))[1])
    assert_folded_is_full(real_steps("gpt2s-fixed", 100), "cupy")
    assert swapped and resumed, (swapped, resumed)
    m, p = swapped[0]
    assert not [r for r in resumed if m < r < m + p], (swapped, resumed)
    assert (m, m + p) in tried, (swapped, tried)


def zero_byte_temporaries(trace: Trace) -> Trace:
    """``trace`` with the third object of each step that is freed within it made a 0-byte ALLOC (the replay bypasses
    it: a fold that passes such requests must count them)."""
    rec = np.array(trace.records)
    marks = list(fold.Steps(trace).marks) + [len(rec)]
    for lo, hi in zip(marks, marks[1:]):
        kind, ids = rec["kind"][lo:hi], rec["id"][lo:hi]
        freed = set(ids[kind == FREE].tolist())
        temps = [x for x in np.flatnonzero(kind == ALLOC).tolist() if int(ids[x]) in freed]
        if len(temps) > 2:
            rec["size"][lo + temps[2]] = 0
    return Trace(rec, dict(trace.meta), streams=trace.streams, labels=trace.labels)


@pytest.mark.parametrize("name, steps, policy, starts", [("gpt-eval50", 130, "torch", True),
                                                         ("gpt2s-fixed", 160, "cupy", False)])
@pytest.mark.parametrize("zero", [False, True])
def test_a_resume_told_record_for_record_answers_as_the_events_compared(monkeypatch, name, steps, policy, starts,
                                                                        zero):
    """A resume from a cycle state asks the records first (`RecordView` of the state's window) and gathers the
    events only where those cannot tell: on real runs (and with a 0-byte temporary each step) the two answer alike
    at every resume (the window's events, its end, its 0-byte ALLOCs), or both refuse (two old objects in each
    other's blocks after a logging step: GPT-2 small's every resume); the result is the full walk's."""
    answers = both_resumes(monkeypatch)
    trace = real_steps(name, steps)
    assert_folded_is_full(zero_byte_temporaries(trace) if zero else trace, policy)
    assert answers and any(got for _, got, _ in answers) == starts, answers
    assert not (zero and starts) or any(got and got[2] for _, got, _ in answers), answers
    for mark, got, plain in answers:
        assert got == plain, (mark, got, plain)


def change_one(rec: np.ndarray, lo: int, hi: int, field: str, data) -> int:
    """Change one record among ``lo`` to ``hi`` (drawn): a FREE's object to another FREE's (``id``), an ALLOC to a
    FREE or back (``kind``), or its size, stream or flags: the position changed."""
    at = data.draw(st.integers(lo, hi - 1))
    if field == "id":
        frees = np.flatnonzero(rec["kind"][lo:hi] == FREE) + lo
        at = int(frees[np.searchsorted(frees, at) % len(frees)])
        rec["id"][at] = rec["id"][data.draw(st.sampled_from(frees.tolist()))]
    elif field == "kind":
        rec["kind"][at] = {ALLOC: FREE, FREE: ALLOC}.get(int(rec["kind"][at]), FREE)
    else:
        rec[field][at] += {"size": 512, "stream": 1, "flags": 1}[field]
    return at


def both_tries(monkeypatch) -> list:
    """Make every first window (`Folder._try`) and every resumed window's end the records tell
    (`RecordView.repeats_at`) also be told by the events gathered (`Folder._tried_by_events`,
    `Folder._resumed_end_by_events`): the pairs of answers, ``(P, end, zero)`` or False (a resumed end's ``zero`` is
    not compared: it was known when the window started), as the walk goes."""
    answers = []
    try_, end_window, repeats_at = fold.Folder._try, fold.Folder._end_window, fold.RecordView.repeats_at

    def trying(self, i, j, key, until):
        view = fold.RecordView.of(self, i, j.mark - i.mark)
        got = view.repeats_at(self, j, 1) if view is not None else None
        if got is not None:
            answers.append(("try", j.mark, got, self._tried_by_events(i, j)))
        return try_(self, i, j, key, until)

    def ending(self, x, until):
        self._walked = self.rec[3] if self.rec[2] is None else None
        return end_window(self, x, until)

    def telling(self, folder, here, more):
        got = repeats_at(self, folder, here, more)
        if more == 0 and got is not None:
            plain = folder._resumed_end_by_events(folder._walked, here, self.P)
            answers.append(("end", here.mark, got and got[:2], plain and plain[:2]))
        return got
    monkeypatch.setattr(fold.Folder, "_try", trying)
    monkeypatch.setattr(fold.Folder, "_end_window", ending)
    monkeypatch.setattr(fold.RecordView, "repeats_at", telling)
    return answers


@pytest.mark.parametrize("name, steps, policy", [("gpt-eval50", 130, "torch"), ("gpt-eval50", 130, "cupy"),
                                                 ("gpt2s-fixed", 60, "cupy"), ("resnet18-eval100", 130, "split")])
def test_a_first_window_told_record_for_record_answers_as_the_events_compared(monkeypatch, name, steps, policy):
    """A first window (`Folder._try`: the window from a boundary with an earlier one's state, and the one after
    it, repeat the earlier one's) and a resumed window's end ask the records first and gather the events only where
    those cannot tell: on real runs, at every such question, the two answer alike; the records tell at least one
    first window; the result is the full walk's."""
    answers = both_tries(monkeypatch)
    assert_folded_is_full(real_steps(name, steps), policy)
    assert any(what == "try" and got for what, _, got, _ in answers), answers
    for what, mark, got, plain in answers:
        assert got == plain, (what, mark, got, plain)


@pytest.mark.parametrize("name, steps, policy, flagged", [("gpt-eval50", 130, "torch", None),
                                                          ("gpt-eval50", 130, "cupy", None),
                                                          ("resnet18-eval100", 130, "split", None),
                                                          ("gpt-eval50", 130, "torch", 30),
                                                          ("gpt-eval50", 130, "cupy", 30)])
def test_windows_read_on_from_a_view_are_those_read_on_from_the_events(monkeypatch, name, steps, policy, flagged):
    """After a window told by its records, `_record_windows` reads on from the template's view (no event gathered):
    at every such call on real runs, the windows told by their records and the ids' run are those the events give,
    and the windows then told event by event from either's starting point (`_windows`) are the same; the result is
    the full walk's. ``flagged``: a flag set on the first ALLOC of that step (no event compares it): the records stop
    repeating there and the events go on, read from the view's starting point."""
    calls, record_windows = [], fold.Folder._record_windows
    trace = real_steps(name, steps)
    if flagged is not None:
        rec = np.array(trace.records)
        lo = int(fold.Steps(trace).marks[flagged])
        rec["flags"][lo + int(np.argmax(rec["kind"][lo:] == ALLOC))] = 1
        trace = Trace(rec, dict(trace.meta), streams=trace.streams, labels=trace.labels)

    def both(self, i, j, P, end, until, ev=None, view=None):
        got = record_windows(self, i, j, P, end, until, ev, view)
        if view is not None:
            plain = record_windows(self, i, j, P, end, until, ev)
            n, lo, R = got[0], got[1], j.at - i.at
            more = None if lo is None else self._windows(lo, 1, P, n, end + n * R, until)
            calls.append(((got[0], got[2]) == (plain[0], plain[2]) and (lo is None) == (plain[1] is None) and (
                lo is None or more == self._windows(plain[1], 1, P, n, end + n * R, until)), more and more[0] > n))
        return got
    monkeypatch.setattr(fold.Folder, "_record_windows", both)
    assert_folded_is_full(trace, policy)
    assert calls and all(same for same, _ in calls), calls
    assert flagged is None or any(read_on for _, read_on in calls), calls      # (windows told event by event)


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), field=st.sampled_from(["id", "size", "stream", "kind", "flags"]))
def test_a_first_window_told_record_for_record_refuses_what_the_events_refuse(monkeypatch, data, field):
    """One record changed in the steps where a real run's first window is tried and walked (a FREE's object, a
    size, a stream, a kind, a flag): the records and the events answer alike wherever the records tell, and the
    result is the full walk's."""
    trace = real_steps_40()
    marks = fold.Steps(trace).marks
    rec = np.array(trace.records)
    change_one(rec, int(marks[8]), int(marks[36]), field, data)
    answers = both_tries(monkeypatch)
    assert_folded_is_full(Trace(rec, dict(trace.meta), streams=trace.streams, labels=trace.labels), "torch")
    for what, mark, got, plain in answers:
        assert got == plain, (what, mark, got, plain)


_REAL_40 = []


def real_steps_40() -> Trace:
    """The first 40 steps of gpt-eval50, read once (a hypothesis test's examples share them)."""
    if not _REAL_40:
        _REAL_40.append(real_steps("gpt-eval50", 40))
    return _REAL_40[0]


_TRIED = {}


def a_first_window(policy: str):
    """``(folder, i, j, records)``: a folded replay of a copy of gpt-eval50's first 40 steps under ``policy``, and
    the boundaries of its first window's try (``j`` has ``i``'s state), the copy's records writable: the records
    and events a try compares can be changed after the walk, and the two comparisons asked again."""
    if policy not in _TRIED:
        trace = real_steps_40()
        rec = np.array(trace.records)
        tried, try_ = [], fold.Folder._try

        def trying(self, i, j, key, until):
            tried.append((self, i, j))
            return try_(self, i, j, key, until)
        fold.Folder._try = trying
        try:
            Replay(Trace(rec, dict(trace.meta), streams=trace.streams, labels=trace.labels), policy).run()
        finally:
            fold.Folder._try = try_
        _TRIED[policy] = (*tried[0], rec)
    return _TRIED[policy]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(data=st.data(), policy=st.sampled_from(["torch", "cupy"]),
       field=st.sampled_from(["id", "size", "stream", "kind", "flags", "addr", "older"]))
def test_a_first_windows_records_and_events_answer_alike_whatever_changes(data, policy, field):
    """A first window's try asked of the same boundaries with one thing changed in the three windows it compares (a
    record's FREE object, size, stream, kind or flags, anywhere or where the template freed an object older than
    it; or two old objects' blocks swapped at ``j``): wherever the records tell (`RecordView.repeats_at`), the
    events gathered (`Folder._tried_by_events`) answer alike, and so of the window from ``j`` alone (a resumed
    window's end, `Folder._resumed_end_by_events`)."""
    folder, i, j, rec = a_first_window(policy)
    R = j.at - i.at
    kept, addr = rec.copy(), dict(j.addr)
    try:
        if field == "older":            # a record of an object older than the template, in the window from j
            at = j.at + int(data.draw(st.sampled_from(fold.RecordView.of(folder, i, j.mark - i.mark).older.tolist())))
            name = data.draw(st.sampled_from(["kind", "flags", "stream"]))
            rec[name][at] = {"kind": ALLOC, "flags": 1, "stream": 1}[name] + (name != "kind") * rec[name][at]
        elif field == "addr":           # two live objects' blocks swapped at j
            ids = sorted(addr)
            a, b = data.draw(st.sampled_from(ids)), data.draw(st.sampled_from(ids))
            j.addr[a], j.addr[b] = addr[b], addr[a]
        else:
            change_one(rec, i.at, min(len(rec), j.at + 2 * R), field, data)
        view = fold.RecordView.of(folder, i, j.mark - i.mark)
        got = view.repeats_at(folder, j, 1) if view is not None else None
        if got is not None:
            assert got == folder._tried_by_events(i, j), (field, got)
        got = view.repeats_at(folder, j, 0) if view is not None else None     # the window from j alone, as a
        if got is not None:                                                     # resumed window's end asks
            plain = folder._resumed_end_by_events(i, j, view.P)
            assert (got and got[:2]) == (plain and plain[:2]), (field, got, plain)
    finally:
        rec[:] = kept
        j.addr.clear()
        j.addr.update(addr)


@pytest.mark.parametrize("policy", ["torch", "cupy"])
@pytest.mark.parametrize("by", [1, 500])
def test_a_window_whose_ids_are_not_its_templates_plus_its_allocs_is_not_told_by_its_records(policy, by):
    """The ids from a first window's start on moved up (by one, or by more than a window's ALLOCs): the window
    repeats its template event for event, and the records could say so with that shift, but the fold that follows
    names the live ids by the windows' growth (`_record_windows`), so the records do not tell (None), with the window
    after it to compare or without (a resumed window's end), and the events do (`RecordView.repeats_at`)."""
    folder, i, j, rec = a_first_window(policy)
    kept = rec.copy()
    try:
        view = fold.RecordView.of(folder, i, j.mark - i.mark)
        assert view.repeats_at(folder, j, 1)
        moved = (np.arange(len(rec)) >= j.at) & (rec["id"] != 0xFFFFFFFF) & (rec["id"] >= view.id_run[1] + 1)
        rec["id"][moved] += by
        assert view.repeats_at(folder, j, 1) is None and view.repeats_at(folder, j, 0) is None
        assert folder._tried_by_events(i, j)
    finally:
        rec[:] = kept


@pytest.mark.parametrize("policy", ["torch", "cupy"])
def test_a_window_freeing_an_old_object_where_its_template_did_is_not_told_by_its_records(policy):
    """Where the template freed an object older than it, the window from ``j`` frees another object older than the
    template, holding that block at ``j`` (and the window after it that object's id a window's ALLOCs more): the
    window after ``j`` would free an object older than the template, which the events refuse; the records do not
    tell it (`RecordView.frees_own`)."""
    folder, i, j, rec = a_first_window(policy)
    view = fold.RecordView.of(folder, i, j.mark - i.mark)
    old = [int(q) for q in view.old]
    others = sorted(x for x in j.addr if x < view.id_run[0])
    assert old and others
    kept, addr = rec.copy(), dict(j.addr)
    try:
        q = old[0]
        freed = int(rec["id"][j.at + q])            # W's object, freed where W freed an older one
        x = next(x for x in others if x != freed)
        rec["id"][j.at + q], rec["id"][j.at + view.R + q] = x, x + view.D
        j.addr[x] = addr[freed]
        assert view.compare(folder, j) == view.D            # the records alike but for that object
        assert view.repeats_at(folder, j, 1) is None
        assert folder._tried_by_events(i, j) is False
    finally:
        rec[:] = kept
        j.addr.clear()
        j.addr.update(addr)


@pytest.mark.parametrize("step", [15, 62])
@pytest.mark.parametrize("by", [1, 500])
def test_a_run_whose_ids_jump_where_a_window_starts_folds_as_the_full_walk(step, by):
    """A recording whose ids jump (by one, or by more than a window's ALLOCs) from the step where a first window (15)
    or a resumed window's follower (62) starts in the run as recorded: the signatures of the steps about the jump
    change (a FREE's distance to its ALLOC), so the folds move; wherever they fall, the result is the full walk's.
    (That the records do not tell a window whose ids are not its template's plus its ALLOCs is held directly:
    `test_a_window_whose_ids_are_not_its_templates_plus_its_allocs_is_not_told_by_its_records`.)"""
    trace = real_steps("gpt-eval50", 130)
    rec = np.array(trace.records)
    x = int(fold.Steps(trace).marks[step])
    jump = int(rec["id"][:x][rec["kind"][:x] == ALLOC].max()) + 1
    moved = (np.arange(len(rec)) >= x) & (rec["id"] != 0xFFFFFFFF) & (rec["id"] >= jump)
    rec["id"][moved] += by
    assert_folded_is_full(Trace(rec, dict(trace.meta), streams=trace.streams, labels=trace.labels), "torch")


def interleaved_ids(steps: int = 40, base: int = 10) -> Trace:
    """Steps of two ALLOCs whose ids are not one run: step ``k`` allocates ``base + 2k + 3`` (5 MiB, freed in the next
    step) then ``base + 2k`` (3 MiB, freed at once). Every id is allocated once and each step's are its previous
    step's plus its two ALLOCs, so the records repeat with a shift of a window's ALLOCs; but a window's ids span more
    than its ALLOCs, and the object a window carries over has an id past the next window's lowest."""
    w = TraceWriter(meta={"producer": "test"})
    w.record(ALLOC, id_=base + 1, size=5 * MiB)
    for k in range(steps):
        w.mark(f"step {k}")
        w.record(ALLOC, id_=base + 2 * k + 3, size=5 * MiB)
        w.record(ALLOC, id_=base + 2 * k, size=3 * MiB)
        w.free(base + 2 * k)
        w.free(base + 2 * k + 1)
    w.mark("tail")
    w.free(base + 2 * steps + 1)
    return w.finish()


@pytest.mark.parametrize("policy", ["torch", "cupy"])
def test_a_window_whose_ids_are_not_one_run_is_not_told_by_its_records_and_folds_as_the_full_walk(monkeypatch,
                                                                                                  policy):
    """Windows whose ALLOC ids are not one run above the live ids (`interleaved_ids`): the records would repeat with
    the windows' growth, but the live ids cannot be renamed by it (the object carried over lies outside the run
    ``[first, first + D)``), so no `RecordView` is made of such a window, the fold is told by the events and renamed
    from them, and the result is the full walk's."""
    trace = interleaved_ids()
    views, of = [], fold.RecordView.of
    monkeypatch.setattr(fold.RecordView, "of", classmethod(lambda cls, *a, **kw: (views.append(of(*a, **kw)),
                                                                                  views[-1])[1]))
    how = assert_folded_is_full(trace, policy)
    assert how is not None and how["steps"] >= 30, how
    assert views and all(v is None for v in views), views


@pytest.mark.parametrize("policy", ["torch", "cupy"])
def test_a_trace_whose_records_are_not_laid_out_as_words_folds_by_its_events_as_the_full_walk(policy):
    """A trace over a strided view of its records (each a field of a wider record: `fold._words` cannot read them as
    words): no window is told record for record (`RecordView.of`, `Folder._record_windows`), the events are
    compared, and the folds -- first windows, reuses, resumes -- give the full walk's result."""
    trace = real_steps("gpt-eval50", 130)
    wide = np.zeros(len(trace), dtype=[("r", trace_module.RECORD_DTYPE), ("pad", "u1")])
    wide["r"] = np.asarray(trace.records)
    trace = Trace(wide["r"], dict(trace.meta), streams=trace.streams, labels=trace.labels)
    assert fold._words(trace.records) is None
    how = assert_folded_is_full(trace, policy)
    assert how is not None and how["folds"] >= 2, how


@pytest.fixture(scope="module")
def gpt_eval50_130():
    return real_steps("gpt-eval50", 130)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), field=st.sampled_from(["id", "size", "stream", "kind", "flags"]))
def test_a_reuse_told_record_for_record_refuses_what_the_events_refuse(monkeypatch, gpt_eval50_130, data, field):
    """One record changed in the windows a reuse or a resume compares after the second break (the step's state is
    the recorded window's again, or a cycle state: a FREE's object, a size, a stream, a kind, a flag): the records
    and the events answer alike wherever the records tell, and the result is the full walk's."""
    trace = gpt_eval50_130
    marks = fold.Steps(trace).marks
    rec = np.array(trace.records)
    change_one(rec, int(marks[100]), int(marks[116]), field, data)
    changed = Trace(rec, dict(trace.meta), streams=trace.streams, labels=trace.labels)
    answers, resumes = both_reuses(monkeypatch), both_resumes(monkeypatch)
    assert_folded_is_full(changed, "torch")
    for mark, got, plain in answers + resumes:
        assert got == plain, (mark, got, plain)


@pytest.mark.parametrize("name, steps, lap, first", [("gpt2s-fixed", 215, 50, 102), ("resnet18-eval100", 560, 100, 255)])
def test_a_run_broken_every_so_many_steps_folds_a_lap_at_a_time(monkeypatch, name, steps, lap, first):
    """Real runs broken by a logging or evaluation step every 50 steps (GPT-2 small; ResNet-18, which also
    evaluates every 100): the folds and the stretches walked between them are recorded from the first fold the run
    came back to, a reuse or a resume (`Journal`), and once a recorded window's state is reused a lap after a fold from it, the laps after it are
    added at once (`Folder._lap_close`), the lap walked once only, no window checked event by event past the
    first; the result is the full walk's, and a lap that does not repeat is not added (`LAP_TRIES`). The first lap
    added is the second walked: GPT-2 small's folds from step 52's state come round at 102 (until 2026-12-03 the
    lap walked from there was recorded, and the first added at 152); ResNet-18's first lap of 100 steps is added at
    255 under `torch`, as before."""
    trace = real_steps(name, steps)
    closed, events = [], []
    close, windows = fold.Folder._lap_close, fold.windows_repeat
    monkeypatch.setattr(fold.Folder, "_lap_close", lambda self, *a: (closed.append(close(self, *a)), closed[-1])[1])
    monkeypatch.setattr(fold, "windows_repeat", lambda ev, *a: (events.append(len(ev)), windows(ev, *a))[1])
    how = assert_folded_is_full(trace, "torch")
    r = Replay(trace, "torch")
    r.run()
    laps = [(p, first, n) for p, first, n in r._folder.periods if p == lap]
    assert closed.count(True) == 2 and len(laps) == 1 and laps[0][2] >= lap, (closed, r._folder.periods)
    assert laps[0][1] == first, r._folder.periods
    marks = fold.steps_of(trace).marks
    assert how["steps"] == r.folded["steps"] and max(events, default=0) < fold._count_between(
        trace.records, marks[0], marks[lap]), max(events)
    # stopped short inside the laps, stepped, and walked on: still the full walk's
    full, _ = walk(trace, "torch", fold=False)
    r = Replay(trace, "torch")
    r.run(until=int(marks[steps * 3 // 4]))
    r.step(3000)
    r.run(until=len(trace))
    res = r.finish().to_dict(timeline=True)
    res.pop("replay_seconds")
    assert res == full["result"]
    # a lap whose old objects' blocks disagree (each freed object held another block at the lap's start) is not
    # added, and the result is still the full walk's
    def moved(self, here, key, p, until):
        return close(self, fold.Boundary(here.at, here.mark, {i: a + 256 for i, a in here.addr.items()}), key, p, until)
    monkeypatch.setattr(fold.Folder, "_lap_close", moved)
    r = Replay(trace, "torch")
    r.run()
    assert r._folder.lap_misses >= 1 and not [p for p, _, _ in r._folder.periods if p == lap], r._folder.periods
    assert_folded_is_full(trace, "torch")


def test_a_state_that_repeats_only_with_the_breaks_period_is_looked_for_once_a_period(monkeypatch):
    """ResNet-18 under `bestfit` (traces/fold/resnet18-eval100: an evaluation every 100 steps, a logging step every 50)
    comes back to a state only with the evaluations' period. Once `SPARSE_AFTER` fingerprints found no fold, the
    folder looks at one boundary a period (`Folder._go_sparse`, the period `Steps.long_period` reads from the
    counts): it folds with that period from the second such look, the result the full walk's, having fingerprinted
    a boundary a period since (it fingerprinted every boundary before: 185 on the whole run)."""
    trace = real_steps("resnet18-eval100", 560)
    how = assert_folded_is_full(trace, "bestfit")
    assert how is not None and how["period"] == 100 and how["steps"] >= 200, how
    r = Replay(trace, "bestfit")
    r.run()
    m, stride = r._folder.sparse
    assert stride == 100 and m < 2 * fold.SPARSE_AFTER, r._folder.sparse
    assert r._folder.looks <= fold.SPARSE_AFTER + 560 // 100, r._folder.looks
    full, _ = walk(trace, "bestfit", fold=False)    # stopped short, stepped, walked on: still the full walk's
    marks = fold.steps_of(trace).marks
    for cut in (130, 420):
        r = Replay(trace, "bestfit")
        r.run(until=int(marks[cut]))
        r.step(2000)
        r.run(until=len(trace))
        res = r.finish().to_dict(timeline=True)
        res.pop("replay_seconds")
        assert res == full["result"] and r._folder.sparse is not None and r.folded, (cut, r.folded)
    monkeypatch.setattr(fold, "SPARSE_AFTER", 1 << 30)     # looking at every boundary: many more looks
    r = Replay(trace, "bestfit")
    r.run()
    assert r._folder.sparse is None and r._folder.looks > 100, r._folder.looks


def test_a_lap_is_added_once_walked_once_from_the_first_fold_after_a_break(monkeypatch):
    """The small GPT (traces/fold/gpt-fixed: period 7, a logging step every 50) under `torch`: its folds from step
    55's state (a resume, the first fold after a break) come round at 155, and the journal kept from there is the
    lap: 155-255 is added at once, the result the full walk's. A journal is kept only from a fold the run came back
    to (a reuse, a resume), not from the first window; one whose stretch cannot be repeated exactly is dropped; and
    a replay stopped inside the lap and walked on is still the full walk's."""
    trace = real_steps("gpt-fixed", 300)
    started, close = [], fold.Folder._lap_fold
    monkeypatch.setattr(fold.Folder, "_lap_fold", lambda self, here, key, before=None, back=False: (
        started.append((here.mark, back, self.journal is None)), close(self, here, key, before, back)))
    how = assert_folded_is_full(trace, "torch")
    r = Replay(trace, "torch")
    r.run()
    laps = [(p, first, n) for p, first, n in r._folder.periods if p > 7]
    assert laps == [(100, 156, 100)] and how["steps"] == r.folded["steps"], r._folder.periods
    assert {m for m, back, fresh in started if not back} == {15} and (55, True, True) in started, started
    #       (the first window's fold, at 15, starts no journal: at 55 there is none yet, and one starts)
    # stopped inside the lap and walked on
    full, _ = walk(trace, "torch", fold=False)
    marks = fold.steps_of(trace).marks
    for target in (int(marks[200]), int(marks[155]) + 1, int(marks[110])):    # (110: a window not folded, walked)
        r = Replay(trace, "torch")
        r.run(until=target)
        r.run(until=len(trace))
        res = r.finish().to_dict(timeline=True)
        res.pop("replay_seconds")
        assert res == full["result"], target
    # a stretch that cannot be repeated drops the journal: no lap, still the full walk's
    pause, made = fold.Folder._lap_pause, []

    def unrepeatable(self):
        recorder = self.journal.recorder if self.journal is not None else None
        pause(self)
        if recorder is not None:
            made.append(recorder)
            recorder.made = None        # (its `Program`, made when a lap asks: it cannot be repeated)
    monkeypatch.setattr(fold.Folder, "_lap_pause", unrepeatable)
    r = Replay(trace, "torch")
    r.run()
    assert made and not [p for p, _, _ in r._folder.periods if p > 7] and r._folder.lap_misses == 0, r._folder.periods
    assert_folded_is_full(trace, "torch")


def test_a_lap_whose_records_differ_in_its_first_lap_adds_nothing_and_counts_no_fold(monkeypatch):
    """The small GPT (`torch`) with one ALLOC of step 160 512 bytes larger: the lap from step 55's state comes round at
    155 with the counts of the lap after it, but the records differ within that lap: no lap repeats (0), none is
    added or counted among the folds (each fold in ``periods`` skipped steps), the run folds on with its period of
    7, and the result is the full walk's."""
    trace = real_steps("gpt-fixed", 300)
    rec = np.array(trace.records)
    x = int(fold.Steps(trace).marks[160])
    rec["size"][x + int(np.flatnonzero(rec["kind"][x:] == ALLOC)[0])] += 512
    trace = Trace(rec, dict(trace.meta), streams=trace.streams, labels=trace.labels)
    laps, repeats = [], fold.Folder._lap_repeats
    monkeypatch.setattr(fold.Folder, "_lap_repeats", lambda self, *a: (laps.append(repeats(self, *a)), laps[-1])[1])
    r = Replay(trace, "torch")
    got = r.run().to_dict()
    assert [lap[0] for lap in laps] == [0], laps
    periods = r._folder.periods
    assert periods and all(n > 0 and p == 7 for p, _, n in periods), periods
    assert r.folded["folds"] == len(periods)
    full = Replay(trace, "torch", fold=False).run().to_dict()
    got.pop("replay_seconds"), full.pop("replay_seconds")
    assert got == full


def test_a_lap_journal_leaves_plain_floats_where_the_walk_stops_or_gives_it_up(monkeypatch):
    """Stopped inside the small GPT's journal (`torch`, step 120): a checkpoint and a result hold plain floats and the
    plain `sections.add`, a replay resumed from the checkpoint walks as the full walk; a journal dropped (every lap
    refused) leaves plain floats too."""
    from allocsim.engine import replay as replay_engine
    monkeypatch.setattr(replay_engine, "KEEP_RECORDS", 1 << 24)     # (its chunks kept: a checkpoint copies them)
    trace = real_steps("gpt-fixed", 300)
    marks = fold.steps_of(trace).marks

    def plain(r):
        d = r.device
        return {type(x) for x in (d.clock, d.malloc_time, d.free_time, r.runtime.gc_time)} == {float} and \
            "add" not in vars(r.sections)
    r = Replay(trace, "torch")
    r.run(until=int(marks[120]))
    assert r._folder.journal is not None and r._folder.journal.recorder is not None
    state = r.checkpoint()
    assert plain(r) and type(state.device.clock) is float
    resumed = Replay(trace, "torch", fold=False)
    resumed.resume(state)
    assert resumed.run() == Replay(trace, "torch", fold=False).run()
    r = Replay(trace, "torch")
    r.run(until=int(marks[120]))
    r.result()
    assert plain(r)
    monkeypatch.setattr(fold.Folder, "_lap_repeats", lambda self, *a: None)
    monkeypatch.setattr(fold, "LAP_TRIES", 1)
    r = Replay(trace, "torch")
    r.run(until=int(marks[290]))
    assert r._folder.lap_misses >= 1 and r._folder.journal is None and plain(r)


def evaluated_past_the_cap(steps: int = 120, every: int = 10) -> Trace:
    """Steps of four requests, an evaluation every ``every`` steps whose 200 MiB request fails under a 64 MiB cap."""
    w = TraceWriter(meta={"producer": "test"})
    carried: list[int] = []
    for k in range(steps):
        w.mark(f"step {k}")
        mine = [w.alloc(size) for size in (3 * MiB, MiB, 700, 5 * MiB)]
        w.free(mine.pop(1))
        for i in carried:
            w.free(i)
        carried = mine
        if k % every == every - 1:
            x, y = w.alloc(200 * MiB), w.alloc(2 * MiB)
            w.free(x)
            w.free(y)
    w.mark("tail")
    for i in carried:
        w.free(i)
    return w.finish()


@pytest.mark.parametrize("policy", ["torch", "cupy"])
def test_a_lap_that_runs_out_of_memory_is_not_added(monkeypatch, policy):
    """A run whose evaluation runs out every 10 steps (``--keep-going``): its state comes round lap after lap, but
    each lap adds an OOM (the walk's ``settled`` counts differ), which a fold cannot repeat: the lap is refused, and
    the result is the full walk's, every OOM in it."""
    asked, repeats = [], fold.Folder._lap_repeats
    monkeypatch.setattr(fold.Folder, "_lap_repeats", lambda self, *a: (asked.append(repeats(self, *a)), asked[-1])[1])
    assert_folded_is_full(evaluated_past_the_cap(), policy, cap=64 * MiB, capacity=None, keep_going=True)
    assert asked and all(got is None for got in asked), asked


@pytest.mark.parametrize("policy", ["torch", "cupy"])
def test_a_lap_over_0_byte_objects_reads_the_chunks_it_passes(monkeypatch, policy):
    """ResNet-18 with a 0-byte temporary in each step (`zero_byte_temporaries`): its lap of 100 steps is added, the
    walk moved past it reading the chunks it passes (the 0-byte requests the replay bypasses are counted from
    them), and the result is the full walk's."""
    closed, close = [], fold.Folder._lap_close
    monkeypatch.setattr(fold.Folder, "_lap_close", lambda self, *a: (closed.append(close(self, *a)), closed[-1])[1])
    assert_folded_is_full(zero_byte_temporaries(real_steps("resnet18-eval100", 1000)), policy)
    assert True in closed, closed


def old_objects_swapped_every(steps: int = 200, every: int = 10, size: int = 4 * MiB) -> Trace:
    """Two long-lived objects only an evaluation every ``every`` steps touches: it frees one and puts a new object in
    its block, then the other, and the roles swap (the first new object is the one the next evaluation frees second).
    Every other lap the objects outliving it lie in each other's blocks; at the end the first one's block is split,
    so where the last small object lands says which object it was."""
    w = TraceWriter(meta={"producer": "test"})
    old, carried = [w.alloc(size), w.alloc(size)], []
    for k in range(steps):
        w.mark(f"step {k}")
        mine = [w.alloc(3 * MiB), w.alloc(5 * MiB)]
        w.free(w.alloc(MiB))
        for i in carried:
            w.free(i)
        carried = mine
        if k % every == every - 1:
            w.free(old[0])
            x = w.alloc(size)
            w.free(old[1])
            old = [w.alloc(size), x]
    w.mark("tail")
    for i in carried:
        w.free(i)
    w.free(old[0])
    w.alloc(MiB)
    return w.finish()


@pytest.mark.parametrize("policy", ["torch", "bestfit"])
def test_a_lap_whose_old_objects_lie_swapped_is_not_added(monkeypatch, policy):
    """A lap from one evaluation to the next whose states are equal by address, but whose old objects lie in each
    other's blocks (`old_objects_swapped_every`): the laps after it would free the wrong ones; it is refused (by the
    two states' addresses, and by the old objects the template frees), and the result is the full walk's."""
    asked, close = [], fold.Folder._lap_close
    monkeypatch.setattr(fold.Folder, "_lap_close", lambda self, *a: (asked.append(close(self, *a)), asked[-1])[1])
    assert_folded_is_full(old_objects_swapped_every(), policy)
    assert asked and not any(asked), asked


def three_sizes(steps: int) -> Trace:
    """Steps whose state two events in is the boundary's: a walk that reaches a step's MARK late must not take it."""
    w = TraceWriter(meta={"producer": "test"})
    for k in range(steps):
        w.mark(f"step {k}")
        for size in (3 * MiB, 5 * MiB, 600):
            w.free(w.alloc(size))
    w.mark("tail")
    return w.finish()


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["run", "step"]), st.integers(1, 40), st.integers(0, 8)), max_size=5),
       st.sampled_from(["torch", "split"]), st.sampled_from([10, 64, 1 << 16]))
@example(moves=[("run", 20, 2), ("step", 1, 6)], policy="torch", chunk=1 << 16)  # two events into step 20, across a MARK
@example(moves=[("run", 4, 2), ("step", 1, 8)], policy="torch", chunk=10)      # ... a step that ends at a chunk's end
def test_a_replay_stepped_and_run_in_any_order_is_the_full_walk(moves, policy, chunk):
    """`Replay.step` walks without the folder looking at the MARKs it passes (`Folder.passed`): a replay run to some
    events, stepped, run on and stepped again, in any order, then run to its end, gives the full walk's result
    (a MARK passed by a step was once taken as reached where the walk went on, a few events later; a step ending at
    a chunk's end hid the MARKs it passed once more), whatever the chunks."""
    old = trace_module.CHUNK
    trace_module.CHUNK = chunk
    try:
        stepped_and_run(moves, policy)
    finally:
        trace_module.CHUNK = old


def stepped_and_run(moves, policy):
    trace = three_sizes(60)
    marks = fold.steps_of(trace).marks
    full = Replay(trace, policy, fold=False).run().to_dict()
    r = Replay(trace, policy)
    for move, k, d in moves:      # run to ``d`` records past the MARK ``k`` steps on; step ``d + 1`` events
        if move == "step":
            r.step(d + 1)
        elif not r.at_end:
            here = int(np.searchsorted(marks, r.events_done * 7 // 6))      # (about: 6 events a step, 7 records)
            r.run(until=min(len(trace), int(marks[min(len(marks) - 1, here + k)]) + d))
    got = (r.run() if not r.at_end else r.finish()).to_dict()
    for d in (full, got):
        d.pop("replay_seconds")
    assert got == full


def test_a_recorder_takes_the_fused_latencies_it_was_told_of_and_no_more():
    """`Recorder.take_latencies` pairs each plain float (a fused loop's latency) with the next end on
    `Tape.latency_ends`, in order among the plain walk's `RecDiff`s; a float with no end left, or an end no float
    took by the window's end, or a total forked from an earlier one (`Tape.follows`), leaves no `Program`."""
    def recorder():
        r = Replay(released_every_step(2), "torch", fold=False)
        return fold.Recorder(r.device, r.runtime, r.sections), r.device
    rec, dev = recorder()
    tape = rec.clock_tape
    start = float(dev.clock)
    t0 = dev.clock
    dev.clock = dev.clock + 1e-6                    # the plain walk: a RecFloat addition and a RecDiff latency
    mixed = fold.LatencyTape([dev.clock - t0])
    tape.incs.append(2e-6)                          # the fused loop: an increment, a float, where it ends
    tape.latency_ends.append(2.0)
    mixed.append((start + 1e-6 + 2e-6) - (start + 1e-6))
    dev.clock = tape.at(start + 1e-6 + 2e-6)
    assert rec.take_latencies(mixed) and rec.taken == 1
    program = rec.stop()
    assert program is not None and program.lat.tolist() == [[0, 1], [1, 2]]
    assert program.incs["clock"].tolist() == [1e-6, 2e-6]

    rec, dev = recorder()                           # a float with no end noted
    assert not rec.take_latencies(fold.LatencyTape([1e-6]))
    rec.stop()
    rec, dev = recorder()                           # an end no float took
    rec.clock_tape.incs.append(1e-6)
    rec.clock_tape.latency_ends.append(1.0)
    dev.clock = rec.clock_tape.at(float(dev.clock) + 1e-6)
    assert rec.take_latencies(fold.LatencyTape()) and rec.stop() is None
    rec, dev = recorder()                           # a fused loop starting from an old total
    old = dev.clock
    dev.clock = dev.clock + 1e-6
    assert not rec.clock_tape.follows(old) and rec.clock_tape.bad and rec.stop() is None


def _events(kind, ids) -> fold.Events:
    ev = fold.Events.__new__(fold.Events)
    ev.at, ev.kind = np.arange(len(kind), dtype=np.int64), np.array(kind, np.uint8)
    ev.id, ev.size, ev.stream = np.array(ids, np.uint32), np.full(len(kind), 512, np.uint64), np.zeros(len(kind), np.uint16)
    return ev


def test_windows_repeat_reads_the_older_objects_blocks_in_window_0_only_and_none_without_them():
    """`windows_repeat` on a template (two ALLOCs, a FREE of its own object, a FREE of an object older than it) and
    four windows that repeat it, each freeing the object the window before carried: from window 0 with the older
    object's blocks it counts all four where the template's older object and window 0's freed one held one block, none
    where they held two; without the blocks an older object's FREE is unlike (none, no address read); from window 1 on
    the blocks are not asked (three)."""
    kind, ids = [], []
    carried = 0                         # the template frees object 0, older than it
    for w in range(5):
        a, b = 100 + 2 * w, 101 + 2 * w
        kind += [ALLOC, ALLOC, FREE, FREE]
        ids += [a, b, a, carried]
        carried = b
    ev, P = _events(kind, ids), 4
    assert fold.windows_repeat(ev, P, 0, {0: 4096}, {101: 4096}) == 4
    assert fold.windows_repeat(ev, P, 0, {0: 4096}, {101: 8192}) == 0
    assert fold.windows_repeat(ev, P, 0) == 0
    assert fold.windows_repeat(ev, P, 1) == fold.windows_repeat(ev, P, 1, {0: 4096}, {101: 8192}) == 3


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.integers(0, 9), min_size=1, max_size=30), perm=st.permutations(range(6)),
       swapped=st.sets(st.integers(0, 5), max_size=2), kind_at=st.none() | st.integers(0, 29))
@example(ops=[0, 8, 5], perm=list(range(6)), swapped=set(), kind_at=1)      # an older object's FREE made an ALLOC
@example(ops=[8, 0], perm=list(range(6)), swapped={2}, kind_at=None)         # the template asked again, other blocks
def test_a_window_whose_old_objects_lie_elsewhere_is_unlike_without_comparing_it(ops, perm, swapped, kind_at):
    """`old_frees_differ`: a template window (ALLOCs, FREEs of its own objects and of six older ones) and the same
    window again with new ids, the older objects renamed (``perm``) and some of them (``swapped``) in another block
    than the template's: it says differ exactly where `windows_repeat` of the two joined finds the first window
    unlike by the older objects' blocks, and never where that finds it alike (another kind somewhere: it may not
    see it, `windows_repeat` does)."""
    kind, ids, live, old, nxt = [], [], [], list(range(6)), 100
    for op in ops:                      # 0-4: ALLOC, 5-7: FREE of a young object, 8-9: FREE of an old one
        if op < 5 or (op < 8 and not live) or (op >= 8 and not old):
            kind.append(ALLOC), ids.append(nxt), live.append(nxt)
            nxt += 1
        elif op < 8:
            kind.append(FREE), ids.append(live.pop(op % len(live)))
        else:
            kind.append(FREE), ids.append(old.pop(op % len(old)))
    again = [i + 1000 if i >= 100 else 50 + perm[i] for i in ids]
    again_kind = list(kind)
    if kind_at is not None and kind_at < len(kind):
        again_kind[kind_at] = FREE if kind[kind_at] == ALLOC else ALLOC
    addr_i = {o: 4096 * (o + 1) for o in range(6)}
    addr_j = {50 + perm[o]: 4096 * (o + 1) + (512 if o in swapped else 0) for o in range(6)}
    template, ev, P = _events(kind, ids), _events(again_kind, again), len(kind)
    alike = fold.windows_repeat(fold.Events.joined(template, ev), P, 0, addr_i, addr_j)
    differ = fold.old_frees_differ(template, ev, P, addr_i, addr_j)
    assert not (differ and alike), (kind, ids, again)
    if kind_at is not None and kind_at < len(kind) and kind[kind_at] == FREE and ids[kind_at] < 100:
        assert differ           # an older object's FREE is no FREE there: seen without comparing the rest
    if kind_at is None:
        freed_swapped = any(k == FREE and i < 100 and i in swapped for k, i in zip(kind, ids))
        assert differ == freed_swapped == (not alike), (kind, ids, swapped)
        moved_i = {o: a + (512 if o in swapped else 0) for o, a in addr_i.items()}  # asked again, other blocks
        same_j = {50 + perm[o]: 4096 * (o + 1) for o in range(6)}
        assert fold.old_frees_differ(template, ev, P, moved_i, same_j) == freed_swapped


def test_the_steps_answer_as_compared_afresh_asked_in_walk_order():
    """`Steps.useful` asked boundary after boundary, as a walk asks (with and without the longest period a cycle
    allows), answers from the runs of equal steps it found before (`Steps._run`) as it does comparing afresh: the
    answers of steps whose runs are never kept."""
    for trace in (real_steps("gpt-eval50", 130), repeat_steps(load("resnet50.bin"), 90), load("gpt2_variable.bin")):
        for longest in (None, 8, 28):
            kept, afresh = fold.Steps(trace), fold.Steps(trace)
            afresh._run = lambda p, q, k: False
            asked = [kept.useful(m, longest) for m in range(len(kept))]
            assert asked == [afresh.useful(m, longest) for m in range(len(afresh))], longest
            assert kept._same or not any(asked)


def cycle_of_steps(period: int, laps: int, allocs: int = 50) -> Trace:
    """A run whose steps differ from one another for ``period`` steps, then repeat: a signature period over 8 (steps
    of ``allocs`` objects: `Steps.read` reads a few steps, not the whole trace, at a time)."""
    w = TraceWriter(meta={"producer": "test"})
    for k in range(period * laps):
        w.mark(f"step {k}")
        ids = [w.alloc((k % period + 1 + j) * 4096) for j in range(allocs)]
        for i in ids:
            w.free(i)
    return w.finish()


def test_the_steps_answer_as_compared_afresh_asked_in_any_order():
    """Asked out of the walk's order, mixing the longest periods a cycle allows, a kept `Steps` answers as one
    comparing afresh: a run of equal steps found for a period over 8 from a late step does not answer an early
    step ahead of it (`useful` looks ahead only ``max(8, m)`` periods), nor a question for shorter periods. (Until
    every signature is read: then both answer from the whole table.)"""
    rng = np.random.default_rng(7)
    for trace in (cycle_of_steps(12, 40), real_steps("gpt-eval50", 130)):
        kept, afresh = fold.Steps(trace), fold.Steps(trace)
        afresh._run = lambda p, q, k: False
        questions = [(13, None), (2, None), (20, 8)] + [(int(m), [None, 8, 28][int(rng.integers(3))])
                                                         for m in rng.permutation(len(kept))]
        asked = 0
        for m, longest in questions:
            if kept._table is not None or afresh._table is not None:
                break
            assert kept.useful(m, longest) == afresh.useful(m, longest), (m, longest)
            asked += 1
        assert asked >= 10 and kept._same, asked


def test_the_folders_making_is_charged_to_its_budget(monkeypatch):
    """Reading the steps (`Steps`, made when the replay is) is folding's cost, so a run where folding gives up costs
    that too within its slack: the budget starts with it spent."""
    import time
    steps_init = fold.Steps.__init__
    def busy(seconds: float) -> None:       # (on the CPU: a sleep's time is not the thread's, and is not charged)
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    monkeypatch.setattr(fold.Steps, "__init__", lambda self, trace: (steps_init(self, trace), busy(0.05))[0])
    fold._STEPS.clear()
    r = Replay(repeat_steps(load("gpt2.bin"), 20), "torch")
    assert r._folder is not None and r._folder.budget.spent >= 0.05
    assert Replay(repeat_steps(load("gpt2.bin"), 20), "torch", fold=False)._folder is None
