"""`tune`'s GC-threshold families (`allocsim.tune._replay_family`): one replay of a PyTorch setting, its checkpoints,
and its threshold variants resumed from them or given its row, are row for row what replaying each variant alone
under the same bound gives (stopped rows included); and `Replay.checkpoint`/`resume` go on as the walk would have."""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocsim.tune as tune_mod
from allocsim.replay import Replay
from allocsim.sweep import Cell, cached_trace
from allocsim.tune import Bound, Space, Target, bound_of, recorded_ooms, tune

import test_tune
from test_tune import STEPS, torch_trace

small_grid = test_tune.small_grid      # the fixture: test_tune's small space

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
#: A bound that stops nothing: every row goes through the bounded walk (and the families' checkpoints) to the end.
NEVER = Bound("fastest", None, (False, 0.0, 0, 0), ())


def timeless(v):
    """A JSON value without the replays' wall times."""
    if isinstance(v, dict):
        return {k: timeless(x) for k, x in v.items() if k != "replay_seconds"}
    return [timeless(x) for x in v] if isinstance(v, list) else v


class Trunks(list):
    """The `_Trunk`s the families made (monkeypatched in): how their variants went."""

    def resumed(self):
        return sum(s is not None for t in self for s in t.starts.values())

    def given_the_row(self):
        return sum(len(t.pending) for t in self)


@pytest.fixture
def trunks(monkeypatch):
    made = Trunks()

    class Kept(tune_mod._Trunk):
        def __init__(self, *a):
            super().__init__(*a)
            made.append(self)
    monkeypatch.setattr(tune_mod, "_Trunk", Kept)
    return made


def check_families(path, cap, bound) -> int:
    """Each family of the space under ``cap``: `_replay_family`'s rows equal each member's `_replay_job` alone
    under ``bound``; the number of families."""
    t = cached_trace(path)
    space = Space(t, Target(None, cap))
    distinct = {}
    for c in space.candidates():
        distinct.setdefault(space.canonical(c), c)
    chosen = list(distinct.values())
    ooms = recorded_ooms(t)

    def args(c):
        return (Cell(path, c.spec, cap, "eager", capacity=None), None, bound,
                Space.least_costs(c, None) + (space.least_peak(c),), ooms, True)
    families = tune_mod._families(space, chosen)
    for head, members in families.items():
        got = tune_mod._replay_family(args(chosen[head]) + ([(args(chosen[v])[0], gc) for v, gc in members],))
        assert [r.pop(tune_mod.SHARED, None) for r in got][0] is None       # the setting's own replay
        alone = [tune_mod._replay_job(args(chosen[i])) for i in [head] + [v for v, _ in members]]
        assert timeless(got) == timeless(alone), chosen[head].label
    return len(families)


@pytest.mark.parametrize("name, cap", [("gpt2.bin", 1.2), ("resnet50.bin", 1.2), ("bert_mlm.bin", 1.2),
                                       ("pressure-gc-threshold.bin", 3_000_000_000)])
def test_a_family_is_its_members_replayed_alone_on_shipped_traces(small_grid, trunks, name, cap):
    path = os.path.join(ROOT, "traces", name)
    if cap < 100:
        cap = int(cap * cached_trace(path).load_bytes)
    res = tune(path, cap=cap, jobs=1, fit=False)
    final = bound_of([r for r in res.rows if not r["pruned"]], "fastest", res.room, tune_mod.TOP)
    for bound in (final, NEVER):
        assert check_families(path, cap, bound) > 0


def test_the_shipped_families_took_every_way(small_grid, trunks, monkeypatch):
    """The test above held something: variants resumed from a checkpoint, and variants given the setting's row
    (a threshold of 0.8, which a setting stopped early has not passed)."""
    monkeypatch.setattr(test_tune.torch_space, "TORCH_GC_THRESHOLDS", (None, 0.6, 0.8))
    path = os.path.join(ROOT, "traces", "gpt2.bin")
    cap = int(1.2 * cached_trace(path).load_bytes)
    res = tune(path, cap=cap, jobs=1, fit=False)
    final = bound_of([r for r in res.rows if not r["pruned"]], "fastest", res.room, tune_mod.TOP)
    check_families(path, cap, final)
    assert trunks.resumed() > 0 and trunks.given_the_row() > 0


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(steps=STEPS, cap=st.sampled_from([1.05, 1.3, 2.0]))
def test_a_family_is_its_members_replayed_alone_on_generated_traces(tmp_path_factory, monkeypatch, small_grid, steps,
                                                                      cap):
    """Windows of 4 events (checked and checkpointed that often), so that a trace of 60 events has many."""
    path = torch_trace(str(tmp_path_factory.mktemp("gen") / "g.bin"), steps)
    t = cached_trace(path)
    if not t.load_bytes:
        return
    with monkeypatch.context() as m:
        m.setattr(tune_mod, "WINDOW", 4)
        check_families(path, max(int(cap * t.load_bytes), 1), NEVER)


@pytest.mark.parametrize("spec", ["torch", "torch[max_split_size_mb:64]", "torch[roundup_power2_divisions:4]",
                                  "torch[expandable_segments:True]", "torch[garbage_collection_threshold:0.7]"])
