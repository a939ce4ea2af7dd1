"""The `cupy` policy: CuPy SingleDeviceMemoryPool rules on hand-made cases, its OOM
escalation, and invariants plus an independent naive model on random traces."""
from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import random_trace

from allocsim.engine.replay import replay
from allocsim.engine.replay import Replay
from allocsim.machine.context import PolicyContext
from allocsim.machine.device import SimulatedDevice
from allocsim.errors import UsageError
from allocsim.policies.cupy import CuPyPool
from allocsim.machine.runtime import EagerRuntime
from allocsim.machine.sections import Sections
from allocsim.trace import ALLOC, TraceWriter
from allocsim.trace.events import SEGMENT_ALLOC, SEGMENT_FREE


def make_pool(capacity=None, cap=None, **options):
    dev = SimulatedDevice(capacity=capacity, cap=cap)
    sec = Sections()
    rt = EagerRuntime(dev, sec)
    pol = CuPyPool(PolicyContext(dev, rt, sec), CuPyPool.parse_options([f"{k}={v}" for k, v in options.items()]))
    rt.attach(pol, {})
    return pol, dev, sec, rt


def section_names(sec):
    """Section names in the order they were first entered (escalation order)."""
    return [k[-1] for k in sec.stats]


def test_rounding_to_512():
    pol, dev, *_ = make_pool()
    a = pol.malloc(1, 0)
    b = pol.malloc(513, 0)
    assert pol.block(a)[1] == 512 and pol.block(b)[1] == 1024
    assert pol.allocated == 1536
    assert dev.bytes_malloc == 1536 and dev.n_malloc == 2      # each miss asks for the rounded size only
    assert pol.counters()["used_bytes"] == 1536


def test_split_remainder_is_reused_without_new_device_allocation():
    pol, dev, *_ = make_pool()
    x = pol.malloc(4096, 0)
    base = x.ptr
    pol.free(x)
    a = pol.malloc(1000, 0)                  # 1024 from the front of the 4096 chunk
    assert pol.block(a) == (base, 1024)
    c = pol.malloc(3072, 0)                  # exactly the remainder
    assert pol.block(c) == (base + 1024, 3072)
    assert dev.n_malloc == 1
    assert pol.n_free_blocks() == 0


def test_best_fit_takes_the_smallest_chunk_that_fits():
    pol, dev, *_ = make_pool()
    chunks = [pol.malloc(n, 0) for n in (4096, 2048, 3072)]
    ptrs = {c.size: c.ptr for c in chunks}
    for c in chunks:
        pol.free(c)
    got = pol.malloc(2000, 0)
    assert pol.block(got) == (ptrs[2048], 2048)
    got = pol.malloc(2100, 0)                # 2560 rounded: 3072 is the smallest that fits, split
    assert pol.block(got) == (ptrs[3072], 2560)
    assert dev.n_malloc == 3


def test_merge_only_within_one_device_allocation():
    pol, dev, *_ = make_pool()
    # two device allocations that happen to be adjacent in the address space
    p = pol.malloc(1024, 0)
    q = pol.malloc(1024, 0)
    assert p.ptr + 1024 == q.ptr
    pol.free(p)
    pol.free(q)
    assert pol.n_free_blocks() == 2          # neighbours in memory, but never merged
    r = pol.malloc(2048, 0)
    assert dev.n_malloc == 3 and r.ptr not in (p.ptr, q.ptr)
    # pieces of one device allocation do merge back
    pol, dev, *_ = make_pool()
    x = pol.malloc(4096, 0)
    base = x.ptr
    pol.free(x)
    a, b, c = pol.malloc(1024, 0), pol.malloc(1024, 0), pol.malloc(2048, 0)
    assert [a.ptr, b.ptr, c.ptr] == [base, base + 1024, base + 2048]
    n = dev.n_malloc
    pol.free(a)
    pol.free(c)
    assert pol.n_free_blocks() == 2          # b keeps a and c apart
    pol.free(b)                              # merges with next (c) then prev (a)
    assert pol.n_free_blocks() == 1
    y = pol.malloc(4096, 0)
    assert pol.block(y) == (base, 4096) and dev.n_malloc == n


