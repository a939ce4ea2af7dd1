# Sourced by the GPU scripts of runs of several processes (gpu_ranks_1gpu.sh, gpu_ranks_2gpu.sh): `step` runs one
# step with its own time limit and notes its status in $W/steps.txt, so a failed step leaves the rest to run.
T0=$(date +%s)
step() {     # step NAME LIMIT_S OUTFILE COMMAND...
  local name=$1 limit=$2 out=$3; shift 3
  local t0=$(date +%s)
  echo "== $name: $*" | tee -a $W/steps.txt
  case $out in *.json) ;; *) echo "== $name" >> $out ;; esac
  timeout $limit "$@" >> $out 2>&1
  local rc=$?
  echo "   $name rc=$rc in $(( $(date +%s) - t0 ))s (script at $(( $(date +%s) - T0 ))s)" | tee -a $W/steps.txt
  return $rc
}
