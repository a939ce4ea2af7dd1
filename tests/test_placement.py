"""The driver placement model against the H100 probe recording, and its invariants."""
import json
import os
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.placement import GRANULE, SMALL, SMALL_UNIT, DriverPlacement

from conftest import ROOT

PROBES = os.path.join(ROOT, "traces", "raw", "driver_placement-h100.jsonl")
MiB = 1 << 20
#: Before the probe's first call the driver already held [0x7fecd0000000, +8 MiB) in a 32 MiB
#: region (the first 2 MiB request lands at +8 MiB), and the space below 0x7fecb2000000 was free.
#: The model cannot know a process's earlier ranges; the replay starts from these two facts.
TOP, EARLIER = 0x7FECB2000000, 0x7FECD0000000


def replay_probes():
    """``(exact, calls, misses)`` per experiment: the model predicts each malloc, then takes the recorded address."""
    rows = [json.loads(line) for line in open(PROBES)][1:]
    model = DriverPlacement(TOP)
    model.take(EARLIER, 8 * MiB)
    exact, calls, misses = Counter(), Counter(), []
    for i, r in enumerate(rows):
        if r["kind"] == "free":
            model.free(r["addr"])
            continue
        got = model.take(r["addr"], r["size"])
        assert got is not None, f"call {i}: the recorded range {r['addr']:#x} overlaps a live one in the model"
        calls[r["exp"]] += 1
        if got == r["addr"]:
            exact[r["exp"]] += 1
        else:
            misses.append((r["exp"], r["size"], r["addr"]))
    return exact, calls, misses


def test_model_predicts_every_recorded_malloc_but_the_first_small_one():
    """1,374 of 1,375: the one miss is the first request under 1 MiB, which the driver put in a
    small-request region at an address the model has no way to know (0x7feccbe00000)."""
    exact, calls, misses = replay_probes()
    assert misses == [("seq", 512, 0x7FECCBE00000)]
    assert sum(calls.values()) == 1375
    for exp in calls:
        assert exact[exp] == calls[exp] - (exp == "seq"), exp


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
    for addr in live:
        m.free(addr)
    assert all(r.unit == SMALL_UNIT for r in m._by_addr.values()), "an empty large region was kept"
