"""A training loop with its own ``try/except torch.OutOfMemoryError``: on an OOM it frees what the failed step
held, empties the cache, halves the batch and tries the step again (the usual "find the batch that fits" code).

The try body runs inside ``allocsim.tries("backoff")`` when allocsim has it, so `allocsim record` marks the
requests this program survives failing; without allocsim (or an allocsim without ``tries``) it runs the same.
Issue 28. Ends with a ``REACTIVE {json}`` line (`_reactive`).
"""
import argparse
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _reactive import Reactive, add_arguments, small_cnn  # noqa: E402

try:
    import allocsim
    tries = getattr(allocsim, "tries", None)
except ImportError:             # pragma: no cover - allocsim not on the path
    tries = None
if tries is None:
    def tries(label):
        return contextlib.nullcontext()


def main():
    p = add_arguments(argparse.ArgumentParser(description=__doc__), steps=6, batch=2048)
    p.add_argument("--width", type=int, default=64, help="first conv's channels (default 64)")
    a = p.parse_args()
    with Reactive(a, "reactive_backoff") as r:
        dev = torch.device("cuda")
        model = small_cnn(a.width).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        batch, step = a.batch, 0
        while step < a.steps:
            x = torch.randn(batch, 3, 32, 32, device=dev)
            y = torch.randint(0, 10, (batch,), device=dev)
            failed = False
            try:
                with tries("backoff"):
                    opt.zero_grad(set_to_none=True)
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    opt.step()
            except torch.OutOfMemoryError:
                if batch == 1:
                    raise
                failed = True
            if failed:          # out of the except block: its traceback no longer holds the step's tensors
                r.caught += 1
                loss = x = y = None
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                batch //= 2
                print(f"step {step}: out of memory, batch now {batch}", flush=True)
                continue
            print(f"step {step}: batch {batch}, loss {loss.item():.4f}", flush=True)
            step += 1
    sys.exit(r.exit_status())


if __name__ == "__main__":
    main()
