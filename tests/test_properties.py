"""Invariants every simulated policy must keep, under both runtimes, on generated traces.

The checks are `allocsim.testing`'s (the same a plug-in author runs with
`check_policy`); here hypothesis draws the traces. The policies are read from the
registry when the tests are collected, so a policy module that lands later is covered
without editing this file (policies with ``real_gpu=True`` are left to the GPU tests).
For each (policy, runtime): live blocks never overlap and lie inside device segments,
each at least as large as its request; reserved >= allocated >= bytes held; the cap
holds; every byte returns; two replays agree; an OOM happens only when the device
really could not serve the request, and is reported at the failed ALLOC.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim import policies, testing
from allocsim.testing import (check_accounting, check_deterministic, check_no_oom_without_binding_cap,
                              check_oom_only_when_full, check_policy)
from allocsim.trace import TraceWriter

MiB = 1 << 20
POLICIES = [n for n in policies.names() if not policies.get(n).real_gpu]
RUNTIMES = list(testing.RUNTIMES)
CASES = [pytest.param(p, r, id=f"{p}-{r}") for p in POLICIES for r in RUNTIMES]

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True, report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

sizes = st.one_of(*(st.integers(lo, hi) for lo, hi in testing.SIZE_RANGES), st.sampled_from(testing.BOUNDARY_SIZES))


@st.composite
def traces(draw, max_ops: int = 40):
    """A random alloc/free sequence on up to three streams, every object freed by the end."""
    ops = draw(st.lists(st.tuples(st.booleans(), sizes, st.integers(0, 2), st.integers(0, 10**6)),
                        min_size=1, max_size=max_ops))
    live = 0
    for is_alloc, *_ in ops:
        live += 1 if is_alloc or not live else -1
    return testing.build_trace(ops, draw(st.permutations(range(live))))


@st.composite
def traces_and_caps(draw):
    t = draw(traces())
    return t, testing.cap_for(t, draw(st.sampled_from(testing.CAP_FACTORS)))


@pytest.mark.parametrize("policy, runtime", CASES)
@SETTINGS
@given(tc=traces_and_caps(), gc_every=st.sampled_from(testing.GC_EVERY))
def test_blocks_disjoint_accounting_ordered_cap_kept_all_bytes_return(policy, runtime, tc, gc_every):
    check_accounting(policy, tc[0], runtime, tc[1], gc_every)


@pytest.mark.parametrize("policy, runtime", CASES)
@settings(SETTINGS, max_examples=20)
@given(tc=traces_and_caps())
def test_replay_is_deterministic(policy, runtime, tc):
    check_deterministic(policy, tc[0], runtime, tc[1])


@pytest.mark.parametrize("policy, runtime", CASES)
@SETTINGS
@given(trace=traces(), generous=st.booleans())
def test_no_oom_without_a_binding_cap(policy, runtime, trace, generous):
    check_no_oom_without_binding_cap(policy, trace, runtime, generous)


@pytest.mark.parametrize("policy, runtime", CASES)
@SETTINGS
@given(tc=traces_and_caps())
def test_oom_only_when_the_device_is_full(policy, runtime, tc):
    check_oom_only_when_full(policy, tc[0], runtime, tc[1])


# ---- the checks themselves can fail: deliberately broken pools ---------------------------
DummyPool = policies.get("none")


class Overlapping(DummyPool):
    """Hands every request the address of its first block."""
    first = None

    def malloc(self, size, stream):
        h = super().malloc(size, stream)
        self.first = self.first or (h and h[0])
        return h and (self.first, h[1], h)

    def free(self, handle):
        super().free(handle[2])

    def block(self, handle):
        return handle[:2]


class Astray(DummyPool):
    """Reports every block a page past where the device put it."""
    def block(self, handle):
        return handle[0] + 4096, handle[1]


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
        self.ctx.free(*handle)
        self.allocated -= handle[1] // 2


class CapBreaking(DummyPool):
    """Takes memory past the device's limit (reaching around its context to lift it)."""
    def malloc(self, size, stream):
        dev = self.ctx._device
        limit, dev.limit = dev.limit, 2**62
        try:
            return super().malloc(size, stream)
        finally:
            dev.limit = limit


class Quitter(DummyPool):
    """Gives up on any request while it holds memory, however empty the device."""
    def malloc(self, size, stream):
        return None if self.allocated else super().malloc(size, stream)


class Moody(DummyPool):
    """Charges a random cost: its results are not reproducible."""
    def malloc(self, size, stream):
        import random
        self.ctx.charge(random.random())
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


BROKEN = [
    (Overlapping, lambda p, t: check_accounting(p, t, "eager"), "blocks overlap"),
    (Astray, lambda p, t: check_accounting(p, t, "eager"), "block outside every segment"),
    (Leaky, lambda p, t: check_accounting(p, t, "eager"), "bytes not conserved"),
    (Undercounting, lambda p, t: check_accounting(p, t, "eager"), "allocated below the bytes held"),
    (CapBreaking, lambda p, t: check_accounting(p, t, "eager", 50 * MiB), "cap exceeded"),
    (Quitter, lambda p, t: check_no_oom_without_binding_cap(p, t, "eager", False), "OOM without a binding cap"),
    (Quitter, lambda p, t: check_oom_only_when_full(p, t, "eager", 10**12), "OOM while the device had room"),
    (Moody, lambda p, t: check_deterministic(p, t, "eager"), "not deterministic"),
]


@pytest.mark.parametrize("broken, check, why", BROKEN, ids=[f"{b.__name__}-{w}" for b, _, w in BROKEN])
def test_each_property_catches_a_policy_that_breaks_it(broken, check, why):
    with pytest.raises(AssertionError, match=why):
        check(broken, _fixed_trace())


@pytest.mark.parametrize("broken, why", [(b, w) for b, _, w in BROKEN[:5]] + [(Moody, "not deterministic")],
                         ids=lambda x: getattr(x, "__name__", x))
def test_check_policy_names_the_broken_invariant(broken, why):
    """`check_policy` on generated traces finds each broken pool without help, and says which rule broke."""
    with pytest.raises(AssertionError, match=why):
        check_policy(broken, examples=20)


def test_check_policy_passes_every_builtin_on_a_given_trace():
    from conftest import random_trace
    for name in POLICIES:
        check_policy(policies.get(name), [random_trace(300, seed=5)], examples=3)
