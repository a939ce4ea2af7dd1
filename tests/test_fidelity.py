"""Fidelity on the real traces in traces/: the models do what the recorded allocators did."""
import bisect
import glob
import os

import numpy as np
import pytest

from allocsim import validate_trace
from allocsim.replay import Replay, make_device
from allocsim.device import SimulatedDevice
from allocsim.trace import ALLOC, SEGMENT_ALLOC, Trace

from conftest import ROOT

RECORDED = sorted(p for p in glob.glob(os.path.join(ROOT, "traces", "*.bin"))
                  if Trace.load(p).meta.get("framework") in ("torch", "cupy"))
TORCH = [p for p in RECORDED if Trace.load(p).meta.get("framework") == "torch"]


@pytest.mark.parametrize("path", RECORDED, ids=os.path.basename)
def test_validate_matches_every_recorded_trace(path):
    v = validate_trace(path)
    assert v.match, v.summary()
    assert v.recorded_events == v.model_events > 0


@pytest.mark.parametrize("path", [p for p in TORCH if "expandable" not in p], ids=os.path.basename)
def test_torch_model_places_every_block_where_pytorch_did(path):
    """Each block lands in the same segment (by creation order) at the same offset."""
    t = Trace.load(path)
    seg = np.flatnonzero(t.kind == SEGMENT_ALLOC)
    rec_bases = t.addr[seg].tolist()
    order = np.argsort(rec_bases)
    sorted_bases = np.asarray(rec_bases)[order]
    dev = make_device(t, "torch", capacity=None)
    model_bases = []
    malloc = dev.malloc

    def recording_malloc(n):
        a = malloc(n)
        if a is not None:
            model_bases.append(a)
        return a
    dev.malloc = recording_malloc
    bad = []

    def check(idx, kind, i, h):
        if bad or kind != ALLOC:
            return
        addr = pol.block(h)[0]
        mb = sorted(model_bases)
        j = bisect.bisect_right(mb, addr) - 1
        r = bisect.bisect_right(sorted_bases, int(t.addr[idx])) - 1
        if (model_bases.index(mb[j]), addr - mb[j]) != (int(order[r]), int(t.addr[idx]) - int(sorted_bases[r])):
            bad.append(idx)
    r = Replay(t, "torch", device=dev, observer=check)
    pol = r.policy
    r.run()
    assert not bad, f"first misplaced block at event {bad[0]}"


def test_device_hands_out_recorded_addresses_when_they_fit():
    hints = [(1000, 0x5000), (2000, 0x1000), (500, 0x5100)]
    d = SimulatedDevice(address_hints=hints)
    assert d.malloc(1000) == 0x5000
    assert d.malloc(2000) == 0x1000
    fresh = d.malloc(500)                  # 0x5100 overlaps the live range at 0x5000: a fresh address
    assert fresh not in (0x5100,) and fresh >= 0x5100 + 500
    d.free(0x5000, 1000)
    assert d.malloc(7) not in (0x5000, 0x1000, fresh)   # no more hints: fresh addresses, never overlapping
