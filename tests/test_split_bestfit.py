"""The `split` pool (CuArrays SplittingPool) and the `bestfit` baseline.

Rules come from `docs/models/cuarrays.md` (split) and `docs/models/bestfit-oracle.md` (bestfit);
the randomized tests compare both policies with deliberately naive
reference models (linear scans over plain lists) written here from the rules.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.engine.replay import Replay
from allocsim.errors import UsageError
from allocsim.policies.split import HUGE, LARGE, SMALL, WORD_END, round_request, size_class
from allocsim.policies._freelists import END, SizeBuckets
from allocsim.trace import TraceWriter

KiB, MiB = 1 << 10, 1 << 20


class _Handles(dict):
    """The engine's id -> handle table; an id not live reads as None."""

    def __missing__(self, key):
        return None


class Driver:
    """A tiny engine: drives one policy by hand and logs its sections in call order."""

    def __init__(self, policy, *, runtime="eager", cap=None, options=None):
        w = TraceWriter()
        w.alloc(1)
        r = Replay(w.finish(), policy, runtime=runtime, cap=cap, capacity=None, options=options)
        self.pol, self.rt, self.dev, self.sec = r.policy, r.runtime, r.device, r.sections
        self.handles = _Handles()
        self.rt.attach(self.pol, self.handles)
        self.log = []               # section names as they open (push) or are counted (add)
        sec, push, add, pop = self.sec, self.sec.push, self.sec.add, self.sec.pop
        sec.push = lambda name, clock: (self.log.append(name), push(name, clock))[1]
        sec.add = lambda name, *a, **k: (self.log.append(name), add(name, *a, **k))[1]

        def pop_quietly(clock):     # Sections.pop records through add: not a new entry
            sec.add = add
            try:
                pop(clock)
            finally:
                sec.add = lambda name, *a, **k: (self.log.append(name), add(name, *a, **k))[1]
        sec.pop = pop_quietly
        self.next_id = 0

    def alloc(self, size):
        i = self.next_id
        self.next_id += 1
        h = self.pol.malloc(size, 0)
        self.handles[i] = h
        if h is not None and not self.rt.eager:
            self.rt.on_alloc(i, size)
        return i

    def free(self, i):
        if self.rt.eager:
            self.pol.free(self.handles[i])
            self.handles[i] = None
        else:
            self.rt.on_free(i)

    def block(self, i):
        return self.pol.block(self.handles[i])


# ---- split: rounding and classes ------------------------------------------------------------------

@pytest.mark.parametrize("req, n, cls", [
    (1, 512, SMALL), (512, 512, SMALL), (513, 1024, SMALL), (MiB - 1, MiB, SMALL), (MiB, MiB, SMALL),
    (MiB + 1, MiB + 128 * KiB, LARGE), (32 * MiB, 32 * MiB, LARGE), (32 * MiB - 1, 32 * MiB, LARGE),
    (32 * MiB + 1, 33 * MiB, HUGE), (100 * MiB + 5, 101 * MiB, HUGE),
])
def test_rounding_and_class(req, n, cls):
    assert round_request(req) == (n, cls)
    d = Driver("split")
    i = d.alloc(req)
    assert d.block(i)[1] == n
    assert d.dev.bytes_malloc == n          # the device is asked for exactly the rounded size


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 80 * MiB))
def test_hot_path_rounding_matches_round_request(req):
    d = Driver("split")
    i = d.alloc(req)
    n, cls = round_request(req)
    assert d.block(i)[1] == n and size_class(n) == cls
    assert d.pol.allocated == n


# ---- split: the split rule -----------------------------------------------------------------------

def test_large_remainder_up_to_1mib_is_not_split():
    d = Driver("split")
    d.free(d.alloc(8 * MiB))
    i = d.alloc(7 * MiB + 512 * KiB)        # remainder 512 KiB would be SMALL: no split, the slack is kept
    assert d.block(i)[1] == 8 * MiB
    assert d.pol.allocated == 8 * MiB
    assert d.pol.free_blocks() == []
    assert d.dev.n_malloc == 1


