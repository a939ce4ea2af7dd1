#!/bin/bash
# One GPU, issue 20 item 3: a run of several processes recorded per rank. Two DDP ranks with the gloo backend share
# the GPU: the gpu-marked tests (torchrun and torch.multiprocessing.spawn), then `allocsim record -- torchrun` of
# examples/dist_train.py, `info`, `validate` on each rank and on the run, `tune` on the run. About 3 minutes.
# Usage (repo root, on a GPU machine): OUT=/some/dir bash benchmarks/gpu_ranks_1gpu.sh
# Writes $OUT/ranks-1gpu.tgz: env.txt, tests.txt, record.txt, run/ (ddp.rank*.bin + stats), info.txt, info.json,
# validate.txt, tune.txt, tune.json, steps.txt (each step's exit status and time).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
REPO=$PWD
W=$OUT/w; mkdir -p $W/run
. $REPO/benchmarks/_gpu_steps.sh
pack() { tar czf $OUT/ranks-1gpu.tgz -C $W . ; }
trap pack EXIT
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  which torchrun; env | grep -E "^(NCCL|TORCH|PYTORCH|CUDA)" | sort
} > $W/env.txt 2>&1

step tests 170 $W/tests.txt python3 -m pytest -m gpu tests/test_ranks.py -q -rs -p no:cacheprovider

# torchrun without network: --standalone (c10d on localhost); if it cannot start, an explicit c10d endpoint
ARGS="$REPO/examples/dist_train.py --backend gloo --model tiny --iters 6 --layers 4 --dim 512 --seq 256"
cd $W/run
step record 120 $W/record.txt python3 -m allocsim record -o ddp.bin -- torchrun --standalone --nproc-per-node 2 $ARGS
if ! ls ddp.rank1.bin > /dev/null 2>&1; then
  step record-c10d 120 $W/record.txt python3 -m allocsim record --force -o ddp.bin -- torchrun --nproc-per-node 2 \
    --rdzv-backend=c10d --rdzv-endpoint=localhost:29500 $ARGS
fi
ls -la >> $W/record.txt
step info 60 $W/info.txt python3 -m allocsim info ddp.bin -q
step info-json 60 $W/info.json python3 -m allocsim info ddp.bin --json
for f in ddp.rank*.bin; do step "validate $f" 60 $W/validate.txt python3 -m allocsim validate $f; done
step validate-run 60 $W/validate.txt python3 -m allocsim validate ddp.bin
step tune 150 $W/tune.txt python3 -m allocsim tune ddp.bin -j 8
step tune-json 150 $W/tune.json python3 -m allocsim tune ddp.bin -j 8 --json --no-fit
cd $REPO
tail -15 $W/tests.txt; tail -8 $W/record.txt; tail -8 $W/info.txt; grep -E "^==|verdict" $W/validate.txt
tail -12 $W/tune.txt; cat $W/steps.txt
