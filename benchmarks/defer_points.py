"""Where each recording frees the large blocks it allocated before its first step ended (issue 21, DDP's rank 0).

    PYTHONPATH=$PWD python3 benchmarks/defer_points.py [--size BYTES] TRACE.bin ... [PROBE.json ...]

For every trace: each block of at least 64 MiB allocated before the first MARK and freed inside a later step
(after its first ALLOC, before the last MARK: DDP's first-iteration gradient bucket, one flat buffer of every
parameter), and where its FREE lies — the MARK before it and how many ALLOCs after that MARK — with the trace's
LOAD (peak live bytes). For every
probe file (`examples/_defer_probe.py`): when the GPU finished each step's backward against when the host
started the next step, and, with stacks, the frames of the large frees (``--size``: only those of that many
bytes). Prints one line per block, step or free.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from allocsim.errors import InputError  # noqa: E402
from allocsim.trace import Trace  # noqa: E402
import allocsim.trace.events as ev  # noqa: E402

BIG = 64 << 20


def free_points(path: str) -> list[dict]:
    """The large blocks live across the first MARK, and the point of the program where each is freed."""
    t = Trace.load(path)
    kind, ids, size, tm = t.kind, t.id.astype(np.int64), t.size.astype(np.int64), t.time_ns.astype(np.int64)
    marks = np.flatnonzero(kind == ev.MARK)
    if not len(marks):
        return []
    is_alloc = kind == ev.ALLOC
    allocs_upto = np.cumsum(is_alloc)
    freed_at = {int(ids[i]): int(i) for i in np.flatnonzero(kind == ev.FREE)}
    load = int(t.live_curve.max())
    out = []
    for a in np.flatnonzero(is_alloc[:marks[0]] & (size[:marks[0]] >= BIG)):
        f = freed_at.get(int(ids[a]))
        if f is None or f < marks[0] or f > marks[-1]:
            continue
        m = marks[marks < f][-1]
        if allocs_upto[f] == allocs_upto[m]:
            continue                                    # at a step's boundary (zero_grad), not inside a step
        out.append({"trace": os.path.basename(path), "id": int(ids[a]), "size": int(size[a]),
                    "mark": t.labels[t.aux[m]], "allocs_after_mark": int(allocs_upto[f] - allocs_upto[m]),
                    "ms_after_mark": round((tm[f] - tm[m]) / 1e6, 2), "event": f, "load": load})
    return out


def probe_lines(path: str, size: int | None = None) -> list[str]:
    with open(path) as fh:
        p = json.load(fh)
    lines = []
    for s in p.get("steps", []):
        if "gpu_backward_done_ms" in s and "next_start_ms" in s:
            lines.append(f"{os.path.basename(path)} step {s['step']}: backward returned {s['backward_return_ms']} ms, "
                         f"GPU done {s['gpu_backward_done_ms']} ms, next step started {s['next_start_ms']} ms "
                         f"(GPU {'done' if s['gpu_done_at_next_start'] else 'NOT done'} then; lag "
                         f"{s['gpu_backward_done_ms'] - s['next_start_ms']:+.1f} ms)")
    starts = [s["start_wall_us"] for s in p.get("steps", [])]
    for fr in (f for f in p.get("frees", []) if size is None or f["size"] == size):
        step = sum(1 for w in starts if fr["time_us"] is not None and w <= fr["time_us"]) - 1
        names = [f.split("(")[0].strip() + (f" ({os.path.basename(f.split(' (')[-1])}" if ".py:" in f else "")
                 for f in fr["frames"] if any(k in f for k in ("c10d::", "Work", "Watchdog", ".py:"))]
        lines.append(f"{os.path.basename(path)} {fr['action']} {fr['size']} B in loop step {step} (0-based) "
                     f"(entry {fr['entry']}, {fr['allocs_before']} allocs since step 0 ended): "
                     + " <- ".join(names[:8]))
    if "frees_error" in p:
        lines.append(f"{os.path.basename(path)} stacks failed: {p['frees_error']}")
    return lines


def main(argv: list[str]) -> int:
    status, size = 0, None
    if argv[:1] == ["--size"] and len(argv) > 1 and argv[1].isdigit():
        size, argv = int(argv[1]), argv[2:]
    for path in argv:
        try:
            blocks = [] if path.endswith(".json") else free_points(path)
            lines = probe_lines(path, size) if path.endswith(".json") else []
        except (InputError, OSError, ValueError, KeyError) as e:
            print(f"{path}: cannot read: {e}", file=sys.stderr)
            status = 2
            continue
        if lines:
            print("\n".join(lines))
        for b in blocks:
            print(f"{b['trace']}: id {b['id']} ({b['size']:,} B) freed at event {b['event']}, '{b['mark']}' + "
                  f"{b['allocs_after_mark']} allocs ({b['ms_after_mark']} ms); LOAD {b['load']:,} B")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