@pytest.mark.parametrize("at", [1, 300, 700, 5000])
def test_a_resumed_replay_ends_as_the_replay_it_copies(spec, at):
    """A replay resumed from another's checkpoint (same setting) gives the result a replay walked in one go
    gives, figure for figure, sections included; the copied one goes on unchanged by the copy."""
    t = cached_trace(os.path.join(ROOT, "traces", "gpt2.bin"))
    cap = int(1.2 * t.load_bytes)
    whole = Replay(t, spec, cap=cap, capacity=None, fold=False).run().to_dict()
    first = Replay(t, spec, cap=cap, capacity=None)
    first.step(at)
    state = first.checkpoint()
    second = Replay(t, spec, cap=cap, capacity=None)
    second.resume(state)
    first.step(10 ** 9)
    for r in (second.run(), first.run()):
        got = r.to_dict()
        assert {k: v for k, v in got.items() if k not in ("replay_seconds", "folded")} == \
            {k: v for k, v in whole.items() if k not in ("replay_seconds", "folded")}


@pytest.mark.parametrize("spec, variant", [
    ("torch", "torch[garbage_collection_threshold:0.6]"),
    ("torch[max_split_size_mb:128]", "torch[max_split_size_mb:128,garbage_collection_threshold:0.6]"),
    ("torch[expandable_segments:True]", None),
])
def test_keeping_the_gc_ages_changes_no_figure(spec, variant):
    """`keep_gc_ages` (a family's replay) gives the setting's own result; and a threshold resumed from its
    checkpoint past the point its GC acts does not (what the families' rule keeps them from)."""
    t = cached_trace(os.path.join(ROOT, "traces", "resnet50.bin"))
    cap = int(1.2 * t.load_bytes)
    plain = Replay(t, spec, cap=cap, capacity=None).run().to_dict()
    kept = Replay(t, spec, cap=cap, capacity=None)
    kept.policy.keep_gc_ages()
    kept.step(10 ** 9)
    got = kept.run().to_dict()
    assert {k: v for k, v in got.items() if k not in ("replay_seconds", "folded")} == \
        {k: v for k, v in plain.items() if k not in ("replay_seconds", "folded")}
    if variant is None:
        return
    late = Replay(t, spec, cap=cap, capacity=None)
    late.policy.keep_gc_ages()
    late.step(len(t) // 2)
    assert late.policy.gc_high > int(0.6 * cap)
    resumed = Replay(t, variant, cap=cap, capacity=None)
    resumed.resume(late.checkpoint())
    assert resumed.run().peak_reserved_bytes != Replay(t, variant, cap=cap, capacity=None).run().peak_reserved_bytes


def test_a_threshold_resumed_counts_each_gc_call_in_its_own_section():
    """A GC-threshold variant resumed from its setting's checkpoint (`keep_gc_ages`) gives the sections its own
    replay gives: the pool misses the walk before made under a recorded OOM's attempt count the GC's calls there,
    not under the pooled allocs (pressure-fraction-oom: its one recorded OOM is tried again before the
    threshold first acts)."""
    t = cached_trace(os.path.join(ROOT, "traces", "pressure-fraction-oom.bin"))
    spec, cap = "torch[max_split_size_mb:100]", 3_200_000_000
    variant = "torch[max_split_size_mb:100,garbage_collection_threshold:0.95]"
    setting = Replay(t, spec, cap=cap, capacity=None)
    setting.policy.keep_gc_ages()
    while not setting.at_end and setting.policy.gc_high <= int(0.95 * cap):
        state = setting.checkpoint()
        setting.step(256)
    assert not setting.at_end
    resumed = Replay(t, variant, cap=cap, capacity=None)
    resumed.resume(state)
    alone = Replay(t, variant, cap=cap, capacity=None).run().to_dict()
    got = resumed.run().to_dict()
    assert "recorded OOM attempt/2. garbage_collect_cached_blocks" in [s["path"] for s in alone["sections"]]
    assert got["sections"] == alone["sections"]
    assert timeless(got) == timeless(alone)


def test_the_report_says_why_a_threshold_took_its_settings_figures(trunks):
    """resnet50 under a cap just above its LOAD: no row fits (no bound, so no family's checkpoints), and the rows
    shared are the expandable-segment families', whose threshold acts (reserved passes it: 2.85 GiB against 0.6 of
    2.86 GiB) but frees nothing; the report's line must not say it never acted."""
    from allocsim.report.tune import tune_report
    path = os.path.join(ROOT, "traces", "resnet50.bin")
    res = tune(path, cap=3_070_000_000, jobs=1, fit=False)
    assert res.shared and res.best is None and trunks.given_the_row() == 0
    assert min(r["peak_reserved_bytes"] for r in res.rows if "expandable_segments:True" in r["setting"]) > \
        0.8 * 3_070_000_000
    line = next(x for x in tune_report(res, 0.0).splitlines() if "took that setting's figures" in x)
    assert "expandable segments" in line and "frees nothing" in line
