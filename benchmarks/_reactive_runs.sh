# Sourced by benchmarks/gpu_reactive.sh and gpu_reactive_explore.sh (issue 28): one run of a reactive program.
# `begin` sets W (the output folder), T0 (the start) and BUDGET (seconds for the whole script); RECORD_OPTS are
# `allocsim record`'s options (default: none, the recorder's defaults).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1

# begin DIR BUDGET: a fresh output folder, the clock, and what the machine is (env.txt)
begin() {
  W=$1; BUDGET=$2; T0=$(date +%s); rm -rf $W; mkdir -p $W
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
    git log -1 --format='commit %H %s' 2>/dev/null; nproc; } > $W/env.txt 2>&1
}

left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# go NAME LIMIT MODE PROG ARGS...: MODE rec (allocsim record), plain, or snap (plain, with its own snapshot);
# the program's REACTIVE line goes to NAME.json, a recording is validated aside (NAME.validate.txt; with INFO
# set, `allocsim info` too: NAME.info.txt)
go() {
  local name=$1 lim=$2 mode=$3; shift 3
  if [ $(left) -lt $((lim / 2)) ]; then echo "SKIP $name (time left $(left)s)"; return; fi
  [ $lim -gt $(left) ] && lim=$(left)
  local t=$(date +%s) rc
  case $mode in
    rec)   timeout $lim python3 -m allocsim record -o $W/$name.bin ${RECORD_OPTS:-} "$@" --oom-log $W/$name.oom.jsonl ;;
    plain) timeout $lim python3 "$@" --oom-log $W/$name.oom.jsonl ;;
    snap)  timeout $lim python3 "$@" --oom-log $W/$name.oom.jsonl --snapshot $W/$name.pickle ;;
  esac > $W/$name.log 2>&1
  rc=$?
  grep -h '^REACTIVE ' $W/$name.log | sed 's/^REACTIVE //' > $W/$name.json
  echo "$name rc=$rc $(( $(date +%s) - t ))s $(cat $W/$name.json)"
  if [ $mode = rec ] && [ -f $W/$name.bin ]; then
    ( timeout ${VALIDATE_S:-90} python3 -m allocsim validate $W/$name.bin > $W/$name.validate.txt 2>&1
      echo "rc=$?" >> $W/$name.validate.txt
      [ -n "${INFO:-}" ] && timeout 60 python3 -m allocsim info $W/$name.bin > $W/$name.info.txt 2>&1 ) &
  fi
}

# figure NAME KEY: a number from NAME.json (0 when the run printed none)
figure() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" $W/$1.json $2 2>/dev/null || echo 0; }

# cap_of COLD WARM FRACTION: halfway when the cold peak is 5 % or more above the warm one, else FRACTION x COLD
cap_of() { python3 -c "import sys; c, w, f = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]); \
print((c + w) // 2 if c - w > c // 20 else int(c * f))" "$@"; }
