"""Fidelity on the real traces in traces/: the models do what the recorded allocators did."""
import glob
import os

import numpy as np
import pytest

from allocsim import validate_trace
from allocsim.policies.torch import has_pool_events
from allocsim.replay import Replay
from allocsim.trace import ALLOC, Trace
from allocsim.trace import events as ev
from allocsim.report.text import validation_summary

from conftest import ROOT

RECORDED = sorted(p for p in glob.glob(os.path.join(ROOT, "traces", "*.bin"))
                  if Trace.load(p).meta.get("framework") in ("torch", "cupy"))
TORCH = [p for p in RECORDED if Trace.load(p).meta.get("framework") == "torch"]
POOLS = [p for p in TORCH if has_pool_events(Trace.load(p))]


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


@pytest.mark.parametrize("path", POOLS, ids=os.path.basename)
def test_private_pools_are_followed_and_needed(path):
    """The recordings with private pools (CUDA graphs, torch.compile reduce-overhead, MemPool) match with their
    pool events followed and nothing called unmodelled; without the pool events they do not match, so the match
    is the pools' doing."""
    v = validate_trace(path)
    text = validation_summary(v)
    assert v.match and v.pool_events and v.private_pool_segments and "not modelled" not in text, text
    t = Trace.load(path)
    rec = np.asarray(t.records)
    bare = Trace(rec[~np.isin(rec["kind"], ev.POOL)].copy(), t.meta, streams=t.streams, sites=t.sites,
                 labels=t.labels, path=t.path)
    assert not validate_trace(bare).match
