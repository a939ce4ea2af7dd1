"""What the framework recorders share: the streamed output file, notes and the stats file."""
from __future__ import annotations

import json
import os
import platform
import sys
import time

from ...version import __version__
from ...outputs import atomic_open, temp_path
from ...trace import TraceWriter


class Recorder:
    """Base of the torch and cupy recorders.

    Records stream to a temporary beside ``out`` while the program runs
    (`outputs.temp_path`: hidden, named with the pid; a recorder killed with
    SIGKILL leaves that readable prefix, no ``out``, and the next run in the
    folder names it); `close_trace` finishes the file and renames it to ``out``,
    so ``out`` appears whole or not at all. Subclasses implement `check_gpu`, `start`, `mark` and `finish`.
    """

    framework = ""
    #: How the recording was started, when not by ``allocsim record``: "python" (`allocsim.recording`,
    #: `allocsim.start_recording`), written in the trace's metadata as ``started_from``.
    started_from: str | None = None

    def __init__(self, out: str, *, command: list[str], stacks: bool = False, max_events: int | None = None):
        self.out = out
        self.command = command
        self.stacks = stacks
        self.max_events = max_events
        self.notes: list[str] = []
        self.writer: TraceWriter | None = None
        self.t_start = time.time()

    @classmethod
    def check_gpu(cls) -> None:   # pragma: no cover - overridden
        raise NotImplementedError

    def settle(self) -> None:
        """Bring the trace up to now, so that an event written next lands after every entry made before it
        (torch: drain the ring buffer; a recorder that writes as it sees needs nothing)."""

    def scope_begin(self, kind: int, label: str) -> int | None:
        """Write a scope's BEGIN (`events.TRY_BEGIN`, `events.PHASE_BEGIN`) at this point of the run; return its
        serial number for `scope_end`, None where no trace is open (nothing allocated on a device yet)."""
        self.settle()
        return None if self.writer is None else self.writer.begin(kind, label)

    def scope_end(self, kind: int, label: str, serial: int | None) -> None:
        """Write the END (`events.TRY_END`, `events.PHASE_END`) of the scope ``serial`` that `scope_begin` opened."""
        if serial is None:
            return
        self.settle()
        if self.writer is not None:
            self.writer.end(kind, label, serial)

    def base_meta(self) -> dict:
        return {"producer": f"allocsim {__version__} record", "framework": self.framework,
                "command": self.command, "cwd": os.getcwd(), "python": platform.python_version(),
                "host": platform.node(), "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "env": {k: v for k, v in os.environ.items()
                        if k.startswith(("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                                         "PYTORCH_NO_CUDA_MEMORY_CACHING",
                                         "CUPY_GPU_MEMORY_LIMIT", "CUDA_VISIBLE_DEVICES"))},
                **({"started_from": self.started_from} if self.started_from else {})}

    def open_trace(self, meta: dict) -> TraceWriter:
        self.writer = TraceWriter(meta, path=temp_path(self.out))
        return self.writer

    def abort(self) -> None:
        """Start failed: remove the partial file, leave nothing behind."""
        w, self.writer = self.writer, None
        if w is not None:
            w.abort()
        if os.path.exists(temp_path(self.out)):
            os.unlink(temp_path(self.out))

    def note(self, text: str) -> None:
        """A remark for the stats file (program interrupted, ring buffer wrapped, ...)."""
        self.notes.append(text)

    def late_meta(self) -> dict:
        """Metadata learnt while recording, for the trace's footer (a process of a run: its rank)."""
        return {}

    def seal(self, path: str) -> None:
        """Last changes to the finished trace file ``path`` before it is published (torch: cuDNN's plan searches
        flagged, `allocsim.formats.recorders.cudnn`); in place, flags only."""

    def close_trace(self, late_meta: dict | None = None):
        """Finish the streamed trace (``late_meta``: `TraceWriter.finish`'s), publish it as ``out``; return the
        `Trace`."""
        w, self.writer = self.writer, None
        trace = w.finish(late_meta)
        self.seal(w.path)
        os.replace(w.path, self.out)
        trace.path = self.out
        return trace

    def write_stats(self, stats: dict) -> dict:
        """Write ``<out>.stats.json`` (atomically) with the common fields added."""
        stats = {"framework": self.framework, "trace": os.path.basename(self.out), "command": self.command,
                 "wall_s": round(time.time() - self.t_start, 3), "notes": self.notes, **stats}
        with atomic_open(f"{self.out}.stats.json") as f:
            json.dump(stats, f, indent=1, sort_keys=True, default=str)
            f.write("\n")
        return stats

    @staticmethod
    def trace_summary(trace) -> dict:
        from ...trace import events as ev
        kind = trace.kind
        return {"events": len(trace), "allocs": int((kind == ev.ALLOC).sum()), "frees": int((kind == ev.FREE).sum()),
                "segment_allocs": int((kind == ev.SEGMENT_ALLOC).sum()),
                "segment_frees": int((kind == ev.SEGMENT_FREE).sum()),
                "marks": int((kind == ev.MARK).sum()), "gcs": int((kind == ev.GC).sum()),
                "ooms": int((kind == ev.OOM).sum()), "load_bytes": trace.load_bytes,
                "finished_cleanly": True}


def stderr(msg: str) -> None:
    print(f"allocsim record: {msg}", file=sys.stderr, flush=True)
