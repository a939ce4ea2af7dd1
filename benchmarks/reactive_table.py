"""Predicted vs measured for the reactive programs (issue 28), as a markdown table.

Usage: ``python benchmarks/reactive_table.py DIR`` on the unpacked output of ``benchmarks/gpu_reactive.sh`` (or of
``gpu_reactive_explore.sh``). DIR holds, per program P (``compile``, ``cudnn``, ``backoff``) and run variant V
(``cold``, ``warm1`` — the first run after a cold one —, ``warm``, ``capcold``, ``capwarm``; the exploration's
``cap``/``cap2`` are capped cold runs; a variant naming ``warm`` is predicted with ``--warm-cache``):
``P-V-plain.json`` (the program's own ``REACTIVE`` line, run without the recorder), ``P-V-rec.json`` and
``P-V-rec.bin`` (the same run recorded) and ``P-V-rec.validate.txt``.

Every prediction comes from one recording, ``P-cold-rec.bin`` (cold cache, no cap): ``allocsim replay REC
--policy torch [--cap CAP] [--warm-cache] --json``, CAP the capped run's own ``cap_bytes``; ``--warm-cache`` for
the warm runs ("n/a" when this allocsim has no such option). It is compared with the plain run (the recorded
one when there is no plain run): peak reserved bytes, cudaMalloc/cudaFree counts, OOMs survived (measured: the
allocator's ``num_ooms`` less the one that ended the run; predicted: the replay's ``caught_ooms``) and how the
run ended. The last column is the verdict of ``allocsim validate`` on that run's own recording.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_FILE = re.compile(r"^(?P<program>[a-z]+)-(?P<variant>[a-z0-9]+)-(?P<how>plain|rec)\.json$")
#: Variants in table order (others follow, sorted).
ORDER = ("cold", "warm1", "warm", "capcold", "cap", "cap2", "capwarm")


def measured_runs(folder: str) -> dict:
    """``{program: {variant: (how, figures)}}``: each run's REACTIVE figures, the plain run's where there is one."""
    runs: dict = {}
    for name in sorted(os.listdir(folder)):
        m = RUN_FILE.match(name)
        if not m:
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                figures = json.loads(f.read().strip().splitlines()[-1])
        except (ValueError, IndexError, OSError):
            continue        # a run that printed no REACTIVE line (killed, crashed): nothing measured
        slot = runs.setdefault(m["program"], {})
        if m["how"] == "plain" or m["variant"] not in slot:
            slot[m["variant"]] = (m["how"], figures)
    return runs


def variant_key(variant: str):
    return (ORDER.index(variant) if variant in ORDER else len(ORDER), variant)


def has_warm_cache() -> bool:
    """Does this allocsim's ``replay`` take ``--warm-cache`` (being added by another change)?"""
    out = subprocess.run([sys.executable, "-m", "allocsim", "replay", "--help"], capture_output=True, text=True,
                         env=_env())
    return "--warm-cache" in out.stdout


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


def predict(recording: str, cap: int, warm: bool) -> dict:
    """The replay's JSON (``error`` instead when it printed none)."""
    cmd = [sys.executable, "-m", "allocsim", "replay", recording, "--policy", "torch", "--json"]
    cmd += ["--cap", str(cap)] if cap else []
    cmd += ["--warm-cache"] if warm else []
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {"error": (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]}


def compiles(recording: str) -> bool:
    """Whether the recording holds compile or autotune phases: a later run of a program without them (cuDNN,
    back-off) keeps nothing between processes, so it is predicted as the first run is, without ``--warm-cache``."""
    sys.path.insert(0, ROOT)
    from allocsim.trace import Trace
    from allocsim.trace.phases import cold_spans
    return len(cold_spans(Trace.load(recording))) > 0


def verdict(folder: str, program: str, variant: str) -> str:
    path = os.path.join(folder, f"{program}-{variant}-rec.validate.txt")
    if not os.path.exists(path):
        return "-"
    with open(path) as f:
        found = re.findall(r"^verdict: (\S+)", f.read(), re.M)
    return found[-1] if found else "no verdict"


def pair(pred: int, meas: int, *, relative: bool = False) -> str:
    """``predicted / measured``, then ``exact`` or the error (relative for bytes, a difference for counts)."""
    if pred == meas:
        return f"{pred:,} / {meas:,} (exact)"
    if relative and meas:
        return f"{pred:,} / {meas:,} ({100 * (pred - meas) / meas:+.1f} %)"
    return f"{pred:,} / {meas:,} ({pred - meas:+,})"


def row(program: str, variant: str, how: str, m: dict, p: dict | None, check: str) -> str:
    cap = m.get("cap_bytes") or 0
    run = f"{variant}, " + (f"cap {cap:,}" if cap else "no cap")
    if how != "plain":
        run += " (recorded run)"
    meas_survived = m["num_ooms"] - (1 if m.get("died") else 0)
    meas_end = "OOM" if m.get("died") else "ok"
    if p is None:
        cells = ["n/a"] * 5
    elif "error" in p:
        cells = [f"replay failed: {p['error']}"] + [""] * 4
    else:
        pred_end = "OOM" if p.get("ooms") or not p.get("completed", True) else "ok"
        cells = [pair(p["peak_reserved_bytes"], m["peak_reserved"], relative=True),
                 pair(p["device_mallocs"], m["device_mallocs"]), pair(p["device_frees"], m["device_frees"]),
                 pair(p.get("caught_ooms", 0), meas_survived),
                 f"{pred_end} / {meas_end}" + (" (exact)" if pred_end == meas_end else "")]
    return "| " + " | ".join([program, run, *cells, check]) + " |"


def table(folder: str) -> list[str]:
    warm_ok = has_warm_cache()
    lines = ["| program | run | peak reserved, predicted / measured | cudaMalloc | cudaFree | OOMs survived "
             "| end | own recording validates |", "|" + "---|" * 8]
    for program, variants in sorted(measured_runs(folder).items()):
        recording = os.path.join(folder, f"{program}-cold-rec.bin")
        cached = os.path.exists(recording) and compiles(recording)
        for variant in sorted(variants, key=variant_key):
            how, m = variants[variant]
            warm = "warm" in variant and cached
            if not os.path.exists(recording):
                p = {"error": f"no {os.path.basename(recording)}"}
            else:
                p = predict(recording, m.get("cap_bytes") or 0, warm) if (warm_ok or not warm) else None
            lines.append(row(program, variant, how, m, p, verdict(folder, program, variant)))
    lines.append("")
    lines.append("Predicted: `allocsim replay P-cold-rec.bin --policy torch [--cap CAP] [--warm-cache]` "
                 "(the cold, uncapped recording; --warm-cache for a warm run of a program that compiles: one that "
                 "does not keeps nothing between processes); measured: the program's own torch.cuda.memory_stats() "
                 "without the recorder." + ("" if warm_ok else " Warm predictions n/a: this allocsim's replay "
                                                               "has no --warm-cache."))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", help="the unpacked output of benchmarks/gpu_reactive.sh")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.folder):
        print(f"reactive_table: {a.folder}: not a folder", file=sys.stderr)
        return 2
    print("\n".join(table(a.folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
