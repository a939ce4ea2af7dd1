"""Fidelity on the real traces in traces/: the models do what the recorded allocators did."""
import glob
import os

import pytest

from allocsim import validate_trace
from allocsim.replay import Replay
from allocsim.trace import ALLOC, Trace
from allocsim.report.text import validation_summary

from conftest import ROOT

RECORDED = sorted(p for p in glob.glob(os.path.join(ROOT, "traces", "*.bin"))
                  if Trace.load(p).meta.get("framework") in ("torch", "cupy"))
TORCH = [p for p in RECORDED if Trace.load(p).meta.get("framework") == "torch"]


@pytest.mark.parametrize("path", RECORDED, ids=os.path.basename)
def test_validate_matches_every_recorded_trace(path):
    v = validate_trace(path)
    assert v.match, validation_summary(v)
    assert v.recorded_events == v.model_events > 0


@pytest.mark.parametrize("path", [p for p in TORCH if "expandable" not in p], ids=os.path.basename)
def test_torch_model_places_every_block_where_pytorch_did(path):
    """Each block lands at the very address PyTorch gave it (the device hands out the recorded segment
    addresses; the model's best fit, splits and cache releases do the rest)."""
    t = Trace.load(path)
    bad = []

    def check(idx, kind, i, h):
        if not bad and kind == ALLOC and r.policy.block(h)[0] != int(t.addr[idx]):
            bad.append(idx)
    r = Replay(t, "torch", capacity=None, observer=check)
    r.run()
    assert not bad, f"first misplaced block at event {bad[0]}"


CUPY = [p for p in RECORDED if Trace.load(p).meta.get("framework") == "cupy"]


@pytest.mark.parametrize("path", CUPY, ids=os.path.basename)
def test_cupy_model_places_every_block_where_cupy_did(path):
    """Each block lands at the address CuPy's pool gave it: the device hands out the recorded segment addresses,
    the model's best fit, splits, merges and releases do the rest, and where free chunks tie the model takes
    the one the recorded run took (CuPy's own tie order is not repeatable: docs/models/cupy.md, "Ties")."""
    t = Trace.load(path)
    bad = []

    def check(idx, kind, i, h):
        if not bad and kind == ALLOC and h is not None and r.policy.block(h)[0] != int(t.addr[idx]):
            bad.append(idx)
    r = Replay(t, "cupy", capacity=None, observer=check)
    r.run()
    assert not bad, f"first misplaced block at event {bad[0]}"
