"""The `torch` policy: each rule of PyTorch's caching allocator on small hand-made traces.

Expected values come from the allocator's rules (docs/models/torch.md, Rules),
worked by hand, not from the model's own output.
"""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

from allocsim.engine.replay import Replay
from allocsim.testing import STREAMS
from allocsim.errors import InputError, UsageError
from allocsim.frameworks.torch import parse_divisions, settings_from_trace
from allocsim.policies.torch import TorchCachingAllocator as Torch, get_allocation_size, round_size
from allocsim.trace import TraceWriter
from allocsim.trace import events as ev

# here, not inside a @given test: importing a test module there defines its @given tests inside a run (nested)
from test_fast_path import assert_fused_is_plain, pressured_traces
from test_reference_models import assert_same

MiB = 1 << 20
KiB = 1 << 10


def run(trace, *opts, cap=None, capacity=None):
    r = Replay(trace, "torch", options=list(opts), cap=cap, capacity=capacity, keep_going=True)
    return r.policy, r.run()


def segs(pol, kind=None):
    return [s for k, s, _ in pol.segment_log if kind is None or k == kind]


# ---- rounding -------------------------------------------------------------------------------
def test_round_size_plain_and_divisions():
    assert round_size(1) == 512
    assert round_size(513) == 1024
    d4 = (4,) * 16
    assert round_size(1200, d4) == 1536            # power-of-two path needs n > 512*d
    assert round_size(int(1.1 * MiB), d4) == 1.25 * MiB
    assert round_size(3 * MiB + 1, d4) == 3.5 * MiB    # steps of 512 KiB between 2 and 4 MiB
    assert round_size(4 * MiB, d4) == 4 * MiB      # a power of two stays


def test_parse_divisions_both_syntaxes():
    assert parse_divisions("4") == (4,) * 16
    # first key fills every interval below it; '>' fills after the last key (rev B: last_index + 1)
    assert parse_divisions("[256:1,512:2,1024:4,>:8]") == (1,) * 9 + (2, 4) + (8,) * 5
    with pytest.raises(ValueError):
        parse_divisions("3")
    with pytest.raises(ValueError):
        parse_divisions("[300:2]")


def test_parse_divisions_a_key_given_again_counts_last_as_pytorch():
    """PyTorch's parseRoundUpPower2Divisions sets a key's interval each time it is given (the first key also fills the
    intervals below it), so ``[256:2,256:4]`` rounds the 256 MiB interval in 4; an empty item is refused as PyTorch
    refuses it (a trailing comma passes there and here)."""
    assert parse_divisions("[256:2,256:4]") == (2,) * 8 + (4,) + (0,) * 7
    assert parse_divisions("[256:2,512:4,256:8]") == (2,) * 8 + (8, 4) + (0,) * 6
    assert parse_divisions("[256:2,]") == (2,) * 9 + (0,) * 7
    for text, k in (("[256:2,,512:4]", 2), ("[,256:2]", 1)):
        with pytest.raises(ValueError, match=rf"item {k} of the list {re.escape(text)} is empty"):
            parse_divisions(text)


@pytest.mark.parametrize("div", [{"1": 2, "01": 4}, {"32768": 2, "65536": 4}])
def test_recorded_divisions_keying_one_interval_twice_are_refused(div):
    """A snapshot's recorded divisions key each interval once; two keys of one interval (``65536`` is clamped to the
    last, as ``32768`` is) are an edited file, not a setting PyTorch ran with."""
    with pytest.raises(InputError, match="roundup_power2_divisions keys .* name one interval"):
        settings_from_trace({"allocator_settings": {"roundup_power2_divisions": div}})


def test_options_alloc_conf_syntax_and_errors():
    o = Torch.parse_options(["expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:[256:1,>:8]",
                             "garbage_collection_threshold=0.6"])
    assert o["expandable_segments"] is True and o["max_split_size_mb"] == 128
    assert o["roundup_power2_divisions"] == (1,) * 9 + (8,) * 7
    assert o["garbage_collection_threshold"] == 0.6
    for bad in ("max_split_size_mb:10", "garbage_collection_threshold:1.5", "nosuch:1", "expandable_segments"):
        with pytest.raises(UsageError):
            Torch.parse_options([bad])


