"""`Replay`: one replay of a trace against a policy, run to the end or stepped and stopped.

A `Replay` makes the device, the runtime, the sections and the policy (through its
`PolicyContext`), then walks the trace's driving events in order, a chunk of records
at a time:

- ALLOC: ``policy.malloc``; the modeled latency is the clock before/after; peak
  allocated and reserved are tracked (with the free-space shape and the free breakdown,
  ``policy.free_breakdown``, at the reserved peak and at each OOM);
  None is an OOM, which stops the walk unless ``keep_going``;
- FREE: the handle goes to the runtime (``gc``) or the policy (``eager``);
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

from array import array
from contextlib import contextmanager

import numpy as np

from .context import PolicyContext
from .costs import CostModel
from .device import SimulatedDevice
from .errors import UsageError
from .metrics import LatencyLog, OOMRecord, ReplayResult, breakdown, largest_free_fragmentation
from .runtime import RUNTIMES
from .sections import ALLOC_ROOT, FREE_ROOT, Sections
from .guard import guard_device_calls, guard_policy
from .spec import PolicySpec, check_overrides_reached, is_plugin, plugin_errors
from .trace import ALLOC, FREE, SEGMENT_ALLOC, Trace
from .trace.events import CACHE_RELEASE, OOM, PRESSURE, SET_LIMIT
from .trace.trace import CHUNK, LiveBytes

#: Root sections of the time the pressure events take (outside any ALLOC's latency).
S_RECORDED_OOM = "recorded OOM attempt"
S_CACHE_RELEASE = "cache release"
S_PERIODIC_GC = "gc(false) (periodic)"


def trace_capacity(trace: Trace) -> int | None:
    """The recorded device's total memory, if the trace's metadata names it."""
    dev = trace.meta.get("device") or {}
    total = dev.get("total_memory") if isinstance(dev, dict) else None
    return int(total) if total else None


def recorded_segments(trace: Trace) -> list[tuple[int, int]]:
    """``(size, address)`` of the recorded allocator's segment allocations, in order."""
    out = []
    for _, rec in trace._chunks():
        seg = rec[rec["kind"] == SEGMENT_ALLOC]
        out += zip(seg["size"].tolist(), seg["addr"].tolist())
    return out


class _Chunk:
    """The driving events of one chunk of records, as lists, and their trace indices."""

    def __init__(self, at, kind, ids, sizes, streams, times):
        self.at = at                # trace index of each driving event (numpy int64)
        self.kind, self.ids, self.sizes, self.streams, self.times = kind, ids, sizes, streams, times


def driving(trace: Trace, zero_counts: list | None = None):
    """Yield ``(start, records, local)`` per chunk of records: ``local`` are the positions of the
    events the walk drives (ALLOC, FREE, `PRESSURE`), 0-byte ALLOCs and their FREEs left out.

    The ids of live 0-byte objects are the only state carried between chunks; ``zero_counts``
    collects ``(trace index, is ALLOC)`` arrays of the bypassed events, to be counted.
    """
    zero_live = np.zeros(0, np.int64)       # ids of live 0-byte objects, sorted
    for start, rec in trace._chunks():
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
        local = np.flatnonzero(is_alloc | is_free | (np.isin(kind, PRESSURE) & ((kind != OOM) | (rec["size"] > 0))))
        if len(local):
            yield start, rec, local


class _AllocBytes:
    """Requested bytes of every ALLOC through a trace index, read forward as `LiveBytes` reads."""

    def __init__(self):
        self.total = 0
        self.pos = 0

    def at(self, records: np.ndarray, index: int) -> int:
        while self.pos <= index:
            rec = np.asarray(records[self.pos:min(self.pos + CHUNK, index + 1)])
            self.total += int(rec["size"][rec["kind"] == ALLOC].sum())
            self.pos += len(rec)
        return self.total


def driving_count(trace: Trace) -> int:
    """How many events the walk drives (what a timeline is sampled against)."""
    return sum(len(local) for *_, local in driving(trace))


class _Walk:
    """What the walk keeps: peaks, counts, OOMs, latencies, where it is."""

    def __init__(self):
        self.peak_alloc = self.peak_res = 0
        self.frag_at_peak = 0.0
        self.at_peak = None            # the free breakdown where reserved reached its peak (`Replay._free_state`)
        self.failed: dict = {}         # id -> size of the objects whose ALLOC failed (--keep-going), till their FREE
        self.failed_live = self.failed_cum = 0      # their bytes: still live in the trace / ever
        self.skipped_frees = 0         # FREEs of objects whose ALLOC failed under --keep-going
        self.n_pressure = 0
        self.ooms: list[OOMRecord] = []
        #: recorded failed requests served: (event, reserved while held, the device's limit then or None)
        self.served: list[tuple[int, int, int | None]] = []
        self.done = 0                  # driving events walked
        self.stopped = False           # an OOM stopped the walk
        self.latency = LatencyLog()
        self.since_gc = 0
        self.timeline = (array("q"), array("q"), array("q"))


