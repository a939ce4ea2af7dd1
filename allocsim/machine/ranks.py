"""A run of several processes: its traces, one per rank, found by the run's name, and what each rank's device
held outside its caching allocator (docs/several-processes.md).

``allocsim record -o run.bin -- torchrun ...`` writes ``run.rank0.bin``, ``run.rank1.bin``, ... (``run.pid<PID>.bin``
for a process without a rank). The commands take the run as it was named (``run.bin``): `run_traces` finds its
process traces when no file of that name exists. A rank's trace records the device's memory
(``device_memory``: ``mem_get_info`` when recording began, at each drain and at the end): what lay on the device
beside the allocator's reserved bytes (the CUDA context, NCCL's buffers, other processes) is `outside_bytes`, and a
rank fits a GPU only with it beside it (`fit_capacity`).
"""
from __future__ import annotations

import glob
import os
import re

from ..errors import UsageError
from ..units import fmt_bytes
from .capacity import device_capacity

_LABEL = re.compile(r"\.(rank|pid)(\d+)$")


def process_name(out: str, label: str) -> str:
    """The trace of one process of the run ``out``: ``run.bin`` + ``rank1`` -> ``run.rank1.bin``."""
    stem, ext = os.path.splitext(out)
    return f"{stem}.{label}{ext or '.bin'}"


def process_of_name(path: str) -> tuple[str, int] | None:
    """``("rank", 2)`` for ``run.rank2.bin``, ``("pid", 7)`` for ``run.pid7.bin``: the process a trace's name
    says; None for another name."""
    m = _LABEL.search(os.path.splitext(path)[0])
    return (m.group(1), int(m.group(2))) if m else None


def run_files(out: str) -> list[str]:
    """The process traces of the run ``out`` that exist (``run.rank<R>.bin``, ``run.pid<PID>.bin``): ranks in
    order, then processes without a rank in pid order."""
    stem, ext = os.path.splitext(out)
    ext = ext or ".bin"
    found = []
    for path in glob.glob(glob.escape(stem) + ".*" + glob.escape(ext)):
        m = _LABEL.search(path[:-len(ext)])
        if m and path[:-len(ext)][:m.start()] == stem:
            found.append(((m.group(1) != "rank", int(m.group(2))), path))
    return [p for _, p in sorted(found)]


def run_traces(name: str | None) -> list[str]:
    """The traces a command's argument names: the file itself when it exists (or is not a run), else the run's
    process traces (``run.bin`` -> ``run.rank0.bin``, ``run.rank1.bin``)."""
    if name is None or os.path.exists(name):
        return [name]
    return run_files(name) or [name]


def rank_label(meta: dict) -> str:
    """``rank 1 of 2`` (``local 1``), ``pid 4242``, or ``-``: which process of a run a trace is."""
    if isinstance(meta.get("rank"), int):
        text = f"rank {meta['rank']}"
        if isinstance(meta.get("world_size"), int):
            text += f" of {meta['world_size']}"
        return text
    return f"pid {meta['pid']}" if isinstance(meta.get("pid"), int) else "-"


def process_words(label: str, path: str) -> str:
    """A process in a sentence: its `rank_label`, or its trace's file name where that is ``-`` (the metadata names no
    rank and no pid), which read "the least room is -'s"."""
    from ..filenames import shown_name
    return shown_name(os.path.basename(path)) if label == "-" else label


def outside_bytes(meta: dict) -> int:
    """The most device memory the recording saw outside its caching allocator (0 when it did not look)."""
    mem = meta.get("device_memory")
    return int(mem.get("outside_peak") or 0) if isinstance(mem, dict) else 0


def fit_capacity(capacity, trace) -> tuple[object, int]:
    """``(capacity for the replay, bytes outside)``: the GPU's memory (`device_capacity`'s) less what lay outside
    the allocator on it; ``capacity`` as given when the trace saw nothing outside or the device is unlimited. It is
    0 or less where the outside bytes fill the device: `check_room` refuses that (and any room below LOAD) first."""
    outside = outside_bytes(trace.meta)
    total, _ = device_capacity(capacity, trace)
    if not outside or total is None:
        return capacity, 0
    return total - outside, outside


#: What lay outside the caching allocator, in a sentence (docs/several-processes.md, "Recording").
OUTSIDE_WORDS = "the recording saw outside the caching allocator (CUDA context, NCCL, other processes)"


def given_capacity(given, total: int) -> str:
    """The device's memory as the user gave it, then in bytes: ``--capacity 8GB (7.45 GiB)``, ``the recorded
    device's memory (79.18 GiB)`` (``given``: ``--capacity``'s text, ``"trace"``, or a size already parsed)."""
    if given == "trace":
        return f"the recorded device's memory ({fmt_bytes(total)})"
    return f"--capacity {given} ({fmt_bytes(total)})" if isinstance(given, str) else f"--capacity {fmt_bytes(total)}"


def check_room(capacity, trace, need: int, need_words: str, given=None, who: str = "") -> None:
    """Refuse, in one line, a device that leaves less than ``need`` (named by ``need_words``: "the trace's LOAD
    785.38 MiB (its peak live bytes)") beside what its recording saw outside the allocator (`fit_capacity`). The
    figure checked is neither the one the user typed nor one they saw, so the line quotes the capacity as given
    (``given``: `given_capacity`'s; ``capacity`` where None) and the subtraction; ``who``: the rank of a run, before
    them."""
    outside = outside_bytes(trace.meta)
    total, _ = device_capacity(capacity, trace)
    if not outside or total is None:
        return
    fits = f"no allocator setting fits{' the run' if who else ''}; the target is impossible"
    words = (f"{who}: " if who else "") + given_capacity(capacity if given is None else given, total)
    if outside >= total:
        raise UsageError(f"{words} is no more than the {fmt_bytes(outside)} {OUTSIDE_WORDS}: nothing is left for "
                         f"{need_words}; {fits}")
    if total - outside < need:
        raise UsageError(f"{words} less the {fmt_bytes(outside)} {OUTSIDE_WORDS} leaves {fmt_bytes(total - outside)}, "
                         f"below {need_words}: {fits}")


def shared_devices(metas: list[dict]) -> list[list[int]]:
    """Groups (of two or more) of the ranks' positions whose traces name one device of one host: their pools
    share its memory, and each one's outside bytes include the others'."""
    groups: dict = {}
    for k, m in enumerate(metas):
        dev = m.get("device") if isinstance(m.get("device"), dict) else {}
        env = m.get("env") if isinstance(m.get("env"), dict) else {}
        key = (m.get("host"), env.get("CUDA_VISIBLE_DEVICES"), dev.get("index"))
        if dev.get("index") is not None:
            groups.setdefault(key, []).append(k)
    return [g for g in groups.values() if len(g) > 1]
