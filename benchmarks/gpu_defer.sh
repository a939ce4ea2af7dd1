#!/bin/bash
# Two GPUs, issue 21 (DDP's rank 0): does the point where DDP's first-iteration gradient bucket (one 326,077,440-byte
# buffer of every parameter) is freed follow how far the GPU lags behind the host, or the allocator setting?
# In the shipped recordings it is freed right after the bucket rebuild's broadcasts at the start of step 2 under the
# defaults (4 of 4 on rank 0), and at the first allreduce of step 2's or step 3's backward under expandable segments
# (4 of 4), which puts 311 MiB more under rank 0's peak (benchmarks/defer_points.py on traces/runs/ddp*.bin).
# Runs of examples/dist_train.py (the shipped command), each under a 60 s limit, in order of what they decide:
#   d-lag     defaults, the GPU held 300 ms before the first backward (the host runs ahead): moves it, if timing
#   x-sync    expandable, torch.cuda.synchronize() after every optimizer step: brings it back, if timing
#   x-stacks  expandable, the program's own allocator history from step 1 with free stacks (C++ and Python frames):
#             which thread and function free it (not under allocsim record: it records its history itself)
#   d-stacks  the same under the defaults
#   x-probe, d-probe  the two settings plainly, with the GPU timeline
# Every run writes --probe timelines (examples/_defer_probe.py: each step's backward done on the GPU vs the next
# step's start on the host, queried, never waited on). The recorded runs are rank traces under run/.
# Usage (repo root, two GPUs; about 3 minutes, at most 4): OUT=dir bash benchmarks/gpu_defer.sh   -> $OUT/defer.tgz
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
REPO=$PWD
W=$OUT/w; mkdir -p $W/run $W/probe
. $REPO/benchmarks/_gpu_steps.sh
pack() { tar czf $OUT/defer.tgz -C $W . ; rm -rf $W; }
trap pack EXIT
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  env | grep -E "^(NCCL|TORCH|PYTORCH|CUDA)" | sort
} > $W/env.txt 2>&1
TRAIN="$REPO/examples/dist_train.py --backend nccl --model gpt2 --iters 4 --layers 6 --dim 768 --heads 12 --seq 512 --batch 8 --vocab 50257 --mode ddp"
LAUNCH="torchrun --standalone --nproc-per-node 2"
X=expandable_segments:True
cd $W/run
left() { [ $(( $(date +%s) - T0 )) -lt ${BUDGET_S:-180} ] || { echo "   skipped $1: out of time" | tee -a $W/steps.txt; return 1; }; }
record() {   # record NAME CONF ARGS...: recorded under allocsim record, with the probe
  local name=$1 conf=$2; shift 2; left $name || return 0
  step "record $name" 60 $W/record.txt env PYTORCH_ALLOC_CONF=$conf python3 -m allocsim record --force -o $name.bin \
    -- $LAUNCH $TRAIN --probe $W/probe/$name "$@"
}
plain() {    # plain NAME CONF ARGS...: not recorded (the stacks runs keep their own history)
  local name=$1 conf=$2; shift 2; left $name || return 0
  step "run $name" 60 $W/record.txt env PYTORCH_ALLOC_CONF=$conf TORCH_SYMBOLIZE_MODE=dladdr \
    $LAUNCH $TRAIN --probe $W/probe/$name "$@"
}
record d-lag "" --gpu-lag-ms 300
record x-sync $X --sync-steps
plain x-stacks $X --probe-stacks
plain d-stacks "" --probe-stacks
record x-probe $X
record d-probe ""
cd $REPO
step "points" 60 $W/points.txt python3 benchmarks/defer_points.py $W/run/*.bin $W/probe/*.json
cat $W/points.txt | cut -c1-400; cat $W/steps.txt
