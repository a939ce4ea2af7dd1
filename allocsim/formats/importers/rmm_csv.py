"""RMM `logging_resource_adaptor` CSV logs -> trace events (``docs/importers.md``).

Header ``Thread,Time,Action,Pointer,Size,Stream`` (columns found by name), then
one row per call, in a valid global order:

    allocate          -> ALLOC (requested size, hex pointer, hex stream)
    allocate failure  -> OOM (size, stream)
    free              -> FREE of the allocation live at that pointer

A 0-byte ``allocate`` at pointer 0 is RMM's nullptr for 0 bytes: several can be live
at once, and a 0-byte ``free`` at 0 ends the oldest of them.

``Time`` is a time of day with microseconds and no date: a step back of more
than 12 hours is taken as midnight and adds a day; smaller steps back (threads
logging out of order, a row from just before midnight logged after one just
past it among them) are clamped so trace time never decreases. Row order, not
time, is the sequence. The Python API loses the buffered tail on a crash, so a
cut-off last line is dropped with a warning.

Costs: one pass, O(1) per row; a dict maps each live pointer to its id.
"""
from __future__ import annotations

import re

from ...trace import TraceWriter
from ...trace.events import MAX_SIZE
from .common import LineLog, base_meta

COLUMNS = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
DAY_US = 86_400 * 10**6
HALF_DAY_US = DAY_US // 2
_TIME = re.compile(r"([0-9]{1,2}):([0-9]{1,2}):([0-9]{1,2})(?:\.([0-9]{0,9}))?\Z")


class RmmLog:
    """An RMM CSV log, ready to emit (the metadata needs no pass over the rows)."""

    def __init__(self, path: str, *, device: int = 0, device_name: str | None = None,
                 total_memory: int | None = None):
        self.path = path
        self.meta = base_meta("rmm-csv", "rmm", path, device=device, device_name=device_name,
                              total_memory=total_memory, time_source="time of day")

    def emit(self, writer: TraceWriter) -> dict:
        """Write one event per row; return counts. Malformed rows -> `InputError` with the line."""
        log = LineLog(self.path)
        live: dict[int, int] = {}
        live_size: dict[int, int] = {}          # pointer -> the size its allocate logged
        nulls: list[int] = []                   # the live 0-byte allocations at nullptr, oldest first
        counts = {"allocate": 0, "allocate failure": 0, "free": 0}
        threads = set()
        state = {"cols": None, "first": None, "day": 0, "last_us": None, "t": 0}

        def header(text):
            names = [c.strip() for c in text.split(",")]
            missing = [c for c in COLUMNS if c not in names]
            if missing:
                log.bad(f"missing column {', '.join(map(repr, missing))} (the header is {text.strip()!r}; "
                        f"expected {','.join(COLUMNS)})")
            twice = [c for c in COLUMNS if names.count(c) > 1]
            if twice:               # which one holds the values is anybody's guess: the first was read
                log.bad(f"column {', '.join(map(repr, twice))} given twice in the header")
            state["cols"] = ([names.index(c) for c in COLUMNS], len(names))

        def row(text):
            if state["cols"] is None:
                return header(text)
            (i_thread, i_time, i_action, i_ptr, i_size, i_stream), width = state["cols"]
            f = text.split(",")
            if len(f) != width:
                log.bad(f"expected {width} fields, found {len(f)}")
            action = f[i_action].strip()
            if action not in counts:
                log.bad(f"unknown action {action!r} (expected allocate, allocate failure or free)")
            size = log.parse_int(f[i_size].strip(), "size", expect="a whole number of bytes")
            if size > MAX_SIZE:
                log.bad(f"absurd size {size} (> 1 PiB)")
            stream = log.parse_int(f[i_stream].strip(), "stream", 16)
            us = _time_of_day(f[i_time].strip(), log)
            ptr_text = f[i_ptr].strip()
            ptr = 0 if ptr_text == "(nil)" else log.parse_int(ptr_text, "pointer", 16)
            null = ptr == 0 and size == 0       # RMM's pools return nullptr for 0 bytes: many may be live at once
            if action == "free":
                if not (null and nulls) and ptr not in live:
                    log.bad(f"free of unknown pointer {ptr_text} (not allocated, or already freed)")
            elif action == "allocate" and ptr in live and not null:
                log.bad(f"pointer {ptr_text} allocated twice (still live as id {live[ptr]})")
            # every check passed: advance the clock and write
            day = state["day"]
            if state["first"] is None:
                state["first"] = us
            elif us + day < state["last_us"] - HALF_DAY_US:
                day = state["day"] = day + DAY_US
            elif us + day > state["last_us"] + HALF_DAY_US:
                day -= DAY_US       # logged before the last midnight, after a row past it: a step back, clamped
            us += day
            state["last_us"] = max(us, state["last_us"] or us)
            t = state["t"] = max(state["t"], (us - state["first"]) * 1000)
            threads.add(f[i_thread].strip())
            counts[action] += 1
            if action == "allocate" and null:
                nulls.append(writer.alloc(0, stream, t=t))
            elif action == "allocate":
                live[ptr] = writer.alloc(size, stream, t=t, addr=ptr)
                live_size[ptr] = size
            elif action == "free" and null and nulls:     # (which one the log cannot tell: the oldest)
                writer.free(nulls.pop(0), t=t, stream=stream)
            elif action == "free":
                allocated = live_size.pop(ptr)
                if size != allocated:
                    log.free_of_another_size(f"a free of {size:,} bytes at {ptr_text}, allocated with {allocated:,} "
                                             f"bytes")
                writer.free(live.pop(ptr), t=t, stream=stream, addr=ptr, size=size)
            else:
                writer.oom(size, stream=stream, t=t)

        log.each(row)
        if state["cols"] is None:
            raise log.error("empty log: no header line")
        return {"format": "rmm", "rows": sum(counts.values()), "allocs": counts["allocate"], "frees": counts["free"],
                "ooms": counts["allocate failure"], "threads": len(threads), "live_at_end": len(live) + len(nulls),
                "days_crossed": state["day"] // DAY_US, "dropped_line": log.dropped_line, "warnings": log.warnings}


def _time_of_day(text: str, log: LineLog) -> int:
    """``HH:MM:SS.ffffff`` (ASCII digits only: no ``1_0``, no other scripts' digits) -> microseconds since midnight."""
    m = _TIME.match(text)
    if not m or not (int(m[1]) < 24 and int(m[2]) < 60 and int(m[3]) < 61):
        log.bad(f"bad time {text!r} (expected HH:MM:SS.ffffff)")
    return ((int(m[1]) * 60 + int(m[2])) * 60 + int(m[3])) * 10**6 + int(((m[4] or "") + "000000")[:6])
