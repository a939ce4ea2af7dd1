"""The `.bin` trace file: a versioned header, fixed-width records, a footer.

Layout (all integers little-endian; documented in ``docs/trace-format.md``)::

    offset  size  field
    0       8     magic b"ALLOCSIM"
    8       2     version (1; 2 when the records use the pool kinds or flags, which version 1 lacks)
    10      2     record size (40)
    12      4     metadata length M (bytes of UTF-8 JSON)
    16      8     record count N, or 2**64-1 while the writer is still running
    24      8     footer offset F, or 0 while the writer is still running
    32      8     records offset R (64 + M rounded up to 8)
    40      24    reserved, zero
    64      M     metadata JSON, then zero padding to R
    R       40*N  records (`RECORD_DTYPE`)
    F       ...   footer JSON: tables (streams, sites, labels) and a summary

The writer streams records as they come and patches N and F when it closes, so a
recording that dies leaves a header marked "unfinished" followed by a readable
prefix of whole records; the reader loads that prefix and says so.
"""
from __future__ import annotations

import codecs
import json
import os
import shlex
import struct

import numpy as np

from ..errors import InputError, json_why
from ..outputs import atomic_path, check_input_file, keep_files_starting_with
from .events import POOL_ANY_STREAM, POOL_BEGIN, POOL_CAPTURE, POOL_EMPTY, RECORD_DTYPE, TRY_BEGIN

MAGIC = b"ALLOCSIM"
keep_files_starting_with(MAGIC, "trace", "an allocsim trace")    # never written over without --force
VERSION = 1
#: Version 2 is version 1 with the private-pool kinds (13-17) and flag bits (8, 16, 32): same header, same
#: records. A file is written as version 1 unless its records use them, so readers of version 1 read it.
POOL_VERSION = 2
#: Version 3 is version 2 with the scope kinds (18-21: TRY_BEGIN/END, PHASE_BEGIN/END); written only when used.
SCOPE_VERSION = 3
READS = (VERSION, POOL_VERSION, SCOPE_VERSION)
POOL_FLAGS = POOL_CAPTURE | POOL_ANY_STREAM | POOL_EMPTY


def version_needed(kind: int, flags: int) -> int:
    """The least version whose records hold a record of ``kind`` with ``flags`` (for a batch: its highest kind
    and the OR of its flags). Flag bits 64 and 128 came after version 2 without a new version: version 1 holds
    them."""
    if kind >= TRY_BEGIN:
        return SCOPE_VERSION
    return POOL_VERSION if kind >= POOL_BEGIN or flags & POOL_FLAGS else VERSION


HEADER = struct.Struct("<8sHHIQQQ24x")
HEADER_SIZE = 64
UNFINISHED = 2**64 - 1
assert HEADER.size == HEADER_SIZE


def _align8(n: int) -> int:
    return (n + 7) & ~7


