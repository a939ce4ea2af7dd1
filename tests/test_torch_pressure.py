"""The `torch` model under memory pressure, against real PyTorch runs.

traces/raw/pressure/ holds ResNet-18 trained by PyTorch 2.11 on an H100 under a memory
fraction, a GC threshold, ``max_split_size_mb`` under a fraction, ``empty_cache()``
calls, a side stream and expandable segments under a fraction (traces/raw/README.md):
each snapshot holds PyTorch's own segment calls, each ``.stats.json`` the settings and
``memory_stats()``. They are imported here (a fifth of a second each) and replayed by
the model with the recorded settings; the segment calls, their sizes, order and the
requests they served, and the allocator's counters must be PyTorch's.

Two recordings need events the engine does not drive yet (a recorded OOM, the cache
releases): `walk` drives them here as the engine will, so the model is checked on
them already.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocsim
from allocsim.search.fit import fit_capacity
from allocsim.frameworks.torch import fraction_for
from allocsim.trace import Trace, TraceWriter
from allocsim.trace import events as ev
from allocsim.search.validate import validate
from allocsim.report.text import validation_summary

from conftest import ROOT
from test_fit_safe import brute_safe, passes

KiB, MiB = 1 << 10, 1 << 20

RAW = os.path.join(ROOT, "traces", "raw", "pressure")
#: scenarios whose recording holds only ALLOC/FREE and segment events: the engine replays them whole
DRIVEN = ["plain", "fraction-retry", "gc-threshold", "maxsplit-cap", "side-stream", "expandable-cap"]
#: memory_stats() counters the model keeps under the same names
COUNTERS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams")


def recorded_stats(name: str) -> dict:
    with open(os.path.join(RAW, name + ".stats.json")) as f:
        return json.load(f)


def fraction_options(stats: dict) -> list:
    """The memory fraction the program set, as ``-O``; none if it set none."""
    return [f"per_process_memory_fraction:{stats['fraction']!r}"] if stats["fraction"] is not None else []


def allowed_bytes(stats: dict) -> int:
    """What PyTorch's setMemoryFraction computes: ``int(fraction * total memory)``."""
    return int(stats["fraction"] * stats["total_memory"])


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """``recording(name)``: the scenario's snapshot imported as a trace (with the device's total memory)."""
    folder, done = tmp_path_factory.mktemp("pressure"), {}

    def load(name: str) -> Trace:
        if name not in done:
            out = str(folder / (name + ".bin"))
            allocsim.import_trace(os.path.join(RAW, name + ".pickle"), out,
                                  total_memory=recorded_stats(name)["total_memory"])
            t = Trace.load(out)
            if name != "empty-cache":
                t = without_inferred_releases(t)
            done[name] = t
        return done[name]
    return load


def without_inferred_releases(t: Trace) -> Trace:
    """The trace less the cache releases the importer inferred. Only the empty-cache scenario called
    ``empty_cache()``; a snapshot cannot tell the allocator's own retry (which frees the whole cache inside
    a malloc, as fraction-retry's one retry did) from ``empty_cache()`` followed by a miss (docs/importers.md,
    "Cache releases"), so here the model's own retry path is what is tested."""
    rec = np.asarray(t.records)
    return Trace(rec[rec["kind"] != ev.CACHE_RELEASE].copy(), t.meta, streams=t.streams, sites=t.sites, labels=t.labels,
                 path=t.path)


def model_counters(trace: Trace, options=(), **kw) -> dict:
    res = allocsim.replay(trace, "torch", options=list(options), keep_going=True, **kw)
    return {k: res.counters[k] for k in COUNTERS}


def assert_match(v):
    assert v.match, validation_summary(v)


# ---- recordings the engine replays whole ----------------------------------------------------
@pytest.mark.parametrize("name", DRIVEN)
def test_validate_matches_the_recorded_run_with_its_settings(recording, name):
    """The recorded fraction passed as ``-O``: same segment calls, frees, reserved bytes and counters."""
    trace, stats = recording(name), recorded_stats(name)
    assert_match(validate(trace, options=fraction_options(stats)))
    got = model_counters(trace, fraction_options(stats))
    assert got == {k: stats["memory_stats"][k] for k in COUNTERS}


@pytest.mark.parametrize("name", [n for n in DRIVEN if recorded_stats(n)["fraction"] is not None])
def test_a_cap_is_the_allowed_memory(recording, name):
    """``--cap`` = what the fraction allowed, and no fraction option: the same run, GC threshold included."""
    trace, stats = recording(name), recorded_stats(name)
    assert_match(validate(trace, cap=allowed_bytes(stats)))
    got = model_counters(trace, cap=allowed_bytes(stats))
    assert got == {k: stats["memory_stats"][k] for k in COUNTERS}


@pytest.mark.parametrize("name", ["fraction-retry", "gc-threshold", "maxsplit-cap"])
def test_without_the_limit_the_model_does_not_match(recording, name):
    """The recordings tell the settings apart: unconstrained, the model makes other segment calls."""
    assert not validate(recording(name)).match


