"""The closed loop on a real GPU (`benchmarks/gpu_closed_loop.py --quick`): record a training script, tune
it, record it again with the recommended settings, and require tune's predicted peak reserved, device
mallocs and OOMs to equal what the allocator itself reports. Skipped, with the reason, without a CUDA GPU."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


def _torch_gpu() -> str:
    """Empty when torch sees a CUDA GPU, else why not."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    return "" if torch.cuda.is_available() else "torch sees no CUDA GPU"


WHY = _torch_gpu()


@pytest.mark.gpu
@pytest.mark.skipif(bool(WHY), reason=f"needs torch with a CUDA GPU: {WHY}")
def test_tune_prediction_is_what_the_gpu_does(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_closed_loop.py"), "--quick"],
                       cwd=ROOT, env=dict(os.environ, OUT=str(tmp_path)), capture_output=True, text=True)
    assert p.returncode in (0, 1), p.stderr[-3000:]
    [row] = json.load(open(tmp_path / "closed_loop.json"))
    for key in ("peak_reserved_bytes", "device_mallocs", "ooms"):
        assert row["predicted"][key] == row["measured"][key], (key, row)
    assert row["measured"]["exit_status"] == 0
