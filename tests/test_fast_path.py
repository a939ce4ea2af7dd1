"""The fused per-chunk loop (`walk_chunk`) against the plain walk through ``malloc``/``free``.

`split`, `torch`, `bestfit` and `cupy` serve a chunk's common events in one fused loop of their own
(docs/architecture.md, "The fast path"); ``Replay(fast_path=False)`` walks the same events one by
one through ``malloc``/``free``. Both must give the same replay: the same device calls (sizes,
addresses, order), every live block at the same address, the same result field by field, and the
same modeled clock bit for bit. Traces: hypothesis-generated ones with cache releases, recorded
OOMs and limits set mid-run, walked in tiny chunks so that every hand-back and chunk edge is met;
and every shipped trace.
"""
from __future__ import annotations

import glob
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocsim.trace.trace as trace_module
from allocsim.engine.replay import Replay, make_device
from allocsim.frameworks.torch import MAX_MB
from allocsim.policies.bestfit import BestFit
from allocsim.policies.cupy import CuPyPool
from allocsim.testing import STREAMS, check_policy
from allocsim.trace import Trace, TraceWriter
from allocsim.trace.events import CACHE_RELEASE, SET_LIMIT

from conftest import ROOT

MiB = 1 << 20
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "traces", "*.bin")))
#: the policies with a fused loop, and options that change their hot path
FUSED = [("split", []), ("split", ["huge_exact=true"]), ("torch", []), ("torch", ["max_split_size_mb:20"]),
         ("torch", ["roundup_power2_divisions:4"]), ("torch", ["expandable_segments:true"]),
         ("torch", ["garbage_collection_threshold:0.6"]),
         ("torch", ["expandable_segments:true,garbage_collection_threshold:0.5,max_split_size_mb:40"]),
         ("bestfit", []), ("bestfit", ["release=true"]), ("bestfit", ["segment=1MiB"]), ("cupy", []),
         ("cupy", ["version=13"]), ("cupy", ["limit=48MiB"])]
FUSED_IDS = [f"{p}[{','.join(o)}]" for p, o in FUSED]


def walk(trace, policy, options, fast_path, *, cap=None, keep_going=True, steps=None):
    """What one replay did: its device calls, result, live blocks, counters and clock."""
    dev = make_device(trace, policy, cap=cap, capacity=None)
    calls = []
    for name in ("malloc", "free", "map"):     # every device call, its arguments and its answer, in order

        def logged(*args, call=getattr(dev, name), name=name):
            out = call(*args)
            calls.append((name, args, out))
            return out
        setattr(dev, name, logged)
    r = Replay(trace, policy, options=options, cap=cap, device=dev, keep_going=keep_going, fast_path=fast_path)
    assert fast_path or not r.fast_path
    while not r.at_end and r.step(steps or 1 << 62):      # in steps, or all at once (still open: read below)
        pass
    blocks = r.live_blocks()
    counters = r.policy.counters()
    res = r.finish().to_dict()
    res.pop("replay_seconds", None)
    return {"device calls": calls, "result": res, "live blocks": blocks, "counters": counters,
            "clock": dev.clock.hex()}


def assert_fused_is_plain(trace, policy, options, **kw):
    fused, plain = walk(trace, policy, options, True, **kw), walk(trace, policy, options, False, **kw)
    for what in plain:
        assert fused[what] == plain[what], f"{what} differ: fused {fused[what]!r:.300} plain {plain[what]!r:.300}"
    return fused


sizes = st.one_of(st.integers(1, 4096), st.integers(4097, 2 * MiB), st.integers(2 * MiB, 48 * MiB), st.integers(32 * MiB, 80 * MiB),
                  st.sampled_from([512, MiB, MiB + 1, 2 * MiB, 10 * MiB, 20 * MiB, 32 * MiB, 33 * MiB]))


@st.composite
def pressured_traces(draw):
    """Allocs and frees on three streams, with cache releases, recorded OOMs and limits set mid-run
    (the events the fused loop hands back), some objects left live."""
    ops = draw(st.lists(st.tuples(st.integers(0, 12), sizes, st.integers(0, 2), st.integers(0, 10**6)),
                        min_size=1, max_size=120))
    w = TraceWriter(meta={"producer": "hypothesis"})
    live: list[int] = []
    for what, size, stream, pick in ops:
        if what == 0:
            w.record(CACHE_RELEASE)
        elif what == 1:
            w.oom(size, stream=STREAMS[stream])
        elif what == 2:
            w.record(SET_LIMIT, size=(pick % 64 + 8) * MiB)
        elif what <= 7 or not live:
            live.append(w.alloc(size, stream=STREAMS[stream]))
        else:
            w.free(live.pop(pick % len(live)))
    for k in draw(st.permutations(range(len(live))))[:draw(st.integers(0, len(live)))]:
        w.free(live[k])
    return w.finish()


@pytest.mark.parametrize("policy, options", FUSED, ids=FUSED_IDS)
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fused_loop_is_the_plain_walk_on_generated_traces(policy, options, data, monkeypatch):
    trace = data.draw(pressured_traces())
    monkeypatch.setattr(trace_module, "CHUNK", data.draw(st.sampled_from([3, 17, 1 << 16])))
    cap = data.draw(st.sampled_from([None, int(max(trace.load_bytes, MiB) * 0.7), int(trace.load_bytes * 1.3) or None]))
    assert_fused_is_plain(trace, policy, options, cap=cap, keep_going=data.draw(st.booleans()),
                          steps=data.draw(st.sampled_from([None, 1, 5])))


