"""What the reactive examples share: a memory cap, a log of every OOM the allocator raised (with its stacks), and
the final JSON line of the allocator's own counters.

Issue 28's programs react to memory: cuDNN's workspace tries and a user's back-off catch an allocation failure
and go on, and a cold torch.compile makes requests (compile-time benchmarks, autotuning) a warm one does not. To
see which code caught what, each OOM the caching allocator raises is logged
by an OOM observer (``torch._C._cuda_attach_out_of_memory_observer``; PyTorch calls it after releasing the
allocator's lock, before it raises) with the Python stack and, where PyTorch can give them, the C++ frames
(``CapturedTraceback``: gathered at the OOM, symbolised once at the end). The last line a program prints is
``REACTIVE {json}``: peak reserved bytes, retries, OOMs, allocations, cudaMalloc/cudaFree counts (from
``torch.cuda.memory_stats()``, the same with and without ``allocsim record``), the OOMs the program itself
caught and whether one ended it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

#: The counters of ``torch.cuda.memory_stats()`` in the final line (output name -> counter).
STATS = {"peak_reserved": "reserved_bytes.all.peak", "peak_allocated": "allocated_bytes.all.peak",
         "num_alloc_retries": "num_alloc_retries", "num_ooms": "num_ooms",
         "allocations": "allocation.all.allocated", "device_mallocs": "num_device_alloc",
         "device_frees": "num_device_free"}


def add_arguments(p: argparse.ArgumentParser, *, steps: int, batch: int) -> argparse.ArgumentParser:
    p.add_argument("--steps", type=int, default=steps, help=f"training steps (default {steps})")
    p.add_argument("--batch", type=int, default=batch, help=f"batch size (default {batch})")
    p.add_argument("--cap-bytes", type=int, default=0,
                   help="allow this many bytes (set_per_process_memory_fraction(N / total)); 0: no cap")
    p.add_argument("--oom-log", metavar="PATH", help="write each OOM the allocator raised, with stacks, as JSONL")
    p.add_argument("--snapshot", metavar="PATH",
                   help="record the allocator's history with Python and C++ stacks and dump a snapshot here at the end")
    p.add_argument("--seed", type=int, default=0)
    return p


class Reactive:
    """The run's cap, OOM observer and final report: ``with Reactive(args, "name") as r: ...; r.caught += 1``."""

    def __init__(self, args, name: str):
        self.args, self.name = args, name
        self.caught = 0             # OOMs the program's own code caught
        self.died = None            # the OOM that ended the run, if one did
        self.ooms: list[dict] = []
        self.tracebacks = []

    def __enter__(self):
        torch.manual_seed(self.args.seed)
        torch.cuda.init()
        if self.args.snapshot:
            torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="all")
        self.total = torch.cuda.get_device_properties(0).total_memory
        if self.args.cap_bytes:
            torch.cuda.set_per_process_memory_fraction(self.args.cap_bytes / self.total)
        torch._C._cuda_attach_out_of_memory_observer(self._observe)
        self.t0 = time.perf_counter()
        return self

    def _observe(self, device, size, allowed, free):
        """One OOM, seen before PyTorch raises it: its size and the stacks that asked (no device work here)."""
        self.ooms.append({"n": len(self.ooms) + 1, "size": int(size), "allowed": int(allowed), "free": int(free),
                          "t": round(time.perf_counter() - self.t0, 3),
                          "python": [f"{f.filename}:{f.lineno}:{f.name}" for f in traceback.extract_stack()[:-1]]})
        try:
            from torch.utils._traceback import CapturedTraceback
            self.tracebacks.append(CapturedTraceback.extract(script=True, cpp=True))
        except Exception:           # pragma: no cover - a torch without it: Python frames only
            self.tracebacks.append(None)

    def __exit__(self, kind, exc, tb):
        if kind is not None and issubclass(kind, torch.OutOfMemoryError):
            self.died = str(exc).splitlines()[0][:300]
            traceback.print_exception(kind, exc, tb, limit=-8)
        torch.cuda.synchronize()
        self.report()
        return kind is not None and issubclass(kind, torch.OutOfMemoryError)   # an OOM death still reports

    def report(self) -> None:
        stats = torch.cuda.memory_stats()
        line = {"program": self.name, "cap_bytes": self.args.cap_bytes, "total_memory": self.total,
                **{k: int(stats.get(v, 0)) for k, v in STATS.items()},
                "program_caught_ooms": self.caught, "observed_ooms": len(self.ooms), "died": self.died,
                "wall_s": round(time.perf_counter() - self.t0, 2)}
        if self.args.oom_log:
            self._write_oom_log()
        if self.args.snapshot:
            torch.cuda.memory._dump_snapshot(self.args.snapshot)
        print("REACTIVE " + json.dumps(line), flush=True)

    def exit_status(self) -> int:
        return 1 if self.died else 0

    def _write_oom_log(self) -> None:
        """The OOMs as JSONL; ``frames``: Python and C++ frames, innermost first (symbolised here, all at once)."""
        have = [i for i, t in enumerate(self.tracebacks) if t is not None]
        cpp = [None] * len(self.tracebacks)
        try:
            import torch._C._profiler as prof
            for i, frames in zip(have, prof.symbolize_tracebacks([self.tracebacks[i].tb for i in have])):
                cpp[i] = [f"{f['filename']}:{f['line']}:{f['name']}" for f in frames]
        except Exception as e:      # pragma: no cover
            print(f"oom-log: C++ frames unavailable ({type(e).__name__}: {e})", file=sys.stderr)
        with open(self.args.oom_log, "w") as f:
            for entry, frames in zip(self.ooms, cpp):
                f.write(json.dumps({**entry, "frames": frames}) + "\n")


def small_cnn(width: int = 64, classes: int = 10) -> torch.nn.Module:
    """Four conv-BN-ReLU blocks on 32x32 images, pooled to ``classes`` logits."""
    nn = torch.nn
    c = [3, width, 2 * width, 4 * width, 4 * width]
    layers = []
    for i in range(4):
        layers += [nn.Conv2d(c[i], c[i + 1], 3, padding=1, bias=False), nn.BatchNorm2d(c[i + 1]), nn.ReLU()]
        if i in (1, 2):
            layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c[-1], classes))
