"""`allocsim tune`'s branch and bound: a replay stopped early never changes what tune reports (every row replayed
to the end, the frontier, the finalists and the recommendation are the exhaustive search's), and the lower bounds
it stops on hold: the spaces' least cost per event, checked against every replay's clock."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocsim.search.tune as tune_mod
from allocsim.engine.replay import Replay, driving
from allocsim.trace import ALLOC, FREE
from allocsim.search.sweep import Cell, cached_trace, run_cell
from allocsim.machine.costs import CostModel
from allocsim.trace.events import SEGMENT_ALLOC, SEGMENT_MAP
from allocsim.search.tune import SLACK, Bound, Space, Target, _to_come, least_clock, tune

import test_tune
from test_tune import STEPS, torch_trace

small_grid = test_tune.small_grid      # the fixture: test_tune's small space

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def timeless(v):
    """A JSON value without the replays' wall times and the pruning marks."""
    if isinstance(v, dict):
        return {k: timeless(x) for k, x in v.items() if k not in ("replay_seconds", "pruned")}
    return [timeless(x) for x in v] if isinstance(v, list) else v


def exhaustive(monkeypatch, path, **kw):
    """``tune`` with no bound: every setting replayed to the end."""
    with monkeypatch.context() as m:
        m.setattr(tune_mod, "bound_of", lambda *a, **k: None)
        return tune(path, jobs=1, **kw)


def check_same_answer(monkeypatch, path, **kw):
    """Tune with the bound reports what tune without it does, for every row it replayed to the end; a stopped
    row fits in neither the frontier nor the finalists, and its lower bounds are below its figures."""
    full, bounded = exhaustive(monkeypatch, path, **kw), tune(path, jobs=1, **kw)
    a, b = full.to_dict(), bounded.to_dict()
    for key in set(a) - {"candidates", "settings_pruned", "settings_shared", "settings_resumed", "replays"}:
        assert timeless(a[key]) == timeless(b[key]), key
    assert b["settings_pruned"] == sum(bool(r["pruned"]) for r in b["candidates"])
    shown = {r["setting"] for r in b["finalists"]} | set(b["frontier"])
    for ra, rb in zip(a["candidates"], b["candidates"]):
        if not rb["pruned"]:
            assert timeless(ra) == timeless(rb), ra["setting"]
            continue
        assert rb["setting"] not in shown and rb["peak_reserved_bytes"] is None
        low = rb["pruned"]
        if not ra["ooms"]:          # a setting that runs out stops at its OOM, before the end the bounds look to
            for k in ("peak_reserved_bytes", "total_time_seconds", "device_mallocs"):
                assert ra[k] >= low[k], (ra["setting"], k)
    return bounded


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(steps=STEPS, capacity=st.sampled_from([None, 400 * MiB, 900 * MiB]), cap=st.sampled_from([None, 1.15, 1.6]),
       objective=st.sampled_from(["fastest", "reserved", "time"]), top=st.sampled_from([1, 3]))
def test_the_bound_changes_no_figure_on_generated_traces(tmp_path_factory, monkeypatch, small_grid, steps, capacity,
                                                         cap, objective, top):
    monkeypatch.setattr(tune_mod, "WINDOW", 2)        # checked every 2 events: the short traces get stopped too
    path = torch_trace(str(tmp_path_factory.mktemp("gen") / "g.bin"), steps * 3)
    load = cached_trace(path).load_bytes
    if cap is not None:            # the allowed memory: a multiple of LOAD (below it nothing fits, refused)
        cap = max(int(cap * load), 1)
        if capacity is not None and cap > capacity:
            capacity = None
    res = check_same_answer(monkeypatch, path, capacity=capacity, cap=cap, objective=objective, top=top, fit=False)
    PRUNED.append(res.pruned)


PRUNED: list = []


def test_the_generated_traces_got_stopped():
    """The property test above held something: some of its replays were stopped (it runs first, in file order)."""
    if not PRUNED:
        pytest.skip("the property test did not run")
    assert sum(PRUNED) > 0


@pytest.mark.parametrize("name, cap, objective", [
    ("gpt2.bin", None, "fastest"),
    ("resnet50.bin", None, "reserved"),
    ("pressure-gc-threshold.bin", 3_000_000_000, "fastest"),        # a cap: GC thresholds, settings that run out
    ("pressure-fraction-oom.bin", 2_302_253_465, "time"),            # a recorded OOM: the rescue reads every row
])
def test_the_bound_changes_no_figure_on_shipped_traces(monkeypatch, small_grid, name, cap, objective):
    res = check_same_answer(monkeypatch, os.path.join(ROOT, "traces", name), cap=cap, objective=objective, fit=False)
    assert res.pruned > 0           # it stops replays (or this test would hold nothing)


