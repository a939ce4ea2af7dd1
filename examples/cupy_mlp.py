"""A 3-layer MLP trained in plain CuPy with a hand-written backward pass and SGD, on random data."""
import os
import sys

import cupy as cp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import StepTimer, mark, parser  # noqa: E402


def main():
    p = parser(__doc__, iters=20, batch=256)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-2)
    a = p.parse_args()
    rs = cp.random.RandomState(a.seed)
    sizes = [a.features, a.hidden, a.hidden, a.classes]
    W = [rs.standard_normal((i, o), dtype=cp.float32) * (2.0 / i) ** 0.5 for i, o in zip(sizes, sizes[1:])]
    b = [cp.zeros(o, cp.float32) for o in sizes[1:]]
    timer = StepTimer(cp.cuda.Device().synchronize, a.warmup)
    for step in range(a.iters):
        x = rs.standard_normal((a.batch, a.features), dtype=cp.float32)
        y = rs.randint(0, a.classes, a.batch)
        with timer:
            acts = [x]                                   # forward, keeping activations
            for k in range(len(W)):
                z = acts[-1] @ W[k] + b[k]
                acts.append(cp.maximum(z, 0) if k < len(W) - 1 else z)
            logits = acts[-1]
            logits = logits - logits.max(axis=1, keepdims=True)
            prob = cp.exp(logits)
            prob /= prob.sum(axis=1, keepdims=True)
            loss = -cp.log(prob[cp.arange(a.batch), y] + 1e-9).mean()
            grad = prob                                  # backward of softmax cross-entropy
            grad[cp.arange(a.batch), y] -= 1
            grad /= a.batch
            for k in reversed(range(len(W))):
                gW = acts[k].T @ grad
                gb = grad.sum(axis=0)
                if k > 0:
                    grad = (grad @ W[k].T) * (acts[k] > 0)
                W[k] -= a.lr * gW
                b[k] -= a.lr * gb
            del acts, prob, grad, gW, gb
        mark(f"step {step + 1}")
    timer.report("cupy_mlp")
    print(f"loss {float(loss):.3f}")


if __name__ == "__main__":
    main()
