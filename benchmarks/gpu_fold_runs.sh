# The recordings of traces/fold/ (issue 31: folds that find real runs' periods), one device call:
#   PYTHONPATH=<allocsim> OUT=dir bash benchmarks/gpu_fold_runs.sh
# Each run is `allocsim record` of benchmarks/fold_train.py; env.txt says what the machine was, steps.txt how each
# run ended. The traces are packed into $OUT/fold.tar.xz (their .stats.json beside them), the logs into logs.tar.xz.
set -u
export PYTHONUNBUFFERED=1
export XZ_OPT=-T0; W=/tmp/fold; rm -rf $W; mkdir -p $W
source benchmarks/_gpu_steps.sh
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, torchvision, transformers; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__)"
  nproc; date -u; } > $W/env.txt 2>&1
rec() {   # rec NAME LIMIT ARGS...: record fold_train.py ARGS into $W/NAME.bin
  local name=$1 limit=$2; shift 2
  step $name $limit $W/$name.log python3 -m allocsim record -o $W/$name.bin benchmarks/fold_train.py "$@"
}
rec gpt-fixed 90 gpt --iters 300
rec gpt-eval50 90 gpt --iters 300 --eval-every 50
rec resnet18-eval100 180 resnet18 --iters 1000 --batch 32 --eval-every 100
# GPT-2 small as the H100 recordings were (batch 8, seq 512): for study here, not shipped (~1M events each)
rec gpt2s-fixed 80 gpt --iters 300 --layers 12 --width 768 --seq 512
rec gpt2s-eval50 80 gpt --iters 300 --layers 12 --width 768 --seq 512 --eval-every 50
ls -l $W > $W/sizes.txt
( cd $W && tar -cJf $OUT/fold.tar.xz gpt-fixed.bin* gpt-eval50.bin* resnet18-eval100.bin* 2>/dev/null
  tar -cJf $OUT/big.tar.xz gpt2s-*.bin* 2>/dev/null
  tar -cJf $OUT/logs.tar.xz *.txt *.log )
cat $W/steps.txt $W/sizes.txt
