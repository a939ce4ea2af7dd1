"""The `torch` model's private pools (docs/models/torch.md, "Private pools") on hand-written traces: each
expectation follows from CUDACachingAllocator.cpp's rules (``get_pool`` routes a request to the newest begun
pool whose filter takes its stream; a block is freed into the pool it came from; ``releasePool`` makes a pool
with no users freeable; ``release_cached_blocks`` frees the whole free segments of the default pools unless a
pool is begun, then of every freeable pool; a MemPool's destructor empties its pool's cache; no release-and-retry
while a pool is begun), never from the model's own output. A hypothesis property: a pool's segments hold only
the requests routed to it, and the default pools' only the others."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.formats.importers import import_file
from allocsim.policies.torch import TorchPoolsPath
from allocsim.engine.replay import Replay
from allocsim.trace import Trace, TraceWriter
from allocsim.trace import events as ev
from allocsim.search.validate import validate
from allocsim.report.text import validation_summary

from conftest import ROOT

MiB = 1 << 20
SEG = 20 * MiB                    # a large request's segment (get_allocation_size of 1-10 MiB)
S0, S1 = 0x100, 0x200             # raw stream handles


class T:
    """A hand-written torch trace: ``a = t.alloc(n)``, ``t.free(a)``, ``t.begin(1)``, ... then ``t.replay()``."""

    def __init__(self):
        self.w = TraceWriter({"framework": "torch", "device": {"total_memory": 80 << 30}})
        self.n = 0

    def _rec(self, kind, **kw):
        self.w.record(kind, **kw)
        self.n += 1
        return self.n - 1

    def alloc(self, size, stream=S0):
        self.n += 1
        return self.w.alloc(size, stream)

    def free(self, i):
        self.n += 1
        self.w.free(i)

    def begin(self, pool, stream=S0, any_stream=False):
        flags = ev.POOL_ANY_STREAM if any_stream else ev.POOL_CAPTURE
        return self._rec(ev.POOL_BEGIN, aux=pool, stream=stream, flags=flags, addr=pool)

    def end(self, pool):
        return self._rec(ev.POOL_END, aux=pool, addr=pool)

    def retain(self, pool):
        return self._rec(ev.POOL_RETAIN, aux=pool, addr=pool)

    def release(self, pool, empty=False):
        return self._rec(ev.POOL_RELEASE, aux=pool, addr=pool, flags=ev.POOL_EMPTY if empty else 0)

    def empty_cache(self):
        return self._rec(ev.CACHE_RELEASE, aux=ev.TORCH_AUX)

    def replay(self, **kw):
        r = Replay(self.w.finish(), "torch", log_events=True, **kw)
        res = r.run()
        return r, res


def calls(r, kind=None):
    """The model's segment calls as (kind name, size, event index)."""
    return [(ev.KIND_NAMES[k], size, at) for k, size, at in r.segment_log if kind is None or k == kind]


def test_a_trace_with_pool_events_takes_the_plain_walk():
    t = T()
    t.alloc(MiB)
    t.begin(1)
    r, _ = t.replay()
    assert type(r.policy) is TorchPoolsPath and not r.fast_path


def test_a_capture_routes_only_its_stream_and_never_reuses_default_blocks():
    t = T()
    x = t.alloc(4 * MiB)                  # default segment 1 (20 MiB), on S0
    t.free(x)                             # 20 MiB free in the default pool
    t.begin(1, stream=S0)
    y = t.alloc(4 * MiB)                  # routed: the pool's own segment, although the default one is free
    z = t.alloc(4 * MiB, stream=S1)       # S1 is not the capture's stream: default pool of S1
    w = t.alloc(4 * MiB)                  # routed: fits in the pool's segment after y
    t.end(1)
    u = t.alloc(4 * MiB)                  # after the end: the default pool's free block
    r, _ = t.replay()
    assert calls(r) == [("SEGMENT_ALLOC", SEG, 0), ("SEGMENT_ALLOC", SEG, 3), ("SEGMENT_ALLOC", SEG, 4)]
    live = r.live_blocks()
    pool_base, s1_base = live[y][0], live[z][0]
    assert live[w][0] == pool_base + 4 * MiB
    assert live[u][0] not in range(pool_base, pool_base + SEG) and live[u][0] not in range(s1_base, s1_base + SEG)


