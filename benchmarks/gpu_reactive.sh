#!/bin/bash
# Issue 28, GPU proof: the three programs that react to memory (examples/reactive_{compile,cudnn,backoff}.py),
# each cold and warm, uncapped and under a cap, each run recorded (`allocsim record`, its defaults) and run plain
# (no recorder); every recording validated; predicted vs measured table at the end (benchmarks/reactive_table.py).
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_reactive.sh   -> $OUT/reactive.tar.gz, ~5 minutes.
#
# Cold / warm: compile uses its own TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR; a cold run starts from empty
# ones. The first run after a cold one still autotunes some kernels (measured: 351 allocations, then 299), so
# after the uncapped cold plain run one more plain run (compile-warm1) fills the caches, and every warm run starts
# from a copy of what that left. cuDNN and back-off keep nothing between processes: their warm run is simply a
# second run.
# Caps, from the plain uncapped runs' own figures (their REACTIVE lines):
#   compile: halfway between the cold and the warm peak reserved (the "between the warm and cold peaks");
#   cudnn:   0.9 x the cold peak reserved (cold and warm peaks are equal; cuDNN's benchmark mode then halves a
#            workspace request and lives);
#   backoff: 0.7 x the cold peak *allocated* (a cap above it only makes the allocator free its cache and retry:
#            no OOM reaches the program; below it the first step fails and the program halves its batch).
# Two lanes run side by side to fit the time: compile alone; cudnn then backoff.
# Files (flat): P-V-{rec,plain}.{log,json,oom.jsonl}, P-V-rec.bin(.stats.json), P-V-rec.{validate,info}.txt with P in
# compile/cudnn/backoff and V in cold/warm/capcold/capwarm; caps.txt, env.txt, lanes, table.txt.
set -u

INFO=1
. benchmarks/_reactive_runs.sh
begin /tmp/reactive-proof ${BUDGET:-480}

# both NAME LIMIT PROG ARGS...: recorded, then plain (BEFORE, if set, runs before each: the cache state)
both() { local name=$1 lim=$2; shift 2
  ${BEFORE:-true}; go $name-rec $lim rec "$@"
  ${BEFORE:-true}; go $name-plain $lim plain "$@"; }

lane_compile() {
  local C=/tmp/rc-compile P=examples/reactive_compile.py cap
  export TORCHINDUCTOR_CACHE_DIR=$C/now/inductor TRITON_CACHE_DIR=$C/now/triton
  cold() { rm -rf $C/now; }
  warm() { rm -rf $C/now; cp -a $C/warm $C/now; }
  BEFORE=cold; both compile-cold 150 $P
  go compile-warm1-plain 90 plain $P                            # the next run after the plain cold one
  rm -rf $C/warm; mkdir -p $C/now; cp -a $C/now $C/warm      # the caches it left
  BEFORE=warm; both compile-warm 90 $P
  cap=$(cap_of $(figure compile-cold-plain peak_reserved) $(figure compile-warm-plain peak_reserved) 0.9)
  echo "compile cap $cap" | tee -a $W/caps.txt
  BEFORE=cold; both compile-capcold 150 $P --cap-bytes $cap
  BEFORE=warm; both compile-capwarm 90 $P --cap-bytes $cap
}

lane_eager() {
  export TORCHINDUCTOR_CACHE_DIR=/tmp/rc-eager/inductor TRITON_CACHE_DIR=/tmp/rc-eager/triton
  local C=examples/reactive_cudnn.py B=examples/reactive_backoff.py cap
  both cudnn-cold 90 $C
  both cudnn-warm 90 $C
  cap=$(cap_of $(figure cudnn-cold-plain peak_reserved) $(figure cudnn-warm-plain peak_reserved) 0.9)
  echo "cudnn cap $cap" | tee -a $W/caps.txt
  both cudnn-capcold 90 $C --cap-bytes $cap
  both cudnn-capwarm 90 $C --cap-bytes $cap
  both backoff-cold 60 $B
  both backoff-warm 60 $B
  cap=$(python3 -c "import sys; print(int(0.7 * int(sys.argv[1])))" $(figure backoff-cold-plain peak_allocated))
  echo "backoff cap $cap" | tee -a $W/caps.txt
  both backoff-capcold 60 $B --cap-bytes $cap
  both backoff-capwarm 60 $B --cap-bytes $cap
}

lane_compile > $W/lane-compile.txt 2>&1 &
A=$!
lane_eager > $W/lane-eager.txt 2>&1
wait $A
wait                      # the validations
cat $W/env.txt $W/caps.txt $W/lane-compile.txt $W/lane-eager.txt
for f in $W/*.validate.txt; do echo "== $(basename $f): $(grep -h '^verdict' $f) $(tail -1 $f)"; done
timeout 120 python3 benchmarks/reactive_table.py $W > $W/table.txt 2>&1; cat $W/table.txt
tar czf $OUT/reactive.tar.gz -C $W .
echo "total $(( $(date +%s) - T0 ))s"; ls -la $OUT
