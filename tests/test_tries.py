"""TRY scopes (code that catches an OOM raised inside it and goes on; docs/allocator-dependent.md, "Try scopes"):
`allocsim.tries()` writes one into the running recording; a replay under a cap that fails a request inside one
survives it and unwinds the innermost try, on the plain walk, every fused loop and a folded walk alike; `compare`,
`fit`, `tune` and `validate` follow it."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import allocsim
import allocsim.formats.recorders as recorders
import allocsim.trace.trace as trace_module
from allocsim.formats.recorders._base import Recorder
from allocsim.engine.replay import Replay, replay
from allocsim.trace import Trace, TraceWriter
from allocsim.trace import events as ev
from allocsim.trace.scopes import scopes_of, sure_load

from test_fast_path import FUSED, FUSED_IDS, assert_fused_is_plain, pressured_traces

MiB = 1 << 20
POLICIES = ["torch", "torch[expandable_segments:True]", "split", "bestfit", "cupy", "simple", "binned", "knet"]


# ---- allocsim.tries() ----------------------------------------------------------------------------------------
class FakeRecorder(Recorder):
    """A recorder whose trace is an in-memory `TraceWriter` (no framework, no GPU)."""

    def __init__(self):
        super().__init__("unused.bin", command=[])
        self.writer = TraceWriter({"framework": "torch"})
        self.settled = 0

    def settle(self):
        self.settled += 1


@pytest.fixture
def recording(monkeypatch):
    rec = FakeRecorder()
    monkeypatch.setattr(recorders, "_active", rec)
    return rec


def test_tries_writes_a_try_scope_into_the_recording(recording):
    w = recording.writer
    with allocsim.tries("back-off"):
        a = w.alloc(10)
        with allocsim.tries():
            w.free(a)
    with pytest.raises(RuntimeError):
        with allocsim.tries("back-off"):
            raise RuntimeError("not an OOM: the END is still written")
    t = w.finish()
    assert [ev.KIND_NAMES[k] for k in t.kind.tolist()] == ["TRY_BEGIN", "ALLOC", "TRY_BEGIN", "FREE", "TRY_END",
                                                          "TRY_END", "TRY_BEGIN", "TRY_END"]
    assert [t.labels[a] for a in t.aux[t.kind != ev.ALLOC][t.kind[t.kind != ev.ALLOC] != ev.FREE].tolist()] == \
        ["back-off", "user", "user", "back-off", "back-off", "back-off"]
    assert t.size[(t.kind == ev.TRY_BEGIN) | (t.kind == ev.TRY_END)].tolist() == [1, 2, 2, 1, 3, 3]
    assert recording.settled == 6       # each BEGIN and END lands after what the recorder saw before it
    s = scopes_of(t)
    assert (s.begin.tolist(), s.end.tolist()) == ([0, 2, 6], [5, 4, 7])


def test_tries_without_a_recording_does_nothing(monkeypatch):
    monkeypatch.setattr(recorders, "_active", None)
    with allocsim.tries("x"):
        pass
    assert "torch" not in allocsim.__dict__


# ---- the replay ----------------------------------------------------------------------------------------------
def autotune_trace(meta=None) -> Trace:
    """Worked by hand (docs/allocator-dependent.md): 8 MiB live (a); a try "autotune" allocates 8 MiB (b), asks for
    30 MiB (c, freed at once) and 5 MiB (d), frees b and ends; d is freed after it; then 16 MiB (e). Inside the try,
    a nested try "inner" asks for 2 MiB (f) and frees it. Under a 40 MiB cap c fails (8 + 8 + 30 > 40, 32 rounded up
    in bins): survived; the try unwinds: b freed, the inner try's f and d skipped; then e: the peak allocated is
    a + e = 24 MiB (LOAD, a + b + c, is 46 MiB)."""
    w = TraceWriter({"framework": "torch", **(meta or {})})
    a = w.alloc(8 * MiB)
    s = w.begin(ev.TRY_BEGIN, "autotune")
    b = w.alloc(8 * MiB)
    c = w.alloc(30 * MiB)
    w.free(c)
    inner = w.begin(ev.TRY_BEGIN, "inner")
    f = w.alloc(2 * MiB)
    w.free(f)
    w.end(ev.TRY_END, "inner", inner)
    d = w.alloc(5 * MiB)
    w.free(b)
    w.end(ev.TRY_END, "autotune", s)
    w.free(d)
    e = w.alloc(16 * MiB)
    w.free(e)
    w.free(a)
    return w.finish()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("fast_path", [True, False])
def test_a_failure_inside_a_try_is_survived_and_the_try_unwinds(policy, fast_path):
    r = replay(autotune_trace(), policy, cap=40 * MiB, capacity=None, fast_path=fast_path)
    assert r.completed and r.ooms == 0
    assert r.caught_ooms == 1 and [(o.event, o.size, o.scope) for o in r.caught_oom_events] == [(3, 30 * MiB,
                                                                                                   "autotune")]
    assert (r.unwound_blocks, r.skipped_allocs) == (1, 2)
    assert (r.allocs, r.frees) == (4, 3)           # a, b, c (failed), e; b (unwound), e, a
    assert r.peak_allocated_bytes == 24 * MiB


def test_an_unmarked_failure_still_ends_the_run_and_the_innermost_try_unwinds():
    w = TraceWriter({"framework": "torch"})
    outer = w.begin(ev.TRY_BEGIN, "outer")
    a = w.alloc(8 * MiB)                            # the outer try's: kept, the inner one unwinds
    inner = w.begin(ev.TRY_BEGIN, "inner")
    b = w.alloc(30 * MiB)                           # fails under 32 MiB: the inner try unwinds
    c = w.alloc(1 * MiB)                            # skipped
    w.end(ev.TRY_END, "inner", inner)
    d = w.alloc(4 * MiB)                            # the outer try goes on
    for i in (b, c, d):
        w.free(i)
    w.end(ev.TRY_END, "outer", outer)
    e = w.alloc(30 * MiB)                           # outside every try, with a live: an OOM that ends the run
    w.free(e)
    w.free(a)
    r = replay(w.finish(), "split", cap=32 * MiB, capacity=None)
    assert [(o.event, o.scope) for o in r.caught_oom_events] == [(3, "inner")]
    assert (r.unwound_blocks, r.skipped_allocs) == (0, 1)
    assert not r.completed and r.ooms == 1 and r.oom_events[0].event == 11
    assert r.peak_allocated_bytes == 12 * MiB


def test_a_flagged_request_inside_a_try_is_the_single_request_rule():
    """CATCHES_OOM catches right around its request, inside any try: only that request is dropped."""
    w = TraceWriter({"framework": "torch"})
    s = w.begin(ev.TRY_BEGIN, "t")
    a = w.alloc(8 * MiB)
    b = w.alloc(30 * MiB, flags=ev.CATCHES_OOM)
    c = w.alloc(4 * MiB)
    for i in (b, c, a):
        w.free(i)
    w.end(ev.TRY_END, "t", s)
    r = replay(w.finish(), "torch", cap=32 * MiB, capacity=None)
    assert r.completed and [(o.event, o.scope) for o in r.caught_oom_events] == [(2, None)]
    assert (r.unwound_blocks, r.skipped_allocs, r.peak_allocated_bytes) == (0, 0, 12 * MiB)


def test_a_recorded_oom_inside_a_try_is_attempted_and_nothing_unwinds():
    """The program really caught it: what it did next is in the trace."""
    w = TraceWriter({"framework": "torch"})
    a = w.alloc(8 * MiB)
    s = w.begin(ev.TRY_BEGIN, "t")
    b = w.alloc(4 * MiB)
    w.oom(30 * MiB)
    c = w.alloc(2 * MiB)
    w.end(ev.TRY_END, "t", s)
    for i in (b, c, a):
        w.free(i)
    r = replay(w.finish(), "split", cap=32 * MiB, capacity=None)
    assert r.completed and r.caught_ooms == 0 and r.ooms == 1 and r.oom_events[0].recorded
    assert (r.unwound_blocks, r.skipped_allocs, r.allocs, r.frees) == (0, 0, 3, 3)


def test_a_try_left_open_skips_to_the_end_and_gc_reclaims_the_unwound():
    w = TraceWriter({"framework": "torch"})
    w.begin(ev.TRY_BEGIN, "cut short")
    a = w.alloc(8 * MiB)
    b = w.alloc(30 * MiB)
    c = w.alloc(1 * MiB)
    for i in (a, b, c):
        w.free(i)
    t = w.finish()
    for runtime in ("eager", "gc"):
        r = replay(t, "split", cap=32 * MiB, capacity=None, runtime=runtime)
        assert r.completed and r.caught_ooms == 1 and (r.unwound_blocks, r.skipped_allocs) == (1, 1)
        assert (r.allocs, r.frees) == (2, 1)


def test_the_report_says_oms_survived(tmp_path, capsys):
    from allocsim.cli import main
    path = str(tmp_path / "t.bin")
    autotune_trace().save(path)
    assert main(["replay", path, "-p", "torch", "--cap", "40MiB", "--no-sections"]) == 0
    out, err = capsys.readouterr()
    assert "OOMs survived                       1" in out and '(in try "autotune")' in out
    assert "1 blocks and skipped 2 requests" in out
    assert len(err.strip().splitlines()) == 1 and "try scopes" in err and "1 blocks freed" in err


# ---- cuDNN's halving ------------------------------------------------------------------------------------------
def search_trace(release: bool = True) -> Trace:
    """Worked by hand: 8 MiB live (a); a cuDNN plan search asks for 40 MiB (flagged), frees it, and (``release``)
    the emptyCache after the search frees a segment; then 4 MiB. Under a 32 MiB cap the search fails and asks for
    20 MiB, granted: 1 OOM survived, peak allocated 28 MiB; under 24 MiB 20 MiB fails too and 10 MiB is granted:
    2 survived, peak 18 MiB. Without the release it is no search: the single-request rule (peak 12 MiB)."""
    w = TraceWriter({"framework": "torch"})
    a = w.alloc(8 * MiB)
    ws = w.alloc(40 * MiB, flags=ev.CATCHES_OOM)
    w.free(ws)
    if release:
        w.segment(ev.SEGMENT_FREE, 1 << 32, 40 * MiB)
    x = w.alloc(4 * MiB)
    w.free(x)
    w.free(a)
    return w.finish()


@pytest.mark.parametrize("policy", ["split", "simple", "bestfit", "cupy"])
@pytest.mark.parametrize("fast_path", [True, False])
def test_a_plan_search_that_fails_asks_again_for_half(policy, fast_path):
    for cap, survived, peak in ((32, [40], 28), (24, [40, 20], 18)):
        r = replay(search_trace(), policy, cap=cap * MiB, capacity=None, fast_path=fast_path)
        assert r.completed and [o.size // MiB for o in r.caught_oom_events] == survived
        assert r.peak_allocated_bytes == peak * MiB and (r.allocs, r.frees) == (3, 3)
    r = replay(search_trace(release=False), policy, cap=32 * MiB, capacity=None, fast_path=fast_path)
    assert r.caught_ooms == 1 and r.peak_allocated_bytes == 12 * MiB and (r.allocs, r.frees) == (3, 2)


# ---- generated traces ----------------------------------------------------------------------------------------
@st.composite
def searched_traces(draw):
    """`pressured_traces` with some ALLOCs flagged CATCHES_OOM and a SEGMENT_FREE put right after some FREEs (a
    flagged request freed so is a cuDNN plan search: `allocsim.trace.scopes.plan_searches`)."""
    t = draw(pressured_traces())
    rec = np.asarray(t.records).copy()
    alloc = np.flatnonzero(rec["kind"] == ev.ALLOC)
    flagged = draw(st.lists(st.booleans(), min_size=len(alloc), max_size=len(alloc)))
    rec["flags"][alloc[np.array(flagged, bool)]] |= ev.CATCHES_OOM
    frees = np.flatnonzero(rec["kind"] == ev.FREE)
    after = draw(st.lists(st.booleans(), min_size=len(frees), max_size=len(frees)))
    at = frees[np.array(after, bool)] + 1
    new = np.zeros(len(at), rec.dtype)
    new["kind"], new["id"], new["site"], new["size"] = ev.SEGMENT_FREE, ev.NO_ID, ev.NO_SITE, MiB
    return Trace(np.insert(rec, at, new), {**t.meta, "framework": "torch"}, streams=t.streams, sites=t.sites)


@st.composite
def tried_traces(draw, base=None):
    """`pressured_traces` with TRY scopes put in, nested, some left open (a trace cut short)."""
    t = draw(pressured_traces() if base is None else base)
    n = len(t)
    where = sorted(draw(st.lists(st.integers(0, n), min_size=0, max_size=12)))
    rec, open_, serial, labels = [], [], 0, ["a", "b"]
    for x in where:
        if open_ and draw(st.booleans()):
            s = open_.pop()
            rec.append((x, ev.TRY_END, s))
        else:
            serial += 1
            open_.append(serial)
            rec.append((x, ev.TRY_BEGIN, serial))
    if draw(st.booleans()):
        rec += [(n, ev.TRY_END, s) for s in reversed(open_)]
    new = np.zeros(len(rec), t.records.dtype)
    new["kind"] = [k for _, k, _ in rec]
    new["size"] = [s for _, _, s in rec]
    new["aux"] = [s % 2 for _, _, s in rec]
    new["id"] = ev.NO_ID
    new["site"] = ev.NO_SITE
    records = np.insert(np.asarray(t.records), [x for x, _, _ in rec], new)
    return Trace(records, {**t.meta, "framework": "torch"}, streams=t.streams, sites=t.sites, labels=labels)


def without_scopes(t: Trace) -> Trace:
    """``t`` with its scope records made GC records, which no replay reads (the trace indices stay)."""
    rec = np.array(t.records)
    scope = np.isin(rec["kind"], ev.SCOPE_KINDS)
    rec["kind"][scope], rec["aux"][scope], rec["size"][scope] = ev.GC, 0, 0
    return Trace(rec, t.meta, streams=t.streams, sites=t.sites, labels=t.labels)


class Watched:
    """Wraps a replay's policy: every handle freed was served and is live (no block freed twice, no skipped request
    freed), and allocated never goes negative."""

    def __init__(self, r: Replay):
        self.live, pol = set(), r.policy
        malloc, free = pol.malloc, pol.free

        def watched_malloc(size, stream):
            h = malloc(size, stream)
            if h is not None:
                assert h not in self.live
                self.live.add(h)
            return h

        def watched_free(h):
            assert h in self.live, f"freed twice, or never served: {h}"
            self.live.discard(h)
            free(h)
            assert pol.allocated >= 0

        pol.malloc, pol.free = watched_malloc, watched_free


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(trace=tried_traces(searched_traces()), policy=st.sampled_from(["split", "simple", "bestfit", "torch"]),
       tight=st.sampled_from([0.3, 0.6, 0.9]), runtime=st.sampled_from(["eager", "gc"]))
def test_unwinding_frees_each_block_once_and_never_a_skipped_request(trace, policy, tight, runtime):
    r = Replay(trace, policy, cap=int(max(trace.load_bytes, MiB) * tight), capacity=None, runtime=runtime,
               fast_path=False, keep_going=True, fold=False)
    Watched(r)
    res = r.run()
    r.collect(True)
    assert len(r.live_blocks()) == len(r.handles)
    assert res.frees <= res.allocs and res.unwound_blocks <= res.allocs - res.skipped_allocs
    assert all(o.scope is not None or trace.flags[o.event] & ev.CATCHES_OOM for o in res.caught_oom_events)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(trace=tried_traces(), policy=st.sampled_from(["split", "torch", "cupy"]), capped=st.booleans())
def test_scopes_change_nothing_where_no_request_fails(trace, policy, capped):
    plain = without_scopes(trace)
    cap = replay(plain, policy, capacity=None).peak_reserved_bytes if capped else None
    got, want = (replay(t, policy, cap=cap, capacity=None).to_dict() for t in (trace, plain))
    assume(not any(not o["recorded"] for o in want["oom_events"]))   # a recorded limit may make a request fail
    for d in (got, want):
        for k in ("replay_seconds", "load_seconds"):
            d.pop(k)
    assert got == want


@pytest.mark.parametrize("policy, options", FUSED, ids=FUSED_IDS)
@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(trace=tried_traces(searched_traces()), chunk=st.sampled_from([3, 17, 1 << 16]),
       tight=st.sampled_from([0.3, 0.6, 0.9]),
       keep_going=st.booleans(), steps=st.sampled_from([None, 1, 5]))
def test_tries_fused_is_plain(policy, options, trace, chunk, tight, keep_going, steps, monkeypatch):
    monkeypatch.setattr(trace_module, "CHUNK", chunk)
    assert_fused_is_plain(trace, policy, options, cap=int(max(trace.load_bytes, MiB) * tight),
                          keep_going=keep_going, steps=steps)


def test_sure_load_leaves_out_what_a_try_can_drop():
    t = autotune_trace()
    assert t.load_bytes == 46 * MiB and sure_load(t) == 24 * MiB       # a + e; b, c, d, f can be dropped
    assert sure_load(without_scopes(t)) == 46 * MiB


# ---- compare, fit, tune, validate ----------------------------------------------------------------------------
def test_compare_fit_and_tune_live_through_survived_ooms(tmp_path):
    from allocsim.search.tune import tune
    t = autotune_trace({"device": {"total_memory": 80 * MiB}})
    path = str(tmp_path / "t.bin")
    t.save(path)
    rows = allocsim.compare(path, ["split", "torch"], caps=[40 * MiB])
    assert all(r["completed"] and not r["ooms"] and r["caught_ooms"] == 1 for r in rows)
    f = allocsim.fit_capacity(path, "split")
    assert f["capacity_bytes"] == 24 * MiB and f["survived_ooms"] == 1     # a + e: below LOAD (46 MiB)
    res = tune(path, cap=40 * MiB)
    assert res.best is not None and res.best["caught_ooms"] == 1 and not res.best["ooms"]


def recorded_capped_trace() -> Trace:
    """A torch run recorded under a 40 MiB limit that survived an OOM inside a try: 12 MiB (a) in a segment, then in
    a try 12 MiB (b) in another, a 30 MiB request that failed (its OOM record), b freed as the exception left; after
    the try 12 MiB (c) from b's cached segment."""
    w = TraceWriter({"framework": "torch", "allocator_settings": {}, "device": {"total_memory": 80 << 30}})
    w.record(ev.SET_LIMIT, size=40 * MiB, addr=ev.fraction_bits(40 * MiB / (80 << 30)))
    w.segment(ev.SEGMENT_ALLOC, 1 << 32, 12 * MiB)
    a = w.alloc(12 * MiB, addr=1 << 32)
    s = w.begin(ev.TRY_BEGIN, "back-off")
    w.segment(ev.SEGMENT_ALLOC, 2 << 32, 12 * MiB)
    b = w.alloc(12 * MiB, addr=2 << 32)
    w.oom(30 * MiB, device_free=40 * MiB)
    w.free(b)
    w.end(ev.TRY_END, "back-off", s)
    c = w.alloc(12 * MiB, addr=2 << 32)
    w.free(c)
    w.free(a)
    return w.finish()