def test_every_stream_is_routed_by_a_use_mem_pool_begin_and_the_newest_begin_wins():
    t = T()
    t.begin(1, any_stream=True)
    a = t.alloc(4 * MiB, stream=S1)       # pool 1 (every stream), S1's blocks of it
    t.begin(2, stream=S0)                 # newer: S0 goes to pool 2, S1 still to pool 1
    b = t.alloc(4 * MiB, stream=S0)
    c = t.alloc(4 * MiB, stream=S1)
    t.end(2)
    d = t.alloc(4 * MiB, stream=S0)       # pool 1 again: S0's blocks of pool 1, a new segment
    t.end(1)
    r, _ = t.replay()
    live = r.live_blocks()
    assert [at for _, _, at in calls(r)] == [1, 3, 6]
    assert live[c][0] == live[a][0] + 4 * MiB                   # beside a, in pool 1's S1 segment
    assert len({live[a][0] // SEG, live[b][0] // SEG, live[d][0] // SEG}) == 3


def test_a_block_freed_after_the_capture_goes_back_to_its_pool():
    t = T()
    t.begin(1)
    y = t.alloc(8 * MiB)
    t.end(1)
    t.free(y)                             # outside the capture: into pool 1's blocks
    o = t.alloc(8 * MiB)                  # a default request: cannot take it, a new default segment
    t.begin(1)                            # pool 1 again (a second graph sharing it)
    y2 = t.alloc(8 * MiB)                 # reuses y's block: no new segment
    t.end(1)
    r, _ = t.replay()
    assert [at for _, _, at in calls(r)] == [1, 4]
    live = r.live_blocks()
    assert live[y2][0] // SEG != live[o][0] // SEG


def test_a_pool_with_users_keeps_its_segments_and_gives_them_back_once_released():
    t = T()
    t.begin(1)
    y = t.alloc(4 * MiB)
    t.end(1)
    d = t.alloc(4 * MiB)
    t.free(y)
    t.free(d)
    first = t.empty_cache()               # the default segment goes; pool 1 has a user (its graph)
    gone = t.release(1)                   # the graph reset: freeable, nothing freed yet
    second = t.empty_cache()              # now the pool's whole free segment goes
    r, _ = t.replay()
    assert calls(r, ev.SEGMENT_FREE) == [("SEGMENT_FREE", SEG, first), ("SEGMENT_FREE", SEG, second)]
    assert not [c for c in calls(r) if c[2] == gone]
    assert r.policy._private == {}                                 # no segments left: forgotten


def test_a_live_block_keeps_a_released_pools_segment_until_it_is_freed():
    t = T()
    t.begin(1)
    a = t.alloc(4 * MiB)                  # segment 1 of the pool
    b = t.alloc(30 * MiB)                 # segment 2 (30 MiB, rounded to 2 MiB)
    t.end(1)
    t.release(1)
    t.free(b)
    one = t.empty_cache()                 # b's segment goes, a's stays (a is live)
    t.free(a)
    two = t.empty_cache()
    r, _ = t.replay()
    assert calls(r, ev.SEGMENT_FREE) == [("SEGMENT_FREE", 30 * MiB, one), ("SEGMENT_FREE", SEG, two)]


def test_graphs_sharing_a_pool_free_it_only_when_the_last_is_gone():
    t = T()
    for _ in range(2):                    # two captures into pool 1: two users
        t.begin(1)
        t.free(t.alloc(4 * MiB))
        t.end(1)
    t.release(1)
    kept = t.empty_cache()
    t.release(1)
    freed = t.empty_cache()
    r, _ = t.replay()
    assert [at for _, _, at in calls(r, ev.SEGMENT_FREE)] == [freed] and kept != freed


def test_a_mempool_deleted_frees_its_segments_at_once():
    t = T()
    t.retain(1)                           # torch.cuda.MemPool(): one user
    t.begin(1, any_stream=True)           # use_mem_pool: a second
    s = t.alloc(1000)                     # small: the pool's 2 MiB small segment
    big = t.alloc(4 * MiB)
    t.end(1)
    t.release(1)                          # use_mem_pool left: the MemPool still holds it
    kept = t.empty_cache()
    t.free(s)
    t.free(big)
    deleted = t.release(1, empty=True)    # ~MemPool: releasePool + emptyCache(pool): small first, then large
    r, _ = t.replay()
    assert calls(r, ev.SEGMENT_FREE) == [("SEGMENT_FREE", 2 * MiB, deleted), ("SEGMENT_FREE", SEG, deleted)]
    assert kept not in [at for _, _, at in r.segment_log]


def test_empty_cache_while_a_pool_is_begun_frees_only_freeable_pools():
    t = T()
    t.free(t.alloc(4 * MiB))              # a free default segment
    t.begin(2)
    t.free(t.alloc(4 * MiB))              # pool 2, then freed into it
    t.end(2)
    t.release(2)                          # pool 2 freeable
    t.begin(1)
    during = t.empty_cache()              # begun: the default pools are kept, freeable pool 2 is freed
    t.end(1)
    after = t.empty_cache()
    r, _ = t.replay()
    assert calls(r, ev.SEGMENT_FREE) == [("SEGMENT_FREE", SEG, during), ("SEGMENT_FREE", SEG, after)]
    assert r.policy.counters()["num_sync_all_streams"] == 1


def test_no_release_and_retry_while_a_pool_is_begun():
    """Under a cap that only a release of the default cache makes room in: outside a pool the retry serves the
    request; inside one ``release_cached_blocks`` is skipped and the request fails."""
    def run(inside):
        t = T()
        t.free(t.alloc(30 * MiB))         # a free 30 MiB default segment
        if inside:
            t.begin(1)
        t.alloc(30 * MiB, stream=S1)      # another stream: cannot use it; a new segment needs the room
        return t.replay(cap=40 * MiB, keep_going=True)
    r, res = run(False)
    assert res.ooms == 0 and r.policy.counters()["num_alloc_retries"] == 1
    assert [c[0] for c in calls(r)] == ["SEGMENT_ALLOC", "SEGMENT_FREE", "SEGMENT_ALLOC"]
    r, res = run(True)
    assert res.ooms == 1 and r.policy.counters()["num_alloc_retries"] == 0


def test_validate_follows_the_pools_and_says_nothing_is_unmodelled(tmp_path):
    """A trace whose recorded segment events are what the rules give: MATCH, and no "not modelled"."""
    w = TraceWriter({"framework": "torch", "device": {"total_memory": 80 << 30}})
    w.segment(ev.SEGMENT_ALLOC, 0x1000000000, SEG, S0)       # PyTorch's entry comes before its alloc's
    x = w.alloc(4 * MiB, S0)
    w.free(x)
    w.record(ev.POOL_BEGIN, aux=1, stream=S0, flags=ev.POOL_CAPTURE)
    w.segment(ev.SEGMENT_ALLOC, 0x2000000000, SEG, S0, flags=ev.PRIVATE_POOL)
    y = w.alloc(4 * MiB, S0)
    w.record(ev.POOL_END, aux=1)
    w.free(y)
    w.record(ev.POOL_RELEASE, aux=1)
    w.record(ev.CACHE_RELEASE)
    w.segment(ev.SEGMENT_FREE, 0x1000000000, SEG, S0)
    w.segment(ev.SEGMENT_FREE, 0x2000000000, SEG, S0, flags=ev.PRIVATE_POOL)
    path = str(tmp_path / "pools.bin")
    w.finish().save(path)
    v = validate(path)
    text = validation_summary(v)
    assert v.match, text
    assert "not modelled" not in text and "private pools: 3 pool events followed, 1 recorded segment allocations in them" in text


# ---- the property ------------------------------------------------------------------------------------
OPS = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.sampled_from([512, 3000, MiB, 3 * MiB, 12 * MiB, 25 * MiB]),
              st.sampled_from([S0, S1])),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("begin"), st.integers(1, 3), st.sampled_from([S0, S1, None])),
    st.tuples(st.just("end"), st.integers(0, 5)),
    st.tuples(st.just("retain"), st.integers(1, 3)),
    st.tuples(st.just("release"), st.integers(1, 3), st.booleans()),
    st.tuples(st.just("cache"),)), max_size=60)