def test_per_stream_arenas_never_share():
    pol, dev, *_ = make_pool()
    a = pol.malloc(1024, 0)
    pol.free(a)
    b = pol.malloc(1024, 1)                  # stream 1 cannot take stream 0's free chunk
    assert dev.n_malloc == 2 and b.ptr != a.ptr
    c = pol.malloc(1024, 0)
    assert c.ptr == a.ptr and dev.n_malloc == 2
    pol.free(b)
    pol.free(c)
    assert pol.largest_free() == 1024


def test_free_all_blocks_releases_only_whole_chunks():
    pol, dev, *_ = make_pool()
    w = pol.malloc(8192, 0)
    x = pol.malloc(4096, 0)
    pol.free(w)
    pol.free(x)
    a = pol.malloc(1024, 0)                  # best fit: splits x (4096), not w
    assert a.ptr == x.ptr
    assert pol.free_all_blocks() == 8192     # w is whole; x's free remainder has a prev
    assert pol.total == 4096 == dev.reserved
    assert pol.segment_log[-1] == (SEGMENT_FREE, 8192, -1)
    pol.free(a)                              # merges back into one whole 4096 chunk
    assert pol.free_all_blocks() == 4096
    assert pol.total == 0 == dev.reserved and pol.n_free_blocks() == 0
    assert pol.counters()["cache_flushes"] == 2


def test_limit_path_flushes_then_collects_then_fails():
    pol, dev, sec, rt = make_pool(limit="4KiB")
    a = pol.malloc(2048, 0)
    pol.free(a)                              # cached 2048 counts against the limit
    b = pol.malloc(3072, 0)                  # 2048 + 3072 > 4096: flush, then it fits
    assert b is not None and pol.cache_flushes == 1 and rt.gc_full == 0
    assert section_names(sec) == ["2.1 free_all_blocks (limit)"]
    assert pol.malloc(2048, 0) is None       # 3072 live: flush, gc, flush, OOM
    assert section_names(sec) == ["2.1 free_all_blocks (limit)", "2.2 gc.collect (limit)",
                                  "2.3 free_all_blocks (limit)"]
    assert pol.cache_flushes == 3 and rt.gc_full == 1
    assert pol.limit_ooms == 1 and pol.device_ooms == 0
    assert dev.n_failed == 0                 # the limit path never asks the device


def test_engine_cap_is_the_pool_limit():
    pol, dev, sec, rt = make_pool(cap=4096, limit="1MiB")
    assert pol.counters()["limit"] == 4096
    pol.malloc(3072, 0)
    assert pol.malloc(2048, 0) is None
    assert section_names(sec)[0].startswith("2.1") and dev.n_failed == 0


@pytest.mark.parametrize("version,gcs", [("14", 2), ("13", 1)])
def test_device_failure_path(version, gcs):
    pol, dev, sec, rt = make_pool(capacity=4096, version=version)
    pol.malloc(3072, 0)
    assert pol.malloc(2048, 0) is None
    assert section_names(sec) == ["3.1 free_all_blocks", "3.2 cudaMalloc",
                                  "3.3 gc.collect", "3.4 free_all_blocks", "3.5 cudaMalloc"]
    assert rt.gc_full == gcs and pol.cache_flushes == 2 and pol.device_ooms == 1
    assert dev.n_failed == 3                 # first attempt and two retries
    assert pol.total == 3072                 # the failed request is not left counted


def test_device_failure_flush_then_retry_succeeds():
    pol, dev, sec, rt = make_pool(capacity=4096)
    a = pol.malloc(2048, 0)
    pol.free(a)
    b = pol.malloc(3072, 0)                  # device full with the cached 2048: flush, retry works
    assert b is not None and rt.gc_full == 0
    assert section_names(sec) == ["3.1 free_all_blocks", "3.2 cudaMalloc"]
    assert [k for k, *_ in pol.segment_log] == [SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_ALLOC]


