"""Replay results on every shipped trace against stored ones, field by field.

The stored results (tests/golden/*.json) were made by the code before the flat-memory
rework; any change to a replay's figures shows up here. Only wall-clock fields are
left out. Regenerate (only when a change of results is intended) with
``python tests/test_golden.py``.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import allocsim  # noqa: E402
from allocsim.compiled import COMPILED_MODULES  # noqa: E402

GOLDEN = os.path.join(ROOT, "tests", "golden")
TRACES = sorted(glob.glob(os.path.join(ROOT, "traces", "*.bin")))
POLICIES = ["split", "torch", "bestfit", "binned", "cupy", "knet", "simple"]
#: Those the compiled build compiles: the only ones whose code differs between the builds (``--compiled-policies-only``
#: replays these alone, in tests/test_compiled.py's run of the other build).
COMPILED_POLICIES = [p for p in POLICIES if allocsim.policies.get(p).__module__ in COMPILED_MODULES]
WALL_CLOCK = ("replay_seconds", "load_seconds")
#: Below LOAD: every policy runs out; --keep-going records each OOM.
TIGHT = 0.9
LONG = 40


def adds_up(b: dict, reserved: int) -> bool:
    """A free breakdown taken at ``reserved`` bytes: four parts, none negative, adding up to reserved - requested."""
    parts = [b[k] for k in ("hard", "soft", "stream", "rounding")]
    return b["reserved"] == reserved and min(parts) >= 0 and sum(parts) == reserved - b["requested"]


#: Fields added after the stored results were made, each with its check (``value, the result's fields``): a
#: result may carry them, and nothing else new. No shipped trace holds an OOM record: none serves one.
ADDED = {"ooms_avoided": lambda v, d: v == [],
         "breakdown_at_peak": lambda v, d: v is None or adds_up(v, d["peak_reserved_bytes"]),
         "caught_ooms": lambda v, d: v == 0, "caught_oom_events": lambda v, d: v == [],   # no shipped trace flags one
         "unwound_blocks": lambda v, d: v == 0, "skipped_allocs": lambda v, d: v == 0}    # nor holds a try
#: The same for each OOM record's fields (taken out before a long list is digested).
OOM_ADDED = {"breakdown": lambda v, o: v is None or adds_up(v, o["reserved_bytes"]),
             "caught": lambda v, o: v is False, "scope": lambda v, o: v is None}


def results(path: str, policies=POLICIES) -> dict:
    """``{case: replay JSON}`` for one trace: each policy x eager/gc x unlimited/tight cap, plus timelines."""
    t = allocsim.Trace.load(path)
    out = {}
    for pol in policies:
        for rt in ("eager", "gc"):
            for cap in (None, int(t.load_bytes * TIGHT)):
                r = allocsim.replay(t, pol, runtime=rt, cap=cap, keep_going=cap is not None)
                out[f"{pol}/{rt}/{'tight' if cap else 'none'}"] = _fields(r.to_dict())
    for pol in [p for p in ("split", "bestfit") if p in policies]:
        out[f"{pol}/eager/timeline"] = _fields(allocsim.replay(t, pol, timeline=True).to_dict(timeline=True))
    return out


def _fields(d: dict) -> dict:
    """The result as JSON would carry it, less the wall-clock fields; long lists as a digest."""
    d = json.loads(json.dumps(d))
    for k in WALL_CLOCK:
        d.pop(k)
    for o in d["oom_events"]:            # added after most stored results: kept only where it says something
        if o["recorded"] is False:
            del o["recorded"]
        for k, check in OOM_ADDED.items():
            assert check(o.pop(k), o), f"OOM at event {o['event']}: field {k!r} fails its check"
    if d.get("trace"):
        d["trace"] = os.path.basename(d["trace"])       # the checkout's folder is not a result
    return {k: _digest(v) for k, v in d.items()}


def _digest(v):
    """A list (or a dict of lists) longer than `LONG`: its length, first entries and a hash of all of it."""
    if isinstance(v, dict):
        return {k: _digest(x) for k, x in v.items()}
    if isinstance(v, list) and len(v) > LONG:
        blob = json.dumps(v, sort_keys=True).encode()
        return {"len": len(v), "head": v[:10], "sha256": hashlib.sha256(blob).hexdigest()}
    return v


def golden_path(trace: str) -> str:
    return os.path.join(GOLDEN, os.path.basename(trace)[: -len(".bin")] + ".json")


@pytest.mark.parametrize("trace", TRACES, ids=os.path.basename)
def test_replays_match_stored_results(trace, request):
    policies = COMPILED_POLICIES if request.config.getoption("--compiled-policies-only") else POLICIES
    with open(golden_path(trace)) as f:
        want = {case: fields for case, fields in json.load(f).items() if case.split("/")[0] in policies}
    got = results(trace, policies)
    assert want and sorted(got) == sorted(want)
    for case, fields in want.items():
        for k, check in ADDED.items():
            if k not in fields:
                assert check(got[case].pop(k), got[case]), f"{os.path.basename(trace)} {case}: field {k!r} fails its check"
        assert sorted(got[case]) == sorted(fields), case
        for k, v in fields.items():
            assert got[case][k] == v, f"{os.path.basename(trace)} {case}: field {k!r} changed"


def test_every_shipped_trace_has_stored_results():
    assert TRACES and all(os.path.exists(golden_path(t)) for t in TRACES)


if __name__ == "__main__":
    os.makedirs(GOLDEN, exist_ok=True)
    for t in TRACES:
        with open(golden_path(t), "w") as f:
            json.dump(results(t), f, separators=(",", ":"), sort_keys=True)
        print(golden_path(t))
