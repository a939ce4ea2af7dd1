#!/bin/bash
# Records the traces in this folder on a GPU machine, times the recorder's overhead and runs
# the GPU tests. Usage (repo root): OUT=/some/dir bash traces/record.sh
# Results: $OUT/traces.tgz (traces + stats), $OUT/env.txt, $OUT/log.txt, $OUT/timing.txt, $OUT/pytest.txt
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=/tmp/rec; mkdir -p $R
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys,torch,torchvision,transformers,cupy; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'cupy', cupy.__version__)"
  python3 -m pytest --version || true
} > $OUT/env.txt 2>&1

rec() {  # name, env assignment or -, script and args
  local name=$1 envs=$2; shift 2
  echo "== $name: ${envs/-/} allocsim record $*"
  local t0=$SECONDS
  env ${envs/-/} python3 -m allocsim record -o $R/$name.bin "$@"
  echo "rc=$? wall=$((SECONDS - t0))s"
}
{
  rec resnet50 - examples/resnet50_train.py --iters 8
  rec resnet50-expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True examples/resnet50_train.py --iters 8
  rec gpt2 - examples/gpt2_train.py --iters 6
  rec gpt2-maxsplit128-rp2div4 PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,roundup_power2_divisions:4 examples/gpt2_train.py --iters 6
  rec gpt2_variable - examples/gpt2_variable.py --iters 10
  rec bert_mlm - examples/bert_mlm.py --iters 6
  rec cupy_mlp - examples/cupy_mlp.py --iters 20
  ls -l $R
} > $OUT/log.txt 2>&1
tar czf $OUT/traces.tgz -C $R .
cp $R/*.bin $R/*.stats.json traces/

{
  for k in 1 2; do
    echo "== plain run $k"; python3 examples/resnet50_train.py --iters 30 --warmup 5
    echo "== recorded run $k"; python3 -m allocsim record -o /tmp/ovh.bin examples/resnet50_train.py --iters 30 --warmup 5
  done
  echo "== recorded with --stacks"; python3 -m allocsim record --stacks -o /tmp/stk.bin examples/resnet50_train.py --iters 12 --warmup 5
  python3 -c "from allocsim import Trace; t=Trace.load('/tmp/stk.bin'); print('sites', len(t.sites), t.sites[:5])"
  echo "== SIGTERM after 20 s"; timeout -s TERM 20 python3 -m allocsim record -o /tmp/term.bin examples/resnet50_train.py --iters 100000
  echo "rc=$?"; python3 -c "import json; from allocsim import Trace; t=Trace.load('/tmp/term.bin'); print(t, t.finished, json.load(open('/tmp/term.bin.stats.json'))['notes'])"
} > $OUT/timing.txt 2>&1

python3 -m pytest -m gpu tests/test_record.py -q -rs > $OUT/pytest.txt 2>&1
python3 -m pytest tests/test_record.py -q -rs >> $OUT/pytest.txt 2>&1
