"""`fit` reports a safe capacity: no OOM at any grid point from it up to the no-limit peak.

OOM is not monotone in the cap, so each answer is checked against a brute scan of the grid
(generated traces) or of the window where the bisecting fit used to answer wrong (ResNet-50).
"""
import html
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim import policies
from allocsim.engine.replay import replay
from allocsim.search.fit import fit_capacity
from allocsim.search.tune import FIT_DIGITS
from allocsim.trace import TraceWriter

from conftest import ROOT

KiB, MiB = 1 << 10, 1 << 20
ONLINE = [n for n in policies.names() if not policies.get(n).real_gpu and n != "oracle"]
#: options that make a policy read the cap itself (knet's soft-limit cap, cupy's own limit)
OPTIONS = {"knet": [(), ("headroom=0",), ("headroom=1MiB",)], "cupy": [(), ("limit=6MiB",)]}


def passes(path, policy, runtime, options, cap) -> bool:
    return replay(path, policy, runtime=runtime, cap=cap, options=list(options)).ooms == 0


def brute_safe(path, policy, runtime, options, load, peak, res):
    """The safe capacity by scanning every grid point down from the peak to the first OOM."""
    safe = peak
    for cap in range((peak - 1) // res * res, max(load, 1) - 1, -res):
        if not passes(path, policy, runtime, options, cap):
            break
        safe = cap
    return safe


@st.composite
def small_traces(draw):
    ops = draw(st.lists(st.tuples(st.booleans(), st.integers(1, 3 * MiB), st.integers(0, 99)),
                        min_size=1, max_size=30))
    w, live = TraceWriter(), []
    for is_alloc, size, pick in ops:
        if is_alloc or not live:
            live.append(w.alloc(size))
        else:
            w.free(live.pop(pick % len(live)))
    for i in live:
        w.free(i)
    return w.finish()


@pytest.mark.parametrize("policy", ONLINE)
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=small_traces(), runtime=st.sampled_from(["eager", "gc"]), data=st.data())
def test_fit_answer_is_the_safe_threshold(policy, trace, runtime, data):
    options = data.draw(st.sampled_from(OPTIONS.get(policy, [()])))
    res = 256 * KiB
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.bin")
        trace.save(path)
        f = fit_capacity(path, policy, runtime=runtime, options=options, resolution=res)
        peak = f["unlimited_peak_bytes"]
        if not passes(path, policy, runtime, options, None):
            assert f["capacity_bytes"] is None
            return
        assert f["capacity_bytes"] == brute_safe(path, policy, runtime, options, f["load_bytes"], peak, res)
        if f["island_bytes"] is not None:
            assert f["island_bytes"] < f["capacity_bytes"]
            assert passes(path, policy, runtime, options, f["island_bytes"])


@pytest.mark.parametrize("policy, old_answer", [("torch", 3082 * MiB), ("bestfit", 3062 * MiB)])
def test_fit_on_resnet50_is_safe_where_bisection_was_not(policy, old_answer):
    # the bisecting fit answered ~3.01 GiB (torch) and ~2.99 GiB (bestfit); OOMs followed up to ~20 MiB above
    path = os.path.join(ROOT, "traces", "resnet50.bin")
    f = fit_capacity(path, policy)
    safe = f["capacity_bytes"]
    assert safe > old_answer
    window = range(safe, old_answer + 24 * MiB + 1, MiB)
    assert all(passes(path, policy, "eager", (), cap) for cap in window)
    assert not passes(path, policy, "eager", (), safe - MiB)       # a threshold, not just a passing point


