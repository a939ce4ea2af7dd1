"""`allocsim tune`: the search finds a planted best, its canonical settings and pruning never lose the
optimum (brute force over small spaces), the OOM rescue, the JSON fields and the command end to end."""
import json
import os
import random
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.cli import main
from allocsim.engine.replay import replay
from allocsim.frameworks.torch import divisions_text, parse_divisions
from allocsim.trace import TraceWriter
from allocsim.trace.events import CACHE_RELEASE
from allocsim.search.spaces import torch as torch_space
from allocsim.search.tune import HEADROOM, TIME, Space, Target, margin, pareto, ranked, tune

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
FIGURES = ("peak_reserved_bytes", "device_mallocs", "device_frees", TIME, "ooms", "first_oom_event")


def torch_trace(path, steps, total_memory=80 << 30, conf: str | None = None):
    """A PyTorch-framework trace from ``steps``: ("a", bytes) allocates (("a", bytes, stream) on that stream),
    ("f", k) frees the k-th live object, ("oom", bytes) is a request the recorded run failed, ("e",) calls
    empty_cache(); ``conf``: the PYTORCH_CUDA_ALLOC_CONF it was recorded under."""
    meta = {"framework": "torch", "device": {"name": "test", "total_memory": total_memory}}
    if conf:
        meta["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": conf}
    w = TraceWriter(meta=meta)
    live = []
    for t, (what, *x) in enumerate(steps):
        if what == "a":
            live.append(w.alloc(*x, t=t))
        elif what == "f" and live:
            w.free(live.pop(x[0] % len(live)), t=t)
        elif what == "oom":
            w.oom(x[0], t=t)
        elif what == "e":
            w.record(CACHE_RELEASE, t=t)
    w.finish().save(path)
    return path


@pytest.fixture
def small_grid(monkeypatch):
    """A space small enough to brute-force, each option still taking default and non-default values."""
    monkeypatch.setattr(torch_space, "TORCH_MAX_SPLIT_MB", (None, 32, 512))
    monkeypatch.setattr(torch_space, "TORCH_DIVISIONS", (None, "2", "[64:8,256:4,>:2]"))
    monkeypatch.setattr(torch_space, "TORCH_NON_SPLIT_MB", (20, 64))
    monkeypatch.setattr(torch_space, "TORCH_GC_THRESHOLDS", (None, 0.6))


def brute_force(path, capacity=None, cap=None):
    """Every raw candidate of the space replayed on its own: (candidate, figures), and the space."""
    from allocsim.search.sweep import cached_trace
    t = cached_trace(path)
    space = Space(t, Target(capacity, cap))
    out = []
    for c in space.candidates():
        res = replay(t, c.spec, cap=c.cap if c.cap is not None else cap, capacity=capacity)
        d = res.to_dict()
        d["first_oom_event"] = res.first_oom.event if res.first_oom else None
        out.append((c, {k: d[k] for k in FIGURES}))
    return out, space


def check_against_brute_force(path, capacity=None, cap=None, objective="reserved"):
    """Settings with one canonical form replay alike, and tune's best equals the best of all raw settings."""
    raw, space = brute_force(path, capacity, cap)
    classes = {}
    for c, figures in raw:
        assert classes.setdefault(space.canonical(c), figures) == figures, c.label
    res = tune(path, capacity=capacity, cap=cap, objective=objective, fit=False)
    assert len(res.rows) == len(classes) <= len(raw)
    rows = [f for _, f in raw]
    if all(r["ooms"] for r in rows):
        assert res.best is None
        return res
    target = Target(capacity, cap)
    room = None if target.limit is None else target.limit - margin(target, HEADROOM)
    key = ("peak_reserved_bytes", TIME, "device_mallocs")      # what the objectives compare
    assert [res.best[k] for k in key] == [ranked(rows, objective, room)[0][k] for k in key]
    return res