def test_segment_sizes():
    assert get_allocation_size(512) == 2 * MiB
    assert get_allocation_size(MiB) == 2 * MiB
    assert get_allocation_size(MiB + 512) == 20 * MiB
    assert get_allocation_size(10 * MiB - 512) == 20 * MiB
    assert get_allocation_size(11 * MiB) == 12 * MiB
    assert get_allocation_size(11 * MiB + 1) == 12 * MiB


def one_each(*sizes, stream=0):
    w = TraceWriter(meta={"framework": "torch"})
    for s in sizes:
        w.alloc(s, stream)
    return w.finish()


def test_pool_choice_and_first_segments():
    pol, res = run(one_each(11 * MiB, MiB, MiB + 1))
    assert segs(pol) == [12 * MiB, 2 * MiB, 20 * MiB]
    assert res.peak_allocated_bytes == 12 * MiB + MiB + MiB + 512   # 1 MiB slack of the 12 MiB not split off
    assert pol.counters()["segment_allocated"] == 3


def test_small_pool_shares_a_segment_large_requests_split_from_20mib():
    # 4 x 500 KiB fit one 2 MiB small segment; 3 x 6 MiB fit one 20 MiB segment (remainder 2 MiB > 1 MiB)
    pol, res = run(one_each(*([500 * KiB] * 4 + [6 * MiB] * 3)))
    assert segs(pol) == [2 * MiB, 20 * MiB]
    assert res.peak_allocated_bytes == 4 * 500 * KiB + 18 * MiB


def test_large_pool_split_rule_remainder_must_exceed_1mib():
    # 19.5 MiB from a 20 MiB segment leaves 0.5 MiB: not split, the block is handed out whole
    pol, res = run(one_each(int(19.5 * MiB), 2 * MiB))
    assert segs(pol) == [20 * MiB, 20 * MiB]
    assert res.peak_allocated_bytes == 20 * MiB + 2 * MiB
    # 18.5 MiB leaves 1.5 MiB: split, and a 1.2 MiB request fits in it
    pol, _ = run(one_each(int(18.5 * MiB), int(1.2 * MiB)))
    assert segs(pol) == [20 * MiB]


def test_free_merges_neighbours_and_best_fit_takes_lowest_address():
    w = TraceWriter(meta={})
    a, b, c = (w.alloc(4 * MiB) for _ in range(3))      # one 20 MiB segment: a|b|c|8 MiB free
    w.free(a)
    w.free(b)                                           # a+b merge: 8 MiB free at the start
    d = w.alloc(8 * MiB)                                # two 8 MiB candidates: lowest address wins
    t = w.finish()
    seen = {}
    r = Replay(t, "torch", observer=lambda i, k, id_, h: seen.__setitem__(id_, h) if k == ev.ALLOC else None)
    pol = r.policy
    r.run()
    assert segs(pol) == [20 * MiB]
    assert pol.block(seen[d])[0] == pol.block(seen[a])[0]


def test_streams_do_not_share_blocks():
    w = TraceWriter(meta={})
    w.free(w.alloc(4 * MiB, stream=7))
    w.alloc(4 * MiB, stream=9)
    pol, _ = run(w.finish())
    assert segs(pol) == [20 * MiB, 20 * MiB]


def test_oversize_blocks_with_max_split():
    w = TraceWriter(meta={})
    w.free(w.alloc(100 * MiB))
    w.alloc(30 * MiB)                # normal request (< 64 MiB) never gets an oversize block
    w.alloc(90 * MiB)                # oversize request: the cached 100 MiB is within +20 MiB slack
    t = w.finish()
    pol, _ = run(t, "max_split_size_mb:64")
    assert segs(pol) == [100 * MiB, 30 * MiB]
    pol, _ = run(t)                  # without max_split the 30 MiB request splits the 100 MiB block
    assert segs(pol) == [100 * MiB, 90 * MiB]
    w = TraceWriter(meta={})
    w.free(w.alloc(200 * MiB))
    w.alloc(100 * MiB)               # 200 >= 100 + 20: too much slack, a new segment
    pol, _ = run(w.finish(), "max_split_size_mb:64")
    assert segs(pol) == [200 * MiB, 100 * MiB]


