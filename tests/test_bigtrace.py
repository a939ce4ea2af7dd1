"""Huge traces in flat memory: the chunked walks against plain whole-array or per-event versions.

`Trace.validate` (one pass, FREEs checked against the live objects) must report the
same defect as a per-event reading of its rules; `allocsim info`'s chunked figures
must equal numpy's over the whole ALLOC-size array; `IdRuns` must be a set; and the
streamed `alloc-heavy` generator must give the same records for any block size as
the whole-array construction it replaced. Tiny chunk sizes put boundaries everywhere.
"""
import glob
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.formats import synth
from allocsim.trace import analysis
from allocsim.errors import InputError
from allocsim.trace import ALLOC, FREE, FREE_REQUESTED, MARK, RECORD_DTYPE, SEGMENT_ALLOC, Trace, TraceWriter
from allocsim.trace import events as ev
from allocsim.trace import trace as trace_module

from conftest import random_trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def chunk_size(monkeypatch):
    """Set `CHUNK` for the test (restored afterwards)."""
    return lambda n: monkeypatch.setattr(trace_module, "CHUNK", n)


# ---- validate: the per-event rules ------------------------------------------------------------

def per_event_verdict(t: Trace):
    """The first defect by `Trace.validate`'s rules, read one event at a time with Python sets."""
    found, top, top_at = {}, -1, 0
    allocated, freed, twice = set(), {FREE: set(), FREE_REQUESTED: set()}, {}
    for i, (kind, _, stream, id_, _, aux, size, _, _) in enumerate(t.records.tolist()):
        if kind not in ev.KIND_NAMES:
            found.setdefault("kind", (i, f"unknown event kind {kind}"))
        if t.finished and stream >= len(t.streams):
            found.setdefault("stream", (i, f"stream index {stream} is beyond the footer's table of "
                                           f"{len(t.streams)} streams"))
        if size > ev.MAX_SIZE:
            what = "allocation" if kind == ALLOC else ev.KIND_NAMES.get(kind, "event")
            found.setdefault("size", (i, f"absurd {what} size {size} bytes (> 1 PiB)"))
        if kind == MARK and t.finished and aux >= len(t.labels):
            found.setdefault("label", (i, f"MARK label index {aux} is beyond the footer's table of "
                                          f"{len(t.labels)} labels"))
        if kind == ALLOC:
            if id_ > top:
                top, top_at = id_, i
            if id_ in allocated:
                twice.setdefault(id_, i)
            allocated.add(id_)
        for k, label in ((FREE, "free"), (FREE_REQUESTED, "free_requested")):
            if kind == k:
                if id_ not in allocated:
                    found.setdefault(f"unknown {label}", (i, f"{label} of unknown id {id_} (never allocated "
                                                             f"before this event)"))
                elif id_ in freed[k]:
                    found.setdefault(f"double {label}", (i, f"double {label} of id {id_}"))
                freed[k].add(id_)
    if top >= ev.NO_ID:
        found.setdefault("id", (top_at, "ALLOC without an object id"))
    elif top >= len(t):
        found.setdefault("id", (top_at, f"object id {top} is out of range (ids are dense; the trace has "
                                        f"{len(t)} events)"))
    if twice:
        smallest = min(twice)
        found["twice"] = (twice[smallest], f"id {smallest} allocated twice")
    for check in trace_module._Validator.ORDER:
        if check in found:
            i, what = found[check]
            return f"<trace>: event {i}: {what}"
    return None


def chunked_verdict(t: Trace):
    try:
        t.validate()
    except InputError as e:
        return str(e)
    return None


@st.composite
def damaged_records(draw):
    """A random small trace (FREE_REQUESTED before some FREEs), then a few fields overwritten."""
    n = draw(st.integers(2, 40))
    rng = np.random.default_rng(draw(st.integers(0, 10_000)))
    w, live = TraceWriter(), []
    for k in range(n):
        if live and rng.random() < 0.45:
            i = live.pop(int(rng.integers(len(live))))
            if rng.random() < 0.3:
                w.free_requested(i, t=k)
            w.free(i, t=k)
        else:
            live.append(w.alloc(int(rng.integers(0, 1 << 20)), t=k))
    rec = w.finish().records.copy()
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(rec) - 1))
        field = draw(st.sampled_from(["kind", "id", "stream", "size"]))
        rec[field][i] = draw({"kind": st.sampled_from([ALLOC, FREE, FREE_REQUESTED, MARK, 0, 77]),
                              "id": st.integers(0, n + 2) | st.just(ev.NO_ID),
                              "stream": st.integers(0, 2),
                              "size": st.sampled_from([0, 5, ev.MAX_SIZE, ev.MAX_SIZE + 1])}[field])
    return rec


