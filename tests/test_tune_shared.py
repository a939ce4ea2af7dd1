"""What `tune`'s replays share or put off to be cheaper must leave every figure as it was: the peak's free state
taken only when a result is built (`Replay.defer_peak_state`), and a fresh walker's first read of the live bytes
kept for the next replays of the trace (`allocsim.engine.replay.live_through`)."""
import importlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from allocsim.search.sweep import cached_trace
from allocsim.trace import ALLOC, FREE, Trace
from allocsim.trace import trace as trace_records
from allocsim.trace.events import RECORD_DTYPE
from allocsim.trace.trace import LiveBytes

R = importlib.import_module("allocsim.engine.replay")    # the module, not the function `allocsim.engine.replay`

CASES = [  # trace, policy, cap: runs to the end, runs out under the cap, recorded OOMs replayed
    ("traces/resnet50.bin", "torch[max_split_size_mb:64]", None),
    ("traces/gpt2.bin", "torch[expandable_segments:True,garbage_collection_threshold:0.6]", 10_402_247_894),
    ("traces/gpt2.bin", "torch", 9_000_000_000),
    ("traces/pressure-fraction-oom.bin", "torch[roundup_power2_divisions:4]", 2_302_253_465),
]


def figures(res) -> dict:
    d = res.to_dict()
    d.pop("replay_seconds")
    d["largest_free_fragmentation_at_peak"] = res.largest_free_fragmentation_at_peak
    return d


@pytest.mark.parametrize("path,policy,cap", CASES)
@pytest.mark.parametrize("runtime", ["eager", "gc"])
def test_deferred_peak_state_is_the_same(path, policy, cap, runtime, monkeypatch):
    """A replay that defers its peak's free state reports the same figures as one that takes it at each peak,
    and it did defer (the second walk ran)."""
    t = cached_trace(path)
    eager = R.Replay(t, policy, cap=cap, runtime=runtime).run()
    taken = []
    real = R.Replay._take_peak_state
    monkeypatch.setattr(R.Replay, "_take_peak_state", lambda self: taken.append(1) or real(self))
    r = R.Replay(t, policy, cap=cap, runtime=runtime)
    r.defer_peak_state()
    while not r.at_end:
        r.step(997)
    assert figures(r.finish()) == figures(eager)
    assert taken == [1]
    assert eager.breakdown_at_peak is not None


def test_a_replay_given_its_device_takes_the_peak_at_once():
    """A replay it cannot make again alike (its own device) takes the free state at each peak."""
    t = cached_trace("traces/resnet50.bin")
    r = R.Replay(t, "torch", device=R.make_device(t, "torch"))
    r.defer_peak_state()
    r.step(2000)
    assert not isinstance(r._w.at_peak, R._PeakLater) and r._w.at_peak is not None


def records_of(events) -> np.ndarray:
    """Records of ``(is_alloc, id, size)``: ids reused, freed twice, freed before their ALLOC, never allocated."""
    rec = np.zeros(len(events), RECORD_DTYPE)
    for k, (is_alloc, i, size) in enumerate(events):
        rec[k]["kind"] = ALLOC if is_alloc else FREE
        rec[k]["id"] = i
        rec[k]["size"] = size if is_alloc else 0
    return rec


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(1, 1000)), min_size=1, max_size=40),
       chunk=st.integers(1, 9), data=st.data())
def test_live_through_reads_as_a_fresh_walker(events, chunk, data):
    """Two walkers, the second restored from what the first read kept, then both read on: each reads what a
    walker reading the trace itself reads, a trace of double frees and reused ids in chunks of any size included."""
    t = Trace(records_of(events), {})
    first = data.draw(st.integers(0, len(events) - 1))
    later = data.draw(st.integers(first, len(events) - 1))
    old = trace_records.CHUNK
    trace_records.CHUNK = chunk
    try:
        plain = LiveBytes()
        want = (plain.at(t.records, first), plain.at(t.records, later))
        for _ in range(2):      # the first keeps what it read, the second is given it
            w = LiveBytes()
            assert (R.live_through(t, w, first), w.at(t.records, later)) == want
            assert w.pos == plain.pos
    finally:
        trace_records.CHUNK = old


