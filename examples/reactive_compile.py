"""A small CNN trained with ``torch.compile(mode="reduce-overhead")``: a program whose requests depend on memory.

With cold caches inductor benchmarks while it compiles (pad_mm) and autotunes each Triton kernel at its first
launch, inside the CUDA graph trees' warm-up run, before the forward and backward are recorded into the trees'
private pool; with warm caches (the program run again with the same ``TORCHINDUCTOR_CACHE_DIR`` and
``TRITON_CACHE_DIR``) it does neither. Neither catches an OOM: under a cap between the warm and the cold peak the
cold run dies, the warm one lives. Issue 28.
Ends with a ``REACTIVE {json}`` line (`_reactive`).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _reactive import Reactive, add_arguments, small_cnn  # noqa: E402


def main():
    a = add_arguments(argparse.ArgumentParser(description=__doc__), steps=6, batch=256).parse_args()
    with Reactive(a, "reactive_compile") as r:
        dev = torch.device("cuda")
        model = small_cnn().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        step_model = torch.compile(model, mode="reduce-overhead")
        loss_fn = torch.nn.CrossEntropyLoss()
        for i in range(a.steps):
            x = torch.randn(a.batch, 3, 32, 32, device=dev)
            y = torch.randint(0, 10, (a.batch,), device=dev)
            torch.compiler.cudagraph_mark_step_begin()
            loss = loss_fn(step_model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            print(f"step {i}: loss {loss.item():.4f}", flush=True)
    sys.exit(r.exit_status())


if __name__ == "__main__":
    main()
