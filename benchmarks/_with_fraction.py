"""Run a training script under a per-process memory fraction: ``python _with_fraction.py F script.py args...``.

`benchmarks/gpu_closed_loop.py` runs it under ``allocsim record`` so the limit is set inside the recorded
program (the recorder writes it as a SET_LIMIT event), then the script runs as ``python script.py`` would.
F is the allowed bytes divided by the device's total memory; 0 leaves the limit unset.
"""
import runpy
import sys

import torch

fraction = float(sys.argv[1])
script = sys.argv[2]
if fraction:
    torch.cuda.set_per_process_memory_fraction(fraction)
sys.argv = sys.argv[2:]
sys.path.insert(0, script.rsplit("/", 1)[0] if "/" in script else ".")
runpy.run_path(script, run_name="__main__")