def test_a_recorded_capped_run_with_survived_ooms_validates():
    from allocsim.search.validate import validate
    v = validate(recorded_capped_trace())
    assert v.match and v.try_scopes == 1
    assert {"name": "OOMs survived", "recorded": 0, "model": 0, "ok": True} in v.checks
    assert {"name": "OOMs", "recorded": 1, "model": 1, "ok": True} in v.checks


# ---- cuDNN's plan searches without C++ stacks ----------------------------------------------------------------
def plan_search_trace(release: str) -> tuple[Trace, int, int]:
    """A search's workspace w (its own segment) freed, then the emptyCache's segment free: directly
    (``release`` "none": main's recorder), after a CACHE_RELEASE the recorder inferred ("inferred") or after the
    program's own ``empty_cache()`` ("program"); then the chosen plan's workspace p and an ordinary request x whose
    FREE is followed by a segment alloc. Returns the trace, w's index and the CACHE_RELEASE's (or -1)."""
    w = TraceWriter({"framework": "torch"})
    w.segment(ev.SEGMENT_ALLOC, 1 << 32, 64 * MiB)
    ws = w.alloc(64 * MiB, addr=1 << 32)
    at = w.count - 1
    w.free_requested(ws)
    w.free(ws)
    rel = -1
    if release != "none":
        rel = w.count
        w.record(ev.CACHE_RELEASE)
    w.segment(ev.SEGMENT_FREE, 1 << 32, 64 * MiB)
    p = w.alloc(8 * MiB)
    x = w.alloc(MiB)
    w.free(x)
    w.segment(ev.SEGMENT_ALLOC, 2 << 32, 20 * MiB)
    w.free(p)
    return w.finish(), at, rel


