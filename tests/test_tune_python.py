"""`tune`'s advice in Python for a process already running (docs/recording.md): the settings string for
``torch.cuda.memory._set_allocator_settings`` and the memory fraction of a cap."""
from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from allocsim.frameworks import torch as ts
from conftest import run_cli
from test_tune import torch_trace

MiB = 1 << 20
DEFAULTS = {"expandable_segments": False, "max_split_size_mb": None, "max_non_split_rounding_mb": 20,
            "roundup_power2_divisions": None, "garbage_collection_threshold": 0.0}
#: what PyTorch's run-time parser (AcceleratorAllocatorConfig::parseArgs) resets when a string leaves it out
RESET = ("max_split_size_mb", "roundup_power2_divisions", "garbage_collection_threshold")


def pytorch_applies(before: dict, text: str) -> dict:
    """The options in force after ``_set_allocator_settings(text)`` with ``before`` in force, as PyTorch 2.11's
    parser does it: the reset options back to their defaults, then the named ones set; the others kept."""
    after = {**before, **{k: DEFAULTS[k] for k in RESET}}
    after.update(ts.parse_conf(text))
    return after


options = st.fixed_dictionaries({}, optional={
    "expandable_segments": st.booleans(),
    "max_split_size_mb": st.sampled_from([20, 128, 512]),
    "max_non_split_rounding_mb": st.sampled_from([20, 64, 256]),
    "roundup_power2_divisions": st.sampled_from(["4", "[256:1,512:2,>:8]"]).map(ts.parse_divisions),
    "garbage_collection_threshold": st.sampled_from([0.5, 0.8]),
    "trace_settings": st.booleans()})


@settings(max_examples=60, deadline=None)
@given(before=options, values=options)
def test_the_settings_string_selects_the_setting_whatever_was_in_force(before, values):
    text = ts.python_lines(values, None, None)["python"].split('"')[1]
    in_force = pytorch_applies({**DEFAULTS, **ts.parse_conf(ts.conf_text(before))}, text)
    wanted = {**DEFAULTS, **{k: v for k, v in values.items() if k != "trace_settings"}}
    assert in_force == wanted


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1 << 30, 200 << 30), share=st.floats(0.01, 0.99))
def test_the_fraction_allows_the_cap_to_the_byte(total, share):
    cap = int(total * share)
    lines = ts.python_lines({}, cap, total)
    written = lines["python_fraction"].split("(")[1].rstrip(")")
    assert int(float(written) * total) == cap          # PyTorch: allowed = size_t(fraction * total)
    assert float(written) == lines["fraction"]


def test_tune_json_carries_the_python_forms(tmp_path):
    steps = [s for n in range(100, 110) for s in (("a", n * MiB), ("f", 0))]
    path = torch_trace(str(tmp_path / "grow.bin"), steps, total_memory=1 << 30)
    r = run_cli("tune", path, "--cap", "512MiB", "--no-fit", "--max-replays", "5", "--json")
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["recommended"]
    assert best["python"].startswith('torch.cuda.memory._set_allocator_settings("')
    assert best["python_fraction"] == "torch.cuda.set_per_process_memory_fraction(0.5)" and best["fraction"] == 0.5
    text = run_cli("tune", path, "--cap", "512MiB", "--no-fit", "--max-replays", "5").stdout
    assert "  in a running Python process (a notebook):" in text and "set_per_process_memory_fraction(0.5)" in text
