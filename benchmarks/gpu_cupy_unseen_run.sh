#!/bin/bash
# One GPU session for issue 20 item 2 (CuPy under pressure on programs the model has not seen).
# Usage (repo root, on a GPU machine): OUT=/some/dir bash benchmarks/gpu_cupy_unseen_run.sh
# Writes $OUT/cupyp.tgz holding:
#   env.txt       GPU, driver, Python, CuPy and CUDA versions, gc thresholds, installed cupy wheels
#   ties-*.json   benchmarks/gpu_cupy_ties.py, twice (which of equal free chunks the pool hands out)
#   plain/        each workload of benchmarks/gpu_cupy_pressure.py run plainly twice (three of them twice more
#                 with PYTHONHASHSEED=0): per-step pool figures on stdout and in NAME.plainK.json
#   rec/          each workload under `allocsim record` (cupy-NAME.bin + .stats.json, NAME.recorded.json)
#   validate.txt  `allocsim validate` of each recording (the code on this branch as committed)
#   replay-real.txt each recording replayed by the model and twice by CuPy's own pool (cupy-real)
#   tests.txt     the gpu-marked CuPy tests
#   runs.log      every command with its exit status and seconds
# Each step has its own timeout; one failing does not stop the others. Aims at under 3 minutes.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W/plain $W/rec
LOG=$W/runs.log
run() {     # run LIMIT_S OUTFILE CMD...: the command's stdout+stderr to OUTFILE, a line to runs.log
    local limit=$1 out=$2; shift 2
    local t0=$SECONDS
    timeout $limit "$@" > $out 2>&1
    local rc=$?
    echo "rc=$rc $((SECONDS - t0))s: $*" >> $LOG
    return 0
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 - <<'EOF'
import gc, sys
import cupy
from cupy.cuda import runtime
print(sys.version)
print("cupy", cupy.__version__, "cuda runtime", runtime.runtimeGetVersion(), "driver", runtime.driverGetVersion())
print("gc thresholds", gc.get_threshold(), "enabled", gc.isenabled())
pool = cupy.get_default_memory_pool()
print("default pool", type(pool), "limit", pool.get_limit())
EOF
  python3 -m pip list 2>/dev/null | grep -i -E "cupy|cuda" ; true
} > $W/env.txt 2>&1
for k in 1 2; do run 60 $W/ties-$k.txt python3 benchmarks/gpu_cupy_ties.py $W/ties-$k.json; done
WORKLOADS="variable cycles cycles-auto oom-backoff streams issue11"
for wl in $WORKLOADS; do
  for k in 1 2; do run 60 $W/plain/$wl.plain$k.txt python3 benchmarks/gpu_cupy_pressure.py $W/plain/$wl.plain$k.json --workload $wl; done
  case $wl in variable|cycles-auto|issue11)
    for k in 1 2; do run 60 $W/plain/$wl.hashseed0-$k.txt env PYTHONHASHSEED=0 python3 benchmarks/gpu_cupy_pressure.py $W/plain/$wl.hashseed0-$k.json --workload $wl; done;;
  esac
  run 90 $W/rec/$wl.record.txt python3 -m allocsim record --framework cupy -o $W/rec/cupy-$wl.bin benchmarks/gpu_cupy_pressure.py $W/rec/$wl.recorded.json --workload $wl
done
# the issue's program recorded twice more: does the recorded run itself repeat?
for k in 2 3; do run 90 $W/rec/variable.record$k.txt python3 -m allocsim record --framework cupy -o $W/rec/cupy-variable-$k.bin benchmarks/gpu_cupy_pressure.py $W/rec/variable.recorded$k.json --workload variable; done
for f in $W/rec/cupy-*.bin; do echo "== $f"; timeout 60 python3 -m allocsim validate $f; echo "rc=$?"; done > $W/validate.txt 2>&1
# the real pool replaying each recording (cupy-real, twice) beside the model: the same requests, CuPy's own ties
for f in $W/rec/cupy-*.bin; do for pol in cupy cupy-real cupy-real; do
  echo "== $f $pol"; timeout 60 python3 -m allocsim replay $f -p $pol --keep-going --json | python3 -c "import json,sys; d=json.load(sys.stdin); print({k: d.get(k) for k in ('peak_reserved_bytes', 'final_reserved_bytes', 'device_mallocs', 'device_frees', 'ooms')})"
done; done > $W/replay-real.txt 2>&1
run 150 $W/tests.txt python3 -m pytest -m gpu tests/test_cupy_pressure.py tests/test_record_pressure.py -k "cupy or CuPy" -q -rs -p no:cacheprovider
tar czf $OUT/cupyp.tgz -C $W .
cat $W/env.txt; cat $W/ties-1.txt $W/ties-2.txt
for wl in $WORKLOADS; do echo "== $wl"; for f in $W/plain/$wl.*.txt; do
  python3 -c "import json,sys; print(sys.argv[1].split('/')[-1], [json.loads(l)['total']>>20 for l in open(sys.argv[1]) if l.startswith('{\"step')])" $f; done; done 2>&1
grep -E "^==|MATCH|verdict|rc=" $W/validate.txt | head -60; cat $W/replay-real.txt; tail -5 $W/tests.txt; cat $LOG
