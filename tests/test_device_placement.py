"""Where the simulated device puts segments: recorded addresses while the replay follows them, the
driver model after (framework policies), a bump pointer for policies without a framework."""
from allocsim import engine
from allocsim.device import BASE_ADDR, SimulatedDevice

from conftest import random_trace

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
    assert engine.build(t, "torch")[2]._driver is not None   # no recorded addresses: the driver model
    assert engine.build(t, "cupy")[2]._driver is not None
    assert engine.build(t, "split")[2]._driver is None
