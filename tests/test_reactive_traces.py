"""Programs that react to memory, recorded on an H200 (traces/reactive/, benchmarks/gpu_reactive.sh, issue 28): a
torch.compile(mode="reduce-overhead") CNN cold and warm, a cuDNN-benchmark ResNet-50 and a loop that halves its
batch on an OOM, each uncapped and under a cap. Each recording validates, and the cold uncapped recording predicts
the other runs as the README's table says: exact where the program's requests do not change (the compiled
program's warm run with --warm-cache, its capped cold run that dies, the cuDNN run's survived OOM), within the
measured spread where cuDNN's timed plan choice moves them."""
from __future__ import annotations

import glob
import json
import os

import pytest

from allocsim.engine.replay import replay
from allocsim.trace import Trace
from allocsim.trace.phases import warm_view
from allocsim.search.validate import validate
from conftest import ROOT

HERE = os.path.join(ROOT, "traces", "reactive")
RECORDINGS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, "*-rec.bin")))


def measured(name: str) -> dict:
    """The program's own memory_stats() figures of run ``name`` (``compile-warm``), without the recorder."""
    with open(os.path.join(HERE, f"{name}-plain.json")) as f:
        return json.load(f)


def predicted(program: str, cap: int | None = None, warm: bool = False):
    t = Trace.load(os.path.join(HERE, f"{program}-cold-rec.bin"))
    return replay(warm_view(t) if warm else t, "torch", cap=cap, keep_going=False)


@pytest.mark.parametrize("name", RECORDINGS)
def test_each_recording_validates(name):
    v = validate(os.path.join(HERE, name))
    assert v.match, [c for c in v.checks if not c["ok"]]


def test_the_warm_run_of_a_compiled_program_from_its_cold_recording():
    m = measured("compile-warm")
    r = predicted("compile", warm=True)
    assert (r.peak_reserved_bytes, r.device_mallocs, r.device_frees) == (m["peak_reserved"], m["device_mallocs"],
                                                                       m["device_frees"])


def test_under_the_cap_the_cold_compiled_run_dies_and_the_warm_one_lives():
    m = measured("compile-capcold")
    r = predicted("compile", cap=m["cap_bytes"])
    assert m["died"] and r.ooms and (r.peak_reserved_bytes, r.device_mallocs) == (m["peak_reserved"],
                                                                                  m["device_mallocs"])
    w = measured("compile-capwarm")
    r = predicted("compile", cap=w["cap_bytes"], warm=True)
    assert not w["died"] and not r.ooms and r.peak_reserved_bytes == w["peak_reserved"]


def test_cudnn_benchmark_survives_its_halved_workspace_under_the_cap():
    m = measured("cudnn-capcold")
    r = predicted("cudnn", cap=m["cap_bytes"])
    assert not r.ooms and r.caught_ooms == m["num_ooms"] == 1
    assert abs(r.peak_reserved_bytes - m["peak_reserved"]) <= 0.001 * m["peak_reserved"]


def test_the_backoff_loop_lives_under_the_cap():
    """Its requests change after the OOM (a halved batch the trace does not hold): the replay lives and peaks where
    the program did, and counts more survived OOMs (each later step's full batch fails again)."""
    m = measured("backoff-capcold")
    r = predicted("backoff", cap=m["cap_bytes"])
    assert not r.ooms and r.caught_ooms >= m["program_caught_ooms"] == 1
    assert r.peak_reserved_bytes == m["peak_reserved"]
