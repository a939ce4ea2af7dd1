#!/bin/bash
# One GPU, issue 32 item 5: recording where people train. About 3 minutes on an H200 (torch 2.11, pytorch-lightning,
# transformers, accelerate installed; nothing downloaded: every model is built in code; each program's unrecorded run
# goes on beside its recorded one).
#   - the CPU-tested parts again where Lightning and transformers are installed (tests/test_integrations.py, ...);
#   - what PyTorch accepts at run time, for tune's Python form (benchmarks/gpu_runtime_settings.py);
#   - a Lightning run and a Hugging Face Trainer run recorded through the callbacks (examples/lightning_train.py,
#     examples/hf_train.py), a notebook-style script recorded with allocsim.recording / start_recording, started
#     before the model is on the GPU and after it (examples/notebook_train.py), `allocsim record -- python -m
#     torch.distributed.run --nproc-per-node 2` (two gloo ranks on the one GPU, examples/dist_train.py) and
#     `allocsim record -- accelerate launch` (one process, examples/hf_train.py);
#   - each program run again without recording: its MEMORY_STATS line (torch.cuda.memory_stats()) compared with the
#     recorded run's (benchmarks/compare_memory_stats.py); each trace through `allocsim validate` and `allocsim info`.
# Usage (repo root, on a GPU machine): OUT=/some/dir bash benchmarks/gpu_trainers.sh
# Writes $OUT/trainers.tar.gz: env.txt, tests.txt, runtime-settings.json, runtime-fraction.json, <run>.rec.txt and
# <run>.plain.txt (each program's output), compare.txt, validate.txt, info.txt, traces/ (the traces and their stats),
# steps.txt (each step's exit status and time), summary.txt. Every failed step is listed in summary.txt as FAILED, and
# the script's exit status is 1 then (the rest still runs).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
REPO=$PWD
: "${OUT:?set OUT to the folder for trainers.tar.gz}"
W=$OUT/w; mkdir -p $W/traces
. $REPO/benchmarks/_gpu_steps.sh
pack() { tar czf $OUT/trainers.tar.gz -C $W . ; }
trap pack EXIT
: > $W/summary.txt
run() {      # run NAME LIMIT_S OUTFILE COMMAND...: a step whose failure is counted (a line in summary.txt: it may run
             # in the background)
  step "$@" || echo "FAILED: $1 (see $(basename $3))" >> $W/summary.txt
}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  for m in pytorch_lightning lightning transformers accelerate; do
    python3 -c "import $m; print('$m', $m.__version__)" 2>&1 | tail -1
  done
  which accelerate torchrun; env | grep -E "^(PYTORCH|CUDA)" | sort
} > $W/env.txt 2>&1
if which accelerate > /dev/null 2>&1; then ACCELERATE=(accelerate launch); else
  ACCELERATE=(python3 -m accelerate.commands.launch); fi

run tests 60 $W/tests.txt python3 -m pytest -q -rs -p no:cacheprovider tests/test_integrations.py
run runtime-settings 30 $W/runtime-settings.json python3 benchmarks/gpu_runtime_settings.py settings
run runtime-fraction 30 $W/runtime-fraction.json python3 benchmarks/gpu_runtime_settings.py fraction

cd $W/traces
both() {     # both NAME LIMIT_S "RECORDED COMMAND" "PLAIN COMMAND" [late]: a recorded run (writes NAME.bin here), the
             # same program not recorded ("@OTHER": OTHER's plain run, the same program), their MEMORY_STATS compared,
             # the trace validated and shown; "late": a trace started late, whose validate says "unseeded" (the
             # model places the pre-existing blocks itself), so its verdict is shown but not counted as a failure
             # The plain run goes on beside the recorded one: each process has its own allocator and counters.
  local name=$1 limit=$2 plain=$W/$1.plain.txt
  case $4 in @*) plain=$W/${4#@}.plain.txt ;; *) run "$name not recorded" $limit $plain bash -c "$4" & ;; esac
  run "$name recorded" $limit $W/$name.rec.txt bash -c "$3"
  wait
  run "$name memory_stats" 10 $W/compare.txt python3 $REPO/benchmarks/compare_memory_stats.py $W/$name.rec.txt $plain
  if [ "${5:-}" = late ]; then step "$name validate (late: unseeded)" 60 $W/validate.txt python3 -m allocsim validate $name.bin
  else run "$name validate" 60 $W/validate.txt python3 -m allocsim validate $name.bin; fi
  run "$name info" 60 $W/info.txt python3 -m allocsim info $name.bin
}
E=$REPO/examples
both lightning 90 "python3 $E/lightning_train.py --record lightning.bin" "python3 $E/lightning_train.py"
both hf 90 "python3 $E/hf_train.py --record hf.bin" "python3 $E/hf_train.py"
both notebook 40 "python3 $E/notebook_train.py --record notebook.bin" "python3 $E/notebook_train.py"
both notebook-start 40 "python3 $E/notebook_train.py --record notebook-start.bin --form start" @notebook
both notebook-late 40 "python3 $E/notebook_train.py --record notebook-late.bin --late" \
  "python3 $E/notebook_train.py --late" late
DIST="-m torch.distributed.run --standalone --nproc-per-node 2 $E/dist_train.py --backend gloo --model tiny --iters 4 \
  --layers 2 --dim 256 --seq 128 --memory-stats"
# two processes on one GPU: are the counters even the same between two runs without recording? (not counted)
step "dist not recorded, again" 120 $W/dist.plain2.txt bash -c "python3 $DIST" &
both dist 120 "python3 -m allocsim record -o dist.bin -- python3 $DIST" "python3 $DIST"
step "dist memory_stats, two runs not recorded" 10 $W/compare.txt python3 $REPO/benchmarks/compare_memory_stats.py \
  $W/dist.plain.txt $W/dist.plain2.txt
ACC="${ACCELERATE[*]} --num_processes 1 --num_machines 1 --mixed_precision no --dynamo_backend no $E/hf_train.py --steps 8"
both acc 120 "python3 -m allocsim record -o acc.bin -- $ACC --record acc.bin" "$ACC"
ls -la > $W/traces.txt
cd $REPO

# what the lead reads first: the verdicts, the phases, the memory_stats comparisons
{ grep -E "^== |verdict" $W/validate.txt
  grep -E "^== |phase|PHASE|eval|checkpoint" $W/info.txt | head -60
  cat $W/compare.txt
  python3 -c "import json; d = json.load(open('$W/runtime-settings.json')); \
print('runtime settings:', json.dumps(d['accepted_with_segments_live'])); \
print('expandable at run time:', d['expandable_segments_at_run_time']['segments_after']); \
print('runtime_text selects the setting:', d['ok'])" 2>&1
  tail -4 $W/runtime-fraction.json
  tail -3 $W/tests.txt
} >> $W/summary.txt
FAILED=$(grep -c '^FAILED' $W/summary.txt)
echo "failed steps: $FAILED" >> $W/summary.txt
cat $W/summary.txt; cat $W/steps.txt
exit $(( FAILED > 0 ))
