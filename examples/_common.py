"""Helpers shared by the example training scripts: argument defaults, step timing, marks."""
from __future__ import annotations

import argparse
import json
import statistics
import time

try:                      # label the trace when run under `allocsim record`; harmless otherwise
    from allocsim import mark
except ImportError:       # pragma: no cover - allocsim not on the path
    def mark(label: str = "") -> None:
        pass


def parser(description: str, *, iters: int, batch: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--iters", type=int, default=iters, help=f"training steps (default {iters})")
    p.add_argument("--batch", type=int, default=batch, help=f"batch size (default {batch})")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the median step time")
    p.add_argument("--seed", type=int, default=0)
    return p


class StepTimer:
    """Wall time per step, measured after a device synchronisation; prints the median after warmup."""

    def __init__(self, sync, warmup: int):
        self.sync, self.warmup, self.times = sync, warmup, []

    def __enter__(self):
        self.sync()
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.sync()
        self.times.append(time.perf_counter() - self.t)

    def report(self, name: str) -> None:
        steady = self.times[self.warmup:] or self.times
        print(f"{name}: {len(self.times)} steps, median step {1e3 * statistics.median(steady):.2f} ms "
              f"(after {min(self.warmup, len(self.times))} warmup)", flush=True)


def train_steps(name: str, a, opt, make_batch, loss_of, sync) -> None:
    """The usual PyTorch loop: a fresh batch (untimed), then zero_grad, forward, backward, step (timed)."""
    timer = StepTimer(sync, a.warmup)
    for i in range(a.iters):
        batch = make_batch(i)
        with timer:
            opt.zero_grad(set_to_none=True)
            loss = loss_of(batch)
            loss.backward()
            opt.step()
    timer.report(name)
    print(f"loss {loss.item():.3f}", flush=True)


def print_memory_stats(torch, tag: str = "") -> None:
    """One line ``MEMORY_STATS <tag> {json}``: the caching allocator's own counters (``torch.cuda.memory_stats()``),
    to compare a recorded run with the same program run without recording (benchmarks/compare_memory_stats.py)."""
    torch.cuda.synchronize()
    stats = {k: v for k, v in sorted(torch.cuda.memory_stats().items()) if isinstance(v, (int, float))}
    print(f"MEMORY_STATS {tag or '-'} {json.dumps(stats, sort_keys=True)}", flush=True)


def recorded_parser(description: str, *, batch: int, dim: int, layers: int, **sizes):
    """The arguments of the examples recorded from inside Python (docs/recording.md): ``--record TRACE`` and the
    model's sizes (``--batch``, ``--dim``, ``--layers``, and any of ``seq=``, ``vocab=`` given)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--record", metavar="TRACE", help="record the run into TRACE from inside the program")
    for name, default in dict(batch=batch, dim=dim, layers=layers, **sizes).items():
        p.add_argument(f"--{name}", type=int, default=default, help=f"default {default}")
    return p


def cuda_torch(program: str):
    """torch, once it sees a CUDA GPU; else the program stops with one line saying so."""
    import sys
    import torch
    if not torch.cuda.is_available():
        sys.exit(f"{program}: needs a CUDA GPU (torch {torch.__version__} sees none)")
    return torch

