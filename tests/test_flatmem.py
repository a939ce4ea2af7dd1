"""Flat memory: chunked walks give the same answers whatever the chunk size.

The replay engine, LOAD and `Trace.validate` read the records a chunk at a time;
a small chunk puts chunk boundaries everywhere (0-byte objects living across
them, OOMs on them, frees of objects from earlier chunks). Latency figures from
`LatencyLog` equal numpy's over the plain array.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.engine.replay import replay
from allocsim.engine.replay import Replay
from allocsim.errors import InputError
from allocsim.machine.metrics import LatencyLog, latency_summary
from allocsim.trace import ALLOC, FREE, FREE_REQUESTED, Trace, TraceWriter
from allocsim.trace import trace as trace_module

from conftest import random_trace


def _chunked(monkeypatch, n):
    monkeypatch.setattr(trace_module, "CHUNK", n)


def _zero_heavy_trace(seed):
    """Random objects, some of 0 bytes, living across many chunk boundaries."""
    rng = np.random.default_rng(seed)
    w = TraceWriter(meta={"device": {"name": "t", "total_memory": 1 << 30}})
    live = []
    for k in range(600):
        if live and rng.random() < 0.45:
            w.free(live.pop(int(rng.integers(len(live)))), t=k)
        else:
            live.append(w.alloc(0 if rng.random() < 0.2 else int(rng.integers(1, 1 << 22)), int(rng.integers(2)), t=k))
        if k % 97 == 0:
            w.mark(f"m{k}", t=k)
    return w.finish()


def _result(t, policy, **kw):
    d = replay(t, policy, **kw).to_dict(timeline=kw.get("timeline", False))
    d.pop("replay_seconds")
    return d


@pytest.mark.parametrize("policy", ["split", "torch", "bestfit"])
@pytest.mark.parametrize("runtime", ["eager", "gc"])
def test_replay_is_the_same_for_any_chunk_size(monkeypatch, policy, runtime):
    t = _zero_heavy_trace(3)
    cases = [dict(), dict(cap=t.load_bytes // 2, keep_going=True), dict(cap=t.load_bytes // 2),
             dict(timeline=True, cap=t.load_bytes // 2, keep_going=True)]
    want = [_result(t, policy, runtime=runtime, **kw) for kw in cases]
    assert any(w["ooms"] for w in want) and want[0]["allocs"] > 0
    for n in (1, 7, 64):
        _chunked(monkeypatch, n)
        t2 = Trace(t.records, t.meta, streams=t.streams)
        assert [_result(t2, policy, runtime=runtime, **kw) for kw in cases] == want, n


def test_load_is_the_same_for_any_chunk_size(monkeypatch):
    t = random_trace(900, seed=5)
    want = int(t.live_curve.max())
    for n in (1, 5, 1000):
        _chunked(monkeypatch, n)
        assert Trace(t.records).load_bytes == want


def _bad_records(data):
    """A random small trace, then a few fields overwritten: every kind of defect `validate` finds."""
    n = data.draw(st.integers(4, 40))
    rec = random_trace(n, seed=data.draw(st.integers(0, 99))).records.copy()
    for _ in range(data.draw(st.integers(0, 3))):
        i = data.draw(st.integers(0, len(rec) - 1))
        field = data.draw(st.sampled_from(["kind", "id", "stream"]))
        rec[field][i] = data.draw({"kind": st.sampled_from([ALLOC, FREE, FREE_REQUESTED, 0, 77]),
                                   "id": st.integers(0, n + 2) | st.just(0xFFFFFFFF),
                                   "stream": st.integers(0, 2)}[field])
    return rec


def _verdict(rec):
    try:
        Trace(rec).validate()
    except InputError as e:
        return str(e)
    return None


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_validate_reports_the_same_defect_for_any_chunk_size(data):
    rec = _bad_records(data)
    want = _verdict(rec)
    for n in (1, 3):
        old = trace_module.CHUNK
        trace_module.CHUNK = n
        try:
            assert _verdict(rec) == want
        finally:
            trace_module.CHUNK = old


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([1e-6, 2.5e-6, 3.3e-5, 7.1e-7, 0.0, 1.5e-4, 1.0000001e-6]), min_size=0, max_size=400),
       st.integers(1, 50))
def test_latency_log_equals_numpy(lat, step):
    log = LatencyLog()
    for k in range(0, len(lat), step):
        log.extend(lat[k:k + step])
    a = np.array(lat, np.float64)
    assert log.summary() == latency_summary(a)
    assert log.total() == float(a.sum())
    if len(a):
        q = np.linspace(0, 1, 501)
        assert log.quantiles(q).tolist() == np.quantile(a, q).tolist()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from([1e-6, 2.5e-6, 3.3e-5, 0.0, 1.5e-4]), max_size=40),
                          st.sampled_from(["list", "array", "numpy", "repeated"]), st.integers(1, 3)), max_size=30),
       st.sampled_from([3, 64, 1 << 14]))
def test_latency_log_pieces_pending_repeated_and_copied_equal_numpy(pieces, pending):
    """However the latencies come (short pieces kept pending, numpy arrays coded at once, a fold's repeated
    window) and wherever a copy is taken, the figures are numpy's over the whole sequence in order."""
    import allocsim.machine.metrics as metrics
    from array import array
    old, metrics.PENDING = metrics.PENDING, pending
    try:
        log, whole, copies = LatencyLog(), [], []
        for lat, how, times in pieces:
            if how == "repeated":
                log.extend_repeated(lat, times)
                whole += lat * times
            else:
                log.extend({"list": list, "array": lambda x: array("d", x), "numpy": np.array}[how](lat))
                whole += lat
            copies.append((log.copy(), len(whole)))
    finally:
        metrics.PENDING = old
    a = np.array(whole, np.float64)
    assert log.count == len(a) and log.summary() == latency_summary(a) and log.total() == float(a.sum())
    for c, n in copies:
        assert c.count == n and c.summary() == latency_summary(a[:n]) and c.total() == float(a[:n].sum())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([1e-6, 2.5e-6, 0.0, -0.0, 1.5e-4, 1e300, 5e-324]) | st.floats(allow_nan=False),
                max_size=60))
