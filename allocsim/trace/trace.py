"""`Trace`: an ordered list of allocation events with numpy column access.

A trace is one structured numpy array of `RECORD_DTYPE` records plus metadata
(producer, framework, device, allocator settings, command line) and three tables
the records index into: streams, call sites and mark labels.

Costs: `Trace.load` memory-maps the records (O(1) until touched) and validates
them in a few vectorised passes (O(n)); column access is a view; iteration builds
one small tuple per event and is meant for inspection, not for replay.
"""
from __future__ import annotations

from collections import namedtuple
from functools import cached_property

import numpy as np

from ..errors import InputError
from . import events as ev
from .events import RECORD_DTYPE
from .format import TraceFileWriter, read_trace_file, write_trace_atomic
from .schema import check_footer, check_meta

Event = namedtuple("Event", "index kind flags stream id site aux size time_ns addr")


class Trace:
    """An allocation trace. Build one with `TraceWriter`, read one with `Trace.load`."""

    def __init__(self, records: np.ndarray, meta: dict | None = None, *, streams=None, sites=None,
                 labels=None, finished: bool = True, path: str | None = None):
        self.records = records
        self.meta = dict(meta or {})
        self.streams = list(streams if streams is not None else [0])
        self.sites = list(sites or [])
        self.labels = list(labels or [])
        self.finished = finished
        self.path = path

    # ---- I/O -------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str, *, validate: bool = True, mmap: bool = True) -> "Trace":
        """Read a `.bin` trace; raise `InputError` (file, position, what) if it is malformed.

        The footer's tables are always checked (the trace is built from them); the
        metadata's fields and the events only with ``validate``.
        """
        meta, records, footer, finished = read_trace_file(path, mmap=mmap)
        check_footer(footer, path)
        if validate:
            check_meta(meta, path)
        t = cls(records, meta, streams=footer.get("streams"), sites=footer.get("sites"),
                labels=footer.get("labels"), finished=finished, path=path)
        if validate:
            t.validate()
        return t

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

    def _chunks(self):
        """``(start, records[start:start + CHUNK])`` over the whole trace: bounded temporaries."""
        for start in range(0, len(self), CHUNK):
            yield start, np.asarray(self.records[start:start + CHUNK])    # a plain view: no memmap overhead

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
    def n_allocs(self) -> int:
        return sum(int(np.count_nonzero(rec["kind"] == ev.ALLOC)) for _, rec in self._chunks())

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

        Walks the records a chunk at a time (`LiveBytes`): memory bounded by the live objects.
        """
        live, peak = LiveBytes(), 0
        for _, rec in self._chunks():
            peak = max(peak, int(live.curve(rec["kind"], rec["id"], rec["size"]).max()))
        return peak

    def marks(self) -> list[tuple[int, str]]:
        """``(event index, label)`` of every MARK."""
        idx = np.flatnonzero(self.kind == ev.MARK)
        aux = self.aux[idx]
        return [(int(i), self.labels[a] if a < len(self.labels) else f"mark {a}") for i, a in zip(idx, aux)]

    # ---- validation --------------------------------------------------------------------
    def validate(self) -> None:
        """Check the event stream; raise `InputError` at the first bad event.

        Two passes over the records, a chunk at a time. Each check keeps its own first
        defect, and they are reported in a fixed order (kind, stream, size, id range,
        double ALLOC, then per FREE kind unknown id and double free), so a trace with
        several defects reports the same one whatever the chunk size. Memory: a few
        per-id flags (one byte per object id each), no per-event arrays.
        """
        where = self.path or "<trace>"
        first = _FirstDefects()
        kinds = np.array(sorted(ev.KIND_NAMES), np.uint8)
        top, top_at = -1, 0             # the largest ALLOC id and its first event
        for start, rec in self._chunks():
            kind = rec["kind"]
            first.note("kind", start, ~np.isin(kind, kinds), lambda j: f"unknown event kind {int(kind[j])}")
            if self.finished:           # an unfinished trace lost its table; indices stand for themselves
                stream = rec["stream"]
                first.note("stream", start, stream >= len(self.streams),
                           lambda j: f"stream index {int(stream[j])} is beyond the footer's table of "
                                     f"{len(self.streams)} streams")
            a_idx = np.flatnonzero(kind == ev.ALLOC)
            size = rec["size"]
            first.note("size", start, (kind == ev.ALLOC) & (size > ev.MAX_SIZE),
                       lambda j: f"absurd allocation size {int(size[j])} bytes (> 1 PiB)")
            if len(a_idx):
                ids = rec["id"][a_idx]
                k = int(np.argmax(ids))
                if int(ids[k]) > top:
                    top, top_at = int(ids[k]), start + int(a_idx[k])
        if top >= ev.NO_ID:
            first.found.setdefault("id", (top_at, "ALLOC without an object id"))
        elif top >= len(self):          # dense ids: each needs its own ALLOC event
            first.found.setdefault("id", (top_at, f"object id {top} is out of range (ids are dense; the trace "
                                                  f"has {len(self)} events)"))
        first.raise_first(("kind", "stream", "size", "id"), where)
        n_ids = top + 1
        allocated = np.zeros(n_ids + 1, bool)
        freed = {k: np.zeros(n_ids + 1, bool) for k in (ev.FREE, ev.FREE_REQUESTED)}
        twice = None                    # (event, id) of the smallest id allocated twice, at its second ALLOC
        for start, rec in self._chunks():
            kind = rec["kind"]
            a_idx = np.flatnonzero(kind == ev.ALLOC)
            a_ids = rec["id"][a_idx].astype(np.int64)
            order = np.argsort(a_ids, kind="stable")
            a_sorted, a_at = a_ids[order], a_idx[order]     # this chunk's ALLOCs by id, and where each is
            for k, label in ((ev.FREE, "free"), (ev.FREE_REQUESTED, "free_requested")):
                f_idx = np.flatnonzero(kind == k)
                f_raw = rec["id"][f_idx]
                f_ids = np.minimum(f_raw.astype(np.int64), n_ids)
                known = allocated[f_ids]
                later = np.flatnonzero(~known)
                if len(a_ids) and len(later):   # allocated in this chunk, before the free?
                    pos = _find(a_sorted, f_ids[later])
                    known[later] = (a_sorted[pos] == f_ids[later]) & (a_at[pos] < f_idx[later])
                bad = np.zeros(len(kind), bool)
                bad[f_idx] = ~known | (f_ids >= n_ids)
                first.note(f"unknown {label}", start, bad,
                           lambda j: f"{label} of unknown id {int(rec['id'][j])} (never allocated before this event)")
                bad[:] = False
                bad[f_idx] = _repeats(f_ids, freed[k]) & (f_ids < n_ids)
                first.note(f"double {label}", start, bad, lambda j: f"double {label} of id {int(rec['id'][j])}")
            rep = np.flatnonzero(_repeats(a_ids, allocated))
            if len(rep):
                j = rep[np.argmin(a_ids[rep])]      # argmin: the first of the smallest id's repeats here
                if twice is None or a_ids[j] < twice[1]:
                    twice = (start + int(a_idx[j]), int(a_ids[j]))
        if twice is not None:
            first.found["twice"] = (twice[0], f"id {twice[1]} allocated twice")
        first.raise_first(("twice", "unknown free", "double free", "unknown free_requested",
                           "double free_requested"), where)


class _FirstDefects:
    """The first event each named check finds bad, over a walk in trace order."""

    def __init__(self):
        self.found: dict[str, tuple[int, str]] = {}

    def note(self, check: str, start: int, bad: np.ndarray, what) -> None:
        """Keep the first True of ``bad`` (a chunk starting at ``start``) if ``check`` has none yet."""
        if check not in self.found and bad.any():
            j = int(np.argmax(bad))
            self.found[check] = (start + j, what(j))

    def raise_first(self, checks, where: str) -> None:
        """Raise `InputError` for the first of ``checks`` (in that order) that found a defect."""
        for c in checks:
            if c in self.found:
                i, what = self.found[c]
                raise InputError(what, path=where, position=f"event {i}")


def _find(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Where each of ``ids`` is (or would go, clipped to the last) in the non-empty ``sorted_ids``.

    Dense ids allocated in order make ``sorted_ids`` a run of consecutive integers
    at its end: those are found by subtraction instead of a binary search.
    """
    n = len(sorted_ids)
    lo = int(np.searchsorted(sorted_ids, sorted_ids[-1] - (n - 1)))      # start of a consecutive tail?
    tail = n - lo
    if sorted_ids[-1] - sorted_ids[lo] != tail - 1:
        return np.minimum(np.searchsorted(sorted_ids, ids), n - 1)
    off = ids - sorted_ids[lo]
    in_tail = (off >= 0) & (off < tail)
    pos = np.where(in_tail, off + lo, 0)
    head = np.flatnonzero(~in_tail)
    if len(head):
        pos[head] = np.minimum(np.searchsorted(sorted_ids, ids[head]), n - 1)
    return pos