@pytest.mark.parametrize("policy", ["split", "torch", "bestfit", "knet", "cupy"])
@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=small_traces(), digits=st.integers(1, 3), top=st.sampled_from([None, 5 * MiB, 9 * MiB]))
def test_a_bisecting_walk_fits_where_it_says_within_a_step_of_a_failure(policy, trace, digits, top):
    """To ``digits`` significant figures (`tune`'s "fits on"): the answer replays without OOM, a cap less than a
    step below it runs out (or lies below LOAD), and it lies less than a step above the exact walk's safe
    capacity (every cap at or above that one fits, so no failure lies there); in about 2 + log2(range/step)
    replays."""
    from math import log2
    res = 64 * KiB
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.bin")
        trace.save(path)
        exact = fit_capacity(path, policy, resolution=res, islands=False, top=top, max_replays=0)
        f = fit_capacity(path, policy, resolution=res, islands=False, top=top, digits=digits)
        if exact["capacity_bytes"] is None or (top is not None and exact["capacity_bytes"] > top):
            assert f["capacity_bytes"] == exact["capacity_bytes"]       # no cap up to top fits: the same answer
            return
        got, fails, step = f["capacity_bytes"], f["fails_bytes"], f["step_bytes"]
        assert passes(path, policy, "eager", (), got) and got - fails <= step and got < exact["capacity_bytes"] + step
        assert fails < f["load_bytes"] or not passes(path, policy, "eager", (), fails)
        assert f["replays"] <= 4 + log2(max(2, exact["unlimited_peak_bytes"] / step))


def test_fit_reports_each_replay_as_it_goes(small_trace_path):
    heard = []
    f = fit_capacity(small_trace_path, "split", resolution=64 * KiB, on_replay=lambda: heard.append(1))
    assert len(heard) == f["replays"] > 1


def test_frontier_plot_and_report_show_no_safe_capacity_islands_and_stopped_walks(tmp_path, small_trace_path):
    from allocsim.report import plots
    from allocsim.report.html import index_html
    from allocsim.report.text import fit_table
    from allocsim.trace import Trace
    fits = [{"policy": "torch", "options": "", "capacity_bytes": None, "island_bytes": None, "threshold": True,
             "unlimited_peak_bytes": 50 * MiB, "replays": 1},
            {"policy": "split", "options": "", "capacity_bytes": 40 * MiB, "island_bytes": 30 * MiB,
             "threshold": False, "unlimited_peak_bytes": 45 * MiB, "replays": 7}]
    fit = {"trace": small_trace_path, "load_bytes": 20 * MiB, "resolution_bytes": MiB, "fits": fits}
    trace = Trace.load(small_trace_path)
    assert os.path.getsize(plots.frontier_plot(trace, fit, str(tmp_path / "f.png"))) > 0
    page = open(index_html(str(tmp_path), trace, [], [], fit, 7)).read()
    assert "none (OOM)" in page and "30.00 MiB" in page
    assert page.index("split") < page.index("torch")           # no safe capacity sorts last
    assert "40.00 MiB*" in page and "*: the walk stopped after --max-replays 7" in page   # the `fit` table's marker
    assert html.escape(fit_table(fit, 7)) in page


def test_a_walk_stopped_by_its_budget_is_still_safe_and_says_so():
    # torch's whole walk on the ResNet-18 recording is 50 replays (knet's on ResNet-50, 612: the same rule, 15x slower)
    path = os.path.join(ROOT, "traces", "pressure-side-stream.bin")
    full = fit_capacity(path, "torch", islands=False)
    cut = fit_capacity(path, "torch", islands=False, max_replays=20)
    assert full["threshold"] and not cut["threshold"] and cut["replays"] == 20 < full["replays"]
    assert cut["capacity_bytes"] > full["capacity_bytes"]
    assert passes(path, "torch", "eager", (), cut["capacity_bytes"])


def test_walks_in_parallel_answer_as_the_walk_in_order(small_trace_path):
    """`fit_many` on two workers (threads here; the process pool the same way): several walks at once, each
    replaying caps ahead of its need, islands and a bounded walk included — the same answers and replay counts
    as each walk alone."""
    from concurrent.futures import ThreadPoolExecutor
    from allocsim.search import fit
    fits = [dict(trace=small_trace_path, policy=p, resolution=64 * KiB, max_replays=m)
            for p, m in (("split", 0), ("binned", 0), ("knet", 0), ("split", 5))]
    alone = [fit_capacity(**f) for f in fits]
    heard, ended = [], []
    with ThreadPoolExecutor(2) as ex:
        together = fit.fit_many(fits, ex, 2, on_replay=lambda walks, i, seconds: heard.append(1),
                                on_fit=lambda i, f: ended.append(i))
    assert together == alone
    assert len(heard) == sum(f["replays"] for f in alone)
    assert sorted(ended) == [0, 1, 2, 3]


