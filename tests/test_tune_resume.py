"""`tune`'s families (`allocsim.search.tune._replay_family`): one replay of a PyTorch setting, its checkpoints, and the
settings that behave as it up to a point (a GC threshold, a larger max_non_split_rounding_mb, a max_split_size_mb),
resumed from them or given its row, are row for row what replaying each alone under the same bound gives (stopped
rows included), and breaking what tells where they part is caught; `Replay.checkpoint`/`resume` go on as the walk
would have."""
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocsim.search.tune as tune_mod
from allocsim.engine.replay import Replay
from allocsim.search.spaces import torch as torch_space
from allocsim.engine.spec import PolicySpec
from allocsim.search.sweep import Cell, cached_trace
from allocsim.search.tune import Bound, Space, Target, bound_of, recorded_ooms, tune

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


KINDS = ("threshold", "rounding", "max_split")


class Trunks(list):
    """The `_Trunk`s the families made (monkeypatched in): how their members went."""

    def given_the_row(self):
        return sum(len(t.watcher.pending) for t in self)

    def ways(self) -> set:
        """``(what was watched, "resumed" or "row")`` of every member that was resumed from a checkpoint or given its
        head's row (a member with a threshold on expandable segments, never watched, left out)."""
        out = set()
        for t in self:
            for v, w in enumerate(t.watcher.watches):
                how = "row" if v in t.watcher.pending else "resumed" if t.starts[v] is not None else None
                out |= {(kind, how) for kind, x in zip(KINDS, w) if x is not None and how is not None
                        and not (kind == "threshold" and t.r.policy.expandable)}
        return out


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

    def job(c):
        return tune_mod.Job(Cell(path, c.spec, cap, "eager", capacity=None), None,
                            tune_mod.Least(*Space.least_costs(c, None), space.least_peak(c)), ooms, bound)
    families = tune_mod._families(space, chosen)
    for head, members in families.items():
        got = tune_mod._replay_family(tune_mod.Family(job(chosen[head]),
                                                      [tune_mod.Member(job(chosen[v]).cell, w) for v, w in members]))
        assert got[0].way is None       # the setting's own replay
        alone = [tune_mod._replay_job(job(chosen[i])) for i in [head] + [v for v, _ in members]]
        assert timeless([o.row for o in got]) == timeless(alone), chosen[head].label
    return len(families)


@pytest.mark.parametrize("name, cap", [pytest.param("gpt2.bin", 1.2, marks=pytest.mark.slow), ("resnet50.bin", 1.2),
                                       pytest.param("bert_mlm.bin", 1.2, marks=pytest.mark.slow),
                                       ("pressure-gc-threshold.bin", 3_000_000_000),
                                       ("pressure-fraction-oom.bin", 1.05),         # a recorded OOM: the rescue
                                       ("pressure-maxsplit-cap.bin", 1.05)])        # alloc_block fails early
def test_a_family_is_its_members_replayed_alone_on_shipped_traces(small_grid, trunks, name, cap):
    path = os.path.join(ROOT, "traces", name)
    if cap < 100:
        cap = int(cap * cached_trace(path).load_bytes)
    res = tune(path, cap=cap, jobs=1, fit=False)
    final = bound_of([r for r in res.rows if not r["pruned"]], "fastest", res.room, tune_mod.TOP)
    for bound in (final, NEVER):
        assert check_families(path, cap, bound) > 0


def test_the_shipped_families_took_every_way(small_grid, trunks, monkeypatch):
    """The test above held something: members of each kind resumed from a checkpoint, and members of each kind
    given the head's row (a threshold of 0.8, which a setting stopped early has not passed; a larger rounding where
    no request refused a block it would take; a max_split of 128 MiB, which a setting without one stopped before
    its first segment as large has never reached: gpt2; one that has, resnet50), nested families included (a
    threshold's variants with a larger rounding)."""
    monkeypatch.setattr(test_tune.torch_space, "TORCH_GC_THRESHOLDS", (None, 0.6, 0.8))
    monkeypatch.setattr(test_tune.torch_space, "TORCH_MAX_SPLIT_MB", (None, 32, 128, 512))
    for name in ("gpt2.bin", "resnet50.bin"):
        path = os.path.join(ROOT, "traces", name)
        cap = int(1.2 * cached_trace(path).load_bytes)
        res = tune(path, cap=cap, jobs=1, fit=False)
        final = bound_of([r for r in res.rows if not r["pruned"]], "fastest", res.room, tune_mod.TOP)
        check_families(path, cap, final)
    assert trunks.ways() == {(kind, how) for kind in KINDS for how in ("resumed", "row")}
    assert any(t.r.policy.gc_threshold_set and not t.r.policy.gc_ages_only for t in trunks)   # a threshold's replay


