"""Requests the program survives failing (CATCHES_OOM, docs/allocator-dependent.md): the converter flags them
from C++ frames, `allocsim record --stacks all` records them on a GPU (marked gpu)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from allocsim.trace import Trace
from allocsim.trace import events as ev

from test_record import _gpu_ok, _script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONV_NET = """
    import torch
    torch.backends.cudnn.benchmark = False
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(32, 64, 5, padding=2), torch.nn.ReLU(),
                              torch.nn.Conv2d(64, 8, 3)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    for side in (64, 96, 64, 128):        # a new shape: cuDNN tries configs; a seen one: the cached plan
        opt.zero_grad()
        net(torch.rand(4, 3, side, side, device="cuda")).sum().backward()
        opt.step()
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok("torch"), reason="needs torch with a CUDA GPU")
def test_a_conv_net_recorded_with_cpp_stacks_has_flagged_workspace_requests(tmp_path):
    s = _script(tmp_path, "conv.py", CONV_NET)
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = str(tmp_path / "conv.bin")
    r = subprocess.run([sys.executable, "-m", "allocsim", "record", "--stacks", "all", "-o", out, s],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    t = Trace.load(out)
    stats = json.load(open(out + ".stats.json"))
    flagged = np.count_nonzero((t.kind == ev.ALLOC) & (t.flags & ev.CATCHES_OOM != 0))
    assert t.meta["stacks"] == "all"
    assert flagged >= 1 and flagged == stats["conversion"]["catches_oom"], (flagged, stats["conversion"])
