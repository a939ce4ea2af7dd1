"""The public replay contract: `Replay` stepped and stopped, and the pressure events its walk drives
(CACHE_RELEASE, SET_LIMIT, recorded OOMs) under every built-in policy."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from allocsim import policies

from allocsim.search import validate
from allocsim.engine.replay import replay
from allocsim.engine.replay import Replay
from allocsim.testing import random_trace as generated_trace
from allocsim.trace import TraceWriter
from allocsim.trace.events import CACHE_RELEASE, OOM, SET_LIMIT
from allocsim.report.text import replay_summary

from conftest import random_trace

MiB = 1 << 20
SIM = [n for n in policies.names() if not policies.get(n).real_gpu]


def _strip(d):
    d = dict(d)
    d.pop("replay_seconds")
    return d


# ---- stepping, stopping, state --------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["split", "torch", "cupy", "bestfit"])
@given(steps=st.lists(st.integers(1, 700), min_size=1, max_size=8))
@settings(max_examples=15, deadline=None)
def test_stepping_in_any_pieces_gives_the_result_of_one_run(policy, steps):
    t = random_trace(1500, seed=5, max_size=1 << 22, streams=2)
    whole = replay(t, policy)
    r = Replay(t, policy)
    done = 0
    for n in steps:
        walked = r.step(n)
        assert 0 <= walked <= n
        done += walked
        assert r.events_done == done
        r.result()                                   # the result so far leaves the replay as it was
    while not r.at_end:
        r.step(997)
    assert _strip(r.finish().to_dict()) == _strip(whole.to_dict())


def test_run_until_stops_before_the_event_and_exposes_the_live_blocks():
    w = TraceWriter()
    a = w.alloc(3 * MiB)
    b = w.alloc(5 * MiB)
    w.free(a)
    c = w.alloc(1 * MiB)                            # trace index 3
    w.free(b)
    w.free(c)
    r = Replay(w.finish(), "bestfit")
    assert r.run(until=3) is None and r.events_done == 3 and not r.at_end
    blocks = r.live_blocks()
    assert sorted(blocks) == [b] and blocks[b][1] >= 5 * MiB
    assert r.allocated == blocks[b][1] and r.reserved >= r.allocated
    so_far = r.result()
    assert so_far.allocs == 2 and so_far.frees == 1 and so_far.driving_events == 3
    res = r.run()
    assert res.allocs == 3 and res.frees == 3 and r.live_blocks() == {} and r.at_end


def test_stop_ends_the_replay_where_it_is():
    t = random_trace(400, seed=2)
    r = Replay(t, "split")
    r.step(100)
    res = r.stop()
    assert res.driving_events == 100 and r.at_end
    assert r.step(5) == 0 and r.finish() is res


# ---- CACHE_RELEASE: what each policy gives back -----------------------------------------------------

#: After the program freed everything and released the cache: the bytes each policy still reserves.
#: ``oracle`` plans one heap for the whole trace and keeps it; ``torch`` is left to its own hook.
HOLDS_AFTER_RELEASE = {"oracle": "heap"}


def _release_trace(live_through=False):
    """Three objects freed (one kept live if ``live_through``), a cache release, one more request."""
    w = TraceWriter()
    keep = w.alloc(3 * MiB) if live_through else None
    ids = [w.alloc(s) for s in (512 * 1024, 5 * MiB, 40 * MiB)]
    for i in ids:
        w.free(i)
    w.record(CACHE_RELEASE)
    w.free(w.alloc(1000))
    if keep is not None:
        w.free(keep)
    return w.finish()


def _reserved_around_release(policy, trace):
    """Reserved bytes just before and just after the trace's first CACHE_RELEASE."""
    at = [i for i, k in enumerate(trace.kind.tolist()) if k == CACHE_RELEASE][0]
    r = Replay(trace, policy, capacity=None)
    r.run(until=at)
    before = r.reserved
    r.run(until=at + 1)
    return r, before, r.reserved


@pytest.mark.parametrize("policy", SIM)
def test_a_cache_release_gives_back_every_cached_segment(policy):
    r, before, after = _reserved_around_release(policy, _release_trace())
    expect = HOLDS_AFTER_RELEASE.get(policy)
    if expect == "heap":
        assert after == before == r.policy.heap
    else:
        assert after == 0, f"{policy} still reserves {after} B of a free cache after the release"
        if policy != "none":                        # `none` caches nothing: there was nothing to give
            assert before > 0
    res = r.run()
    assert res.completed and res.allocs == 4 and res.frees == 4


