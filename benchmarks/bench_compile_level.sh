#!/bin/sh
# The compile level's cost and worth (setup.py's OPTIMIZE, docs/performance.md "the compile at -O1"): the tree
# built in place in a copy per level (CFLAGS names the level; an empty one is setup.py's own), each build timed,
# then the replay benchmark alternated over the copies for ROUNDS rounds.
#   sh benchmarks/bench_compile_level.sh [LEVEL ...]      (default: "" -O2 -O3; ROUNDS=3 ALLOCS=500000)
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
[ $# -gt 0 ] || set -- "" -O2 -O3
i=0
for level in "$@"; do
    i=$((i + 1))
    mkdir "$WORK/$i"
    cp -r "$ROOT/allocsim" "$ROOT/benchmarks" "$ROOT/setup.py" "$ROOT/pyproject.toml" "$WORK/$i/"
    find "$WORK/$i" -name "*.so" -delete
    (cd "$WORK/$i" && CFLAGS="$level" /usr/bin/time -f "build ${level:-(setup.py's level)}: wall %e s, cpu %U+%S s" \
        "$PY" setup.py -q build_ext --inplace 2>&1 | tail -1)
done
for r in $(seq "${ROUNDS:-3}"); do
    i=0
    for level in "$@"; do
        i=$((i + 1))
        printf 'round %s %s: ' "$r" "${level:-(setup.py)}"
        "$PY" "$WORK/$i/benchmarks/bench_replay.py" --allocs "${ALLOCS:-500000}" --policies split,torch,bestfit,cupy \
            --repeat 3 2>&1 | tail -4 | awk '{printf "%s %s  ", $1, $6} END {print "(x cpu)"}'
    done
done
