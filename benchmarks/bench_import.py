"""Time `allocsim import` on a synthetic 1M-entry PyTorch snapshot.

Builds a snapshot the way a long run leaves one: the ring buffer kept the last
``--entries`` entries of a longer history (so the import must seed the blocks
alive before it), blocks live in 20 MiB segments on two streams, each block
gets alloc / free_requested / free_completed, ``time_us`` on every entry.
Pickles it, then times ``python -m allocsim import`` end to end (interpreter
start included) and the in-process phases.

    python3 benchmarks/bench_import.py [--entries 1000000] [--frames]
"""
from __future__ import annotations

import argparse
import os
import pickle
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

MiB = 1024**2
SEG = 20 * MiB


def build(n_entries: int, *, frames: bool, seed: int = 0) -> dict:
    """A consistent snapshot whose trace holds the last ``n_entries`` of a longer history.

    Each stream bump-allocates from its current 20 MiB segment and opens a new
    one when it is full; a block is freed (requested, then completed a few
    entries later) at random while about 2,000 blocks are live.
    """
    rng = random.Random(seed)
    history = []
    current = {}                   # stream -> [segment base, bump offset]
    seg_stream = {}                # segment base -> stream
    live = {}                      # addr -> (requested, stream, segment base)
    allocated = []                 # addresses not yet free-requested (swap-remove list)
    pending = []                   # addresses free-requested, not completed
    t = 1_700_000_000_000_000
    stack = [{"filename": "/home/u/train.py", "line": 10, "name": "step"}] if frames else None
    total = int(n_entries * 1.1)
    while len(history) < total:
        t += rng.randint(1, 5)
        r = rng.random()
        if pending and (len(pending) > 16 or r > 0.9):
            addr = pending.pop(0)
            size, stream, _ = live.pop(addr)
            history.append({"action": "free_completed", "addr": addr, "size": size, "stream": stream,
                            "time_us": t})
        elif not allocated or len(allocated) < 2000 and r < 0.5:
            size = rng.choice((512, 4096, 65536, 1 << 20, 3 << 20))
            stream = rng.choice((0, 0, 0, 0x5603B2C0))
            cur = current.get(stream)
            rounded = (size + 511) // 512 * 512
            if cur is None or cur[1] + rounded > SEG:
                base = 0x7F0000000000 + len(seg_stream) * SEG
                cur = current[stream] = [base, 0]
                seg_stream[base] = stream
                history.append({"action": "segment_alloc", "addr": base, "size": SEG, "stream": stream,
                                "time_us": t})
            addr = cur[0] + cur[1]
            cur[1] += rounded
            live[addr] = (size, stream, cur[0])
            allocated.append(addr)
            e = {"action": "alloc", "addr": addr, "size": size, "stream": stream, "time_us": t}
            if stack:
                e["frames"] = stack
            history.append(e)
        else:
            k = rng.randrange(len(allocated))
            allocated[k], allocated[-1] = allocated[-1], allocated[k]
            addr = allocated.pop()
            size, stream, _ = live[addr]
            history.append({"action": "free_requested", "addr": addr, "size": size, "stream": stream,
                            "time_us": t})
            pending.append(addr)
    blocks = {base: [] for base in seg_stream}
    waiting = set(pending)
    for addr in sorted(live):
        size, _, base = live[addr]
        blocks[base].append({"address": addr, "size": (size + 511) // 512 * 512, "requested_size": size,
                             "state": "active_pending_free" if addr in waiting else "active_allocated"})
    segs = [{"device": 0, "address": base, "total_size": SEG, "stream": seg_stream[base], "segment_type": "large",
             "is_expandable": False, "blocks": blocks[base]} for base in sorted(seg_stream)]
    return {"segments": segs, "device_traces": [history[-n_entries:]],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--frames", action="store_true", help="give every alloc a one-frame stack")
    args = ap.parse_args()
    t = time.perf_counter()
    snap = build(args.entries, frames=args.frames)
    print(f"built {len(snap['device_traces'][0]):,} entries in {time.perf_counter() - t:.1f}s")
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "snapshot.pickle"), os.path.join(d, "trace.bin")
        with open(src, "wb") as f:
            pickle.dump(snap, f, protocol=pickle.HIGHEST_PROTOCOL)
        del snap
        print(f"pickle: {os.path.getsize(src) / MiB:.1f} MiB")

        from allocsim.formats.importers import safe_pickle
        from allocsim.formats.importers.torch_snapshot import SnapshotConversion
        from allocsim.trace import TraceWriter
        t0 = time.perf_counter()
        loaded = safe_pickle.load(src)
        t1 = time.perf_counter()
        conv = SnapshotConversion(loaded, source=src)
        t2 = time.perf_counter()
        w = TraceWriter(meta=conv.meta, path=out, chunk=1 << 16)
        stats = conv.emit(w)
        w.finish()
        t3 = time.perf_counter()
        print(f"in process: unpickle {t1 - t0:.2f}s, check + walk back {t2 - t1:.2f}s, emit {t3 - t2:.2f}s; "
              f"seeded {stats['seeded']}, wrapped {stats['wrapped']}")
        del loaded, conv
        os.unlink(out)
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "allocsim", "import", src, "-o", out], env=env,
                           capture_output=True, text=True)
        wall = time.perf_counter() - t
        print(r.stdout.strip() or r.stderr.strip())
        print(f"allocsim import: {wall:.2f}s wall for {args.entries:,} entries "
              f"({wall / args.entries * 1e6:.2f} µs/entry); target < 10 s")
        return r.returncode


if __name__ == "__main__":
    sys.exit(main())