@pytest.mark.parametrize("release", ["none", "inferred", "program"])
def test_plan_searches_are_the_requests_an_emptycache_follows(release, tmp_path):
    from allocsim.formats.recorders.cudnn import flag_plan_searches, plan_searches
    t, at, rel = plan_search_trace(release)
    program = [rel] if release == "program" else []
    want = [] if release == "program" else [at]
    assert plan_searches(t.records, program).tolist() == want
    path = str(tmp_path / "t.bin")
    t.save(path)
    assert flag_plan_searches(path, program) == len(want)
    flagged = Trace.load(path)
    assert np.flatnonzero(flagged.flags & ev.CATCHES_OOM).tolist() == want
    assert flag_plan_searches(path, program) == 0          # flagged already


def test_the_torch_recorder_seals_its_trace_with_the_plan_searches(tmp_path, monkeypatch):
    """`Recorder.seal` runs on the finished file before it is published; the torch recorder's flags the searches
    where cudnn.benchmark is on and no C++ stacks are kept."""
    from types import SimpleNamespace
    from allocsim.formats.recorders import cudnn
    t, at, _ = plan_search_trace("inferred")
    for benchmark, stacks, want in ((True, False, [at]), (False, False, []), (True, "all", [])):
        rec = FakeRecorder()
        rec.out = str(tmp_path / f"out-{benchmark}-{stacks}.bin")
        rec.stacks, rec.program_releases = stacks, []
        rec.torch = SimpleNamespace(backends=SimpleNamespace(cudnn=SimpleNamespace(benchmark=benchmark)))
        rec.open_trace({"framework": "torch"})
        for r in np.asarray(t.records).tolist():
            kind, flags, stream, id_, site, aux, size, time_ns, addr = r
            rec.writer.record(kind, flags=flags, id_=id_, aux=aux, size=size, addr=addr)
        rec.seal = cudnn.seal.__get__(rec)
        out = rec.close_trace()
        assert np.flatnonzero(out.flags & ev.CATCHES_OOM).tolist() == want
        assert np.flatnonzero(Trace.load(rec.out).flags & ev.CATCHES_OOM).tolist() == want
        assert any("plan-search" in n for n in rec.notes) == bool(benchmark and stacks != "all")


