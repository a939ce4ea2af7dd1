"""The state at the reserved peak (free breakdown, largest free block) costs a replay at most a share of its time:
one it cannot afford is taken by a second walk to the last peak's event, with the same figures (issue 29: reading
every pool at every new peak made 4,000 private pools cost 11.7 s; docs/architecture.md, "The state at the
reserved peak")."""
import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocsim.policies.torch import TorchCachingAllocator
from allocsim.engine.replay import Replay, replay
from allocsim.trace import Trace

from conftest import ROOT

sys.path.insert(0, ROOT)
from benchmarks.bench_pools_streams import own_streams, private_pools  # noqa: E402

FIGURES = ("peak_reserved_bytes", "peak_allocated_bytes", "largest_free_fragmentation_at_peak", "breakdown_at_peak",
           "final_reserved_bytes")


def _figures(res) -> dict:
    return {k: getattr(res, k) for k in FIGURES if hasattr(res, k)}


@pytest.fixture
def never_afford(monkeypatch):
    """Every peak's state left to the second walk."""
    monkeypatch.setattr(Replay, "PEAK_SHARE", 0.0, raising=False)
    monkeypatch.setattr(Replay, "PEAK_ALLOWANCE", -1.0, raising=False)


def _always(trace, policy):
    """The replay with every peak's state taken as it is reached (an observer: it cannot be made again)."""
    return Replay(trace, policy, observer=lambda *a: None).run()


@pytest.mark.parametrize("make", [private_pools, own_streams], ids=["pools", "streams"])
def test_a_replay_of_many_pools_reads_them_at_one_peak(make, never_afford, monkeypatch):
    """N pools, each a new reserved peak: the pools are read at one peak (in the second walk), not at N."""
    reads = []
    real = TorchCachingAllocator.largest_free
    monkeypatch.setattr(TorchCachingAllocator, "largest_free", lambda self: reads.append(1) or real(self))
    trace = make(300)
    res = replay(trace, "torch")
    assert len(reads) == 1, len(reads)
    monkeypatch.setattr(TorchCachingAllocator, "largest_free", real)
    assert _figures(res) == _figures(_always(trace, "torch"))


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), streams=st.integers(1, 4), policy=st.sampled_from(["torch", "cupy", "split"]))
def test_the_peak_state_of_a_second_walk_is_the_one_taken_at_once(seed, streams, policy):
    """Left to the second walk or taken at once, the peak's figures are the same, bit for bit."""
    from conftest import random_trace
    trace = random_trace(300, seed=seed, streams=streams, max_size=8 << 20)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Replay, "PEAK_SHARE", 0.0)
        mp.setattr(Replay, "PEAK_ALLOWANCE", -1.0)
        later = replay(trace, policy)
    assert _figures(later) == _figures(_always(trace, policy))


@pytest.mark.parametrize("name", ["pools-mempool.bin", "pools-capture.bin"])
def test_shipped_traces_give_the_same_peak_state_either_way(name, never_afford):
    trace = Trace.load(os.path.join(ROOT, "traces", name))
    assert _figures(replay(trace, "torch")) == _figures(_always(trace, "torch"))
