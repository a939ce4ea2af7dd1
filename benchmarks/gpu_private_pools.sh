#!/bin/bash
# One GPU session for issue 20 item 1 (private pools: CUDA graphs, torch.compile reduce-overhead, MemPool).
# Usage (repo root, on a GPU machine): OUT=/some/dir bash benchmarks/gpu_private_pools.sh
# For each workload of examples/private_pools.py (capture, mempool, compile): record it with `allocsim record`,
# run it again with its own full history and dump a snapshot (for `allocsim import`), then `allocsim validate`
# the trace and the imported snapshot; `allocsim tune` on the capture trace; the gpu-marked pool tests.
# Writes $OUT/pools.tgz: env.txt, runs.log, pools-*.bin (+ .stats.json), pools-*.pickle (-mid: before the pools are
# released), validate.txt, tune.txt,
# tests.txt. Each step has its own timeout; a failing step leaves the others' files.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
export TORCHINDUCTOR_CACHE_DIR=$W/inductor-cache        # the snapshot run of `compile` reuses the recorded run's kernels
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} > $W/env.txt 2>&1
for w in capture mempool compile; do
  echo "=== $w: record" >> $W/runs.log
  ( time timeout 150 python3 -m allocsim record -o $W/pools-$w.bin examples/private_pools.py --workload $w ) >> $W/runs.log 2>&1
  echo "rc=$?" >> $W/runs.log
  echo "=== $w: snapshot" >> $W/runs.log
  ( time timeout 120 python3 examples/private_pools.py --workload $w --snapshot $W/pools-$w.pickle ) >> $W/runs.log 2>&1
  echo "rc=$?" >> $W/runs.log
  for snap in $W/pools-$w.pickle $W/pools-$w-mid.pickle; do
    [ -f $snap ] || continue
    python3 -m allocsim import $snap -o ${snap%.pickle}-imported.bin >> $W/runs.log 2>&1
    echo "import $snap rc=$?" >> $W/runs.log
  done
done
for f in $W/pools-capture.bin $W/pools-mempool.bin $W/pools-compile.bin $W/pools-*-imported.bin; do
  echo "=== validate $f"; timeout 60 python3 -m allocsim validate $f; echo "rc=$?"
done > $W/validate.txt 2>&1
timeout 90 python3 -m allocsim tune $W/pools-capture.bin > $W/tune.txt 2>&1; echo "rc=$?" >> $W/tune.txt
timeout 120 python3 -m pytest -m gpu tests/test_record_pools.py -q -rs -p no:cacheprovider > $W/tests.txt 2>&1
echo "pytest rc=$?" >> $W/tests.txt
rm -rf $W/inductor-cache
tar czf $OUT/pools.tgz -C $W .
tail -40 $W/runs.log; grep -E "^===|verdict|MATCH|not modelled|rc=" $W/validate.txt; tail -5 $W/tune.txt; tail -5 $W/tests.txt
