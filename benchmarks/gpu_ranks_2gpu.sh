#!/bin/bash
# Two GPUs, issue 21: NCCL runs recorded per rank with `allocsim record -- torchrun`: DDP and FSDP2 (fully_shard) of a
# small GPT-2 (transformers, random weights; the hand-written one if transformers is missing), each with and without
# expandable segments, and a DDP run where the last rank's memory fraction makes it catch an OOM; `validate` on every
# rank trace, `tune` on the DDP and FSDP runs at the GPU's capacity, and the recommended setting re-run recorded, its
# predicted and measured peak reserved and device calls per rank (benchmarks/gpu_ranks_rerun.py). About 6 minutes;
# every step has its own time limit and a failed step leaves the rest to run.
# Usage (repo root, on a machine with 2 GPUs): OUT=/some/dir bash benchmarks/gpu_ranks_2gpu.sh
# Writes $OUT/ranks-2gpu.tgz: env.txt, steps.txt, record.txt, run/ (traces, stats, *.compare.json),
# info.txt, validate.txt, tune-*.txt / .json, rerun.txt.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
REPO=$PWD
W=$OUT/w; mkdir -p $W/run
. $REPO/benchmarks/_gpu_steps.sh
pack() { tar czf $OUT/ranks-2gpu.tgz -C $W . ; }
trap pack EXIT
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  python3 -c "import transformers; print('transformers', transformers.__version__)"
  env | grep -E "^(NCCL|TORCH|PYTORCH|CUDA)" | sort
} > $W/env.txt 2>&1
MODEL=gpt2; python3 -c "import transformers" 2>/dev/null || MODEL=tiny
TRAIN="$REPO/examples/dist_train.py --backend nccl --model $MODEL --iters 4 --layers 6 --dim 768 --heads 12 --seq 512 --batch 8 --vocab 50257"
LAUNCH="torchrun --standalone --nproc-per-node 2"
cd $W/run
record() {   # record NAME [ENV=VALUE ...] -- TRAIN ARGS...
  local name=$1; shift
  local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  step "record $name" 100 $W/record.txt env "${envs[@]}" python3 -m allocsim record --force -o $name.bin -- $LAUNCH "$@"
}
record ddp PYTORCH_ALLOC_CONF= -- $TRAIN --mode ddp
record ddp-expandable PYTORCH_ALLOC_CONF=expandable_segments:True -- $TRAIN --mode ddp
record fsdp PYTORCH_ALLOC_CONF= -- $TRAIN --mode fsdp
record fsdp-expandable PYTORCH_ALLOC_CONF=expandable_segments:True -- $TRAIN --mode fsdp
record ddp-fraction-oom PYTORCH_ALLOC_CONF= -- $TRAIN --mode ddp --fraction 0.12 --oom-probe over
ls -la >> $W/record.txt
pack
for run in ddp ddp-expandable fsdp fsdp-expandable ddp-fraction-oom; do
  step "info $run" 60 $W/info.txt python3 -m allocsim info $run.bin -q
  step "validate $run" 60 $W/validate.txt python3 -m allocsim validate $run.bin
done
for run in ddp fsdp; do
  step "tune $run" 100 $W/tune-$run.json python3 -m allocsim tune $run.bin -j 16 --no-fit --json
  step "rerun $run" 100 $W/rerun.txt python3 $REPO/benchmarks/gpu_ranks_rerun.py $W/tune-$run.json $run-rerun.bin -- \
    $LAUNCH $TRAIN --mode $run
done
step "tune ddp --objective reserved" 100 $W/tune-ddp-reserved.json python3 -m allocsim tune ddp.bin -j 16 --no-fit \
  --json --objective reserved
step "rerun ddp reserved" 100 $W/rerun.txt python3 $REPO/benchmarks/gpu_ranks_rerun.py $W/tune-ddp-reserved.json \
  ddp-reserved-rerun.bin -- $LAUNCH $TRAIN --mode ddp
pack
step "tune ddp (report)" 60 $W/tune-ddp.txt python3 -m allocsim tune ddp.bin -j 16 --no-fit
cd $REPO
grep -E "^rank|caught OOM|process traces|nothing recorded" $W/record.txt; grep -E "^run of|^rank|^  rank|outside" $W/info.txt | head -40
grep -E "^validate|verdict" $W/validate.txt; cat $W/rerun.txt | grep -vE "^W|warn" | tail -30; cat $W/steps.txt