def test_release_available_cached_blocks_frees_an_oversize_block_before_flushing():
    w = TraceWriter(meta={})
    a, b = w.alloc(100 * MiB), w.alloc(200 * MiB)
    w.free(a)
    w.free(b)
    w.alloc(120 * MiB)       # cached 200 MiB has too much slack (>= 120 + 20); 300 + 120 > cap 350:
    #                          the smallest cached oversize block >= 120 MiB (the 200 MiB one) is freed
    pol, res = run(w.finish(), "max_split_size_mb:64", cap=350 * MiB)
    assert [(k, s) for k, s, _ in pol.segment_log] == [
        (ev.SEGMENT_ALLOC, 100 * MiB), (ev.SEGMENT_ALLOC, 200 * MiB), (ev.SEGMENT_FREE, 200 * MiB),
        (ev.SEGMENT_ALLOC, 120 * MiB)]
    assert pol.num_alloc_retries == 0 and res.ooms == 0


def test_retry_and_cache_flush_under_a_cap():
    w = TraceWriter(meta={})
    w.free(w.alloc(30 * MiB))
    w.free(w.alloc(500 * KiB))
    w.alloc(50 * MiB)                # cap 64 MiB: 30 + 2 + 50 > 64 -> flush both, retry
    w.alloc(30 * MiB)                # 50 + 30 > 64 and nothing cached: flush, retry, OOM
    pol, res = run(w.finish(), cap=64 * MiB)
    assert [(k, s) for k, s, _ in pol.segment_log] == [
        (ev.SEGMENT_ALLOC, 30 * MiB), (ev.SEGMENT_ALLOC, 2 * MiB),
        (ev.SEGMENT_FREE, 30 * MiB), (ev.SEGMENT_FREE, 2 * MiB),   # large pool released before small
        (ev.SEGMENT_ALLOC, 50 * MiB)]
    c = pol.counters()
    assert c["num_alloc_retries"] == 2 and c["cache_flushes"] == 2 and c["num_sync_all_streams"] == 2
    assert c["num_ooms"] == 1 and res.ooms == 1
    names = [r["name"] for r in res.sections]
    assert "5. release_cached_blocks" in names and "6. alloc_block (retry)" in names


def test_expandable_segments_map_pages_and_unmap_on_flush():
    w = TraceWriter(meta={})
    a = w.alloc(30 * MiB)            # large pool: two 20 MiB pages mapped
    b = w.alloc(5 * MiB)             # fits in the 10 MiB mapped and free after a: no map
    w.alloc(500 * KiB)               # small pool: one 2 MiB page
    w.free(a)
    w.alloc(100 * MiB)               # grows from b's 5 MiB free tail: maps 100 MiB; 42 + 100 > cap 130
    #                                  -> flush unmaps a's completely free page, then the retry fits
    pol, res = run(w.finish(), "expandable_segments:True", cap=130 * MiB)
    log = [(k, s) for k, s, _ in pol.segment_log]
    assert log[:3] == [(ev.SEGMENT_MAP, 40 * MiB), (ev.SEGMENT_MAP, 2 * MiB), (ev.SEGMENT_UNMAP, 20 * MiB)]
    # a's 30 MiB + the 5 MiB after it: only page 0 (0-20 MiB) is completely free; page 1 holds b
    # PyTorch's segment stat counts no expandable segment: left out, not a 0 beside the maps (issue 18)
    c = pol.counters()
    assert c["num_device_alloc"] == 3 and not {"segment_current", "segment_allocated"} & set(c)
    assert res.ooms == 0 and pol.num_alloc_retries == 1
    assert log[3] == (ev.SEGMENT_MAP, 100 * MiB) and len(log) == 4
    assert sum(s if k == ev.SEGMENT_MAP else -s for k, s in log) == res.final_reserved_bytes
    del b


def test_segment_counters_follow_cudamalloc_segments():
    """Without expandable segments, each device malloc is a segment (PyTorch's ``segment`` stat), each free ends one."""
    w = TraceWriter(meta={})
    a = w.alloc(30 * MiB)
    w.alloc(500 * KiB)
    w.free(a)
    w.alloc(100 * MiB)
    pol, res = run(w.finish(), cap=130 * MiB)     # 30 MiB, 2 MiB (small pool); the flush frees a's, then 100 MiB
    c = pol.counters()
    assert c["segment_allocated"] == c["num_device_alloc"] == 3 and c["num_device_free"] == 1
    assert c["segment_current"] == c["segment_allocated"] - c["num_device_free"]


