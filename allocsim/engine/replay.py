"""`Replay`: one replay of a trace against a policy, run to the end or stepped and stopped.

A `Replay` makes the device, the runtime, the sections and the policy (through its
`PolicyContext`), then walks the trace's driving events in order, a chunk of records
at a time:

- ALLOC: ``policy.malloc``; the modeled latency is the clock before/after; peak
  allocated and reserved are tracked (with the free-space shape and the free breakdown,
  ``policy.free_breakdown``, at the reserved peak and at each OOM);
  None is an OOM, which stops the walk unless ``keep_going``; of an ALLOC flagged
  CATCHES_OOM (the program catches its failure: a cuDNN workspace try) it is a caught OOM,
  counted apart, and the walk goes on without it (its FREE is skipped; the request the
  program made next is not in the trace: none is assumed; docs/allocator-dependent.md), except
  a cuDNN plan search's, which asks again for half as much until one is granted (`_halve`);
  inside a TRY scope (code that catches an OOM and goes on: `allocsim.tries()`, inductor's
  autotuning) it is an OOM the program survives: counted with those, and the innermost try
  unwinds as the exception would (`_unwind_try`: the blocks allocated inside it since its
  BEGIN and still live are freed, every later ALLOC up to its END is skipped, and their FREEs);
- FREE: the handle goes to the runtime (``gc``) or the policy (``eager``); a FREE the
  recorded run made inside the next request (flag ``IN_REQUEST``: CuPy's ``gc.collect()``
  on its limit or OOM path) is held by the eager runtime and reaches the policy at the
  matching collection of that request's malloc, or after it (`Runtime.hold`);
- the private-pool events (`POOL`) go to ``policy.pool_event`` (docs/models/torch.md, "Private pools");
- the pressure events (`PRESSURE`): a recorded OOM is attempted again (a failure is
  an OOM marked ``recorded`` and the walk goes on, as the program did; a success is
  freed at once and listed in ``ooms_avoided``; an offline policy's plan leaves it out); CACHE_RELEASE calls
  ``policy.release_cache()``; SET_LIMIT sets the device's cap unless the caller gave one.

0-byte ALLOCs and their FREEs never reach the policy (every modeled allocator bypasses
its pool for them); they are counted. There is one walk: the optional features (a
policy's ``tick``, periodic GC, per-event indices for `validate`, a timeline, an
observer) are two hooks called around each event only when one of them is on.
When all of them are off and the runtime is eager, a policy that offers the optional
fused loop ``walk_chunk`` serves the chunk's common events itself (`_walk_fused`);
every event it hands back goes through the plain loop (docs/architecture.md, "The fast path").

Memory is bounded by the live state: the id -> handle table holds live ids only, the
lists are one chunk's, and latencies are one-byte codes (`LatencyLog`).
"""
from __future__ import annotations

import time
from array import array
from copy import copy
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from ..machine.capacity import trace_capacity
from ..machine.context import PolicyContext
from ..machine.costs import CostModel
from ..machine.device import RECORDED_END, SimulatedDevice
from ..errors import InputError, UsageError
from .fold import Folder, LatencyTape
from ..machine.metrics import LatencyLog, OOMRecord, ReplayResult, assemble_result, breakdown, largest_free_fragmentation
from ..machine.runtime import RUNTIMES
from .guard import guard_counters, guard_device_calls, guard_policy
from ..machine.sections import Sections
from ..policies.base import overrides_inlined
from .spec import PolicySpec, is_plugin, plugin_errors
from ..trace import ALLOC, FREE, SEGMENT_ALLOC, Trace
from ..trace.events import (CACHE_RELEASE, CATCHES_OOM, IN_REQUEST, OOM, POOL, POOL_RELEASE, PRESSURE, SET_LIMIT,
                            kind_table)
from ..trace.scopes import label_of, plan_search_set, scopes_of
from ..trace import trace as trace_records
from ..trace.trace import CHUNK, LiveBytes
from ..params import count_argument, kind_of
from ..units import parse_size

#: Root sections of the time the pressure events take (outside any ALLOC's latency).
S_RECORDED_OOM = "recorded OOM attempt"
S_CACHE_RELEASE = "cache release"
S_HALVED = "halved workspace retry"
#: The events the walk drives besides ALLOC and FREE: the pressure events and the private-pool events.
STEERING = PRESSURE + POOL
#: The same as a table by kind: `driving` looks each record's kind up in it (`np.isin` took a twelfth of a compiled walk)
_STEERS = kind_table(STEERING)
S_PERIODIC_GC = "gc(false) (periodic)"

#: The walk's kind for a FREE flagged IN_REQUEST: this plus its ``aux`` (which collection of the request made
#: it). Never in a trace; a fused loop hands it back as any kind it does not serve.
FREE_IN_REQUEST = 0x100


def recorded_segments(trace: Trace) -> list[tuple[int, int]]:
    """``(size, address)`` of the recorded allocator's segment allocations, in order (a small trace's kept for its
    next replays, as its chunks are: `kept_chunks`; the caller copies it)."""
    def make():
        out = []
        records, chunk = trace.records, trace_records.CHUNK
        kind_flags = trace.kind_flags                       # (kept with the trace)
        for start in range(0, len(kind_flags), chunk):      # (the kinds copied, contiguous: a quarter of the time)
            at = np.flatnonzero(kind_flags[start:start + chunk].astype(np.uint8) == SEGMENT_ALLOC)
            seg = np.asarray(records[start:start + chunk])[at]
            past = np.flatnonzero(seg["addr"] > RECORDED_END - seg["size"])      # sizes are at most 1 PiB
            if len(past):
                j = past[0]
                raise InputError(f"SEGMENT_ALLOC at {int(seg['addr'][j]):#x} of {int(seg['size'][j]):,} bytes ends "
                                 f"past 2**62, the highest address the model takes from a trace (a GPU's lie below "
                                 f"2**57)", path=trace.path, position=f"event {start + int(at[j])}")
            out += zip(seg["size"].tolist(), seg["addr"].tolist())
        return out
    if len(trace) > KEEP_RECORDS:
        return make()
    return kept_for(_KEPT, (id(trace), "segments"), trace, make, 8)


#: Pieces of a chunk a walk reads, each converted alone, before the whole chunk is (`_Chunk.columns`).
PIECES = 256


class _Chunk:
    """The driving events of one chunk of records, as lists (made when the walk first reads them: a chunk a
    fold passes over is never converted, and a walk that stops at each step, as a folding one does, converts
    only the steps it walks), and their trace indices."""

    def __init__(self, at, rec, local, times: bool, caught=None, flags=None):
        self.at = at                # trace index of each driving event (numpy int64)
        self._rec, self._local, self._times, self._flags = rec, local, times, flags
        self._pieces = 0                # pieces read so far without the lists
        self.caught = caught        # positions of the ALLOCs flagged CATCHES_OOM (a set), None when there are none

    def __getattr__(self, name):
        """``kind``, ``ids``, ``sizes``, ``streams``, ``times``: the columns as lists, made on first use."""
        if name not in _CHUNK_COLUMNS or "_rec" not in self.__dict__:
            raise AttributeError(name)
        self.kind, self.ids, self.sizes, self.streams = self._lists(0, len(self.at))
        self.times = self._rec["time_ns"][self._local].tolist() if self._times else None
        del self._rec, self._local, self._flags
        self.__dict__.pop("_cols", None)
        return getattr(self, name)

    def columns(self, lo: int, hi: int) -> tuple:
        """``kind``, ``ids``, ``sizes``, ``streams`` of events ``lo`` to ``hi``: slices of the lists where made,
        else those events' alone, up to `PIECES` pieces (each costs some microseconds whatever its length: a walk in
        tiny pieces), then the whole chunk's. A folding walk, which stops at each step and passes most of a chunk by
        a fold, converts only the steps it walks (the whole of a 44k-event chunk took 6.5 ms), and no event twice
        (until 2026-12-03 the whole chunk was converted once half of it had been in pieces: a walk that stopped at
        each boundary converted 1.5 chunks a chunk, 31 ms of GPT-2 small's 180 under `cupy`)."""
        if "_rec" in self.__dict__ and not self._times and self._pieces < PIECES and (lo or hi < len(self.at)):
            self._pieces += 1
            return self._lists(lo, hi)
        cols = (self.kind, self.ids, self.sizes, self.streams)
        return cols if not lo and hi >= len(self.at) else tuple(col[lo:hi] for col in cols)

    def item(self, name: str, j: int) -> int:
        """Column ``ids``, ``sizes`` or ``streams`` of event ``j``, without making the lists."""
        if "_rec" not in self.__dict__:
            return getattr(self, name)[j]
        return int(self._rec[_RECORD_COLUMN[name]][self._local[j]])

    def _lists(self, lo: int, hi: int) -> tuple:
        cols = self.__dict__.get("_cols")
        if cols is None:
            cols = self._cols = self._gathered()
        return tuple(col[lo:hi].tolist() for col in cols)

    def _gathered(self) -> tuple:
        """The chunk's four columns as compact numpy arrays, gathered once (a piece is then a slice of each; the
        lists cost the most, each piece's own)."""
        rec, local, flags = self._rec, self._local, self._flags
        kind = rec["kind"][local]
        if flags is not None:       # the chunk flags something: a FREE made inside a request is held for it
            inside = (kind == FREE) & (flags & IN_REQUEST != 0)
            if inside.any():
                kind = kind.astype(np.int64)
                kind[inside] = FREE_IN_REQUEST + rec["aux"][local][inside]
        return (kind, *(rec[col][local] for col in ("id", "size", "stream")))


