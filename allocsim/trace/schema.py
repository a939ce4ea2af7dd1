"""The metadata and footer fields allocsim reads, checked once where a trace is loaded.

The metadata is free-form JSON (recorders and importers add what they know), but
a few fields are read by later code: the device's total memory becomes the replay
capacity, the framework picks the model to validate against, the torch settings
seed the torch policy, the starting segments seed `validate`. Each of those, when
present, must have the type and range checked here, so no consumer meets a
string where it expects bytes. Unknown fields are kept and never read.

Each check raises `InputError` naming the file, the field (``metadata: device.total_memory``,
``footer: streams``) and what is wrong.
"""
from __future__ import annotations

from ..errors import InputError
from .events import MAX_SIZE


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Fields:
    """Reads fields of one JSON object, raising `InputError` at ``metadata: device.total_memory`` when one is wrong."""

    def __init__(self, obj: dict, path: str, where: str):
        self.obj, self.path, self.where = obj, path, where

    def bad(self, name: str, what: str):
        raise InputError(f"{what}, got {_show(self.obj.get(name))}", path=self.path, position=self.where + name)

    def get(self, name: str, ok, what: str):
        """The field's value (None when absent or null), refused unless ``ok(value)``."""
        v = self.obj.get(name)
        if v is not None and not ok(v):
            self.bad(name, what)
        return v

    def sub(self, name: str) -> "_Fields | None":
        """The nested object ``name`` as `_Fields`, or None when absent."""
        v = self.get(name, lambda x: isinstance(x, dict), "expected a JSON object")
        return None if v is None else _Fields(v, self.path, f"{self.where}{name}.")


def _show(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check_meta(meta: dict, path: str) -> None:
    """Refuse metadata whose read fields have the wrong type or range."""
    m = _Fields(meta, path, "metadata: ")
    for name in ("producer", "framework"):
        m.get(name, lambda v: isinstance(v, str), "expected a string")
    m.get("framework_version", lambda v: isinstance(v, (str, int, float)) and not isinstance(v, bool),
          "expected a version string")
    m.get("command", lambda v: isinstance(v, (str, list)), "expected a string or a list of arguments")
    m.get("iterations", lambda v: _is_int(v) and v >= 0, "expected a count (an integer >= 0)")
    dev = m.sub("device")
    if dev is not None:
        dev.get("total_memory", lambda v: _is_int(v) and 0 < v <= MAX_SIZE,
                "expected a size in bytes (a positive integer up to 1 PiB)")
        dev.get("name", lambda v: isinstance(v, str), "expected a string")
        dev.get("index", lambda v: _is_int(v) and v >= 0, "expected a device index (an integer >= 0)")
    m.sub("allocator_settings")          # its fields are checked by the torch policy that reads them
    ranks = {name: m.get(name, lambda v: _is_int(v) and v >= (name == "world_size"), "expected an integer >= "
                         + ("1" if name == "world_size" else "0"))
             for name in ("rank", "world_size")}                # a process of a run (docs/several-processes.md)
    m.get("local_rank", lambda v: _is_int(v) and v >= 0, "expected an integer >= 0")
    if None not in ranks.values() and ranks["rank"] >= ranks["world_size"]:
        raise InputError(f"{ranks['rank']} is not below world_size {ranks['world_size']}", path=path,
                         position="metadata: rank")
    mem = m.sub("device_memory")
    if mem is not None:
        _check_device_memory(mem)
    segs = m.get("initial_segments", lambda v: isinstance(v, list), "expected a list of segments")
    for k, s in enumerate(segs or []):
        where = f"metadata: initial_segments[{k}]"
        if not isinstance(s, dict):
            raise InputError(f"expected a JSON object, got {_show(s)}", path=path, position=where)
        seg = _Fields(s, path, where + ".")
        seg.get("total_size", lambda v: _is_int(v) and 0 <= v <= MAX_SIZE, "expected a size in bytes (an integer, 0 "
                                                                           "to 1 PiB)")
        seg.get("address", lambda v: _is_int(v) and v >= 0, "expected an address (an integer >= 0)")


def _check_device_memory(mem: "_Fields") -> None:
    """``device_memory``: byte counts the recorder read from the device (``mem_get_info``) and its allocator."""
    def size(v):
        return _is_int(v) and 0 <= v <= MAX_SIZE
    what = "expected a size in bytes (an integer, 0 to 1 PiB)"
    total = mem.get("total", size, what)
    most = total if total is not None else MAX_SIZE    # (none of the device's counts exceeds its memory)
    within = f"expected a size in bytes (an integer, 0 to the device's total {total:,})" if total is not None else what
    mem.get("outside_peak", lambda v: size(v) and v <= most, within)
    for moment in ("start", "end"):
        at = mem.sub(moment)
        for name in ("free", "reserved", "outside") if at is not None else ():
            at.get(name, lambda v: size(v) and v <= most, within)


def check_footer(footer: dict, path: str) -> None:
    """Refuse footer tables of the wrong shape: streams are integers, sites and labels strings."""
    f = _Fields(footer, path, "footer: ")
    streams = f.get("streams", lambda v: isinstance(v, list) and v and all(_is_int(x) for x in v),
                    "expected a non-empty list of integer stream handles")
    if streams is not None and len(set(streams)) != len(streams):
        f.bad("streams", "a stream is named twice")
    for name in ("sites", "labels"):
        f.get(name, lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "expected a list of strings")
    f.get("summary", lambda v: isinstance(v, dict), "expected a JSON object")
    f.get("meta", lambda v: isinstance(v, dict), "expected a JSON object")