# ---- the search finds a planted best ----------------------------------------------------------------
def test_planted_divisions_setting_is_found(tmp_path):
    """Requests growing 100, 101, ... 127 MiB, each freed before the next: plain rounding caches every size in a
    segment of its own; roundup_power2_divisions:2 rounds them all to 128 MiB, one segment — nothing in the space
    reserves less (expandable segments map 20 MiB pages: 140 MiB)."""
    steps = [s for n in range(100, 128) for s in (("a", n * MiB), ("f", 0))]
    path = torch_trace(str(tmp_path / "grow.bin"), steps)
    res = tune(path, capacity=None, jobs=1, fit=False, objective="reserved")
    best = res.best
    assert best["peak_reserved_bytes"] == 128 * MiB
    assert "roundup_power2_divisions:2" in best["conf"] and "expandable_segments" not in best["conf"]
    assert best["conf"].startswith("PYTORCH_ALLOC_CONF=") and best["legacy_conf"].startswith("PYTORCH_CUDA_ALLOC_CONF=")
    # each request's 2 MiB-rounded segment stays cached; the next even size reuses it exactly
    assert res.recorded["peak_reserved_bytes"] == sum({(n + n % 2) * MiB for n in range(100, 128)})


def test_planted_setting_wins_on_time_under_pressure(tmp_path):
    """The same trace on a 130 MiB device: the defaults fit only by releasing their cache and retrying at
    almost every request; roundup_power2_divisions:2 makes one device malloc and no retry, and wins on time."""
    steps = [s for n in range(100, 128) for s in (("a", n * MiB), ("f", 0))]
    path = torch_trace(str(tmp_path / "grow.bin"), steps, total_memory=130 * MiB)
    res = tune(path, jobs=1, fit=False, objective="time")
    assert "roundup_power2_divisions:2" in res.best["setting"]
    assert (res.best["device_mallocs"], res.best["retries"]) == (1, 0)
    assert res.recorded["retries"] > 10 and not res.recorded["ooms"]
    assert any(r["ooms"] for r in res.rows)     # some settings do not fit at all


# ---- canonical settings and pruning never lose the optimum -------------------------------------------
SIZES = st.sampled_from([256, 4096, 700 << 10, 3 * MiB, 12 * MiB, 21 * MiB, 40 * MiB, 70 * MiB, 130 * MiB, 300 * MiB])
STEPS = st.lists(st.one_of(st.tuples(st.just("a"), SIZES), st.tuples(st.just("f"), st.integers(0, 50))),
                 min_size=1, max_size=60)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(steps=STEPS, capacity=st.sampled_from([None, 400 * MiB, 900 * MiB]),
       objective=st.sampled_from(["fastest", "reserved", "time", "both"]))
def test_pruning_keeps_the_optimum_on_generated_traces(tmp_path_factory, small_grid, steps, capacity, objective):
    path = torch_trace(str(tmp_path_factory.mktemp("gen") / "g.bin"), steps)
    check_against_brute_force(path, capacity=capacity, objective=objective)


@pytest.mark.parametrize("name, capacity, cap, objective", [
    ("resnet50.bin", None, None, "reserved"),
    ("resnet50-expandable.bin", None, 3400 * MiB, "reserved"),    # a cap: the gc threshold is in the space
    ("resnet50-expandable.bin", None, 3200 * MiB, "fastest"),     # room 3040 MiB: 2.94 GiB peaks leave it
    ("cupy_mlp.bin", None, None, "fastest"),
    ("synthetic-transformer.bin", None, None, "reserved"),        # another producer: the Julia pools and their caps
])
def test_pruning_keeps_the_optimum_on_shipped_traces(small_grid, name, capacity, cap, objective):
    res = check_against_brute_force(os.path.join(ROOT, "traces", name), capacity, cap, objective)
    assert res.rows[0]["recorded"]


def test_never_worse_than_a_50_point_grid():
    """50 settings drawn from the full space, each replayed alone (a user's grid of `allocsim replay`s):
    none beats tune's answer. On the ResNet-18 recording with a side stream: a real PyTorch run, the space as
    large as ResNet-50's, a third of its events."""
    path = os.path.join(ROOT, "traces", "pressure-side-stream.bin")
    res = tune(path, jobs=1, fit=False, objective="reserved")
    from allocsim.search.sweep import cached_trace
    space = Space(cached_trace(path), res.target)
    grid = random.Random(12).sample(space.candidates(), 50)
    for c in grid:
        r = replay(cached_trace(path), c.spec).to_dict()
        assert r["ooms"] or r["peak_reserved_bytes"] >= res.best["peak_reserved_bytes"], c.label