@pytest.mark.parametrize("broken", ["rounding", "max_split"])
def test_a_family_that_misses_where_a_member_parts_is_caught(small_grid, monkeypatch, broken):
    """The check above fails where a watch is broken on purpose: torch notes no refused best fit
    (``oversize_slack`` never falls), or the trunk counts no segment (the max_split watch sees only failures)."""
    if broken == "rounding":
        from allocsim.policies.torch import TorchCachingAllocator
        monkeypatch.setattr(TorchCachingAllocator, "_note_oversize", lambda self, pool, n: None)
    else:
        monkeypatch.setattr(torch_space, "SEGMENT_ALLOC", -1)
    path, cap = os.path.join(ROOT, "traces", "pressure-gc-threshold.bin"), 3_000_000_000
    res = tune(path, cap=cap, jobs=1, fit=False)
    final = bound_of([r for r in res.rows if not r["pruned"]], "fastest", res.room, tune_mod.TOP)
    with pytest.raises(AssertionError):
        for bound in (final, NEVER):
            check_families(path, cap, bound)


def test_a_max_split_resumed_past_a_failed_alloc_block_is_not_the_same():
    """Why the max_split watch parts at the first failed ``alloc_block`` too: resnet50 under 1.05 x LOAD fails one
    (a flush and retry) before any segment of 128 MiB; ``max_split_size_mb:128`` resumed from the setting without it
    is the same figure for figure, sections included, from a checkpoint before, and not from one after (step 4,
    ``release_available_cached_blocks``, ran there and counts its section, even though it freed nothing); the
    family's trunk resumes it from before."""
    t = cached_trace(os.path.join(ROOT, "traces", "resnet50.bin"))
    cap = int(1.05 * t.load_bytes)
    head, member = "torch[trace_settings:False]", "torch[trace_settings:False,max_split_size_mb:128]"
    alone = Replay(t, member, cap=cap, capacity=None).run().to_dict()
    r = Replay(t, head, cap=cap, capacity=None)
    states = []
    while not r.policy.num_alloc_retries:
        states.append(r.checkpoint())
        r.step(64)
    r.step(64)
    assert max(size for _, size, _ in r.policy.segment_log) < 128 << 20
    states.append(r.checkpoint())

    def resumed(state):
        m = Replay(t, member, cap=cap, capacity=None)
        m.resume(state)
        return m.run().to_dict()
    before, after = resumed(states[-2]), resumed(states[-1])
    assert timeless(before) == timeless(alone)
    assert timeless({**after, "sections": None}) == timeless({**alone, "sections": None})
    assert after["sections"] != alone["sections"]
    trunk = tune_mod._Trunk(torch_space.TorchWatcher(
        [torch_space.watch(PolicySpec.parse(head).values(), PolicySpec.parse(member).values())],
        (np.full(len(states) + 8, 1 << 40), np.zeros(len(states) + 8, np.int64), np.zeros(len(states) + 8, np.int64))))
    r = Replay(t, head, cap=cap, capacity=None)
    trunk.begin(r)
    for k in range(len(states)):            # windows of 64 events: checkpoints wherever the limit could be passed
        trunk.before(k)
        r.step(64)
        trunk.after()
    assert not trunk.pending and trunk.starts[0].walk.done <= states[-2].walk.done


#: Requests about the watched limits: below and above 32 MiB (max_split) and its segments, blocks that a larger
#: rounding would take for them (20 MiB against 64 MiB above the request).
NEAR = st.sampled_from([256, 700 << 10, 3 * MiB, 12 * MiB, 21 * MiB, 31 * MiB, 33 * MiB, 40 * MiB, 70 * MiB,
                        130 * MiB])
NEAR_STEPS = st.lists(st.one_of(st.tuples(st.just("a"), NEAR), st.tuples(st.just("f"), st.integers(0, 50))),
                      min_size=1, max_size=60)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(steps=st.one_of(STEPS, NEAR_STEPS), cap=st.sampled_from([1.05, 1.3, 2.0]))