def test_distinct_latencies_are_numpys_unique(values):
    """`metrics._distinct` (numpy's `unique` by its own steps: `unique`'s first call in a process cost a tenth of a
    small replay) gives `unique`'s values and counts, bit for bit (-0.0 and 0.0 taken as one, as `unique` does)."""
    from allocsim.machine.metrics import _distinct
    a = np.array(values, np.float64)
    want, want_counts = np.unique(a, return_counts=True)
    got, got_counts = _distinct(a, counts=True)
    assert got.tobytes() == want.tobytes() and got_counts.tolist() == want_counts.tolist()
    assert _distinct(a).tobytes() == want.tobytes()


def test_latency_log_large_and_measured():
    """Long runs (the pairwise sum's split into leaves) and many distinct values (float storage)."""
    rng = np.random.default_rng(0)
    for a in (rng.choice([1e-6, 3e-6, 2.2e-5], 300_001), rng.uniform(0, 1e-3, 70_000)):
        log = LatencyLog()
        for k in range(0, len(a), 65536):
            log.extend(a[k:k + 65536].tolist())
        assert log.summary() == latency_summary(a) and log.total() == float(a.sum())


@pytest.mark.parametrize("name", ["resnet50.bin", "gpt2.bin"])
def test_info_is_the_same_for_any_chunk_size(monkeypatch, name):
    """Real traces: marks, segments and streams cross chunk boundaries."""
    from allocsim.trace.analysis import summarize
    t = Trace.load(f"traces/{name}")
    want = summarize(t)
    assert want["marks"] and want["upstream_segments"]["peak_reserved_bytes"]
    _chunked(monkeypatch, 97)
    assert summarize(Trace.load(f"traces/{name}")) == want


def _next_split_id(t, runtime):
    """The id `split` would give its next block after replaying ``t``."""
    r = Replay(t, "split", runtime=runtime)
    r.run()
    return r.policy._new_id()


@pytest.mark.parametrize("runtime", ["eager", "gc"])
def test_split_renumbering_changes_nothing(monkeypatch, runtime):
    """`split` renumbers its live blocks (same order) between chunks and the engine renames the handles it holds
    (`Policy.renumber`): the results stay the same, and the dead ids are dropped."""
    from allocsim.policies import split
    t = Trace.load("traces/gpt2_variable.bin")
    cases = [dict(), dict(cap=int(t.load_bytes * 0.9), keep_going=True)]
    want = [_result(t, "split", runtime=runtime, **kw) for kw in cases]
    ids = _next_split_id(t, runtime)
    _chunked(monkeypatch, 97)
    monkeypatch.setattr(split, "RENUMBER_MIN", 16)
    assert [_result(t, "split", runtime=runtime, **kw) for kw in cases] == want
    if runtime == "eager":      # (gc: the dead objects' blocks stay held until collected, so few ids die)
        assert _next_split_id(t, runtime) < ids * 3 // 4       # dead ids were dropped
