#!/bin/bash
# One GPU session for issue 11's recorder side: the gpu-marked recorder tests (the same scripts run with and
# without `allocsim record`), the pressure recordings with their plain-vs-recorded figures, and
# `allocsim validate` on each new trace. Usage (repo root, on a GPU machine): OUT=/some/dir bash benchmarks/gpu_pressure_run.sh
# Writes $OUT/pressure.tgz: env.txt, tests.txt, record.txt, rec/ (traces, stats, figures, compare.txt, runs.log), validate.txt
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W/rec
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, torchvision, cupy; print(sys.version); print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'cupy', cupy.__version__)"
} > $W/env.txt 2>&1
timeout 240 python3 -m pytest -m gpu tests/test_record_pressure.py tests/test_record.py -q -rs -p no:cacheprovider > $W/tests.txt 2>&1
echo "pytest rc=$?" >> $W/tests.txt
timeout 270 python3 benchmarks/gpu_pressure_record.py $W/rec > $W/record.txt 2>&1
echo "record rc=$?" >> $W/record.txt
for f in $W/rec/pressure-*.bin; do python3 -m allocsim validate $f; echo "rc=$?"; done > $W/validate.txt 2>&1
tar czf $OUT/pressure.tgz -C $W .
cat $W/tests.txt | tail -25; cat $W/record.txt | tail -60; grep -E "^validate|verdict|rc=" $W/validate.txt