def _build(ops):
    """A valid trace from ``ops`` and, per ALLOC id, the pool the rules route it to (0: the default pools)."""
    t = T()
    live, begun, users, routed_to = [], [], {}, {}
    for op in ops:
        if op[0] == "alloc":
            stream = op[2]
            pool = next((p for p, s in reversed(begun) if s is None or s == stream), 0)
            i = t.alloc(op[1], stream)
            routed_to[i] = pool
            live.append(i)
        elif op[0] == "free" and live:
            t.free(live.pop(op[1] % len(live)))
        elif op[0] == "begin" and op[1] not in [p for p, _ in begun] and users.get(op[1], 1) > 0:
            t.begin(op[1], stream=op[2] or S0, any_stream=op[2] is None)
            begun.append((op[1], op[2]))
            users[op[1]] = users.get(op[1], 0) + 1
        elif op[0] == "end" and begun:
            pool = begun.pop(op[1] % len(begun))[0]
            t.end(pool)
        elif op[0] == "retain" and users.get(op[1], 1) > 0:
            t.retain(op[1])
            users[op[1]] = users.get(op[1], 0) + 1
        elif op[0] == "release" and users.get(op[1], 0) > 0 and op[1] not in [p for p, _ in begun]:
            t.release(op[1], empty=op[2])
            users[op[1]] -= 1
        elif op[0] == "cache":
            t.empty_cache()
    return t, routed_to


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_a_pools_segments_hold_only_the_requests_routed_to_it(ops):
    t, routed_to = _build(ops)
    r = Replay(t.w.finish(), "torch", log_events=True)
    segments: dict[int, tuple[int, int]] = {}          # base -> (size, pool whose request made it)
    seen = 0
    while not r.at_end:
        r.step(1)
        for (kind, size, at), (addr, _) in zip(r.segment_log[seen:], r.policy.segment_where[seen:]):
            if kind == ev.SEGMENT_ALLOC:
                segments[addr] = (size, routed_to[int(r.trace.id[at])])
            else:
                assert segments.pop(addr)[0] == size
        seen = len(r.segment_log)
        for i, (addr, size) in r.live_blocks().items():
            base = max(b for b in segments if b <= addr)
            seg_size, pool = segments[base]
            assert addr + size <= base + seg_size
            assert pool == routed_to[i], f"block {i} (routed to pool {routed_to[i]}) lies in pool {pool}'s segment"
    r.close()