def test_a_folded_replay_with_tries_is_the_full_walk():
    """Steps that survive an OOM in a try are walked; the steps after, which repeat, fold, and the result is the
    full walk's."""
    w = TraceWriter({"framework": "torch"})
    keep = w.alloc(4 * MiB)
    for step in range(40):
        w.mark("step")
        a = w.alloc(8 * MiB)
        s = w.begin(ev.TRY_BEGIN, "t")
        b = w.alloc((30 if step < 3 else 2) * MiB)          # fails under 32 MiB in the first steps only
        c = w.alloc(MiB)
        for i in (c, b):
            w.free(i)
        w.end(ev.TRY_END, "t", s)
        w.free(a)
    w.free(keep)
    t = w.finish()
    for policy in ("split", "torch", "cupy"):
        folded = Replay(t, policy, cap=32 * MiB, capacity=None)
        got = folded.run()
        want = replay(t, policy, cap=32 * MiB, capacity=None, fold=False)
        assert got.caught_ooms == 3 and got.skipped_allocs == 3 and folded.folded is not None
        d, e = got.to_dict(), want.to_dict()
        for x in (d, e):
            x.pop("replay_seconds")
        assert d == e


def test_a_checkpoint_inside_an_unwound_try_resumes_as_the_walk_goes_on():
    t = autotune_trace()
    whole = replay(t, "torch", cap=40 * MiB, capacity=None).to_dict()
    r = Replay(t, "torch", cap=40 * MiB, capacity=None)
    r.step(4)                           # past the failed request: the try's later ALLOCs are being skipped
    assert r._w.skip_until is not None and r.can_checkpoint()
    again = Replay(t, "torch", cap=40 * MiB, capacity=None)
    again.resume(r.checkpoint())
    got = again.run().to_dict()
    for d in (whole, got):
        d.pop("replay_seconds")
    assert got == whole