class Replay:
    """One replay of ``trace`` against ``policy``: `run` it, or `step` it and read its state.

    ``policy`` is what `PolicySpec.of` takes (``"torch[expandable_segments:True]"``,
    ``"my.py:MyPool"``, a spec or a `Policy` subclass); ``options`` adds ``key=value`` texts or a
    dict. ``capacity="trace"`` takes the device memory recorded in the trace (else unlimited);
    ``cap`` is the pool cap, which overrides the limits the program set (SET_LIMIT).
    ``observer(event_index, kind, id, handle)`` is called after each driving event (it slows the
    walk); ``progress(done)`` after each chunk; ``plan_progress(done, total)`` follows an offline
    policy's plan, made here. ``log_events`` gives a policy with ``wants_event_index`` the trace
    index of each ALLOC (`validate`). ``backend="cuda"`` makes a simulated policy's device calls
    real; ``device`` replaces the simulated device. ``fast_path=False`` walks every event through
    ``malloc``/``free`` even for a policy with a fused ``walk_chunk`` (the tests compare the two).
    ``guard`` checks the cheap contract rules as the replay goes (`allocsim.guard`); None: for a plug-in only
    (not one on a real GPU, whose blocks its real allocator places).
    """

    def __init__(self, trace: Trace, policy="split", *, runtime: str = "eager", cap=None, capacity="trace",
                 options=None, costs: CostModel | None = None, gc_every=None, device=None, backend: str = "sim",
                 keep_going: bool = False, timeline: bool = False, observer=None, progress=None,
                 log_events: bool = False, plan_progress=None, fast_path: bool = True, guard: bool | None = None):
        self.trace = trace
        self.spec = spec = PolicySpec.of(policy, options)
        cls = spec.policy_class()
        if runtime not in RUNTIMES:
            raise UsageError(f"unknown runtime {runtime!r} (known: {', '.join(RUNTIMES)})")
        self.sections = Sections()
        self.device = device if device is not None else make_device(trace, cls, capacity=capacity, cap=cap,
                                                                    costs=costs, backend=backend)
        self.runtime = RUNTIMES[runtime](self.device, self.sections, gc_every=gc_every)
        self.context = PolicyContext(self.device, self.runtime, self.sections, trace)
        guard = is_plugin(cls) and not cls.real_gpu if guard is None else guard   # a real allocator's blocks are its own
        if guard:
            taken = guard_device_calls(self.context, self.device, spec.name)
        with plugin_errors(cls, spec.name, "being set up"):
            self.policy = cls(self.context, spec.values(), **({"progress": plan_progress} if cls.offline else {}))
        check_overrides_reached(self.policy, spec.name)
        if guard:
            guard_policy(self.policy, self.device, taken, spec.name)
            fast_path = False           # its fused loop would serve events around the checks
        self.handles: dict = {}        # id -> handle, live objects only
        self.runtime.attach(self.policy, self.handles)
        self.keep_going, self.timeline, self.observer, self.progress = keep_going, timeline, observer, progress
        self._recorded_limits = cap is None
        self._log_index = log_events and getattr(self.policy, "wants_event_index", False)
        self._w = _Walk()
        self._live = LiveBytes()       # live requested bytes, read up to each OOM
        self._allocs = _AllocBytes()   # requested bytes so far, read up to each OOM (gc: `_trace_bytes`)
        self._zero_counts: list = []
        self._chunks = self._driving_chunks()
        self._chunk, self._pos, self._j0 = None, 0, 0     # the chunk walked, the position in it, events before it
        self._before, self._after = self._before_hook(), self._after_hook()
        fused = getattr(self.policy, "walk_chunk", None) if fast_path else None
        self._fused = fused if self._before is None and self._after is None and self.runtime.eager else None
        self._result = None
        self._closed = False

    # ---- running -----------------------------------------------------------------------------
    def run(self, until: int | None = None) -> ReplayResult | None:
        """Walk to the end (or to trace index ``until``: the events before it); at the end, finish and
        return the `ReplayResult` (None while stopped short of it)."""
        self._walk(lambda c: len(c.at) if until is None else int(np.searchsorted(c.at, until)))
        return self.finish() if self.at_end else None

    def step(self, n: int = 1) -> int:
        """Walk the next ``n`` driving events (fewer at the end, or at an OOM that stops); return how many."""
        start = self._w.done
        self._walk(lambda c: min(len(c.at), self._pos + start + n - self._w.done))
        return self._w.done - start

    @property
    def at_end(self) -> bool:
        """True once every driving event is walked, or an OOM stopped the walk."""
        return self._chunks is None or self._w.stopped

    def _walk(self, end_of) -> None:
        """Walk chunk after chunk, each up to position ``end_of(chunk)``; stop where that falls short of
        the chunk's end (the target is reached), at an OOM that stops, or at the end of the trace."""
        w = self._w
        while not w.stopped and self._chunks is not None:
            c = self._chunk
            if c is None or self._pos >= len(c.at):
                c = self._chunk = next(self._chunks, None)
                self._pos = 0
                if c is None:
                    self._chunks = None
                    return
            hi = end_of(c)
            if hi > self._pos:
                lat = array("d")
                self._pos = self._walk_chunk(c, self._pos, hi, lat)
                w.latency.extend(lat)
                w.done = self._j0 + self._pos
                if self._pos >= len(c.at):
                    self._j0 += len(c.at)
                if self.progress is not None:
                    self.progress(w.done)
            if hi < len(c.at):
                return

    def _driving_chunks(self):
        """A `_Chunk` of Python lists per chunk of records that holds driving events."""
        times = self.policy.tick is not None
        for start, rec, local in driving(self.trace, self._zero_counts):
            yield _Chunk(local + start, rec["kind"][local].tolist(), rec["id"][local].tolist(),
                         rec["size"][local].tolist(), rec["stream"][local].tolist(),
                         rec["time_ns"][local].tolist() if times else None)

    def _walk_chunk(self, c, lo, hi, lat) -> int:
        """Drive events ``lo`` to ``hi`` of chunk ``c``, each ALLOC's latency appended to ``lat``; return
        where the walk got to (past an OOM that stops)."""
        if self._fused is not None:
            return self._walk_fused(c, lo, hi, lat)
        return self._walk_plain(c, lo, hi, lat.append)

    def _walk_fused(self, c, lo, hi, lat) -> int:
        """`_walk_chunk` through the policy's fused loop: it takes events from one iterator over the
        range, serves what it can and hands back the event it stops at (a pressure event, a FREE of an
        id not live), which the plain loop drives before the fused loop goes on from the next one.

        The fused loop reports each ALLOC it served through its own escalation (the only ones that can
        raise reserved memory or fail) to `_served`, for the reserved peak and the OOMs."""
        w, dev, handles = self._w, self.device, self.handles
        fused, plain = self._fused, self._walk_plain
        cols = (c.kind, c.ids, c.sizes, c.streams)
        if lo or hi < len(c.at):
            cols = tuple(col[lo:hi] for col in cols)
        events = zip(range(lo, hi), *cols)

        def served(j, h):
            return self._served(c, j, h)
        while True:
            j, w.peak_alloc = fused(events, handles, lat, w.peak_alloc, dev, served)
            if w.stopped:
                return j + 1
            if j is None:
                return hi
            plain(c, j, j + 1, lat.append)
            if w.stopped:
                return j + 1

    def _served(self, c, j, h) -> bool:
        """After an ALLOC a fused loop served through the policy's escalation: an OOM (``h`` None) is
        recorded, a new reserved peak is taken; True if the walk stops here."""
        w, pol = self._w, self.policy
        if h is None:
            return self._oom(c, j, c.sizes[j], c.streams[j])
        r = self.device.reserved
        if r > w.peak_res:
            self._new_peak(r, pol.allocated, int(c.at[j]), c.streams[j])
        return False

    def _new_peak(self, reserved: int, allocated: int, at: int, stream: int, held: int = 0) -> None:
        """Reserved memory reached a new peak after event ``at``: keep it, with the free-space shape and
        the free breakdown there (``held``: a request held outside the trace)."""
        w = self._w
        w.peak_res = reserved
        w.frag_at_peak = largest_free_fragmentation(reserved, allocated, self.policy.largest_free())
        w.at_peak = self._free_state(at, stream, held)

    def _walk_plain(self, c, lo, hi, lat_append) -> int:
        """`_walk_chunk` event by event through ``malloc``/``free`` and the hooks."""
        w, pol, dev, handles = self._w, self.policy, self.device, self.handles
        malloc, free, pop = pol.malloc, pol.free, handles.pop
        on_alloc = None if self.runtime.eager else self.runtime.on_alloc
        on_free = None if self.runtime.eager else self.runtime.on_free
        before, after = self._before, self._after
        peak_alloc, peak_res = w.peak_alloc, w.peak_res
        h = None
        cols = (c.kind, c.ids, c.sizes, c.streams)
        if lo or hi < len(c.at):            # a part of the chunk (a step): only then copy the slices
            cols = tuple(col[lo:hi] for col in cols)
        for j, k, i, size, st in zip(range(lo, hi), *cols):
            if before is not None:
                before(c, j, k)
            if k == 1:                 # ALLOC (a literal compares fastest)
                t0 = dev.clock
                h = malloc(size, st)
                lat_append(dev.clock - t0)
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
            elif k == 2:               # FREE
                if on_free is None:
                    h = pop(i, None)
                    if h is None:          # its ALLOC failed under --keep-going
                        self._skip_free(i)
                        continue
                    free(h)
                elif i in handles:
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
                after(c, j, k, i, h)
        w.peak_alloc, w.peak_res = peak_alloc, peak_res
        return hi

    def _skip_free(self, i) -> None:
        """The FREE of object ``i``, whose ALLOC failed under --keep-going: counted; its bytes are no longer live."""
        w = self._w
        w.skipped_frees += 1
        w.failed_live -= w.failed.pop(i, 0)

    def _oom(self, c, j, size, stream, *, recorded: bool = False) -> bool:
        """Record an OOM at driving event j of chunk c; True if the walk stops here."""
        w, pol, dev = self._w, self.policy, self.device
        at = int(c.at[j])
        live = self._live.at(self.trace.records, at) - (0 if recorded else size)   # an OOM record adds no bytes
        if not recorded:
            w.failed[c.ids[j]] = size
            w.failed_live += size
            w.failed_cum += size
        free = pol.free_breakdown(stream)
        w.ooms.append(OOMRecord(at, size, stream, live, pol.allocated, dev.reserved,
                                largest_free_fragmentation(dev.reserved, pol.allocated, pol.largest_free()),
                                recorded=recorded,
                                breakdown=None if free is None else breakdown(
                                    dev.reserved, pol.allocated,
                                    self._trace_bytes(at, self._live, self._allocs) + self._held(), free)))
        if recorded or self.keep_going:
            return False
        w.stopped = True
        return True

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
        with self._root_section(S_RECORDED_OOM if kind == OOM else S_CACHE_RELEASE):
            if kind == CACHE_RELEASE:
                pol.release_cache()
                return
            h = pol.malloc(size, stream)
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
        return None if free is None else (at, self.device.reserved, self.policy.allocated, free, self._held(held))

    def _held(self, extra: int = 0) -> int:
        """What, added to `_trace_bytes` now, gives the requested bytes of the objects holding a block: under
        eager, less the live objects whose ALLOC failed (--keep-going); under gc, less every failed and every
        collected object (a dead object keeps its block until collected); plus ``extra``."""
        w, rt = self._w, self.runtime
        return extra - (w.failed_live if rt.eager else w.failed_cum + rt.reclaimed_bytes)

    def _trace_bytes(self, at: int, live: LiveBytes, allocs: _AllocBytes) -> int:
        """From the trace, through event ``at``: the live requested bytes (eager) or every requested byte (gc)."""
        rec = self.trace.records
        return live.at(rec, at) if self.runtime.eager else allocs.at(rec, at)

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
        return getattr(self.policy, "segment_log", None)

    # ---- the result ---------------------------------------------------------------------------------
    def finish(self) -> ReplayResult:
        """End the replay (where it is) and return its `ReplayResult`; the policy is closed."""
        if self._result is None:
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

    def result(self) -> ReplayResult:
        """The result so far (the replay goes on; after `finish`, the final result)."""
        if self._result is not None:
            return self._result
        saved = {k: list(v) for k, v in self.sections.stats.items()}
        try:
            return self._build_result()
        finally:
            self.sections.stats = saved

    def _build_result(self) -> ReplayResult:
        w, pol, rt, dev, sections, trace = self._w, self.policy, self.runtime, self.device, self.sections, self.trace
        n_allocs = w.latency.count
        n_frees = w.done - n_allocs - w.n_pressure - w.skipped_frees
        if self._zero_counts:                    # count the bypassed 0-byte requests the walk got past
            end = self._next_index()
            for at, is_zero_alloc in self._zero_counts:
                passed = at < end
                n_zero_allocs = int(np.count_nonzero(is_zero_alloc[passed]))
                n_allocs += n_zero_allocs
                n_frees += int(np.count_nonzero(passed)) - n_zero_allocs
        pol.finish()
        peak_alloc = getattr(pol, "peak_allocated_override", None) or w.peak_alloc   # real allocators report their own
        alloc_time = w.latency.total()
        other_roots = sum(v[1] for k, v in sections.stats.items() if len(k) == 1 and k[0] not in (ALLOC_ROOT, FREE_ROOT))
        eager_free_time = max(0.0, dev.clock - alloc_time - other_roots)
        sections.add(ALLOC_ROOT, alloc_time, n_allocs, path=(ALLOC_ROOT,))
        gc_frees = sum(v[0] for k, v in sections.stats.items() if k[-1] == FREE_ROOT)
        eager_frees = max(0, n_frees - gc_frees) if rt.eager else 0
        if eager_frees or eager_free_time > 1e-12:
            sections.add(FREE_ROOT, eager_free_time, eager_frees, path=(FREE_ROOT,))
        counters = pol.counters()
        ooms = w.ooms
        res = ReplayResult(
            policy=pol.name or type(pol).__name__, runtime=rt.name, cap_bytes=dev.cap, capacity_bytes=dev.capacity,
            trace=trace.path,
            options={k: v for k, v in pol.options.items() if any(p.name == k and p.default != v for p in pol.params)},
            events=len(trace), driving_events=w.done, allocs=n_allocs, frees=n_frees, completed=not w.stopped,
            load_bytes=trace.load_bytes, peak_allocated_bytes=peak_alloc, peak_reserved_bytes=dev.peak_reserved,
            final_reserved_bytes=dev.reserved,
            largest_free_fragmentation_at_peak=w.frag_at_peak,
            device_mallocs=dev.n_malloc, device_frees=dev.n_free, device_malloc_bytes=dev.bytes_malloc,
            device_free_bytes=dev.bytes_free, cache_flushes=int(counters.get("cache_flushes", 0)),
            gc_incremental=rt.gc_incremental, gc_full=rt.gc_full, gc_time_seconds=rt.gc_time,
            gc_reclaimed_bytes=rt.reclaimed_bytes, ooms=len(ooms), oom_events=list(ooms),
            ooms_avoided=[at for at, _, _ in w.served], alloc_time_seconds=alloc_time,
            total_time_seconds=dev.clock, latency=w.latency.summary(), counters=counters,
            latency_measured=pol.real_gpu or getattr(dev, "measured", False),
            sections=sections.rows(), section_table=sections.table(),
            certified_limits=dev.certified() if hasattr(dev, "certified") else None,
            breakdown_at_peak=self._peak_breakdown(),
        )
        if res.peak_reserved_bytes:
            res.utilization = res.peak_allocated_bytes / res.peak_reserved_bytes
            res.fragmentation = 1.0 - res.utilization
        if res.load_bytes:
            res.overhead_vs_load = res.peak_reserved_bytes / res.load_bytes - 1.0
        if self.timeline:
            tl_idx, tl_alloc, tl_res = w.timeline
            res.timeline = {"event": list(tl_idx), "allocated": list(tl_alloc), "reserved": list(tl_res),
                            "latency_quantiles": w.latency.quantiles(np.linspace(0, 1, 501)).tolist()
                            if w.latency.count else [],
                            "oom_events": [o.event for o in ooms]}
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


def make_device(trace: Trace, policy, *, capacity="trace", cap=None, costs: CostModel | None = None,
                backend: str = "sim"):
    """The device a `Replay` of ``trace`` against ``policy`` (a class or what `PolicySpec.of` takes) makes:
    simulated, or real cudaMalloc/cudaFree with ``backend="cuda"``. Made apart, it can be watched (tests
    wrap its calls) and handed to `Replay` as ``device``.

    When the policy models the framework that recorded the trace, the simulated device hands out
    the recorded segment addresses (PyTorch and CuPy break best-fit ties by address)."""
    cls = policy if isinstance(policy, type) else PolicySpec.of(policy).policy_class()
    if capacity == "trace":
        capacity = trace_capacity(trace)
    if backend == "cuda" and not cls.real_gpu:
        from .gpu import CudaDevice
        return CudaDevice(capacity=capacity, cap=cap, costs=costs)
    if backend not in ("sim", "cuda"):
        raise UsageError(f"unknown backend {backend!r} (known: sim, cuda)")
    return SimulatedDevice(capacity=capacity, cap=cap, costs=costs or CostModel(),
                           address_hints=(recorded_segments(trace) if cls.framework == trace.meta.get("framework")
                                          else []) if cls.framework else None)