def test_a_family_is_its_members_replayed_alone_on_generated_traces(tmp_path_factory, monkeypatch, small_grid, steps,
                                                                      cap):
    """Windows of 4 events (checked that often), a checkpoint before each where a member could part (so that one
    resumed from a checkpoint after it shows), so that a trace of 60 events has many."""
    path = torch_trace(str(tmp_path_factory.mktemp("gen") / "g.bin"), steps)
    t = cached_trace(path)
    if not t.load_bytes:
        return
    with monkeypatch.context() as m:
        m.setattr(tune_mod, "WINDOW", 4)
        m.setattr(tune_mod, "CHECKPOINT_EVERY", 4)
        check_families(path, max(int(cap * t.load_bytes), 1), NEVER)


#: Requests about every limit a watch reads: the 1 MiB small pool and 2 MiB / 10 MiB / 20 MiB segment sizes (rule 6),
#: max_split 20 and 32 MiB and the segments that large, and cached blocks just under 30 and 64 MiB above a request
#: (34 MiB + 512 against 64 and 98 MiB) or 20 MiB above it.
EDGES = st.sampled_from([700 << 10, MiB + 512, 2 * MiB - 512, 2 * MiB, 3 * MiB, 10 * MiB, 10 * MiB + 512, 12 * MiB,
                         19 * MiB, 20 * MiB, 20 * MiB + 512, 31 * MiB, 32 * MiB, 34 * MiB + 512, 52 * MiB, 64 * MiB,
                         98 * MiB])
#: `torch_trace`'s steps: ("a", bytes, stream), ("f", k), ("oom", bytes) and ("e",): empty_cache().
EDGE_STEPS = st.lists(st.one_of(st.tuples(st.just("a"), EDGES, st.sampled_from([0, 0, 0, 1])),
                                st.tuples(st.just("f"), st.integers(0, 50)), st.tuples(st.just("oom"), EDGES),
                                st.tuples(st.just("e"))), min_size=1, max_size=60)


def edge_trace(path, steps) -> str:
    """A PyTorch trace of ``EDGE_STEPS``, recorded under a GC threshold the grid lacks: the defaults are not the
    recorded setting (which heads no family), so the setting without max_split heads the max_split family."""
    return torch_trace(path, steps, conf="garbage_collection_threshold:0.7")


@pytest.fixture
def edge_grid(monkeypatch):
    """max_split 20 and 32 MiB, roundings 20, 30 and 64 MiB and a threshold: every family nests."""
    monkeypatch.setattr(torch_space, "TORCH_MAX_SPLIT_MB", (None, 20, 32))
    monkeypatch.setattr(torch_space, "TORCH_DIVISIONS", (None,))
    monkeypatch.setattr(torch_space, "TORCH_NON_SPLIT_MB", (20, 30, 64))
    monkeypatch.setattr(torch_space, "TORCH_GC_THRESHOLDS", (None, 0.6))


def check_edges(tmp, steps, cap) -> None:
    """`check_families` on ``edge_trace(steps)`` under ``cap`` x its LOAD, checked and checkpointed every 4 events."""
    path = edge_trace(str(tmp / "e.bin"), steps)
    t = cached_trace(path)
    if t.load_bytes:
        check_families(path, max(int(cap * t.load_bytes), 1), NEVER)


EDGE_CAPS = st.sampled_from([1.0, 1.05, 1.3])
EDGE_SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@EDGE_SETTINGS
@given(steps=EDGE_STEPS, cap=EDGE_CAPS)
def test_a_family_is_its_members_replayed_alone_at_the_edges(tmp_path_factory, monkeypatch, edge_grid, steps, cap):
    """Two streams, recorded OOMs, empty_cache() and requests at every limit a watch reads, under caps that fail
    segment calls early."""
    with monkeypatch.context() as m:
        m.setattr(tune_mod, "WINDOW", 4)
        m.setattr(tune_mod, "CHECKPOINT_EVERY", 4)
        check_edges(tmp_path_factory.mktemp("edge"), steps, cap)


def _late_rounding(parted):
    """`TorchWatcher.parted` that fires a rounding watch a MiB late."""
    def late(self):
        kept = dict(self.pending)
        self.pending = {v: (g, r and r - MiB, s) for v, (g, r, s) in kept.items()}
        out = parted(self)
        self.pending = {v: kept[v] for v in self.pending}
        return out
    return late


