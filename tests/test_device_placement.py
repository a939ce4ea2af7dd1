"""Where the simulated device puts segments: recorded addresses while the replay follows them, the
driver model after (framework policies), a bump pointer for policies without a framework."""
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import allocsim
from allocsim.engine.replay import Replay, make_device
from allocsim.machine.device import ADDRESS_END, BASE_ADDR, SimulatedDevice
from allocsim.errors import UsageError
from allocsim.trace import SEGMENT_ALLOC, SEGMENT_FREE, Trace

from conftest import ROOT, random_trace

MiB = 1 << 20
TOP = 0x7F2000000000
#: a recording's segment calls: 20 and 2 MiB in one region, 64 MiB lower down than the model would
#: put it (a range the trace does not show lay between)
HINTS = [(20 * MiB, TOP - 32 * MiB), (2 * MiB, TOP - 12 * MiB), (64 * MiB, TOP - 160 * MiB)]


def test_recorded_addresses_while_the_replay_follows_the_recording():
    d = SimulatedDevice(address_hints=HINTS)
    assert [d.malloc(n) for n, _ in HINTS] == [a for _, a in HINTS]


def test_a_call_of_another_size_ends_the_recorded_addresses_for_good():
    d = SimulatedDevice(address_hints=HINTS)
    assert d.malloc(20 * MiB) == HINTS[0][1]
    assert d.malloc(3 * MiB // 2) == TOP - 12 * MiB          # not the recorded 2 MiB call: the driver model,
    assert d.malloc(64 * MiB) == TOP - 96 * MiB              # from then on, though this size matches


def test_a_recorded_range_still_held_ends_the_recorded_addresses():
    hints = [(20 * MiB, TOP - 32 * MiB), (20 * MiB, TOP - 32 * MiB)]  # recorded: freed, then reused
    d = SimulatedDevice(address_hints=hints)
    a = d.malloc(20 * MiB)
    b = d.malloc(20 * MiB)                                   # the replay kept the first one
    assert a == hints[0][1] and b != a and (b + 20 * MiB <= a or a + 20 * MiB <= b)


def test_a_page_map_is_accounted_as_a_malloc_and_placed_nowhere():
    """`map` (expandable segments' pages): the same reserved bytes, counts, cost and refusal as a malloc of
    that size, while the recorded addresses and the driver model stay as they were for the next malloc."""
    mapped, malloced = SimulatedDevice(cap=100 * MiB, address_hints=HINTS), SimulatedDevice(cap=100 * MiB)
    assert mapped.map(20 * MiB) and malloced.malloc(20 * MiB) is not None
    assert not mapped.map(81 * MiB) and malloced.malloc(81 * MiB) is None
    for field in ("reserved", "peak_reserved", "n_malloc", "bytes_malloc", "n_failed", "clock", "malloc_time",
                  "refused_min"):
        assert getattr(mapped, field) == getattr(malloced, field), field
    assert mapped.malloc(20 * MiB) == HINTS[0][1]            # the map took no recorded address
    assert not mapped._driver._owner.keys() - {HINTS[0][1]}   # and left no range in the driver model


def test_framework_device_without_hints_reuses_freed_ranges_as_the_driver_does():
    d = SimulatedDevice(address_hints=[])
    a = d.malloc(100 * MiB)
    b = d.malloc(100 * MiB)
    assert b < a                                             # the heap grows downward
    d.free(a, 100 * MiB)
    assert d.malloc(64 * MiB) == a + 64 * MiB                # the top of the 128 MiB region a gave back


def test_device_without_framework_keeps_the_bump_pointer():
    d = SimulatedDevice()
    a = d.malloc(1000)
    assert a == BASE_ADDR
    d.free(a, 1000)
    assert d.malloc(1000) == BASE_ADDR + 1024                # never reused


def test_engine_gives_framework_policies_the_driver_and_others_the_bump_pointer():
    t = random_trace(n=50, seed=3)
    assert Replay(t, "torch").device._driver is not None   # no recorded addresses: the driver model
    assert Replay(t, "cupy").device._driver is not None
    assert Replay(t, "split").device._driver is None


PRESSURE = os.path.join(ROOT, "traces", "raw", "pressure")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("pressure") / "plain.bin")
    allocsim.import_trace(os.path.join(PRESSURE, "plain.pickle"), out)
    return Trace.load(out)