def test_large_remainder_over_1mib_is_split():
    d = Driver("split")
    d.free(d.alloc(8 * MiB))
    i = d.alloc(6 * MiB)
    addr, size = d.block(i)
    assert size == 6 * MiB
    (cls, rsize, rid), = d.pol.free_blocks()
    assert (cls, rsize) == (LARGE, 2 * MiB)
    assert rid > d.handles[i]               # the remainder is a new (younger) block
    assert d.pol.block(rid) == (addr + 6 * MiB, 2 * MiB)


def test_small_blocks_always_split():
    d = Driver("split")
    d.free(d.alloc(MiB))
    i = d.alloc(1)
    assert d.block(i)[1] == 512
    assert [(c, s) for c, s, _ in d.pol.free_blocks()] == [(SMALL, MiB - 512)]


# ---- split: the dead HUGE check ------------------------------------------------------------------

def test_huge_dead_check_takes_larger_block_whole():
    d = Driver("split")
    d.free(d.alloc(64 * MiB))
    i = d.alloc(40 * MiB)
    assert d.block(i)[1] == 64 * MiB        # not split, not exact: the merged code's dead check
    assert d.dev.n_malloc == 1 and d.pol.allocated == 64 * MiB


def test_huge_exact_option_allocates_exact_size():
    d = Driver("split", options={"huge_exact": True})
    d.free(d.alloc(64 * MiB))
    i = d.alloc(40 * MiB)
    assert d.block(i)[1] == 40 * MiB and d.dev.n_malloc == 2
    j = d.alloc(64 * MiB)                   # the exact size is still reused
    assert d.dev.n_malloc == 2 and d.block(j)[1] == 64 * MiB


@pytest.mark.parametrize("huge_exact", [False, True])
def test_free_list_entries_stay_in_63_bits_and_a_larger_block_keeps_its_order(huge_exact):
    """Entries of blocks below 1 TiB fit 63 bits, in a free list that ends below 2**63 (a C array compiled); a
    2 TiB block's larger entry goes to a free list of its own, after them: it is still found in its place
    (taken whole by a smaller HUGE request, or by its exact size under huge_exact)."""
    d = Driver("split", options={"huge_exact": huge_exact})
    ids = [d.alloc(n) for n in (700, 3 * MiB + 5, 40 * MiB, 512 << 30, 2 << 40)]
    for i in ids:
        d.free(i)
    d.alloc(100)                            # repopulates them all, takes a piece of the 700 B block
    entries, outsize = list(d.pol._avail.entries), d.pol._outsize.entries
    assert entries == sorted(entries) and entries[-1] == WORD_END and len(entries) == 5
    assert all(e < WORD_END for e in entries[:-1]) and outsize[-1] == END and len(outsize) == 2
    assert entries[-2] < 1 << 63 < outsize[0] < END
    i = d.alloc((2 << 40) if huge_exact else (1 << 40) + 1)
    assert d.block(i)[1] == 2 << 40 and d.dev.n_malloc == 5


def test_a_search_within_63_bits_goes_on_to_the_larger_blocks():
    """A request whose entry fits 63 bits (600 GiB) finds no block below 1 TiB that fits; the blocks of 1 TiB or
    more (a 2 TiB and a 3 TiB block, whose entries are past 63 bits, in their own free list) are searched next,
    and the 2 TiB block is the best fit."""
    d = Driver("split")
    ids = [d.alloc(n) for n in (700, 40 * MiB, 512 << 30, 2 << 40, 3 << 40)]
    for i in ids:
        d.free(i)
    d.alloc(100)                            # repopulates them all
    assert sum(e >= 1 << 63 for e in d.pol._outsize.entries) == 3     # the 2 TiB and 3 TiB blocks, and END
    i = d.alloc(600 << 30)
    assert d.block(i)[1] == 2 << 40 and d.dev.n_malloc == 5
    i = d.alloc(100 << 30)                  # below every HUGE block: the 512 GiB one, whole
    assert d.block(i)[1] == 512 << 30 and d.dev.n_malloc == 5