@pytest.mark.parametrize("policy", [p for p in SIM if p not in HOLDS_AFTER_RELEASE and p != "none"])
def test_a_cache_release_keeps_what_a_live_block_needs(policy):
    r, before, after = _reserved_around_release(policy, _release_trace(live_through=True))
    (addr, size), = r.live_blocks().values()
    assert size >= 3 * MiB and after >= size            # the live block's memory stays
    assert after < before                               # the free cache beside it went
    r.run()


def test_cache_release_is_timed_under_its_own_root_section():
    res = replay(_release_trace(), "cupy")
    roots = {s["name"]: s for s in res.sections if s["depth"] == 0}
    assert roots["cache release"]["ncalls"] == 1 and roots["cache release"]["seconds"] > 0
    assert res.counters["cache_flushes"] == 1


# ---- SET_LIMIT ------------------------------------------------------------------------------------

def _limited_trace(limit):
    """The program sets a limit, then holds 3 x 8 MiB; then lifts the limit and holds 3 more."""
    w = TraceWriter()
    w.record(SET_LIMIT, size=limit, aux=1)
    held = [w.alloc(8 * MiB) for _ in range(3)]
    w.record(SET_LIMIT, size=0, aux=1)
    held += [w.alloc(8 * MiB) for _ in range(3)]
    for i in held:
        w.free(i)
    return w.finish()


@pytest.mark.parametrize("policy", ["split", "cupy", "bestfit", "none"])
def test_a_recorded_limit_caps_the_device_until_lifted(policy):
    t = _limited_trace(20 * MiB)
    res = replay(t, policy, capacity=None, keep_going=True)
    assert [o.event for o in res.oom_events] == [3]         # the third 8 MiB does not fit under 20 MiB
    assert res.cap_bytes is None                            # lifted by the second SET_LIMIT
    assert replay(t, policy, capacity=None, keep_going=True, cap=1 << 30).ooms == 0   # --cap overrides


# ---- recorded OOMs -------------------------------------------------------------------------------

def _oom_trace(request):
    """2 x 8 MiB live, then a recorded OOM of ``request`` bytes, then the program goes on."""
    w = TraceWriter()
    a, b = w.alloc(8 * MiB), w.alloc(8 * MiB)
    w.oom(request)                                          # trace index 2
    w.free(a)
    c = w.alloc(4 * MiB)
    w.free(b)
    w.free(c)
    return w.finish()


@pytest.mark.parametrize("policy", [p for p in SIM if p != "oracle"])
def test_a_recorded_oom_that_fails_again_is_recorded_and_the_walk_goes_on(policy):
    res = replay(_oom_trace(64 * MiB), policy, capacity=None, cap=40 * MiB)
    assert res.ooms == 1 and res.ooms_avoided == []
    o = res.first_oom
    assert o.recorded and o.event == 2 and o.size == 64 * MiB and o.live_bytes == 16 * MiB
    assert res.completed and res.allocs == 3 and res.frees == 3     # without --keep-going, past the OOM
    assert "(recorded OOM)" in replay_summary(res)


@pytest.mark.parametrize("policy", [p for p in SIM if p != "oracle"])
def test_a_recorded_oom_served_is_listed_and_freed_at_once(policy):
    t = _oom_trace(4 * MiB)
    res = replay(t, policy, capacity=None)
    assert res.ooms == 0 and res.ooms_avoided == [2]
    assert "recorded OOM at event 2: served under this policy/setting (would not have happened)" in replay_summary(res)
    r = Replay(t, policy, capacity=None)
    r.run(until=2)
    held = r.allocated
    r.step(1)
    assert r.allocated == held                          # the served request is not held past its event
    assert res.allocs == 3 and res.frees == 3 and res.completed


def test_an_offline_plan_leaves_recorded_ooms_out():
    res = replay(_oom_trace(4 * MiB), "oracle", capacity=None)
    assert res.ooms == 0 and res.ooms_avoided == [] and res.completed and res.allocs == 3