class TraceFileWriter:
    """Streams records to a `.bin` file; `close()` writes the footer and patches the header.

    Records are buffered and written in whole-record chunks of `chunk` records, so
    a killed writer leaves at most a partial last chunk, of whole records.
    Writes go to ``path`` directly (the file is the recording); use
    :func:`write_trace_atomic` to publish a finished trace without a half-written file.
    """

    def __init__(self, path: str, meta: dict, chunk: int = 4096):
        self.path = path
        blob = json.dumps(meta, sort_keys=True, default=str).encode()
        self._records_offset = _align8(HEADER_SIZE + len(blob))
        self._f = open(path, "wb")
        self._f.write(HEADER.pack(MAGIC, VERSION, RECORD_DTYPE.itemsize, len(blob), UNFINISHED, 0,
                                  self._records_offset))
        self._f.write(blob)
        self._f.write(b"\0" * (self._records_offset - HEADER_SIZE - len(blob)))
        self._f.flush()
        self._buf = np.zeros(chunk, RECORD_DTYPE)
        self._n_buf = 0
        self.count = 0
        self.version = VERSION

    def write(self, records: np.ndarray) -> None:
        """Append an array of `RECORD_DTYPE` records."""
        self.flush()
        records = np.ascontiguousarray(records, RECORD_DTYPE)
        if len(records):
            self._raise_version(version_needed(int(records["kind"].max()), int(np.bitwise_or.reduce(records["flags"]))))
        self._f.write(records.tobytes())
        self._f.flush()      # each chunk reaches the OS whole: a killed writer loses only what is unwritten
        self.count += len(records)

    def append(self, kind, flags, stream, id_, site, aux, size, time_ns, addr) -> None:
        """Append one record (buffered)."""
        self._buf[self._n_buf] = (kind, flags, stream, id_, site, aux, size, time_ns, addr)
        self._n_buf += 1
        if kind >= POOL_BEGIN or flags & POOL_FLAGS:
            self._raise_version(version_needed(kind, flags))
        if self._n_buf == len(self._buf):
            self.flush()

    def _raise_version(self, version: int) -> None:
        """Mark the file ``version`` if it is above the one written (in its header, at once: a writer that dies
        leaves it readable as such)."""
        if version > self.version:
            self.version = version
            at = self._f.tell()
            self._f.seek(8)
            self._f.write(struct.pack("<H", version))
            self._f.seek(at)

    def flush(self) -> None:
        if self._n_buf:
            self._f.write(self._buf[: self._n_buf].tobytes())
            self.count += self._n_buf
            self._n_buf = 0
        self._f.flush()

    def close(self, footer: dict) -> None:
        self.flush()
        footer_offset = self._f.tell()
        self._f.write(json.dumps(footer, sort_keys=True, default=str).encode())
        self._f.seek(16)
        self._f.write(struct.pack("<QQ", self.count, footer_offset))
        self._f.close()

    def abort(self) -> None:
        """Close without a footer (the file stays 'unfinished')."""
        try:
            self.flush()
        finally:
            self._f.close()


def write_trace_atomic(path: str, meta: dict, records: np.ndarray, footer: dict) -> None:
    """Write a complete trace to ``path`` via a temporary file and a rename (see `atomic_path`)."""
    with atomic_path(path) as tmp:
        w = TraceFileWriter(tmp, meta)
        w.write(records)
        w.close(footer)


def _within(e: Exception, text: bytes) -> int:
    """Where in a JSON ``text`` that `json.loads` refused the fault lies, for a byte position: an undecodable byte's
    offset (counted after a UTF-8 byte order mark, which `json.loads` skips); else 0, the text's start (a syntax
    error's line and column are in its message)."""
    if not isinstance(e, UnicodeDecodeError):
        return 0
    return e.start + (len(codecs.BOM_UTF8) if text.startswith(codecs.BOM_UTF8) else 0)


#: Compressed files a trace is often kept in, by their magic: what compressed them and the command that unpacks.
PACKED = ((b"\xfd7zXZ\x00", ("xz", "xz -dk")), (b"\x1f\x8b", ("gzip", "gunzip -k")),
          (b"\x28\xb5\x2f\xfd", ("zstd", "zstd -d")), (b"BZh", ("bzip2", "bunzip2 -k")))


#: What tells a file `allocsim import` reads (a snapshot, a log) from a trace: functions ``path -> what it is`` (None
#: if not one); `allocsim.formats.importers` adds its detection, so this module, below the importers, knows none.
IMPORTABLE: list = []


def _import_it(path: str) -> str:
    """The end of the "not a trace" line for a file `allocsim import` reads: what it is and the command."""
    what = next((w for w in (sniff(path) for sniff in IMPORTABLE) if w), None)
    return f": it is {what}; import it first (allocsim import {shlex.quote(path)} -o NAME.bin)" if what else ""


