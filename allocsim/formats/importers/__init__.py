"""Import allocation logs written by other tools into allocsim traces.

Formats, told apart by content (never by file name):

    torch   PyTorch memory snapshot pickle (`torch.cuda.memory._dump_snapshot`), see `torch_snapshot`
    rmm     RMM logging_resource_adaptor CSV, see `rmm_csv`
    cupy    CuPy DebugPrintHook JSONL, see `cupy_jsonl`

``import_file(path, out)`` streams the events to a temporary file beside
``out`` and renames it into place only when the whole input converted, so a
malformed input leaves no output file.
"""
from __future__ import annotations

import json
import numbers

from ...errors import InputError, UsageError
from ...filenames import printable, shown_name
from ...units import parse_size
from ...outputs import atomic_path, check_input_file, claim_outputs
from ...trace import TraceWriter
from ...trace.events import ALLOC, OOM
from ...trace.format import IMPORTABLE, MAGIC, packed_note
from ...trace.schema import check_meta
from . import safe_pickle
from .cupy_jsonl import HookLog
from .rmm_csv import COLUMNS, RmmLog
from .torch_snapshot import SnapshotConversion, convert

FORMATS = ("torch", "rmm", "cupy")

__all__ = ["FORMATS", "convert", "detect", "import_file", "open_source"]


def detect(path: str) -> str:
    """``"torch"``, ``"rmm"`` or ``"cupy"``, from the first bytes of ``path``; `InputError` if none fits."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError as e:
        raise InputError(e.strerror or str(e), path=path)
    if not head.strip():
        raise InputError("the file is empty; nothing to import", path=path, position="byte 0")
    _refuse_packed(head, path)
    if safe_pickle.looks_like_pickle(head, any_object=True):    # protocol 0 and 1 too (no PROTO opcode)
        return "torch"          # (a pickle of no dict, an OrderedDict's global first: the importer says what it is)
    if head.startswith(MAGIC):
        raise InputError("already an allocsim trace; nothing to import", path=path, position="byte 0")
    first = head.lstrip(b"\xef\xbb\xbf \t\r\n").split(b"\n", 1)[0].strip()
    if set(COLUMNS) <= {c.strip() for c in first.decode("utf-8", "replace").split(",")}:
        return "rmm"
    if first.startswith(b"{"):
        try:
            obj = json.loads(first)
        except (ValueError, RecursionError):
            obj = None
        if isinstance(obj, dict) and "hook" in obj:
            return "cupy"
    raise InputError("cannot tell the format: not a pickle (PyTorch snapshot), an RMM CSV log (header "
                     f"{','.join(COLUMNS)}) or a CuPy DebugPrintHook JSONL (objects with \"hook\"); "
                     "pass --format", path=path, position="byte 0")


#: Each format in the user's words, for the line that says a file given as a trace is one to import.
WHAT = {"torch": "a PyTorch memory snapshot", "rmm": "an RMM log", "cupy": "a CuPy DebugPrintHook log"}


def what_to_import(path: str) -> str | None:
    """What ``path`` is, if `import_file` reads it (`detect`), else None."""
    try:
        return WHAT[detect(path)]
    except InputError:
        return None


IMPORTABLE.append(what_to_import)       # `Trace.load` of a snapshot or log says to import it


def open_source(path: str, fmt: str | None = None, *, device: int | None = None, device_name: str | None = None,
                total_memory: int | None = None):
    """Read ``path`` enough to know its metadata; return an object with ``meta`` and ``emit(writer) -> stats``.
    ``device`` None: a snapshot's device that holds the events, device 0 of a log."""
    check_input_file(path)
    fmt = fmt or detect(path)
    kw = {"device": device, "device_name": device_name, "total_memory": total_memory}
    if fmt == "torch":
        _pickle_file(path)
        return SnapshotConversion(safe_pickle.load(path), source=path, **kw)
    kw["device"] = device or 0
    if fmt in ("rmm", "cupy"):
        _text_log(path, fmt)            # (given or found: a NUL amid the text is binary either way)
    if fmt == "rmm":
        return RmmLog(path, **kw)
    if fmt == "cupy":
        return HookLog(path, **kw)
    raise UsageError(f"unknown import format {fmt!r} (known: {', '.join(FORMATS)})")


def _pickle_file(path: str) -> None:
    """Refuse a file given as a snapshot that is no pickle (``--format torch`` on a CSV log), saying what it is or how
    it begins: the unpickler read its text as opcodes and called it a truncated pickle."""
    try:
        fmt = detect(path)              # a pickle of any protocol is "torch"
    except InputError as e:
        if not e.what.startswith("cannot tell the format"):
            raise                       # unreadable, empty, an allocsim trace already: said as import says it
        with open(path, "rb") as f:
            head = f.read(24).decode("utf-8", "backslashreplace")
        what = f"it begins with '{printable(head, keep='')}'"
    else:
        if fmt == "torch":
            return
        what = f"it is {WHAT[fmt]} (--format {fmt})"
    raise InputError(f"not a pickle, so not a PyTorch memory snapshot (as --format torch says): {what}", path=path,
                     position="byte 0")