_RECORD_COLUMN = {"ids": "id", "sizes": "size", "streams": "stream"}
_CHUNK_COLUMNS = ("kind", "ids", "sizes", "streams", "times")


def driving(trace: Trace, zero_counts: list | None = None, skip: list | None = None):
    """Yield ``(start, records, local)`` per chunk of records: ``local`` are the positions of the
    events the walk drives (ALLOC, FREE, `PRESSURE`), 0-byte ALLOCs and their FREEs left out.

    The ids of live 0-byte objects are the only state carried between chunks; ``zero_counts``
    collects ``(trace index, is ALLOC)`` arrays of the bypassed events, to be counted. ``skip``, a
    one-item list a caller may set as it goes: the records before the trace index it holds are passed
    over unread while no 0-byte object is live (a fold, which vouches that they make none): the chunks
    that end by it, and the part before it of the chunk it lies in. A fold that lands mid-chunk walks a
    few steps before the next: the records from there are read in pieces of `LANDING` records, doubled
    piece after piece to the chunk's end, not the chunk's whole rest (half a chunk read at each landing
    was a twentieth of a folded replay of a small GPT) -- where the rest allocates no 0-byte object (then
    no 0-byte object is live in it, and pieces drive what the whole rest drives; else it is read whole,
    as a walk that never folds reads it: a trace that frees a 0-byte object twice is read alike).
    """
    zero_live = np.zeros(0, np.int64)       # ids of live 0-byte objects, sorted
    for first, whole in trace.chunks():
        lo, n, piece = 0, len(whole), 0     # piece: the next piece's length after a landing (0: the rest)
        while lo < n:
            if skip is not None and first + lo < skip[0] and not len(zero_live):
                if first + n <= skip[0]:
                    break
                lo = skip[0] - first
                rest = whole[lo:]
                piece = 0 if ((rest["kind"] == ALLOC) & (rest["size"] == 0)).any() else LANDING
            hi = min(n, lo + piece) if piece else n
            rec, start, lo, piece = whole[lo:hi], first + lo, hi, 2 * piece
            local, zero_live = _driving_local(rec, zero_live, start, zero_counts)
            if len(local):
                yield start, rec, local


#: The first piece read where a fold lands mid-chunk (`driving`).
LANDING = 1 << 12


def _driving_local(rec, zero_live: np.ndarray, start: int, zero_counts: list | None) -> tuple:
    """``(local, zero_live)`` for one piece of records from trace index ``start`` (`driving`): the positions of
    its driving events, and the live 0-byte ids after it."""
    kind = rec["kind"]
    is_alloc = kind == ALLOC
    is_free = kind == FREE
    zero = is_alloc & (rec["size"] == 0)
    if zero.any() or len(zero_live):
        ids = rec["id"].astype(np.int64)
        zero_live = np.union1d(zero_live, ids[zero])
        zero_free = is_free & np.isin(ids, zero_live)
        zero_live = np.setdiff1d(zero_live, ids[zero_free])
        skipped = np.flatnonzero(zero | zero_free)
        if len(skipped) and zero_counts is not None:
            zero_counts.append((skipped + start, zero[skipped]))
        is_alloc = is_alloc & ~zero
        is_free = is_free & ~zero_free
    return np.flatnonzero(is_alloc | is_free | (_STEERS.take(kind) & ((kind != OOM) | (rec["size"] > 0)))), zero_live


class _AllocBytes:
    """Requested bytes of every ALLOC through a trace index, read forward as `LiveBytes` reads."""

    def __init__(self):
        self.total = 0                  # through the last chunk read
        self.pos = 0
        self._read = np.zeros(0, np.int64)      # the running total after each record of that chunk
        self._read_at = 0
        self.last = 0                           # records read by the last read (`trace_records.ahead`)

    def at(self, records: np.ndarray, index: int) -> int:
        """The bytes through event ``index`` (non-decreasing over the calls), read a piece at a time as
        `LiveBytes.at` reads."""
        while self.pos <= index:
            self.last = trace_records.ahead(self.pos, index, self.last)
            rec = np.asarray(records[self.pos:self.pos + self.last])
            sizes = np.where(rec["kind"] == ALLOC, rec["size"], 0).astype(np.int64)
            self._read, self._read_at = np.cumsum(sizes) + self.total, self.pos
            self.total = int(self._read[-1])
            self.pos += len(rec)
        return int(self._read[index - self._read_at])


#: A trace of at most this many records keeps its walk's chunks, lists made, for its next replays in this process
#: (`kept_chunks`): `tune` and `fit` replay one trace hundreds of times, most replays stopped early, and making
#: the chunks' lists was a fifth of such a replay. About 100 bytes an event, kept for the last few traces only.
KEEP_RECORDS = 2 * CHUNK
_KEPT: dict = {}


def kept_chunks(trace: Trace, times: bool) -> tuple[list, list] | None:
    """``(chunks, zero_counts)`` of a replay of ``trace`` (`Replay._driving_chunks`, with or without ``times``),
    made by the first replay and shared by the next (read only: a chunk's lists are made once); None for a
    trace of more than `KEEP_RECORDS` records, whose replays make their own a chunk at a time."""
    if len(trace) > KEEP_RECORDS:
        return None
    def make():
        zero_counts: list = []
        return list(chunks_of(trace, times, zero_counts)), zero_counts
    # the chunk size as `Trace.chunks` reads it now
    return kept_for(_KEPT, (id(trace), times, trace_records.CHUNK), trace, make, 8)


_LIVE: dict = {}


def live_through(trace: Trace, walker: LiveBytes, at: int) -> int:
    """``walker.at(trace.records, at)``: the live requested bytes after event ``at``. A fresh walker's first read
    of a trace of at most `KEEP_RECORDS` records is kept for the next walker to read there (`tune` replays
    hundreds of settings that run out at a few of the same events, each read the trace from its start); the
    walker is left as its own read would have left it, a trace freeing an object twice included (a read
    replaces the walker's arrays, never changes them: they are shared safely)."""
    if walker.pos or len(trace) > KEEP_RECORDS:
        return walker.at(trace.records, at)
    key = (id(trace), at, trace_records.CHUNK)
    kept = _LIVE.get(key)
    if kept is not None and kept[0] is trace:
        vars(walker).update(vars(kept[1]))
        return kept[2]
    live = walker.at(trace.records, at)
    if len(_LIVE) >= 1024:
        _LIVE.clear()
    _LIVE[key] = (trace, copy(walker), live)
    return live


def kept_for(cache: dict, key, trace: Trace, make, most: int):
    """``make()``, a value derived from ``trace``, kept in ``cache`` under ``key`` (with the trace, so that its id
    is not reused meanwhile) for the trace's next replays; ``cache`` is emptied once it holds ``most``."""
    kept = cache.get(key)
    if kept is not None and kept[0] is trace:
        return kept[1]
    value = make()
    if len(cache) >= most:
        cache.clear()
    cache[key] = (trace, value)
    return value


def chunks_of(trace: Trace, times: bool, zero_counts: list, skip: list | None = None):
    """A `_Chunk` per chunk of records of ``trace`` that holds driving events (`driving`; ``zero_counts`` and
    ``skip`` its)."""
    for start, rec, local in driving(trace, zero_counts, skip):
        flags = rec["flags"][local]
        if not flags.any():         # most traces flag nothing: no caught requests, no held frees
            yield _Chunk(local + start, rec, local, times)
            continue
        caught = np.flatnonzero((flags & CATCHES_OOM != 0) & (rec["kind"][local] == ALLOC))
        yield _Chunk(local + start, rec, local, times, set(caught.tolist()) if len(caught) else None, flags)


def driving_count(trace: Trace) -> int:
    """How many events the walk drives (what a timeline is sampled against)."""
    return sum(len(local) for *_, local in driving(trace))