def test_fastest_takes_the_fastest_that_leaves_the_headroom():
    """Under a limit of 100 with room for 95: the fastest of those at or below 95; none there: the fastest that
    fits at all; no limit: the fastest. ``reserved`` still takes the least reserved."""
    rows = [{"peak_reserved_bytes": r, TIME: t, "device_mallocs": 1, "ooms": o, "name": n} for n, r, t, o in
            [("a", 90, 5.0, 0), ("b", 80, 9.0, 0), ("c", 97, 1.0, 0), ("d", 70, 0.5, 1)]]
    assert ranked(rows, "fastest", 95)[0]["name"] == "a"
    assert ranked(rows, "fastest", 50)[0]["name"] == "c"
    assert ranked(rows, "fastest", None)[0]["name"] == "c"
    assert ranked(rows, "reserved", 95)[0]["name"] == "b"
    assert margin(Target(None, 100 * MiB), HEADROOM) == 5 * MiB and margin(Target(200, None), 7) == 7
    assert margin(Target(None, None), HEADROOM) is None


def test_pareto_keeps_exactly_the_undominated():
    rows = [{"peak_reserved_bytes": r, TIME: t} for r, t in
            [(5, 5), (4, 6), (6, 4), (5, 6), (6, 6), (4, 6), (3, 9)]]
    front = pareto(rows)
    assert [(r["peak_reserved_bytes"], r[TIME]) for r in front] == [(3, 9), (4, 6), (5, 5), (6, 4)]
    for r in rows:
        dominated = any(o["peak_reserved_bytes"] <= r["peak_reserved_bytes"] and
                        o[TIME] <= r[TIME] and o is not r and
                        (o["peak_reserved_bytes"], o[TIME]) !=
                        (r["peak_reserved_bytes"], r[TIME]) for o in rows)
        assert dominated == all(f["peak_reserved_bytes"] != r["peak_reserved_bytes"] or
                                f[TIME] != r[TIME] for f in front)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(table=st.lists(st.sampled_from([0, 1, 2, 4, 8, 16]), min_size=16, max_size=16))
def test_divisions_text_parses_back(table):
    text = divisions_text(tuple(table))
    assert parse_divisions(text) == tuple(table)
    assert len(text) <= len("[" + ",".join(f"{1 << i}:{d}" for i, d in enumerate(table)) + "]")


# ---- OOM rescue ------------------------------------------------------------------------------------------
def oom_trace(tmp_path):
    """250 MiB cached, then 2 x 100 MiB live in it, then the recorded run failed a 200 MiB request.

    On 420 MiB: the defaults need a new 200 MiB segment beside the 250 MiB one (450 MiB) and fail again;
    expandable segments grow the mapped range to 400 MiB (20 MiB left); max_split_size_mb:32 keeps the
    100 MiB requests out of the 250 MiB block, releases it (release_available_cached_blocks) and ends at
    400 MiB too."""
    steps = [("a", 250 * MiB), ("f", 0), ("a", 100 * MiB), ("a", 100 * MiB), ("oom", 200 * MiB)]
    return torch_trace(str(tmp_path / "oom.bin"), steps)


def test_rescue_names_the_settings_that_serve_the_failed_request(tmp_path):
    res = tune(oom_trace(tmp_path), capacity=420 * MiB, jobs=1, fit=False)
    (o,) = res.rescue
    assert o["event"] == 4 and o["size"] == 200 * MiB
    assert o["recorded"]["reached"] and not o["recorded"]["served"]
    served = {s["setting"]: s["headroom_bytes"] for s in o["served_by"]}
    assert served["expandable_segments:True"] == 20 * MiB
    assert served["max_split_size_mb:32"] == 20 * MiB
    assert "recorded" not in served         # the defaults, as recorded here
    assert res.recorded["ooms"] == 1 and res.recorded["first_oom_event"] == 4     # fails at the target: no fit
    assert res.best["setting"] in served