def packed_note(head: bytes, path: str) -> str | None:
    """"it is xz-compressed; unpack it first (xz -dk PATH)" where ``head``, a file's first bytes, is a compressed
    file's (`PACKED`), else None."""
    packed = next((how for magic, how in PACKED if head.startswith(magic)), None)
    return packed and f"it is {packed[0]}-compressed; unpack it first ({packed[1]} {shlex.quote(path)})"


def read_trace_file(path: str, *, mmap: bool = True):
    """Read and check a `.bin` file; return ``(meta, records, footer, finished, version)``.

    ``records`` is a read-only memmap (or array) of `RECORD_DTYPE`. An unfinished
    file (writer died) yields its whole-record prefix with ``finished=False`` and
    an empty footer. Every structural defect raises `InputError` naming the file
    and the byte offset.
    """
    check_input_file(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
            if len(head) < 8 or head[:8] != MAGIC:
                packed = packed_note(head, path)
                raise InputError(f"not an allocsim trace (bad magic {head[:8]!r}; expected {MAGIC!r})"
                                 + (f": {packed}" if packed else _import_it(path)), path=path, position="byte 0")
            if len(head) < HEADER_SIZE:
                raise InputError(f"truncated header: {len(head)} of {HEADER_SIZE} bytes", path=path,
                                 position=f"byte {len(head)}")
            magic, version, rec_size, meta_len, n, footer_off, rec_off = HEADER.unpack(head)
            if version not in READS:
                raise InputError(f"unsupported trace version {version} (this allocsim reads versions "
                                 f"{', '.join(map(str, READS))})", path=path, position="byte 8")
            if rec_size != RECORD_DTYPE.itemsize:
                raise InputError(f"record size {rec_size} does not match version {VERSION} ({RECORD_DTYPE.itemsize})",
                                 path=path, position="byte 10")
            if rec_off != _align8(HEADER_SIZE + meta_len):
                raise InputError(f"records offset {rec_off} inconsistent with metadata length {meta_len}",
                                 path=path, position="byte 32")
            blob = f.read(meta_len)
            if len(blob) < meta_len:
                raise InputError(f"truncated header: metadata is {meta_len} bytes, file has {len(blob)}",
                                 path=path, position=f"byte {HEADER_SIZE + len(blob)}")
            try:
                meta = json.loads(blob)
            except (ValueError, RecursionError) as e:    # (a decode error, bad UTF-8, a 5,000-digit number)
                raise InputError(f"metadata is not valid JSON ({json_why(e)})", path=path,
                                 position=f"byte {HEADER_SIZE + _within(e, blob)}")
            if not isinstance(meta, dict):
                raise InputError("metadata is not a JSON object", path=path, position=f"byte {HEADER_SIZE}")
            finished = n != UNFINISHED
            if finished:
                end = rec_off + n * rec_size
                if footer_off != end or end > size:
                    have = max(0, (min(size, footer_off or size) - rec_off)) // rec_size
                    raise InputError(f"truncated records: header says {n} records, file holds {have}",
                                     path=path, position=f"byte {min(size, end)}")
                f.seek(footer_off)
                try:
                    footer = json.loads(text := f.read())
                except (ValueError, RecursionError) as e:
                    raise InputError(f"footer is not valid JSON ({json_why(e)})", path=path,
                                     position=f"byte {footer_off + _within(e, text)}")
                if not isinstance(footer, dict):
                    raise InputError("footer is not a JSON object", path=path, position=f"byte {footer_off}")
            else:
                n = max(0, size - rec_off) // rec_size
                footer = {}
    except OSError as e:
        raise InputError(e.strerror or str(e), path=path)
    if n == 0:
        records = np.zeros(0, RECORD_DTYPE)
    elif mmap:
        records = np.memmap(path, RECORD_DTYPE, mode="r", offset=rec_off, shape=(n,))
    else:
        records = np.fromfile(path, RECORD_DTYPE, count=n, offset=rec_off)
    return meta, records, footer, finished, version