def test_a_halved_workspace_that_its_try_unwinds_counts_once():
    """A plan search's halved workspace inside a try that a later failure unwinds: the trace's whole size is dropped
    at the unwind, and the shortfall of the halved block no longer counts beside it (it did: the recorded OOM's
    breakdown read -18 MiB requested under split, -28 MiB under torch; what lives there is the 2 MiB block)."""
    w = TraceWriter({"framework": "torch"})
    b = w.alloc(2 * MiB)
    s = w.begin(ev.TRY_BEGIN, "t")
    a = w.alloc(8 * MiB)
    ws = w.alloc(40 * MiB, flags=ev.CATCHES_OOM)
    y = w.alloc(30 * MiB)
    w.oom(100 * MiB)
    w.free(y)
    w.free(ws)
    w.segment(ev.SEGMENT_FREE, 1 << 32, 40 * MiB)      # cuDNN's emptyCache after the search: a plan search
    w.free(a)
    w.end(ev.TRY_END, "t", s)
    w.free(b)
    t = w.finish()
    for pol in ("split", "torch"):
        for fast in (True, False):
            r = replay(t, pol, cap=32 * MiB, capacity=None, fast_path=fast)
            (oom,) = r.oom_events
            assert oom.breakdown["requested"] == 2 * MiB, (pol, fast, oom.breakdown)
