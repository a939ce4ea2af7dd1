"""The engine: the walk agrees with its hooks on or off; runtime semantics; 0-byte bypass; sections."""
import pytest

from allocsim import policies
from allocsim.engine.replay import replay
from allocsim.engine.replay import Replay
from allocsim.trace import TraceWriter

from conftest import random_trace

SIM = [n for n in policies.names() if not policies.get(n).real_gpu]


def _strip(d):
    d = dict(d)
    d.pop("replay_seconds")
    return d


@pytest.mark.parametrize("policy", SIM)
@pytest.mark.parametrize("runtime", ["eager", "gc"])
def test_the_walk_gives_the_same_results_with_hooks_on(policy, runtime):
    t = random_trace(1200, seed=11, max_size=1 << 22, streams=2)
    for cap in (None, t.load_bytes + (t.load_bytes >> 2)):
        lean = replay(t, policy, runtime=runtime, cap=cap, keep_going=True)
        general = replay(t, policy, runtime=runtime, cap=cap, keep_going=True, observer=lambda *a: None)
        assert _strip(lean.to_dict()) == _strip(general.to_dict())


def _replayed(t):
    """The policy and runtime of a finished `none` replay under `gc` (its dead objects not yet collected)."""
    r = Replay(t, "none", runtime="gc")
    r.run()
    return r.policy, r.runtime


def _gc_trace():
    w = TraceWriter()
    a = w.alloc(1000)          # will be promoted by the first collection, then die
    b = w.alloc(1000)
    w.free(b)                  # dies young
    return w, a


def test_incremental_collection_reclaims_only_young_dead():
    w, a = _gc_trace()
    t = w.finish()
    pol, rt = _replayed(t)
    assert pol.allocated == 2000          # the free of b only marked it dead
    assert rt.collect(False) == 1 and pol.allocated == 1000
    w2, a2 = _gc_trace()
    w2.free(a2)
    t2 = w2.finish()
    pol, rt = _replayed(t2)
    assert rt.collect(False) == 2         # nothing was promoted yet: both died young
    w3 = TraceWriter()
    a3 = w3.alloc(1000)
    t3 = w3.finish()
    pol, rt = _replayed(t3)
    rt.collect(False)                     # a3 survives: promoted
    rt.on_free(a3)
    assert rt.collect(False) == 0 and pol.allocated == 1000   # old dead: only a full collection
    assert rt.collect(True) == 1 and pol.allocated == 0
    assert (rt.gc_incremental, rt.gc_full) == (2, 1)


def test_periodic_collection_every_n_bytes():
    w = TraceWriter()
    for _ in range(10):
        w.free(w.alloc(1 << 20))
    t = w.finish()
    r = replay(t, "none", runtime="gc", gc_every=3 << 20)
    # collections run before the 3rd, 6th and 9th allocation: they reclaim 2, 3 and 3 dead MiB
    assert r.gc_incremental == 3 and r.gc_reclaimed_bytes == 8 << 20
    assert any(s["name"] == "gc(false) (periodic)" for s in r.sections)


def test_zero_byte_requests_bypass_the_pool():
    w = TraceWriter()
    z = w.alloc(0)
    a = w.alloc(512)
    w.free(z)
    w.free(a)
    r = replay(w.finish(), "none")
    assert (r.allocs, r.frees, r.device_mallocs) == (2, 2, 1)


def test_oom_stops_unless_keep_going():
    w = TraceWriter()
    a = w.alloc(600)
    b = w.alloc(600)
    c = w.alloc(100)
    for i in (a, b, c):
        w.free(i)
    t = w.finish()
    r = replay(t, "none", cap=1000)
    assert r.ooms == 1 and r.oom_events[0].event == 1 and not r.completed and r.driving_events == 2
    assert r.oom_events[0].live_bytes == 600 and r.oom_events[0].reserved_bytes == 600
    k = replay(t, "none", cap=1000, keep_going=True)
    assert k.ooms == 1 and k.completed and k.allocs == 3 and k.frees == 2


def test_section_roots_add_up_to_the_modeled_clock():
    t = random_trace(800, seed=4)
    r = replay(t, "none", runtime="gc", cap=t.load_bytes, keep_going=True, gc_every=8 << 20)
    roots = sum(s["seconds"] for s in r.sections if s["depth"] == 0)
    assert roots == pytest.approx(r.total_time_seconds, rel=1e-9)


@pytest.mark.parametrize("name, policy", [("cupy_mlp.bin", "cupy"), ("pressure-cupy-cycles-fixed.bin", "cupy"),
                                          ("pools-compile.bin", "torch"), ("pressure-fraction-oom.bin", "torch")])
def test_a_small_traces_kept_chunks_replay_as_chunks_made_afresh(monkeypatch, name, policy):
    """`kept_chunks`: the replays of a small trace share its chunks (lists made once, 0-byte requests counted from
    the kept arrays, recorded segment calls kept); each replay, stopped part-way or run to the end, gives what one
    that makes its own gives (traces with 0-byte requests, flagged frees and private-pool events)."""
    import importlib
    import os
    from allocsim.trace import Trace
    from conftest import ROOT
    engine = importlib.import_module("allocsim.engine.replay")       # the module (the package's ``replay`` is the function)
    t = Trace.load(os.path.join(ROOT, "traces", name))
    assert len(t) <= engine.KEEP_RECORDS

    def results():
        out = []
        for until in (len(t) // 3, None):
            r = Replay(t, policy)
            r.run(until)
            out.append(_strip(r.result().to_dict()) if until else _strip(r.finish().to_dict()))
            r.close()
        return out
    kept = [results(), results()]          # the second pair reads what the first kept
    assert engine._KEPT and any(v[0] is t for v in engine._KEPT.values())
    monkeypatch.setattr(engine, "KEEP_RECORDS", 0)
    engine._KEPT.clear()
    afresh = results()
    assert not engine._KEPT
    assert kept[0] == kept[1] == afresh


@pytest.mark.parametrize("policy", ["split", "torch", "simple"])
def test_a_results_json_form_is_asdicts(policy):
    """`ReplayResult.to_dict` builds the OOM lists itself (`OOMRecord.to_dict`): the whole form equals
    `dataclasses.asdict`'s less the three fields it leaves out, OOMs with and without a breakdown, caught ones too."""
    import dataclasses
    t = random_trace(n=1500, seed=7, max_size=1 << 24)
    for timeline in (False, True):
        r = replay(t, policy, cap=t.load_bytes // 2, keep_going=True, timeline=timeline)
        assert r.oom_events
        r.caught_oom_events.append(dataclasses.replace(r.oom_events[0], caught=True, scope="try", breakdown=None))
        want = dataclasses.asdict(r)
        for name in ("certified_limits", "folded") + (() if timeline else ("timeline",)):
            del want[name]
        got = r.to_dict(timeline=timeline)
        assert got == want and list(got) == list(want)
        got["oom_events"][0]["size"] += 1
        if got["oom_events"][0]["breakdown"] is not None:
            got["oom_events"][0]["breakdown"]["hard"] += 1          # a copy: the result is as it was
        assert dataclasses.asdict(r)["oom_events"] == want["oom_events"]
