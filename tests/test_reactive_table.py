"""benchmarks/reactive_table.py, the predicted-vs-measured table of issue 28's GPU proof: which run it compares
with, how it counts the OOMs a run survived, and how it shows an error."""
from __future__ import annotations

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("reactive_table", os.path.join(ROOT, "benchmarks", "reactive_table.py"))
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)


def figures(**kw):
    base = {"cap_bytes": 0, "peak_reserved": 1000, "device_mallocs": 3, "device_frees": 1, "num_ooms": 0,
            "died": None}
    return {**base, **kw}


def write(folder, name, lines):
    (folder / name).write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_the_plain_run_is_the_one_measured_and_a_run_without_figures_is_left_out(tmp_path):
    write(tmp_path, "cudnn-cold-rec.json", [figures(peak_reserved=2)])
    write(tmp_path, "cudnn-cold-plain.json", [figures(peak_reserved=1)])
    write(tmp_path, "cudnn-warm-rec.json", [figures(peak_reserved=3)])     # no plain run: the recorded one
    (tmp_path / "cudnn-capcold-plain.json").write_text("")                  # killed before its line
    (tmp_path / "cudnn-cold-rec.bin").write_bytes(b"")                       # not a figures file
    runs = rt.measured_runs(str(tmp_path))
    assert {v: (how, m["peak_reserved"]) for v, (how, m) in runs["cudnn"].items()} == \
        {"cold": ("plain", 1), "warm": ("rec", 3)}


def test_survived_ooms_leave_out_the_one_that_ended_the_run():
    died = figures(cap_bytes=10, num_ooms=3, died="CUDA out of memory")
    line = rt.row("compile", "capcold", "plain", died,
                  {"peak_reserved_bytes": 1000, "device_mallocs": 3, "device_frees": 1, "caught_ooms": 2,
                   "ooms": 1, "completed": False}, "MATCH")
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "capcold, cap 10"
    assert cells[5] == "2 / 2 (exact)" and cells[6] == "OOM / OOM (exact)"


def test_errors_are_relative_for_bytes_and_differences_for_counts():
    assert rt.pair(5, 5) == "5 / 5 (exact)"
    assert rt.pair(1100, 1000, relative=True) == "1,100 / 1,000 (+10.0 %)"
    assert rt.pair(47, 284) == "47 / 284 (-237)"


def test_a_warm_run_without_a_warm_cache_replay_is_not_predicted():
    cells = [c.strip() for c in rt.row("compile", "warm", "plain", figures(), None, "MATCH").strip("|").split("|")]
    assert cells[2:7] == ["n/a"] * 5 and cells[7] == "MATCH"