def test_an_unrecorded_oom_still_stops_the_walk():
    w = TraceWriter()
    w.oom(1 * MiB)
    w.alloc(64 * MiB)
    w.alloc(1 * MiB)
    res = replay(w.finish(), "split", capacity=None, cap=32 * MiB)
    assert res.ooms_avoided == [0] and res.ooms == 1 and not res.first_oom.recorded and not res.completed
    assert res.driving_events == 2


def test_validate_compares_the_oom_events():
    def trace(request):
        w = TraceWriter(meta={"framework": "cupy", "device": {"name": "t", "total_memory": 64 * MiB}})
        w.segment(3, 0x7F0000000000, 8 * MiB)      # SEGMENT_ALLOC the model makes too
        a = w.alloc(8 * MiB)
        w.oom(request)
        w.free(a)
        return w.finish()

    same = validate.validate(trace(1 << 30))             # fails under the model too: MATCH
    assert same.match and {c["name"]: c["ok"] for c in same.checks}["OOM events"]
    served = validate.validate(trace(1 * MiB))           # the model serves it: MISMATCH on the OOMs
    checks = {c["name"]: c for c in served.checks}
    assert not served.match and not checks["OOMs"]["ok"] and not checks["OOM events"]["ok"]
    assert checks["OOM events"]["recorded"] == "2" and checks["OOM events"]["model"] == "-"


def test_generated_traces_for_check_policy_hold_cache_releases():
    import random
    rng = random.Random(0)
    kinds = {k for _ in range(30) for k in generated_trace(rng).kind.tolist()}
    assert CACHE_RELEASE in kinds and OOM not in kinds


def test_cli_a_recorded_oom_that_happens_again_is_not_a_stop():
    """`replay` of a run that survived an OOM: under its own model the OOM happens again and the replay goes
    on, as the program did (exit 0, one note); a policy that runs out elsewhere stops there (exit 1)."""
    from conftest import ROOT, run_cli
    path = os.path.join(ROOT, "traces", "pressure-fraction-oom.bin")
    same = run_cli("replay", path, "-p", "torch", "--json")
    assert same.returncode == 0, same.stderr
    assert "1 recorded OOM happened again, as in the recorded run" in same.stderr
    assert json.loads(same.stdout)["completed"]
    other = run_cli("replay", path, "-p", "split", "--json")
    assert other.returncode == 1 and "(replay stopped;" in other.stderr and "recorded OOM" not in other.stderr


@settings(max_examples=30, deadline=None)
@given(pieces=st.lists(st.integers(1, 400), min_size=1, max_size=40), most=st.integers(1, 50))
@example(pieces=[400] * 5, most=50)     # past half the chunk in pieces: still each piece's own events
def test_a_chunk_read_in_pieces_converts_each_event_read_once_until_many_pieces(pieces, most):
    """`_Chunk.columns`: each piece is the events' own columns (the whole chunk's lists' slices, bit for bit); a
    piece converts its own events only (a folding walk that passes most of a chunk converts only the steps it
    walks, and none twice), and the whole chunk is converted only where it is asked for whole or after `PIECES`
    pieces."""
    import allocsim.engine.replay as replay_module
    w = TraceWriter(meta={"producer": "test"})
    for k in range(1500):
        w.free(w.alloc(512 * (k % 7 + 1), stream=k % 2))
    trace = w.finish()
    whole = next(replay_module.chunks_of(trace, False, []))
    expected = [whole.kind, whole.ids, whole.sizes, whole.streams]     # (converted before `_lists` is counted)
    c = next(replay_module.chunks_of(trace, False, []))
    n, lo, converted, switched = len(c.at), 0, [], False
    lists = replay_module._Chunk._lists
    kept, replay_module.PIECES = replay_module.PIECES, most
    try:
        replay_module._Chunk._lists = lambda self, a, b: converted.append(b - a) or lists(self, a, b)
        for k, size in enumerate(pieces):
            hi = min(n, lo + size)
            got = c.columns(lo, hi)
            assert [list(col) for col in got] == [col[lo:hi] for col in expected]
            switched = switched or k >= most or (lo == 0 and hi >= n)
            assert ("_rec" not in c.__dict__) == switched, (k, lo, hi, n)
            read = sum(min(n, sum(pieces[:i]) + s) - min(n, sum(pieces[:i])) for i, s in enumerate(pieces[:k + 1]))
            assert sum(converted) <= read + (n if switched else 0), (converted, read)
            lo = hi
    finally:
        replay_module.PIECES = kept
        replay_module._Chunk._lists = lists
