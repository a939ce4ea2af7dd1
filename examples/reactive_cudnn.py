"""torchvision's ResNet-50 (random weights and data, nothing downloaded) trained a few steps with
``torch.backends.cudnn.benchmark = True``: cuDNN picks each convolution's plan by timing the candidates, sizing
their workspace from what the caching allocator holds and halving it on an OOM. Issue 28.
Ends with a ``REACTIVE {json}`` line (`_reactive`).
"""
import argparse
import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _reactive import Reactive, add_arguments  # noqa: E402


def main():
    p = add_arguments(argparse.ArgumentParser(description=__doc__), steps=4, batch=64)
    p.add_argument("--image", type=int, default=224, help="image side (default 224)")
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    with Reactive(a, "reactive_cudnn") as r:
        dev = torch.device("cuda")
        model = torchvision.models.resnet50(weights=None).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        for i in range(a.steps):
            x = torch.randn(a.batch, 3, a.image, a.image, device=dev)
            y = torch.randint(0, 1000, (a.batch,), device=dev)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            print(f"step {i}: loss {loss.item():.4f}", flush=True)
    sys.exit(r.exit_status())


if __name__ == "__main__":
    main()
