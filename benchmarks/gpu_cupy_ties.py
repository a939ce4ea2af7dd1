"""Which of several equal free chunks CuPy's pool hands out (issue 20: why two plain runs differ).

CuPy 14's arena is a ``std::set<(size, address of the _Chunk object)>`` and a request takes its
``lower_bound((size, 0))``: among free chunks of the best-fitting size, the one whose *Python object* lies
lowest in host memory, not the lowest device address. This probe runs a pool of its own
(``SingleDeviceMemoryPool``, whose ``_debug_arena_get_index`` shows the set in its order), makes ``--segments``
equal segments, frees them in a shuffled order, and asks for one more chunk of that size; it records whether the
chunk taken was the first in the set's order, the one at the lowest device address, and the one whose object
id is lowest. Objects are made and dropped between the segments' requests, so that the chunk objects land
where the heap has room. Repeated ``--trials`` times. Run it twice: the device addresses repeat, the object order need not.

Usage: python3 benchmarks/gpu_cupy_ties.py OUT.json [--trials N] [--segments K]
"""
import argparse
import json
import random

import cupy as cp


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--trials", type=int, default=40)
    p.add_argument("--segments", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    pool = cp.cuda.memory.SingleDeviceMemoryPool()
    ident = cp.cuda.get_current_stream().ptr
    n = 1 << 20
    rows, counts = [], {"first_in_set": 0, "lowest_address": 0, "lowest_object_id": 0, "trials": 0}
    with cp.cuda.using_allocator(pool.malloc):
        for trial in range(a.trials):
            held, junk = [], []
            for _ in range(a.segments):     # each segment's chunk object is made here: scatter them in the heap
                junk += [(object(), object(), object()) for _ in range(rng.randrange(1, 64))]
                rng.shuffle(junk)
                del junk[:len(junk) // 2]
                held.append(cp.empty(n, cp.uint8))
            del junk
            order = list(range(a.segments))
            rng.shuffle(order)
            for i in order:
                held[i] = None
            index = [(size, chunk.ptr(), id(chunk)) for size, chunk in pool._debug_arena_get_index(ident)]
            same = [r for r in index if r[0] == n]
            got = cp.empty(n, cp.uint8)
            ptr = got.data.ptr
            row = {"trial": trial, "taken": ptr, "set_order": [r[1] for r in same],
                   "first_in_set": ptr == same[0][1] if same else None,
                   "lowest_address": ptr == min(r[1] for r in same) if same else None,
                   "lowest_object_id": ptr == min(same, key=lambda r: r[2])[1] if same else None}
            rows.append(row)
            counts["trials"] += 1
            for k in ("first_in_set", "lowest_address", "lowest_object_id"):
                counts[k] += bool(row[k])
            del got
            held = None
            pool.free_all_blocks()
    out = {"cupy": cp.__version__, "counts": counts, "rows": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({"cupy": cp.__version__, **counts}))


if __name__ == "__main__":
    main()
