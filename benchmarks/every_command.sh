#!/bin/bash
# Every command on every shipped trace, each bounded by `timeout`, one line per run in $OUT/results.tsv:
# command, trace, exit status, seconds, outcome (ok; TRACEBACK; timeout; rcN and the last line of its output),
# the log's number under $OUT/logs/. The cap is 0.8 x the recorded peak reserved (LOAD where none is recorded);
# fit and tune are bounded with --max-replays. From the repo root:
#     OUT=/tmp/every bash benchmarks/every_command.sh [TRACE ...]
# (about 50 minutes on 2 shared cores for traces/ and traces/runs/; results of 2026-12-02 in
# benchmarks/results/every_command-2026-12-02.txt).
P=${PYTHON:-python3}
export PYTHONPATH=$PWD
OUT=${OUT:-/tmp/every_command}
mkdir -p "$OUT/logs" "$OUT/plots"
RES=$OUT/results.tsv
: > "$RES"
POLICIES="bestfit binned knet none oracle simple split torch cupy"
TRACES=${*:-$(ls traces/*.bin traces/runs/*.bin)}
n=0
runone() {  # label, timeout, allocsim arguments...
  local label=$1 t=$2; shift 2
  n=$((n + 1))
  local log=$OUT/logs/$n.txt
  echo "# $*" > "$log"
  local s=$SECONDS
  timeout "$t" "$P" -m allocsim "$@" >> "$log" 2>&1
  local rc=$? outcome=ok
  if grep -q Traceback "$log"; then outcome=TRACEBACK
  elif [ $rc = 124 ]; then outcome=timeout
  elif [ $rc != 0 ]; then outcome="rc$rc: $(tail -1 "$log" | cut -c1-150)"
  fi
  printf "%s\t%s\t%s\t%ss\t%s\tlog %s\n" "$label" "$trace" $rc $((SECONDS - s)) "$outcome" $n >> "$RES"
}
for trace in $TRACES; do
  peak=$("$P" -m allocsim info "$trace" --json -q 2>/dev/null | "$P" -c \
    "import json,sys; d=json.load(sys.stdin); print(d['upstream_segments']['peak_reserved_bytes'] or d['load_bytes'])")
  cap=$(( ${peak:-1000000000} * 8 / 10 ))B
  runone info 60 info "$trace" -q
  for p in $POLICIES; do
    runone "replay $p" 60 replay "$trace" -p $p -q
    runone "replay $p --cap" 60 replay "$trace" -p $p --cap $cap -q
  done
  runone compare 120 compare "$trace" -j 1 -q --caps none,$cap
  runone fit 150 fit "$trace" -j 1 -q --max-replays 20
  runone tune 150 tune "$trace" -j 1 --max-replays 12
  runone "tune --cap" 150 tune "$trace" -j 1 --max-replays 12 --cap $cap
  runone validate 60 validate "$trace"
  rm -rf "$OUT/plots/$n"
  runone plot 120 plot "$trace" -j 1 --report "$OUT/plots/$n"
done
echo DONE >> "$RES"
