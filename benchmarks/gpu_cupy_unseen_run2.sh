#!/bin/bash
# A second, short GPU session for issue 20 item 2: the `cycles-fixed` workload (arrays in reference cycles whose
# sizes the request meeting the pool's limit shares) and `issue11` as first written (one oversized batch),
# each run plainly twice and recorded once, validated with and without the IN_REQUEST flags honoured.
# Usage (repo root, on a GPU machine): OUT=/some/dir bash benchmarks/gpu_cupy_unseen_run2.sh  -> $OUT/cupyp2.tgz
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
W=$OUT/w2; mkdir -p $W/plain $W/rec
for wl in cycles-fixed issue11; do
  for k in 1 2; do timeout 60 python3 benchmarks/gpu_cupy_pressure.py $W/plain/$wl.plain$k.json --workload $wl > $W/plain/$wl.plain$k.txt 2>&1; echo "rc=$? $wl plain$k"; done
  timeout 90 python3 -m allocsim record --framework cupy -o $W/rec/cupy-$wl.bin benchmarks/gpu_cupy_pressure.py $W/rec/$wl.recorded.json --workload $wl > $W/rec/$wl.record.txt 2>&1; echo "rc=$? $wl recorded"
  timeout 60 python3 -m allocsim validate $W/rec/cupy-$wl.bin > $W/rec/$wl.validate.txt 2>&1; echo "rc=$? $wl validate"
done > $W/runs.log 2>&1
tar czf $OUT/cupyp2.tgz -C $W .
cat $W/runs.log; tail -3 $W/rec/*.validate.txt; grep -h '"step"' $W/plain/cycles-fixed.plain1.txt | tail -3