DIVISIONS = [None, "2", "4", "16", "[64:8,256:4,>:2]", "[256:4,>:1]"]


@pytest.mark.parametrize("path", ["traces/gpt2.bin", "traces/resnet50.bin", "traces/gpt2-maxsplit128-rp2div4.bin"])
@pytest.mark.parametrize("div", DIVISIONS)
@pytest.mark.parametrize("expandable", [False, True])
def test_least_peak_is_below_every_replay_that_does_not_run_out(path, div, expandable):
    """The torch space's bound on reserved (`least_peak`) is at most the peak reserved, indeed the peak allocated,
    of every replay that runs to the end, and above LOAD once the divisions round."""
    from allocsim.search.spaces import torch as space
    t = cached_trace(path)
    spec = space.spec({"trace_settings": False, "expandable_segments": expandable, "roundup_power2_divisions": div})
    low = space.least_peak(t, spec.values())
    res = R.Replay(t, spec, capacity=None).run()
    assert res.completed and not res.ooms
    assert t.load_bytes <= low <= res.peak_allocated_bytes <= res.peak_reserved_bytes
    if div in ("2", "4"):
        assert low > t.load_bytes * 1.01


@settings(max_examples=80, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 1 << 40)), min_size=1, max_size=60),
       chunk=st.integers(1, 9), data=st.data())
def test_a_walker_asked_at_increasing_events_reads_what_each_event_leaves(steps, chunk, data):
    """`LiveBytes.at` and the replay's `_AllocBytes.at` (each reads a piece ahead, `ahead`, and answers from it) give,
    at any non-decreasing events, the live bytes and the bytes allocated so far as one event at a time gives them:
    objects freed in any order, a FREE of an object never allocated freeing nothing."""
    events, live = [], []
    for what, size in steps:            # 0: allocate; 1: free a live object (if any); 2: free one never allocated
        if what == 1 and live:
            events.append((False, live.pop(data.draw(st.integers(0, len(live) - 1))), 0))
        elif what == 2:
            events.append((False, 10 ** 6 + len(events), 0))
        else:
            events.append((True, len(events), size))
            live.append(len(events) - 1)
    want_live, want_allocated, held, total = [], [], {}, 0
    for is_alloc, i, size in events:
        if is_alloc:
            held[i] = size
            total += size
        else:
            held.pop(i, None)
        want_live.append(sum(held.values()))
        want_allocated.append(total)
    asked = sorted(data.draw(st.lists(st.integers(0, len(events) - 1), min_size=1, max_size=10)))
    rec = records_of(events)
    old = trace_records.CHUNK
    trace_records.CHUNK = chunk
    try:
        walker, allocs = LiveBytes(), R._AllocBytes()
        assert [walker.at(rec, k) for k in asked] == [want_live[k] for k in asked]
        assert [allocs.at(rec, k) for k in asked] == [want_allocated[k] for k in asked]
    finally:
        trace_records.CHUNK = old


@settings(max_examples=60, deadline=None)
@given(chunk=st.integers(1, 64), asked=st.lists(st.integers(0, 200), min_size=1, max_size=8))
def test_a_walker_reads_through_the_event_asked_then_pieces_that_double_up_to_a_chunk(chunk, asked):
    """A walker's first read ends at the event asked (a replay's peak early in a long trace read a whole chunk
    for it), and each later read is twice the last at least, through the event asked, at most a chunk."""
    rec = records_of([(True, i, 8) for i in range(201)])
    old = trace_records.CHUNK
    trace_records.CHUNK = chunk
    try:
        walker, allocs = LiveBytes(), R._AllocBytes()
        for k in sorted(asked):
            before = (walker.pos, walker.last)
            walker.at(rec, k)
            allocs.at(rec, k)
            assert (allocs.pos, allocs.last) == (walker.pos, walker.last)
            if before[0] > k:
                assert (walker.pos, walker.last) == before          # answered from the piece read
                continue
            assert min(chunk, 2 * before[1]) <= walker.last <= chunk
            assert walker.pos >= k + 1
            if before == (0, 0) and k < chunk:
                assert walker.pos == k + 1
    finally:
        trace_records.CHUNK = old
