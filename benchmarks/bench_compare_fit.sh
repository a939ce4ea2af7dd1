#!/bin/bash
# compare -j 2 vs -j 1, and fit on the largest shipped trace (issue 5's speed targets).
# Usage (repo root): bash benchmarks/bench_compare_fit.sh
set -eu
export PYTHONPATH=$PWD
T=traces/gpt2_variable.bin           # the largest shipped trace
P=binned,split,knet,torch,cupy,bestfit
t() { local s=$(date +%s.%N); "$@" > /dev/null; echo "$(echo "$(date +%s.%N) - $s" | bc)"; }
j1=$(t python3 -m allocsim compare $T --policies $P --caps none,8GB,12GB --runtime eager,gc -j 1 -q)
j2=$(t python3 -m allocsim compare $T --policies $P --caps none,8GB,12GB --runtime eager,gc -j 2 -q)
echo "compare $T, 36 cells: -j 1 ${j1}s, -j 2 ${j2}s, ratio $(echo "scale=3; $j2 / $j1" | bc) (start-up bound: each cell takes ~30 ms)"
A=/tmp/alloc-heavy-200k.bin
python3 -m allocsim synth alloc-heavy --param n_allocs=200000 -o $A > /dev/null
j1=$(t python3 -m allocsim compare $A --policies $P --caps none,64MB --runtime eager,gc -j 1 -q)
j2=$(t python3 -m allocsim compare $A --policies $P --caps none,64MB --runtime eager,gc -j 2 -q)
echo "compare alloc-heavy 200k, 24 cells: -j 1 ${j1}s, -j 2 ${j2}s, ratio $(echo "scale=3; $j2 / $j1" | bc)"
f=$(t python3 -m allocsim fit $T --policies $P -j 2 -q)
echo "fit $T ($P + oracle), -j 2: ${f}s"