#: each scenario's allocator settings other than the fraction (its PYTORCH_CUDA_ALLOC_CONF)
CONF = {"fraction-retry": [], "gc-threshold": ["garbage_collection_threshold:0.6"],
        "maxsplit-cap": ["max_split_size_mb:64"], "expandable-cap": ["expandable_segments:True"]}


@pytest.mark.parametrize("name", sorted(CONF))
def test_the_unconstrained_run_replayed_under_a_cap_predicts_the_real_run(recording, name):
    """A counterfactual: the `plain` recording (no limit) replayed with ``--cap`` = the scenario's allowed
    memory and its settings gives what PyTorch did when the same program really ran that way."""
    stats = recorded_stats(name)
    assert stats["alloc_conf"] == ",".join(CONF[name])
    res = allocsim.replay(recording("plain"), "torch", options=CONF[name], cap=allowed_bytes(stats), keep_going=True)
    real = stats["memory_stats"]
    assert {k: res.counters[k] for k in COUNTERS} == {k: real[k] for k in COUNTERS}
    assert res.peak_reserved_bytes == real["reserved_bytes.all.peak"]
    assert res.final_reserved_bytes == real["reserved_bytes.all.current"]


def test_the_unconstrained_run_under_the_oom_runs_cap_fails_the_request_pytorch_failed(recording):
    """`plain` under fraction-oom's cap runs out at the request the real run failed (the same allocation of
    the first step, 32 MiB), after the same segment calls and one flush and retry."""
    plain, oomed = recording("plain"), recording("fraction-oom")
    res = allocsim.replay(plain, "torch", cap=allowed_bytes(recorded_stats("fraction-oom")))
    kind, at = np.asarray(oomed.kind), int(np.flatnonzero(np.asarray(oomed.kind) == ev.OOM)[0])
    first = res.oom_events[0].event
    assert res.ooms == 1 and plain.size[first] == oomed.size[at]
    assert np.count_nonzero(np.asarray(plain.kind)[:first] == ev.ALLOC) == np.count_nonzero(kind[:at] == ev.ALLOC)
    assert res.counters["num_device_alloc"] == np.count_nonzero(kind[:at] == ev.SEGMENT_ALLOC)
    assert res.counters["num_alloc_retries"] == res.counters["num_ooms"] == 1


# ---- recordings with a recorded OOM or cache releases, driven by the engine's walk ------------
def test_a_recorded_oom_fails_again_after_the_same_retry(recording):
    """fraction-oom: the walk attempts the recorded 32 MiB request; it fails as in PyTorch, after one
    flush and one retry, and the run goes on with the halved batch: every segment call before and after
    is PyTorch's, and so are the allocator's counters — with the fraction as an option and as --cap."""
    trace, stats = recording("fraction-oom"), recorded_stats("fraction-oom")
    at = np.flatnonzero(np.asarray(trace.kind) == ev.OOM).tolist()
    assert len(at) == 1
    for kw in ({"options": fraction_options(stats)}, {"cap": allowed_bytes(stats)}):
        v = validate(trace, **kw)
        assert_match(v)
        res = allocsim.replay(trace, "torch", options=list(kw.get("options", ())), cap=kw.get("cap"))
        assert [o.event for o in res.oom_events] == at and res.oom_events[0].recorded
        assert res.completed and res.ooms_avoided == []
        assert {k: res.counters[k] for k in COUNTERS} == {k: stats["memory_stats"][k] for k in COUNTERS}


def test_the_recorded_oom_is_served_without_the_limit(recording):
    """The same trace with no limit: the request PyTorch failed is served, and the result says so."""
    trace = recording("fraction-oom")
    res = allocsim.replay(trace, "torch")
    assert res.ooms == 0 and res.ooms_avoided == np.flatnonzero(np.asarray(trace.kind) == ev.OOM).tolist()


def test_empty_cache_frees_the_segments_pytorch_freed(recording):
    """empty-cache: the imported trace carries a cache release at each empty_cache() call (inferred from
    the snapshot); the walk's ``release_cache()`` frees the same segments in the same order (large pool
    first, by size and address), and the run then matches to the end."""
    trace, stats = recording("empty-cache"), recorded_stats("empty-cache")
    assert np.count_nonzero(np.asarray(trace.kind) == ev.CACHE_RELEASE) == \
        stats["memory_stats"]["num_sync_all_streams"] == 4
    assert_match(validate(trace))
    res = allocsim.replay(trace, "torch")
    assert {k: res.counters[k] for k in COUNTERS} == {k: stats["memory_stats"][k] for k in COUNTERS}
    assert not validate(without_inferred_releases(trace)).match     # without the releases it cannot match


