"""CuPy `DebugPrintHook` JSONL -> trace events (``docs/importers.md``).

One JSON object per line, printed at postprocess time:

    malloc (mem_ptr != 0)  -> ALLOC of the requested ``size`` at ``mem_ptr``
    malloc (size == 0)     -> ALLOC of 0 bytes: a request CuPy answers with a null pointer and
                              never frees, counted as `allocsim record` counts it
    malloc (mem_ptr == 0)  -> OOM of the requested ``size`` (the request raised)
    free                   -> FREE of the most recent open malloc with that ``pmem_id`` and ``mem_ptr``
    alloc  (mem_ptr != 0)  -> SEGMENT_ALLOC of ``mem_size`` (the pool went upstream)
    alloc  (mem_ptr == 0)  -> nothing: a failed upstream attempt the pool may retry; counted

The rounded ``mem_size`` of a malloc is not kept: the `cupy` policy rounds the
requested size again, the same way. The hook carries no stream and no clock, so
every event is on stream 0 and its time is its line index. Lines for other
devices than ``device`` are skipped and counted. ``pmem_id`` is Python's
``id()`` and can be reused, so each id keeps a stack of open mallocs and a
free closes the newest.

Costs: one pass, O(1) per line (a JSON parse and a dict lookup).
"""
from __future__ import annotations

import json

from ...trace import SEGMENT_ALLOC, TraceWriter
from ...trace.events import MAX_SIZE
from ...errors import InputError, json_why
from .common import LineLog, base_meta

#: Keys each hook must carry (``device_id`` defaults to the device being imported).
REQUIRED = {"malloc": ("size", "mem_size", "mem_ptr", "pmem_id"), "free": ("mem_size", "mem_ptr", "pmem_id"),
            "alloc": ("mem_size", "mem_ptr")}


class HookLog:
    """A DebugPrintHook JSONL log, ready to emit."""

    def __init__(self, path: str, *, device: int = 0, device_name: str | None = None,
                 total_memory: int | None = None):
        self.path = path
        self.device = device
        self.meta = base_meta("cupy-jsonl", "cupy", path, device=device, device_name=device_name,
                              total_memory=total_memory, time_source="line index")

    def emit(self, writer: TraceWriter) -> dict:
        """Write one event per hook line of ``device``; return counts."""
        log = LineLog(self.path)
        open_ids: dict[object, list[tuple]] = {}  # pmem_id -> (id, mem_ptr, mem_size) of its open mallocs, oldest first
        open_at: dict[int, int] = {}              # mem_ptr of an open malloc -> its line
        counts = {"malloc": 0, "zero_malloc": 0, "free": 0, "alloc": 0, "oom": 0, "failed_upstream": 0,
                  "other_devices": 0}
        device = self.device

        def line(text):
            try:
                h = json.loads(text)
            except (ValueError, RecursionError) as e:
                return log.bad(f"bad JSON ({json_why(e)})")
            if not isinstance(h, dict):
                return log.bad("not a JSON object")
            hook = h.get("hook")
            keys = REQUIRED.get(hook) if isinstance(hook, str) else None
            if keys is None:
                return log.bad(f"unknown hook {hook!r} (expected malloc, free or alloc)")
            missing = [k for k in keys if k not in h]
            if missing:
                return log.bad(f"{hook} line without {', '.join(missing)}")
            for k in keys:
                if k != "pmem_id" and not (type(h[k]) is int and 0 <= h[k] < 2**64):
                    return log.bad(f"{k} is {h[k]!r}, expected a non-negative integer"
                                   + (" (a whole number of bytes)" if k.endswith("size") else ""))
            if "pmem_id" in keys and type(h["pmem_id"]) not in (str, int):
                return log.bad(f"pmem_id is {h['pmem_id']!r}, expected a string or an integer")
            if type(h.get("device_id", device)) is not int:
                return log.bad(f"device_id is {h['device_id']!r}, expected an integer (the device's index)")
            if h.get("device_id", device) != device:
                counts["other_devices"] += 1
                return
            t = log.line - 1
            if hook == "malloc":
                if h["size"] > MAX_SIZE:
                    return log.bad(f"absurd size {h['size']} (> 1 PiB)")
                if h["size"] == 0 and h["mem_size"] == 0:
                    counts["malloc"] += 1
                    counts["zero_malloc"] += 1
                    return writer.alloc(0, t=t)
                if h["mem_ptr"] == 0:
                    counts["oom"] += 1
                    return writer.oom(h["size"], t=t)
                if h["mem_ptr"] in open_at:
                    return log.bad(f"malloc at mem_ptr {h['mem_ptr']:#x}, where the malloc of line "
                                   f"{open_at[h['mem_ptr']]} is not freed yet")
                counts["malloc"] += 1
                open_at[h["mem_ptr"]] = log.line
                open_ids.setdefault(h["pmem_id"], []).append(
                    (writer.alloc(h["size"], t=t, addr=h["mem_ptr"]), h["mem_ptr"], h["mem_size"]))
            elif hook == "free":
                stack = open_ids.get(h["pmem_id"])
                if not stack:
                    return log.bad(f"free of unknown pmem_id {h['pmem_id']!r} at mem_ptr {h['mem_ptr']:#x} (no open "
                                   f"malloc with it: never allocated, or already freed)")
                k = next((k for k in range(len(stack) - 1, -1, -1) if stack[k][1] == h["mem_ptr"]), None)
                if k is None:
                    return log.bad(f"free of pmem_id {h['pmem_id']!r} at mem_ptr {h['mem_ptr']:#x}, but its open "
                                   f"malloc is at {stack[-1][1]:#x}")
                obj, ptr, mem_size = stack.pop(k)
                if h["mem_size"] != mem_size:
                    log.free_of_another_size(f"a free of {h['mem_size']:,} bytes at mem_ptr {ptr:#x}, malloc'd with "
                                             f"mem_size {mem_size:,}")
                counts["free"] += 1
                del open_at[ptr]
                writer.free(obj, t=t, addr=ptr, size=h["mem_size"])
            elif h["mem_ptr"]:
                counts["alloc"] += 1
                writer.segment(SEGMENT_ALLOC, h["mem_ptr"], h["mem_size"], t=t)
            else:
                counts["failed_upstream"] += 1

        log.each(line)
        if counts["other_devices"] and not sum(v for k, v in counts.items() if k != "other_devices"):
            raise InputError(f"none of its {counts['other_devices']} hook lines is for device {device} "
                             "(pass --device N)", path=self.path)
        return {"format": "cupy", "lines": log.line, "allocs": counts["malloc"], "zero_allocs": counts["zero_malloc"],
                "frees": counts["free"],
                "segment_allocs": counts["alloc"], "ooms": counts["oom"],
                "failed_upstream": counts["failed_upstream"], "other_devices": counts["other_devices"],
                "live_at_end": sum(map(len, open_ids.values())), "dropped_line": log.dropped_line,
                "warnings": log.warnings}