def _repeats(ids: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Which of ``ids`` (in order) were seen before: in ``seen`` or earlier in ``ids``; marks them all seen."""
    again = seen[ids]
    first = np.unique(ids, return_index=True)[1]
    later = np.ones(len(ids), bool)
    later[first] = False
    seen[ids] = True
    return again | later


#: Records read at a time by the chunked walks (`Trace.load_bytes`, the replay engine).
CHUNK = 1 << 16


class LiveBytes:
    """Live requested bytes along a trace read in order, chunk by chunk.

    Keeps the live objects' ids and sizes (sorted numpy arrays) between chunks, so
    its memory is bounded by the live state, not by the trace length. Each chunk
    costs a sort of the live objects plus the chunk's ALLOCs. A FREE of an id not
    live (an unvalidated trace) frees 0 bytes.
    """

    def __init__(self):
        self.ids = np.zeros(0, np.int64)
        self.sizes = np.zeros(0, np.int64)
        self.live = 0
        self.pos = 0        # records read by `at`

    def at(self, records: np.ndarray, index: int) -> int:
        """Live bytes after event ``index`` of ``records``, read from where the last call stopped.

        Calls must come with non-decreasing ``index``; each record is read once over them all,
        `CHUNK` at most at a time. (The replay asks only at OOMs.)
        """
        while self.pos <= index:
            rec = records[self.pos:min(self.pos + CHUNK, index + 1)]
            self.curve(rec["kind"], rec["id"], rec["size"])
            self.pos += len(rec)
        return self.live

    def curve(self, kind: np.ndarray, ids: np.ndarray, size: np.ndarray) -> np.ndarray:
        """Live bytes after each event of the next chunk (int64), the chunk's columns given."""
        a, f = kind == ev.ALLOC, kind == ev.FREE
        all_ids = np.concatenate([self.ids, ids[a].astype(np.int64)])
        all_sizes = np.concatenate([self.sizes, size[a].astype(np.int64)])
        order = np.argsort(all_ids, kind="stable")
        all_ids, all_sizes = all_ids[order], all_sizes[order]
        freed = ids[f].astype(np.int64)
        pos = _find(all_ids, freed) if len(all_ids) else np.zeros(len(freed), np.intp)
        known = all_ids[pos] == freed if len(all_ids) else np.zeros(len(freed), bool)
        delta = np.zeros(len(kind), np.int64)
        delta[a] = size[a]
        delta[f] = -np.where(known, all_sizes[pos] if len(all_ids) else 0, 0)
        out = np.cumsum(delta)
        out += self.live
        keep = np.ones(len(all_ids), bool)
        keep[pos[known]] = False
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
        self.next_id += 1
        self.record(ev.ALLOC, flags=flags, stream=stream, id_=i, site=self.site_index(site), size=size,
                    t=t, addr=addr)
        return i

    def free(self, id_: int, *, t=None, stream: int = 0, addr: int = 0, size: int = 0) -> None:
        self.record(ev.FREE, id_=id_, t=t, stream=stream, addr=addr, size=size)

    def free_requested(self, id_: int, *, t=None, stream: int = 0, addr: int = 0, size: int = 0) -> None:
        self.record(ev.FREE_REQUESTED, id_=id_, t=t, stream=stream, addr=addr, size=size)

    def segment(self, kind: int, addr: int, size: int, stream: int = 0, *, t=None) -> None:
        """SEGMENT_ALLOC / SEGMENT_FREE / SEGMENT_MAP / SEGMENT_UNMAP."""
        self.record(kind, addr=addr, size=size, stream=stream, t=t)

    def gc(self, full: bool, *, t=None) -> None:
        self.record(ev.GC, aux=int(bool(full)), t=t)

    def oom(self, size: int, *, device_free: int = 0, stream: int = 0, t=None) -> None:
        self.record(ev.OOM, size=size, addr=device_free, stream=stream, t=t)

    def mark(self, label: str = "", *, t=None) -> None:
        s = self._labels.get(label)
        if s is None:
            s = self._labels[label] = len(self._labels)
        self.record(ev.MARK, aux=s, t=t)

    # ---- output ----------------------------------------------------------------
    def _flush(self) -> None:
        self._file.write(self._buf[: self._n])
        self._n = 0

    def tables(self) -> dict:
        return {"streams": list(self._streams) or [0], "sites": list(self._sites), "labels": list(self._labels)}

    def finish(self) -> Trace:
        """Close the writer; return the trace (memory-mapped from the file when streaming)."""
        t = self.tables()
        if self._file:
            self._flush()
            self._file.close({**t, "summary": {"events": self._file.count, "allocs": self.next_id}})
            return Trace.load(self.path, validate=False)
        return Trace(self._buf[: self._n].copy(), self.meta, streams=t["streams"], sites=t["sites"],
                     labels=t["labels"])

    def abort(self) -> None:
        if self._file:
            self._flush()
            self._file.abort()
