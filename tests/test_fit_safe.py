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
from allocsim.replay import replay
from allocsim.fit import fit_capacity
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
