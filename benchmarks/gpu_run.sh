#!/bin/bash
# One GPU session's work for the real-allocator paths (issue 4) and the recorder overhead (issue 3).
# Usage (repo root, on a GPU machine): OUT=/some/dir bash benchmarks/gpu_run.sh
# Writes $OUT/gpu.tgz holding: tests.txt, calibrate.txt, costs-h100.json, replays.txt, overhead.txt,
# validate.txt, and the re-recorded cupy_mlp trace with its stats.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
A="python3 -m allocsim"
# 1. re-record the CuPy trace with the recorder that treats 0-byte requests as requests
$A record -o traces/cupy_mlp.bin examples/cupy_mlp.py --iters 20 > $W/record-cupy.txt 2>&1
cp traces/cupy_mlp.bin traces/cupy_mlp.bin.stats.json $W/
$A validate traces/cupy_mlp.bin > $W/validate.txt 2>&1
# 2. every GPU-marked test, then the two GPU test files whole
python3 -m pytest -m gpu tests/test_gpu_replay.py tests/test_record.py -q -rs > $W/tests.txt 2>&1
python3 -m pytest tests/test_gpu_replay.py -q -rs >> $W/tests.txt 2>&1
# 3. calibrate
$A calibrate -o $W/costs-h100.json > $W/calibrate.txt 2>&1
# 4. real allocators against their models, and --backend cuda
{
  for t in resnet50 resnet50-expandable gpt2-maxsplit128-rp2div4 bert_mlm; do
    echo "== $t"; $A replay traces/$t.bin --policy torch --json --no-sections | python3 -c "import json,sys; d=json.load(sys.stdin); print('model', d['peak_reserved_bytes'], d['final_reserved_bytes'], d['device_mallocs'])"
    $A replay traces/$t.bin --policy torch-real --json | python3 -c "import json,sys; d=json.load(sys.stdin); print('real ', d['peak_reserved_bytes'], d['final_reserved_bytes'], d['device_mallocs'], 'p50', d['latency']['p50'], 'p99', d['latency']['p99'])"
  done
  echo "== cupy_mlp cupy model vs cupy-real"
  $A replay traces/cupy_mlp.bin --policy cupy --no-sections
  $A replay traces/cupy_mlp.bin --policy cupy-real --no-sections
  $A replay traces/cupy_mlp.bin --policy cupy-async --no-sections
  $A replay traces/cupy_mlp.bin --policy cuda-direct --no-sections
  echo "== resnet50 split, simulated vs --backend cuda"
  $A replay traces/resnet50.bin --policy split --no-sections
  $A replay traces/resnet50.bin --policy split --backend cuda --no-sections
  $A replay traces/resnet50.bin --policy split --cost-model $W/costs-h100.json --no-sections
} > $W/replays.txt 2>&1
# 5. recorder overhead: interleaved plain and recorded ResNet-50 runs, median step after warmup
{
  for k in 1 2 3 4; do
    echo "== plain $k"; python3 examples/resnet50_train.py --iters 40 --warmup 8
    echo "== recorded $k"; $A record -o /tmp/ovh.bin examples/resnet50_train.py --iters 40 --warmup 8
  done
} > $W/overhead.txt 2>&1
tar czf $OUT/gpu.tgz -C $W .
