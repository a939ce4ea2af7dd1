"""Recording from inside Python, as a notebook would (docs/recording.md): a plain PyTorch loop around
``with allocsim.recording(...)`` (``--form with``) or ``allocsim.start_recording`` / ``stop_recording``
(``--form start``). With ``--late`` the model is on the GPU before recording starts, as in a notebook whose
cells built it first: the trace then starts with those blocks as pre-existing, and says what it lacks.

    python examples/notebook_train.py --record nb.bin [--form start] [--late]
    python examples/notebook_train.py [--late]          # the same program, not recorded

It ends with a ``MEMORY_STATS`` line: the allocator's own counters, which recording leaves unchanged.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_memory_stats  # noqa: E402


def model_of(a):
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(a.dim, 4 * a.dim), nn.GELU(), nn.Linear(4 * a.dim, a.dim))
                           for _ in range(a.layers)))


def train(model, a, dev) -> float:
    import torch
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    for step in range(a.iters):
        x = torch.randn(a.batch, a.dim, generator=g).to(dev)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == a.iters // 2:
            import allocsim
            allocsim.mark("half way")         # a label of the program's own (a no-op when nothing records)
            with torch.no_grad():
                model(torch.randn(4 * a.batch, a.dim, generator=g).to(dev))     # an evaluation's larger batch
    return float(loss)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", metavar="TRACE", help="record into TRACE from inside the program")
    p.add_argument("--form", choices=["with", "start"], default="with")
    p.add_argument("--late", action="store_true", help="put the model on the GPU before recording starts")
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("notebook_train.py: needs a CUDA GPU")
    dev = torch.device("cuda")
    model = model_of(a).to(dev) if a.late else None
    import allocsim
    if not a.record:
        recording = contextlib.nullcontext()
    elif a.form == "with":
        recording = allocsim.recording(a.record, force=True)
    else:
        allocsim.start_recording(a.record, force=True)
        recording = contextlib.nullcontext()
    with recording:
        if model is None:
            model = model_of(a).to(dev)
        loss = train(model, a, dev)
    if a.record and a.form == "start":
        allocsim.stop_recording()
    print(f"notebook ({a.form}{', late' if a.late else ''}): loss {loss:.4f}", flush=True)
    print_memory_stats(torch, "notebook")
    return 0


if __name__ == "__main__":
    sys.exit(main())