@dataclass(frozen=True)
class ReplaySettings:
    """How one replay runs, apart from its trace and policy: one frozen value that the commands build once
    from their arguments (`allocsim.commands._common.replay_settings`) and hand on as it is, through a sweep's
    cells, `replay` and `Replay`. `with_` gives a copy with some fields changed (a sweep's cell sets cap,
    runtime and capacity).

    ``runtime``: ``"eager"`` or ``"gc"`` (`allocsim.machine.runtime`); ``cap``: the pool cap in bytes, which overrides
    the limits the program set (SET_LIMIT); ``capacity``: the device memory, ``"trace"`` for the recorded
    device's (else unlimited), None for unlimited; ``costs``: the `CostModel` (None: the defaults);
    ``gc_every``: an incremental collection every so many allocated bytes; ``keep_going``: count OOMs and go
    on; ``timeline``: sample allocated/reserved for plots; ``backend``: ``"sim"`` or ``"cuda"`` (a simulated
    policy's device calls made real); ``fast_path``: False walks every event through ``malloc``/``free`` even
    for a policy with a fused loop (the tests compare the two); ``fold``: False walks every periodic run in
    full (`allocsim.engine.fold`; True skips the repeats, with the same result bit for bit)."""

    runtime: str = "eager"
    cap: int | None = None
    capacity: int | str | None = "trace"
    costs: CostModel | None = None
    gc_every: int | None = None
    keep_going: bool = False
    timeline: bool = False
    backend: str = "sim"
    fast_path: bool = True
    fold: bool = True

    def __post_init__(self):
        """Refuse what no replay can mean: a cap, a capacity or ``gc_every`` is a size in bytes, positive (a cap
        may be 0), an integer or text `allocsim.units.parse_size` reads (``"8GB"``). A Python caller's
        ``cap=-1`` replayed with one OOM, ``cap=float("nan")`` with no cap, ``cap="8GB"`` failed deep inside."""
        for name in ("cap", "gc_every", "capacity"):
            value = getattr(self, name)
            if value is not None and not (name == "capacity" and value == "trace"):
                object.__setattr__(self, name, _size_setting(name, value))   # ("none": None, as on the command line)
        for name in ("runtime", "backend"):         # (a list was an unhashable type deep inside)
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"replay setting {name}: a name (text), not {getattr(self, name)!r}")
        for name in ("keep_going", "timeline", "fast_path", "fold"):     # (keep_going="no" was true)
            value = getattr(self, name)
            if kind_of(value) != "b":
                raise TypeError(f"replay setting {name}: True or False, not {value!r}")
            object.__setattr__(self, name, bool(value))
        if self.costs is not None and not isinstance(self.costs, CostModel):
            raise TypeError(f"replay setting costs: a CostModel (allocsim.CostModel.load(path) reads one), not "
                            f"{self.costs!r}")

    def with_(self, **changes) -> ReplaySettings:
        return replace(self, **changes) if changes else self


def _size_setting(name: str, value) -> int | None:
    """A replay setting in bytes (`ReplaySettings`): an integer (numpy's too) up to 2**62, or its text; the text
    ``none`` (``off``, ``unlimited``) is None, no limit, as the command line reads it."""
    if isinstance(value, str):
        value = parse_size(value, what=name, allow_none=True)
        if value is None:
            return None
    if kind_of(value) not in ("i", "u"):
        raise TypeError(f"replay setting {name}: a size in bytes (an integer, or text such as '8GB'), not {value!r}")
    least = 0 if name == "cap" else 1      # (a cap of 0 bytes refuses every request: `fit`'s intervals reach it)
    if not least <= int(value) <= 2**62:
        raise ValueError(f"replay setting {name}: {int(value)} bytes (a size is {least} to 2**62 bytes)")
    return int(value)


def settings_of(settings: ReplaySettings | None, changes: dict) -> ReplaySettings:
    """``settings`` (default: `ReplaySettings()`) with ``changes``, the keyword arguments `replay` and `Replay`
    take for its fields; a name that is no field is a TypeError, as an unknown keyword argument is."""
    if settings is not None and not isinstance(settings, ReplaySettings):      # (a dict failed deep inside)
        raise TypeError(f"settings: a ReplaySettings (its fields may also be given as keyword arguments), not "
                        f"{type(settings).__name__}")
    unknown = set(changes) - set(ReplaySettings.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown replay setting(s): {', '.join(sorted(unknown))} "
                        f"(known: {', '.join(ReplaySettings.__dataclass_fields__)})")
    return (settings or ReplaySettings()).with_(**changes)


class _Walk:
    """What the walk keeps: peaks, counts, OOMs, latencies, where it is."""

    def __init__(self):
        self.peak_alloc = self.peak_res = 0
        self.frag_at_peak = 0.0
        self.at_peak = None            # the free breakdown where reserved reached its peak (`Replay._free_state`)
        self.failed: dict = {}         # id -> size of the objects whose ALLOC failed (--keep-going), till their FREE
        self.failed_live = self.failed_cum = 0      # their bytes: still live in the trace / ever
        #: requests granted smaller than the trace holds them (a plan search's halved workspace, `Replay._halve`):
        #: (object, ALLOC event, event its block goes (its FREE, an unwound try) or None, bytes the trace holds
        #: beyond the block); a tuple, replaced, never changed
        self.shrunk: tuple = ()
        self.skipped_frees = 0         # FREEs of objects whose ALLOC failed under --keep-going
        #: a try unwound (`Replay._unwind_try`): the ALLOCs before this trace index are skipped; None: none
        self.skip_until = None
        self.skipped_allocs = 0        # ALLOCs skipped so (their FREEs are skipped FREEs)
        self.unwound = 0               # blocks an unwound try freed (their FREEs are skipped FREEs)
        self.n_pressure = 0
        self.ooms: list[OOMRecord] = []
        self.caught: list[OOMRecord] = []       # failed requests the program survives (CATCHES_OOM, a TRY scope)
        #: recorded failed requests served: (event, reserved while held, the device's limit then or None)
        self.served: list[tuple[int, int, int | None]] = []
        self.done = 0                  # driving events walked
        self.stopped = False           # an OOM stopped the walk
        self.latency = LatencyLog()
        self.since_gc = 0
        self.timeline = (array("q"), array("q"), array("q"))

    # ---- the state as a contract (docs/architecture.md, "Folding": who declares what) -----------------------
    def copy(self) -> "_Walk":
        """An equal walk that shares nothing a walk changes (a checkpoint; a resume copies it again). O(OOMs +
        latency chunks)."""
        w = copy(self)
        w.failed, w.ooms, w.caught, w.served = dict(self.failed), self.ooms[:], self.caught[:], self.served[:]
        w.latency = self.latency.copy()
        return w

    def fingerprint(self):
        """What steers the rest of a replay from the walk: ``--gc-every``'s running count; None where a fold cannot
        start (a failed object still live, a stopped walk, a try being unwound). Once per iteration boundary."""
        if self.failed or self.stopped or self.skip_until is not None:
            return None
        return self.since_gc

    def counts(self) -> "WalkCounts":
        """The walk's counts now: a snapshot a fold compares and repeats (`advance`). Twice per fold."""
        return WalkCounts(self.done, self.n_pressure, (self.skipped_frees, len(self.ooms), len(self.served),
                                                       self.peak_alloc, self.peak_res, len(self.caught),
                                                       self.skipped_allocs, self.unwound))

    def advance(self, before: "WalkCounts", after: "WalkCounts", k: int) -> None:
        """A fold skipped ``k`` more windows like the one walked between ``before`` and ``after`` (whose
        ``settled`` counts are equal): add their pressure events (the events walked are the replay's to move)."""
        self.n_pressure += k * (after.n_pressure - before.n_pressure)


class WalkCounts(NamedTuple):
    """The walk's counts a fold reads (`_Walk.counts`): the driving events walked, the pressure events (a period
    adds to both), and ``settled``, those a window that folds leaves as it found them (skipped FREEs, OOMs, recorded
    OOMs served, the peaks, caught OOMs, skipped ALLOCs, blocks unwound)."""

    done: int
    n_pressure: int
    settled: tuple


@dataclass(frozen=True)
class ReplayState:
    """A `Replay.checkpoint`: each piece's own copy (the policy's `allocsim.policies.base.Policy.checkpoint`, the
    device's `allocsim.machine.device.DeviceState`, the runtime's `allocsim.machine.runtime.RuntimeState`, the
    walk's `_Walk.copy`, the sections' `allocsim.machine.sections.SectionsState`) and where the walk is in the
    trace: the readers of live and requested bytes, the 0-byte requests bypassed, the chunks passed unread, the
    chunks still to walk, the chunk walked, the position in it and the driving events before it; and, where the
    state at the reserved peak is deferred to a second walk (`Replay.defer_peak_state`), how that walk goes the way
    this one went (`Replay._peak_walk`: the policy, settings, and a state to resume from, of the replay that reached
    the peak; ``()`` otherwise)."""

    policy: object
    device: object
    runtime: object
    walk: _Walk
    sections: object
    live: LiveBytes
    allocs: _AllocBytes
    zero_counts: list
    skip: list
    chunks: object
    chunk: object
    pos: int
    j0: int
    source: tuple = ()


@dataclass(frozen=True)
class _PeakLater:
    """The reserved peak was first reached after trace event ``at``; its free state is taken later
    (`Replay.defer_peak_state`)."""

    at: int


