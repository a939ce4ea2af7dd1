#!/bin/bash
# Issue 28 exploration (one device call): the three reactive programs (examples/reactive_*.py) cold and warm,
# uncapped and under a cap computed here from the uncapped runs' own peaks; each recorded with `--stacks all`
# and run plain; the compile program and the capped cuDNN run also once with their own snapshot (raw frames).
# Two lanes run side by side to fit the time: the compile program alone; cuDNN then back-off.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_reactive_explore.sh   -> $OUT/explore.tar.gz
set -u

RECORD_OPTS="--stacks all" VALIDATE_S=60
. benchmarks/_reactive_runs.sh
begin /tmp/reactive-explore ${BUDGET:-400}
cold() { rm -rf $TORCHINDUCTOR_CACHE_DIR $TRITON_CACHE_DIR; }
peak() { figure $1 peak_reserved; }
cap_between() { cap_of "$@"; }

lane_compile() {
  export TORCHINDUCTOR_CACHE_DIR=/tmp/rc-compile/inductor TRITON_CACHE_DIR=/tmp/rc-compile/triton
  local P="examples/reactive_compile.py"
  cold; go compile-cold-rec 150 rec $P
  cold; go compile-cold-plain 150 plain $P
  go compile-warm-rec 90 rec $P
  go compile-warm-plain 90 plain $P
  local cap=$(cap_between $(peak compile-cold-plain) $(peak compile-warm-plain) 0.9)
  echo "compile cap $cap"
  cold; go compile-capcold-rec 150 rec $P --cap-bytes $cap
  cold; go compile-capcold-plain 150 plain $P --cap-bytes $cap
  go compile-capwarm-rec 90 rec $P --cap-bytes $cap
  go compile-capwarm-plain 90 plain $P --cap-bytes $cap
  cold; go compile-capcold-snap 150 snap $P --cap-bytes $cap
  cold; go compile-cold-snap 150 snap $P
}

lane_eager() {
  export TORCHINDUCTOR_CACHE_DIR=/tmp/rc-eager/inductor TRITON_CACHE_DIR=/tmp/rc-eager/triton
  local C="examples/reactive_cudnn.py" B="examples/reactive_backoff.py" cap ccap
  go cudnn-cold-rec 90 rec $C
  go cudnn-cold-plain 60 plain $C
  ccap=$(cap_between $(peak cudnn-cold-plain) $(peak cudnn-cold-plain) 0.9); echo "cudnn cap $ccap"
  go cudnn-cap-rec 90 rec $C --cap-bytes $ccap
  go cudnn-cap-plain 60 plain $C --cap-bytes $ccap
  go backoff-cold-rec 60 rec $B
  go backoff-cold-plain 60 plain $B
  cap=$(cap_between $(peak backoff-cold-plain) $(peak backoff-cold-plain) 0.6); echo "backoff cap $cap"
  go backoff-cap-rec 60 rec $B --cap-bytes $cap
  go backoff-cap-plain 60 plain $B --cap-bytes $cap
  go cudnn-warm-rec 90 rec $C
  go cudnn-warm-plain 60 plain $C
  go backoff-warm-rec 60 rec $B
  go backoff-warm-plain 60 plain $B
  go cudnn-cap-snap 90 snap $C --cap-bytes $ccap
  cap=$(cap_between $(peak cudnn-cold-plain) $(peak cudnn-cold-plain) 0.75); echo "cudnn cap2 $cap"
  go cudnn-cap2-rec 90 rec $C --cap-bytes $cap
  go cudnn-cap2-plain 60 plain $C --cap-bytes $cap
}

lane_compile > $W/lane-compile.txt 2>&1 &
A=$!
lane_eager > $W/lane-eager.txt 2>&1
wait $A
wait                      # the validations
cat $W/env.txt $W/lane-compile.txt $W/lane-eager.txt
for f in $W/*.validate.txt; do echo "== $f"; grep -iE "verdict|MATCH|differ|rc=" $f | head -8; done
tar czf $OUT/explore.tar.gz -C $W .
ls -la $OUT