def test_gc_threshold_frees_old_cached_segments():
    w = TraceWriter(meta={})
    w.free(w.alloc(40 * MiB))        # cached at large-pool get_free_block call 0
    w.free(w.alloc(60 * MiB))        # call 1: miss; cached at 1
    w.alloc(70 * MiB)                # call 2: miss; reserved 100 = threshold: no GC yet
    w.alloc(80 * MiB)                # call 3: reserved 170 > 0.5 * 200: ages 3 and 2, average 2.5:
    t = w.finish()                   # the 40 MiB goes first, then (average 2) the 60 MiB
    want = [(ev.SEGMENT_ALLOC, 40 * MiB), (ev.SEGMENT_ALLOC, 60 * MiB), (ev.SEGMENT_ALLOC, 70 * MiB),
            (ev.SEGMENT_FREE, 40 * MiB), (ev.SEGMENT_FREE, 60 * MiB), (ev.SEGMENT_ALLOC, 80 * MiB)]
    # 200 MiB allowed: a fraction of the device memory, or --cap (the per-process allowed memory)
    for opts, cap, capacity in ((("per_process_memory_fraction:0.5",), None, 400 * MiB), ((), 200 * MiB, 400 * MiB)):
        pol, res = run(t, "garbage_collection_threshold:0.5", *opts, cap=cap, capacity=capacity)
        assert [(k, s) for k, s, _ in pol.segment_log] == want
        assert pol.num_alloc_retries == 0
        assert any(r["name"] == "2. garbage_collect_cached_blocks" for r in res.sections)
    # no allowed memory: no GC, the device fills instead; fraction 1.0 clears the limit (setMemoryFraction)
    for opts in ((), ("per_process_memory_fraction:1.0",)):
        pol, _ = run(t, "garbage_collection_threshold:0.5", *opts, capacity=200 * MiB)
        assert pol.num_alloc_retries == 1 and pol.cache_flushes == 1


def test_settings_from_trace_and_explicit_override():
    meta = {"allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "backend:native,max_non_split_rounding_mb:40",
                                   "max_split_size": 128 * MiB, "expandable_segments": True,
                                   "garbage_collection_threshold": 0.0,
                                   "roundup_power2_divisions": {str(1 << i): (4 if i == 0 else 0)
                                                                for i in range(16)}}}
    s = settings_from_trace(meta)
    assert s["max_split_size_mb"] == 128 and s["expandable_segments"] is True
    assert s["max_non_split_rounding_mb"] == 40 and s["roundup_power2_divisions"][:2] == (4, 0)
    w = TraceWriter(meta=meta)
    w.alloc(int(1.1 * MiB))
    pol, res = run(w.finish(), "expandable_segments:False")
    assert pol.expandable is False and pol.max_split == 128 * MiB
    assert res.peak_allocated_bytes == 1.25 * MiB          # the recorded divisions apply
    pol, _ = run(w.finish(), "trace_settings:false")
    assert pol.max_split > 2**60
    with pytest.raises(InputError):
        settings_from_trace({"allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}})


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30 * MiB), st.booleans(), st.integers(0, 1)), min_size=1, max_size=60),
       st.booleans())
def test_invariants_blocks_disjoint_and_reserved_accounts(ops, expandable):
    """Live blocks never overlap and hold at least the rounded request; reserved = segment log sum."""
    w = TraceWriter(meta={})
    live = []
    for size, free_one, stream in ops:
        live.append(w.alloc(size, stream))
        if free_one and len(live) > 1:
            w.free(live.pop(0))
    t = w.finish()
    blocks = {}

    def check(i, kind, id_, h):
        if kind == ev.ALLOC and h is not None:
            blocks[id_] = pol.block(h)
            assert blocks[id_][1] >= round_size(int(t.id_size[id_]))
        elif kind == ev.FREE:
            blocks.pop(id_, None)
        spans = sorted(blocks.values())
        assert all(a0 + s0 <= a1 for (a0, s0), (a1, _) in zip(spans, spans[1:]))

    opts = ["expandable_segments:True"] if expandable else []
    r = Replay(t, "torch", options=opts, cap=256 * MiB, keep_going=True, observer=check)
    pol, dev = r.policy, r.device
    r.run()
    grown = sum(s if k in (ev.SEGMENT_ALLOC, ev.SEGMENT_MAP) else -s for k, s, _ in pol.segment_log)
    assert grown == dev.reserved
    assert pol.allocated == sum(s for _, s in blocks.values())


