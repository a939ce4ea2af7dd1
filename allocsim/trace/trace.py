"""`Trace`: an ordered list of allocation events with numpy column access.

A trace is one structured numpy array of `RECORD_DTYPE` records plus metadata
(producer, framework, device, allocator settings, command line) and three tables
the records index into: streams, call sites and mark labels.

Costs: `Trace.load` memory-maps the records (O(1) until touched) and validates
them in a few vectorised passes (O(n)); column access is a view; iteration builds
one small tuple per event and is meant for inspection, not for replay.
"""
from __future__ import annotations

import os

from collections import namedtuple
from functools import cached_property

import numpy as np

from ..errors import InputError
from . import events as ev
from .events import RECORD_DTYPE
from .pools_check import POOL_NUMBERED, PoolNumbers
from .format import TraceFileWriter, read_trace_file, version_needed, write_trace_atomic
from .schema import check_footer, check_meta

Event = namedtuple("Event", "index kind flags stream id site aux size time_ns addr")


def trace_path(path) -> str:
    """A trace's file name as the readers take it: a str, a `pathlib.Path` (any ``os.PathLike``) or bytes; anything
    else is a TypeError saying so (a Python caller's ``allocsim.replay(5)`` failed deep inside)."""
    if isinstance(path, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(path))
    raise TypeError(f"a trace is a Trace or its file's name (str, pathlib.Path, bytes), not {type(path).__name__}")


