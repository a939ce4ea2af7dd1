"""Re-run a recorded multi-process program under the setting `allocsim tune RUN --json` recommended, recorded again,
and set what tune predicted for each rank beside what each rank's allocator then did (issue 21).

    python3 benchmarks/gpu_ranks_rerun.py TUNE.json OUT.bin -- torchrun --standalone --nproc-per-node 2 train.py ...

The recommended ``conf`` line (``PYTORCH_ALLOC_CONF=...`` or ``unset ...``) becomes the program's environment; a
recommended cap becomes ``--fraction CAP/TOTAL --fraction-ranks all`` (examples/dist_train.py's). The program is
recorded with ``allocsim record -o OUT.bin``; then, per rank: predicted (the tune row of that rank) and measured (the
new trace's segment calls and peak reserved, which ``allocsim info`` reads from the recorded allocator's own
events). Prints a table and writes ``OUT.compare.json``.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys


def env_of(conf: str) -> dict:
    """The environment a recommended ``conf`` line sets: ``NAME=VALUE`` set, ``unset A B`` removed."""
    env = dict(os.environ)
    words = shlex.split(conf or "")
    if words[:1] == ["unset"]:
        for name in words[1:]:
            env.pop(name, None)
    else:
        for w in words:
            name, _, value = w.partition("=")
            env[name] = value
    return env


def measured(path: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "allocsim", "info", path, "--json"], capture_output=True, text=True)
    d = json.loads(out.stdout)
    up = d["upstream_segments"]
    return {"peak_reserved_bytes": up["peak_reserved_bytes"], "device_mallocs": up["segment_alloc"] + up["segment_map"],
            "device_frees": up["segment_free"] + up["segment_unmap"], "oom_events": d["oom_events"],
            "outside_peak": (d.get("device_memory") or {}).get("outside_peak")}


def main(argv: list[str]) -> int:
    tune_json, out, sep, *program = argv
    assert sep == "--", "usage: gpu_ranks_rerun.py TUNE.json OUT.bin -- PROGRAM ..."
    tuned = json.load(open(tune_json))
    rec = tuned.get("recommended")
    if not rec:
        print(f"{tune_json}: no setting fits every rank; nothing to re-run")
        return 1
    rows = [r["row"] for r in tuned["ranks"]]
    cap = rows[0].get("cap_bytes")
    if cap:
        total = rows[0]["capacity_bytes"] + (tuned["ranks"][0].get("outside_bytes") or 0)
        program += ["--fraction", f"{cap / total:.6f}", "--fraction-ranks", "all"]
    print(f"re-run under: {rec['conf']}" + (f" and a fraction {cap / total:.4f}" if cap else ""), flush=True)
    r = subprocess.run([sys.executable, "-m", "allocsim", "record", "--force", "-o", out, "--", *program],
                       env=env_of(rec["conf"]))
    print(f"re-run exit status {r.returncode}", flush=True)
    stem, ext = os.path.splitext(out)
    result = []
    for k, (rank, row) in enumerate(zip(tuned["ranks"], rows)):
        path = f"{stem}.rank{k}{ext}"
        got = measured(path) if os.path.exists(path) else None
        want = {key: row[key] for key in ("peak_reserved_bytes", "device_mallocs", "device_frees", "ooms")}
        result.append({"rank": k, "trace": path, "setting": row["setting"], "predicted": want, "measured": got})
        if got is None:
            print(f"rank {k}: no trace {path}")
            continue
        same = all(want[key] == got[key] for key in ("peak_reserved_bytes", "device_mallocs", "device_frees"))
        print(f"rank {k} ({row['setting']}): peak reserved predicted {want['peak_reserved_bytes']:,} measured "
              f"{got['peak_reserved_bytes']:,}; device mallocs/frees predicted {want['device_mallocs']}/"
              f"{want['device_frees']} measured {got['device_mallocs']}/{got['device_frees']}; "
              f"{'EXACT' if same else 'DIFFERENT'}; outside the allocator {got['outside_peak']}", flush=True)
    with open(f"{stem}.compare.json", "w") as f:
        json.dump({"recommended": rec, "ranks": result, "exit_status": r.returncode}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
