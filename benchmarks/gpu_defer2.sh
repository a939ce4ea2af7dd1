#!/bin/bash
# Two GPUs, issue 21, second call: is the point where DDP frees its first-iteration bucket moved by recording at all?
# The first call (benchmarks/gpu_defer.sh, traces/raw/defer/) found it freed at the bucket rebuild (the peak reserved
# rank 0 prints is then 9.000 GiB under the defaults, 6.840 GiB under expandable segments) or one to two steps later
# (9.766 / 7.602 GiB) under either setting when recorded by allocsim record, and at the rebuild in the 4 of 4 rank
# runs that kept their own history instead. Here the program runs with no recorder and no allocator history: its
# own printed peak reserved per rank says where the bucket went, 4 times under each setting; then twice more with
# free stacks (examples/_defer_probe.py) under the defaults, to catch the thread of a late free if one comes.
# Usage (repo root, two GPUs; about 3.5 minutes, at most 4): OUT=dir bash benchmarks/gpu_defer2.sh -> $OUT/defer2.tgz
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
REPO=$PWD
W=$OUT/w; mkdir -p $W/probe
. $REPO/benchmarks/_gpu_steps.sh
pack() { tar czf $OUT/defer2.tgz -C $W . ; rm -rf $W; }
trap pack EXIT
TRAIN="$REPO/examples/dist_train.py --backend nccl --model gpt2 --iters 4 --layers 6 --dim 768 --heads 12 --seq 512 --batch 8 --vocab 50257 --mode ddp"
LAUNCH="torchrun --standalone --nproc-per-node 2"
left() { [ $(( $(date +%s) - T0 )) -lt ${BUDGET_S:-190} ] || { echo "   skipped $1: out of time" | tee -a $W/steps.txt; return 1; }; }
plain() {    # plain NAME CONF ARGS...
  local name=$1 conf=$2; shift 2; left $name || return 0
  step "run $name" 45 $W/runs.txt env PYTORCH_ALLOC_CONF=$conf TORCH_SYMBOLIZE_MODE=dladdr \
    $LAUNCH $TRAIN --probe $W/probe/$name "$@"
}
for k in 1 2 3 4; do
  plain d$k ""
  plain x$k expandable_segments:True
done
plain d-stacks5 "" --probe-stacks
plain d-stacks6 "" --probe-stacks
cd $REPO
grep -E "^== run|^rank" $W/runs.txt > $W/peaks.txt
step "points" 30 $W/points.txt python3 benchmarks/defer_points.py --size 326077440 $W/probe/*.json
cat $W/peaks.txt; grep "free_" $W/points.txt | cut -c1-300; cat $W/steps.txt