@settings(max_examples=400, deadline=None)
@given(damaged_records(), st.sampled_from([1, 2, 5, 1 << 16]))
def test_validate_follows_the_per_event_rules(rec, chunk):
    old = trace_module.CHUNK
    trace_module.CHUNK = chunk
    try:
        assert chunked_verdict(Trace(rec)) == per_event_verdict(Trace(rec))
    finally:
        trace_module.CHUNK = old


def test_validate_keeps_load_and_alloc_count(chunk_size):
    """The validating pass leaves LOAD and the ALLOC count behind, equal to the plain whole-array ones."""
    t = random_trace(3000, seed=9)
    for n in (7, 1 << 16):
        chunk_size(n)
        t2 = Trace(t.records)
        t2.validate()
        assert {"load_bytes", "n_allocs"} <= set(t2.__dict__)
        assert t2.load_bytes == int(t.live_curve.max()) and t2.n_allocs == int((t.kind == ALLOC).sum())


# ---- IdRuns is a set -------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 300), max_size=40), max_size=12), st.lists(st.integers(0, 310), max_size=50))
def test_id_runs_is_a_set(batches, probes):
    runs, plain = trace_module.IdRuns(), set()
    for b in batches:
        runs.add_sorted(np.unique(np.array(b, np.int64)))
        plain.update(b)
        assert runs.contains(np.array(probes, np.int64)).tolist() == [p in plain for p in probes]
        assert np.all(runs.starts[1:] > runs.ends[:-1])         # disjoint, not touching: as few runs as can be


# ---- info: chunked figures equal the whole-array ones ---------------------------------------------

def whole_array_histogram(sizes: np.ndarray) -> list[dict]:
    """Power-of-two buckets of sorted ``sizes``, as `info` computed them from the whole array."""
    out = []
    for lo in [0] + [2 ** k for k in range(64)]:
        hi = 2 * lo if lo else 1
        inside = sizes[(sizes >= lo) & (sizes < hi)]
        if len(inside):
            out.append({"lo": lo, "hi": hi, "count": len(inside), "bytes": int(inside.sum(dtype=np.uint64))})
    return out


def whole_array_figures(t: Trace) -> dict:
    """The size figures of `info`, from every ALLOC size at once (as `info` used to)."""
    sizes = np.sort(t.size[t.kind == ALLOC])
    n = len(sizes)
    return {"allocs": n, "distinct_sizes": len(np.unique(sizes)),
            "median_alloc_bytes": int(sizes[(n - 1) // 2]) if n else 0,
            "max_alloc_bytes": int(sizes[-1]) if n else 0,
            "total_alloc_bytes": int(sizes.sum(dtype=np.uint64)) if n else 0,
            "size_histogram": whole_array_histogram(sizes), "load_bytes": int(t.live_curve.max()) if len(t) else 0,
            "marks": int((t.kind == MARK).sum())}


@st.composite
def size_traces(draw):
    """Random objects of sizes from 0 to 2**50 (many repeats, many distinct), with marks, GCs and segments."""
    rng = np.random.default_rng(draw(st.integers(0, 10_000)))
    pool = rng.integers(0, 1 << draw(st.sampled_from([3, 12, 30, 50])), draw(st.integers(1, 60)), dtype=np.int64)
    w, live = TraceWriter(), []
    for k in range(draw(st.integers(0, 300))):
        r = rng.random()
        if r < 0.05:
            w.mark(f"m{k}", t=k)
        elif r < 0.08:
            w.gc(bool(rng.random() < 0.5), t=k)
        elif r < 0.1:
            w.segment(SEGMENT_ALLOC, 0, int(rng.integers(1, 1 << 30)), t=k)
        elif live and r < 0.5:
            w.free(live.pop(int(rng.integers(len(live)))), t=k)
        else:
            live.append(w.alloc(int(rng.choice(pool)), int(rng.integers(3)), t=k))
    return w.finish()


@settings(max_examples=150, deadline=None)
@given(size_traces(), st.sampled_from([1, 4, 33]), st.sampled_from([1, 8, 1 << 22]))
def test_info_chunked_equals_whole_array(t, chunk, dense):
    """Tiny chunks and a tiny dense range for `DistinctSizes` (its sorted part merged often)."""
    want = whole_array_figures(t)
    old = trace_module.CHUNK, analysis.DistinctSizes.DENSE
    trace_module.CHUNK, analysis.DistinctSizes.DENSE = chunk, dense
    try:
        got = analysis.summarize(t)
    finally:
        trace_module.CHUNK, analysis.DistinctSizes.DENSE = old
    assert {k: got[k] for k in want} == want
    trace_module.CHUNK = 1 << 16
    try:
        assert analysis.summarize(Trace(t.records, t.meta, streams=t.streams, labels=t.labels)) == got
    finally:
        trace_module.CHUNK = old[0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1 << 50), min_size=1, max_size=200), st.data())
