#!/bin/bash
# The compiled build's replay speed, this checkout against a base commit, built and measured alternately on one
# machine (README, "Speed"). Needs Cython >= 3.3.1 importable from $CY (a pure-Python copy will do) and a C
# compiler; writes $OUT/compiled-compare.txt. Usage:
#   CY=_cy BASE=7532727 OUT=$OUT bash benchmarks/compiled_compare.sh
# Without git history here (no BASE to export) it measures this checkout alone.
set -u
OUT=${OUT:-out}; CY=${CY:-_cy}; BASE=${BASE:-7532727}
POLICIES=${POLICIES:-"torch,torch[expandable_segments:True],split,cupy,bestfit"}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd); LOG="$OUT/compiled-compare.txt"
CY=$(cd "$CY" 2>/dev/null && pwd || echo "$CY")
here=$PWD; work=$(mktemp -d)
say() { echo "$@" | tee -a "$LOG"; }
say "# $(date -u +%FT%TZ) $(python3 -V 2>&1), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
say "# Cython: $(PYTHONPATH=$CY python3 -c 'import Cython; print(Cython.__version__, Cython.__file__)' 2>&1)"
trees="new"
mkdir -p "$work/new" && git ls-files -z | xargs -0 cp --parents -t "$work/new" 2>/dev/null \
    || { rm -rf "$work/new"; cp -r "$here" "$work/new"; }
if git archive "$BASE" 2>/dev/null | (mkdir -p "$work/base" && tar -x -C "$work/base"); then
    trees="base new"
else
    say "# no commit $BASE here: this checkout alone"
fi
for t in $trees; do
    ( cd "$work/$t" && find . -name '*.so' -delete
      ALLOCSIM_COMPILE=1 PYTHONPATH=$CY:$PWD timeout 400 python3 setup.py -q build_ext --inplace -j 4 > build.log 2>&1
      say "# $t: $(PYTHONPATH=$PWD python3 -m allocsim --version 2>&1)" \
          "($(grep -c '^allocsim:' build.log) fallback lines)" )
done
for round in 1 2 3; do
    for t in $trees; do
        say "## round $round, $t, load $(cut -d' ' -f1-3 /proc/loadavg)"
        ( cd "$work/$t" && PYTHONPATH=$PWD timeout 120 python3 benchmarks/bench_replay.py --plain \
              --policies "$POLICIES" --allocs 300000 2>&1 | tee -a "$LOG" )
    done
done
rm -rf "$work"
