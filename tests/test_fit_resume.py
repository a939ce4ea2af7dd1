"""`allocsim fit`'s probes resumed from the previous probe's checkpoints (`allocsim.search.fit._Trail`): every probe's whole
result (figures, sections, latencies, OOM records, the certified interval) is the one its replay from the first event
gives, and so is every walk's answer, on generated and shipped traces; and the check fails where the rule that says
which checkpoint a cap shares is broken on purpose."""
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.search import fit
from allocsim.engine.replay import Replay
from allocsim.search.sweep import cached_trace, run_cell
from allocsim.trace import TraceWriter
from allocsim.trace import events as ev
from allocsim.search.tune import FIT_DIGITS

from conftest import run_cli
from test_torch_pools import OPS as POOL_OPS, T, _build
from test_tune import SIZES, torch_trace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
#: Settings a probe may resume under (`_resumable`), and two it never does (a GC threshold or a fraction of the
#: cap reads the cap's value: the device is pinned).
SPECS = ["torch", "torch[expandable_segments:True]", "torch[max_split_size_mb:32]",
         "torch[roundup_power2_divisions:4]", "torch[per_process_memory_fraction:0.5]",
         "torch[per_process_memory_fraction:0.5,garbage_collection_threshold:0.6]",
         "torch[garbage_collection_threshold:0.6]"]
#: What differs between two replays of one cap that are the same replay: wall times and how much was folded.
UNTIMED = ("replay_seconds", "load_seconds", "folded")


class Probes:
    """Every resumable probe of the walks run while it is installed (`checked`), replayed again from the first
    event and compared whole: ``resumed`` of ``count`` went on from a checkpoint, ``differ`` lists the caps whose
    result was not the same."""

    def __init__(self):
        self.count = self.resumed = 0
        self.differ: list = []


@pytest.fixture
def checked(monkeypatch):
    probes = Probes()
    walk, start_for = fit._Trail.walk, fit._Trail.start_for

    def walked(r, cell, after):
        res = walk(r, cell, after)
        alone = run_cell(cell, None, full=True)[1]
        probes.count += 1
        if whole(res) != whole(alone):
            probes.differ.append(cell.cap)
        return res

    def started(self, limit, below):
        b = start_for(self, limit, below)
        probes.resumed += b > 0
        return b
    monkeypatch.setattr(fit._Trail, "walk", staticmethod(walked))
    monkeypatch.setattr(fit._Trail, "start_for", started)
    monkeypatch.setattr(fit, "TRAIL_LEAST", 0)      # the small traces too: the pressure traces, the generated ones
    fit._TRAILS.clear()
    yield probes
    fit._TRAILS.clear()


def whole(res) -> dict:
    """All of a result but its wall times: the figures, sections, latency quantiles, OOM records, certified limits."""
    d = {k: v for k, v in res.to_dict().items() if k not in UNTIMED}
    d["certified_limits"] = res.certified_limits
    return d


def both_ways(path, spec, monkeypatch, **kw) -> tuple[dict, dict]:
    """``fit_capacity`` with probes resumed, then with every probe replayed from the first event."""
    fit._TRAILS.clear()
    resumed = fit.fit_capacity(path, spec, **kw)
    with monkeypatch.context() as m:
        m.setattr(fit, "_resumable", lambda cell, settings: None)
        alone = fit.fit_capacity(path, spec, **kw)
    return resumed, alone


WALKS = [dict(), dict(islands=False, digits=FIT_DIGITS)]
#: Steps of a PyTorch trace (`test_tune.torch_trace`), recorded failed requests among them (their served limit).
STEPS = st.lists(st.one_of(st.tuples(st.just("a"), SIZES), st.tuples(st.just("f"), st.integers(0, 50)),
                           st.tuples(st.just("oom"), SIZES)), min_size=4, max_size=80)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(steps=STEPS, spec=st.sampled_from(SPECS), walk=st.sampled_from(WALKS),
       resolution=st.sampled_from([MiB, 4 * MiB]), top=st.sampled_from([None, 0.8, 1.1]), everywhere=st.booleans())
def test_resumed_probes_are_the_probes_on_generated_traces(tmp_path_factory, monkeypatch, checked, steps, spec, walk,
                                                          resolution, top, everywhere):
    """Windows of 2 records, a checkpoint wherever one is due (or at every boundary): a trace of 80 events has
    many."""
    monkeypatch.setattr(fit, "TRAIL_WIDTH", 2)
    monkeypatch.setattr(fit, "TRAIL_GAIN", 0)
    monkeypatch.setattr(fit._Trail, "everywhere", everywhere)
    path = torch_trace(str(tmp_path_factory.mktemp("gen") / "g.bin"), steps, total_memory=2 << 30)
    peak = cached_trace(path).load_bytes
    kw = dict(walk, resolution=resolution, top=None if top is None or not peak else int(top * peak))
    resumed, alone = both_ways(path, spec, monkeypatch, **kw)
    assert resumed == alone
    assert checked.differ == []