def test_a_stepped_replay_that_is_not_stopped_is_the_plain_row():
    """A bound that never stops: the row is `run_cell`'s, figure for figure."""
    path = os.path.join(ROOT, "traces", "resnet50.bin")
    never = Bound("fastest", None, (False, 0.0, 0, 0), ())
    for spec in ("torch", "torch[expandable_segments:True]"):
        cell = Cell(path, spec)
        row = tune_mod._replay_job(tune_mod.Job(cell, None, tune_mod.Least(1e-6, 4e-7), [], never))
        assert row["pruned"] is None
        assert timeless(row) == timeless({**run_cell(cell), **{k: row[k] for k in ("retries", "ooms_avoided",
                                                                                   "breakdown", "pruned")}})


@pytest.mark.parametrize("name, cap", [("gpt2.bin", None), ("pressure-gc-threshold.bin", 3_000_000_000),
                                       ("cupy_mlp.bin", None), ("pressure-cupy-limit.bin", None),
                                       ("synthetic-transformer.bin", None)])
def test_each_event_to_come_costs_at_least_the_spaces_least(name, cap):
    """The clock's lower bound: at every point of every replay of the space (a sample of its settings, every
    kind of path: expandable segments, GC thresholds, pool caps), the final clock is at least the clock so far
    plus the space's least cost of each ALLOC and FREE still to come."""
    path = os.path.join(ROOT, "traces", name)
    t = cached_trace(path)
    space = Space(t, Target(None, cap))
    candidates = space.candidates()
    kinds = np.concatenate([rec["kind"][local] for _, rec, local in driving(t)])
    allocs, frees = (np.append(np.cumsum((kinds == k)[::-1])[::-1], 0) for k in (ALLOC, FREE))
    n, window, w_allocs, w_frees, at = _to_come(t)         # what the bound reads: the same, every window
    assert n == len(kinds) and (w_allocs == allocs[::window][:len(w_allocs)]).all()
    assert (w_frees == frees[::window][:len(w_frees)]).all() and len(at) == -(-n // window)
    checked = 0
    for c in candidates[:: max(1, len(candidates) // 24)]:
        per_alloc, per_free = Space.least_costs(c, None)
        r = Replay(t, c.spec, cap=c.cap if c.cap is not None else cap)
        seen = []
        while not r.at_end:
            d = r.events_done
            seen.append((d, r.device.clock))
            r.step(97)
        res = r.finish()
        if not res.completed:       # stopped at an OOM: the events after it never come
            continue
        checked += 1
        lows = np.array([(clock + allocs[d] * per_alloc + frees[d] * per_free) * (1 - SLACK) for d, clock in seen])
        assert (lows <= res.total_time_seconds).all(), c.label
    assert checked


def test_tune_runs_on_a_local_dask_cluster(tmp_path, capsys):
    """``--dask-local N`` (as `sweep`'s): the same answer as the local pool; an empty ``--scheduler`` is one line."""
    pytest.importorskip("dask.distributed")
    import json
    from allocsim.cli import main
    from conftest import run_cli
    path = os.path.join(ROOT, "traces", "resnet50.bin")
    answers = []
    for how in (["--dask-local", "2"], ["-j", "1"]):
        assert main(["tune", path, "--max-replays", "10", "--no-fit", "--json", *how]) == 0
        answers.append(timeless(json.loads(capsys.readouterr().out)))
    (a, rows_a), (b, rows_b) = [({k: v for k, v in x.items() if k not in ("candidates", "settings_pruned", "settings_shared",
                                                                               "settings_resumed", "replays")},
                                 x["candidates"]) for x in answers]
    assert a == b       # which replays stop depends on the order they end in; every figure shown does not
    assert all(ra == rb for ra, rb in zip(rows_a, rows_b) if ra["peak_reserved_bytes"] and rb["peak_reserved_bytes"])
    out = run_cli("tune", path, "--scheduler", " ")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--scheduler" in out.stderr


def test_the_recorded_walk_beside_the_settings_gives_the_walk_alone():
    """On an executor the recorded settings' capacity walk goes on while the settings replay: the same "fits on"
    figures and replay counts as walked after them, in this process."""
    from concurrent.futures import ThreadPoolExecutor
    path = os.path.join(ROOT, "traces", "resnet50.bin")
    alone = tune(path, jobs=1, max_replays=20)
    with ThreadPoolExecutor(2) as ex:
        beside = tune(path, jobs=2, executor=ex, max_replays=20)
    assert alone.replays == beside.replays
    assert alone.recorded["fit_capacity_bytes"] is not None
    for a, b in zip(alone.shown, beside.shown):
        assert a["setting"] == b["setting"]
        assert (a.get("fit_capacity_bytes"), a.get("fit_threshold")) == (b.get("fit_capacity_bytes"),
                                                                          b.get("fit_threshold"))


@pytest.mark.parametrize("name, cap", [("gpt2.bin", None), ("bert_mlm.bin", 6_532_016_563),
                                       ("pressure-gc-threshold.bin", 3_000_000_000),
                                       ("resnet50-expandable.bin", 3_673_526_976)])
def test_the_device_calls_still_to_come_cost_at_least_the_bound(name, cap):
    """The clock's device-call term (`least_clock`) on real traces, a sample of each space under a cap and not."""
    assert check_device_call_bound(os.path.join(ROOT, "traces", name), cap, 16)


@pytest.mark.slow       # ~35 s on the 2-core machine: run by hand (`pytest -m slow`)
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(steps=STEPS, cap=st.sampled_from([None, 1.1, 1.5]))
def test_the_device_call_bound_holds_on_generated_traces(tmp_path_factory, monkeypatch, steps, cap):
    """The same, checked every 2 events, on generated traces (every setting of the space)."""
    monkeypatch.setattr(tune_mod, "WINDOW", 2)
    path = torch_trace(str(tmp_path_factory.mktemp("gen") / "g.bin"), steps * 3)
    load = cached_trace(path).load_bytes
    check_device_call_bound(path, max(int(cap * load), 1) if cap is not None and load else None, 10**6)


def check_device_call_bound(path: str, cap: int | None, sample: int) -> int:
    """At every check of every replay of about ``sample`` settings of the space (expandable segments, GC
    thresholds, divisions) that ends without running out, the final clock is at least `least_clock`; every
    device call reserves at most `largest_device_call`'s bytes, and the calls from a check on reserve at least
    what `live_ahead` says is missing then. How many replays it checked."""
    t = cached_trace(path)
    space = Space(t, Target(None, cap))
    come = _to_come(t)
    window = come[1]
    candidates = [c for c in space.candidates() if c.spec.ref == "torch"]
    checked = 0
    for c in candidates[:: max(1, len(candidates) // sample)]:
        least = space.least(c, None)
        ahead, largest = least.ahead
        r = Replay(t, c.spec, cap=cap)
        seen = []
        while not r.at_end:
            k = r.events_done // window
            if k >= len(ahead):         # past the last driving event (a trace of none): no check there
                break
            seen.append((least_clock(r.device, k, come, least), r.device.bytes_malloc,
                         max(int(ahead[k]) - r.device.reserved, 0)))
            r.step(window)
        res = r.finish()
        if not res.completed:       # stopped at an OOM: the events after it never come
            continue
        checked += 1
        calls = [size for kind, size, _ in r.policy.segment_log if kind in (SEGMENT_ALLOC, SEGMENT_MAP)]
        assert max(calls, default=0) <= largest, c.label
        for low, mallocs_before, missing in seen:
            assert low <= res.total_time_seconds, c.label
            assert r.device.bytes_malloc - mallocs_before >= missing, c.label
    return checked


@settings(max_examples=200, deadline=None, derandomize=True)
@given(points=st.lists(st.tuples(st.integers(0, 1 << 34), st.one_of(st.just(0.0), st.floats(1e-9, 1e-2))),
                       min_size=2, max_size=6, unique_by=lambda p: p[0]),       # (a point at 0 bytes too)
       calls=st.lists(st.integers(1, 1 << 35), min_size=1, max_size=8), largest=st.integers(1, 1 << 35))
def test_least_malloc_seconds_is_below_any_calls_that_reserve_as_much(points, calls, largest):
    """`CostModel.least_malloc_seconds` under any cost model (measured points in any shape, a falling last slope
    included): any device calls of at most ``largest`` bytes each cost at least it for the bytes they reserve."""
    costs = CostModel(malloc_points=[list(p) for p in sorted(points)])
    calls = [min(n, largest) for n in calls]
    spent = sum(costs.malloc_cost(n) for n in calls)
    assert costs.least_malloc_seconds(sum(calls), largest) <= spent * (1 + 1e-12)