def test_rescue_headroom_is_the_limit_less_reserved(tmp_path):
    """On 460 MiB the defaults serve it too, in a new segment beside the 250 MiB one (450 MiB: 10 MiB left);
    expandable segments still map 400 MiB (60 MiB left)."""
    (o,) = tune(oom_trace(tmp_path), capacity=460 * MiB, jobs=1, fit=False).rescue
    assert o["recorded"]["served"] and o["recorded"]["headroom_bytes"] == 10 * MiB
    served = {s["setting"]: s["headroom_bytes"] for s in o["served_by"]}
    assert served["expandable_segments:True"] == 60 * MiB and served["recorded"] == 10 * MiB
    assert [s["headroom_bytes"] for s in o["served_by"]] == sorted(served.values(), reverse=True)


# ---- the command -------------------------------------------------------------------------------------
def test_json_fields(tmp_path, capsys):
    path = oom_trace(tmp_path)
    assert main(["tune", path, "--capacity", "420MiB", "--json", "-j", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["capacity_bytes"] == 420 * MiB and out["cap_bytes"] is None and out["objective"] == "fastest"
    assert out["headroom_bytes"] == 21 * MiB          # 5 % of 420 MiB
    assert out["settings_distinct"] == out["settings_replayed"] == len(out["candidates"]) <= out["settings_total"]
    # every setting replayed (its walk reads the rescue), or given the row of one whose walk it is (a family's)
    assert out["replays"] + out["settings_shared"] >= out["settings_distinct"]
    assert all(len(c["rescue"]) == 1 for c in out["candidates"])
    assert out["recommended"]["conf"].startswith("PYTORCH_ALLOC_CONF=")
    assert out["recorded"]["recorded"] and out["recorded"]["ooms"] == 1
    best = out["finalists"][0]
    for key in ("setting", "peak_reserved_bytes", "overhead_vs_load", "first_oom_event", "device_mallocs",
                "device_frees", "retries", TIME, "device_time_seconds", "fit_capacity_bytes", "conf", "legacy_conf"):
        assert key in best, key
    assert best["fit_capacity_bytes"] <= 420 * MiB
    assert set(out["frontier"]) <= {c["setting"] for c in out["candidates"] if not c["ooms"]}
    assert out["rescue"][0]["served_by"]


def test_command_end_to_end_on_a_shipped_trace(tmp_path, capsys):
    plot = str(tmp_path / "front.png")
    path = os.path.join(ROOT, "traces", "resnet50.bin")
    assert main(["tune", path, "--max-replays", "12", "-j", "2", "--plot", plot]) == 0
    text = capsys.readouterr().out
    assert re.search(r"searched \d+ settings, \d+ distinct on this trace, the first 12 replayed \(--max-replays\)", text)
    assert "PYTORCH_ALLOC_CONF=" in text and "PYTORCH_CUDA_ALLOC_CONF=" in text
    assert text.count("\nrecorded ") == 1 and "fits on" in text
    with open(plot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_recorded_settings_are_the_first_candidate():
    """gpt2-maxsplit128-rp2div4 was recorded under max_split_size_mb:128,roundup_power2_divisions:4: the
    recorded row replays exactly that setting, and the grid point of the same values shares its canonical form."""
    from allocsim.search.sweep import cached_trace
    path = os.path.join(ROOT, "traces", "gpt2-maxsplit128-rp2div4.bin")
    res = tune(path, jobs=1, fit=False, max_replays=3)
    assert res.rows[0]["recorded"]
    assert res.rows[0]["conf"] == "PYTORCH_ALLOC_CONF=max_split_size_mb:128,roundup_power2_divisions:4"
    space = Space(cached_trace(path), res.target)
    recorded, *grid = space.candidates()
    same = [c for c in grid if c.label == "max_split_size_mb:128,roundup_power2_divisions:4"]
    assert len(same) == 1 and space.canonical(same[0]) == space.canonical(recorded)
    assert replay(path, "torch").peak_reserved_bytes == res.rows[0]["peak_reserved_bytes"]


def test_any_executor_gives_the_same_rows():
    """In this process, on the local pool (-j 2) and on another executor (threads here, Dask's client the same
    way): the same settings, the same figures, in the same order."""
    from concurrent.futures import ThreadPoolExecutor
    path = os.path.join(ROOT, "traces", "resnet50.bin")
    kw = dict(max_replays=6, fit=False)
    with ThreadPoolExecutor(2) as ex:
        runs = [tune(path, jobs=1, **kw), tune(path, jobs=2, **kw), tune(path, executor=ex, **kw)]
    first, *others = [[(r["setting"], *(r[k] for k in FIGURES)) for r in res.rows] for res in runs]
    assert len(first) == 6 and all(o == first for o in others)


def test_snapshot_is_the_recommended_settings_replay(tmp_path, capsys):
    """``--snapshot``: the recommended setting's replay as a PyTorch snapshot — its final segments are what a
    replay under that setting reserves at the end, and its settings line is the recommended one."""
    import pickle
    out = str(tmp_path / "rec.pickle")
    path = os.path.join(ROOT, "traces", "resnet50.bin")
    assert main(["tune", path, "--max-replays", "6", "--no-fit", "-j", "1", "--json", "--snapshot", out]) == 0
    res = json.loads(capsys.readouterr().out)
    best = next(r for r in res["finalists"] if r["conf"] == res["recommended"]["conf"])
    with open(out, "rb") as f:
        snap = pickle.load(f)                   # our own file, just written
    want = replay(path, best["spec"], cap=best["cap_bytes"], capacity=res["capacity_bytes"])
    assert sum(s["total_size"] for s in snap["segments"]) == want.final_reserved_bytes
    assert len([e for e in snap["device_traces"][0] if e["action"] == "segment_alloc"]) == want.device_mallocs


def test_one_command_on_a_snapshot_from_an_oomed_run(tmp_path):
    """A PyTorch snapshot of a run that hit an OOM under a memory fraction (the caught OOM is in it), given
    as it is: tune imports it on the fly, says the recorded settings fail the request again, recommends a
    setting that serves it, and draws the frontier — one command."""
    import subprocess
    import sys
    raw = os.path.join(ROOT, "traces", "raw", "pressure")
    with open(os.path.join(raw, "fraction-oom.stats.json")) as f:
        stats = json.load(f)
    allowed = int(stats["fraction"] * stats["total_memory"])
    plot = str(tmp_path / "front.png")
    p = subprocess.run([sys.executable, "-m", "allocsim", "tune", os.path.join(raw, "fraction-oom.pickle"),
                        "--cap", str(allowed), "--max-replays", "30", "--no-fit", "-j", "1", "--json", "--plot", plot],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "a torch log, imported for the search" in p.stderr
    res = json.loads(p.stdout)
    (o,) = res["rescue"]
    assert not o["recorded"]["served"] and o["served_by"]
    assert res["recorded"]["ooms"] == 1 and res["recorded"]["first_oom_event"] == o["event"]
    best = next(r for r in res["finalists"] if r["conf"] == res["recommended"]["conf"])
    assert best["ooms"] == 0 and best["setting"] in {s["setting"] for s in o["served_by"]}
    assert res["trace"].endswith("fraction-oom.pickle") and os.path.getsize(plot) > 0


def test_rescue_headroom_is_under_the_limit_the_program_set():
    """A run that set its own memory fraction (a recorded SET_LIMIT) and ran out: the headroom a setting
    leaves is measured under that limit, not under the whole device."""
    import numpy as np
    from allocsim.engine.replay import Replay
    from allocsim.trace import Trace
    from allocsim.trace.events import SET_LIMIT
    path = os.path.join(ROOT, "traces", "pressure-fraction-oom.bin")
    t = Trace.load(path)
    limit = int(t.size[np.flatnonzero(np.asarray(t.kind) == SET_LIMIT)[0]])
    (o,) = tune(path, jobs=1, fit=False, max_replays=20).rescue
    served = {s["setting"]: s["headroom_bytes"] for s in o["served_by"]}
    r = Replay(t, "torch[expandable_segments:True]")
    r.run()
    [(at, reserved, lim)] = r.served_ooms
    assert at == o["event"] and lim == limit
    assert served["expandable_segments:True"] == limit - reserved < 64 << 20


def test_a_gc_threshold_acts_only_under_a_cap_below_the_device(tmp_path):
    """The torch space's ``gc_acts`` is the torch model's ``gc_on()``: a cap at the whole device is fraction 1 (no allowed
    memory), so a threshold never acts and its candidates collapse; a lower cap turns it on."""
    from allocsim.search.sweep import cached_trace
    t = cached_trace(torch_trace(str(tmp_path / "t.bin"), [("a", 300 * MiB), ("f", 0), ("a", 100 * MiB)], 1 << 30))
    assert not Space(t, Target(1 << 30, 1 << 30)).facts.gc_acts
    assert Space(t, Target(1 << 30, 800 * MiB)).facts.gc_acts
    assert not Space(t, Target(1 << 30, None)).facts.gc_acts


# ---- the columns in the user's terms --------------------------------------------------------------------
def test_fits_on_is_the_allowed_memory_under_a_cap():
    """Under --cap, "fits on" is a fraction of the device, up to the cap; a walk whose budget ran out is marked;
    with no cap it is a GPU's memory."""
    from allocsim.report.tune import fits_legend, fits_on
    row = {"fit_capacity_bytes": 350 * MiB, "fit_threshold": False, "ooms": 0, "cap_bytes": 400 * MiB,
           "pareto": True, "recorded": False}
    capped = Target(1000 * MiB, 400 * MiB)
    assert fits_on(row, capped) == "0.350 (350.00 MiB)*"
    assert "budget ran out" in fits_legend([row], capped) and "up to the cap" in fits_legend([row], capped)
    below = dict(row, fit_capacity_bytes=300 * MiB, fit_threshold=True)
    assert fits_on(below, capped) == "0.300 (300.00 MiB)"
    assert "*" not in fits_legend([below], capped)
    assert fits_on(dict(row, fit_threshold=True), Target(1000 * MiB, None)) == "350.00 MiB"
    assert "smallest GPU" in fits_legend([row], Target(1000 * MiB, None))
    assert fits_on(dict(row, fit_capacity_bytes=None), capped) == "none"


def test_the_fits_on_legend_says_only_what_its_rows_show():
    """The bisection sentence only where a row bisected (not a walk that ran out at the cap, whose figure is the
    peak above it, nor one that runs out with no limit); under --no-fit, where no row was walked, only that."""
    from allocsim.report.tune import fits_legend
    row = {"fit_capacity_bytes": 350 * MiB, "fit_threshold": True, "fit_digits": 3, "ooms": 0, "cap_bytes": None,
           "pareto": True, "recorded": True}
    capped, free = Target(1000 * MiB, 400 * MiB), Target(1000 * MiB, None)
    above_cap = dict(row, fit_capacity_bytes=450 * MiB)
    never = dict(row, fit_capacity_bytes=None)
    for rows, target in (([above_cap], capped), ([never], capped), ([never], free)):
        assert "bisected" not in fits_legend(rows, target), rows
    assert "a figure above the cap" in fits_legend([above_cap], capped)
    assert "none: it runs out even with no limit" in fits_legend([never], free)
    assert "none:" not in fits_legend([row], free)
    for rows, target in (([row], free), ([row], capped), ([never, row, above_cap], capped)):
        assert "bisected to 3 significant figures" in fits_legend(rows, target), rows
    assert "rounded up" in fits_legend([above_cap], capped) and "rounded up" not in fits_legend([never], capped)
    unwalked = [{k: v for k, v in r.items() if not k.startswith("fit_")} for r in (row, dict(row, pareto=False))]
    assert fits_legend(unwalked, capped) == fits_legend(unwalked, free) == "fits on: - (not walked: --no-fit)"


@pytest.mark.parametrize("cap", [120 * MiB + 12345, 300 * MiB + 12345])
def test_under_a_cap_the_walk_starts_at_the_cap(tmp_path, monkeypatch, cap):
    """Under --cap the "fits on" walk replays nothing above the cap (here below the unlimited peaks, 160 MiB, but
    for expandable segments', 100 MiB; or above them all), and its answer is the brute force's: the smallest grid
    point (whole MiB, or the cap itself) from which every one up to the cap replays without OOM."""
    from allocsim.search import fit
    caps, probe = [], fit.probe
    monkeypatch.setattr(fit, "probe", lambda args: caps.append(args[2]) or probe(args))
    steps = [s for n in (30, 50, 20, 70, 10, 40) for s in (("a", n * MiB), ("a", n * MiB // 3), ("f", 0), ("f", 0))] * 3
    path = torch_trace(str(tmp_path / "w.bin"), steps, total_memory=1 << 30)
    for policy in ("torch", "torch[max_split_size_mb:32]", "torch[expandable_segments:True]"):
        caps.clear()
        f = fit.fit_capacity(path, policy, islands=False, top=cap)
        assert f["top_bytes"] == cap and f["threshold"]
        assert caps[0] is None and all(c <= cap for c in caps[1:]), policy     # the unlimited replay, then none above
        passing = 0
        for c in [cap] + list(range(cap // MiB * MiB, 0, -MiB)):
            if replay(path, policy, cap=c).ooms:
                break
            passing = c
        assert f["capacity_bytes"] == passing, policy
    res = tune(path, cap=cap, jobs=1, max_replays=6)
    assert all(r["fit_capacity_bytes"] <= cap for r in res.shown if r.get("fit_capacity_bytes") is not None)


@pytest.mark.parametrize("text, error", [("120%", "--headroom"), ("abc%", "--headroom"), ("-1GiB", "--headroom"),
                                         ("lots", "--headroom")])
def test_a_bad_headroom_is_one_line(tmp_path, text, error):
    from conftest import run_cli
    out = run_cli("tune", oom_trace(tmp_path), "--headroom", text, "--no-fit")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and error in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_headroom_decides_between_fitting_settings(tmp_path, capsys):
    """A 2.94 GiB peak leaves 5 % under a 3200 MiB cap, not under 3100 MiB: there the fastest that fits at all is
    taken, and the report says so; a headroom given in bytes is kept as given."""
    path = os.path.join(ROOT, "traces", "resnet50-expandable.bin")
    assert main(["tune", path, "--cap", "3100MiB", "--max-replays", "8", "--no-fit", "--headroom", "0"]) == 0
    assert "no setting fits with" not in capsys.readouterr().out
    assert main(["tune", path, "--cap", "3100MiB", "--max-replays", "8", "--no-fit"]) == 0
    text = capsys.readouterr().out
    assert "objective fastest (155.00 MiB headroom under the limit)" in text
    assert "no setting fits with 155.00 MiB to spare" in text
    assert main(["tune", path, "--cap", "3100MiB", "--max-replays", "8", "--no-fit", "--headroom", "1MiB",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["headroom_bytes"] == MiB
    from conftest import run_cli
    out = run_cli("tune", path, "--cap", "3100MiB", "--no-fit", "--headroom", "4GiB")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not below the limit" in out.stderr


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 1 << 40), st.integers(1, 1 << 40))
def test_the_fits_on_fraction_is_rounded_up_to_3_significant_figures(n, capacity):
    """The fraction a user passes on must allow at least the certified bytes: rounded up, never down, by less
    than a unit of its third figure."""
    from decimal import Decimal
    from allocsim.report.tune import fraction_up
    shown = fraction_up(n, capacity)
    d = Decimal(shown)
    assert d * capacity >= n
    digits = d.as_tuple().digits
    assert len(digits) - digits.index(next(x for x in digits if x)) <= 3 or digits[-1] == 0   # 3 figures
    unit = Decimal(1).scaleb(d.adjusted() - 2)
    assert (d - unit) * capacity < n                # a unit of the third figure less would not allow it
