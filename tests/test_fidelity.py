"""Fidelity on the real traces in traces/: the models do what the recorded allocators did."""
import glob
import os

import numpy as np
import pytest

from allocsim import validate_trace
from allocsim.policies.cupy import RecordedPlaces
from allocsim.policies.torch import has_pool_events
from allocsim.engine.replay import Replay, make_device
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


CUPY = [p for p in RECORDED if Trace.load(p).meta.get("framework") == "cupy"]


@pytest.mark.parametrize("path", CUPY, ids=os.path.basename)
def test_cupy_model_places_every_block_where_cupy_did(path):
    """Each block lands where CuPy's pool put it: in the segment made at the same turn (the k-th device
    allocation), at the same offset. The model's best fit, splits, merges and releases do that, and where free
    chunks tie it takes the one the recorded run took (CuPy's own tie order is not repeatable:
    docs/models/cupy.md, "Ties"). Placement by segment and offset, not address: the device may place a
    segment elsewhere than CUDA did (its driver placement is a model too)."""
    t = Trace.load(path)
    recorded = RecordedPlaces(t)
    dev = make_device(t, "cupy", capacity=None)
    made, malloc = [], dev.malloc                   # (address, bytes) of each device allocation the model made

    def counted(n):
        addr = malloc(n)
        if addr is not None:
            made.append((addr, n))
        return addr
    dev.malloc = counted
    bad = []

    def check(idx, kind, i, h):
        if bad or kind != ALLOC or h is None:
            return
        addr = r.policy.block(h)[0]
        k = max(j for j, (base, n) in enumerate(made) if base <= addr < base + n)
        if (k, addr - made[k][0]) != (recorded.segment[idx], recorded.offset[idx]):
            bad.append(idx)
    r = Replay(t, "cupy", device=dev, observer=check)
    r.run()
    assert not bad, f"first misplaced block at event {bad[0]}"


RANKS = sorted(glob.glob(os.path.join(ROOT, "traces", "runs", "*.rank*.bin")))


@pytest.mark.parametrize("path", RANKS, ids=os.path.basename)
def test_validate_matches_every_rank_of_the_recorded_runs(path):
    """Each rank's trace of the NCCL runs on two GPUs (traces/runs/) does what its rank's allocator did."""
    v = validate_trace(path)
    assert v.match, validation_summary(v)
    assert v.recorded_events == v.model_events > 0


def test_the_recorded_runs_are_shipped_with_every_rank():
    """Five runs of two ranks each, each rank on its own device and saying which rank it is."""
    runs = {}
    for p in RANKS:
        meta = Trace.load(p).meta
        runs.setdefault(os.path.basename(p).split(".rank")[0], set()).add((meta["rank"], meta["world_size"]))
    assert runs and all(ranks == {(0, 2), (1, 2)} for ranks in runs.values()), runs
    assert len(runs) == 5
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