# ---- split: ties go to the oldest block ---------------------------------------------------------------

@pytest.mark.parametrize("free_order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_best_fit_tie_goes_to_lowest_id(free_order):
    d = Driver("split")
    ids = [d.alloc(4 * KiB) for _ in range(3)]          # three separate 4 KiB buffers
    addrs = [d.block(i)[0] for i in ids]
    for k in free_order:
        d.free(ids[k])
    got = [d.block(d.alloc(4 * KiB))[0] for _ in range(3)]
    assert got == addrs                                 # oldest first, whatever the free order
    assert d.dev.n_malloc == 3


def test_best_fit_prefers_smallest_fitting_size():
    d = Driver("split")
    big, small = d.alloc(64 * KiB), d.alloc(8 * KiB)
    big_addr, small_addr = d.block(big)[0], d.block(small)[0]
    d.free(big)
    d.free(small)
    assert d.block(d.alloc(6 * KiB))[0] == small_addr     # 8 KiB is the best fit, split (2 KiB left)
    assert d.block(d.alloc(8 * KiB))[0] == big_addr       # 2 KiB is too small now: the 64 KiB buffer
    assert d.dev.n_malloc == 2


def test_merged_head_leaves_no_stale_fit():
    """A head that grew by compaction is no longer a block of its old size (lazy deletion)."""
    d = Driver("split")
    q = d.alloc(4 * KiB)                    # its own buffer
    d.free(d.alloc(MiB))
    p0, p1 = d.alloc(512), d.alloc(512)     # pieces of the 1 MiB buffer
    q_addr = d.block(q)[0]
    d.free(q)
    d.free(p0)
    d.alloc(2 * MiB)                        # repopulate q (4 KiB) and p0 (512 B)
    d.free(p1)                              # next alloc: p1 merges p0 and the rest back into 1 MiB
    assert d.block(d.alloc(512))[0] == q_addr   # the best fit is q, not p0's old 512 B entry


# ---- split: free is deferred; compaction --------------------------------------------------------------

def test_free_only_marks_until_next_alloc():
    d = Driver("split")
    i = d.alloc(4 * KiB)
    d.free(i)
    assert d.pol.free_blocks() == [] and d.pol.counters()["pending_freed"] == 1
    d.alloc(2 * MiB)                        # another class: the 4 KiB block is only repopulated
    assert [(c, s) for c, s, _ in d.pol.free_blocks()] == [(SMALL, 4 * KiB)]
    assert "1.1a repopulate" not in d.log   # phase-1 hot sections are reported once, at finish()
    d.pol.finish()
    assert d.sec.stats[("pooled alloc", "1.1a repopulate")][0] == 1


def test_compaction_merges_a_run_into_its_head():
    d = Driver("split")
    d.free(d.alloc(MiB))
    p = [d.alloc(512) for _ in range(3)]                # three pieces of the 1 MiB buffer + remainder
    base = d.block(p[0])[0]
    assert [d.block(i)[0] for i in p] == [base, base + 512, base + 1024]
    head0 = d.handles[p[0]]
    d.free(p[0])
    d.free(p[2])
    d.alloc(2 * MiB)                                    # repopulate: p2 merges with the remainder
    free = sorted((d.pol.block(b), b) for _, _, b in d.pol.free_blocks())
    assert [blk for blk, _ in free] == [(base, 512), (base + 1024, MiB - 1024)]
    assert d.pol.counters()["compacted_blocks"] == 1
    d.free(p[1])
    d.alloc(2 * MiB)
    (cls, size, head), = d.pol.free_blocks()
    assert (cls, size) == (SMALL, MiB) and head == head0   # merged into the head: p0's block
    assert d.pol.block(head) == (base, MiB)
    assert d.pol.counters()["compacted_blocks"] == 3


def test_whole_block_after_compaction_can_be_reclaimed():
    d = Driver("split", cap=3 * MiB)
    d.free(d.alloc(MiB))
    a, b = d.alloc(512 * KiB), d.alloc(512 * KiB)
    d.free(a)
    d.free(b)
    i = d.alloc(3 * MiB)                    # needs the 1 MiB buffer back: re-merged, whole, reclaimed
    assert i is not None and d.block(i)[1] == 3 * MiB
    assert d.dev.n_free == 1 and d.pol.counters()["reclaimed_blocks"] == 1


# ---- split: escalation order under a cap --------------------------------------------------------------

def test_reclaim_before_gc_under_cap():
    d = Driver("split", runtime="gc", cap=10 * MiB)
    a, b = d.alloc(4 * MiB), d.alloc(4 * MiB)
    d.free(a)
    d.free(b)                               # dead, but the pool sees them only after a collection
    d.log.clear()
    i = d.alloc(8 * MiB)
    assert d.handles[i] is not None
    assert d.log == ["1.3 alloc",
                     "1.4a reclaim", "1.4b alloc", "1.4a reclaim", "1.4b alloc", "1.4a reclaim", "1.4b alloc",
                     "1.5a reclaim", "1.5b alloc",
                     "2.0 gc(false)", "pooled free", "2.1a repopulate", "2.1b compact", "2.2 scan",
                     "2.3 alloc",
                     "2.4a reclaim", "2.4b alloc", "2.4a reclaim", "2.4b alloc"]   # HUGE: nothing; LARGE: both
    assert d.pol.counters()["cache_flushes"] == 1
    assert d.rt.gc_incremental == 1 and d.rt.gc_full == 0
    assert d.dev.n_free == 2 and d.dev.reserved == 8 * MiB


def test_partial_reclaim_stops_at_target_smallest_first():
    d = Driver("split", cap=12 * MiB)
    ids = [d.alloc(s) for s in (2 * MiB, 3 * MiB, 4 * MiB)]
    for i in ids:
        d.free(i)
    d.alloc(5 * MiB)                        # 9 + 5 > 12: the LARGE reclaim frees 2 MiB, then 3 MiB (5 >= 5): stop
    assert d.dev.n_free == 2 and d.dev.bytes_free == 5 * MiB
    assert [s for _, s, _ in d.pol.free_blocks()] == [4 * MiB]


def test_oom_after_three_phases():
    d = Driver("split", cap=4 * MiB)
    d.alloc(3 * MiB)
    i = d.alloc(2 * MiB)
    assert d.handles[i] is None
    assert d.log.count("3.5b alloc") == 1 and "3.0 gc(true)" in d.log
    assert d.pol.counters()["cache_flushes"] == 3


# ---- bestfit ------------------------------------------------------------------------------------

@pytest.mark.parametrize("unit_shift", [0, 9])
def test_size_buckets_best_fit_limit_void_entries_and_end(unit_shift):
    """`SizeBuckets`: the smallest size >= n within the limit, ties to the lowest key; an entry the owner's map
    no longer holds is void (skipped, dropped); `END` closes the list through every operation."""
    free = {}                               # the owner's map: key -> size while free
    buckets = SizeBuckets(lambda e: free.get(buckets.key_of(e)) == buckets.size_of(e), 32, unit_shift)

    def push(key, size):
        free[key] = size
        buckets.push(key, size)
    for key, size in ((7, 4 * KiB), (3, 4 * KiB), (5, 8 * KiB), (2, 64 * KiB), (9, MiB)):
        push(key, size)
    del free[3]                             # 3 leaves the free lists by its map alone: a void entry
    assert buckets.members() == [(4 * KiB, 7), (8 * KiB, 5), (64 * KiB, 2), (MiB, 9)]
    assert buckets.entries[-1] == END and buckets.largest() == MiB
    push(1, 8 * KiB)                        # a tie of 5's size, lower key
    assert buckets.pop_fit(5 * KiB, limit=16 * KiB) == 1
    del free[1]
    assert buckets.pop_fit(65 * KiB, limit=512 * KiB) == 0      # 1 MiB is beyond the limit
    assert buckets.pop_fit(65 * KiB) == 9
    del free[9]
    assert buckets.largest() == 64 * KiB and buckets.pop_fit(2 * MiB) == 0
    del free[2]
    assert buckets.compact() == 2 and buckets.entries[-1] == END
    assert [buckets.pop_fit(KiB) for _ in range(3)] == [7, 5, 0]      # each fit leaves the list


def test_bestfit_coalesces_neighbours():
    d = Driver("bestfit")
    ids = [d.alloc(256 * KiB) for _ in range(4)]
    seg = d.block(ids[0])[0]
    assert [d.block(i)[0] for i in ids] == [seg + k * 256 * KiB for k in range(4)]
    for k in (0, 2, 1):
        d.free(ids[k])
    assert d.pol.free_blocks() == [(seg, 768 * KiB), (seg + MiB, MiB)]
    d.free(ids[3])
    assert d.pol.free_blocks() == [(seg, 2 * MiB)]      # one block, the whole segment
    assert d.dev.n_free == 0                            # kept by default


def test_bestfit_reuses_freed_memory_without_device_malloc():
    d = Driver("bestfit")
    sizes = [3000, 70 * KiB, 300 * KiB, 5 * MiB, 512, 1 * MiB]
    for it in range(40):
        ids = [d.alloc(s) for s in sizes]
        if it == 0:
            first = d.dev.n_malloc
        for i in reversed(ids):
            d.free(i)
    assert d.dev.n_malloc == first and d.dev.n_free == 0


def test_bestfit_is_best_fit_lowest_address():
    d = Driver("bestfit")
    ids = [d.alloc(s) for s in (64 * KiB, 8 * KiB, 64 * KiB, 8 * KiB, 16 * KiB, 8 * KiB)]
    a1, a3 = d.block(ids[1])[0], d.block(ids[3])[0]
    d.free(ids[1])                                      # two separate 8 KiB holes
    d.free(ids[3])
    assert d.block(d.alloc(8 * KiB))[0] == a1           # same size: lowest address
    assert d.block(d.alloc(4 * KiB))[0] == a3           # smallest that fits beats the big tail


def test_bestfit_tie_goes_to_lowest_address():
    d = Driver("bestfit")
    holes = []
    for _ in range(8):
        holes.append(d.alloc(8 * KiB))
        d.alloc(4 * KiB)                    # separators keep the holes apart
    addrs = [d.block(i)[0] for i in holes]
    for k in (5, 2, 7, 0, 3, 6, 1, 4):
        d.free(holes[k])
    assert [d.block(d.alloc(8 * KiB))[0] for _ in range(8)] == addrs


def test_bestfit_merged_block_leaves_no_stale_fit():
    """A block that grew by merging is no longer a block of its old size (lazy deletion)."""
    d = Driver("bestfit")
    a, b, _, q, _ = (d.alloc(s) for s in (8 * KiB, 8 * KiB, 4 * KiB, 12 * KiB, 4 * KiB))
    q_addr = d.block(q)[0]
    for i in (q, a, b):                     # a's 8 KiB hole becomes 16 KiB when b is freed
        d.free(i)
    assert d.block(d.alloc(8 * KiB))[0] == q_addr


def test_bestfit_segments_round_up():
    d = Driver("bestfit")
    i = d.alloc(3 * MiB)
    assert d.dev.bytes_malloc == 4 * MiB                # a multiple of the 2 MiB segment
    assert d.pol.free_blocks() == [(d.block(i)[0] + 3 * MiB, MiB)]     # its tail is free for others
    d.alloc(MiB + 512 * KiB)                            # does not fit the 1 MiB tail: a new 2 MiB segment
    assert d.dev.n_malloc == 2 and d.dev.bytes_malloc == 6 * MiB


@pytest.mark.parametrize("free_order", [(0, 1), (1, 0)])
def test_bestfit_blocks_never_span_segments(free_order):
    d = Driver("bestfit")
    ids = [d.alloc(4 * MiB), d.alloc(MiB + 512 * KiB)]  # segment 1 filled to its end, then segment 2
    seg1, seg2 = d.block(ids[0])[0], d.block(ids[1])[0]
    assert seg2 == seg1 + 4 * MiB                       # the device's ranges touch
    for k in free_order:
        d.free(ids[k])
    assert d.pol.free_blocks() == [(seg1, 4 * MiB), (seg2, 2 * MiB)]   # adjacent, wholly free, yet two


def test_bestfit_flush_then_retry():
    d = Driver("bestfit", cap=4 * MiB)
    d.free(d.alloc(MiB))
    d.log.clear()
    i = d.alloc(3 * MiB)                                # 2 + 4 > 4: release the free segment, retry
    assert d.handles[i] is not None
    assert d.pol.counters()["cache_flushes"] == 1 and d.dev.n_free == 1
    assert d.log == ["2. segment alloc", "3a. release free segments", "3b. segment alloc"]
    assert d.handles[d.alloc(2 * MiB)] is None          # nothing left to release: OOM


def test_bestfit_collects_under_gc_runtime():
    d = Driver("bestfit", runtime="gc", cap=2 * MiB)
    d.free(d.alloc(MiB + 512 * KiB))        # dead, not yet collected
    d.log.clear()
    i = d.alloc(MiB + 512 * KiB)
    assert d.handles[i] is not None and d.dev.n_malloc == 1
    assert d.log == ["2. segment alloc", "3a. release free segments", "3b. segment alloc", "4.0 gc(true)",
                     "pooled free", "4.1 best fit"]


def test_bestfit_release_option():
    d = Driver("bestfit", options={"release": True})
    a, b = d.alloc(MiB), d.alloc(MiB)
    d.free(a)
    assert d.dev.n_free == 0
    d.free(b)
    assert d.dev.n_free == 1 and d.dev.reserved == 0 and d.pol.free_blocks() == []
    d.alloc(MiB)
    assert d.dev.n_malloc == 2


@pytest.mark.parametrize("options", [[], ["release=true"], ["segment=1MiB"]])
def test_bestfit_keys_past_one_machine_word_replay_alike(options):
    """Segments 16 TiB apart (`spread_out`, as for `torch`): the key field widens with each segment and re-keys
    the free list, most entries are Python ints past 2**63 (the compiled build's slow path), and the fused loop
    still walks as the plain walk, and both as the reference model, block for block."""
    from allocsim.formats import synth
    from test_fast_path import assert_fused_is_plain
    from test_reference_models import assert_same
    from test_torch_policy import spread_out
    trace = synth.generate("alloc-heavy", seed=3, n_allocs=3000)
    with pytest.MonkeyPatch.context() as mp:
        spread_out(mp)
        r = Replay(trace, "bestfit", options=options)
        r.run()
        assert r.policy._field.abits > 44
        assert max(r.policy._keys[:-1], default=0) > 1 << 63 or "release=true" in options    # (all released)
        assert_fused_is_plain(trace, "bestfit", options)
        assert_same(trace, "bestfit-ref", options)


def test_bestfit_rejects_bad_segment():
    with pytest.raises(UsageError, match="segment"):
        Driver("bestfit", options={"segment": 1000})


# ---- both: randomized comparisons with naive models and invariants ---------------------------------------

class NaiveSplit:
    """Phase 1 of the SplittingPool with unlimited memory, by linear scans over plain dicts."""

    def __init__(self, huge_exact=False):
        self.blocks = {}        # id -> [addr, size, prev, next, state]
        self.next_id = 1
        self.next_addr = 0
        self.freed = []
        self.huge_exact = huge_exact
        self.mallocs = 0

    def _new(self, addr, size, prev=0, nxt=0, state="avail"):
        b = self.next_id
        self.next_id += 1
        self.blocks[b] = [addr, size, prev, nxt, state]
        return b

    def malloc(self, req):
        n, c = round_request(req)
        for b in self.freed:
            self.blocks[b][4] = "avail"
        for b in self.freed:
            if b not in self.blocks or self.blocks[b][4] != "avail":
                continue
            head = b
            while self.blocks[head][2] and self.blocks[self.blocks[head][2]][4] == "avail":
                head = self.blocks[head][2]
            m = self.blocks[head][3]
            while m and self.blocks[m][4] == "avail":
                self.blocks[head][1] += self.blocks[m][1]
                nxt = self.blocks[m][3]
                self.blocks[head][3] = nxt
                if nxt:
                    self.blocks[nxt][2] = head
                del self.blocks[m]
                m = nxt
        self.freed = []
        cands = [(v[1], k) for k, v in self.blocks.items() if v[4] == "avail" and size_class(v[1]) == c
                 and v[1] >= n and not (c == HUGE and self.huge_exact and v[1] != n)]
        if cands:
            b = min(cands)[1]
        else:
            b = self._new(self.next_addr, n)
            self.next_addr += n
            self.mallocs += 1
        blk = self.blocks[b]
        rem = blk[1] - n
        if c != HUGE and rem > 0 and size_class(rem) == c:
            r = self._new(blk[0] + n, rem, b, blk[3])
            if blk[3]:
                self.blocks[blk[3]][2] = r
            blk[3] = r
            blk[1] = n
        blk[4] = "alloc"
        return b

    def free(self, b):
        self.blocks[b][4] = "freed"
        self.freed.append(b)


class NaiveBestFit:
    """Best fit over a list of free (addr, size) with merging, by linear scans."""

    SEG = 2 * MiB

    def __init__(self):
        self.free_list = []     # [addr, size, segment]
        self.next_addr = 0

    def malloc(self, req):
        n = -(-req // 512) * 512
        cands = [f for f in self.free_list if f[1] >= n]
        if cands:
            f = min(cands, key=lambda f: (f[1], f[0]))
            self.free_list.remove(f)
        else:
            seg = -(-n // self.SEG) * self.SEG
            f = [self.next_addr, seg, self.next_addr]
            self.next_addr += seg
        if f[1] > n:
            self.free_list.append([f[0] + n, f[1] - n, f[2]])
        return f[0], n, f[2]

    def free(self, addr, n, seg):
        blk = [addr, n, seg]
        for f in list(self.free_list):
            if f[2] == seg and f[0] + f[1] == blk[0]:
                self.free_list.remove(f)
                blk = [f[0], f[1] + blk[1], seg]
            elif f[2] == seg and blk[0] + blk[1] == f[0]:
                self.free_list.remove(f)
                blk[1] += f[1]
        self.free_list.append(blk)


# wide: every class and path; dense: few sizes, so equal sizes (ties), splits and merges are frequent
wide_sizes = st.one_of(st.integers(1, 64 * KiB), st.integers(1, 3 * MiB), st.integers(1, 40 * MiB),
                       st.sampled_from([512, 4096, MiB, 2 * MiB, 33 * MiB]))
dense_sizes = st.sampled_from([512, 1000, 1536, 4096, 8192, 64 * KiB, 300 * KiB, MiB, 3 * MiB, 6 * MiB])
ops_st = st.one_of(
    st.lists(st.tuples(st.booleans(), wide_sizes, st.integers(0, 10**6)), min_size=1, max_size=120),
    st.lists(st.tuples(st.booleans(), dense_sizes, st.integers(0, 10**6)), min_size=1, max_size=200))


def _script(ops):
    """(alloc size | free index) steps: True -> alloc, False -> free a live one (by the integer)."""
    live, steps, k = [], [], 0
    for is_alloc, size, pick in ops:
        if is_alloc or not live:
            steps.append(("a", k, size))
            live.append(k)
            k += 1
        else:
            steps.append(("f", live.pop(pick % len(live)), 0))
    return steps, k


@settings(max_examples=150, deadline=None)
@given(ops_st, st.booleans())
def test_split_matches_naive_model(ops, huge_exact):
    steps, n = _script(ops)
    d = Driver("split", options={"huge_exact": huge_exact})
    ref, ref_h = NaiveSplit(huge_exact), {}
    for kind, i, size in steps:
        if kind == "a":
            d.alloc(size)
            ref_h[i] = ref.malloc(size)
            assert d.handles[i] == ref_h[i]     # same block id: same (size, id) choice, same splits
            assert d.block(i)[1] == ref.blocks[ref_h[i]][1]
        else:
            d.free(i)
            ref.free(ref_h[i])
    assert d.dev.n_malloc == ref.mallocs
    assert d.pol.allocated == sum(v[1] for v in ref.blocks.values() if v[4] == "alloc")


@settings(max_examples=150, deadline=None)
@given(ops_st)
def test_bestfit_matches_naive_model(ops):
    steps, n = _script(ops)
    d = Driver("bestfit")
    ref, ref_h = NaiveBestFit(), {}
    seg_of = {}                         # our segment address -> the naive model's
    for kind, i, size in steps:
        if kind == "a":
            d.alloc(size)
            ref_h[i] = ref.malloc(size)
            addr, sz = d.block(i)
            raddr, rsz, rseg = ref_h[i]
            assert sz == rsz
            ours = max(a for a in d.pol._segments if a <= addr)
            assert seg_of.setdefault(ours, rseg) == rseg
            assert addr - ours == raddr - rseg
        else:
            d.free(i)
            ref.free(*ref_h[i])
    assert sorted(s for _, s in d.pol.free_blocks()) == sorted(f[1] for f in ref.free_list)


@settings(max_examples=40, deadline=None)
@given(ops_st, st.sampled_from(["split", "bestfit"]), st.sampled_from(["eager", "gc"]),
       st.sampled_from([None, 24 * MiB, 64 * MiB]))
def test_replay_invariants(ops, policy, runtime, cap):
    """Live blocks never overlap and hold their request; allocated is their sum; memory is conserved."""
    steps, n = _script(ops)
    w = TraceWriter()
    for kind, i, size in steps:
        if kind == "a":
            w.alloc(size)
        else:
            w.free(i)
    trace = w.finish()
    live = {}
    pol_box = []

    def observe(ev, kind, i, h):
        pol = pol_box[0]
        if kind == 1 and h is not None:
            live[i] = pol.block(h)
            assert live[i][1] >= trace.id_size[i]
        elif kind == 2:
            live.pop(i, None)
        spans = sorted(live.values())
        assert all(a + s <= b for (a, s), (b, _) in zip(spans, spans[1:]))

    r = Replay(trace, policy, runtime=runtime, cap=cap, capacity=None, keep_going=True, observer=observe)
    pol = r.policy
    pol_box.append(pol)
    res = r.run()
    if runtime == "eager":
        assert pol.allocated == sum(s for _, s in live.values())
    free_bytes = sum(f[1] for f in pol.free_blocks())           # (cls, size, id) / (addr, size)
    pending = sum(pol.block(b)[1] for b in pol._freed) if policy == "split" else 0
    assert free_bytes + pending + pol.allocated == res.final_reserved_bytes    # nothing lost, nothing twice