@pytest.mark.parametrize("scenario", ["gc-threshold", "fraction-retry", "maxsplit-cap"])
def test_replay_under_a_setting_the_program_did_not_run_with_predicts_the_real_rerun(plain, scenario, tmp_path):
    """The plain ResNet-18 run replayed under another scenario's settings makes the real re-run's segment
    calls, of the same sizes, in the same order, and (the driver model) starts segments in freed ranges."""
    stats = json.load(open(os.path.join(PRESSURE, f"{scenario}.stats.json")))
    allocsim.import_trace(os.path.join(PRESSURE, f"{scenario}.pickle"), str(tmp_path / "real.bin"))
    real = Trace.load(str(tmp_path / "real.bin"))
    opts = [o for o in stats["alloc_conf"].split(",") if o] + [f"per_process_memory_fraction={stats['fraction']}"]
    dev = make_device(plain, "torch", capacity=stats["total_memory"])
    calls, malloc, free = [], dev.malloc, dev.free
    dev.malloc = lambda n: calls.append((SEGMENT_ALLOC, n, malloc(n))) or calls[-1][2]
    dev.free = lambda a, n: calls.append((SEGMENT_FREE, n, a)) or free(a, n)
    Replay(plain, "torch", capacity=stats["total_memory"], options=opts, device=dev).run()
    seg = np.isin(real.kind, [SEGMENT_ALLOC, SEGMENT_FREE])
    assert [(k, n) for k, n, _ in calls] == list(zip(real.kind[seg].tolist(), real.size[seg].tolist()))
    assert dev.peak_reserved == stats["memory_stats"]["reserved_bytes.all.peak"]
    assert dev.reserved == stats["memory_stats"]["reserved_bytes.all.current"]
    freed, reused = [], 0
    for k, n, a in calls:
        if k == SEGMENT_FREE:
            freed.append((a, a + n))
        else:
            reused += any(lo <= a < hi for lo, hi in freed)
    assert reused > 0, "no segment started where a freed one had been (the real run: 22, 23, 65)"


# issue 29: a device larger than the ~127 TiB the driver model had below its top, and the end of the address space
TiB = 1 << 40


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 80), st.booleans()), min_size=1, max_size=12))
def test_a_device_larger_than_the_space_below_the_top_places_every_segment_apart(calls):
    """Segments of tens of TiB on a 1 PiB device: the driver model takes space above the bump pointer when the
    space below its top is full (it raised MemoryError), and no two live ranges, nor an expandable segment's, overlap."""
    d = SimulatedDevice(capacity=1 << 50, address_hints=[])
    ranges, mallocs = {}, []            # every live range; the device mallocs among them, oldest first
    for tib, expandable in calls:
        if expandable:
            ranges[d.reserve_address_range(tib * TiB)] = tib * TiB
            continue
        while d.reserved + tib * TiB > d.limit:
            a = mallocs.pop(0)
            d.free(a, ranges.pop(a))
        mallocs.append(d.malloc(tib * TiB))
        ranges[mallocs[-1]] = tib * TiB
    spans = sorted((a, a + n) for a, n in ranges.items())
    assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:])), spans
    assert spans[-1][1] < ADDRESS_END


def test_a_range_past_the_end_of_the_address_space_is_one_line():
    """Ranges a framework's model keeps end below 2**63 (the compiled build's signed words): past it the replay
    stops in one line, in both builds alike (the device is shared Python)."""
    d = SimulatedDevice(capacity=1 << 50, address_hints=[])
    d._next = ADDRESS_END - (2 << 20)
    with pytest.raises(UsageError, match=r"reach past address 2\*\*63, the end of the model's address space"):
        d.reserve_address_range(4 << 20)
    bump = SimulatedDevice(capacity=None, address_hints=None)       # no framework: its addresses are never read
    bump._next = ADDRESS_END - (2 << 20)
    assert bump.malloc(4 << 20) == ADDRESS_END - (2 << 20)
