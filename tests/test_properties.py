"""Invariants every simulated policy must keep, under both runtimes, on generated traces.

The policies are read from the registry when the tests are collected, so a policy
module that lands later is covered without editing this file (policies with
``real_gpu=True`` are left to the GPU tests). For each (policy, runtime):

- live blocks never overlap, and each is at least as large as its request;
- reserved >= allocated >= bytes the policy holds (requested) at every step;
- the device never holds more than the cap;
- every byte returns: once everything is freed (and, for gc, a full collection has
  run) the policy's ``allocated`` is 0;
- two replays give identical results;
- an OOM happens only when the device really could not serve the request: never
  without a cap, never when the cap exceeds every request's generously rounded size
  summed, and when one happens the device was full up to that rounding margin, and it
  is reported at the index of the failed ALLOC.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim import engine, policies
from allocsim.trace import ALLOC, TraceWriter

MiB = 1 << 20
ZERO = getattr(engine, "ZERO", None)    # the handle a 0-byte request may get without reaching the policy
POLICIES = [n for n in policies.names() if not policies.get(n).real_gpu]
RUNTIMES = ["eager", "gc"]
CASES = [pytest.param(p, r, id=f"{p}-{r}") for p in POLICIES for r in RUNTIMES]

#: The most any modeled allocator takes from the device to serve one request of s bytes:
#: power-of-two bins double it, PyTorch takes 2 or 20 MiB segments (large sizes rounded to
#: 2 MiB), CuPy rounds to 512 B. 2 s + 64 MiB bounds them all with room to spare.
def device_request_bound(size: int) -> int:
    return 2 * size + 64 * MiB


SETTINGS = settings(max_examples=50, deadline=None, derandomize=True, report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Sizes from 1 B to a few hundred MiB, weighted toward the small sizes traces are made of.
sizes = st.one_of(
    st.integers(1, 4096),
    st.integers(4097, 2 * MiB),
    st.integers(2 * MiB, 64 * MiB),
    st.integers(64 * MiB, 300 * MiB),
    st.sampled_from([0, 512, 1 * MiB, 2 * MiB, 10 * MiB, 20 * MiB]),   # the allocators' boundaries
)


@st.composite
def traces(draw, max_ops: int = 40):
    """A random alloc/free sequence on up to three streams, every object freed by the end."""
    ops = draw(st.lists(st.tuples(st.booleans(), sizes, st.integers(0, 2), st.integers(0, 10**6)),
                        min_size=1, max_size=max_ops))
    w = TraceWriter(meta={"producer": "hypothesis"})
    live: list[int] = []
    for is_alloc, size, stream, pick in ops:
        if is_alloc or not live:
            live.append(w.alloc(size, stream=[0, 7, 0xBEEF][stream]))
        else:
            w.free(live.pop(pick % len(live)))
    order = draw(st.permutations(range(len(live))))
    for k in order:
        w.free(live[k])
    return w.finish()


@st.composite
def traces_and_caps(draw):
    t = draw(traces())
    factor = draw(st.sampled_from([None, 1.0, 1.25, 2.0, 4.0]))
    cap = None if factor is None else int(max(t.load_bytes, 1) * factor)
    return t, cap


def run_checked(trace, policy, runtime, cap, *, keep_going=True, gc_every=None):
    """Replay with the invariants checked after every driving event; return (result, policy, runtime, device)."""
    pol, rt, dev, sections = engine.build(trace, policy, runtime=runtime, cap=cap, capacity=None,
                                          gc_every=gc_every)
    id_size = trace.id_size.tolist()

    def observe(event, kind, id_, handle):
        held = [(i, h) for i, h in enumerate(rt.handles) if h is not None and h is not ZERO]
        held_bytes = sum(id_size[i] for i, _ in held)
        assert dev.reserved >= pol.allocated >= held_bytes, \
            f"event {event}: reserved {dev.reserved} allocated {pol.allocated} held {held_bytes}"
        if cap is not None:
            assert dev.reserved <= cap, f"event {event}: reserved {dev.reserved} > cap {cap}"
        free = pol.largest_free()
        assert 0 <= free <= dev.reserved - pol.allocated, \
            f"event {event}: largest free block {free} > reserved - allocated {dev.reserved - pol.allocated}"
        blocks = []
        for i, h in held:
            addr, size = pol.block(h)
            assert size >= id_size[i], f"event {event}: block of id {i} is {size} B for a {id_size[i]} B request"
            blocks.append((addr, size, i))
        blocks.sort()
        for (a0, s0, i0), (a1, _, i1) in zip(blocks, blocks[1:]):
            assert a0 + s0 <= a1, f"event {event}: block of id {i0} [{a0:#x}+{s0}] overlaps id {i1} at {a1:#x}"

    try:
        res = engine._run(trace, pol, rt, dev, sections, keep_going=keep_going, timeline=False, progress=None,
                          observer=observe)
    finally:
        pol.close()
    return res, pol, rt, dev


@pytest.mark.parametrize("policy, runtime", CASES)
@SETTINGS
@given(tc=traces_and_caps(), gc_every=st.sampled_from([None, None, 4 * MiB, 256 * MiB]))
def test_blocks_disjoint_accounting_ordered_cap_kept_all_bytes_return(policy, runtime, tc, gc_every):
    trace, cap = tc
    res, pol, rt, dev = run_checked(trace, policy, runtime, cap, gc_every=gc_every)
    if runtime == "gc":
        rt.collect(True)
    assert pol.allocated == 0, f"{pol.allocated} bytes still allocated after every object was freed"
    assert 0 <= dev.reserved and dev.peak_reserved <= (cap if cap is not None else dev.peak_reserved)
    assert res.peak_reserved_bytes >= res.peak_allocated_bytes >= 0
    assert res.allocs == trace.n_allocs and res.frees == trace.n_allocs - res.ooms   # failed ALLOCs have no FREE


@pytest.mark.parametrize("policy, runtime", CASES)
@settings(SETTINGS, max_examples=20)
@given(tc=traces_and_caps())
def test_replay_is_deterministic(policy, runtime, tc):
    trace, cap = tc
    a, b = (engine.replay(trace, policy, runtime=runtime, cap=cap, capacity=None, keep_going=True).to_dict()
            for _ in range(2))
    a.pop("replay_seconds")
    b.pop("replay_seconds")
    assert a == b


@pytest.mark.parametrize("policy, runtime", CASES)
@SETTINGS
@given(trace=traces(), generous=st.booleans())
def test_no_oom_without_a_binding_cap(policy, runtime, trace, generous):
    alloc_sizes = trace.size[trace.kind == ALLOC].tolist()
    cap = sum(device_request_bound(s) for s in alloc_sizes) if generous else None
    res, *_ = run_checked(trace, policy, runtime, cap, keep_going=False)
    assert res.ooms == 0, f"OOM at {res.first_oom} with cap {cap}"


@pytest.mark.parametrize("policy, runtime", CASES)
@SETTINGS
@given(tc=traces_and_caps())
def test_oom_only_when_the_device_is_full(policy, runtime, tc):
    trace, cap = tc
    res, pol, rt, dev = run_checked(trace, policy, runtime, cap, keep_going=True)
    if cap is None:
        assert res.ooms == 0
    offline = policies.get(policy).offline
    for o in res.oom_events:
        assert trace.kind[o.event] == ALLOC and trace.size[o.event] == o.size > 0
        assert o.live_bytes == int(trace.live_curve[o.event]) - o.size
        if offline:
            # a bound, not an allocator: its one planned heap fits the cap or nothing is placed
            assert o.reserved_bytes == 0 and pol.heap > cap
            continue
        # the policy gave up only when the device could not take what this request needs
        assert o.reserved_bytes + device_request_bound(o.size) > cap, \
            f"OOM at event {o.event} ({o.size} B) with {o.reserved_bytes} B reserved of a {cap} B cap"
        assert o.reserved_bytes <= cap
    if res.ooms:
        first = res.first_oom.event
        stopped, *_ = run_checked(trace, policy, runtime, cap, keep_going=False)
        assert stopped.ooms == 1 and stopped.first_oom.event == first and not stopped.completed


# ---- the checks themselves can fail: deliberately broken pools ---------------------------
DummyPool = policies.get("none")


class Overlapping(DummyPool):
    """Hands every request the same address."""
    def malloc(self, size, stream):
        h = super().malloc(size, stream)
        return h and (0x1000, h[1], h)

    def free(self, handle):
        super().free(handle[2])

    def block(self, handle):
        return handle[:2]


class Leaky(DummyPool):
    """Never returns a freed block."""
    def free(self, handle):
        pass


class Undercounting(DummyPool):
    """Reports half of what it hands out."""
    def malloc(self, size, stream):
        h = super().malloc(size, stream)
        if h:
            self.allocated -= size - size // 2
        return h

    def free(self, handle):
        self.device.free(*handle)
        self.allocated -= handle[1] // 2


class CapBreaking(DummyPool):
    """Takes memory past the device's limit."""
    def malloc(self, size, stream):
        limit, self.device.limit = self.device.limit, 2**62
        try:
            return super().malloc(size, stream)
        finally:
            self.device.limit = limit


