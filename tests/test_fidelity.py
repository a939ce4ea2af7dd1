"""Fidelity on the real traces in traces/: the models do what the recorded allocators did."""
import bisect
import glob
import os

import numpy as np
import pytest

from allocsim import validate_trace
from allocsim.replay import Replay, make_device
from allocsim.trace import ALLOC, SEGMENT_ALLOC, Trace

from conftest import ROOT

RECORDED = sorted(p for p in glob.glob(os.path.join(ROOT, "traces", "*.bin"))
                  if Trace.load(p).meta.get("framework") in ("torch", "cupy"))
TORCH = [p for p in RECORDED if Trace.load(p).meta.get("framework") == "torch"]

#: Pressure traces (issue 11) whose limits, cache releases or OOM the replay does not drive yet; a name
#: leaves these sets when its trace matches (strict: an unexpected pass fails, so it is not forgotten).
NOT_YET_VALIDATED = {"pressure-cupy-limit.bin", "pressure-empty-cache.bin", "pressure-fraction-oom.bin",
                     "pressure-fraction-retry.bin", "pressure-gc-threshold.bin", "pressure-maxsplit-cap.bin"}
NOT_YET_PLACED = {"pressure-empty-cache.bin", "pressure-fraction-retry.bin", "pressure-gc-threshold.bin",
                  "pressure-maxsplit-cap.bin"}


def _known(paths, not_yet):
    """``paths`` as parameters, those named in ``not_yet`` marked as the expected failures they are today."""
    mark = pytest.mark.xfail(strict=True, reason="SET_LIMIT / CACHE_RELEASE / OOM not replayed yet (issue 11)")
    return [pytest.param(p, marks=mark) if os.path.basename(p) in not_yet else p for p in paths]


@pytest.mark.parametrize("path", _known(RECORDED, NOT_YET_VALIDATED), ids=os.path.basename)
def test_validate_matches_every_recorded_trace(path):
    v = validate_trace(path)
    assert v.match, v.summary()
    assert v.recorded_events == v.model_events > 0


@pytest.mark.parametrize("path", _known([p for p in TORCH if "expandable" not in p], NOT_YET_PLACED),
                         ids=os.path.basename)
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