# ---- the free blocks' keys (KeyField) --------------------------------------------------------
SPREAD = 1 << 44        # 16 TiB between segments: a key field of ~50 bits, so most keys pass one machine word


def spread_out(mp):
    """Make the simulated device place ranges by its bump pointer (no driver model), leaving ``SPREAD`` bytes
    after each (a process whose segments lie far apart in its address space)."""
    from allocsim.machine.device import SimulatedDevice
    init, bump = SimulatedDevice.__init__, SimulatedDevice._bump

    def bare(self, *args, address_hints=None, **kw):
        init(self, *args, **kw)

    def spread(self, n, bounded=False):
        addr = bump(self, n, bounded)
        self._next += SPREAD
        return addr
    mp.setattr(SimulatedDevice, "__init__", bare)
    mp.setattr(SimulatedDevice, "_bump", spread)


def test_the_key_field_widens_for_each_segment_outside_it_and_keeps_the_order():
    """`KeyField`: a segment outside the field widens it (with room around) and re-keys the free blocks; keys of
    blocks past ``fit`` are Python ints; either way keys order blocks by (size, address)."""
    from allocsim.policies.torch import KeyField, _wide_key
    f = KeyField()
    f.widen(1 << 40, 2 * MiB)
    assert f.covers(1 << 40, 2 * MiB) and not f.covers((1 << 40) + (1 << f.abits), 2 * MiB)
    f.widen(1 << 46, 20 * MiB)
    assert f.covers(1 << 40, 2 * MiB) and f.covers(1 << 46, 20 * MiB) and f.abits >= 46 and f.fit <= 1 << 16
    blocks = [(s, p) for s in (512, 4 * KiB, f.fit, 20 * MiB) for p in ((1 << 40) + 512, (1 << 46) + MiB)]
    keys = [_wide_key(s, p, f.abits, f.lo) for s, p in blocks]
    assert sorted(keys) == keys and max(keys) > 1 << 63
    assert [k >> f.abits for k in keys] == [s for s, _ in blocks]


WIDE_OPTIONS = [[], ["max_split_size_mb:20"], ["expandable_segments:true"],
                ["garbage_collection_threshold:0.6"], ["expandable_segments:true,garbage_collection_threshold:0.5"]]


def assert_wide_keys_replay_alike(trace, options, cap):
    """On a device whose segments lie 16 TiB apart: the fused loop is the plain walk, and both the reference
    model, block for block."""
    with pytest.MonkeyPatch.context() as mp:
        spread_out(mp)
        assert_fused_is_plain(trace, "torch", options, cap=cap)
        assert_same(trace, "torch-ref", options, cap=cap)