class Quitter(DummyPool):
    """Gives up on any request while it holds memory, however empty the device."""
    def malloc(self, size, stream):
        return None if self.allocated else super().malloc(size, stream)


class Moody(DummyPool):
    """Charges a random cost: its results are not reproducible."""
    def malloc(self, size, stream):
        import random
        self.device.clock += random.random()
        return super().malloc(size, stream)


def _fixed_trace():
    w = TraceWriter()
    a = w.alloc(3 * MiB)
    b = w.alloc(5000, stream=1)
    w.free(a)
    c = w.alloc(100 * MiB)
    w.free(b)
    w.free(c)
    return w.finish()


@pytest.mark.parametrize("broken, test, cap, why", [
    (Overlapping, test_blocks_disjoint_accounting_ordered_cap_kept_all_bytes_return, None, "overlaps"),
    (Leaky, test_blocks_disjoint_accounting_ordered_cap_kept_all_bytes_return, None, "still allocated"),
    (Undercounting, test_blocks_disjoint_accounting_ordered_cap_kept_all_bytes_return, None, "held"),
    (CapBreaking, test_blocks_disjoint_accounting_ordered_cap_kept_all_bytes_return, 50 * MiB, "> cap"),
    (Quitter, test_no_oom_without_a_binding_cap, None, "OOM at"),
    (Quitter, test_oom_only_when_the_device_is_full, 10**12, "OOM at event"),
    (Moody, test_replay_is_deterministic, None, None),
])
def test_each_property_catches_a_policy_that_breaks_it(monkeypatch, broken, test, cap, why):
    monkeypatch.setitem(policies.REGISTRY, "broken", type("Broken", (broken,), {"name": "broken"}))
    inner = test.hypothesis.inner_test        # the property body, on one fixed case
    case = {"tc": (_fixed_trace(), cap), "gc_every": None, "trace": _fixed_trace(), "generous": False}
    names = inner.__code__.co_varnames[:inner.__code__.co_argcount]
    args = {k: v for k, v in case.items() if k in names}
    with pytest.raises(AssertionError, match=why):
        inner("broken", "eager", **args)