def test_nth_alloc_size_is_exact(sizes, data):
    """Any rank in any range holding it, over sizes far apart (several passes) or close (one)."""
    w = TraceWriter()
    for s in sizes:
        w.alloc(s)
    t = w.finish()
    k = data.draw(st.integers(0, len(sizes) - 1))
    want = sorted(sizes)[k]
    assert analysis.nth_alloc_size(t, k, 0, 1 << 51) == want
    lo = min(sizes)
    assert analysis.nth_alloc_size(t, k - sum(s < lo for s in sizes), lo, max(sizes) + 1) == want


def test_info_is_unchanged_on_generated_traces(tmp_path):
    """`info --json` of generated traces, against what the whole-array `info` printed for them."""
    for preset, params, want in (("alloc-heavy", {"n_allocs": 20000}, {
            "distinct_sizes": 11166, "median_alloc_bytes": 8584, "load_bytes": 44560724, "max_alloc_bytes": 4194136,
            "total_alloc_bytes": 6702135812}),
            ("transformer", {"layers": 2}, {"distinct_sizes": 15, "median_alloc_bytes": 2097152,
                                            "load_bytes": 973307908, "total_alloc_bytes": 11327037480})):
        t = synth.generate(preset, path=str(tmp_path / f"{preset}.bin"), **params)
        d = analysis.summarize(Trace.load(t.path))
        assert {k: d[k] for k in want} == want
        assert {k: d[k] for k in whole_array_figures(t)} == whole_array_figures(t)


# ---- synth alloc-heavy: streamed, the same records ------------------------------------------------

def whole_array_alloc_heavy(n, lifetime, iterations, seed, min_size=16, max_size=4 << 20, event_ns=20_000):
    """The alloc-heavy records built all at once, as `synth` did before it streamed."""
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(min_size), np.log(max_size), n))
    sizes = np.maximum(4, (sizes.astype(np.int64) + 3) // 4 * 4)
    life = rng.geometric(1.0 / max(1.0, lifetime), n)
    marks = (np.arange(iterations, dtype=np.int64) * n) // iterations
    order = np.argsort(np.concatenate([np.arange(n, dtype=np.float64), np.arange(n) + life + 0.5, marks - 0.25]),
                       kind="stable")
    rec = np.zeros(2 * n + iterations, RECORD_DTYPE)
    is_alloc, is_mark = order < n, order >= 2 * n
    rec["kind"] = np.where(is_alloc, ALLOC, np.where(is_mark, MARK, FREE))
    rec["id"] = np.where(is_mark, ev.NO_ID, np.where(is_alloc, order, order - n))
    rec["site"] = ev.NO_SITE
    rec["aux"] = np.where(is_mark, order - 2 * n, 0)
    rec["size"] = np.where(is_alloc, sizes[np.minimum(order, n - 1)], 0)
    gaps = rng.exponential(event_ns, len(rec)).astype(np.int64)
    gaps[0] = 0
    rec["time_ns"] = np.cumsum(gaps)
    return rec


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.sampled_from([1.0, 1.5, 3.0, 64.0]), st.integers(1, 40), st.integers(0, 99),
       st.sampled_from([1, 3, 64, 1 << 18]))
def test_alloc_heavy_is_the_same_for_any_block(n, lifetime, iterations, seed, block):
    p = synth.resolve_params(synth.PRESETS["alloc-heavy"], {"n_allocs": n, "lifetime": lifetime})
    t = synth._alloc_heavy(p, iterations, 1.0, np.random.default_rng(seed), {}, None, block)
    assert t.records.tobytes() == whole_array_alloc_heavy(n, lifetime, iterations, seed).tobytes()


def test_alloc_heavy_streams_to_disk(tmp_path):
    """Streamed to a file a few allocations at a time: the same trace as in memory, published whole."""
    p = synth.resolve_params(synth.PRESETS["alloc-heavy"], {"n_allocs": 3000})
    path = str(tmp_path / "a.bin")
    on_disk = synth._alloc_heavy(p, 5, 1.0, np.random.default_rng(4), {"x": 1}, path, 100)
    in_memory = synth._alloc_heavy(p, 5, 1.0, np.random.default_rng(4), {"x": 1}, None)
    assert np.array_equal(on_disk.records, in_memory.records) and on_disk.labels == in_memory.labels
    Trace.load(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


@pytest.mark.parametrize("name", sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(ROOT, "traces", "*.bin"))))
def test_info_is_unchanged_on_shipped_traces(name):
    """`info --json` of every shipped trace, against what the whole-array `info` printed (tests/golden/info/)."""
    with open(os.path.join(ROOT, "tests", "golden", "info", f"{name}.json")) as f:
        want = json.load(f)
    got = analysis.summarize(Trace.load(os.path.join(ROOT, "traces", f"{name}.bin")))
    got.pop("path")
    if got["metadata"]["framework"] == "torch" and "catches_oom" not in want:     # added since: no C++ stacks
        assert (got.pop("catches_oom"), got.pop("catches_oom_max_bytes")) == (None, 0)
    assert json.loads(json.dumps(got)) == want