@pytest.mark.parametrize("options", WIDE_OPTIONS)
def test_keys_past_one_machine_word_replay_alike(options):
    """Segments 16 TiB apart: most keys are Python ints past 2**63 (`_wide_key`, the compiled build's slow
    path) and the field re-keys the pools as it widens (a generated trace: no recorded addresses, so the
    device places every segment itself)."""
    from allocsim.formats import synth
    trace = synth.generate("alloc-heavy", seed=3, n_allocs=3000)
    with pytest.MonkeyPatch.context() as mp:
        spread_out(mp)
        r = Replay(trace, "torch", options=options, capacity=8 << 30)
        r.run()
        field = r.policy._field
        pools = [p for pp in r.policy._pools.values() for p in pp]
        assert field.abits > 44 and max(k for p in pools for k in p.keys) > 1 << 63
        assert all(type(p.keys) is list for p in pools if p.keys and p.keys[-1] >= 1 << 63)   # never C words
    assert_wide_keys_replay_alike(trace, options, trace.load_bytes * 11 // 10)


def test_compiled_pools_keep_their_keys_as_c_words_within_63_bits():
    """Compiled, a pool whose keys stay below 2**63 keeps them as C words in an ``array('q')`` (`BlockPool`);
    interpreted, a list (ResNet-50's recording: every key within 61 bits)."""
    import os
    from array import array
    from conftest import ROOT
    from allocsim.compiled import compiled_modules
    from allocsim.trace import Trace
    r = Replay(Trace.load(os.path.join(ROOT, "traces", "resnet50.bin")), "torch")
    r.run()
    pools = [p for pp in r.policy._pools.values() for p in pp]
    assert pools and all(k < 1 << 63 for p in pools for k in p.keys)
    words = Torch.__module__ in compiled_modules()
    assert all(type(p.keys) is (array if words else list) for p in pools), [type(p.keys) for p in pools]


@pytest.mark.parametrize("options", WIDE_OPTIONS)
@settings(max_examples=15, deadline=None, derandomize=True)
@given(data=st.data())
def test_keys_past_one_machine_word_replay_alike_under_pressure(options, data):
    """The same on generated traces with cache releases, recorded OOMs and limits set mid-run."""
    trace = data.draw(pressured_traces())
    cap = data.draw(st.sampled_from([None, int(max(trace.load_bytes, MiB) * 0.7), int(trace.load_bytes * 1.3) or None]))
    assert_wide_keys_replay_alike(trace, options, cap)


CHECKPOINT_OPTIONS = WIDE_OPTIONS + [["max_split_size_mb:20,max_non_split_rounding_mb:40"]]


@st.composite
def oversize_traces(draw):
    """Requests about a 20 MiB ``max_split`` on three streams, most freed again: blocks that rule 5 refuses for a
    request of 20 MiB or more (``oversize_slack``) as well as ones it takes."""
    w, live = TraceWriter(), []
    for size, stream, pick in draw(st.lists(st.tuples(st.sampled_from([300 * KiB, 3 * MiB, 21 * MiB, 33 * MiB,
                                                                         45 * MiB, 70 * MiB, 130 * MiB]),
                                                        st.integers(0, 2), st.integers(0, 4)), min_size=1, max_size=40)):
        if pick and live:
            w.free(live.pop(pick % len(live)))
        live.append(w.alloc(size, stream=STREAMS[stream]))
    return w.finish()


def _replayed(r) -> dict:
    """What a torch replay left, walked to the end: its result (no wall time), counters, refused slack, live
    blocks and segment log."""
    while not r.at_end and r.step(1 << 62):
        pass
    blocks, pol = r.live_blocks(), r.policy
    slack, log = pol.oversize_slack, pol.segment_log[:]
    res = r.finish().to_dict()
    res.pop("replay_seconds", None)
    return {"result": res, "counters": pol.counters(), "oversize_slack": slack, "live": blocks, "log": log}


@pytest.mark.parametrize("options", CHECKPOINT_OPTIONS)
@settings(max_examples=15, deadline=None, derandomize=True)
@given(data=st.data())
def test_a_checkpoint_anywhere_resumes_as_the_replay_walked_on(options, data):
    """A checkpoint between any two events (pools whose keys are C words, or Python ints past 2**63 on a device
    whose segments lie 16 TiB apart, re-keyed as the field widens; three streams; a cap), resumed by a fresh
    replay through the fused loop or the plain walk, ends as the replay walked through, refused slack
    (``oversize_slack``) and segment log included; the replay checkpointed goes on unchanged."""
    trace = data.draw(st.one_of(pressured_traces(), oversize_traces()))
    cap = data.draw(st.sampled_from([None, int(max(trace.load_bytes, MiB) * 0.7)]))
    k, fast = data.draw(st.integers(1, max(1, len(trace)))), data.draw(st.booleans())
    with pytest.MonkeyPatch.context() as mp:
        if data.draw(st.booleans()):
            spread_out(mp)
        whole = _replayed(Replay(trace, "torch", options=options, cap=cap, capacity=None))
        r = Replay(trace, "torch", options=options, cap=cap, capacity=None)
        r.step(k)
        if not r.can_checkpoint():
            return
        state = r.checkpoint()
        resumed = Replay(trace, "torch", options=options, cap=cap, capacity=None, fast_path=fast)
        resumed.resume(state)
        assert _replayed(r) == whole
        assert _replayed(resumed) == whole
