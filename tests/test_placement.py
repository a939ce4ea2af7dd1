"""The driver placement model against the H100 probe recording, and its invariants."""
import json
import os
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

import numpy as np
import pytest

from allocsim.machine.placement import GRANULE, SMALL, SMALL_UNIT, DriverPlacement
from allocsim.trace import SEGMENT_ALLOC, SEGMENT_FREE, Trace

from conftest import ROOT

PROBES = os.path.join(ROOT, "traces", "raw", "driver_placement-h100.jsonl")
MiB = 1 << 20
#: Before the probe's first call the driver already held [0x7fecd0000000, +8 MiB) in a 32 MiB
#: region (the first 2 MiB request lands at +8 MiB), and the space below 0x7fecb2000000 was free.
#: The model cannot know a process's earlier ranges; the replay starts from these two facts.
TOP, EARLIER = 0x7FECB2000000, 0x7FECD0000000


def one_step(model, calls):
    """``(exact, calls, misses)`` per tag of ``(tag, is_free, size, address)`` calls: the model predicts
    each malloc, then takes the recorded address, so each prediction starts from the real state."""
    exact, made, misses = Counter(), Counter(), []
    for i, (tag, is_free, n, addr) in enumerate(calls):
        if is_free:
            model.free(addr)
            continue
        got = model.take(addr, n)
        assert got is not None, f"call {i}: the recorded range {addr:#x} overlaps a live one in the model"
        made[tag] += 1
        if got == addr:
            exact[tag] += 1
        else:
            misses.append((tag, n, addr))
    return exact, made, misses


def replay_probes():
    rows = [json.loads(line) for line in open(PROBES)][1:]
    model = DriverPlacement(TOP)
    model.take(EARLIER, 8 * MiB)
    return one_step(model, [(r["exp"], r["kind"] == "free", r["size"], r["addr"]) for r in rows])


def test_model_predicts_every_recorded_malloc_but_the_first_small_one():
    """1,374 of 1,375: the one miss is the first request under 1 MiB, which the driver put in a
    small-request region at an address the model has no way to know (0x7feccbe00000)."""
    exact, calls, misses = replay_probes()
    assert misses == [("seq", 512, 0x7FECCBE00000)]
    assert sum(calls.values()) == 1375
    for exp in calls:
        assert exact[exp] == calls[exp] - (exp == "seq"), exp


@pytest.mark.parametrize("name, want", [("gpt2.bin", (157, 189)), ("gpt2_variable.bin", (180, 204)),
                                        ("gpt2-maxsplit128-rp2div4.bin", (188, 229)), ("bert_mlm.bin", (91, 154)),
                                        ("resnet50.bin", (69, 109)), ("cupy_mlp.bin", (2, 6))])
def test_model_on_the_recorded_runs_segment_calls(name, want):
    """How many recorded segment addresses the model predicts one step ahead (docs/models/driver.md):
    the misses are ranges the trace does not show, most of them in the first iterations."""
    t = Trace.load(os.path.join(ROOT, "traces", name))
    seg = np.isin(t.kind, [SEGMENT_ALLOC, SEGMENT_FREE])
    calls = [(name, k == SEGMENT_FREE, n, a) for k, n, a in zip(t.kind[seg].tolist(), t.size[seg].tolist(),
                                                                 t.addr[seg].tolist())]
    exact, made, _ = one_step(DriverPlacement(top=max(a + n for _, free, n, a in calls if not free) + 256), calls)
    assert (exact[name], made[name]) == want


def test_take_refuses_an_address_a_live_range_holds():
    m = DriverPlacement()
    a = m.malloc(20 * MiB)
    assert m.take(a + 2 * MiB, 2 * MiB) is None
    m.free(a)                       # nothing was placed: the only allocation goes, and its region with it
    assert not m._by_addr


def test_exact_fit_hole_is_passed_over_and_freed_runs_are_reused():
    m = DriverPlacement()
    a, b, c = (m.malloc(64 * MiB) for _ in range(3))
    assert a > b > c and a - b == 64 * MiB             # regions stack downward from the top
    m.free(b)                                          # a 64 MiB hole between a and c
    assert m.malloc(64 * MiB) < c                      # exactly as big as the region: passed over
    small = m.malloc(2 * MiB)
    assert small == b + 32 * MiB                       # a 32 MiB region at the top of the hole it leaves room in
    assert m.malloc(2 * MiB) == small + GRANULE        # the newest region's next granule


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 300 * MiB), st.integers(0, 10**6)), max_size=120))
def test_live_ranges_never_overlap_and_stay_aligned(ops):
    m = DriverPlacement()
    live = {}
    for is_free, n, pick in ops:
        if is_free and live:
            addr = sorted(live)[pick % len(live)]
            m.free(addr)
            del live[addr]
            continue
        addr = m.malloc(n)
        unit = m._owner[addr].unit                     # a small region packs even 1 MiB+ requests at 512 B
        assert addr % unit == 0 and (n >= SMALL or unit == SMALL_UNIT)
        assert all(addr + n <= a or a + k <= addr for a, k in live.items()), "overlaps a live range"
        live[addr] = n
        assert_consistent(m)
    for addr in live:
        m.free(addr)
    assert all(r.unit in (0, SMALL_UNIT) for r in m._by_addr.values()), "an empty large region was kept"
    assert_consistent(m)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["malloc", "take", "free"]), st.integers(1, 100 * MiB),
                          st.integers(0, 2**20)), max_size=80))
def test_recorded_addresses_anywhere_keep_the_map_whole(ops):
    """`take` at arbitrary granule addresses (a trace's unseen neighbours): live ranges stay disjoint and
    every byte below the top is a hole or a region, never both."""
    top = 1 << 40
    m = DriverPlacement(top)
    live = {}
    for op, n, pick in ops:
        if op == "free" and live:
            addr = sorted(live)[pick % len(live)]
            m.free(addr)
            del live[addr]
            assert_consistent(m)
            continue
        if op == "take":
            addr = top - (pick % 4096 + 1) * GRANULE
            if m.take(addr, n) is None:
                g = -(-n // GRANULE) * GRANULE
                assert any(a < addr + g and addr < a + -(-k // GRANULE) * GRANULE for a, k in live.items()), \
                    "refused a range no live allocation's granules meet"
                continue
        else:
            addr = m.malloc(n)
        assert all(addr + n <= a or a + k <= addr for a, k in live.items()), "overlaps a live range"
        live[addr] = n
        assert_consistent(m)


def assert_consistent(m):
    """Holes and regions below the top tile [0, top) without overlap; each allocation lies in its region."""
    spans = sorted([(a, b, "hole") for a, b in m._holes.items()] +
                   [(r.start, min(r.end, m.top), "region") for r in m._by_addr.values() if r.start < m.top])
    assert spans[0][0] == 0 and all(x[1] == y[0] for x, y in zip(spans, spans[1:])) and spans[-1][1] == m.top
    for addr, r in m._owner.items():
        assert r.start <= addr and addr + r.live[addr] <= r.end
    assert m.fingerprint() == m._make_fingerprint(), "the kept fingerprint is not the placement's now"


def test_recorded_ranges_at_the_bottom_of_the_space_leave_room():
    """Recorded addresses of 0 (a hand-made trace): the space above them, taken for unseen ranges, is given back."""
    m = DriverPlacement()
    assert m.take(0, 20 * MiB) is not None
    a = m.malloc(20 * MiB)
    assert a >= 20 * MiB
    assert_consistent(m)