class Replay:
    """One replay of ``trace`` (a `Trace`, or its file's name as `replay` takes it) against ``policy``: `run` it, or
    `step` it and read its state. A trace is replayed as it is: `Trace.load` checks a file's, a trace built in
    memory (`TraceWriter`, ``Trace(records)``) is checked by its `Trace.validate` (a double free replays as given).

    ``policy`` is what `PolicySpec.of` takes (``"torch[expandable_segments:True]"``,
    ``"my.py:MyPool"``, a spec or a `Policy` subclass); ``options`` adds ``key=value`` texts or a
    dict. ``settings`` (a `ReplaySettings`; its fields may also be given as keyword arguments, which
    change them) says how it runs. The rest watch or steer one replay:
    ``observer(event_index, kind, id, handle)`` is called after each driving event (it slows the
    walk); ``progress(done)`` after each chunk; ``plan_progress(done, total)`` follows an offline
    policy's plan, made here. ``log_events`` gives a policy with ``wants_event_index`` the trace
    index of each ALLOC (`validate`). ``device`` replaces the simulated device. ``guard`` checks the cheap
    contract rules as the replay goes (`allocsim.engine.guard`); None: where a plug-in places the blocks (its own
    ``malloc``, ``free``, ``block`` or fused loop; not on a real GPU, whose blocks its real allocator places).

    ``policy`` is public, for reading: the policy instance, whose members `allocsim.policies.base.Policy`
    declares (`validate` reads ``seeded``, the snapshot export ``layout``, `tune` ``gc_on()``); only the
    walk calls it.
    """

    def __init__(self, trace: Trace | str, policy="split", settings: ReplaySettings | None = None, *, options=None,
                 device=None, observer=None, progress=None, log_events: bool = False, plan_progress=None,
                 guard: bool | None = None, **changes):
        self.settings = s = settings_of(settings, changes)
        self.trace = trace = load_trace(trace)[0]
        self.spec = spec = PolicySpec.of(policy, options)
        cls = spec.policy_class()
        if s.runtime not in RUNTIMES:
            raise UsageError(f"unknown runtime {s.runtime!r} (known: {', '.join(RUNTIMES)})")
        self.sections = Sections()
        if device is not None and not isinstance(device, SimulatedDevice):
            raise TypeError(f"device: a device that make_device made (a SimulatedDevice), not {device!r}")
        self.device = device if device is not None else make_device(trace, cls, s)
        self.runtime = RUNTIMES[s.runtime](self.device, self.sections, gc_every=s.gc_every)
        self.context = PolicyContext(self.device, self.runtime, self.sections, trace)
        if guard is None:           # a built-in's allocation code is the suite's to check; a real allocator's, its own
            guard = not cls.real_gpu and (any(f is not None and is_plugin(f) for f in
                                              (cls.malloc, cls.free, cls.block, cls.walk_chunk))
                                          or is_plugin(cls) and overrides_inlined(cls))   # (a helper of a built-in's)
        if guard:
            taken = guard_device_calls(self.context, self.device, spec.name)
        with plugin_errors(cls, spec.name, "being set up"):
            self.policy = cls(self.context, spec.values(), **({"progress": plan_progress} if cls.offline else {}))
        if guard:
            guard_policy(self.policy, self.device, taken, spec.name)
        if is_plugin(cls.counters):
            guard_counters(self.policy, spec.name)
        self.handles: dict = {}        # id -> handle, live objects only
        self.runtime.attach(self.policy, self.handles)
        self.keep_going, self.timeline, self.observer, self.progress = s.keep_going, s.timeline, observer, progress
        self._recorded_limits = s.cap is None
        self._log_index = (log_events or self.policy.follows_recording) and self.policy.wants_event_index
        self._w = _Walk()
        self._peak_deferred = False     # `defer_peak_state`
        self._peak_only_at = None       # a second walk's one peak event whose state it takes (`_take_peak_state`)
        self._resumed = None            # (the `ReplayState`, own_limit) this replay resumed from (`resume`)
        self._peak_seconds = 0.0        # spent taking peak states (`_afford_peak_state`)
        self._made_at = time.perf_counter()
        self._remade = device is None and observer is None and not guard and not log_events    # made again alike
        self._live = LiveBytes()       # live requested bytes, read up to each OOM
        self._allocs = _AllocBytes()   # requested bytes so far, read up to each OOM (gc: `_trace_bytes`)
        self._zero_counts: list = []
        self._skip = [0]                # records before this trace index are passed unread (`move_to`)
        self._chunks = self._driving_chunks()
        self._chunk, self._pos, self._j0 = None, 0, 0     # the chunk walked, the position in it, events before it
        self._before, self._after = self._before_hook(), self._after_hook()
        fused = self.policy.fused_loop() if s.fast_path and not guard else None   # a guarded walk: plain
        self._fused = fused if self._before is None and self._after is None and self.runtime.eager else None
        self._fused_tape = self._fused is not None and self.policy.fused_tape()    # it records a folded window
        self._unwind = None             # (BEGIN, failed request, END) trace indices of the try to unwind next
        self._retry = None              # (chunk, position, size, stream) of a plan search's workspace to halve next
        self._result = None
        self._closed = False
        self._fold_until = None         # the trace index the walk is to reach (None: the end; -1: no folding)
        self._last_at = -1              # the trace index of the last event walked
        made = time.perf_counter(), time.thread_time()     # (`fold.Budget`'s two clocks)
        self._folder = Folder(self) if s.fold and Folder.possible(self, device is not None, guard) else None
        if self._folder is not None:        # reading the steps is folding's cost (`fold.Budget`)
            self._folder.budget.charge_since(made)

    # ---- running -----------------------------------------------------------------------------
    def run(self, until: int | None = None) -> ReplayResult | None:
        """Walk to the end (or to trace index ``until``: the events before it); at the end, finish and
        return the `ReplayResult` (None while stopped short of it). ``until`` past the end walks to the end; one
        that is not a trace index (text, a float, a negative number) is refused."""
        self._still_open("run")
        if until is not None:
            until = count_argument("Replay.run: until", until, 0)
        self._fold_until = until
        self._walk(lambda c: len(c.at) if until is None else int(np.searchsorted(c.at, until)))
        return self.finish() if self.at_end else None

    def step(self, n: int = 1) -> int:
        """Walk the next ``n`` driving events (fewer at the end, or at an OOM that stops); return how many."""
        self._still_open("step")
        n = count_argument("Replay.step: n", n, 0)
        start = self._w.done
        self._fold_until = -1
        self._walk(lambda c: min(len(c.at), self._pos + start + n - self._w.done))
        if self._folder is not None and self._w.done > start:
            self._folder.passed(self._last_at)      # (it did not look at the MARKs passed, a chunk's end included)
        return self._w.done - start

    # ---- checkpoints ---------------------------------------------------------------------------
    def can_checkpoint(self) -> bool:
        """Whether `checkpoint` can copy this replay: a replay made of its trace, policy and settings alone
        (`defer_peak_state`'s), of a trace whose chunks are kept (`kept_chunks`), not at its end, whose runtime
        and policy copy their own state (`allocsim.machine.runtime.Runtime.can_checkpoint`: eager with no free
        held; `allocsim.policies.base.Policy.can_checkpoint`: a class that declares ``checkpoint``/``restore``)."""
        return (self._remade and self.runtime.can_checkpoint() and not self.timeline
                and self._before is None and self._after is None and self._chunks_kept
                and self.policy.can_checkpoint() and not self.at_end)

    def checkpoint(self) -> ReplayState:
        """The replay's state between two events, copied (policy, device, runtime, walk, sections, where it is in
        the trace): `resume` starts another replay of the same trace and settings from it, as if that one had
        walked here (`allocsim.search.tune` resumes settings that behave alike up to here; `can_checkpoint` says
        when). O(blocks + regions), not O(events walked)."""
        if not self.can_checkpoint():
            raise ValueError("this replay cannot be checkpointed (Replay.can_checkpoint)")
        if self._folder is not None:
            self._folder.abort()        # a window recorded up to here: its clock goes back to a plain float first
        return ReplayState(self.policy.checkpoint(self.handles), self.device.checkpoint(), self.runtime.checkpoint(),
                           self._w.copy(), self.sections.checkpoint(), copy(self._live), copy(self._allocs),
                           self._zero_counts[:], self._skip[:], copy(self._chunks), self._chunk, self._pos, self._j0,
                           self._peak_walk() if isinstance(self._w.at_peak, _PeakLater) else ())

    def resume(self, state: ReplayState, *, own_limit: bool = False) -> None:
        """Go on from ``state`` (a `checkpoint` of a replay of the same trace and settings whose policy is the
        same class of allocator, its options maybe not) instead of from the first event: the policy keeps its
        options and takes the state; this replay must not have walked yet. It is not folded from here.
        ``own_limit``: the checkpoint is of a replay under another constant cap that went as this one would up to
        there (`allocsim.search.fit`'s probes): the device keeps its own cap and limit, and the recorded failed requests
        served so far name this limit."""
        if self._w.done or not self.can_checkpoint():
            raise ValueError("resume: a fresh replay that can be checkpointed")
        cap = self.device.cap
        self.device.restore(state.device)
        w = state.walk.copy()
        if own_limit:
            self.device.set_cap(cap)
            limit = self.device.limit if self.device.limit < 2**63 else None
            w.served = [(at, r, limit) for at, r, _ in w.served]
        self.sections.restore(state.sections)
        handles = self.policy.restore(state.policy)
        self.handles.clear()
        self.handles.update(handles)
        self._w = w
        self._live, self._allocs = copy(state.live), copy(state.allocs)
        self._zero_counts[:], self._skip[:] = state.zero_counts, state.skip
        self._chunks, self._chunk, self._pos, self._j0 = copy(state.chunks), state.chunk, state.pos, state.j0
        self.runtime.restore(state.runtime)
        self._folder = None
        self._resumed = (state, own_limit)

    @property
    def at_end(self) -> bool:
        """True once every driving event is walked, or an OOM stopped the walk."""
        return self._chunks is None or self._w.stopped

    def _walk(self, end_of) -> None:
        """Walk chunk after chunk, each up to position ``end_of(chunk)``; stop where that falls short of
        the chunk's end (the target is reached), at an OOM that stops, or at the end of the trace."""
        w, folder = self._w, self._folder
        if folder is not None:
            if not folder.active or (self._fold_until == -1 and folder.recorder is None):
                folder = None           # gave up; or `step`, which never folds: no look at each boundary
            else:
                folder.budget.pause()
        while not w.stopped and self._chunks is not None:
            c = self._chunk
            if c is None or self._pos >= len(c.at):
                since = folder.budget.now() if folder is not None else None
                c = self._chunk = next(self._chunks, None)
                if folder is not None:      # reading a chunk is the walk's own work, as `--no-fold` does it
                    folder.budget.walked_since(since, 0)
                self._pos = 0
                if c is None:
                    self._chunks = None
                    if self.runtime.held:       # the trace ends inside a request: its frees still go
                        self.runtime.end_request()
                    return
                if self.policy.renumber is not None:
                    self._renumber()
            if folder is not None:
                moved = folder.at(c, self._pos, self._fold_until)
                if not folder.active:
                    folder = None           # it gave up: no more stops at boundaries
                if moved:
                    if self.progress is not None:
                        self.progress(w.done)
                    continue                # folded: the walk moved on
            target = hi = end_of(c)
            if folder is not None:
                hi = min(hi, folder.stop(c, self._pos))
            if hi > self._pos:
                recorder = None if folder is None else folder.recorder
                recording = recorder is not None
                lat = LatencyTape() if recording else array("d")
                tape = recorder.clock_tape if recording and self._fused_tape else None
                since, pos = folder.budget.now() if folder is not None else None, self._pos
                self._pos = self._walk_chunk(c, pos, hi, lat, fused=not recording or tape is not None, tape=tape)
                if self._pos > pos:
                    self._last_at = int(c.at[self._pos - 1])      # (a step's last event: `Folder.passed`)
                if recording and not recorder.take_latencies(lat):
                    folder.abort()
                w.latency.extend(lat)
                if folder is not None and (not recording or tape is not None):  # the walk's own time, for the
                    folder.budget.walked_since(since, self._pos - pos)     # the folder's account (`fold.Budget`)
                w.done = self._j0 + self._pos
                if self._pos >= len(c.at):
                    self._j0 += len(c.at)
                if self.progress is not None:
                    self.progress(w.done)
            if target < len(c.at) and self._pos >= target:
                return

    def move_to(self, at: int, passed: int | None = None) -> int:
        """Move the walk to trace index ``at`` as if every driving event before it was walked (a fold; the
        folder has set the state); return how many driving events that passed. Given ``passed`` (how many
        lie between), the folder vouches that no 0-byte ALLOC lies between: the records before ``at`` not read
        yet are passed unread (the chunks wholly before it, and the part before it of the chunk it lies in)."""
        w = self._w
        start = w.done
        c = self._chunk
        if passed is not None:
            self._skip[0] = at
        while int(c.at[-1]) < at:
            self._j0 += len(c.at)
            c = self._chunk = next(self._chunks, None)
            if c is None:
                self._chunks = None
                self._pos = 0
                w.done = self._j0 = self._j0 if passed is None else start + passed
                return w.done - start
            if self.policy.renumber is not None:
                self._renumber()
        self._pos = int(np.searchsorted(c.at, at))
        if passed is not None:      # the chunks passed unread: the count is the folder's
            self._j0 = start + passed - self._pos
        w.done = self._j0 + self._pos
        return w.done - start

    @property
    def folded(self) -> dict | None:
        """How much of the walk was folded (`allocsim.engine.fold.Folder.summary`), None if none."""
        return None if self._folder is None else self._folder.summary()

    def _renumber(self) -> None:
        """Between chunks: let the policy rename its handles (`Policy.renumber`) and apply the renaming to the
        engine's id -> handle table, the one the runtime reads too."""
        handles = self.handles
        new = self.policy.renumber(handles.values())
        if new:
            for i, h in handles.items():
                handles[i] = new[h]

    def _driving_chunks(self):
        """A `_Chunk` (Python lists, made when first read) per chunk of records that holds driving events; those
        of a small trace are kept for its next replays (`kept_chunks`)."""
        times = self.policy.tick is not None
        kept = kept_chunks(self.trace, times)
        self._chunks_kept = kept is not None     # an iterator over a list, copied by a checkpoint
        if kept is not None:
            chunks, self._zero_counts[:] = kept
            return iter(chunks)
        return chunks_of(self.trace, times, self._zero_counts, self._skip)

    def _walk_chunk(self, c, lo, hi, lat, fused: bool = True, tape=None) -> int:
        """Drive events ``lo`` to ``hi`` of chunk ``c``, each ALLOC's latency appended to ``lat``; return
        where the walk got to (past an OOM that stops). A survived OOM inside a try, or of a cuDNN plan search,
        stops the fused or plain walk for a moment (as an OOM that stops it does): the try is unwound here and the
        walk goes on, through the ALLOCs it skips (`_walk_skipping`), or the search asks again (`_halve`).
        ``fused`` False walks plainly even where the policy has a fused loop: a window the folder records
        (`allocsim.engine.fold.Recorder`) goes through ``malloc``, ``free`` and the device's Python additions to
        the clock, which a compiled fused loop would make on a C double the recorder cannot see -- unless the loop
        records onto the clock's ``tape`` itself (`Policy.fused_tape`)."""
        w = self._w
        while True:
            if w.skip_until is not None:
                lo = self._walk_skipping(c, lo, hi, lat)
                if lo >= hi:
                    return lo
            if fused and self._fused is not None:
                lo = self._walk_fused(c, lo, hi, lat, tape)
            else:
                lo = self._walk_plain(c, lo, hi, lat.append)
            if self._unwind is None and self._retry is None:
                return lo
            w.stopped = False
            if self._retry is not None:
                self._halve()
            else:
                self._unwind_try()
            if lo >= hi:
                return lo

    def _unwind_try(self) -> None:
        """The request at ``_unwind``'s failed index failed inside the try it names: the exception releases the
        blocks allocated inside the try since its BEGIN that are still live (freed now, the last allocated first;
        their FREEs skipped), and the ALLOCs after it up to the try's END are skipped (`_walk_skipping`)."""
        (begin, at, end), self._unwind = self._unwind, None
        w, rt, handles, free = self._w, self.runtime, self.handles, self.policy.free
        rec = np.asarray(self.trace.records[begin + 1:at])
        made = rec[rec["kind"] == ALLOC]
        for i, size in zip(reversed(made["id"].tolist()), reversed(made["size"].tolist())):
            if i not in handles or not (rt.eager or i in rt.born):      # freed already, or never a block
                continue
            if rt.eager:
                free(handles.pop(i))
            else:
                rt.on_free(i)       # dead: the collector reclaims it
            w.unwound += 1
            self._drop(i, size, ever=False)
            if any(k == i for k, *_ in w.shrunk):      # a halved block: the trace's whole size counts as dropped now
                w.shrunk = tuple((k, a, at if k == i and (f is None or f > at) else f, b) for k, a, f, b in w.shrunk)
        w.skip_until = end

    def _halve(self) -> None:
        """The workspace request of a cuDNN plan search failed (`_retry`): ``generate_and_filter_plans`` catches the
        OOM and asks for half as much, until a request is granted or the size reaches 0; each failure is an OOM
        survived. The one granted holds the object's block (its FREE frees it)."""
        (c, j, size, stream), self._retry = self._retry, None
        w, pol, dev = self._w, self.policy, self.device
        n, h = size // 2, None
        with self._root_section(S_HALVED):
            while n and h is None:
                h = pol.malloc(n, stream)
                if h is None:
                    self._oom_record(c, j, n, stream, recorded=False, caught=True, scope=None)
                    n //= 2
        if h is None:
            return
        i = c.item("ids", j)
        self.handles[i] = h
        if not self.runtime.eager:
            self.runtime.on_alloc(i, n)
        size = w.failed.pop(i)
        w.failed_live -= size
        w.failed_cum -= size
        w.shrunk += ((i, int(c.at[j]), self._free_of(i, int(c.at[j])), size - n),)
        a, r = pol.allocated, dev.reserved
        w.peak_alloc = max(w.peak_alloc, a)
        if r > w.peak_res:
            self._new_peak(r, a, int(c.at[j]), stream)

    def _free_of(self, i: int, after: int) -> int | None:
        """The event of object ``i``'s FREE after event ``after``, or None (a search per halved request: few)."""
        rec = self.trace.records
        at = np.flatnonzero((np.asarray(rec["kind"][after + 1:]) == FREE) & (np.asarray(rec["id"][after + 1:]) == i))
        return after + 1 + int(at[0]) if len(at) else None

    def _walk_skipping(self, c, lo, hi, lat) -> int:
        """Events ``lo`` to ``hi`` of chunk ``c`` while a try is unwound: its ALLOCs (before ``skip_until``) are
        skipped, the rest walked plainly; return where the walk got to (the end of the skipped ALLOCs is cleared
        once reached)."""
        w = self._w
        full = int(np.searchsorted(c.at, w.skip_until))
        stop = min(hi, full)
        if stop > lo:
            kinds, ids, sizes, _ = c.columns(lo, stop)
            for j, k, i, size in zip(range(lo, stop), kinds, ids, sizes):
                if k == ALLOC:
                    if self.runtime.held:
                        self.runtime.end_request()
                    w.skipped_allocs += 1
                    self._drop(i, size, ever=True)
                else:
                    self._walk_plain(c, j, j + 1, lat.append)
        if stop >= full and full < len(c.at):
            w.skip_until = None
        return max(lo, stop)

    def _drop(self, i, size, *, ever: bool) -> None:
        """Object ``i`` holds no block while the trace holds it live: its FREE is skipped (``ever``: it never
        held one, a request that failed or was skipped)."""
        w = self._w
        w.failed[i] = size
        w.failed_live += size
        if ever:
            w.failed_cum += size

    def _walk_fused(self, c, lo, hi, lat, tape=None) -> int:
        """`_walk_chunk` through the policy's fused loop: it takes events from one iterator over the
        range, serves what it can and hands back the event it stops at (a pressure event, a FREE of an
        id not live), which the plain loop drives before the fused loop goes on from the next one.

        The fused loop reports each ALLOC it served through its own escalation (the only ones that can
        raise reserved memory or fail) to `_served`, for the reserved peak and the OOMs. With ``tape`` it records
        onto it (a window the folder records, `Policy.fused_tape`), handing back what it does not serve from its
        pools."""
        w, dev, handles = self._w, self.device, self.handles
        fused, plain = self._fused, self._walk_plain
        held = self.runtime.held
        while held and lo < hi:         # a request whose in-request frees the last chunk held: walk it plainly
            lo = plain(c, lo, lo + 1, lat.append)
            if w.stopped:
                return lo
        if lo >= hi:
            return hi
        events = zip(range(lo, hi), *c.columns(lo, hi))

        def served(j, h):
            return self._served(c, j, h)
        while True:
            if tape is None:
                j, w.peak_alloc = fused(events, handles, lat, w.peak_alloc, dev, served)
            else:
                tape.follows(dev.clock)         # (else the tape is marked bad: nothing is folded)
                j, w.peak_alloc = fused(events, handles, lat, w.peak_alloc, dev, served, tape)
            if w.stopped:
                return j + 1
            if j is None:
                return hi
            plain(c, j, j + 1, lat.append)
            if w.stopped:
                return j + 1
            while held and j + 1 < hi:  # frees held for the next request: walk it plainly (`Runtime.hold`)
                j += 1
                next(events)
                plain(c, j, j + 1, lat.append)
                if w.stopped:
                    return j + 1

    def _served(self, c, j, h) -> bool:
        """After an ALLOC a fused loop served through the policy's escalation: an OOM (``h`` None) is
        recorded, a new reserved peak is taken; True if the walk stops here."""
        w, pol = self._w, self.policy
        if h is None:
            return self._oom(c, j, c.item("sizes", j), c.item("streams", j))
        r = self.device.reserved
        if r > w.peak_res:
            self._new_peak(r, pol.allocated, int(c.at[j]), c.item("streams", j))
        return False

    def _new_peak(self, reserved: int, allocated: int, at: int, stream: int, held: int = 0) -> None:
        """Reserved memory reached a new peak after event ``at``: keep it, with the free-space shape and
        the free breakdown there (``held``: a request held outside the trace); deferred (`defer_peak_state`):
        only where."""
        w = self._w
        w.peak_res = reserved
        if not self._take_peak_now(at):
            w.at_peak = _PeakLater(at)
            return
        t0 = time.perf_counter()
        w.frag_at_peak = largest_free_fragmentation(reserved, allocated, self.policy.largest_free())
        w.at_peak = self._free_state(at, stream, held)
        self._peak_seconds += time.perf_counter() - t0

    #: The peak states a replay takes as it walks cost at most this share of its time (and `PEAK_ALLOWANCE`
    #: seconds): reading every pool at every new peak made a replay of N pools cost N x peaks.
    PEAK_SHARE, PEAK_ALLOWANCE = 0.25, 0.01

    def _take_peak_now(self, at: int) -> bool:
        """Whether the state of the new peak after event ``at`` is taken now: in a second walk, at its one event;
        else unless deferred (`defer_peak_state`) or more than the replay can afford (`_afford_peak_state`)."""
        if self._peak_only_at is not None:
            return at == self._peak_only_at
        return not self._peak_deferred and self._afford_peak_state()

    def _afford_peak_state(self) -> bool:
        """Whether a new peak's state is taken now: always where the replay cannot be made again alike (a device,
        observer, guard or event log given), else while the states taken so far cost within `PEAK_SHARE` of the
        time since the replay was made. One not taken is left to a second walk to the last peak's event, if no
        later peak is taken (`_take_peak_state`): the figures are the same either way, the cost bounded by the
        events walked (docs/architecture.md, "The state at the reserved peak")."""
        return not self._remade or self._peak_seconds <= self.PEAK_ALLOWANCE + self.PEAK_SHARE * (
            time.perf_counter() - self._made_at)

    def defer_peak_state(self) -> None:
        """Take the free-space shape and breakdown at the reserved peak only if the result is built: a replay
        reaches a new peak at each of its first segment calls, and a replay that may be given up (`tune`'s
        bounded ones, most stopped early) need not pay that at each. The result's figures are the same:
        a second replay walks to the event the peak was first reached at (`_take_peak_state`). Only a replay
        made of its trace, policy and settings alone (no device, observer, guard or event log given) defers:
        another takes them at once."""
        self._peak_deferred = self._remade

    def _peak_walk(self) -> tuple:
        """How a second walk reaches this replay's reserved peak the way this one did: ``(spec, settings, state,
        own_limit)``, a replay of that policy and settings resumed from ``state`` (None: from the first event). A
        replay that resumed (`resume`) walked the checkpoint's replay's way up to the checkpoint: a peak in the walk
        it copied is reached as that one reached it (the checkpoint says how, through a chain of resumes too), a
        later one by resuming from the same checkpoint. (Walked from the first event under its own settings, a
        setting that does not behave alike up to the checkpoint -- a threshold resumed past where its GC acts --
        never came to that peak, and the result raised ``TypeError``.)"""
        if self._resumed is not None:
            state, own_limit = self._resumed
            if self._w.at_peak is not state.walk.at_peak:
                return self.spec, self.settings, replace(state, source=()), own_limit     # (no chain of states held)
            if state.source:
                return state.source
        return self.spec, self.settings, None, False

    def _take_peak_state(self) -> None:
        """The peak's free-space shape and breakdown (`defer_peak_state`), from a replay walked, unfolded, through
        the event the peak was first reached at the way this one reached it (`_peak_walk`: of the same trace,
        policy and settings, from the first event unless this replay resumed from a checkpoint)."""
        w = self._w
        spec, settings, state, own_limit = self._peak_walk()
        again = Replay(self.trace, spec, settings.with_(fold=False), guard=False)   # (a deferring replay is unguarded)
        if state is not None:
            again.resume(state, own_limit=own_limit)
        again._peak_only_at = w.at_peak.at         # the peaks before it are passed over, as later ones would be
        try:
            again.run(until=w.at_peak.at + 1)
        finally:
            again.close()
        w.frag_at_peak, w.at_peak = again._w.frag_at_peak, again._w.at_peak

    def _walk_plain(self, c, lo, hi, lat_append) -> int:
        """`_walk_chunk` event by event through ``malloc``/``free`` and the hooks."""
        w, pol, dev, handles = self._w, self.policy, self.device, self.handles
        malloc, free, pop = pol.malloc, pol.free, handles.pop
        rt = self.runtime
        on_alloc = None if rt.eager else rt.on_alloc
        on_free = None if rt.eager else rt.on_free
        born = None if rt.eager else rt.born
        held = rt.held
        before, after = self._before, self._after
        peak_alloc, peak_res = w.peak_alloc, w.peak_res
        h = None
        for j, k, i, size, st in zip(range(lo, hi), *c.columns(lo, hi)):
            if before is not None:
                before(c, j, k)
            if k == 1:                 # ALLOC (a literal compares fastest)
                t0 = dev.clock
                h = malloc(size, st)
                lat_append(dev.clock - t0)
                if held:                   # the request the held frees were made in is over
                    rt.end_request()
                if h is None:
                    w.peak_alloc, w.peak_res = peak_alloc, peak_res
                    if self._oom(c, j, size, st):
                        return j + 1
                    continue
                handles[i] = h
                if on_alloc is not None:
                    on_alloc(i, size)
                a = pol.allocated
                if a > peak_alloc:
                    peak_alloc = a
                r = dev.reserved
                if r > peak_res:
                    peak_res = r
                    self._new_peak(r, a, int(c.at[j]), st)
            elif k == 2 or k >= FREE_IN_REQUEST:   # FREE
                if on_free is None:
                    h = pop(i, None)
                    if h is None:          # its ALLOC failed under --keep-going
                        self._skip_free(i)
                        continue
                    if k == 2:
                        free(h)
                    else:                  # made inside the next request: held for it
                        rt.hold(h, k - FREE_IN_REQUEST)
                elif i in born:            # live (an unwound try's block is dead already)
                    h = handles[i]
                    on_free(i)
                else:
                    self._skip_free(i)
                    continue
            else:
                w.peak_alloc, w.peak_res = peak_alloc, peak_res
                h = None
                self._pressure(c, j, k, size, st)
                peak_alloc, peak_res = w.peak_alloc, w.peak_res
            if after is not None:
                after(c, j, k if k < FREE_IN_REQUEST else FREE, i, h)
        w.peak_alloc, w.peak_res = peak_alloc, peak_res
        return hi

    def _skip_free(self, i) -> None:
        """The FREE of object ``i``, whose ALLOC failed under --keep-going: counted; its bytes are no longer live."""
        w = self._w
        w.skipped_frees += 1
        w.failed_live -= w.failed.pop(i, 0)

    def _oom(self, c, j, size, stream, *, recorded: bool = False) -> bool:
        """Record an OOM at driving event j of chunk c; True if the walk stops here (neither a recorded OOM nor a
        survived one stops it; one whose try unwinds, or a plan search that asks again, stops it for a moment:
        `_walk_chunk`)."""
        w = self._w
        caught = not recorded and c.caught is not None and j in c.caught
        at = int(c.at[j])
        scope = None
        if not recorded and not caught:     # inside a try: survived, and the try unwinds
            tries = scopes_of(self.trace)
            k = tries.innermost(at) if len(tries) else None
            if k is not None:
                caught, scope = True, label_of(self.trace, tries, k)
                self._unwind = (int(tries.begin[k]), at, int(tries.end[k]))
        if not recorded:
            self._drop(c.item("ids", j), size, ever=True)
        self._oom_record(c, j, size, stream, recorded=recorded, caught=caught, scope=scope)
        if caught and scope is None and size > 1 and at in plan_search_set(self.trace):
            self._retry = (c, j, size, stream)      # a plan search: it asks again for half (`_halve`)
        elif scope is None and (recorded or caught or self.keep_going):
            return False
        w.stopped = True
        return True

    def _oom_record(self, c, j, size, stream, *, recorded: bool, caught: bool, scope) -> None:
        """File an `OOMRecord` of a failed request of ``size`` bytes at driving event j of chunk c, with the state
        now: an OOM, or one the program survives (``caught``)."""
        w, pol, dev = self._w, self.policy, self.device
        at = int(c.at[j])
        live = live_through(self.trace, self._live, at) - (0 if recorded else c.item("sizes", j))  # (a record: none)
        free = pol.free_breakdown(stream)
        (w.caught if caught else w.ooms).append(OOMRecord(
            at, size, stream, live, pol.allocated, dev.reserved,
            largest_free_fragmentation(dev.reserved, pol.allocated, pol.largest_free()), recorded=recorded,
            breakdown=None if free is None else breakdown(
                dev.reserved, pol.allocated, self._trace_bytes(at, self._live, self._allocs) + self._held(at), free),
            caught=caught, scope=scope))

    def _pressure(self, c, j, kind, size, stream) -> None:
        """Drive one pressure event (see the module docstring)."""
        w, pol, dev = self._w, self.policy, self.device
        w.n_pressure += 1
        if self._log_index:         # the device calls a release or an attempt makes are filed under this event
            pol.event_index = int(c.at[j])
        if kind == SET_LIMIT:
            if self._recorded_limits:
                dev.set_cap(size or None)
            return
        if kind == OOM and pol.offline:
            return          # an offline plan covers the requests the program made; a failed one is outside it
        if kind in POOL:    # the pool's number and the flags are read from the record (rare events)
            rec = self.trace.records[int(c.at[j])]
            with self._root_section(S_CACHE_RELEASE) if kind == POOL_RELEASE else nullcontext():
                pol.pool_event(kind, int(rec["aux"]), stream, int(rec["flags"]))
            return
        with self._root_section(S_RECORDED_OOM if kind == OOM else S_CACHE_RELEASE):
            if kind == CACHE_RELEASE:
                pol.release_cache()
                return
            h = pol.malloc(size, stream)
            if self.runtime.held:
                self.runtime.end_request()
            if h is None:
                self._oom(c, j, size, stream, recorded=True)
                return
            a, r = pol.allocated, dev.reserved       # served: held for a moment, freed at once (no FREE follows)
            w.peak_alloc = max(w.peak_alloc, a)
            if r > w.peak_res:
                self._new_peak(r, a, int(c.at[j]), stream, held=size)
            pol.free(h)
            w.served.append((int(c.at[j]), r, dev.limit if dev.limit < 2**63 else None))

    # ---- the free breakdown (why reserved > requested), at a new reserved peak and at each OOM ----------
    def _free_state(self, at: int, stream: int, held: int = 0):
        """What `_peak_breakdown` needs of the moment after event ``at`` (``held``: a request held outside
        the trace), or None when the policy cannot say; the trace's bytes are read once, at the end."""
        free = self.policy.free_breakdown(stream)
        return None if free is None else (at, self.device.reserved, self.policy.allocated, free, self._held(at, held))

    def _held(self, at: int, extra: int = 0) -> int:
        """What, added to `_trace_bytes` through event ``at``, gives the requested bytes of the objects holding a
        block: under eager, less the live objects whose ALLOC failed (--keep-going) and what the trace holds beyond
        a live halved request's block; under gc, less every failed and every collected object (a dead object keeps
        its block until collected) and every halved request's shortfall (collected, it gives back its block's);
        plus ``extra``."""
        w, rt = self._w, self.runtime
        if rt.eager:
            short = sum(b for _, a, f, b in w.shrunk if a <= at and (f is None or at < f))
            return extra - w.failed_live - short
        return extra - w.failed_cum - rt.reclaimed_bytes - sum(b for _, a, _, b in w.shrunk if a <= at)

    def _trace_bytes(self, at: int, live: LiveBytes, allocs: _AllocBytes) -> int:
        """From the trace, through event ``at``: the live requested bytes (eager) or every requested byte (gc)."""
        return live_through(self.trace, live, at) if self.runtime.eager else allocs.at(self.trace.records, at)

    def _peak_breakdown(self) -> dict | None:
        """`breakdown` where reserved reached its peak, with the trace ``event``; None if the policy cannot say."""
        if self._w.at_peak is None:
            return None
        at, reserved, allocated, free, held = self._w.at_peak
        requested = self._trace_bytes(at, LiveBytes(), _AllocBytes()) + held
        return {"event": at, **breakdown(reserved, allocated, requested, free)}

    @contextmanager
    def _root_section(self, name: str):
        """Time work outside any malloc as the root section ``name``."""
        with self.context.top_level(), self.context.section(name):
            yield

    # ---- the optional features: two hooks around each event, None when all are off ------------------
    def _before_hook(self):
        """Before each event: the policy's ``tick``, the periodic GC, the ALLOC's trace index."""
        pol, rt, w = self.policy, self.runtime, self._w
        tick, gc_every, log_index = pol.tick, rt.gc_every or 0, self._log_index
        if tick is None and not gc_every and not log_index:
            return None

        def before(c, j, k):
            if tick is not None:
                tick(c.times[j])
            if k != ALLOC:
                return
            if gc_every:
                w.since_gc += c.sizes[j]
                if w.since_gc >= gc_every:
                    w.since_gc = 0
                    with self._root_section(S_PERIODIC_GC):
                        rt.collect(False)
            if log_index:
                pol.event_index = int(c.at[j])
        return before

    def _after_hook(self):
        """After each event: a timeline sample (every step-th event and at each change of reserved), the observer."""
        pol, dev, timeline, observer = self.policy, self.device, self.timeline, self.observer
        if not timeline and observer is None:
            return None
        tl_idx, tl_alloc, tl_res = self._w.timeline
        tl_step = max(1, driving_count(self.trace) // 4000) if timeline else 1

        def after(c, j, k, i, h):
            if timeline and ((self._j0 + j) % tl_step == 0 or dev.reserved != (tl_res[-1] if tl_res else -1)):
                tl_idx.append(int(c.at[j]))
                tl_alloc.append(pol.allocated)
                tl_res.append(dev.reserved)
            if observer is not None:
                observer(int(c.at[j]), k, i, h)
        return after

    # ---- state, through public members ------------------------------------------------------------
    @property
    def fast_path(self) -> bool:
        """True when the policy's fused loop walks the common events (see `_walk_fused`)."""
        return self._fused is not None

    @property
    def records_fused(self) -> bool:
        """True when a window the folder records walks through the policy's fused loop, onto the recorder's tape
        (`Policy.fused_tape`): at the walk's own pace, so the folder's account counts it as walking."""
        return self._fused_tape

    @property
    def walk(self) -> _Walk:
        """The walk's own state (peaks, counts, OOMs, latencies): what a fold fingerprints, counts and adds to
        (`_Walk.fingerprint`, `_Walk.counts`, `_Walk.advance`); read only elsewhere."""
        return self._w

    @property
    def event_indexed(self) -> bool:
        """Whether the walk stores each event's trace index in the policy (``event_index``: `validate`'s event log,
        a policy that follows the recording)."""
        return bool(self._log_index)

    @property
    def events_done(self) -> int:
        """Driving events walked so far."""
        return self._w.done

    @property
    def allocated(self) -> int:
        return self.policy.allocated

    @property
    def reserved(self) -> int:
        return self.device.reserved

    @property
    def ooms(self) -> list[OOMRecord]:
        return list(self._w.ooms)

    @property
    def caught_ooms(self) -> list[OOMRecord]:
        """The failed requests the program survives (flagged CATCHES_OOM, or inside a TRY scope), which the walk
        went on past."""
        return list(self._w.caught)

    @property
    def served_ooms(self) -> list[tuple[int, int, int | None]]:
        """``(event, reserved bytes while it was held, the limit then)`` of each recorded failed request this
        replay served; the limit is the device's (a recorded SET_LIMIT, ``--cap``, the capacity), None if none."""
        return list(self._w.served)

    def live_blocks(self) -> dict[int, tuple[int, int]]:
        """``{object id: (addr, size)}`` of the live objects' blocks (0-byte objects never have one)."""
        block = self.policy.block
        return {i: block(h) for i, h in self.handles.items()}

    def largest_free(self) -> int | None:
        """The policy's largest free block inside reserved memory (None: it cannot see it)."""
        return self.policy.largest_free()

    def collect(self, full: bool = True) -> int:
        """Run a collection now (after the walk, a full one returns every dead object); objects reclaimed."""
        return self.runtime.collect(full)

    @property
    def segment_log(self) -> list | None:
        """The policy's own log of device calls ``(kind, size, event index)``, if it keeps one (`validate`)."""
        return self.policy.segment_log

    # ---- the result ---------------------------------------------------------------------------------
    def finish(self) -> ReplayResult:
        """End the replay (where it is) and return its `ReplayResult`; the policy is closed."""
        self._still_open("finish")
        if self._result is None:
            if self._folder is not None:
                self._folder.abort()
            try:
                self._result = self._build_result()
            finally:
                self.close()
        return self._result

    stop = finish

    def close(self) -> None:
        """End the replay without a result: the policy releases what it holds (a GPU policy's memory)."""
        if not self._closed:
            self._closed = True
            self._chunks = None
            self.policy.close()

    def _still_open(self, method: str) -> None:
        """Refuse to walk or to make a result once `close` ended the replay without one: ``run()`` after a
        ``close()`` part-way returned a result of the events walked until then, as if that were the whole run."""
        if self._closed and self._result is None:
            raise ValueError(f"Replay.{method}: the replay was closed part-way (Replay.close), so it has no result; "
                             f"make a new Replay")

    def result(self) -> ReplayResult:
        """The result so far (the replay goes on; after `finish`, the final result)."""
        if self._result is not None:
            return self._result
        self._still_open("result")
        if self._folder is not None:
            self._folder.abort()        # a window being recorded is walked on plainly
        with self.sections.kept():          # the policy's `finish` adds its hot-path totals: only for this result
            return self._build_result()

    def _build_result(self) -> ReplayResult:
        """The policy's `finish`, then `assemble_result` over the figures of the walk, policy, runtime and device."""
        w = self._w
        allocs = w.latency.count
        frees = w.done - allocs - w.n_pressure - w.skipped_frees - w.skipped_allocs + w.unwound
        if self._zero_counts:                    # count the bypassed 0-byte requests the walk got past
            end = self._next_index()
            for at, is_zero_alloc in self._zero_counts:
                passed = at < end
                n_zero_allocs = int(np.count_nonzero(is_zero_alloc[passed]))
                allocs += n_zero_allocs
                frees += int(np.count_nonzero(passed)) - n_zero_allocs
        if isinstance(w.at_peak, _PeakLater):
            self._take_peak_state()
        self.policy.finish()
        res = assemble_result(w, policy=self.policy, runtime=self.runtime, device=self.device, trace=self.trace,
                              stats=self.sections.stats, allocs=allocs, frees=frees,
                              breakdown_at_peak=self._peak_breakdown(), timeline=self.timeline)
        res.folded = self.folded
        return res

    def _next_index(self) -> int:
        """The trace index the walk goes on from: the records before it are done."""
        if self._w.stopped:
            return self._w.ooms[-1].event     # a walk stops only at the OOM just recorded
        if self._chunks is None:
            return len(self.trace)
        c = self._chunk
        if c is None:
            return 0
        return int(c.at[self._pos]) if self._pos < len(c.at) else int(c.at[-1]) + 1


def make_device(trace: Trace, policy, settings: ReplaySettings | None = None, **changes):
    """The device a `Replay` of ``trace`` against ``policy`` (a class or what `PolicySpec.of` takes) under
    ``settings`` (its capacity, cap, costs and backend; keyword arguments change them) makes: simulated, or
    real cudaMalloc/cudaFree with ``backend="cuda"``. Made apart, it can be watched (tests wrap its calls)
    and handed to `Replay` as ``device``.

    When the policy models the framework that recorded the trace, the simulated device hands out
    the recorded segment addresses (PyTorch and CuPy break best-fit ties by address)."""
    s = settings_of(settings, changes)
    cls = policy if isinstance(policy, type) else PolicySpec.of(policy).policy_class()
    capacity = trace_capacity(trace) if s.capacity == "trace" else s.capacity
    if s.backend == "cuda" and not cls.real_gpu:
        from ..machine.gpu import CudaDevice
        return CudaDevice(capacity=capacity, cap=s.cap, costs=s.costs)
    if s.backend not in ("sim", "cuda"):
        raise UsageError(f"unknown backend {s.backend!r} (known: sim, cuda)")
    return SimulatedDevice(capacity=capacity, cap=s.cap, costs=s.costs or CostModel(),
                           address_hints=(recorded_segments(trace) if cls.framework == trace.meta.get("framework")
                                          else []) if cls.framework else None)


def replay(trace: Trace | str, policy="split", settings: ReplaySettings | None = None, *, options=None,
           device=None, observer=None, progress=None, log_events: bool = False, plan_progress=None,
           guard: bool | None = None, **changes) -> ReplayResult:
    """Replay ``trace`` (a `Trace` or a path) against ``policy`` to the end; return its `ReplayResult`.

    The arguments are `Replay`'s. ``load_seconds`` is the time loading the file; ``replay_seconds``
    the replay's, the policy's set-up (an oracle's plan) included. A plug-in's exception becomes one
    `PluginError` line (an observer's own assertions, `allocsim.testing`'s, pass through as they are).
    """
    trace, loaded = load_trace(trace)
    t_start = time.perf_counter()
    spec = PolicySpec.of(policy, options)
    r = Replay(trace, spec, settings, device=device, observer=observer, progress=progress, log_events=log_events,
               plan_progress=plan_progress, guard=guard, **changes)
    return to_the_end(r, spec, observer is None, loaded, t_start)


def load_trace(trace) -> tuple[Trace, float]:
    """The trace (loaded if a path: a str, a `pathlib.Path`, bytes) and the seconds its loading took."""
    if isinstance(trace, Trace):
        return trace, 0.0
    t_load = time.perf_counter()
    trace = Trace.load(trace)           # (a str, a pathlib.Path, bytes: `allocsim.trace.trace_path`)
    return trace, time.perf_counter() - t_load


def to_the_end(r: Replay, spec: PolicySpec, plugin_lines: bool, loaded: float, t_start: float) -> ReplayResult:
    """Run ``r`` to the end and close it; its result with the load and replay seconds. ``plugin_lines``: a
    plug-in's exception becomes one `PluginError` line."""
    with plugin_errors(type(r.policy), spec.name, "replaying") if plugin_lines else nullcontext():
        try:
            res = r.run()
        finally:
            r.close()
    res.load_seconds = loaded
    res.replay_seconds = time.perf_counter() - t_start
    return res
