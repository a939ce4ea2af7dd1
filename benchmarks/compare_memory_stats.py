"""Compare the ``MEMORY_STATS`` lines (examples/_common.py `print_memory_stats`) of a recorded run and the same
program run without recording: ``compare_memory_stats.py RECORDED.txt PLAIN.txt``. One line per tag (a process):
``same`` with the number of counters, or the counters that differ; exit status 1 if any differs or a tag is
missing on one side."""
from __future__ import annotations

import json
import sys


def stats_of(path: str) -> dict:
    out = {}
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("MEMORY_STATS "):
                _, tag, text = line.rstrip("\n").split(" ", 2)
                out[tag] = json.loads(text)
    return out


def main(recorded: str, plain: str) -> int:
    a, b = stats_of(recorded), stats_of(plain)
    bad = 0
    if not a or set(a) != set(b):
        print(f"tags differ: recorded {sorted(a)}, not recorded {sorted(b)}")
        bad = 1
    for tag in sorted(set(a) & set(b)):
        diff = {k: (a[tag].get(k), b[tag].get(k)) for k in sorted(set(a[tag]) | set(b[tag]))
                if a[tag].get(k) != b[tag].get(k)}
        if diff:
            bad = 1
            print(f"{tag}: {len(diff)} of {len(a[tag])} counters differ (recorded, not recorded): "
                  + ", ".join(f"{k} {x} vs {y}" for k, (x, y) in list(diff.items())[:12]))
        else:
            print(f"{tag}: same ({len(a[tag])} counters; peak reserved {a[tag].get('reserved_bytes.all.peak')}, "
                  f"allocations {a[tag].get('allocation.all.allocated')})")
    return bad


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