class Trace:
    """An allocation trace. Build one with `TraceWriter`, read one with `Trace.load`."""

    def __init__(self, records: np.ndarray, meta: dict | None = None, *, streams=None, sites=None,
                 labels=None, finished: bool = True, path: str | None = None, version: int | None = None):
        self.records = records
        self.version = version          # the file's format version (None: built in memory)
        self.meta = dict(meta or {})
        self.streams = list(streams if streams is not None else [0])
        self.sites = list(sites or [])
        self.labels = list(labels or [])
        self.finished = finished
        self.path = path
        self._read = None               # `load`'s: (path, records, absolute path, the file's identity then)

    # ---- I/O -------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str, *, validate: bool = True, mmap: bool = True, walkers=()) -> "Trace":
        """Read a `.bin` trace; raise `InputError` (file, position, what) if it is malformed.

        The footer's tables are always checked (the trace is built from them); the
        metadata's fields and the events only with ``validate``. ``walkers`` are fed
        each `Chunk` of the validating pass (see `walk`), so a caller that summarises the
        records reads them once.
        """
        path = trace_path(path)
        meta, records, footer, finished, version = read_trace_file(path, mmap=mmap)
        check_footer(footer, path)
        meta = {**meta, **footer.get("meta", {})}      # what the writer learnt only at the end (docs/trace-format.md)
        if validate:
            check_meta(meta, path)
        t = cls(records, meta, streams=footer.get("streams"), sites=footer.get("sites"),
                labels=footer.get("labels"), finished=finished, path=path, version=version)
        st = os.stat(path)
        t._read = (path, records, os.path.abspath(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        if validate:
            t.validate(walkers)
        elif walkers:
            t.walk(*walkers)
        return t

    def file_as_read(self) -> str | None:
        """The file (its absolute path) that holds this trace as it is: the one `load` read, unchanged since (the
        same file, size and time) and this trace unchanged too (its records, path, metadata and tables). None
        otherwise (a trace built in memory, one whose metadata a caller changed, a file replaced since): what a
        sweep's cells, which name their trace by its file, can read in its stead
        (`allocsim.search.sweep.trace_on_disk`). O(header and footer)."""
        read = self._read
        if read is None or read[1] is not self.records or read[0] != self.path:
            return None
        path, key = read[2], read[3]
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != key:
                return None
            fresh = Trace.load(path, validate=False)    # (its records memory-mapped: read no further)
        except (OSError, InputError):
            return None
        same = (fresh.meta == self.meta and fresh.finished == self.finished and fresh.streams == self.streams
                and fresh.sites == self.sites and fresh.labels == self.labels)
        return path if same else None

    def save(self, path: str) -> None:
        """Write this trace to ``path`` atomically (no half-written file on failure)."""
        write_trace_atomic(path, self.meta, np.asarray(self.records), self._footer())

    def _footer(self) -> dict:
        return {"streams": self.streams, "sites": self.sites, "labels": self.labels,
                "summary": {"events": len(self), "allocs": self.n_allocs}}

    # ---- access ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        for i, r in enumerate(self.records.tolist()):
            yield Event(i, *r)

    def __repr__(self) -> str:
        return f"<Trace {self.path or ''} events={len(self)} allocs={self.n_allocs}>"

    def chunks(self):
        """``(start, records[start:start + CHUNK])`` over the whole trace: bounded temporaries."""
        for start in range(0, len(self), CHUNK):
            yield start, np.asarray(self.records[start:start + CHUNK])    # a plain view: no memmap overhead

    def walk(self, *walkers, stop=None) -> None:
        """Feed each `Chunk` of the records, in order, to every walker's ``add(chunk)``; ``stop()`` true after a
        chunk ends the walk there.

        Walkers that run together share the chunk's columns (read once) and the pass.
        """
        for start, rec in self.chunks():
            chunk = Chunk(start, rec)
            for w in walkers:
                w.add(chunk)
            if stop is not None and stop():
                return

    def column(self, name: str) -> np.ndarray:
        return self.records[name]

    kind = property(lambda self: self.records["kind"])
    flags = property(lambda self: self.records["flags"])
    stream = property(lambda self: self.records["stream"])
    id = property(lambda self: self.records["id"])
    site = property(lambda self: self.records["site"])
    aux = property(lambda self: self.records["aux"])
    size = property(lambda self: self.records["size"])
    time_ns = property(lambda self: self.records["time_ns"])
    addr = property(lambda self: self.records["addr"])

    @cached_property
    def kinds_present(self) -> frozenset:
        """The event kinds the trace holds, read once (a policy asks at every replay whether some are there): a count
        of each kind, not `numpy.unique`, whose first call in a process imports `numpy.ma` (10-20 ms, more than a
        folded replay of a small GPT takes)."""
        seen = np.zeros(256, bool)
        for _, rec in self.chunks():
            seen |= np.bincount(rec["kind"], minlength=256) > 0
        return frozenset(np.flatnonzero(seen).tolist())

    @cached_property
    def kind_flags(self) -> np.ndarray:
        """Each record's kind and flags as one contiguous little-endian ``uint16``, ``kind | flags << 8``, kept
        (2 bytes a record, a twentieth of the records'): the passes that look at kinds alone (the folder's steps,
        the recorded segments) read it, not the records' 40-byte-strided columns (each such pass cost a read of
        every record). `validate` keeps the one its pass reads; else read here, once."""
        out = np.empty(len(self), "<u2")
        for start, rec in self.chunks():
            out[start:start + len(rec)] = kind_flags_of(rec)
        return out

    @property
    def kinds(self) -> np.ndarray:
        """Each record's kind, contiguous in memory but strided by 2: the low bytes of `kind_flags` (a view, no
        copy)."""
        return self.kind_flags.view(np.uint8)[::2]

    @cached_property
    def n_allocs(self) -> int:
        """ALLOC events (counted by `validate` as it goes, else in a pass of its own)."""
        return sum(int(np.count_nonzero(rec["kind"] == ev.ALLOC)) for _, rec in self.chunks())

    @cached_property
    def n_ids(self) -> int:
        """One more than the largest object id (ids are dense)."""
        ids = self.id[self.kind == ev.ALLOC]
        return int(ids.max()) + 1 if len(ids) else 0

    @cached_property
    def id_size(self) -> np.ndarray:
        """Requested size of each object id."""
        out = np.zeros(self.n_ids, np.int64)
        a = self.kind == ev.ALLOC
        out[self.id[a].astype(np.int64)] = self.size[a]
        return out

    @cached_property
    def live_curve(self) -> np.ndarray:
        """Live requested bytes after each event (int64, one entry per event)."""
        kind = self.kind
        delta = np.zeros(len(self), np.int64)
        a = kind == ev.ALLOC
        delta[a] = self.size[a]
        f = kind == ev.FREE
        delta[f] = -self.id_size[self.id[f].astype(np.int64)]
        return np.cumsum(delta)

    @cached_property
    def load_bytes(self) -> int:
        """LOAD: peak live requested bytes, the lower bound for any allocator.

        Found by `validate` as it goes, else by a walk of its own; either way a chunk at a time
        (`LiveBytes`): memory bounded by the live objects.
        """
        live = LiveBytes()
        self.walk(live)
        return live.peak

    def marks(self) -> list[tuple[int, str]]:
        """``(event index, label)`` of every MARK (read a chunk at a time)."""
        out = []
        for start, rec in self.chunks():
            idx = np.flatnonzero(rec["kind"] == ev.MARK)
            out += [(start + int(i), self.labels[a] if a < len(self.labels) else f"mark {a}")
                    for i, a in zip(idx, rec["aux"][idx].tolist())]
        return out

    # ---- validation --------------------------------------------------------------------
    def validate(self, walkers=()) -> None:
        """Check the event stream; raise `InputError` at the first bad event.

        One pass over the records (`_Validator`), which also finds LOAD and the ALLOC count
        (kept as `load_bytes` and `n_allocs`) and feeds ``walkers`` (see `walk`).
        """
        check = _Validator(self)
        kept = _KindFlags(len(self))
        # an unknown kind is reported before any other defect: no later chunk can change what is (a file of zeros,
        # sparse and claiming 400 GiB, was read whole before its one line)
        self.walk(check, kept, *walkers, stop=lambda: _Validator.ORDER[0] in check.first.found)
        check.finish()
        self.__dict__["load_bytes"], self.__dict__["n_allocs"] = check.live.peak, check.n_allocs
        self.__dict__["kind_flags"] = kept.out


class _KindFlags:
    """A walker keeping each `Chunk`'s ``kind_flags`` (`Trace.kind_flags`, read by `validate`'s pass)."""

    def __init__(self, n: int):
        self.out = np.empty(n, "<u2")

    def add(self, c: "Chunk") -> None:
        self.out[c.start:c.start + len(c.kind)] = c.kind_flags


class _Validator:
    """The checks of `Trace.validate`, a `Chunk` at a time.

    Each check keeps its own first defect, and they are reported in a fixed order (kind,
    stream, size, id range, double ALLOC, then per FREE kind unknown id and double free),
    so a trace with several defects reports the same one whatever the chunk size.

    A FREE is checked against the live objects (`LiveBytes`, which finds LOAD on the way):
    one that frees an object allocated before it and not yet freed is good, and in a good
    trace all are, so the exact sorting-out of unknown and double frees runs only for a
    chunk that has a bad one. (Once one FREE is bad, the live set may be wrong later on,
    but the first unknown or double free, which is what is reported, is exact.)
    Memory: the live objects, and the ids allocated (and FREE_REQUESTED) as runs of
    consecutive ids (`IdRuns`), bounded by the gaps in them, not by the trace length.
    """

    ORDER = ("kind", "version", "stream", "size", "id", "twice", "unknown free", "double free",
             "unknown free_requested", "double free_requested",
             "flags", "site", "aux", "pool", "pool numbers", "label", "device free", "fraction", "segment",
             "scope")   # "version" and from "flags" on: `_RecordFields`

    def __init__(self, trace: Trace):
        self.trace = trace
        self.first = _FirstDefects()
        self.known_kind = np.zeros(256, bool)
        self.known_kind[list(ev.KIND_NAMES)] = True
        self.top, self.top_at = -1, 0           # the largest ALLOC id and its first event
        self.allocated = IdRuns()
        self.requested = IdRuns()               # ids freed by FREE_REQUESTED
        self.live = LiveBytes()
        self.twice = None                       # (event, id) of the smallest id allocated twice, at its second ALLOC
        self.n_allocs = 0
        self.fields = _RecordFields(trace, self.first)

    def add(self, c: "Chunk") -> None:
        first, start, kind, t = self.first, c.start, c.kind, self.trace
        if c.known_kinds < len(kind):
            first.note("kind", start, ~self.known_kind[kind], lambda j: f"unknown event kind {int(kind[j])}")
        stream = c.rec["stream"]
        if t.finished and c.stream_range[1] >= len(t.streams):   # unfinished: no table, indices stand for themselves
            first.note("stream", start, stream >= len(t.streams),
                       lambda j: f"stream index {int(stream[j])} is beyond the footer's table of "
                                 f"{len(t.streams)} streams")
        a_idx, a_ids = c.where(ev.ALLOC), c.ids(ev.ALLOC)
        self.n_allocs += len(a_idx)
        size = c.rec["size"]
        if int(size.max()) > ev.MAX_SIZE:       # every kind's size: segment, OOM and limit sizes are bytes too
            first.note("size", start, size > ev.MAX_SIZE, lambda j: f"absurd {_size_of(kind[j])} {int(size[j])} "
                                                                    f"bytes (> 1 PiB)")
        self.fields.add(c)
        if len(a_idx):
            k = int(np.argmax(a_ids))
            if int(a_ids[k]) > self.top:
                self.top, self.top_at = int(a_ids[k]), start + int(a_idx[k])
        if _increasing(a_ids):          # the usual order: no sort needed
            a_sorted, a_at = a_ids, a_idx
        else:
            order = np.argsort(a_ids, kind="stable")
            a_sorted, a_at = a_ids[order], a_idx[order]     # this chunk's ALLOCs by id, and where each is
        self.live.add(c)
        for k, label in ((ev.FREE, "free"), (ev.FREE_REQUESTED, "free_requested")):
            f_idx, f_ids = c.where(k), c.ids(k)
            if not len(f_idx):
                continue
            if k == ev.FREE:
                live = (self.live.freed_from >= -1) & (self.live.freed_from < f_idx)
                if live.all() and not self.live.freed_twice:
                    continue            # every FREE ends a live object: the usual case
            known = self.allocated.contains(f_ids)
            later = np.flatnonzero(~known)
            if len(a_ids) and len(later):   # allocated in this chunk, before the free?
                pos = _find(a_sorted, f_ids[later])
                known[later] = (a_sorted[pos] == f_ids[later]) & (a_at[pos] < f_idx[later])
            first.note(f"unknown {label}", start, ~known,
                       lambda j: f"{label} of unknown id {int(f_ids[j])} (never allocated before this event)", at=f_idx)
            if k == ev.FREE:            # allocated before, but not live then: freed before
                live[np.setdiff1d(np.arange(len(f_ids)), np.unique(f_ids, return_index=True)[1])] = False
                double = known & ~live
            else:
                double = _repeats(f_ids, self.requested)
            first.note(f"double {label}", start, double, lambda j: f"double {label} of id {int(f_ids[j])}", at=f_idx)
        rep = np.flatnonzero(_repeats(a_ids, self.allocated))
        if len(rep):
            j = rep[np.argmin(a_ids[rep])]      # argmin: the first of the smallest id's repeats here
            if self.twice is None or a_ids[j] < self.twice[1]:
                self.twice = (start + int(a_idx[j]), int(a_ids[j]))

    def finish(self) -> None:
        """Raise `InputError` for the first defect in `ORDER`, if any."""
        found = self.first.found
        if self.top >= ev.NO_ID:
            found.setdefault("id", (self.top_at, "ALLOC without an object id"))
        elif self.top >= len(self.trace):          # dense ids: each needs its own ALLOC event
            found.setdefault("id", (self.top_at, f"object id {self.top} is out of range (ids are dense; the trace "
                                                 f"has {len(self.trace)} events)"))
        if self.twice is not None:
            found["twice"] = (self.twice[0], f"id {self.twice[1]} allocated twice")
        self.first.raise_first(self.ORDER, self.trace.path or "<trace>")


def _size_of(kind: int) -> str:
    """What a record's ``size`` is, in an error line: ``allocation size``, ``SEGMENT_ALLOC size``."""
    return "allocation size" if kind == ev.ALLOC else f"{ev.KIND_NAMES.get(int(kind), 'event')} size"


class _RecordFields:
    """The record fields `_Validator` checks beyond kinds, ids and sizes, a `Chunk` at a time
    (the table in ``docs/trace-format.md``, section 4).

    Every event: no flag bits beyond those defined, each on a kind it marks, a site index within the footer's
    ``sites`` (or none). Per kind: GC, CACHE_RELEASE and SET_LIMIT ``aux`` 0 or 1; a MARK's
    label index within ``labels``; an OOM's device free bytes and a torch SET_LIMIT's fraction
    (0 to 1) in range; a SEGMENT_FREE names a segment allocated before it (in the trace or in
    the metadata's ``initial_segments``), and no SEGMENT_FREE or SEGMENT_UNMAP takes the
    recorded reserved bytes below zero. The tables are checked only in a finished file (an
    unfinished one has none). The kind-specific checks read only the events of their kind, and
    the segment events (few) are followed one at a time.
    """

    #: ``aux`` of the kinds that have a closed set of values, and what each names.
    AUX = {ev.GC: "0 (incremental) nor 1 (full)", ev.CACHE_RELEASE: "0 (torch) nor 1 (CuPy)",
           ev.SET_LIMIT: "0 (torch) nor 1 (CuPy)"}
    SEGMENT_KINDS = (ev.SEGMENT_ALLOC, ev.SEGMENT_FREE, ev.SEGMENT_MAP, ev.SEGMENT_UNMAP)
    FLAGS = (ev.PRE_EXISTING | ev.FAILED | ev.PRIVATE_POOL | ev.POOL_CAPTURE | ev.POOL_ANY_STREAM | ev.POOL_EMPTY
             | ev.IN_REQUEST | ev.CATCHES_OOM)
    #: The flags that mark one kind of record only, and those kinds (docs/trace-format.md).
    FLAG_KINDS = {ev.POOL_CAPTURE: (ev.POOL_BEGIN,), ev.POOL_ANY_STREAM: (ev.POOL_BEGIN,),
                  ev.POOL_EMPTY: (ev.POOL_RELEASE,), ev.IN_REQUEST: (ev.FREE,), ev.CATCHES_OOM: (ev.ALLOC,)}
    FLAG_NAMES = {ev.POOL_CAPTURE: "POOL_CAPTURE", ev.POOL_ANY_STREAM: "POOL_ANY_STREAM",
                  ev.POOL_EMPTY: "POOL_EMPTY", ev.IN_REQUEST: "IN_REQUEST", ev.CATCHES_OOM: "CATCHES_OOM"}

    def _bad_flags(self, flags: int, kind: int) -> str:
        """What is wrong with a record's flags: bits no flag defines, or a flag on a kind it does not mark."""
        if flags & ~self.FLAGS & 0xFF:
            defined = ", ".join(str(1 << b) for b in range(8) if self.FLAGS >> b & 1)
            return f"unknown flag bits {flags & ~self.FLAGS & 0xFF:#x} (defined: {defined})"
        bit = next(b for b, kinds in self.FLAG_KINDS.items() if flags & b and kind not in kinds)
        marks = " and ".join(ev.KIND_NAMES[k] + "s" for k in self.FLAG_KINDS[bit])
        name = ev.KIND_NAMES.get(kind, f"kind {kind}")
        return (f"flag {bit} ({self.FLAG_NAMES[bit]}) on {'an' if name[0] in 'AEIOU' else 'a'} {name}: it marks "
                f"{marks} only")

    def __init__(self, trace: Trace, first: _FirstDefects):
        self.trace, self.first = trace, first
        self.tables = trace.finished
        segs = [s for s in trace.meta.get("initial_segments") or [] if isinstance(s, dict)]
        self.reserved = sum(int(s.get("total_size") or 0) for s in segs)
        self.live = {int(s["address"]): int(s.get("total_size") or 0) for s in segs
                     if isinstance(s.get("address"), int)}
        #: a starting segment without an address: a free of any address may be of it
        self.by_address = all(isinstance(s.get("address"), int) for s in segs)
        self.pools = PoolNumbers()                  # one pool per number and one number per pool
        self.open_scopes: dict[int, list] = {}     # BEGIN kind -> the open scopes' (serial, label), innermost last
        self.last_serial = 0

    def add(self, c: "Chunk") -> None:
        first, start, t = self.first, c.start, self.trace
        flags = (c.kind_flags >> 8).astype(np.uint8)
        if flags.any():         # rare: most traces flag nothing
            unknown = flags & np.uint8(~self.FLAGS & 0xFF)
            kind = c.kind
            misplaced = np.zeros(len(flags), bool)
            for bit, kinds in self.FLAG_KINDS.items():
                misplaced |= (flags & bit != 0) & ~np.isin(kind, kinds)
            first.note("flags", start, (unknown != 0) | misplaced,
                       lambda j: self._bad_flags(int(flags[j]), int(kind[j])))
        if self.tables:
            site = c.rec["site"] + np.uint32(1)     # NO_SITE wraps to 0: one comparison finds the bad ones
            if int(site.max()) > len(t.sites):
                first.note("site", start, site > len(t.sites),
                           lambda j: f"site index {int(site[j]) - 1} is beyond the footer's table of "
                                     f"{len(t.sites)} sites")
        for kind, expected in self.AUX.items():
            at = c.where(kind)
            aux = c.rec["aux"][at]
            first.note("aux", start, aux > 1, lambda j: f"{ev.KIND_NAMES[kind]} aux {int(aux[j])} is neither "
                                                        f"{expected}", at=at)
        for kind in (*ev.POOL, ev.GRAPH_REPLAY):
            at = c.where(kind)
            pool = c.rec["aux"][at]
            first.note("pool", start, pool == 0, lambda j: f"{ev.KIND_NAMES[kind]} names pool 0 (pools are "
                                                           f"numbered from 1)", at=at)
        if "pool numbers" not in first.found and any(len(c.where(k)) for k in POOL_NUMBERED):
            clash = self.pools.first_clash(c.rec, start)
            if clash:
                first.found["pool numbers"] = clash
        at = c.where(ev.MARK)
        if self.tables and len(at):
            label = c.rec["aux"][at]
            first.note("label", start, label >= len(t.labels),
                       lambda j: f"MARK label index {int(label[j])} is beyond the footer's table of "
                                 f"{len(t.labels)} labels", at=at)
        at = c.where(ev.OOM)
        free = c.rec["addr"][at]
        first.note("device free", start, free > ev.MAX_SIZE,
                   lambda j: f"absurd OOM device free bytes {int(free[j])} (> 1 PiB)", at=at)
        at = c.where(ev.SET_LIMIT)
        at = at[c.rec["aux"][at] == ev.TORCH_AUX]
        fraction = np.ascontiguousarray(c.rec["addr"][at]).view("<f8")
        first.note("fraction", start, ~((fraction >= 0) & (fraction <= 1)),     # NaN fails both
                   lambda j: f"SET_LIMIT memory fraction {float(fraction[j])!r} is not a number from 0 to 1", at=at)
        if "segment" not in first.found and any(len(c.where(k)) for k in self.SEGMENT_KINDS):
            self._segments(c)
        if t.version is not None and "version" not in first.found:
            need = version_needed(int(c.kind.max()), int(np.bitwise_or.reduce(flags))) if len(c.kind) else t.version
            if need > t.version:
                first.note("version", start, np.array([version_needed(int(k), int(f)) > t.version
                                                       for k, f in zip(c.kind, flags)]),
                           lambda j: f"{ev.KIND_NAMES.get(int(c.kind[j]), f'kind {int(c.kind[j])}')} (flags "
                                     f"{int(flags[j])}) in a version-{t.version} file: it needs version "
                                     f"{version_needed(int(c.kind[j]), int(flags[j]))} (docs/trace-format.md, "
                                     f"Versioning)")
        if "scope" not in first.found and any(len(c.where(k)) for k in ev.SCOPE_KINDS):
            self._scopes_in(c)

    def _scopes_in(self, c: "Chunk") -> None:
        """Follow the chunk's scope events in order (few): each BEGIN a new serial above the last, its label
        within ``labels``; each END closing the innermost open BEGIN of its pair, same serial and label."""
        at = np.sort(np.concatenate([c.where(k) for k in ev.SCOPE_KINDS]))
        rec = c.rec[at]
        labels = len(self.trace.labels) if self.tables else None
        for j, kind, serial, label in zip(at.tolist(), rec["kind"].tolist(), rec["size"].tolist(),
                                          rec["aux"].tolist()):
            name, what = ev.KIND_NAMES[kind], None
            begin = kind if kind in ev.SCOPES else next(b for b, e in ev.SCOPES.items() if e == kind)
            stack = self.open_scopes.setdefault(begin, [])
            if labels is not None and label >= labels:
                what = f"{name} label index {label} is beyond the footer's table of {labels} labels"
            elif kind in ev.SCOPES:
                if serial <= self.last_serial:
                    what = (f"{name} serial {serial} is not above the last scope's ({self.last_serial}): each "
                            f"scope takes the next number")
                self.last_serial = max(self.last_serial, serial)
                stack.append((serial, label))
            elif not stack:
                what = f"{name} (serial {serial}) closes no open {ev.KIND_NAMES[begin]}"
            elif stack[-1] != (serial, label):
                what = (f"{name} (serial {serial}, label {label}) does not close the innermost open "
                        f"{ev.KIND_NAMES[begin]} (serial {stack[-1][0]}, label {stack[-1][1]})")
            else:
                stack.pop()
            if what:
                self.first.found["scope"] = (c.start + j, what)
                return

    def _segments(self, c: "Chunk") -> None:
        """Follow the chunk's segment events in order: the live segments by address, the reserved bytes."""
        at = np.sort(np.concatenate([c.where(k) for k in self.SEGMENT_KINDS]))
        rec = c.rec[at]
        for j, kind, size, addr in zip(at.tolist(), rec["kind"].tolist(), rec["size"].tolist(), rec["addr"].tolist()):
            what = None
            if kind == ev.SEGMENT_ALLOC:
                self.live[addr] = size
            elif kind == ev.SEGMENT_FREE and self.live.pop(addr, None) is None and self.by_address:
                what = f"SEGMENT_FREE of a segment never allocated (address {addr:#x}, {size} bytes)"
            self.reserved += size if kind in (ev.SEGMENT_ALLOC, ev.SEGMENT_MAP) else -size
            if what is None and self.reserved < 0:
                what = (f"{ev.KIND_NAMES[kind]} of {size} bytes takes the recorded reserved bytes below zero "
                        f"({self.reserved}): more released than was allocated")
            if what:
                self.first.found["segment"] = (c.start + j, what)
                return


class _FirstDefects:
    """The first event each named check finds bad, over a walk in trace order."""

    def __init__(self):
        self.found: dict[str, tuple[int, str]] = {}

    def note(self, check: str, start: int, bad: np.ndarray, what, at: np.ndarray | None = None) -> None:
        """Keep the first True of ``bad`` (a chunk starting at ``start``) if ``check`` has none yet.

        ``what(j)`` says what is wrong with ``bad[j]``; ``at`` gives the chunk position of
        each entry of ``bad`` when it covers only some of the chunk's events.
        """
        if check not in self.found and bad.any():
            j = int(np.argmax(bad))
            self.found[check] = (start + (j if at is None else int(at[j])), what(j))

    def raise_first(self, checks, where: str) -> None:
        """Raise `InputError` for the first of ``checks`` (in that order) that found a defect."""
        for c in checks:
            if c in self.found:
                i, what = self.found[c]
                raise InputError(what, path=where, position=f"event {i}")


def _find(sorted_ids: np.ndarray, ids: np.ndarray, tail: int | None = None) -> np.ndarray:
    """Where each of ``ids`` is (or would go, clipped to the last) in the non-empty ``sorted_ids``.

    Dense ids allocated in order make ``sorted_ids`` end in a run of consecutive
    integers (from ``tail`` where the caller knows it): those are found by subtraction
    instead of a binary search.
    """
    n = len(sorted_ids)
    lo = n - _consecutive_tail(sorted_ids) if tail is None else tail
    off = ids - sorted_ids[lo]
    in_tail = (off >= 0) & (off < n - lo)
    pos = np.where(in_tail, off + lo, 0)
    head = np.flatnonzero(~in_tail)
    if len(head):
        pos[head] = np.minimum(np.searchsorted(sorted_ids, ids[head]), n - 1)
    return pos


def _consecutive_tail(sorted_ids: np.ndarray) -> int:
    """How many of the non-empty, sorted ``sorted_ids`` end it as consecutive integers (at least 1).

    ``sorted_ids[-1] - sorted_ids[j] - (n - 1 - j)`` is never negative for distinct ids and
    falls to 0 exactly where the consecutive tail begins, so a binary search finds it;
    the answer is checked, as repeated ids (an unvalidated trace) break that order.
    """
    n = len(sorted_ids)
    if sorted_ids[-1] - sorted_ids[0] == n - 1:
        return n
    excess = sorted_ids[-1] - sorted_ids - np.arange(n - 1, -1, -1)
    lo = int(np.searchsorted(-excess, 0))
    if sorted_ids[-1] - sorted_ids[lo] != n - 1 - lo:
        return 1
    return n - lo


def _increasing(ids: np.ndarray) -> bool:
    """Are ``ids`` strictly increasing (so already sorted, without repeats)?"""
    return bool(np.all(ids[1:] > ids[:-1]))


def _repeats(ids: np.ndarray, seen: "IdRuns") -> np.ndarray:
    """Which of ``ids`` (in order) were seen before: in ``seen`` or earlier in ``ids``; adds them all to ``seen``."""
    if _increasing(ids):
        again = seen.contains(ids) if len(ids) and ids[0] < seen.end else np.zeros(len(ids), bool)
        seen.add_sorted(ids)
        return again
    again = seen.contains(ids)
    s = np.sort(ids)
    if np.all(s[1:] != s[:-1]):
        seen.add_sorted(s)
        return again
    first = np.unique(ids, return_index=True)[1]
    later = np.ones(len(ids), bool)
    later[first] = False
    seen.add_sorted(np.unique(ids))
    return again | later


class IdRuns:
    """A set of object ids held as sorted, disjoint runs ``[start, end)`` of consecutive ids.

    Dense ids allocated (or freed) mostly in order make few runs: the memory is
    bounded by the gaps in the set (for freed ids, about the live objects), not by
    how many ids it holds. Queries and insertions take numpy arrays.
    """

    def __init__(self):
        self.starts = np.zeros(0, np.int64)
        self.ends = np.zeros(0, np.int64)

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Membership of each of ``ids`` (int64)."""
        if not len(self.starts):
            return np.zeros(len(ids), bool)
        k = np.searchsorted(self.starts, ids, side="right") - 1
        return (k >= 0) & (ids < self.ends[np.maximum(k, 0)])

    def add_sorted(self, ids: np.ndarray) -> None:
        """Add ``ids`` (int64, sorted, without repeats; members already in the set are fine)."""
        if not len(ids):
            return
        cut = np.flatnonzero(ids[1:] != ids[:-1] + 1) + 1
        starts = ids[np.concatenate(([0], cut))]
        ends = ids[np.concatenate((cut - 1, [len(ids) - 1]))] + 1
        if len(self.starts) and starts[0] >= self.ends[-1]:         # all after the set: append, maybe joining
            starts = np.concatenate((self.starts, starts))
            ends = np.concatenate((self.ends, ends))
        elif len(self.starts):
            order = np.argsort(np.concatenate((self.starts, starts)), kind="stable")
            starts = np.concatenate((self.starts, starts))[order]
            ends = np.maximum.accumulate(np.concatenate((self.ends, ends))[order])
        new = np.concatenate(([True], starts[1:] > ends[:-1]))          # a run not touching the one before
        last = np.concatenate((np.flatnonzero(new)[1:] - 1, [len(starts) - 1]))
        self.starts, self.ends = starts[new], ends[last]

    @property
    def end(self) -> int:
        """One more than the largest id in the set (0 when empty)."""
        return int(self.ends[-1]) if len(self.ends) else 0


#: Records read at a time by the chunked walks (`Trace.walk`, the replay engine).
CHUNK = 1 << 16


def kind_flags_of(rec: np.ndarray) -> np.ndarray:
    """``kind | flags << 8`` of each record, contiguous little-endian ``uint16``s: of records laid out as
    `RECORD_DTYPE`, the first two bytes of each, in one strided read."""
    if rec.dtype == RECORD_DTYPE and rec.flags.c_contiguous:
        return rec.view(np.uint8).view("<u2")[::RECORD_DTYPE.itemsize // 2].copy()
    return rec["kind"].astype("<u2") | (rec["flags"].astype("<u2") << 8)


def ahead(pos: int, index: int, last: int) -> int:
    """How many records a walker that has read ``pos`` records and is asked at ``index`` reads next: through
    ``index``, at least twice its ``last`` read, at most a `CHUNK`. A replay asks at its peak (often in the first
    steps) and at each OOM: the first read of a long trace read a whole chunk for an answer a few thousand records
    in (2.3 ms of a 300-step replay of a small GPT whose 10 steps take 5.6), and reads double from there, so that
    OOMs a few events apart still read chunks."""
    return min(CHUNK, max(index + 1 - pos, 2 * last, 1))


class Chunk:
    """Records ``start`` onwards (``rec``), with the columns the chunked walks share, each read once.

    The record columns are strided (40 bytes a record), so the kinds are copied once and
    the positions, ids and ALLOC sizes of an event kind are gathered on first use.
    """

    def __init__(self, start: int, rec: np.ndarray):
        self.start, self.rec = start, rec
        self.kind_flags = kind_flags_of(rec)        # both bytes in one strided read (`Trace.kind_flags`)
        self.kind = self.kind_flags.astype(np.uint8)
        self._where: dict[int, np.ndarray] = {}
        self._ids: dict[int, np.ndarray] = {}

    def where(self, kind: int) -> np.ndarray:
        """Positions (in the chunk) of the events of ``kind``."""
        at = self._where.get(kind)
        if at is None:
            at = self._where[kind] = np.flatnonzero(self.kind == kind)
        return at

    def ids(self, kind: int) -> np.ndarray:
        """Object ids (int64) of the events of ``kind``."""
        ids = self._ids.get(kind)
        if ids is None:
            ids = self._ids[kind] = self.rec["id"][self.where(kind)].astype(np.int64)
        return ids

    @cached_property
    def alloc_sizes(self) -> np.ndarray:
        """Requested bytes (uint64) of the ALLOCs."""
        return self.rec["size"][self.where(ev.ALLOC)]

    @cached_property
    def known_kinds(self) -> int:
        """How many events are of a known kind (all of them, in a good trace)."""
        return sum(len(self.where(k)) for k in ev.KIND_NAMES)

    @cached_property
    def stream_range(self) -> tuple[int, int]:
        """The smallest and largest stream index in the chunk."""
        stream = self.rec["stream"]
        return int(stream.min()), int(stream.max())


class LiveBytes:
    """Live requested bytes along a trace read in order, a `Chunk` at a time; a walker (`Trace.walk`).

    Keeps the live objects' ids and sizes (sorted numpy arrays) between chunks, so
    its memory is bounded by the live state, not by the trace length. A chunk whose
    ALLOC ids are new and increasing (the usual order) costs no sort. A FREE of an id
    not live (an unvalidated trace) frees 0 bytes. ``peak`` is LOAD so far.
    """

    def __init__(self):
        self.ids = np.zeros(0, np.int64)
        self.sizes = np.zeros(0, np.int64)
        self.live = 0
        self.peak = 0
        self.pos = 0        # records read by `at`
        self.freed_from = np.zeros(0, np.intp)  # per FREE of the last chunk: where in it the object freed was
        #                                          allocated, -1 before it, -2 no live object of that id
        self.freed_twice = False                # a live object freed twice in the last chunk
        self._read = np.zeros(0, np.int64)      # `at`: live bytes after each record of the last chunk read
        self._read_at = 0                       # where that chunk starts
        self.last = 0                           # records read by `at`'s last read (`ahead`)

    def at(self, records: np.ndarray, index: int) -> int:
        """Live bytes after event ``index`` of ``records``, read from where the last call stopped.

        Calls must come with non-decreasing ``index``; each record is read once over them all, a
        piece at a time (`ahead`: twice the last, up to a `CHUNK`), its curve kept: the replay asks at each
        OOM, and under a tight cap with ``--keep-going`` they come a few events apart (a read of a few records
        cost a chunk's fixed numpy work). ``live`` and the arrays are then those after the piece, not ``index``.
        """
        while self.pos <= index:
            self.last = ahead(self.pos, index, self.last)
            rec = np.asarray(records[self.pos:self.pos + self.last])
            self._read, self._read_at = self.curve(Chunk(self.pos, rec)), self.pos
            self.pos += len(rec)
        return int(self._read[index - self._read_at])

    def add(self, chunk: Chunk) -> None:
        self.peak = max(self.peak, int(self.curve(chunk).max()))

    def curve(self, chunk: Chunk) -> np.ndarray:
        """Live bytes after each event of the next chunk (int64)."""
        a, f = chunk.where(ev.ALLOC), chunk.where(ev.FREE)
        a_ids, a_sizes = chunk.ids(ev.ALLOC), chunk.alloc_sizes.astype(np.int64)
        all_ids = np.concatenate([self.ids, a_ids])
        all_sizes = np.concatenate([self.sizes, a_sizes])
        born = np.concatenate([np.full(len(self.ids), -1, np.intp), a])
        tail = None                     # where a consecutive run of ids ends the sorted ids, if known
        if _increasing(a_ids) and (not len(self.ids) or not len(a_ids) or a_ids[0] > self.ids[-1]):
            if len(a_ids) and a_ids[-1] - a_ids[0] == len(a_ids) - 1:
                tail = len(self.ids)
        else:
            order = np.argsort(all_ids, kind="stable")
            all_ids, all_sizes, born = all_ids[order], all_sizes[order], born[order]
        freed = chunk.ids(ev.FREE)
        pos = _find(all_ids, freed, tail) if len(all_ids) else np.zeros(len(freed), np.intp)
        known = all_ids[pos] == freed if len(all_ids) else np.zeros(len(freed), bool)
        delta = np.zeros(len(chunk.kind), np.int64)
        delta[a] = a_sizes
        delta[f] = -np.where(known, all_sizes[pos] if len(all_ids) else 0, 0)
        out = np.cumsum(delta)
        out += self.live
        keep = np.ones(len(all_ids), bool)
        keep[pos[known]] = False
        self.freed_from = np.where(known, born[pos] if len(all_ids) else -2, -2)
        self.freed_twice = len(keep) - np.count_nonzero(keep) < np.count_nonzero(known)
        self.ids, self.sizes = all_ids[keep], all_sizes[keep]
        if len(out):
            self.live = int(out[-1])
        return out


class TraceWriter:
    """Builds a trace event by event, in memory or streamed to a `.bin` file.

    ``w = TraceWriter(meta={...})``; ``i = w.alloc(size)``; ``w.free(i)``; ``w.mark("iter 1")``;
    ``trace = w.finish()``. With ``path=``, records stream to that file as they come
    (a crash leaves a readable prefix) and `finish()` writes the footer.
    Each call is O(1); in-memory records are kept in a growing numpy buffer.
    """

    def __init__(self, meta: dict | None = None, path: str | None = None, chunk: int = 4096):
        self.meta = dict(meta or {})
        self.path = path
        self._file = TraceFileWriter(path, self.meta, chunk) if path else None
        self._buf = np.zeros(max(chunk, 16), RECORD_DTYPE)
        self._n = 0
        self._streams: dict[int, int] = {}
        self._sites: dict[str, int] = {}
        self._labels: dict[str, int] = {}
        self._scopes = 0
        self.next_id = 0
        self.now = 0

    # ---- tables ----------------------------------------------------------------
    def stream_index(self, stream: int) -> int:
        s = self._streams.get(stream)
        if s is None:
            s = self._streams[stream] = len(self._streams)
            if s > 0xFFFF:
                raise ValueError("more than 65535 streams")
        return s

    def site_index(self, site: str | None) -> int:
        if site is None:
            return ev.NO_SITE
        s = self._sites.get(site)
        if s is None:
            s = self._sites[site] = len(self._sites)
        return s

    # ---- events ----------------------------------------------------------------
    def record(self, kind, *, flags=0, stream=0, id_=ev.NO_ID, site=ev.NO_SITE, aux=0, size=0, t=None, addr=0):
        """Append one raw record; ``stream`` is the original stream value."""
        if t is not None:
            self.now = int(t)
        if self._n == len(self._buf):
            if self._file:
                self._flush()
            else:
                self._buf = np.resize(self._buf, 2 * len(self._buf))
        self._buf[self._n] = (kind, flags, self.stream_index(stream), id_, site, aux, size, self.now, addr)
        self._n += 1

    def alloc(self, size: int, stream: int = 0, *, t=None, addr: int = 0, site: str | None = None,
              flags: int = 0) -> int:
        """Record an ALLOC; return its dense id."""
        if size < 0 or size > ev.MAX_SIZE:
            raise ValueError(f"bad allocation size {size}")
        i = self.next_id
        if i >= ev.NO_ID:       # 0xFFFFFFFF marks "no object"; past it numpy would refuse the record
            raise ValueError(f"more than {ev.NO_ID:,} allocations (an object id is 32 bits)")
        self.next_id += 1
        self.record(ev.ALLOC, flags=flags, stream=stream, id_=i, site=self.site_index(site), size=size,
                    t=t, addr=addr)
        return i

    def free(self, id_: int, *, t=None, stream: int = 0, addr: int = 0, size: int = 0) -> None:
        self.record(ev.FREE, id_=id_, t=t, stream=stream, addr=addr, size=size)

    def free_requested(self, id_: int, *, t=None, stream: int = 0, addr: int = 0, size: int = 0) -> None:
        self.record(ev.FREE_REQUESTED, id_=id_, t=t, stream=stream, addr=addr, size=size)

    def segment(self, kind: int, addr: int, size: int, stream: int = 0, *, t=None, flags: int = 0) -> None:
        """SEGMENT_ALLOC / SEGMENT_FREE / SEGMENT_MAP / SEGMENT_UNMAP (``flags``: `events.PRIVATE_POOL`)."""
        self.record(kind, addr=addr, size=size, stream=stream, t=t, flags=flags)

    def gc(self, full: bool, *, t=None) -> None:
        self.record(ev.GC, aux=int(bool(full)), t=t)

    def oom(self, size: int, *, device_free: int = 0, stream: int = 0, t=None) -> None:
        self.record(ev.OOM, size=size, addr=device_free, stream=stream, t=t)

    def label_index(self, label: str) -> int:
        s = self._labels.get(label)
        if s is None:
            s = self._labels[label] = len(self._labels)
        return s

    def mark(self, label: str = "", *, t=None) -> None:
        self.record(ev.MARK, aux=self.label_index(label), t=t)

    def begin(self, kind: int, label: str, *, t=None) -> int:
        """Open a scope (`events.TRY_BEGIN` or `events.PHASE_BEGIN`) named ``label``; return its serial number,
        which its `end` carries."""
        self._scopes += 1
        self.record(kind, aux=self.label_index(label), size=self._scopes, t=t)
        return self._scopes

    def end(self, kind: int, label: str, serial: int, *, t=None) -> None:
        """Close the scope ``serial`` (`events.TRY_END` or `events.PHASE_END`): the innermost open one of its pair."""
        self.record(kind, aux=self.label_index(label), size=serial, t=t)

    @property
    def count(self) -> int:
        """Records written so far."""
        return self._n + (self._file.count if self._file else 0)

    # ---- output ----------------------------------------------------------------
    def _flush(self) -> None:
        self._file.write(self._buf[: self._n])
        self._n = 0

    def tables(self) -> dict:
        return {"streams": list(self._streams) or [0], "sites": list(self._sites), "labels": list(self._labels)}

    def finish(self, late_meta: dict | None = None) -> Trace:
        """Close the writer; return the trace (memory-mapped from the file when streaming).

        ``late_meta``: metadata learnt only while recording (the device's memory at the end, a rank the program
        chose); it goes in the footer, and a loaded trace's metadata is the header's with it over them."""
        t = self.tables()
        self.meta.update(late_meta or {})
        if self._file:
            self._flush()
            self._file.close({**t, "summary": {"events": self._file.count, "allocs": self.next_id},
                              **({"meta": late_meta} if late_meta else {})})
            return Trace.load(self.path, validate=False)
        return Trace(self._buf[: self._n].copy(), self.meta, streams=t["streams"], sites=t["sites"],
                     labels=t["labels"])

    def abort(self) -> None:
        if self._file:
            self._flush()
            self._file.abort()
