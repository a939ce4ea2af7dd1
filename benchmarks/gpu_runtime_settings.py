"""What PyTorch accepts at run time, for `tune`'s Python form (docs/recording.md, issue 32 item 4): one JSON object.

``settings`` (default): with segments already on the device, each option given to
``torch.cuda.memory._set_allocator_settings`` (accepted, or PyTorch's error); whether segments made after
``expandable_segments:True`` are expandable and the earlier ones stay as they were; which options a later string
that leaves them out resets or keeps; and whether `allocsim.frameworks.torch.runtime_text` of a setting puts
exactly that setting in force (read back from ``_snapshot()["allocator_settings"]``).
``fraction``: `fraction_for(1 GiB, total)` given to ``set_per_process_memory_fraction``: 1 GiB in one block fits,
2 MiB more does not (PyTorch allows ``int(f * total)`` bytes: the cap to the byte).
"""
from __future__ import annotations

import json
import sys

import torch

from allocsim.frameworks import torch as ts

MiB = 1 << 20


def settings_in_force() -> dict:
    return torch.cuda.memory._snapshot().get("allocator_settings", {})


def try_setting(text: str):
    try:
        torch.cuda.memory._set_allocator_settings(text)
        return "accepted"
    except Exception as e:          # noqa: BLE001 - PyTorch's own refusal is the finding
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def segments() -> list:
    return [(s["address"], s["total_size"], s.get("is_expandable")) for s in torch.cuda.memory._snapshot()["segments"]]


#: The structured fields of a snapshot's ``allocator_settings`` (the values in force, not the last string given).
STRUCTURED = ("max_split_size", "garbage_collection_threshold", "expandable_segments", "roundup_power2_divisions")
DEFAULTS = {"max_split_size_mb": None, "garbage_collection_threshold": 0.0, "expandable_segments": False}


def same_in_force(values: dict, in_force: dict) -> dict:
    """Compare the options ``values`` select with those the snapshot's structured fields say are in force, both read
    by `settings_from_trace` (the string left out: it is the one just given); a field the snapshot lacks is not
    compared."""
    got = ts.settings_from_trace({"allocator_settings": {k: in_force[k] for k in STRUCTURED if k in in_force}})
    field = {"max_split_size_mb": "max_split_size", "garbage_collection_threshold": "garbage_collection_threshold",
             "expandable_segments": "expandable_segments", "roundup_power2_divisions": "roundup_power2_divisions"}
    wanted = {**DEFAULTS, **{k: v for k, v in values.items() if k in field}}
    keys = [k for k in field if field[k] in in_force]
    differ = {k: [wanted.get(k), got.get(k)] for k in keys if wanted.get(k) != got.get(k)}
    return {"compared": keys, "differ": differ}


def probe_settings() -> dict:
    out = {"torch": torch.__version__, "initial": settings_in_force()}
    held = [torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")]
    before = segments()
    out["accepted_with_segments_live"] = {t: try_setting(t) for t in (
        "max_split_size_mb:128", "max_non_split_rounding_mb:64", "roundup_power2_divisions:4",
        "garbage_collection_threshold:0.6", "backend:native", "backend:cudaMallocAsync", "expandable_segments:True")}
    held.append(torch.empty(64 * MiB, dtype=torch.uint8, device="cuda"))
    after = segments()
    out["expandable_segments_at_run_time"] = {"segments_before": before, "segments_after": after,
                                              "earlier_unchanged": all(s in after for s in before)}
    try_setting("max_split_size_mb:128,max_non_split_rounding_mb:64,expandable_segments:True,"
                "garbage_collection_threshold:0.6,roundup_power2_divisions:4")
    try_setting("roundup_power2_divisions:2")
    out["after_a_string_naming_one_option"] = settings_in_force()
    checks = []
    for conf in ("expandable_segments:True,roundup_power2_divisions:4", "max_split_size_mb:256",
                 "max_split_size_mb:128,garbage_collection_threshold:0.6", ""):
        values = ts.parse_conf(conf)
        text = ts.runtime_text(values)
        result = try_setting(text)
        checks.append({"setting": conf, "runtime_text": text, "result": result, "in_force": settings_in_force(),
                       **same_in_force(values, settings_in_force())})
        checks[-1]["ok"] = result == "accepted" and not checks[-1]["differ"]
    out["runtime_text_selects_the_setting"] = checks
    out["ok"] = all(c["ok"] for c in checks)
    del held
    return out


def probe_fraction() -> dict:
    total = torch.cuda.get_device_properties(0).total_memory
    cap = 1 << 30
    f = ts.fraction_for(cap, total)
    torch.cuda.set_per_process_memory_fraction(f)
    out = {"total": total, "cap": cap, "fraction": repr(f), "int_f_total": int(f * total)}
    a = torch.empty(cap, dtype=torch.uint8, device="cuda")
    out["cap_in_one_block"] = "fits"
    try:
        b = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
        out["two_mib_more"] = "fits (the fraction allows more than the cap)"
        del b
    except torch.cuda.OutOfMemoryError:
        out["two_mib_more"] = "OOM (as it should: the cap is the limit)"
    del a
    out["ok"] = out["int_f_total"] == cap and out["two_mib_more"].startswith("OOM")
    return out


if __name__ == "__main__":
    res = probe_fraction() if sys.argv[1:] == ["fraction"] else probe_settings()
    print(json.dumps(res, indent=1, default=str))
    sys.exit(0 if res["ok"] else 1)
