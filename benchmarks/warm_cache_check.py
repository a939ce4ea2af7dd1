"""Check ``--warm-cache`` on recordings made before the recorder marked phases (docs/compile.md).

A recording of a first run (``COLD``, with its pool events) has no PHASE scopes; a PyTorch memory snapshot of
another first run of the same program (``SNAPSHOT``, ``torch.cuda.memory._dump_snapshot`` with C++ and Python
frames) names, in each allocation's frames, the calls the recorder now wraps (`allocsim/formats/recorders/
torch_compile.py`, `HOOKS`). This script finds the phases each of the snapshot's allocations was made in, carries
them over to ``COLD``'s allocations by aligning the two runs' request sizes (the runs differ only in how many
times autotuning repeats a benchmark), writes ``OUT``: ``COLD`` with the PHASE scopes the recorder would have
written (each BEGIN before the first allocation inside, each END before the next allocation outside), and prints
what it carried over. Then ``allocsim validate OUT --warm-cache WARM`` checks the prediction.

    python benchmarks/warm_cache_check.py COLD.bin SNAPSHOT.pickle OUT.bin
"""
from __future__ import annotations

import difflib
import sys

import numpy as np

from allocsim.formats.importers import safe_pickle
from allocsim.formats.recorders.torch_compile import HOOKS
from allocsim.trace import Trace
from allocsim.trace import events as ev

#: (file name ending, function) -> phase label, from the recorder's hooks (``Class.method``: the method's name).
PHASE_FRAMES = {(module.split(".")[-1] + ".py", attribute.split(".")[-1]): label
                for module, attribute, kind, label in HOOKS if kind == ev.PHASE_BEGIN}


def phases_of(frames) -> tuple:
    """The phase labels open at an entry, outermost first, from its frames (innermost first)."""
    out = []
    for f in reversed(frames or []):
        label = PHASE_FRAMES.get((str(f.get("filename", "")).rsplit("/", 1)[-1], f.get("name")))
        if label is not None:
            out.append(label)
    return tuple(out)


def main(cold_path: str, snapshot_path: str, out_path: str) -> None:
    snap = safe_pickle.load(snapshot_path)
    entries = [e for t in snap["device_traces"] for e in t if e["action"] == "alloc"]
    snap_sizes = [int(e["size"]) for e in entries]
    snap_phases = [phases_of(e.get("frames")) for e in entries]
    cold = Trace.load(cold_path)
    a = np.flatnonzero(cold.kind == ev.ALLOC)
    sizes = cold.size[a].tolist()
    matcher = difflib.SequenceMatcher(None, sizes, snap_sizes, autojunk=False)
    state: list = [None] * len(sizes)
    matched = 0
    for i, j, n in matcher.get_matching_blocks():
        for k in range(n):
            state[i + k] = snap_phases[j + k]
        matched += n
    for k in range(len(state)):         # an allocation the snapshot's run did not make: its predecessor's phases
        if state[k] is None:
            state[k] = state[k - 1] if k else ()
    rec = np.asarray(cold.records)
    labels = list(cold.labels)
    out, serials, open_ = [], 0, []     # open_: (label, serial), outermost first
    pos = dict(zip(a.tolist(), range(len(a))))
    for i in range(len(rec)):
        k = pos.get(i)
        if k is not None:
            want = state[k]
            keep = 0
            while keep < len(open_) and keep < len(want) and open_[keep][0] == want[keep]:
                keep += 1
            while len(open_) > keep:
                label, serial = open_.pop()
                out.append(_scope(ev.PHASE_END, labels, label, serial, rec[i]))
            for label in want[keep:]:
                serials += 1
                open_.append((label, serials))
                out.append(_scope(ev.PHASE_BEGIN, labels, label, serials, rec[i]))
        out.append(rec[i])
    while open_:
        label, serial = open_.pop()
        out.append(_scope(ev.PHASE_END, labels, label, serial, rec[-1]))
    phased = Trace(np.array(out, dtype=rec.dtype), cold.meta, streams=cold.streams, sites=cold.sites, labels=labels)
    phased.save(out_path)
    n_phase = sum(1 for s in state if s)
    print(f"{cold_path}: {len(sizes):,} allocations, {matched:,} aligned with the snapshot's {len(snap_sizes):,}; "
          f"{n_phase:,} inside phases ({serials:,} scopes) -> {out_path}")


def _scope(kind: int, labels: list, label: str, serial: int, at):
    """A scope record at the time of record ``at``."""
    if label not in labels:
        labels.append(label)
    r = np.zeros(1, at.dtype)[0]
    r["kind"], r["aux"], r["size"], r["time_ns"] = kind, labels.index(label), serial, at["time_ns"]
    r["id"], r["site"] = ev.NO_ID, ev.NO_SITE
    return r


if __name__ == "__main__":
    main(*sys.argv[1:4])