def test_gc_runtime_collect_rescues_the_request():
    """Under the gc runtime a dead object returns to the pool only in gc.collect."""
    w = TraceWriter()
    a = w.alloc(3072)
    w.free(a)                                # dead, not yet collected
    w.alloc(2048)
    t = w.finish()
    r = replay(t, "cupy", runtime="gc", options={"limit": 4096})
    assert r.ooms == 0 and r.gc_full == 1 and r.cache_flushes == 2
    names = [row["name"] for row in r.sections if row["depth"] == 1]
    assert names.index("2.1 free_all_blocks (limit)") < names.index("2.2 gc.collect (limit)") \
        < names.index("2.3 free_all_blocks (limit)")
    r = replay(t, "cupy", runtime="eager", options={"limit": 4096})   # the 3072 chunk is split
    assert r.ooms == 0 and r.gc_full == 0 and r.cache_flushes == 0 and r.device_mallocs == 1


def test_v13_and_v14_break_ties_differently():
    ptrs = {}
    for version in ("14", "13"):
        pol, dev, *_ = make_pool(version=version)
        x = pol.malloc(1024, 0)              # lower address
        y = pol.malloc(1024, 0)
        assert x.ptr < y.ptr
        pol.free(x)
        pol.free(y)                          # y freed last
        ptrs[version] = (pol.malloc(1024, 0).ptr, x.ptr, y.ptr)
    assert ptrs["14"][0] == ptrs["14"][1]    # lowest address
    assert ptrs["13"][0] == ptrs["13"][2]    # most recently freed


def test_options_and_counters():
    with pytest.raises(UsageError):
        CuPyPool.parse_options(["version=12"])
    with pytest.raises(UsageError):
        CuPyPool.parse_options(["limit=lots"])
    pol, *_ = make_pool(track_total="true")
    a = pol.malloc(100, 0)
    pol.free(a)
    pol.malloc(100, 0)
    assert list(pol.total_log) == [512, 512, 512]
    c = pol.counters()
    assert c["total_bytes"] == 512 and c["used_bytes"] == 512 and c["free_bytes"] == 0


def test_segment_log_has_event_indices_from_the_engine():
    w = TraceWriter()
    w.mark("start")
    a = w.alloc(1000)
    w.free(a)
    w.alloc(5000)
    t = w.finish()
    r = Replay(t, "cupy", log_events=True)
    r.run()
    assert r.segment_log == [(SEGMENT_ALLOC, 1024, 1), (SEGMENT_ALLOC, 5120, 3)]


# ---- invariants and an independent model on random traces ------------------------------