def test_tune_walks_each_spec_once(monkeypatch, small_trace_path):
    """Rows of one spec under different pool caps share one capacity walk (the walk varies the cap itself)."""
    from allocsim.search import fit
    from allocsim.search.tune import _fit_all
    caps = []
    real = fit.probe
    monkeypatch.setattr(fit, "probe", lambda args: caps.append(args[2]) or real(args))
    rows = [{"spec": "split", "cap_bytes": None}, {"spec": "split", "cap_bytes": 8 * MiB},
            {"spec": "binned", "cap_bytes": None}]
    n, walked = _fit_all(small_trace_path, rows, None, None), len(caps)
    one = {p: fit_capacity(small_trace_path, p, islands=False, digits=FIT_DIGITS) for p in ("split", "binned")}
    assert n == walked == one["split"]["replays"] + one["binned"]["replays"]
    assert [r["fit_capacity_bytes"] for r in rows] == [one["split"]["capacity_bytes"]] * 2 + [
        one["binned"]["capacity_bytes"]]


def test_a_walk_looks_ahead_on_the_usual_outcomes(small_trace_path):
    """`Walk.ahead`: down from the peak, the grid points below the need (a probe that passes certifies its own
    cap), a known outcome followed where there is one; in the bisection, the points of a search that fails."""
    from itertools import islice
    from allocsim.search import fit
    w = fit.walk_of(small_trace_path, "split", resolution=MiB)
    assert list(w.ahead({})) == [None]                  # nothing is guessed before the unlimited replay
    assert w.left() == float("inf")
    w.take(fit.probe(w.task(None)))
    top = w.need
    assert w.left() == (top - w.floor) / MiB           # one replay so far, for the grid points above the need
    assert list(islice(w.ahead({}), 3)) == [top, top - MiB, top - 2 * MiB]
    jump = fit.Probe(True, top - 5 * MiB, w.load, w.peak)
    assert list(islice(w.ahead({top: jump}), 2)) == [top, top - 6 * MiB]
    stop = fit.Probe(False, 0, w.load, w.peak)
    lo, hi = w.floor - 1, w.safe
    first = (lo + hi) // 2 // MiB * MiB
    assert list(islice(w.ahead({top: stop}), 3)) == [top, first, (first + hi) // 2 // MiB * MiB]


def test_a_pinned_walk_replays_the_peak_it_answers(tmp_path):
    """A GC threshold reads the cap's value (the unlimited replay certifies no cap): the walk took the no-limit peak,
    126 MiB here, for safe unreplayed, where a GC at that cap fails; it replays it, and no cap up to it is safe."""
    w, live = TraceWriter(), []
    for size in (62915072, 2097664, 41943552, None, 1048576, 10486272, 5243904):
        if size is None:
            w.free(live.pop(1))
        else:
            live.append(w.alloc(size))
    path = str(tmp_path / "t.bin")
    w.finish().save(path)
    options = ("garbage_collection_threshold:0.6",)
    f = fit_capacity(path, "torch", options=options, resolution=MiB)
    peak = f["unlimited_peak_bytes"]
    assert replay(path, "torch", options=list(options)).ooms == 0
    assert replay(path, "torch", options=list(options), cap=peak).ooms == 1
    assert f["capacity_bytes"] is None
    under = fit_capacity(path, "torch", options=options, resolution=MiB, top=2 * peak, islands=False, digits=2)
    assert under["capacity_bytes"] is not None     # from the cap, where it fits
    assert replay(path, "torch", options=list(options), cap=under["capacity_bytes"]).ooms == 0