def _refuse_packed(head: bytes, path: str) -> None:
    """A compressed file is read as what it holds only once unpacked: say so, and how (a gzip'd log was "cannot tell
    the format ... pass --format", and given --format, "a binary file")."""
    packed = packed_note(head, path)
    if packed:
        raise InputError(packed, path=path, position="byte 0")


def _text_log(path: str, fmt: str) -> None:
    """Refuse a binary file given as a text log (``--format rmm`` on a snapshot): the line would quote its bytes. A
    log's zeros at its end are a crash's torn tail (the blocks the file system gave and nothing wrote), not binary."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError as e:
        raise InputError(e.strerror or str(e), path=path)
    _refuse_packed(head, path)
    what = ("an allocsim trace already" if head.startswith(MAGIC) else
            "a pickle (a PyTorch snapshot: --format torch)" if safe_pickle.looks_like_pickle(head, any_object=True) else
            "a binary file" if b"\0" in head.rstrip(b"\0") else None)
    if what:
        raise InputError(f"is {what}, not {WHAT[fmt]} (a text log, as --format {fmt} says)", path=path,
                         position="byte 0")


def check_device(device, total_memory, device_name, *, names=("device", "total_memory", "device_name")) -> int | None:
    """What an import is told of the recorded GPU, refused (`UsageError`, naming the argument as ``names`` do) where it
    is no GPU's: an index from 0, a positive size (text as `parse_size` reads it: returned in bytes), a name of one
    line of printable text (as ``nvidia-smi --query-gpu=name`` prints it). A Python caller's ``total_memory=1.5``
    made a device of 1 byte, and ``device="0"`` was blamed on the input file."""
    if device is not None and (isinstance(device, bool) or not isinstance(device, numbers.Integral) or device < 0):
        raise UsageError(f"{names[0]}: a GPU's index (an integer from 0), not {device!r}")
    if isinstance(total_memory, str):
        total_memory = parse_size(total_memory, what=names[1])
    if total_memory is not None and (isinstance(total_memory, bool) or not isinstance(total_memory, numbers.Integral)
                                     or total_memory <= 0):
        raise UsageError(f"{names[1]}: the GPU's memory, a positive size in bytes (or text such as '80GiB'), "
                         f"not {total_memory!r}")
    if device_name is not None and (not isinstance(device_name, str) or not device_name.strip()
                                    or printable(device_name, keep="") != device_name):
        shown = shown_name(device_name) if isinstance(device_name, str) else repr(device_name)
        raise UsageError(f"{names[2]} '{shown}': a GPU's name is one line of printable text (as nvidia-smi "
                         f"--query-gpu=name prints it)")
    return None if total_memory is None else int(total_memory)


def import_file(path: str, out: str, *, format: str | None = None, device: int | None = None,
                total_memory: int | str | None = None, device_name: str | None = None,
                force: bool = False) -> dict:
    """Convert ``path`` into the trace file ``out``; return stats (counts, warnings, events written).

    ``format`` None or ``"auto"`` detects it from the content. ``device``: the GPU's index; ``total_memory`` its
    memory in bytes (or text: ``"80GiB"``); ``device_name`` its name, one line of printable text. The output
    appears whole, validated, or not at all; a trace already there is replaced only with ``force``, as ``import -o``
    does.
    """
    total_memory = check_device(device, total_memory, device_name)
    claim_outputs([("output", out)], [path], force=force)
    src = open_source(path, None if format in (None, "auto") else format, device=device, device_name=device_name,
                      total_memory=total_memory)
    check_meta(src.meta, path)          # what the input says of itself, before a byte is written
    with atomic_path(out) as tmp:
        writer = TraceWriter(meta=src.meta, path=tmp, chunk=1 << 16)
        try:
            stats = src.emit(writer)
        except ValueError as e:     # past a limit of the trace format, e.g. more than 65535 streams
            writer.abort()
            raise InputError(f"cannot be a trace: {e}", path=path) from None
        except BaseException:
            writer.abort()
            raise
        trace = writer.finish()
        if not len(trace):      # a header-only CSV, an empty JSONL: an empty trace only misleads later
            raise InputError("holds no allocation events; nothing to import (is it the right file?)", path=path)
        if not ({ALLOC, OOM} & trace.kinds_present):     # segments alone: no request to replay
            raise InputError(f"holds no allocation request, only {len(trace):,} event"
                             f"{'' if len(trace) == 1 else 's'} of the allocator's own (segments, marks); nothing "
                             f"to replay (is it the right file?)", path=path)
        try:
            trace.validate()
        except InputError as e:   # the input contradicts itself in a way the importer did not catch
            raise InputError(f"the converted trace is invalid: {e.what}", path=path, position=e.position)
        stats["events"] = len(trace)
        stats["streams"] = len(trace.streams)
        stats["sites"] = len(trace.sites)
        del trace
    return stats