class NaivePool:
    """CuPy's rules written the slow, obvious way: a flat list of chunks, linear scans."""

    def __init__(self, lowest_address: bool):
        self.lowest = lowest_address
        self.chunks = []      # dicts: ptr, size, seg, stream, free, stamp
        self.next_addr = 0
        self.seg = 0
        self.stamp = 0
        self.n_malloc = 0

    def malloc(self, size, stream):
        n = -(-size // 512) * 512
        free = [c for c in self.chunks if c["free"] and c["stream"] == stream and c["size"] >= n]
        if not free:
            self.n_malloc += 1
            self.seg += 1
            c = {"ptr": self.next_addr, "size": n, "seg": self.seg, "stream": stream, "free": False, "stamp": 0}
            self.next_addr += n
            self.chunks.append(c)
            return c
        key = (lambda c: (c["size"], c["ptr"])) if self.lowest else (lambda c: (c["size"], -c["stamp"]))
        c = min(free, key=key)
        c["free"] = False
        if c["size"] > n:
            rest = dict(c, ptr=c["ptr"] + n, size=c["size"] - n, free=True, stamp=self._stamp())
            c["size"] = n
            self.chunks.append(rest)
        return c

    def _stamp(self):
        self.stamp += 1
        return self.stamp

    def free(self, c):
        c["free"] = True
        for nb in [x for x in self.chunks if x["free"] and x["seg"] == c["seg"] and x is not c]:
            if nb["ptr"] == c["ptr"] + c["size"]:            # next
                c["size"] += nb["size"]
                self.chunks.remove(nb)
        for nb in [x for x in self.chunks if x["free"] and x["seg"] == c["seg"] and x is not c]:
            if nb["ptr"] + nb["size"] == c["ptr"]:           # prev
                nb["size"] += c["size"]
                self.chunks.remove(c)
                c = nb
        c["stamp"] = self._stamp()


def check_layout(pol, dev):
    """Chunks tile each device allocation exactly; no two free neighbours; totals agree."""
    heads = set()
    for arena in pol._arenas.values():
        for c in arena.chunks:
            assert c.is_free
            while c.prev is not None:
                c = c.prev
            heads.add(c)
    seen_total = 0
    for h in heads:
        c, seg = h, 0
        while c is not None:
            seg += c.size
            if c.next is not None:
                assert c.ptr + c.size == c.next.ptr and c.next.prev is c
                assert not (c.is_free and c.next.is_free)
            c = c.next
        seen_total += seg
    assert pol.total == dev.reserved
    assert seen_total <= pol.total


# few distinct sizes, so that equal-size free chunks (the tie-break) are common
sizes = st.one_of(st.sampled_from([1000, 1024, 2048, 4096]), st.integers(1, 20_000))
TIE = [(True, 1024, 0, 0), (True, 1024, 0, 0), (False, 0, 0, 0), (False, 0, 0, 0), (True, 1024, 0, 0)]
ops = st.lists(st.tuples(st.booleans(), sizes, st.integers(0, 1), st.integers(0, 10**6)), min_size=1, max_size=120)


@settings(max_examples=80, deadline=None)
@given(ops, st.sampled_from(["14", "13"]))
@example(TIE, "14")
@example(TIE, "13")
def test_random_ops_match_naive_model_and_keep_invariants(seq, version):
    pol, dev, *_ = make_pool(version=version)
    ref = NaivePool(lowest_address=version == "14")
    seg_of_base = {}                          # device address of a segment -> creation order (1, 2, ...)
    live = []
    for is_alloc, size, stream, pick in seq:
        if is_alloc or not live:
            c = pol.malloc(size, stream)
            r = ref.malloc(size, stream)
            live.append((c, r))
            base = head(c).ptr
            seg_of_base.setdefault(base, len(seg_of_base) + 1)
            ref_base = min(x["ptr"] for x in ref.chunks if x["seg"] == r["seg"])
            # the same chunk: same device allocation, same offset in it, same size
            assert (seg_of_base[base], c.ptr - base, c.size) == (r["seg"], r["ptr"] - ref_base, r["size"])
            assert dev.n_malloc == ref.n_malloc
        else:
            c, r = live.pop(pick % len(live))
            pol.free(c)
            ref.free(r)
        check_layout(pol, dev)
        assert pol.allocated == sum(c.size for c, _ in live)
    spans = sorted(pol.block(c) for c, _ in live)
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n <= b                    # live blocks never overlap


def head(c):
    while c.prev is not None:
        c = c.prev
    return c


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10**6))
def test_replay_random_trace_no_overlap(seed):
    t = random_trace(400, seed=seed, streams=2)
    live = {}

    def observer(ev_index, kind, id_, handle):
        if kind == ALLOC:
            a, n = live[id_] = pol_box[0].block(handle)
            for i, (b, m) in live.items():       # the new block overlaps no live one
                assert i == id_ or a + n <= b or b + m <= a
        else:
            del live[id_]

    pol_box = []
    r = Replay(t, "cupy", observer=observer)
    pol_box.append(r.policy)
    res = r.run()
    assert res.peak_reserved_bytes >= res.peak_allocated_bytes >= res.load_bytes