@pytest.mark.parametrize("name, spec, walk, top", [
    ("resnet50.bin", "torch", WALKS[0], None),
    ("resnet50.bin", "torch[max_split_size_mb:128]", WALKS[1], None),
    ("bert_mlm.bin", "torch[expandable_segments:True]", WALKS[0], None),
    ("gpt2.bin", "torch", WALKS[1], 1.2),
    pytest.param("pressure-maxsplit-cap.bin", "torch[max_split_size_mb:64]", WALKS[0], 3767323852,
                 marks=pytest.mark.slow),       # ~30 s on the 2-core machine: run by hand (`pytest -m slow`)
    ("pressure-fraction-retry.bin", "torch", WALKS[0], None),
    ("pressure-empty-cache.bin", "torch", WALKS[0], None),
])
def test_resumed_probes_are_the_probes_on_shipped_traces(monkeypatch, checked, name, spec, walk, top):
    path = os.path.join(ROOT, "traces", name)
    if top is not None and top < 100:
        top = int(top * cached_trace(path).load_bytes)
    resumed, alone = both_ways(path, spec, monkeypatch, top=top, **walk)
    assert resumed == alone
    assert checked.differ == [] and checked.resumed > 0, (checked.count, checked.resumed)


@pytest.mark.slow       # ~30 s on the 2-core machine: run by hand (`pytest -m slow`)
@pytest.mark.parametrize("broken", [
    lambda bounds, limit: bounds[0] <= limit,           # a refused need below the limit is not a divergence
    lambda bounds, limit: bounds[1] is None or limit <= bounds[1],      # nor a granted need above it
])
def test_the_check_fails_where_the_divergence_rule_is_broken(monkeypatch, checked, broken):
    """With either half of the rule left out (`_holds`), probes resume past the event where their cap makes the
    replay go otherwise, and the comparison above sees it."""
    monkeypatch.setattr(fit, "_holds", broken)
    monkeypatch.setattr(fit._Trail, "everywhere", True)     # where to resume is the rule's choice alone
    path = os.path.join(ROOT, "traces", "resnet50.bin")
    fit.fit_capacity(path, "torch", islands=False, digits=FIT_DIGITS)
    fit.fit_capacity(path, "torch")
    assert checked.differ


# ---- private pools (issue 28, item 4) ------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(ops=POOL_OPS, walk=st.sampled_from(WALKS), everywhere=st.booleans())
def test_resumed_probes_are_the_probes_on_traces_with_private_pools(tmp_path_factory, monkeypatch, checked, ops, walk,
                                                                   everywhere):
    """Captures, MemPools, releases and empty_cache among the requests (`test_torch_pools._build`), windows of 2
    records: a probe that goes on from a checkpoint taken while pools are begun, hold segments or are freeable gives
    the replay from the first event, figure for figure."""
    monkeypatch.setattr(fit, "TRAIL_WIDTH", 2)
    monkeypatch.setattr(fit, "TRAIL_GAIN", 0)
    monkeypatch.setattr(fit._Trail, "everywhere", everywhere)
    path = str(tmp_path_factory.mktemp("pools") / "p.bin")
    _build(ops)[0].w.finish().save(path)
    resumed, alone = both_ways(path, "torch", monkeypatch, **walk)
    assert resumed == alone
    assert checked.differ == []


@pytest.mark.parametrize("name", ["pools-compile.bin", "pools-capture.bin", "pools-mempool.bin"])
@pytest.mark.parametrize("everywhere", [False, True])
def test_resumed_probes_are_the_probes_on_the_shipped_pool_traces(monkeypatch, checked, name, everywhere):
    """The recorded graph captures, graph trees and MemPools, the exact walk (a few hundred records: windows of
    20)."""
    monkeypatch.setattr(fit, "TRAIL_WIDTH", 20)
    monkeypatch.setattr(fit, "TRAIL_GAIN", 0)
    monkeypatch.setattr(fit._Trail, "everywhere", everywhere)
    path = os.path.join(ROOT, "traces", name)
    resumed, alone = both_ways(path, "torch", monkeypatch)
    assert resumed == alone
    assert checked.differ == [] and checked.resumed > 0, (checked.count, checked.resumed)


