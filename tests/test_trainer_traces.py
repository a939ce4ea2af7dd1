"""The traces recorded where people train (traces/trainers/, traces/README.md, issue 32): through the Lightning and
Hugging Face callbacks, `allocsim.recording` and launchers, on an H200. Each validates as it did there, and the
trainers' phases are where `info` reads them."""
from __future__ import annotations

import os

import pytest

from allocsim.trace import Trace
from allocsim.trace.phases import phase_shares
from allocsim.search.validate import validate
from conftest import ROOT

HERE = os.path.join(ROOT, "traces", "trainers")
MATCH = ("lightning", "hf", "notebook", "dist.rank0", "dist.rank1", "accelerate")
#: the phases each trainer's callback marked: name -> scopes
PHASES = {"lightning": {"train": 12, "eval": 3, "checkpoint": 2}, "hf": {"train": 12, "eval": 3, "checkpoint": 3},
          "accelerate": {"train": 8, "eval": 2, "checkpoint": 2}}


@pytest.mark.parametrize("name", MATCH)
def test_each_recording_validates(name):
    v = validate(os.path.join(HERE, name + ".bin"))
    assert v.match, [c for c in v.checks if not c["ok"]]


def test_a_late_start_says_what_it_lacks():
    """Started after the model was on the GPU: the blocks live then are seeded as PRE_EXISTING and the metadata says
    what is missing; the model is not seeded with the recorded layout (unseeded), as validate says."""
    t = Trace.load(os.path.join(HERE, "notebook-late.bin"))
    assert t.meta["started_late"]["missing"] and t.meta["initial_segments"]
    v = validate(t)
    assert v.pre_existing > 0 and not v.seeded


@pytest.mark.parametrize("name", sorted(PHASES))
def test_the_trainers_phases_are_in_the_trace(name):
    t = Trace.load(os.path.join(HERE, name + ".bin"))
    scopes = {name: p["scopes"] for name, p in phase_shares(t)["phases"].items()}
    assert scopes == PHASES[name]