def spread_trace():
    """1 MiB objects on two streams, one per device allocation, between live 3 GiB ones (the address span
    passes the keys' first 4 GiB), all freed, two 48 GiB ones, then 1 MiB asked for again (ties between
    equal sizes: the lowest address) and split (the remainders filed among them)."""
    w = TraceWriter()
    small, big = [], []
    for k in range(6):
        small.append(w.alloc(1 << 20, stream=k % 2))
        big.append(w.alloc(3 << 30, stream=k % 2))
    for i in small[::-1]:
        w.free(i)
    big += [w.alloc(48 << 30, stream=s) for s in (0, 1)]         # beyond the field, with free chunks filed
    again = [w.alloc(n, stream=s) for n in (1 << 20, 1000, 1 << 20, 4096, 1 << 19) for s in (0, 1)]
    for i in again[::3] + big:
        w.free(i)
    again += [w.alloc(1 << 20, stream=s) for s in (0, 1, 1)]
    return w.finish()


@pytest.mark.parametrize("version", ["14", "13"])
@pytest.mark.parametrize("downward", [False, True], ids=["upward", "downward"])
def test_keys_follow_the_address_span_and_stay_within_a_word(version, downward, monkeypatch):
    """A device allocation outside the keys' address field re-keys the free chunks (a wider field, or a lower
    base when the device places below every earlier allocation); the pool serves as its reference model
    does, every key orders and finds its chunk, and v14's keys stay within 63 bits."""
    from test_reference_models import assert_same
    def obtain(dev, n, obtain=SimulatedDevice._obtain):
        """Each range above the last (or below it), 256-byte aligned, at the device's own cost."""
        cost = obtain(dev, n)[1]
        step = (n + 255) // 256 * 256
        dev.test_next = getattr(dev, "test_next", 1 << 44) + (-step if downward else step)
        return dev.test_next - (0 if downward else step), cost
    monkeypatch.setattr(SimulatedDevice, "_obtain", obtain)
    fields, widest = [], []

    def keys_checked(self, addr, n, cover=CuPyPool._cover):
        cover(self, addr, n)
        fields.append((self._ix.lo, self._ix.abits))
        for a in self._arenas.values():
            assert list(a.keys) == sorted(a.keys) == [c.key for c in a.chunks]
            assert all(c.key >> self._ix.shift << 9 == c.size and (c.key & (1 << self._ix.abits) - 1) + self._ix.lo == c.ptr
                       for c in a.chunks)
            widest.extend(k.bit_length() for k in a.keys)
    monkeypatch.setattr(CuPyPool, "_cover", keys_checked)
    assert_same(spread_trace(), "cupy-ref", [f"version={version}"], capacity=None)
    assert len(fields) == 14 and fields[-1][1] > fields[0][1]            # the field widened
    assert (fields[-1][0] < fields[0][0]) == downward                   # the base moved down with the device
    assert widest and (max(widest) <= 63) == (version == "14")


@pytest.mark.parametrize("version", ["14", "13"])
def test_keys_past_one_machine_word_replay_alike(version):
    """Device allocations 64 TiB apart: the larger free chunks' v14 keys pass 2**63, so an arena whose keys were
    C words (the compiled build, `_Arena.words`) keeps them as Python ints from then on; the fused loop is the
    plain walk, and both the reference model, chunk for chunk (v13's keys are Python ints throughout)."""
    from allocsim.formats import synth
    from allocsim.compiled import compiled_modules
    from test_fast_path import assert_fused_is_plain
    from test_reference_models import assert_same
    import test_torch_policy
    trace = synth.generate("alloc-heavy", seed=3, n_allocs=3000)
    words = []                                  # per device allocation: whether the arenas' keys were words

    def cover(self, addr, n, cover=CuPyPool._cover):
        words.extend(a.words for a in self._arenas.values())
        cover(self, addr, n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(test_torch_policy, "SPREAD", 1 << 46)
        test_torch_policy.spread_out(mp)
        mp.setattr(CuPyPool, "_cover", cover)
        r = Replay(trace, "cupy", options={"version": version})
        r.run()
        keys = [k for a in r.policy._arenas.values() for k in a.keys]
        assert max(keys).bit_length() > 63 and not any(a.words for a in r.policy._arenas.values())
        assert (True in words) == (CuPyPool.__module__ in compiled_modules() and version == "14")
        assert_fused_is_plain(trace, "cupy", [f"version={version}"])
        assert_same(trace, "cupy-ref", [f"version={version}"])