@pytest.mark.parametrize("policy", ["split", "torch", "bestfit", "cupy"])
@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_fused_loop_is_the_plain_walk_on_shipped_traces(policy, path):
    trace = Trace.load(path)
    assert_fused_is_plain(trace, policy, [])
    assert_fused_is_plain(trace, policy, [], cap=trace.load_bytes * 11 // 10)     # escalations, flushes, OOMs


def test_fused_loop_only_when_the_walk_has_nothing_else_to_do():
    """The fused loop runs under the eager runtime with every optional feature off; else the plain walk."""
    trace = Trace.load(os.path.join(ROOT, "traces", "resnet50.bin"))
    assert Replay(trace, "split").fast_path and Replay(trace, "bestfit").fast_path
    assert Replay(trace, "torch").fast_path and Replay(trace, "torch[expandable_segments:True]").fast_path
    assert not Replay(trace, "split", runtime="gc").fast_path
    assert not Replay(trace, "split", timeline=True).fast_path
    assert not Replay(trace, "split", observer=lambda *a: None).fast_path
    assert Replay(trace, "cupy").fast_path
    assert not Replay(trace, "cupy", options={"track_total": True}).fast_path      # its own malloc/free


def skewed_fused_loop(base):
    """``base`` with a fused loop that charges a nanosecond more than the plain walk: check_policy must say so.
    It declares malloc and free beside it, so the engine takes its loop as theirs (`Policy.fused_loop`)."""

    class SkewedFusedLoop(base):
        def malloc(self, size, stream):
            return super().malloc(size, stream)

        def free(self, handle):
            super().free(handle)

        def walk_chunk(self, *args):
            out = super().walk_chunk(*args)
            args[4].clock += 1e-9          # the device
            return out
    return SkewedFusedLoop


@pytest.mark.parametrize("policy", [BestFit, CuPyPool], ids=lambda c: c.name)
def test_check_policy_holds_a_fused_loop_to_the_plain_walk(policy):
    check_policy(policy, runtimes=("eager",), examples=4)
    with pytest.raises(AssertionError, match="fast path differs from the plain walk: .* total_time_seconds"):
        check_policy(skewed_fused_loop(policy), runtimes=("eager",), examples=4)


def coalescing_trace() -> Trace:
    """Frees that merge with a right neighbour, then a left one, inside one segment, each followed by a request
    that fits only the merged block (or a stale end record would let it overlap a live block)."""
    KiB = 1024
    w = TraceWriter()
    a, b, c, d, e = (w.alloc(n * 64 * KiB) for n in (1, 2, 3, 4, 5))
    w.free(c)
    w.free(b)                   # merges right with c: the merged block ends where c ended
    w.free(d)                   # merges left with b+c through that end
    x = w.alloc(9 * 64 * KiB)   # fits exactly the merged b+c+d
    f, g, h = (w.alloc(n * 64 * KiB) for n in (2, 3, 1))
    w.free(f)
    w.free(g)                   # merges left with f: f's end record must go
    p = w.alloc(2 * 64 * KiB)   # takes f's place; the rest of f+g stays free where g began
    q = w.alloc(3 * 64 * KiB)   # takes exactly where g began
    w.free(q)                   # must not merge with the live p
    y = w.alloc(5 * 64 * KiB)   # would overlap p if it had
    for i in (a, e, x, h, p, y):
        w.free(i)
    return w.finish()


@pytest.mark.parametrize("policy, options", FUSED, ids=FUSED_IDS)
def test_fused_loop_coalesces_as_the_plain_walk(policy, options):
    assert_fused_is_plain(coalescing_trace(), policy, options)


def test_fused_loop_misses_an_empty_pool_under_the_widest_rounding_slack():
    """An oversize request (``n >= max_split``) that finds no candidate is a miss whatever
    ``max_non_split_rounding_mb`` is, up to the most bytes a size_t holds, in the fused loop as in the plain walk
    (where ``n + slack`` passed 2**62 the fused loop took the pool's end for a hit: an IndexError interpreted, a
    drop past the end of the keys compiled; from 2**63 bytes an OverflowError compiled)."""
    w = TraceWriter()
    a = w.alloc(30 * MiB)
    b = w.alloc(60 * MiB)
    w.free(a)
    c = w.alloc(50 * MiB)       # the pool holds only the 30 MiB block: no candidate, a miss
    for i in (b, c):
        w.free(i)
    trace = w.finish()
    for mb in (MAX_MB, MAX_MB >> 1, MAX_MB >> 2):
        fused = assert_fused_is_plain(trace, "torch", [f"max_split_size_mb:20,max_non_split_rounding_mb:{mb}"])
        assert fused["counters"]["num_device_alloc"] == 3, fused["counters"]


def edge_sizes_trace() -> Trace:
    """Requests at and one byte past every rounding and class edge the fast paths test (512 B, 128 KiB,
    1 MiB, 32 MiB), allocated, partly freed and allocated again, so that a step or a boundary off by one
    in a fused loop changes a block's size or class."""
    sizes = []
    for edge in (512, 128 << 10, 1 << 20, 32 << 20):
        sizes += [edge - 1, edge, edge + 1, 3 * edge + 1]
    sizes += [(1 << 20) + (128 << 10) + 1, (32 << 20) + (1 << 20) + 1, 5 * (128 << 10) + 1]
    w = TraceWriter()
    live = [w.alloc(n) for n in sizes]
    for i in live[::2]:
        w.free(i)
    again = [w.alloc(n) for n in reversed(sizes)]
    for i in live[1::2] + again:
        w.free(i)
    return w.finish()


@pytest.mark.parametrize("policy, options", FUSED, ids=FUSED_IDS)
def test_fused_loop_rounds_and_classes_as_the_plain_walk_at_every_edge(policy, options):
    assert_fused_is_plain(edge_sizes_trace(), policy, options)
