"""Recording from inside Python, as a notebook would (docs/recording.md): a plain PyTorch loop around
``with allocsim.recording(...)`` (``--form with``) or ``allocsim.start_recording`` / ``stop_recording``
(``--form start``). With ``--late`` the model is on the GPU before recording starts, as in a notebook whose
cells built it first: the trace then starts with those blocks as pre-existing, and says what it lacks.

    python examples/notebook_train.py --record nb.bin [--form start] [--late]
    python examples/notebook_train.py [--late]          # the same program, not recorded

It ends with a ``MEMORY_STATS`` line: the allocator's own counters, which recording leaves unchanged.
"""
from __future__ import annotations

import contextlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import cuda_torch, print_memory_stats, recorded_parser  # noqa: E402


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
    p = recorded_parser(__doc__.splitlines()[0], batch=64, dim=1024, layers=4, iters=8)
    p.add_argument("--form", choices=["with", "start"], default="with")
    p.add_argument("--late", action="store_true", help="put the model on the GPU before recording starts")
    a = p.parse_args()
    torch = cuda_torch("notebook_train.py")
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