def _late_segment(parted):
    """`TorchWatcher.parted` that fires a max_split watch only past a segment of exactly that size."""
    def late(self):
        kept = dict(self.pending)
        self.pending = {v: (g, r, s and s + 1) for v, (g, r, s) in kept.items()}
        out = parted(self)
        self.pending = {v: kept[v] for v in self.pending}
        return out
    return late


@pytest.mark.parametrize("broken", [pytest.param(_late_rounding, marks=pytest.mark.slow), _late_segment])
def test_a_watch_a_step_late_is_caught_at_the_edges(tmp_path_factory, monkeypatch, edge_grid, broken):
    """The check above finds a trace where a watch broken on purpose, by an edge, misses where a member parts
    (the rounding's within 300 examples: a 64 MiB block cached when 34 MiB + 512 is asked, 30 MiB - 512 above it)."""
    from hypothesis import Phase, find
    from hypothesis.errors import NoSuchExample
    monkeypatch.setattr(tune_mod, "WINDOW", 4)
    monkeypatch.setattr(tune_mod, "CHECKPOINT_EVERY", 4)
    monkeypatch.setattr(torch_space.TorchWatcher, "parted", broken(torch_space.TorchWatcher.parted))

    def parts(example):
        try:
            check_edges(tmp_path_factory.mktemp("edge"), *example)
        except AssertionError:
            return True
        return False
    try:
        find(st.tuples(EDGE_STEPS, EDGE_CAPS), parts, 
             settings=settings(EDGE_SETTINGS, max_examples=300, phases=[Phase.generate]))
    except NoSuchExample:
        pytest.fail(f"{broken.__name__}: every family still equal to its members replayed alone")


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


@pytest.mark.parametrize("spec, variant", [
    ("torch", "torch[garbage_collection_threshold:0.6]"),
    ("torch[max_split_size_mb:128]", "torch[max_split_size_mb:128,garbage_collection_threshold:0.6]"),
])
@pytest.mark.parametrize("part", [2, 20])
def test_a_deferred_peak_state_is_the_one_taken_at_once_for_a_replay_resumed_from_another_settings(monkeypatch, spec,
                                                                                                    variant, part):
    """A peak state left to a second walk (`defer_peak_state`; a replay also defers one past its share of time for
    them: CI on a loaded machine did, and the second walk, of the resumed setting from the first event, never
    reached that peak) comes out as the one taken at once for a replay resumed from another setting's checkpoint
    past where the two differ: a peak in the walk the checkpoint copied (a checkpoint half way), one reached after
    it (a checkpoint a twentieth of the way), and either through a chain of two resumes."""
    monkeypatch.setattr(Replay, "PEAK_ALLOWANCE", float("inf"))     # (no peak deferred for time: only when asked)
    t = cached_trace(os.path.join(ROOT, "traces", "resnet50.bin"))
    cap = int(1.2 * t.load_bytes)
    walks = []
    take = Replay._take_peak_state
    monkeypatch.setattr(Replay, "_take_peak_state", lambda self: (walks.append(self._peak_walk()), take(self))[1])

    def resumed(defer_before: bool, defer_after: bool, chain: bool = False) -> tuple[dict, bool]:
        late = Replay(t, spec, cap=cap, capacity=None)
        if defer_before:
            late.defer_peak_state()
        late.policy.keep_gc_ages()
        late.step(len(t) // part)
        state = late.checkpoint()
        assert (type(state.walk.at_peak).__name__ == "_PeakLater") == defer_before
        r = Replay(t, variant, cap=cap, capacity=None)
        r.resume(state)
        if defer_after:
            r.defer_peak_state()
        copied = state
        if chain:           # resumed again from a checkpoint of the resumed replay, a few events on
            r.step(100)
            state = r.checkpoint()
            r = Replay(t, variant, cap=cap, capacity=None)
            r.resume(state)
            if defer_after:
                r.defer_peak_state()
        d = r.run().to_dict()
        d.pop("replay_seconds"), d.pop("load_seconds")
        return d, r._w.at_peak is copied.walk.at_peak     # (the peak taken at once: the copied walk's, or later)

    want, copied = resumed(False, False)
    assert want["breakdown_at_peak"] is not None and copied == (part == 2) and not walks
    for defer in ((True, False), (False, True), (True, True)):
        for chain in (False, True):
            walks.clear()
            assert resumed(*defer, chain)[0] == want, (defer, chain)
            assert walks or defer == ((False, True) if part == 2 else (True, False))   # (a peak deferred, then taken)


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