# ---- fit: a cap that is the allowed memory still certifies only what it should ---------------
@st.composite
def churn(draw):
    """Allocations of 0.5-40 MiB, some freed in between: segments cached, reused, collected."""
    w, live = TraceWriter(), []
    sizes = st.one_of(st.sampled_from([700 * KiB, 3 * MiB, 12 * MiB, 22 * MiB, 30 * MiB, 40 * MiB]),
                      st.integers(KiB, 40 * MiB))
    for is_alloc, size, pick in draw(st.lists(st.tuples(st.booleans(), sizes, st.integers(0, 99)),
                                              min_size=6, max_size=30)):
        if is_alloc or not live:
            live.append(w.alloc(size))
        else:
            w.free(live.pop(pick % len(live)))
    return w.finish()


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=churn(), options=st.sampled_from([("garbage_collection_threshold:0.2",), ("max_split_size_mb:20",),
                                               ("expandable_segments:true",),
                                               ("expandable_segments:true", "garbage_collection_threshold:0.3")]))
def test_fit_is_the_safe_capacity_when_the_cap_is_the_allowed_memory(tmp_path_factory, trace, options):
    """GC thresholds read the cap's value (pinned replays), allocations are checked against it before
    pages are mapped (noted comparisons): `fit` still answers what a scan of every grid point does."""
    path = str(tmp_path_factory.mktemp("fit") / "t.bin")
    trace.save(path)
    f = fit_capacity(path, "torch", options=options, resolution=MiB, islands=False)
    if not passes(path, "torch", "eager", options, None):
        assert f["capacity_bytes"] is None
        return
    assert f["capacity_bytes"] == brute_safe(path, "torch", "eager", options, f["load_bytes"],
                                             f["unlimited_peak_bytes"], MiB)


def test_expandable_segments_with_no_device_capacity_certify_only_their_cap(tmp_path):
    """With no device capacity, an expandable segment's range is 9/8 of 2**44, whatever the cap. It was 9/8 of the
    cap: under 402-418 MiB that range left the last 300 MiB request no room past the segments freed before it, so
    a new range was mapped whole and the replay failed, where the unlimited replay (a range of 2**44) peaks at
    400 MiB and granted a 402 MiB `fits`: it certified every cap from 402 MiB up, and `fit` took 402 MiB for
    safe. Every cap a replay certifies replays alike, and `fit`'s answer replays without OOM."""
    w, live = TraceWriter(), []
    for step in [10 * MiB + 1024, 300 * MiB + 512, 20 * MiB, "f2", "f0", 30 * MiB + 512, "f38", "e", 30 * MiB,
                 300 * MiB + 1024]:
        if step == "e":
            w.record(ev.CACHE_RELEASE)
        elif isinstance(step, str):
            w.free(live.pop(int(step[1:]) % len(live)))
        else:
            live.append(w.alloc(step))
    path = str(tmp_path / "t.bin")
    w.finish().save(path)
    options = ["expandable_segments:true"]
    for cap in (None, 410 * MiB):
        res = allocsim.replay(path, "torch", options=options, cap=cap, keep_going=True)
        lo, hi = res.certified_limits
        for other in {lo, hi if hi is not None else 2 * lo}:
            again = allocsim.replay(path, "torch", options=options, cap=other, keep_going=True)
            assert outcome(again) == outcome(res), f"cap {cap} certifies {lo}..{hi}, but {other} differs"
    f = fit_capacity(path, "torch", options=tuple(options), resolution=MiB, islands=False)
    assert passes(path, "torch", "eager", options, f["capacity_bytes"])


def outcome(res) -> tuple:
    """What a replay did that a limit can change: device calls, their bytes, OOMs, counters."""
    return (res.device_mallocs, res.device_malloc_bytes, res.device_frees, res.peak_reserved_bytes,
            [o.event for o in res.oom_events], res.counters)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=churn(), options=st.sampled_from([(), ("garbage_collection_threshold:0.2",), ("max_split_size_mb:20",),
                                               ("expandable_segments:true",),
                                               ("expandable_segments:true", "garbage_collection_threshold:0.3")]),
       factor=st.sampled_from([0.9, 1.1, 1.3, 1.6]))
def test_a_capped_replay_goes_the_same_way_at_every_cap_it_certifies(trace, options, factor):
    """`fit`'s premise (allocsim/search/fit.py): a replay at cap C certifies [lo, hi]; replays there do the same."""
    cap = max(int(trace.load_bytes * factor), MiB)
    res = allocsim.replay(trace, "torch", options=list(options), cap=cap, capacity=4 << 30, keep_going=True)
    lo, hi = res.certified_limits
    assert lo <= cap and (hi is None or cap <= hi)
    for other in {lo, hi if hi is not None else 2 * cap}:
        again = allocsim.replay(trace, "torch", options=list(options), cap=other, capacity=4 << 30, keep_going=True)
        assert outcome(again) == outcome(res), f"cap {cap} certifies {lo}..{hi}, but {other} differs"


@given(total=st.integers(1 << 30, 1 << 40), share=st.floats(0.0, 1.2))
def test_fraction_for_gives_pytorchs_allowed_memory_to_the_byte(total, share):
    """`fraction_for`: the fraction torch-real and the closed loop set, so that PyTorch's ``int(f * total)``
    is the cap exactly (none, or a cap of the whole device and more: 1.0, no limit)."""
    allowed = int(share * total)
    f = fraction_for(allowed, total)
    if 0 < allowed < total:
        assert int(f * total) == allowed and 0.0 < f < 1.0
    else:
        assert f == 1.0
