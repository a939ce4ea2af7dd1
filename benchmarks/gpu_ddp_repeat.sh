#!/bin/bash
# The last device session of 2026-11-25 (two H200s): every gpu-marked test on the merged code, then DDP on two
# GPUs recorded twice more under the defaults, tuned on the first and the recommendation re-run (traces/README.md,
# "Runs of two processes"). Usage (repo root, two GPUs): OUT=dir bash benchmarks/gpu_ddp_repeat.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} TORCH_SYMM_MEM_DISABLE_MULTICAST=${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}
REPO=$PWD
W=/tmp/wE; mkdir -p $W/run
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv > $W/env.txt
python3 -c "import sys,torch,cupy; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cupy', cupy.__version__)" >> $W/env.txt 2>&1
( cd $REPO && timeout 330 python3 -m pytest -m gpu tests/ -q -rs -p no:cacheprovider ) > $W/gpu-tests.txt 2>&1
echo "pytest rc=$?" >> $W/gpu-tests.txt
tail -15 $W/gpu-tests.txt
TRAIN="$REPO/examples/dist_train.py --backend nccl --model gpt2 --iters 4 --layers 6 --dim 768 --heads 12 --seq 512 --batch 8 --vocab 50257 --mode ddp"
LAUNCH="torchrun --standalone --nproc-per-node 2"
cd $W/run
for k in a b; do
  timeout 100 env PYTORCH_ALLOC_CONF= python3 -m allocsim record --force -o ddp-$k.bin -- $LAUNCH $TRAIN > $W/record-$k.txt 2>&1
  echo "record $k rc=$?"
done
python3 -m allocsim info ddp-a.bin -q > $W/info.txt 2>&1; python3 -m allocsim info ddp-b.bin -q >> $W/info.txt 2>&1
python3 -m allocsim validate ddp-a.bin > $W/validate.txt 2>&1; python3 -m allocsim validate ddp-b.bin >> $W/validate.txt 2>&1
grep -E "verdict" $W/validate.txt
timeout 100 python3 -m allocsim tune ddp-a.bin -j 16 --no-fit --json > $W/tune-a.json 2> $W/tune-a.err; echo "tune rc=$?"
timeout 100 python3 $REPO/benchmarks/gpu_ranks_rerun.py $W/tune-a.json ddp-a-rerun.bin -- $LAUNCH $TRAIN > $W/rerun.txt 2>&1
echo "rerun rc=$?"; grep -E "^rank|predicted" $W/rerun.txt
cd $W && tar czf $OUT/final.tgz . && ls -la $OUT
