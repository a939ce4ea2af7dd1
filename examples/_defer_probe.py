"""When the GPU finished each step, beside when the host went on; and who freed the large blocks.

`examples/dist_train.py --probe FILE` (issue 21, `benchmarks/gpu_defer.sh`): DDP's first-iteration gradient bucket
(one flat buffer of every parameter) is freed at a point of the program that moved between recordings of the same
command (traces/README.md, "Runs of two processes"). Whether that point follows how far the GPU lags behind the host
is what this measures, without synchronising anything inside the steps: a timing CUDA event after each backward
(the current stream waits there for DDP's allreduces), queried, not waited on, when the next step starts, and read
after the loop against one synchronised start. With ``--probe-stacks`` the program records the allocator's history
itself from the end of step 0 (``context="all"``, C++ and Python frames, so frees carry the stack of the thread that
made them) and writes the frees of blocks of at least 64 MiB with their frames. One JSON object per rank in
``FILE.rank<R>.json``.
"""
from __future__ import annotations

import json
import time

BIG = 64 << 20


class DeferProbe:
    def __init__(self, torch, dev, rank: int, path: str, stacks: bool):
        self.torch, self.dev, self.rank, self.path, self.stacks = torch, dev, rank, path, stacks
        torch.cuda.synchronize(dev)
        self.h0 = time.perf_counter()
        self.wall0_us = time.time_ns() // 1000
        self.e0 = self._event()
        self.steps: list[dict] = []
        self.recording = False

    def _event(self):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def _now(self) -> float:
        return round((time.perf_counter() - self.h0) * 1e3, 3)

    def step_start(self, step: int) -> None:
        """The host starts ``step``: was the previous backward done on the GPU (a query: no wait)?"""
        if self.steps:
            last = self.steps[-1]
            last["next_start_ms"] = self._now()
            last["gpu_done_at_next_start"] = bool(last["_event"].query())
        self.steps.append({"step": step, "start_ms": self._now(), "start_wall_us": time.time_ns() // 1000})

    def after_backward(self) -> None:
        self.steps[-1]["_event"] = self._event()
        self.steps[-1]["backward_return_ms"] = self._now()

    def after_step(self, step: int) -> None:
        if self.stacks and step == 0 and not self.recording:
            self.torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="all",
                                                          max_entries=200000)
            self.recording = True

    def finish(self) -> None:
        torch = self.torch
        torch.cuda.synchronize(self.dev)
        out = {"rank": self.rank, "wall0_us": self.wall0_us, "steps": []}
        for s in self.steps:
            e = s.pop("_event", None)
            if e is not None:
                s["gpu_backward_done_ms"] = round(self.e0.elapsed_time(e), 3)
            out["steps"].append(s)
        if self.recording:
            t = time.perf_counter()
            try:
                snap = torch.cuda.memory._snapshot()
                out["frees"] = self._big_frees(snap)
            except Exception as e:  # noqa: BLE001 - the timeline is kept whatever the stacks do
                out["frees_error"] = repr(e)
            torch.cuda.memory._record_memory_history(enabled=None)
            out["snapshot_s"] = round(time.perf_counter() - t, 2)
        with open(f"{self.path}.rank{self.rank}.json", "w") as f:
            json.dump(out, f, indent=1)

    def _big_frees(self, snap) -> list[dict]:
        """The frees (requested, completed) of blocks of at least BIG bytes, with the allocs before each."""
        entries = snap["device_traces"][self.dev.index]
        found, allocs = [], 0
        for i, e in enumerate(entries):
            if e["action"] == "alloc":
                allocs += 1
            elif e["action"] in ("free_requested", "free_completed") and e["size"] >= BIG:
                frames = [f"{f.get('name')} ({f.get('filename')}:{f.get('line')})" for f in e.get("frames", [])]
                found.append({"entry": i, "allocs_before": allocs, "action": e["action"], "size": e["size"],
                              "time_us": e.get("time_us"), "frames": frames[:60]})
        return found
