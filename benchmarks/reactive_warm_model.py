"""What a warm compile cache leaves out, measured from a cold run's snapshot (issue 28).

Usage: ``python benchmarks/reactive_warm_model.py COLD.pickle`` — a memory snapshot of a cold
``torch.compile`` run taken with C++ and Python stacks (``examples/reactive_compile.py --snapshot``). Each
allocation is put in a phase by its Python frames: *compile* (inductor's joint-graph passes: ``pad_mm``'s
matmul benchmarks, the attention patterns' example tensors, constant folding) or *autotune*
(``triton_heuristics``: ``CachingAutotuner`` benchmarking each config at a kernel's first launch), else *kept*.
The snapshot is imported and replayed with the torch policy four times, dropping nothing, either phase, or both
(an allocation dropped takes its frees with it). On the H200 run of ``gpu_reactive_explore.sh`` dropping both
left 299 allocations and reproduced the warm run's peak reserved, cudaMalloc and cudaFree exactly.
"""
from __future__ import annotations

import collections
import os
import pickle
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from allocsim import Trace, import_trace  # noqa: E402
from allocsim.engine import replay
from allocsim.trace import events as ev  # noqa: E402

#: Phase -> file names in an allocation's Python frames that put it there (checked in this order).
PHASES = {"autotune": ("triton_heuristics.py",), "compile": ("pad_mm.py", "fuse_attention.py", "constant_folding.py")}


def phase_of(entry: dict) -> str:
    files = [f.get("filename", "") for f in entry.get("frames") or [] if f.get("filename", "").endswith(".py")]
    for phase, names in PHASES.items():
        if any(os.path.basename(f) in names for f in files):
            return phase
    return "kept"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    with open(argv[0], "rb") as f:
        snapshot = pickle.load(f)
    entries = [e for dev in snapshot.get("device_traces", []) for e in dev if e.get("action") == "alloc"]
    phases = [phase_of(e) for e in entries]
    with tempfile.TemporaryDirectory() as tmp:
        import_trace(argv[0], os.path.join(tmp, "cold.bin"))
        trace = Trace.load(os.path.join(tmp, "cold.bin"))
        r = trace.records
        allocs = np.flatnonzero(r["kind"] == ev.ALLOC)
        if len(allocs) != len(entries):
            print(f"{argv[0]}: {len(entries)} alloc entries, the imported trace has {len(allocs)} (one device only)",
                  file=sys.stderr)
            return 2
        print(f"{argv[0]}: {dict(collections.Counter(phases))}")
        print("| dropped | allocations | peak reserved | cudaMalloc | cudaFree | peak allocated |\n|---|---|---|---|---|---|")
        for drop in ((), ("autotune",), ("compile",), ("compile", "autotune")):
            ids = [int(r["id"][i]) for i, p in zip(allocs, phases) if p in drop]
            gone = np.isin(r["id"], ids) & np.isin(r["kind"], [ev.ALLOC, ev.FREE, ev.FREE_REQUESTED])
            kept = Trace(r[~gone], trace.meta, streams=trace.streams, sites=trace.sites, labels=trace.labels)
            res = replay(kept, "torch")
            print(f"| {' + '.join(drop) or 'nothing'} | {len(allocs) - len(ids):,} | {res.peak_reserved_bytes:,} "
                  f"| {res.device_mallocs} | {res.device_frees} | {res.peak_allocated_bytes:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