def resumed_anywhere(t, cap=None) -> None:
    """`Replay.checkpoint` after every record of ``t`` and a fresh replay resumed from each: its whole result is
    the one the replay from the first event gives, bit for bit."""
    alone = whole(Replay(t, "torch", cap=cap).run())
    r = Replay(t, "torch", cap=cap)
    for k in range(1, len(t)):
        if r.run(until=k) is not None:
            break
        again = Replay(t, "torch", cap=cap)
        again.resume(r.checkpoint())
        assert whole(again.run()) == alone, f"resumed after record {k}"


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(ops=POOL_OPS, cap=st.sampled_from([None, 30 * MiB, 60 * MiB]))
def test_a_replay_resumed_anywhere_in_a_trace_with_private_pools_is_the_replay_from_event_0(ops, cap):
    """Pools begun, ended, retained, released and emptied among the requests (`test_torch_pools._build`)."""
    resumed_anywhere(_build(ops)[0].w.finish(), cap)


def _released_then_emptied(t):
    """A graph's pool released: the next empty_cache frees its segment (the pool is freeable)."""
    t.begin(1)
    a = t.alloc(12 * MiB)
    t.end(1)
    t.free(a)
    t.release(1)
    t.free(t.alloc(MiB))
    t.empty_cache()
    t.alloc(MiB)


def _kept_by_a_live_block(t):
    """A released pool whose block is still live keeps its segment (and itself: its reserved bytes) through one
    empty_cache, and gives it back at the next."""
    t.begin(1)
    a = t.alloc(12 * MiB)
    t.end(1)
    t.release(1)
    t.empty_cache()
    t.free(a)
    t.free(t.alloc(MiB))
    t.empty_cache()
    t.alloc(MiB)


def _begun_across(t):
    """A capture still begun where the checkpoint is taken: its requests go on to its pool, and empty_cache frees
    nothing of the default pools meanwhile."""
    t.free(t.alloc(3 * MiB))
    t.begin(2, any_stream=True)
    t.free(t.alloc(3 * MiB))
    t.empty_cache()
    b = t.alloc(5 * MiB)
    t.end(2)
    t.free(b)
    t.empty_cache()
    t.alloc(MiB)


@pytest.mark.parametrize("write", [_released_then_emptied, _kept_by_a_live_block, _begun_across])
def test_a_replay_resumed_anywhere_keeps_the_pools_state(write):
    """What the pools' state holds besides blocks — the freeable pools, a pool's reserved bytes, the pools begun —
    each read after the checkpoint."""
    t = T()
    write(t)
    resumed_anywhere(t.w.finish())


def pool_steps(path: str, steps: int) -> str:
    """A torch trace of ``steps`` training steps (12 requests each, half freed mid-step), every 5th step capturing
    a graph into a new private pool that keeps two blocks, the graph four captures old released, ``empty_cache``
    every 50th step: 28 records a step."""
    w = TraceWriter({"framework": "torch", "device": {"name": "test", "total_memory": 80 << 30}})
    graphs, pool = [], 0
    for k in range(steps):
        w.mark(f"step {k}")
        acts = [w.alloc((1, 2, 3, 6, 12)[(k + i) % 5] * MiB + 512 * i, 0x100) for i in range(12)]
        for a in acts[::2]:
            w.free(a)
        if k % 5 == 0:
            pool += 1
            w.record(ev.POOL_BEGIN, aux=pool, stream=0x100, flags=ev.POOL_CAPTURE, addr=pool)
            inside = [w.alloc((2, 4, 8)[(k + i) % 3] * MiB, 0x100) for i in range(6)]
            for a in inside[:4]:
                w.free(a)
            w.record(ev.POOL_END, aux=pool, addr=pool)
            graphs.append((pool, inside[4:]))
            if len(graphs) > 3:
                old, kept = graphs.pop(0)
                for a in kept:
                    w.free(a)
                w.record(ev.POOL_RELEASE, aux=old, addr=old)
        for a in acts[1::2]:
            w.free(a)
        if k % 50 == 49:
            w.record(ev.CACHE_RELEASE, aux=ev.TORCH_AUX)
    w.finish().save(path)
    return path


def test_tune_under_a_cap_on_a_long_trace_with_private_pools(tmp_path):
    """The crash of issue 28: on a trace with private pools of `fit.TRAIL_LEAST` records or more, ``tune --cap``
    (and ``fit``) ended in ``ValueError: a checkpoint of private pools`` from a resumed probe."""
    path = pool_steps(str(tmp_path / "pools.bin"), 360)
    assert len(cached_trace(path)) >= fit.TRAIL_LEAST
    peak = Replay(cached_trace(path), "torch").run().peak_reserved_bytes
    p = run_cli("tune", path, "--cap", str(int(0.9 * peak)), "-j", "1", "--max-replays", "4")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