def test_the_snapshot_export_names_each_segments_pool_and_the_importer_routes_it_back(tmp_path):
    """A replay exported as a PyTorch snapshot gives a pool's segments that pool's ``MempoolId_t`` (from the
    trace's pool events) and the default ones (0, 0); importing that snapshot routes the requests back."""
    import pickle
    from allocsim.formats.exporters.torch_snapshot import replay_snapshot
    t = T()
    d = t.alloc(4 * MiB)
    t.w.record(ev.POOL_BEGIN, aux=1, stream=S0, flags=ev.POOL_CAPTURE, addr=ev.pool_id_bits((7, 0)))
    p = t.alloc(4 * MiB)
    t.w.record(ev.POOL_END, aux=1, addr=ev.pool_id_bits((7, 0)))
    _, snap = replay_snapshot(t.w.finish(), "torch")
    by_addr = {s["address"]: tuple(s["segment_pool_id"]) for s in snap["segments"]}
    assert sorted(by_addr.values()) == [(0, 0), (7, 0)]
    src, out = str(tmp_path / "s.pickle"), str(tmp_path / "s.bin")
    with open(src, "wb") as f:
        pickle.dump(snap, f)
    import_file(src, out)
    back = Trace.load(out)
    assert [ev.KIND_NAMES[int(k)] for k in back.kind if k != ev.FREE_REQUESTED] == [
        "SEGMENT_ALLOC", "ALLOC", "POOL_BEGIN", "SEGMENT_ALLOC", "ALLOC", "POOL_END"]
    assert d == 0 and p == 1


def test_with_expandable_segments_a_pool_maps_its_own_range_and_unmaps_it_once_freeable():
    t = T()
    t.alloc(4 * MiB)                      # the default pool's range: one 20 MiB page mapped
    t.begin(1)
    y = t.alloc(4 * MiB)                  # the pool's own range: another page, not the default one's free room
    t.end(1)
    t.free(y)
    kept = t.empty_cache()                # pool 1 has a user: its page stays; the default page holds a live block
    t.release(1)
    gone = t.empty_cache()
    r, _ = t.replay(options={"expandable_segments": True})
    assert calls(r) == [("SEGMENT_MAP", SEG, 0), ("SEGMENT_MAP", SEG, 2), ("SEGMENT_UNMAP", SEG, gone)]
    assert kept != gone and r.policy._private == {}
    (a, _), = r.policy.segment_where[:1]
    (b, _), = r.policy.segment_where[1:2]
    assert abs(a - b) >= 80 << 30         # separate virtual ranges (1.125 x device memory each)


# ---- real snapshots (traces/raw/pools, recorded on an H200 with PyTorch 2.11) ------------------------
RAW = os.path.join(ROOT, "traces", "raw", "pools")


@pytest.mark.skipif(not os.path.isdir(RAW), reason="no raw pool snapshots")
@pytest.mark.parametrize("name", ["capture-mid", "mempool-mid", "compile"])
def test_a_real_snapshot_whose_pools_are_still_there_imports_to_a_match_that_needs_them(tmp_path, name):
    """examples/private_pools.py's graphs sharing a pool, MemPool and torch.compile reduce-overhead, each
    snapshot taken while its pools still held segments: imported, the pools inferred from the final segments are
    followed to the real allocator's segment calls; without the pool events the same requests do not match."""
    out = str(tmp_path / f"{name}.bin")
    import_file(os.path.join(RAW, f"{name}.pickle"), out)
    v = validate(out)
    text = validation_summary(v)
    assert v.match and v.pool_events and "not modelled" not in text, text
    t = Trace.load(out)
    rec = np.asarray(t.records)
    bare = Trace(rec[~np.isin(rec["kind"], ev.POOL)].copy(), t.meta, streams=t.streams, sites=t.sites,
                 labels=t.labels, path=t.path)
    assert not validate(bare).match
