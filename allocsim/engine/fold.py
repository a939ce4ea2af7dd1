"""Folding periodic runs: a long replay costs what is distinct (docs/architecture.md, "Folding").

At each iteration boundary (a MARK record; once a period of the steps' breaks where 24 looks found no fold:
`Folder._go_sparse`) `Folder` fingerprints the whole state that steers the rest of
the replay: the policy's (`Policy.fold_state`, blocks by address, never by handle), the runtime's (the gc
runtime's live and dead objects by the address of their blocks), the device's (reserved, cap, the recorded
addresses still to hand out, the driver placement) and the walk's (`--gc-every`'s running count). The live
objects are named by their blocks' addresses, so two boundaries whose states differ only in the ids of the
live objects have equal fingerprints. The fingerprint is a byte string: a dict finds every earlier boundary
with the same one (by hash, then exactly).

When boundary ``j`` equals an earlier boundary ``i`` and the driving events after ``j`` repeat those after
``i`` (kinds, sizes, streams, and every FREE frees the corresponding object: one allocated ``P`` events
later, or, for an object older than ``i``, the one holding the same block), the replay from ``j`` goes as
it went from ``i``. The engine then walks one window of ``P`` events from ``j``, plainly (``malloc`` and
``free``: a compiled fused loop adds to the clock in a C double), while recording what adds to the result
(`Recorder`): every increment of the modeled clock and of the device's and runtime's
time totals, each malloc's latency and each section's time as a pair of positions on the clock's tape,
and the integer counters' growth. It checks that the state at the window's end equals the state at its
start, finds how many more windows repeat in the trace (record for record where the records repeat with the
period, `repeating_records`; else event by event, `windows_repeat`), and adds them without walking: the clock
is the tape repeated, summed as the walk sums it (the very float additions, made in units of the last place
within a binade, `_runs`, so every float is the full walk's bit for bit), latencies and section times are
differences on it, counts are multiplied; the live ids are renamed to those the full walk would hold. Then the
walk goes on, past chunks it never reads (docs/architecture.md, "Folding").

A run broken by an evaluation (or any step of another shape) folds again without searching from scratch: where
the state comes back to one a recorded window started from, the windows from there are added with that
recording, none walked (`Folder._reuse`), and so where it comes back to a state the first recorded window went
through (the window begun there, `Rotated`); where it comes back into a cycle folded before, its window is recorded
at once (`Folder._resume`). A run broken every so many steps goes round the same folds and walks: from a fold
from a state to the next fold from it, a lap, cut from what the walk added since it came back from a first break
(`Journal`) and added as many times as the laps after it repeat it (`Folder._lap_close`). A trace whose steps
never repeat gets no folder (`Steps.may_repeat`).

What cannot be folded exactly is not folded: a policy whose `fold_state` is None (the default, so a plug-in is
never folded wrongly), a policy that follows the recording (`Policy.follows_recording`), FREEs held for a
request (``IN_REQUEST``), private-pool events, an observer, a
timeline, `log_events`, a policy ``tick``, a real or custom device, a guarded plug-in, an OOM or a served
recorded OOM inside the window, and any float the window computes from the clock in a way the recorder does
not follow (its tapes are then "tainted").
"""
from __future__ import annotations

import pickle
import time
import weakref
from array import array
from bisect import bisect_left, insort
from typing import NamedTuple

import numpy as np

from ..machine.device import SimulatedDevice
from ..trace.events import ALLOC, FREE, IN_REQUEST, MARK, NO_ID, POOL, PRESSURE, RECORD_DTYPE, kind_table
from ..trace import trace as trace_records
from . import repeats

#: The kinds whose records must repeat for a window to repeat (0-byte ALLOCs and their FREEs included).
FOLD_KINDS = np.array((ALLOC, FREE) + PRESSURE)
#: Records read at a time when comparing windows, and the most events one comparison batch holds.
READ = 1 << 16
#: Records a signature is read from at a time (its dozen temporaries then stay in the cache).
SIG_READ = 1 << 14
BATCH = 1 << 18
#: Fingerprint bytes made per driving event walked, at most: past it, boundaries are skipped (a state far
#: larger than a step, such as the gc runtime's dead objects, is then fingerprinted every so many steps, and
#: a period is found as a multiple of the true one).
BYTES_PER_EVENT = 4
#: Records compared at a time when reading windows record for record (a multiple of the period), and the longest
#: period in records read so (a longer one is read event by event).
SPAN = 1 << 15
MAX_RECORD_PERIOD = 1 << 22
#: The longest period looked for, in steps.
MAX_PERIOD = 512
#: Earlier boundaries with the same fingerprint tried at a boundary (the most recent first), and how many
#: boundaries' fingerprints are kept at most (the oldest are forgotten).
TRIES = 2
HISTORY = 4096
#: What folding may spend beyond what its folds saved, as a share of the whole walk's time, before it gives up
#: (`Budget`; issue 31: where nothing repeats, at most 5 % over ``--no-fold``). None: it never gives up.
SLACK = 0.05
#: Driving events walked (and `MIN_RATES` stretches of them rated) before the walk's cost per event is trusted
#: (`Budget.over`: a cheap run was judged only after 40 steps, having spent half its time), and the time looking
#: for a period may take beyond the slack before a fold pays it back (a fresh process's first fingerprints):
#: `ALLOWANCE`, the walk's time for that many events (`Budget.rate`: 10 ms on this project's machine, whose walk takes 0.13-0.21 us an
#: event; the folder's own work is as much slower as the walk on a slower machine: in seconds, on the H200 host,
#: three times slower tonight, the allowance was a third and GPT-2 small under `cupy` gave folding up in every run).
MIN_EVENTS = 1024
ALLOWANCE = 65_000      # (events; at most `SLACK` of the whole walk's time again: a short run's slack is short)
#: Before the first fold, the time the folder's making and its first looks may take beyond the slack (at most
#: twice the slack), as the walk's time for this many events (2 ms here): a fixed cost whatever the run's length
#: (reading the steps, the first signatures and fingerprints: 0.6-0.8 ms on a 300-step GPT whose whole walk takes
#: 20 ms, whose slack was then spent by step 7 of the 16 its state takes to repeat). In a fresh process, as
#: `allocsim replay` runs, they take about twice what they take in a process that replayed before (the first touch
#: of its memory): with 1 ms, at most the slack, that GPT gave folding up before its first fold in most runs of
#: `allocsim replay` on this project's machine, and took 1.3-1.5 times its `--no-fold` time; with 2 ms it folds in
#: every run (docs/performance.md, 2026-12-03, late night).
FIRST_LOOKS = 13_000
#: The stretches walked between looks are rated (`Budget.rate`) in runs of at least this many driving events, the
#: last `RATES` kept, `MIN_RATES` of them before the rate is trusted.
STRETCH, RATES, MIN_RATES = 256, 64, 4
#: Once a cycle is folded (the shortest of ``p`` steps), an earlier equal state more than this many times
#: ``p`` steps back is not tried, and a boundary is fingerprinted only where such a short period repeats from it
#: (`Steps.useful`'s ``longest``): recording a window that long (an evaluation every N steps makes a period of N
#: steps) costs more than walking the few steps after the break until the cycle resumes (`Folder._reuse`,
#: `Folder._resume`), and the boundaries just before a break repeat only with that long period.
RESUME_WAIT = 4
#: Resumes from one cycle state whose events did not repeat the cycle's (`Folder._resume`) before it is not tried
#: from that state again (a break that leaves two old objects in each other's blocks does so at every break).
RESUME_TRIES = 2
#: Laps that did not repeat (`Folder._lap_close`) before no journal is kept again; the folds from each state a journal
#: keeps (`Journal.starts`, the latest); the clock increments it holds at most (past them it starts afresh).
LAP_TRIES, LAP_STARTS, LAP_INCREMENTS = 2, 4, 1 << 22
GROUP = 1 << 16
#: Whether a recorded window is kept begun at each boundary inside it too (`Folder._rotations`, `Rotated`).
ROTATE = True
#: Fingerprints made, no fold found, before the folder looks only once a period of the steps' breaks
#: (`Folder._go_sparse`; every real run that folds here folded within 16).
SPARSE_AFTER = 24
#: Records below which a trace gets no folder (`Folder.possible`, while the budget is on: `SLACK`). A folder's
#: costs are fixed -- its making, its first looks, a stop at each boundary -- and a fold pays only once the state has
#: settled (6-16 steps on the real runs here) and a window is recorded before one is skipped: of the real runs cut
#: short (GPT-2 small, the small GPT and ResNet-18 under each policy) none under 65k records folded for a gain,
#: and the 13 shipped recordings that got a folder (all under 22k records) paid +1 to +103 % over ``--no-fold`` for
#: it (docs/performance.md, 2026-12-04).
MIN_RECORDS = 1 << 16
#: Steps up to which `Steps.may_repeat` answers (past it, a trace is taken to may repeat).
COUNTED = 1 << 13
#: Steps `Steps._count_breaks` keeps at most, all periods together (8 bytes each).
COUNT_BREAKS = 1 << 20
#: The longest reach (in steps) `Steps.useful` rules steps out for by their counts alone, all at once, and the
#: most steps x reach it compares so (O(steps x reach) once: 0.16 s at 100k steps and a reach of 24).
CANDIDATE_REACH, CANDIDATE_COUNTS = 64, 1 << 21
#: Counts `Steps.counts_repeat_all` compares in one gather at most (periods x steps); past it, period by period.
COUNTS_AT_ONCE = 1 << 14
#: Steps `Steps._run` reads a run on by, at most, a call.
RUN_READ = 256
#: The cycle states' windows kept for resumes (`Folder._cycle_view`), in records: a few of GPT-2 small's (38k each).
CYCLE_RECORDS = 1 << 20


# ---- the recorder: floats that remember how they were made ---------------------------------------------
class Tape:
    """The increments added, in order, to one running float total (the clock, a time total).

    A policy's fused loop records onto the clock's tape itself (`Policy.fused_tape`): it keeps the total in a C
    double, appends each increment it adds to ``incs``, notes each latency it makes (a plain float: the last
    increment) by the number of increments then on the tape in ``latency_ends``, and hands the total back with `at`,
    so the window walks at the fused loop's pace while every sum is followed as the plain walk's."""

    def __init__(self):
        self.incs = array("d")
        self.latency_ends = array("d")  # a fused loop's latencies: where each ends on the tape (it starts one
        #                                  before), counts held as doubles (exact below 2**53; appended in C compiled)
        self.bad = False            # something was computed from the total that the tape cannot repeat

    def at(self, value: float) -> "RecFloat":
        """The running total ``value`` after every increment on the tape (a fused loop hands its total back)."""
        return RecFloat.on(value, self, len(self.incs))

    def between(self, start: float, n: int, end) -> "RecDiff":
        """The latency from total ``start``, when the tape held ``n`` increments, to ``end`` (a total on it): one a
        fused loop makes around a call out (an escalation adds to the clock as the plain walk does), a `RecDiff`
        as the plain walk's; the tape is marked bad where ``end`` is not its latest total."""
        self.follows(end)
        return end - RecFloat.on(start, self, n) if not self.bad else float(end) - start

    def follows(self, total) -> bool:
        """Whether ``total`` is this tape's latest running total (a fused loop may go on from it); else the tape
        is marked bad (a total forked from an earlier one)."""
        if not (isinstance(total, RecFloat) and total.tape is self and total.n == len(self.incs)):
            self.bad = True
        return not self.bad


_new_float, _float_add = float.__new__, float.__add__


class RecFloat(float):
    """A running total that appends each increment added to it to its `Tape`; ``n`` is how many it holds.
    A difference of two totals on the same tape is a `RecDiff`; anything else made of it taints the tape."""

    __slots__ = ("tape", "n")

    @classmethod
    def on(cls, value: float, tape: Tape, n: int) -> "RecFloat":
        r = cls(value)
        r.tape, r.n = tape, n
        return r

    def __add__(self, c):
        t, n = self.tape, self.n
        incs = t.incs
        if n != len(incs) or type(c) not in (float, int):     # a fork of the tape, or a derived value
            t.bad = True
        c = float(c)
        incs.append(c)
        r = _new_float(RecFloat, _float_add(self, c))      # (each event of a recorded window adds: kept lean)
        r.tape, r.n = t, n + 1
        return r

    __radd__ = __add__              # IEEE addition is commutative

    def __sub__(self, other):
        if isinstance(other, RecFloat) and other.tape is self.tape:
            d = _new_float(RecDiff, float.__sub__(self, other))
            d.tape, d.a, d.b = self.tape, other.n, self.n
            return d
        return _taint(self, float.__sub__(self, other))

    def __rsub__(self, other):
        return _taint(self, float.__rsub__(self, other))

    def __mul__(self, other):
        return _taint(self, float.__mul__(self, other))

    __rmul__ = __mul__

    def __truediv__(self, other):
        return _taint(self, float.__truediv__(self, other))

    def __neg__(self):
        return _taint(self, float.__neg__(self))


def _derived(op):
    """A `RecDiff` operator: taints the tape and gives the plain float's result. Never NotImplemented: compiled
    code (Cython's fast float paths) raises where Python would fall back to the float's own operator."""

    def derived(self, *args):
        self.tape.bad = True
        return op(float(self), *args)
    return derived


class RecDiff(float):
    """A clock difference (a latency, a section's time): the positions ``a`` and ``b`` on its tape."""

    __slots__ = ("tape", "a", "b")

    __add__, __radd__, __sub__, __rsub__ = (_derived(op) for op in (float.__add__, float.__radd__, float.__sub__,
                                                                     float.__rsub__))
    __mul__, __rmul__, __truediv__, __rtruediv__, __neg__ = (
        _derived(op) for op in (float.__mul__, float.__rmul__, float.__truediv__, float.__rtruediv__, float.__neg__))


def _taint(rec: RecFloat, value: float) -> float:
    rec.tape.bad = True
    return value


class LatencyTape(list):
    """The latencies of a recorded window's piece: `RecDiff`s from the plain walk, plain floats from a fused loop
    that records onto the tape (`Tape.latency_ends` says where each ends); a fused loop appends to it as to an
    array."""


class Recorder:
    """One window walked with its float totals recorded: the clock, the device's malloc/free time, the
    runtime's GC time, and every section added (by path: a constant or a difference on the clock)."""

    def __init__(self, device, runtime, sections):
        self.device, self.runtime, self.sections = device, runtime, sections
        self.tapes = {name: Tape() for name in ("clock", "malloc_time", "free_time", "gc_time")}
        self.start = {"clock": device.clock, "malloc_time": device.malloc_time, "free_time": device.free_time,
                      "gc_time": runtime.gc_time}
        for name, value in self.start.items():
            self._put(name, RecFloat.on(value, self.tapes[name], 0))
        self.adds: list = []            # (path, seconds spec, calls) of every section added, in order
        self.lat: list = []             # every latency, in order: a count of the fused loop's next ones, or
        #                                 their (a, b) clock positions, ``((n, 2) array, fused ones among them)``
        self.taken = 0                  # the fused loop's latencies taken (`Tape.latency_ends`)
        self.n_lat = 0                  # every latency taken (`mark`)
        add = sections.add

        def recording_add(name, seconds, calls=1, *, path=None):
            key = path if path is not None else (*sections.stack, name)
            self.adds.append((key, seconds, calls))
            add(name, float(seconds), calls, path=path)
        sections.add = recording_add

    @property
    def clock_tape(self) -> Tape:
        """The clock's tape, for a fused loop that records onto it (`Policy.fused_tape`)."""
        return self.tapes["clock"]

    def _put(self, name, value) -> None:
        if name == "gc_time":
            self.runtime.gc_time = value
        else:
            setattr(self.device, name, value)

    def _get(self, name):
        return self.runtime.gc_time if name == "gc_time" else getattr(self.device, name)

    def take_latencies(self, lat: LatencyTape) -> bool:
        """Keep the positions of a walked piece's latencies; False if one is not a clock difference. A plain float
        is a fused loop's, ending where `Tape.latency_ends` says (a piece walked by the fused loop alone: counted,
        its pairs made at the end, `_latencies`)."""
        clock = self.tapes["clock"]
        fused, k = clock.latency_ends, self.taken
        self.n_lat += len(lat)
        if set(map(type, lat)) <= {float}:     # (all plain: the fused loop walked the piece alone: read at `stop`)
            if k + len(lat) > len(fused):
                return False
            if self.lat and type(self.lat[-1]) is int:
                self.lat[-1] += len(lat)
            else:
                self.lat.append(len(lat))
            self.taken = k + len(lat)
            return True
        pairs = []
        for d in lat:
            if type(d) is float and k < len(fused):
                pairs.append((int(fused[k]) - 1, int(fused[k])))
                k += 1
            elif isinstance(d, RecDiff) and d.tape is clock:
                pairs.append((d.a, d.b))
            else:
                return False
        self.lat.append((np.array(pairs, np.int64).reshape(-1, 2), k - self.taken))
        self.taken = k
        return True

    def stop(self) -> "Program | None":
        """Put plain floats back; the window's `Program`, or None if it cannot be repeated exactly."""
        self.end()
        return self.program()

    def end(self) -> None:
        """Put plain floats back, keeping what was recorded: `program` makes it into a `Program` when asked (a
        lap's journal keeps each stretch so, and makes only those of a lap that comes round)."""
        del self.sections.add
        self.ends = {}
        for name in self.tapes:
            self.ends[name] = end = self._get(name)
            self._put(name, float(end))

    def adds_anything(self) -> bool:
        """Whether what was recorded adds to any total (`Program.adds_anything`), before it is made."""
        return bool(self.lat or self.adds or any(len(tape.incs) for tape in self.tapes.values()))

    def mark(self) -> "tuple | None":
        """Where the recording is, at a step boundary inside the window (the walk stops at each): each tape's length
        and running total, the latencies taken, the sections added -- where `pieces` may cut the window."""
        totals = [self._get(name) for name in self.tapes]
        if not all(isinstance(t, RecFloat) and t.tape is tape and t.n == len(tape.incs)
                   for t, tape in zip(totals, self.tapes.values())):
            return None     # (a total off its tape here: not cut here)
        return tuple(len(tape.incs) for tape in self.tapes.values()), tuple(map(float, totals)), self.n_lat, len(
            self.adds)

    def program(self) -> "Program | None":
        """What was recorded (`end`) as a `Program`, or None if it cannot be repeated exactly; made once."""
        if "made" not in self.__dict__:
            self.made = self._program(None, None)
        return self.made

    def pieces(self, mark: tuple) -> "tuple[Program, Program] | None":
        """The window cut at ``mark`` (`mark`, taken inside it): ``(before, after)``, each a `Program` that adds what
        the walk added on its side, or None where either cannot be repeated exactly (`Rotated`)."""
        if mark is None or self.program() is None:
            return None
        before, after = self._program(None, mark), self._program(mark, None)
        return None if before is None or after is None else (before, after)

    def _program(self, lo: "tuple | None", hi: "tuple | None") -> "Program | None":
        """The `Program` of what was recorded between marks ``lo`` and ``hi`` (None: the window's start, its end),
        or None if it cannot be repeated exactly: every tape's increments there sum, from its total at ``lo``, to its
        total at ``hi``, and every latency and section time there is a difference on the clock's tape there."""
        names = tuple(self.tapes)
        if hi is None:
            for name, tape in self.tapes.items():
                end = self.ends[name]
                if tape.bad or not isinstance(end, RecFloat) or end.tape is not tape or end.n != len(tape.incs):
                    return None
            if self.taken != len(self.tapes["clock"].latency_ends):
                return None
        n0 = lo[0] if lo is not None else (0,) * len(names)
        n1 = hi[0] if hi is not None else tuple(len(tape.incs) for tape in self.tapes.values())
        v0 = lo[1] if lo is not None else tuple(self.start[name] for name in names)
        v1 = hi[1] if hi is not None else tuple(float(self.ends[name]) for name in names)
        incs, units = {}, {}            # the clock's units, read by the check and kept for the repeats (`_runs`)
        for x, (name, tape) in enumerate(self.tapes.items()):
            incs[name] = np.array(tape.incs[n0[x]:n1[x]])
            if _total(v0[x], incs[name], 1, units if name == "clock" else None) != v1[x]:
                return None
        c0, c1 = n0[0], n1[0]           # (the clock's tape: the first)
        clock, adds = self.tapes["clock"], []
        for key, seconds, calls in self.adds[lo[3] if lo is not None else 0:hi[3] if hi is not None else None]:
            if isinstance(seconds, RecDiff) and seconds.tape is clock and c0 <= seconds.a and seconds.b <= c1:
                adds.append((key, (seconds.a - c0, seconds.b - c0), calls))
            elif type(seconds) in (float, int):
                adds.append((key, float(seconds), calls))
            else:
                return None
        lat = self._latencies()[lo[2] if lo is not None else 0:hi[2] if hi is not None else None]
        if lo is not None and len(lat):
            if lat.min() < c0 or lat.max() > c1:
                return None
            lat = lat - c0
        return Program(incs, lat, adds, units)

    def _latencies(self) -> np.ndarray:
        """Every latency's (a, b) positions on the clock's tape, in order: a run of the fused loop's ends where
        `take_latencies` counted them (made once, after `end`)."""
        if "_pairs" not in self.__dict__:
            self._pairs = self._pairs_made()
        return self._pairs

    def _pairs_made(self) -> np.ndarray:
        ends, k, parts = np.frombuffer(self.tapes["clock"].latency_ends).astype(np.int64), 0, []
        for got in self.lat:
            if type(got) is int:
                parts.append(np.stack((ends[k:k + got] - 1, ends[k:k + got]), axis=1))
                k += got
            else:
                parts.append(got[0])
                k += got[1]
        return np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)


def _accumulate(start: float, incs: np.ndarray, times: int = 1) -> np.ndarray:
    """``start`` and every running total after each increment of ``incs`` (repeated ``times`` times), added one
    by one as the walk adds them, bit for bit (`_runs`)."""
    L = len(incs)
    out = np.empty(L * times + 1)
    out[0], at = start, 0
    for n, base, offsets in _runs(start, incs, times):
        if base is None:
            out[at * L:(at + n) * L + 1] = offsets
        else:
            np.add(base[:, None], offsets[1:], out=out[1 + at * L:1 + (at + n) * L].reshape(n, L))
        at += n
    return out


def _total(start: float, incs: np.ndarray, times: int = 1, memo: dict | None = None) -> float:
    """The last of `_accumulate`'s totals, without making the others where it need not (``memo``: `_runs`')."""
    total = float(start)
    if not len(incs) or not times:
        return total        # (nothing added: a total a window never touched, most of a recorder's four)
    for _, base, offsets in _runs(start, incs, times, memo):
        total = float(offsets[-1] if base is None else base[-1] + offsets[-1])
    return total


def _runs(start: float, incs: np.ndarray, times: int, memo: dict | None = None):
    """The running totals of ``start`` plus ``times`` windows of increments ``incs``, as the walk's additions
    make them, bit for bit, in runs of windows: ``(n, base, offsets)``, ``n`` windows whose totals are
    ``base[w] + offsets`` (window ``w``'s start and its ``L`` totals after it; the two are exact parts of a
    representable sum), or, with ``base`` None, ``offsets`` the ``n * L + 1`` totals themselves, added one by one
    (at most `GROUP` at a time).

    While a total ``s`` stays in one binade ``[2**e, 2**(e + 1))`` it is ``S`` units ``u = 2**(e - 52)``, ``S``
    a 53-bit integer, and rounding ``s + inc`` to nearest adds ``round(inc / u)`` units whatever ``S`` is
    (``inc / u`` is exact, a power-of-two scaling), unless ``inc / u`` ends in exactly one half (a tie rounds
    to even ``S``: left to the additions). So window ``w``'s totals are ``S0 + w * D + P`` units, ``P`` the
    running sum of one window's units and ``D`` its last, all integers below ``2**53`` (exact as floats): every
    window of a run has the same differences of totals. The window that reaches the next binade is added
    one increment at a time; a few binades at most. ``memo``: a dict kept with ``incs`` (`Program`), ``u`` -> the
    window's units in that binade (a lap repeats each of its parts in the same binade, lap after lap)."""
    L, done, s = len(incs), 0, float(start)
    exact = memo.get("exact") if memo is not None else None
    if exact is None:
        exact = bool(L) and bool(np.isfinite(incs).all() and (incs >= 0).all())
        if memo is not None:
            memo["exact"] = exact
    for _ in range(8 if exact else 0):  # binades
        if not s >= np.finfo(np.float64).tiny or s == np.inf:
            break
        u = np.ldexp(1.0, int(np.frexp(s)[1]) - 53)
        P = memo.get(u, False) if memo is not None else False
        if P is False:
            P = _units(incs, u)
            if memo is not None:
                memo[u] = P
        if P is None:
            break
        S0, last = int(s / u), int(P[-1])
        room = (1 << 53) - 1 - S0 - last     # the windows from here whose totals all stay below 2**53 units
        fit = 0 if room < 0 else times - done if last == 0 else min(times - done, room // last + 1)
        if fit:
            yield fit, (S0 + np.arange(fit) * float(last)) * u, P * u
            done += fit
            s = float(S0 + fit * last) * u
        if done == times:
            return
        window = _added(s, incs, 1)     # into the next binade: this window by additions
        yield 1, None, window
        done += 1
        s = float(window[-1])
        if done == times:
            return
    group = max(1, GROUP // max(1, L))
    while done < times:
        n = min(group, times - done)
        window = _added(s, incs, n)
        yield n, None, window
        done += n
        s = float(window[-1])


def _units(incs: np.ndarray, u: float) -> np.ndarray | None:
    """The running sum of ``incs`` in units ``u`` rounded to nearest, from 0 (`_runs`), or None where an increment
    ends in exactly half a unit or reaches ``2**53`` units (left to the additions). One C pass where `repeats` is
    compiled (`repeats.units`: numpy's five passes took 90 us on a small GPT's window of 2,800 increments, once for
    the window's check and once for its repeats, before `Recorder.stop` kept them), else `_units_plain`: the same
    numbers (tests/test_repeats.py)."""
    if not repeats.COMPILED:
        return _units_plain(incs, u)
    out = np.empty(len(incs) + 1)
    return out if repeats.units(np.ascontiguousarray(incs, np.float64), u, out) else None


def _units_plain(incs: np.ndarray, u: float) -> np.ndarray | None:
    """`_units` by numpy's passes (the plain model of `repeats.units`)."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = incs / u                # exact (or past 2**53: left to the additions)
        whole = np.floor(r)
        frac = r - whole
    if (frac == 0.5).any() or (r >= 2.0 ** 53).any():
        return None
    return np.concatenate(([0.0], np.cumsum(whole + (frac > 0.5))))


def _added(start: float, incs: np.ndarray, times: int) -> np.ndarray:
    """`_accumulate` by the additions themselves."""
    out = np.empty(len(incs) * times + 1)
    out[0] = start
    out[1:].reshape(times, len(incs))[:] = incs
    return np.add.accumulate(out, out=out)


class Additions:
    """What a fold adds (`Folder._skip`): `repeat` adds the floats of ``k`` windows, `advances` says how the counts
    grow -- by default the window's growth between its two snapshots, ``k`` times."""

    def advances(self, start: "Counts", end: "Counts", k: int) -> tuple:
        """The counts' growth of ``k`` windows as ``(before, after, times)`` in the walk's order (``start`` and
        ``end``: the window's counts)."""
        return ((start, end, k),)


class Program(Additions):
    """What one window adds to the float totals, to be repeated: the increments per total, the latencies and
    section times as positions on the clock's tape (or constants)."""

    def __init__(self, incs: dict, lat: np.ndarray, adds: list, units: dict | None = None):
        self.incs, self.lat = incs, lat
        self.by_key: dict = {}          # section -> [(seconds spec, calls)] in the order they were added
        self.units: dict = {} if units is None else units   # the clock's `_runs` memo: binade unit -> its units
        for key, spec, calls in adds:
            self.by_key.setdefault(key, []).append((spec, calls))

    def adds_anything(self) -> bool:
        """Whether repeating it adds to any total (a stretch of no events adds nothing)."""
        return bool(len(self.lat) or self.by_key or any(len(incs) for incs in self.incs.values()))

    def repeat(self, k: int, device, runtime, sections, latency) -> None:
        """Add ``k`` windows to the totals: run by run of `_runs` (one binade's windows take the same
        latencies and section times, coded once)."""
        incs = self.incs["clock"]
        L = len(incs)
        for n, base, offsets in _runs(device.clock, incs, k, self.units):
            if base is None:            # each window's own totals
                clock = np.ndarray((n, L + 1), offsets.dtype, offsets, 0, (L * offsets.itemsize, offsets.itemsize))
                device.clock = float(offsets[-1])
            else:                       # every window's differences are the offsets'
                clock = offsets[None, :]
                device.clock = float(base[-1] + offsets[-1])
            self._add(clock, n, sections, latency)
        for obj, name in ((device, "malloc_time"), (device, "free_time"), (runtime, "gc_time")):
            if len(self.incs[name]):
                setattr(obj, name, _total(getattr(obj, name), self.incs[name], k))

    def _add(self, clock: np.ndarray, n: int, sections, latency) -> None:
        """The latencies and section times of ``n`` windows whose clock totals are the rows of ``clock`` (one
        row: the same for all)."""
        times = n // len(clock)         # how many times over each row counts
        if len(self.lat):               # window by window, each window's latencies in order
            lat = clock[:, self.lat[:, 1]] - clock[:, self.lat[:, 0]]
            w = 0
            while w < len(lat):         # windows in one binade have the same latencies: coded once per run
                same = (lat[w:] == lat[w]).all(axis=1)
                run = len(same) if same.all() else int(np.argmin(same))
                latency.extend_repeated(lat[w], run * times)
                w += run
        for key, specs in self.by_key.items():
            cols = [np.full(len(clock), spec) if isinstance(spec, float) else clock[:, spec[1]] - clock[:, spec[0]]
                    for spec, _ in specs]
            values = np.stack(cols, axis=1)         # window by window, in the order they were added
            stat = sections.stats[key]
            stat[1] = _total(stat[1], values.ravel()) if times == 1 else _total(stat[1], values[0], times)
            stat[0] += n * sum(calls for _, calls in specs)


class Chain(Additions):
    """A lap's additions in order (`Journal`): each a `Program` and how many times over it adds (a fold's window ``k``
    times, a stretch walked once). Repeated, each is added in turn, as the walk added them, so every float is
    the full walk's."""

    def __init__(self, parts: list):
        self.parts = parts

    def repeat(self, k: int, device, runtime, sections, latency) -> None:
        for _ in range(k):
            for program, times in self.parts:
                program.repeat(times, device, runtime, sections, latency)


class Rotated(Additions):
    """A recorded window begun at a step boundary inside it: the windows from a state its cycle went through, a
    run's period resumed at another phase after a break (`Folder._rotations`). The walk from that boundary's
    state adds the part of the window after the boundary, then, window after window, the whole window (its part
    before the boundary and after it), and last the part before it: ``k`` windows from there are ``after``, the
    window ``k - 1`` times, ``before`` -- each float added as the walk adds it, every count grown in the same
    order (`advances`: a segment log's entries repeat in the walk's order). The two parts are cut from the
    window's `Recorder` when first asked (`Recorder.pieces`)."""

    def __init__(self, recorder: "Recorder", mark: tuple, window: "Program", middle: "Counts"):
        self.recorder, self.mark, self.window, self.middle = recorder, mark, window, middle
        self.incs = window.incs         # (a window's increments: a journal counts them, `Journal.add`)

    def parts(self) -> "tuple[Program, Program] | None":
        """``(before, after)``, the window cut at the boundary, or None where either cannot be repeated exactly."""
        if "_parts" not in self.__dict__:
            self._parts = self.recorder.pieces(self.mark)
            self.recorder = None        # (its tapes are no longer needed)
        return self._parts

    def adds_anything(self) -> bool:
        return self.window.adds_anything()

    def repeat(self, k: int, device, runtime, sections, latency) -> None:
        before, after = self.parts()
        after.repeat(1, device, runtime, sections, latency)
        if k > 1:
            self.window.repeat(k - 1, device, runtime, sections, latency)
        before.repeat(1, device, runtime, sections, latency)

    def advances(self, start: "Counts", end: "Counts", k: int) -> tuple:
        """From the boundary: the part after it, the window ``k - 1`` times, the part before it."""
        whole = ((start, end, k - 1),) if k > 1 else ()
        return ((self.middle, end, 1), *whole, (start, self.middle, 1))


class Journal:
    """What the walk added since it came back to a state a fold went through (a reuse, a resume), part by part, so
    that a lap can be repeated: a run broken by an evaluation every so many steps goes round the same folds and
    walks, and a lap is the stretch from a fold from one state to the next fold from that state (`Folder._lap_close`).
    Each fold's `Program` and count is kept, and each stretch walked between folds is recorded onto a `Recorder`'s
    tapes (through the policy's fused loop: `Policy.fused_tape`); ``starts`` says where each state's folds began (its
    boundary, the part its fold is, the counts there). From any of them to a later fold from the same state, the
    parts are one lap (`Chain`), recorded the first time round: a lap is added once it has been walked once (until
    2026-12-03 the first lap added was the third walked: a 300-step run broken every 50 steps, its state back at
    steps 55 and 155, added none)."""

    __slots__ = ("parts", "recorder", "starts", "events")

    def __init__(self):
        self.parts: list = []               # (Program, times), in order; a stretch walked: (its ended Recorder, 1)
        self.recorder = None                # the stretch being walked since the last fold
        self.starts: dict[bytes, list] = {}     # state -> [(Boundary, part index, Counts)], the last `LAP_STARTS`
        self.events = 0                     # increments kept in the parts (`LAP_INCREMENTS`)

    def add(self, part, times: int, increments: int) -> None:
        """One more part: a fold's `Program` and its windows, or a stretch walked (once) and its clock increments."""
        self.parts.append((part, times))
        self.events += increments


# ---- the trace side: the events a window compares -----------------------------------------------------
class Events:
    """The records of ``kind`` in `FOLD_KINDS` from trace index ``lo`` on, up to ``n`` of them: their trace
    indices and columns (numpy)."""

    COLUMNS = ("kind", "id", "size", "stream")

    def __init__(self, records, lo: int, n: int):
        parts, end = [], len(records)
        got = 0
        while got < n and lo < end:
            rec = records[lo:min(end, lo + _reading(n - got))]
            keep = np.flatnonzero(_folded(rec["kind"]))[:n - got]
            parts.append([keep + lo] + [rec[name][keep] for name in self.COLUMNS])
            got += len(keep)
            lo += len(rec)
        cols = [np.concatenate(c) for c in zip(*parts)] or [np.zeros(0, np.int64)] * 5
        self.at, self.kind, self.id, self.size, self.stream = cols     # the records' own dtypes

    def __len__(self) -> int:
        return len(self.at)

    def part(self, lo: int, hi: int) -> "Events":
        """Events ``lo`` to ``hi`` of these."""
        out = Events.__new__(Events)
        for name in ("at",) + self.COLUMNS:
            setattr(out, name, getattr(self, name)[lo:hi])
        return out

    @classmethod
    def joined(cls, a: "Events", b: "Events") -> "Events":
        """``a``'s events then ``b``'s (a window far before another: `Folder._resume` compares them)."""
        out = cls.__new__(cls)
        for name in ("at",) + cls.COLUMNS:
            setattr(out, name, np.concatenate((getattr(a, name), getattr(b, name))))
        return out

    def alloc_positions(self) -> np.ndarray:
        """For each FREE, the position (in these events) of its object's ALLOC, -1 if before them; else -1 (made
        once: a reuse asks twice)."""
        got = getattr(self, "_apos", None)
        if got is None:
            got = self._apos = self._alloc_positions()
        return got

    def old_frees(self, P: int, addr: dict) -> tuple[np.ndarray, list]:
        """The positions, among the first ``P`` events, of the FREEs of objects allocated before them (an id below
        every id they allocate), and the addresses (``addr``: id -> address where they start) of those objects'
        blocks (made once for a ``P`` and an ``addr``: every comparison across a gap from this window asks the same,
        `old_frees_differ`; asked with others, made again)."""
        got = getattr(self, "_old_frees", None)
        if got is None or got[0] != P or got[1] is not addr:
            kind, ids = self.kind[:P], self.id[:P]
            allocs = ids[kind == ALLOC]
            k = np.flatnonzero((kind == FREE) & (ids < allocs.min()) if len(allocs) else kind == FREE)
            got = self._old_frees = (P, addr, k, [addr.get(i) for i in ids[k].tolist()])
        return got[2], got[3]

    def _alloc_positions(self) -> np.ndarray:
        is_alloc, is_free = self.kind == ALLOC, self.kind == FREE
        a_pos = np.flatnonzero(is_alloc)
        a_ids = self.id[a_pos].astype(np.int64)
        f = np.flatnonzero(is_free)
        out = np.full(len(self), -1, np.int64)
        if not len(a_ids) or not len(f):
            return out
        lo, hi = int(a_ids.min()), int(a_ids.max())
        if hi - lo < 4 * len(self):            # ids in a narrow range (dense, as recorders give them): a table
            table = np.full(hi - lo + 1, -1, np.int64)
            table[a_ids - lo] = a_pos
            fid = self.id[f].astype(np.int64)
            inside = (fid >= lo) & (fid <= hi)
            got = np.full(len(f), -1, np.int64)
            got[inside] = table[fid[inside] - lo]
            out[f] = np.where(got < f, got, -1)
            return out
        order = np.argsort(a_ids, kind="stable")
        a_ids, a_pos = a_ids[order], a_pos[order]
        fid = self.id[f].astype(np.int64)
        k = np.minimum(np.searchsorted(a_ids, fid), len(a_ids) - 1)
        hit = (a_ids[k] == fid) & (a_pos[k] < f)
        out[f[hit]] = a_pos[k[hit]]
        return out


def windows_repeat(ev: Events, P: int, first: int, addr_i=None, addr_j=None) -> int:
    """How many whole windows of ``P`` events, from window ``first`` on (window 0 starts at ``ev``'s
    position ``P``; the one before it is the template), repeat the window before each. In window 0 a FREE of
    an object allocated before the template frees the one holding the same block (``addr_i``/``addr_j``:
    id -> address at the two boundaries); later, every FREE frees the object allocated P events after the
    object the FREE P events before freed."""
    n = len(ev) // P - 1 - first          # whole windows available to check
    if n <= 0:
        return 0
    lo, hi = (first + 1) * P, (first + 1 + n) * P
    same = ((ev.kind[lo:hi] == ev.kind[lo - P:hi - P]) & (ev.size[lo:hi] == ev.size[lo - P:hi - P])
            & (ev.stream[lo:hi] == ev.stream[lo - P:hi - P]))
    apos = ev.alloc_positions()
    t = np.arange(lo, hi)
    is_free = ev.kind[lo:hi] == FREE
    prev = apos[t - P]
    young = prev >= 0
    same &= ~is_free | (young & (apos[t] == prev + P))
    if first == 0 and addr_i is not None:       # window 0: FREEs of objects older than the template
        k = np.flatnonzero(is_free[:P] & ~young[:P])
        if len(k):
            held = [a is not None and a == addr_j.get(b)
                    for a, b in zip(map(addr_i.get, ev.id[lo + k - P].tolist()), ev.id[lo + k].tolist())]
            same[k] = np.array(held, bool) & (ev.kind[lo + k] == ev.kind[lo + k - P])
    bad = np.flatnonzero(~same)
    return n if not len(bad) else int(bad[0]) // P


def old_frees_differ(template: Events, ev: Events, P: int, addr_i: dict, addr_j: dict) -> bool:
    """Whether a FREE among the template's first ``P`` events, of an object allocated before them (an id below
    every id they allocate), is not, at its place in ``ev``, a FREE of the object holding the same block
    (``addr_i``/``addr_j``: id -> address at the two windows' starts): then `windows_repeat` of the two windows
    joined says the first is unlike (its window 0's check of such FREEs), and this says so reading those FREEs
    alone. A run broken by a logging step can leave the objects that outlive a step holding each other's blocks:
    every comparison across the gap then fails there, 1.6 ms of windows_repeat each on GPT-2 small under `cupy`
    (`Folder._resume`, `Folder._reuse`). The template's such FREEs are found once (`Events.old_frees`)."""
    k, held = template.old_frees(P, addr_i)
    if not len(k) or len(ev) < P:
        return False
    if (ev.kind[k] != FREE).any():
        return True
    return any(a is None or a != addr_j.get(i) for a, i in zip(held, ev.id[k].tolist()))


# ---- the folder ----------------------------------------------------------------------------------------
_LOW = np.uint64(0xFFFFFFFF)        # a record's first word less its id: kind, flags, stream


class RecordView:
    """A window (``W``, from boundary ``walked``, ``R`` records), and for a reuse the window after it (``F``), as
    the folder compares a later boundary's windows with them record for record: the windows from a boundary with
    ``W``'s state repeat ``W`` (and ``F``) if their records are those of ``W`` (and ``F``) with every id ``shift``
    more, except the FREEs in ``W`` of objects older than ``W``, whose objects must hold the blocks those held (by
    the two boundaries' addresses). What `windows_repeat` (and a reuse's second window's check) asks of the events
    gathered, read here without gathering them (a reuse of GPT-2 small's period-12 window gathered 77k events: 4
    ms); made once per window, and only where:

    - ``W``'s ALLOC ids are one run of ``D`` (its ALLOC count: distinct, given window after window, as every
      recorder gives them) above every id live at ``walked``, so a FREE's id ``shift`` more can only be the object
      allocated at the same place; every ALLOC and FREE carries an id, and a record of another kind with an id (a
      FREE_REQUESTED) names an object of these windows or is not compared by its id;
    - with ``F``: it has ``W``'s records but for the ids, its ALLOC ids are ``W``'s plus ``D``, and it frees no
      object older than ``W`` (every FREE of ``F`` frees one of ``W``'s or its own, as a reuse's second window
      asks).

    The boundary compared must have no live id at or above its first ALLOC's. Where any of this fails, the folder
    compares the events gathered, as before. O(R) to make, O(R) a comparison (two strided passes)."""

    __slots__ = ("p", "P", "R", "D", "windows", "base", "w0", "size", "shifted", "older", "old", "old_addr",
                 "first_alloc", "end_rel", "lo_rel", "zero", "id_run", "holder", "held_at", "mode")

    @classmethod
    def of(cls, folder: "Folder", walked: Boundary, p: int, end_addr: dict | None = None) -> "RecordView | None":
        """The view of the window of ``p`` steps from ``walked``, with its follower where ``end_addr`` is given
        (where each live object's block lay at the window's end: a recorded window, for `Folder._reuse`), or None
        where the conditions above do not hold."""
        records, marks = folder.r.trace.records, folder.marks
        words, windows = _words(records), 1 if end_addr is None else 2
        if words is None or walked.mark + windows * p >= len(marks):
            return None
        lo = walked.at
        R = int(marks[walked.mark + p]) - lo
        if not 0 < R <= MAX_RECORD_PERIOD or int(marks[walked.mark + windows * p]) - lo != windows * R:
            return None
        got = _window(words, lo, R, windows, max(walked.addr) if walked.addr else -1)
        if got is None:
            return None
        w0, size, shifted, older, old, (D, P, first_alloc, lo_id, hi_id, end_rel, lo_rel, zero) = got
        old_addr = [walked.addr.get(i) for i in (w0[old] >> np.uint64(32)).tolist()]
        if any(x is None for x in old_addr):
            return None
        v = cls.__new__(cls)
        v.p, v.P, v.R, v.D, v.windows, v.w0, v.size, v.shifted = p, P, R, D, windows, w0, size, shifted
        v.base = lo                         # where the window lies in the records (`_same` reads it there)
        v.older, v.old, v.old_addr = older, old, old_addr
        v.mode = None                       # how each record compares, for `repeats.same` (made when first asked)
        v.first_alloc = first_alloc
        v.end_rel = end_rel                 # just past the last event (of F, with F), from W's start
        v.lo_rel = lo_rel                   # F's first event, from W's start (with F)
        v.zero = zero                       # whether W allocates 0 bytes
        v.id_run = (lo_id, hi_id)
        v.holder, v.held_at = _by_address(end_addr) if end_addr is not None else (None, None)
        return v

    def compare(self, folder: "Folder", here: Boundary) -> "int | bool | None":
        """Whether the windows from ``here`` are this view's record for record: the ids' ``shift`` where they are,
        False where they differ only in the old objects' blocks (which the events say too: `old_frees_differ`),
        None where the records do not tell (they differ beyond their ids; a live id above the first ALLOC's)."""
        records, marks, R, p, n = folder.r.trace.records, folder.marks, self.R, self.p, self.windows
        m, lo = here.mark, here.at
        if m + n * p >= len(marks) or any(int(marks[m + w * p]) != lo + w * R for w in range(1, n + 1)):
            return None
        words = _words(records)
        w0 = words[lo:lo + n * R, 0]
        first = int(w0[self.first_alloc] >> np.uint64(32))
        shift = first - int(self.w0[self.first_alloc] >> np.uint64(32))
        if shift < 0 or (here.addr and max(here.addr) >= first):
            return None         # (a live id as high: a trace that allocates a live id again, which `validate` refuses)
        if not self._same(words, lo, shift):
            return None
        at, addr = here.addr, (w0[self.old] >> np.uint64(32)).tolist()
        if any(at.get(i) != a for i, a in zip(addr, self.old_addr)):
            folder.swapped(m, p)    # (as `old_frees_differ` finds them: two old objects in each other's blocks, say)
            return False
        return shift

    def _same(self, words: np.ndarray, lo: int, shift: int) -> bool:
        """Whether the records from trace index ``lo`` are this view's, every id ``shift`` more where `shifted`, the
        older objects' records but for their ids: one C pass where `repeats` is compiled (`repeats.same`: numpy's
        took 85 us a comparison of the small GPT's 2,800 records, 0.6 ms of GPT-2 small's under `cupy`), else
        `_same_plain`; the two answer alike (tests/test_repeats.py)."""
        if not repeats.COMPILED:
            return self._same_plain(words, lo, shift)
        if self.mode is None:
            mode = self.shifted.astype(np.uint8)
            mode[self.older] = 2
            self.mode = mode
        return repeats.same(words, lo, self.base, self.mode, shift)

    def _same_plain(self, words: np.ndarray, lo: int, shift: int) -> bool:
        """`_same` by numpy's passes (the plain model of `repeats.same`)."""
        N = len(self.w0)
        w0 = words[lo:lo + N, 0]
        same = np.subtract(w0, self.w0) == np.where(self.shifted, np.uint64(shift << 32), np.uint64(0))
        same[self.older] = (w0[self.older] & _LOW) == (self.w0[self.older] & _LOW)
        return bool(same.all() and (words[lo:lo + N, 2] == self.size).all())

    def repeats_at(self, folder: "Folder", here: Boundary, more: int) -> "tuple | bool | None":
        """A window's view (without ``F``) and a boundary ``here`` with its state: whether the window from ``here``
        repeats ``W`` and the ``more`` after it each the one before, as `windows_repeat` of the events from ``W``'s
        start asks (at least ``1 + more`` windows): ``(P, end, zero)`` (the window's events, where the one from
        ``here`` ends, whether it allocates 0 bytes), False where the old objects' blocks differ, None where the
        records do not tell. Told where ``here``'s window has ``W``'s records with every id ``D`` more (the window
        right after ``W``'s ids) and, where ``W`` freed objects older than it, frees objects ``W`` allocated
        (`frees_own`), and each window after it has the records of the one before, ids ``D`` more
        (`repeating_records`). `Folder._try` asks with one more (a window to record, one to skip), a resumed
        window's end with none; `Folder._record_windows` then reads on from the view."""
        shift = self.compare(folder, here)
        if shift is None or shift is False:
            return shift
        if shift != self.D or not self.frees_own(folder, here):
            return None
        records, R = folder.r.trace.records, self.R
        stop = here.at + (1 + more) * R
        if more and (stop > len(records) or repeating_records(_words(records), here.at + R, R, self.D, stop) < stop):
            return None
        return self.P, here.at + self.end_rel, self.zero

    def frees_own(self, folder: "Folder", here: Boundary) -> bool:
        """Whether the window from ``here`` frees, where ``W`` freed objects older than ``W``, objects ``W``
        allocated (its other FREEs free, ids ``D`` more, objects ``W``'s FREEs' objects were allocated after:
        then no FREE of the window after ``here`` frees an object older than ``W``)."""
        if not len(self.old):
            return True
        ids = (_words(folder.r.trace.records)[here.at + self.old, 0] >> np.uint64(32)).astype(np.int64)
        return bool(((ids >= self.id_run[0]) & (ids <= self.id_run[1])).all())

    def reuse(self, folder: "Folder", here: Boundary, until) -> "tuple | bool | None":
        """A recorded window's view (with ``F``): the windows from ``here`` (its state ``W``'s) told record for
        record: ``(k, new_end, shift)``, the ``k`` windows that repeat and where they end (`Folder._record_windows`
        and `_windows` read on past the first two as for any recorded window), False where they do not repeat or
        end past ``until``, None where the records do not tell."""
        shift = self.compare(folder, here)
        if shift is None or shift is False:
            return shift
        records, R, lo = folder.r.trace.records, self.R, here.at
        end = lo + self.end_rel
        if until is not None and end > until:
            return False
        stop = len(records) if until is None else min(len(records), until)
        q = repeating_records(_words(records), end, R, self.D, stop)
        folder.steps.repeated(end, q, R, self.p, self.D)
        n = max(0, q - end) // R
        lo_next = None if q >= stop or folder._differs(q, self.p) else (lo + self.lo_rel + (n - 1) * R if n else lo)
        k, new_end = folder._windows(lo_next, 1, self.P, 2 + n, end + n * R, until)
        if k != 2 + n:
            return None         # windows told event by event past the records: their ids are not known by arithmetic
        return k, new_end, shift + (k - 1) * self.D

    def renamed(self, addr: dict, shift: int) -> dict | None:
        """The live ids after the windows skipped: an object holding a block that an object allocated in ``W`` held
        at its end is the one allocated at the same place of the last window skipped, ``shift`` more (the ids of
        every window skipped are ``W``'s plus a constant, the records say so); any other lives on. None where a
        live object's block was nobody's at ``W``'s end."""
        got = _holders(addr, self.holder, self.held_at)
        if got is None:
            return None
        ids, h = got
        new = (h >= self.id_run[0]) & (h <= self.id_run[1])     # (W's ids are one run)
        return dict(zip(ids[new].tolist(), (h[new] + shift).tolist()))


def _window(words: np.ndarray, lo: int, R: int, windows: int, live_max: int) -> tuple | None:
    """What `RecordView.of` reads of ``windows`` windows of ``R`` records from trace index ``lo``: ``(w0, size,
    shifted, older, old, (D, P, first_alloc, lo_id, hi_id, end_rel, lo_rel, zero))`` (`RecordView`'s fields; ``old``
    the positions of the old objects' FREEs), or None where its conditions fail; ``live_max``: the highest id live at
    the window's start (-1: none). One C pass a question where `repeats` is compiled (`repeats.window`: 0.27 ms of
    numpy a view of a small GPT's 2,800-record window), else `_window_plain`: the two answer alike
    (tests/test_repeats.py)."""
    N = windows * R
    if not repeats.COMPILED:
        return _window_plain(words[lo:lo + N, 0].copy(), words[lo:lo + N, 2].copy(), R, windows, live_max)
    shifted, older, old = np.empty(N, np.uint8), np.empty(N, np.int64), np.empty(N, np.int64)
    got = repeats.window(words, _FOLDED_BYTES, lo, R, windows, live_max, shifted, older, old)
    if got is None:
        return None
    D, P, first_alloc, lo_id, hi_id, n_older, n_old, end_rel, lo_rel, zero = got
    w0, size = words[lo:lo + N, 0], words[lo:lo + N, 2]     # (the records' own columns: no copy)
    return (w0, size, shifted.view(bool), older[:n_older], old[:n_old],
            (D, P, first_alloc, lo_id, hi_id, end_rel, lo_rel if windows == 2 else None, zero))


def _window_plain(w0: np.ndarray, size: np.ndarray, R: int, windows: int, live_max: int) -> tuple | None:
    """`_window` by numpy's passes, from the windows' first and size words (the plain model of `repeats.window`)."""
    if windows == 2 and not (((w0[R:] & _LOW) == (w0[:R] & _LOW)).all() and (size[R:] == size[:R]).all()):
        return None
    kind, ids = (w0 & np.uint64(0xFF)).astype(np.int64), (w0 >> np.uint64(32)).astype(np.int64)
    has_id, alloc, free = ids != NO_ID, kind == ALLOC, kind == FREE
    if not has_id[alloc | free].all():
        return None                             # an ALLOC or FREE without an id
    a = np.flatnonzero(alloc[:R])
    D = len(a)
    if not D:
        return None
    made = ids[a]
    lo_id, hi_id = int(made.min()), int(made.max())
    if hi_id - lo_id != D - 1 or lo_id <= live_max:
        return None             # W's ids not D distinct ones (then, its span below D: given window after window)
    if windows == 2:
        if not (ids[a + R] - made == D).all():
            return None
        a, made = np.concatenate((a, a + R)), np.concatenate((made, ids[a + R]))
    table = np.full(hi_id + (windows - 1) * D - lo_id + 1, -1, np.int64)    # id -> where it was allocated
    table[made - lo_id] = a
    f = np.flatnonzero(has_id & ~alloc)         # FREEs, and the other records of an object (FREE_REQUESTED)
    fid = ids[f]
    inside = (fid >= lo_id) & (fid < lo_id + len(table))
    born = np.where(inside, table[np.clip(fid - lo_id, 0, len(table) - 1)], -1)
    older = f[(born < 0) | (born >= f)]         # of objects older than W
    old = older[kind[older] == FREE]
    if (old >= R).any():        # (never, where W was folded: F was compared with it, whose FREEs free objects
        return None             # allocated since W's template; the records alone do not say so)
    shifted = has_id.copy()
    shifted[older] = False                      # (another record of an older object: not an event, not compared)
    fold = np.flatnonzero(_folded(kind.astype(np.uint8)))
    P = int(np.searchsorted(fold, R))           # W's events
    if windows * P != len(fold) or not P:
        return None
    return (w0, size, shifted, older, old, (D, P, int(a[0]), lo_id, hi_id, int(fold[-1]) + 1,
                                            int(fold[P]) if windows == 2 else None,
                                            bool(((kind[:R] == ALLOC) & (size[:R] == 0)).any())))


class Counts(NamedTuple):
    """The integer totals a window adds to, as each piece declares them (docs/architecture.md, "Folding": who
    declares what): the walk's (`allocsim.engine.replay._Walk.counts`), the device's and the runtime's ``COUNTS``
    (`allocsim.machine.state.Counted`) and the policy's (`Policy.fold_counts`)."""

    walk: tuple
    device: tuple
    runtime: tuple
    policy: tuple


class Boundary:
    """An iteration boundary walked: its trace index, which MARK it is, and where each live object's block lies."""

    __slots__ = ("at", "mark", "addr")

    def __init__(self, at: int, mark: int, addr: dict):
        self.at, self.mark, self.addr = at, mark, addr


class Budget:
    """Folding's account in seconds, so that a fold that does not pay is given up (docs/architecture.md,
    "Folding"): what the folder spends (its looks at the boundaries, the stops they make the walk take, the windows it
    records plainly beyond what walking them would cost; a window a fused loop records is walking) against the walk's
    own cost per event (`rate`). The folder gives up
    once it has spent more than `SLACK` of the whole walk's estimated time, plus what its folds saved, plus
    `ALLOWANCE` (at most that slack again), plus the first looks' `FIRST_LOOKS` (at most twice the slack), these two
    the walk's time for so many events (a slower machine's folder is as much slower as its walk): a run that
    folds little then costs about `SLACK` more than ``--no-fold`` and the walk of 13,000 events, two milliseconds
    here (up to three times the slack on a short one), one that folds much keeps folding. Each look and each stop is
    charged the least of the wall time and the thread's CPU time it took (``clock``, ``cpu``): the time another
    process had the CPU is not the folder's (charged it, a small GPT's folding was given up in 7 of 20 replays
    beside two busy processes on two cores, 1 in 20 so); the walk's rate stays on the wall clock, its lower quartile
    of stretches (the charges can only be less than the wall time's: folding is given up no more often than on the
    wall clock alone; a budget wholly on the CPU clock, tried, gave up more often). Time steers only whether to go
    on folding, never a result (a fold is the full walk bit for bit). O(1) a boundary."""

    def __init__(self, clock=time.perf_counter, cpu=time.thread_time):
        self.clock, self.cpu = clock, cpu
        self.walk_s, self.walk_n = 0.0, 0       # walked (fused, or recorded by the fused loop): seconds, events
        self.inner_s, self.inner_n = 0.0, 0     # ... of them since the folder last let go (`walked`)
        self.inner_cpu = 0.0                    # ... the thread's CPU seconds of them
        self.run_s, self.run_n = 0.0, 0         # ... not yet rated (short steps: stretches gathered to `STRETCH`)
        self.rates: list[float] = []            # seconds an event of the last `RATES` stretches walked
        self.spent = 0.0                        # the folder's own seconds, and the recorded windows'
        self.recorded = 0                       # events walked recording plainly (charged back at the rate)
        self.saved = 0                          # driving events the folds passed
        self.mark = None                        # (wall, CPU, events done, recording plainly) as the folder last let go

    def enter(self, done: int) -> tuple[float, float]:
        """The folder is asked again with ``done`` events walked: the stretch since it let go was walked. Returns the
        two clocks' readings, for `leave`."""
        now, cpu = self.clock(), self.cpu()
        if self.mark is not None:
            then, then_cpu, before, plainly = self.mark
            if plainly:
                self.spent += min(now - then, cpu - then_cpu)
                self.recorded += done - before
            else:               # the walk's own calls; the rest of the stretch (stopping at a boundary) is folding's
                self.walk_s += self.inner_s
                self.walk_n += self.inner_n
                self.spent += max(0.0, min(now - then - self.inner_s, cpu - then_cpu - self.inner_cpu))
                self.run_s += self.inner_s
                self.run_n += self.inner_n
                if self.run_n >= STRETCH:
                    self.rates.append(self.run_s / self.run_n)
                    del self.rates[:-RATES]
                    self.run_s, self.run_n = 0.0, 0
        self.inner_s, self.inner_cpu, self.inner_n = 0.0, 0.0, 0
        return now, cpu

    def walked(self, seconds: float, events: int, cpu: float | None = None) -> None:
        """The walk drove ``events`` in ``seconds`` (``cpu`` of them on the thread's CPU clock: ``seconds`` if not
        given) between two boundaries: its cost per event is measured on the walking alone, as a walk that does not
        stop at each boundary walks (stopping is the folder's cost)."""
        self.inner_s += seconds
        self.inner_cpu += seconds if cpu is None else cpu
        self.inner_n += events

    def now(self) -> tuple[float, float]:
        """The two clocks' readings, for `walked_since` and `charge_since`."""
        return self.clock(), self.cpu()

    def walked_since(self, since: tuple[float, float], events: int) -> None:
        """`walked`: the walk drove ``events`` since the readings ``since`` (`now`)."""
        wall, cpu = self.now()
        self.walked(wall - since[0], events, cpu - since[1])

    def charge_since(self, since: tuple[float, float]) -> None:
        """The folder's own work outside its looks (its making: the steps read) took the time since the readings
        ``since``: the least of the two clocks' is spent."""
        wall, cpu = self.now()
        self.spent += min(wall - since[0], cpu - since[1])

    def leave(self, began: tuple[float, float], done: int, plainly: bool, passed: int) -> None:
        """The folder lets go, having taken the time since ``began`` and passed ``passed`` events by a fold;
        ``plainly``: a window is recorded plainly from here (its time is the folder's, less its events at the walk's
        rate; one the fused loop records onto the tape is walked at the walk's own pace, and counted as walking)."""
        now, cpu = self.clock(), self.cpu()
        self.spent += min(now - began[0], cpu - began[1])
        self.saved += passed
        self.mark = (now, cpu, done, plainly)

    def pause(self) -> None:
        """The walk stopped (a stepped replay): the time until it walks again is its caller's."""
        self.mark = None

    def rate(self) -> float:
        """The walk's seconds an event, as a walk that does not stop would walk: the lower quartile of the last
        stretches' rates (a stretch walked in pieces, or in the first steps, while the pools grow, costs more an
        event than the whole walk's steady chunks: an estimate above it would credit folds with savings they do
        not make)."""
        return sorted(self.rates)[len(self.rates) // 4]

    def over(self, done: int, share: float) -> bool:
        """Whether folding has spent past its slack and its savings, ``done`` driving events walked (folded ones
        included) at ``share`` of the trace's steps (the whole walk is estimated from them). Before the first fold
        there is no allowance but `FIRST_LOOKS`, the folder's making (reading the steps, charged too) and first
        looks: a run whose state repeats nowhere the folder looks costs about `SLACK` over ``--no-fold``, and two
        milliseconds here (`ALLOWANCE`, there from the start until 2026-12-03, made that 10-16 % on the real runs under
        the policies whose states repeat late or never). After it, both (until 2026-12-03 evening the first looks'
        went at the first fold, though no fold gives the making and first looks back: the small GPT, 300 cheap steps,
        gave folding up at steps 43-52 in most runs on a loaded machine, its first fold of 21 steps having saved
        about what its window cost, and walked the 250 steps after, which fold)."""
        if SLACK is None or self.walk_n < MIN_EVENTS or share <= 0 or len(self.rates) < MIN_RATES:
            return False
        per = self.rate()
        total = done / share
        slack = per * SLACK * total
        first = min(per * FIRST_LOOKS, 2 * slack)   # (the making and first looks: no fold gives them back)
        if not self.saved:
            return self.spent - per * self.recorded > slack + first
        return self.spent - per * self.recorded > slack + per * self.saved + first + min(per * ALLOWANCE, slack)


def fingerprint(r) -> "tuple[bytes, dict] | None":
    """``(fingerprint bytes, id -> address)`` of replay ``r``'s state now -- what a fold starts from and comes back
    to: the policy's `fold_state`, the runtime's objects by address, the device's, the walk's counts -- or None
    when it cannot be folded."""
    walk = r.walk.fingerprint()
    if walk is None:
        return None
    handles, pol = r.handles, r.policy
    state = pol.fold_state(handles.values())
    if state is None:
        return None
    addr = pol.addresses(handles)
    return pickle.dumps((state, r.runtime.fingerprint(addr), r.device.fingerprint(), walk), protocol=5), addr


class Folder:
    """Watches a `Replay`'s walk at each boundary and folds its periodic runs (see the module docstring)."""

    def __init__(self, replay):
        self.r = replay
        self.steps = steps_of(replay.trace)
        self.marks = self.steps.marks
        self.spent = 0                          # bytes of fingerprints made: kept within `BYTES_PER_EVENT`
        self.last = 0
        self.next_mark = 0
        self.seen: dict[bytes, list[Boundary]] = {}
        self.order: list[bytes] = []            # fingerprints in the order boundaries were seen (forgetting)
        self.rec = None                         # the window being recorded: (Recorder, ...)
        self.folded_events = self.folded_steps = 0
        self.periods: list[tuple[int, int, int]] = []    # (period in steps, first step folded, steps folded)
        self.cycles: dict[bytes, tuple[Boundary, int]] = {}     # a state a fold went round: where, period (`_resume`)
        self.unlike: dict[bytes, int] = {}      # resumes from a cycle state whose events differed (`RESUME_TRIES`)
        self.saved: dict[bytes, tuple] = {}     # a recorded window by the state it starts from (`_reuse`)
        self.views: dict[bytes, tuple] = {}     # what `_reuse` reads of each, once
        self.record_views: dict[bytes, "RecordView | None"] = {}    # ... record for record (`RecordView`), once
        self.cycle_views: dict[tuple, "RecordView | None"] = {}     # (trace index, p) -> a cycle state's (`_resume`)
        self.cycle_events: dict[tuple, Events] = {}     # (trace index, P) -> a cycle state's window (`_resume`)
        self.recent: list[tuple[Boundary, bytes]] = []  # the last boundaries fingerprinted, with their fingerprints
        self.gave_up_at = None                  # the step the folder gave up at (`Budget`): the walk goes on plainly
        self.budget = Budget()
        self.journal: Journal | None = None     # what the walk added since it came back to a folded state: laps
        self.lap_misses = 0                     # laps that did not repeat (`LAP_TRIES`)
        self.swapped_until = -1                 # no resume asked before this trace index (`swapped`)
        self.looks = 0                          # fingerprints made
        self.sparse: tuple[int, int] | None = None  # (a boundary, a stride): only those boundaries looked at
        self.sparse_at = SPARSE_AFTER           # the looks made when `_go_sparse` is asked next

    @property
    def recorder(self) -> "Recorder | None":
        """What the walk records onto now: the window's `Recorder`, or the lap's stretch's, else None."""
        if self.rec is not None:
            return self.rec[0]
        return None if self.journal is None else self.journal.recorder

    @property
    def active(self) -> bool:
        """Whether the folder still looks at the boundaries (it has not given up)."""
        return self.gave_up_at is None

    @staticmethod
    def possible(replay, device_given: bool, guard: bool) -> bool:
        """Whether a replay can fold at all: a policy that declares its state (a subclass made outside allocsim
        only if it declares its own: what it adds is its to say) and does not follow the recording, a simulated
        device, no observer, timeline, event log or tick, and a trace long enough for a fold to pay (`MIN_RECORDS`,
        unless the budget is off) whose steps may repeat (`Steps.may_repeat`)."""
        cls = type(replay.policy)
        if not cls.declares("fold_state") or (SLACK is not None and len(replay.trace) < MIN_RECORDS):
            return False
        return (type(replay.device) is SimulatedDevice and not device_given and not guard
                and not replay.policy.follows_recording      # its picks follow the trace, not its state alone
                and replay.observer is None and not replay.timeline and not replay.event_indexed
                and replay.policy.tick is None and not steps_of(replay.trace).unseen
                and steps_of(replay.trace).may_repeat())

    # -- where the walk stops ------------------------------------------------------------------------
    def stop(self, c, pos: int) -> int:
        """The position in chunk ``c`` the walk stops at next for the folder: the next boundary it looks at (each,
        or once a period: `_go_sparse`) or the recorded window's end (past the chunk: its length)."""
        stops = [len(c.at)]
        m = self._next_look(self.next_mark)
        if m < len(self.marks):
            stops.append(int(np.searchsorted(c.at, self.marks[m])))
        if self.rec is not None:
            stops.append(int(np.searchsorted(c.at, self.rec[1])))
        return max(pos + 1, min(stops))

    def at(self, c, pos: int, until) -> bool:
        """Called before the walk drives event ``pos`` of chunk ``c``: handle the boundaries the walk has
        reached; True when the walk was moved (a fold), so the caller looks at its chunk again. Each call is
        charged to the `Budget`; past it the folder gives up (``active`` False) and the walk goes on plainly --
        judged between windows, not while one is recorded (its fold, about to pay, is then counted)."""
        r, budget = self.r, self.budget
        done = r.events_done
        began = budget.enter(done)
        moved = self._at(c, pos, until)
        plainly = self.recorder is not None and not r.records_fused     # a window walked plainly is charged whole
        budget.leave(began, r.events_done, plainly, r.events_done - done if moved else 0)
        if self.rec is None and budget.over(r.events_done, self.next_mark / len(self.marks)):
            self.abort()
            self.gave_up_at = self.next_mark
        return moved

    def _at(self, c, pos: int, until) -> bool:
        """`at`'s work: the recorded window's end, and a boundary reached."""
        x = int(c.at[pos])
        if self.rec is not None and x >= self.rec[1]:
            if self._end_window(x, until):
                return True         # folded; else a boundary here is taken below, at its own position
        reached = self.next_mark
        while self.next_mark < len(self.marks) and self.marks[self.next_mark] <= x:
            self.next_mark += 1
        if self.next_mark == reached:
            return False
        if self.rec is not None:
            if self.rec[10] is not None:
                self._note(self.next_mark - 1)
            return False
        return self._boundary(int(self.marks[self.next_mark - 1]), self.next_mark - 1, until)

    def _note(self, m: int) -> None:
        """A boundary ``m`` inside a window being recorded from a state an earlier boundary had (`_try`): where the
        recording is, the counts and the live objects' addresses, for the windows from the states of its cycle
        (`_rotations`). Its state is not fingerprinted: the walk from the window's start goes as it went from the
        template's, whose boundaries' states are known (a fingerprint of GPT-2 small's state under `cupy` costs a
        few tenths of a millisecond, eleven such a window: charged to the budget, they gave folding up after the
        first fold)."""
        mark = self.rec[0].mark()
        if mark is not None:
            r = self.r
            self.rec[10][m] = (mark, self._counts(), r.policy.addresses(r.handles))

    def passed(self, x: int) -> None:
        """The walk drove trace index ``x`` without the folder looking (a `Replay.step`): the MARKs before it are
        passed, not boundaries to take where the walk goes on (the state there is not theirs)."""
        self.next_mark = max(self.next_mark, int(np.searchsorted(self.marks, x, side="right")))

    # -- the fingerprint -------------------------------------------------------------------------------
    def _fingerprint(self):
        """``(fingerprint bytes, id -> address)`` of the state now, or None when it cannot be folded (`fingerprint`)."""
        return fingerprint(self.r)

    def _boundary(self, at: int, mark: int, until) -> bool:
        """Take the boundary at trace index ``at`` (MARK number ``mark``): fold from it if it can (True: the walk
        was moved), else start recording a window where an earlier boundary had its state, and remember it."""
        if self._next_look(mark) != mark:
            return False    # not looked at (`_go_sparse`)
        longest = RESUME_WAIT * min(p for _, p in self.cycles.values()) if self.cycles else None
        budget = BYTES_PER_EVENT * self.r.events_done + (1 << 20)
        if self.spent + self.last > budget:
            return False    # fingerprints cost more than the walk: skip some
        back = self._coming_back(mark)
        if not back and not self.steps.useful(mark, longest):
            return False    # the steps after do not repeat
        got = self._fingerprint()
        if got is None:
            return False
        key, addr = got
        self.last = len(key)
        self.spent += len(key)
        self.looks += 1
        here = Boundary(at, mark, addr)
        self.recent.append((here, key))
        del self.recent[:-MAX_PERIOD]
        if key in self.saved and self._reuse(here, key, until):
            return True
        cycle = self.cycles.get(key) if self.unlike.get(key, 0) < RESUME_TRIES and at >= self.swapped_until else None
        if not (cycle and self._resume(here, key, until)):
            # (an earlier state more than `longest` steps back: its window costs more than waiting for the cycle)
            earlier = [e for e in reversed(self.seen.get(key, [])[-TRIES:])
                       if longest is None or mark - e.mark <= longest]
            if earlier and (not back or self.steps.useful(mark, longest)):
                for e in earlier:
                    if self._repeats(e.mark, mark, mark - e.mark) and self._try(e, here, key, until):
                        break
        self.seen.setdefault(key, []).append(here)
        self.order.append(key)
        if len(self.order) > HISTORY:
            old = self.order.pop(0)
            self.seen[old].pop(0)
            if not self.seen[old]:
                del self.seen[old]
        if self.looks >= self.sparse_at and self.sparse is None and self.rec is None and not self.periods:
            self._go_sparse(mark)
        return False

    def _next_look(self, m: int) -> int:
        """The first boundary from ``m`` on that the folder looks at: ``m``, or once sparse (`_go_sparse`) the next
        on its grid."""
        if self.sparse is None:
            return m
        start, stride = self.sparse
        return m + (start - m) % stride

    def _go_sparse(self, m: int) -> None:
        """`SPARSE_AFTER` fingerprints found no fold: from boundary ``m`` on, look only once a period of the steps'
        breaks (`Steps.long_period`: an evaluation every N steps), at the boundaries ``m + N``, ``m + 2N``, ... A
        state that repeats only with that period (`bestfit` on ResNet-18, its state a few cycles of other lengths
        that a logging step every 50 steps breaks: the same at steps 16, 116, 216, ...) is found there, a look per
        period, where a look at every boundary spent the folder's allowance before it came round (walked whole,
        1.07-1.13 of ``--no-fold``). Recording such a window notes no boundary inside it: no look there would
        ask for one (`Folder._rotations`; the guard is defensive: the walk stops only at those looked at). Once on,
        it stays on: a run whose short cycle settles only after `SPARSE_AFTER` looks is not folded with it (the small
        GPT under `torch` with `SPARSE_AFTER` 5 folds nothing, its cycle of 7 off the grid of 50)."""
        stride = self.steps.long_period(m)
        if stride is not None:
            self.sparse = (m, stride)
        else:               # (asked again `SPARSE_AFTER` looks later, not at each: it costs up to `MAX_PERIOD` passes)
            self.sparse_at = self.looks + SPARSE_AFTER

    def swapped(self, m: int, p: int) -> None:
        """A comparison across a gap (`RecordView.compare`) found, at boundary ``m``, a state a cycle of ``p`` steps
        went through but with old objects in each other's blocks (a logging step can leave two objects that outlive
        a step so, and each step's new ones take their places: on GPT-2 small under `cupy` the windows from the
        dozen boundaries after each logging step all differ from their cycle states', one state of its period-12
        cycle each, each comparison making its state's view of 40k records, 30 ms of a 200 ms replay). The walk's
        own states from ``m`` then go round the cycle so swapped: `_try` finds it from ``m`` a period later, and no
        resume is asked until then (a reuse still is: its recorded window's view is made once; where the swap ends
        sooner, a reuse finds it, or at most a period is walked)."""
        end = int(self.marks[m + p]) if m + p < len(self.marks) else len(self.r.trace.records)
        self.swapped_until = max(self.swapped_until, end)

    def _coming_back(self, m: int) -> bool:
        """Whether boundary ``m`` may be where a run comes back to a cycle a fold went round (`_reuse`, `_resume`):
        the ``p`` steps after it have the ALLOC counts of the ``p`` after those, for a cycle's period ``p``. Such a
        boundary is fingerprinted without reading the steps' signatures first (after a break, the few boundaries
        before the run is folded again read no signature: those came to more than the walk between folds);
        others ask `Steps.useful`."""
        return any(self.steps.counts_repeat(m, p, p) for p in {p for _, p in self.cycles.values()})

    def _alike(self, a: int, m: int, p: int) -> bool:
        """Whether steps ``m`` to ``m + 2p`` may be the ``p`` steps from ``a`` twice, before their events are
        compared exactly (`_reuse`, `_resume`): by the steps' signatures where all are read, else by their ALLOC
        counts (a weaker test, read for nothing)."""
        steps, n = self.steps, len(self.marks)
        if a + p > n or m + 2 * p > n:
            return False
        if steps.known[a:a + p].all() and steps.known[m:m + 2 * p].all():
            return self._repeats(a, m, p)
        return steps.counts_repeat(a, m - a, p) and steps.counts_repeat(a, m + p - a, p)

    def _repeats(self, a: int, m: int, p: int) -> bool:
        """Whether steps ``m`` to ``m + 2p`` have the signatures of the ``p`` steps from ``a`` twice: the steps
        after ``m`` repeat (by their signatures) for a window to record and one to skip at least."""
        sig, here = self.steps.read(a, a + p), self.steps.read(m, m + 2 * p)
        return len(sig) == p and len(here) == 2 * p and (here[:p] == sig).all() and (here[p:] == sig).all()

    def _resume(self, here: Boundary, key: bytes, until) -> bool:
        """Boundary ``here`` has the state of boundary ``b`` inside a cycle a fold went round, of ``p`` steps (a
        run broken by a step of another shape, an evaluation, comes back to its cycle): if the ``3p`` steps from
        it have the signatures of the ``p`` from ``b`` and the events of the first ``p`` repeat those from ``b``
        (`windows_repeat` across the gap: the same objects, by the blocks they hold, freed), start recording
        that window at once. Its end checks what `_try` checks before it (`_end_window`): the state is back, and
        the window after it repeats it. A resume that fails there is not tried again from that state."""
        b, p = self.cycles[key]
        m = here.mark
        if m + 3 * p > len(self.marks) or not (self._alike(b.mark, m, p) and self._alike(b.mark, m + p, p)):
            return False
        view = self._cycle_view(b, p)
        told = view.compare(self, here) if view is not None else None
        if told is None:            # the records do not tell: the events gathered do
            got = self._resumed_by_events(here, b, p)
        else:
            got = told is not False and (view.P, here.at + view.end_rel, view.zero)
        if not got:
            self.unlike[key] = self.unlike.get(key, 0) + 1
            return False
        P, end, zero = got
        if until is not None and end > until:
            return False
        r = self.r
        self._lap_pause()           # (a lap goes on with the window as one of its parts)
        self.rec = (Recorder(r.device, r.runtime, r.sections), end, None, here, key, P, self._counts(), zero, p, None,
                    None)
        return True

    def _cycle_view(self, b: Boundary, p: int) -> "RecordView | None":
        """The `RecordView` of the window of ``p`` steps from cycle state ``b``, made once for every resume from it
        (kept to `CYCLE_RECORDS` records in all: the oldest go first)."""
        if (b.at, p) not in self.cycle_views:
            view = RecordView.of(self, b, p)
            while self.cycle_views and sum(v.R for v in self.cycle_views.values() if v is not None) + (
                    view.R if view is not None else 0) > CYCLE_RECORDS:
                del self.cycle_views[next(iter(self.cycle_views))]
            self.cycle_views[b.at, p] = view
        return self.cycle_views[b.at, p]

    def _resumed_by_events(self, here: Boundary, b: Boundary, p: int) -> "tuple | bool":
        """`_resume`'s comparison of the events gathered, where the records cannot tell (`RecordView.compare`):
        ``(P, end, zero)`` (the window's events, where they end, whether it allocates 0 bytes), or False."""
        records = self.r.trace.records
        P = _count_between(records, here.at, int(self.marks[here.mark + p]))
        ev = Events(records, here.at, P)
        if (b.at, P) not in self.cycle_events:      # the cycle state's window, read once for every resume
            while self.cycle_events and P * (len(self.cycle_events) + 1) > BATCH:    # kept to a batch of events:
                del self.cycle_events[next(iter(self.cycle_events))]                  # the oldest go first
            self.cycle_events[b.at, P] = Events(records, b.at, P)
        template = self.cycle_events[b.at, P]
        if P == 0 or len(ev) < P or old_frees_differ(template, ev, P, b.addr, here.addr) \
                or windows_repeat(Events.joined(template, ev), P, 0, b.addr, here.addr) < 1:
            return False
        return P, int(ev.at[P - 1]) + 1, bool(np.any((ev.kind == ALLOC) & (ev.size == 0)))

    def _try(self, i: Boundary, j: Boundary, key: bytes, until) -> bool:
        """Boundary ``j`` has the state of ``i``: if the events after ``j`` repeat those after ``i`` for at
        least two windows (one to record, one to skip), start recording the first. Told record for record where
        the records can (`RecordView.repeats_at`, the view kept for the window's end), else by the events gathered
        (`_tried_by_events`): the two answer alike (tests/test_fold.py holds them to it)."""
        p = j.mark - i.mark
        view = RecordView.of(self, i, p)
        got = view.repeats_at(self, j, 1) if view is not None else None
        if got is None:
            view, got = None, self._tried_by_events(i, j)
        if not got:
            return False
        P, end, zero = got
        if until is not None and end > until:
            return False
        r = self.r
        self._lap_pause()           # (a lap goes on with the window as one of its parts)
        notes = {} if ROTATE and r.runtime.eager and self.sparse is None else None  # (`_note`: eager runs only)
        self.rec = (Recorder(r.device, r.runtime, r.sections), end, i, j, key, P, self._counts(), zero, p, view, notes)
        return True

    def _tried_by_events(self, i: Boundary, j: Boundary) -> "tuple | bool":
        """`_try`'s comparison of the events gathered (`windows_repeat`): ``(P, end, zero)`` as
        `RecordView.repeats_at` gives it, or False."""
        P = _count_between(self.r.trace.records, i.at, j.at)
        if P == 0:
            return False
        ev = Events(self.r.trace.records, i.at, 3 * P)
        if len(ev) < 3 * P or windows_repeat(ev, P, 0, i.addr, j.addr) < 2:
            return False
        return P, int(ev.at[2 * P - 1]) + 1, bool(np.any((ev.kind[:P] == ALLOC) & (ev.size[:P] == 0)))

    def _counts(self) -> "Counts":
        """The integer totals a window adds to, as each piece declares them, to repeat."""
        r = self.r
        return Counts(r.walk.counts(), r.device.counts(), r.runtime.counts(), r.policy.fold_counts())

    # -- the recorded window's end: repeat it ------------------------------------------------------------
    def abort(self) -> None:
        """Stop recording (the walk ends or is read mid-window): the totals go back to plain floats."""
        if self.rec is not None:
            self.rec[0].end()
            self.rec = None
        self._drop_lap()

    def _end_window(self, x: int, until) -> bool:
        """The recorded window is walked: if it can be repeated exactly and the state is back where it began,
        add every following window that repeats (up to ``until``) and move the walk past them; True then. Else
        the window walked is one more stretch of the journal (`_lap_walked`)."""
        rec, self.rec = self.rec, None
        program = rec[0].stop()
        if self._fold_window(program, rec, until):
            return True
        self._lap_walked(program)
        return False

    def _fold_window(self, program: "Program | None", rec: tuple, until) -> bool:
        """`_end_window`'s fold, the window walked recorded as ``program`` (None: it cannot be repeated)."""
        recorder, end, i, j, key, P, before, zero, p, view, notes = rec
        after = self._counts()
        if program is None or after.walk.settled != before.walk.settled:    # a skipped FREE, an OOM, a new peak
            self.cycles.pop(key, None)
            return False
        got = self._fingerprint()
        if got is None or got[0] != key:
            self.cycles.pop(key, None)
            return False
        records = self.r.trace.records
        walked, end_addr = j, got[1]
        base, k, resumed = end, 0, i is None
        if resumed:         # resumed (`_resume`): the window after the walked one must repeat it, as in `_try`
            e = Boundary(int(self.marks[j.mark + p]), j.mark + p, got[1])
            view = RecordView.of(self, j, p)
            told = view.repeats_at(self, e, 0) if view is not None else None
            if told is None:
                view, told = None, self._resumed_end_by_events(j, e, P)
            if not told:
                self.cycles.pop(key, None)
                return False
            base, k, i, j = told[1], 1, j, e        # it is skipped; the walked one leads
            if until is not None and base > until:
                return False
        n, lo, run = self._record_windows(i, j, P, base, until, view=view)     # record for record, while they repeat
        told = k + n
        k, new_end = self._windows(lo, 1, P, told, base + n * (j.at - i.at), until)
        if k == 0:
            return False
        rename = None       # (`_rename`'s, gathering the walked and the last skipped windows' events)
        if run is not None and k == told and self.r.runtime.eager:     # every window skipped told by its records:
            first, D = run                                              # its ids the walked one's, k * D more
            first += 0 if resumed else D        # (the walked window: the template's follower, or, resumed, itself)
            rename = {h: h + k * D for h in self.r.handles if first <= h < first + D}
        self._lap_fold(walked, key, before, resumed)     # (a lap may start where the window did)
        self._skip(program, k, before, after, end, new_end, P, (j.mark - i.mark, j.mark + 1), zero, rename)
        self._lap_folded(program, 1 + k)                # (the window walked, and the ``k`` after it)
        if self.r.runtime.eager:
            self._save(key, (program, before, after, P, p, walked, end_addr, zero))
            if notes:
                self._rotations(i, walked, notes, recorder, (program, before, after, P, p, zero))
        p = j.mark - i.mark
        self.cycles.update((k_, (b, p)) for b, k_ in self.recent if i.mark <= b.mark < j.mark)
        return True

    def _save(self, key: bytes, saved: tuple) -> None:
        """Keep a recorded window by the state it starts from (`_reuse`), its views made anew when asked."""
        self.saved[key] = saved
        self.views.pop(key, None)
        self.record_views.pop(key, None)

    def _rotations(self, i: Boundary, walked: Boundary, notes: dict, recorder: "Recorder", window: tuple) -> None:
        """The window recorded from ``walked`` (whose state is the template's from ``i``) went through the states
        the template's boundaries after ``i`` had (noted at the boundaries inside it, `_note`): the windows from each
        such state are kept too, as the recorded window begun there (`Rotated`), so that a run that comes back to
        its cycle at another phase after a break folds at once (`_reuse`), where it recorded a window first
        (`_resume`: on a small GPT logging every 50 steps, 7 steps walked at every break). Each is compared where
        it lies in the trace, from the template's boundary ``b`` (its state: the walk from ``walked`` went through
        it at the boundary noted, as the state at the window's end, checked, is the template's start), to its end
        at the boundary inside the recorded window (its addresses); a state saved already keeps its own window."""
        program, before, after, P, p, zero = window
        for b, key in self.recent:
            note = notes.get(walked.mark + b.mark - i.mark) if i.mark < b.mark < walked.mark else None
            if note is not None and key not in self.saved:
                mark, middle, addr = note
                self._save(key, (Rotated(recorder, mark, program, middle), before, after, P, p, b, addr, zero))

    def _resumed_end_by_events(self, j: Boundary, e: Boundary, P: int) -> "tuple | bool":
        """A resumed window's end compared by the events gathered: whether the window after the walked one (from
        ``j``) repeats it (`windows_repeat`): ``(P, end, zero)`` as `RecordView.repeats_at` gives it, or False."""
        ev = Events(self.r.trace.records, j.at, 2 * P)
        if len(ev) < 2 * P or windows_repeat(ev, P, 0, j.addr, e.addr) < 1:
            return False
        return P, int(ev.at[2 * P - 1]) + 1, None

    def _record_windows(self, i: Boundary, j: Boundary, P: int, end: int, until, ev: Events | None = None,
                        view: "RecordView | None" = None) -> tuple[int, int | None, tuple | None]:
        """``(k, lo, run)``: the ``k`` windows after the walked one (which ends at ``end``) that repeat it record for
        record, read without gathering the events (`repeating_records`), where `windows_repeat` reads on
        from (None: nowhere, the trace or ``until`` is reached), and, where the template's ALLOC ids are one run
        of ``D`` (every window's then is, ``D`` more than the one's before), ``(its first id, D)`` (else None).

        The records repeat with the period of the boundaries, ``R = j.at - i.at``, and each window's ALLOC
        ids are ``D`` more than the one's before (ids dense in ALLOC order, as every recorder gives them): then
        the kinds, sizes and streams repeat and every FREE frees the object allocated ``P`` events after the
        one the FREE ``P`` events before freed (the ALLOC ``R`` records after that object's carries its id
        plus ``D``, and no ALLOC of that id lies between, or one ``R`` records before it would), as
        `windows_repeat` asks, given that the walked window's FREEs free objects allocated since ``i`` -- which
        is checked here, with the template's and the walked window's events lying ``R`` records apart and their
        ALLOC ids ``D`` apart. Where any of this does not hold, `windows_repeat` reads every window. ``ev``: the
        ``2P`` events from ``i`` where the caller has read them; ``view``: the template's `RecordView`, where it told
        that the walked window repeats it (`RecordView.repeats_at`: all of the above, no event gathered)."""
        records = self.r.trace.records
        words, R = _words(records), j.at - i.at
        if words is None or not 0 < R <= MAX_RECORD_PERIOD:
            return 0, i.at, None
        if view is not None:
            D, run, lead = view.D, (view.id_run[0], view.D), j.at       # (no event lies before the window's first)
        else:
            ev = Events(records, i.at, 2 * P) if ev is None else ev
            allocs = np.flatnonzero(ev.kind[:P] == ALLOC)
            if len(ev) < 2 * P or not len(allocs) or not (ev.at[P:] == ev.at[:P] + R).all():
                return 0, i.at, None
            ids = ev.id.astype(np.int64)
            shift = ids[allocs + P] - ids[allocs]
            D = int(shift[0])
            first, span = int(ids[allocs].min()), int(ids[allocs].max() - ids[allocs].min())
            if not (shift == D).all() or D <= span:
                return 0, i.at, None        # ids not given window after window (or windows' ids overlap)
            frees = np.flatnonzero(ev.kind[P:] == FREE) + P
            if (ev.alloc_positions()[frees] < 0).any():
                return 0, i.at, None        # the walked window frees an object older than the template
            run, lead = (first, D) if span == D - 1 else None, int(ev.at[P])
        stop = len(records) if until is None else min(len(records), until)
        q = repeating_records(words, end, R, D, stop)
        self.steps.repeated(end, q, R, j.mark - i.mark, D)    # the skipped steps' signatures, known unread
        k = max(0, q - end) // R
        if q >= stop or self._differs(q, j.mark - i.mark):
            return k, None, run
        return k, (lead + (k - 1) * R if k else i.at), run      # the last two windows lead on

    def _differs(self, x: int, p: int) -> bool:
        """Whether the step that trace index ``x`` lies in has another ALLOC count than the step ``p`` before it:
        then the window of ``p`` steps that holds it cannot repeat the one before it, even event by event (a run
        broken by an evaluation: `_windows` need not read on)."""
        s = int(np.searchsorted(self.marks, x, side="right")) - 1
        return s >= p and not self.steps.counts_repeat(s - p, p, 1)

    def _windows(self, lo: int | None, first: int, P: int, k: int, new_end: int, until) -> tuple[int, int]:
        """``(k, new_end)`` counting on the windows that repeat event by event (`windows_repeat`) from window
        ``first`` of the events from ``lo`` (None: none to read), ``k`` counted and ending at ``new_end`` before.
        A few windows are read first, more while they repeat: a run that stops soon (at the next evaluation) is
        not read a whole batch ahead."""
        records, windows = self.r.trace.records, 4
        while lo is not None:           # ev from `lo`: the template, window 0, then 1, ...
            ev = Events(records, lo, max(min(windows, BATCH // P), first + 2) * P)
            windows *= 4
            n = windows_repeat(ev, P, first)
            if n:
                ends = ev.at[(np.arange(first, first + n) + 2) * P - 1] + 1
                if until is not None:           # only whole windows that end by the walk's target
                    n = int(np.searchsorted(ends, until, side="right"))
                if n:
                    k, new_end = k + n, int(ends[n - 1])
            if n == 0 or n < len(ev) // P - 1 - first:
                break
            lo, first = int(ev.at[(first + n - 1) * P]), 1      # the last two windows checked lead the next batch
        return k, new_end

    def _reuse(self, here: Boundary, key: bytes, until) -> bool:
        """Boundary ``here`` has the state a window recorded before started from (a run broken by an evaluation
        comes back to its cycle): if the windows from here repeat that one, add them with its recording,
        walking none. The first is compared with the recorded window across the gap (an object older than it
        freed where the recorded window freed the one holding the same block), the second with the first (an
        object older than the first freed: the one allocated where the recorded window's follower freed one of
        the recorded window's), the others each with the one before (`windows_repeat`). The live ids are then
        those the last window skipped leaves where the recorded window left its own (by block). Told record for
        record where the recorded window allows it (`RecordView`), else by the events gathered
        (`_reused_by_events`): the two answer alike (tests/test_fold.py holds them to it)."""
        program, before, after, P, p, walked, end_addr, zero = self.saved[key]
        if self.journal is not None and key in self.journal.starts and self._lap_close(here, key, p, until):
            return True
        rotated = type(program) is Rotated      # (asked as a resume is: `RESUME_TRIES`, `swapped`)
        if rotated and (self.unlike.get(key, 0) >= RESUME_TRIES or here.at < self.swapped_until):
            return False
        if not self._alike(walked.mark, here.mark, p):
            return False            # the steps from here are not the recorded window's twice: no events read
        if rotated and program.parts() is None:
            del self.saved[key]     # (its parts cannot be repeated exactly)
            return False
        got = self._reused_by_records(here, key, until)
        if got is None:
            got = self._reused_by_events(here, key, until)
        if not got:
            if rotated:
                self.unlike[key] = self.unlike.get(key, 0) + 1
            return False
        k, new_end, rename = got
        self._lap_fold(here, key, None, True)
        self._skip(program, k, before, after, here.at + 1, new_end, P, (p, here.mark + 1), zero, rename)
        self._lap_folded(program, k)
        return True

    def _reused_by_records(self, here: Boundary, key: bytes, until) -> "tuple | bool | None":
        """`_reuse`'s comparison record for record (`RecordView`, made once a recorded window): ``(k, new_end,
        rename)`` for the ``k`` windows that repeat from ``here``, ending at ``new_end``, and the live ids' new names;
        False where they do not repeat; None where the records cannot tell (`_reused_by_events` does)."""
        if key not in self.record_views:
            _, _, _, P, p, walked, end_addr, _ = self.saved[key]
            view = RecordView.of(self, walked, p, end_addr)
            self.record_views[key] = view if view is not None and view.P == P else None
        view = self.record_views[key]
        got = view.reuse(self, here, until) if view is not None else None
        if not got:
            return got
        k, new_end, shift = got
        rename = view.renamed(here.addr, shift)
        return False if rename is None else (k, new_end, rename)

    def _reused_by_events(self, here: Boundary, key: bytes, until) -> "tuple | bool":
        """`_reuse`'s comparison of the events gathered (`Events`, `windows_repeat`): ``(k, new_end, rename)`` as
        `_reused_by_records` gives it, or False."""
        _, _, _, P, p, walked, end_addr, _ = self.saved[key]
        records = self.r.trace.records
        if key not in self.views:       # what a reuse reads of the recorded window, read once
            W = Events(records, walked.at, 2 * P)
            allocs = np.flatnonzero(W.kind[:P] == ALLOC)
            made = W.id[allocs].astype(np.int64)
            by_id = np.argsort(made, kind="stable")     # (an id allocated twice: its last ALLOC, as `_rename`)
            self.views[key] = (W.part(0, P), W.alloc_positions()[P:],
                               (made[by_id], allocs[by_id]),       # its ALLOCs' ids, sorted, and places
                               _by_address(end_addr))             # who held each block after it
        W, follower, (made, place), holders = self.views[key]
        A = Events(records, here.at, 2 * P)
        if len(A) < 2 * P or old_frees_differ(W, A, P, walked.addr, here.addr):
            return False
        first = Events.joined(W, A.part(0, P))     # the first window (the second is compared below)
        if windows_repeat(first, P, 0, walked.addr, here.addr) < 1:
            return False
        q, t = np.arange(P), np.arange(P, 2 * P)
        a_pos = A.alloc_positions()
        same = (A.kind[t] == A.kind[q]) & (A.size[t] == A.size[q]) & (A.stream[t] == A.stream[q])
        want = np.where(a_pos[q] >= 0, a_pos[q] + P, follower)
        if not (same & ((A.kind[t] != FREE) | ((want >= 0) & (a_pos[t] == want)))).all():
            return False
        end = int(A.at[2 * P - 1]) + 1
        if until is not None and end > until:
            return False
        if here.mark + p >= len(self.marks):
            return False
        a0, a1 = Boundary(here.at, here.mark, here.addr), Boundary(int(self.marks[here.mark + p]), here.mark + p, {})
        n, lo, _ = self._record_windows(a0, a1, P, end, until, A)   # the first two lead, as a template and the walked
        k, new_end = self._windows(lo, 1, P, 2 + n, end + n * (a1.at - a0.at), until)
        got = _holders(here.addr, *holders)
        if got is None:
            return False            # a live object whose block no object held after the recorded window
        ids, h = got                # (each live object's block: who held it after the recorded window)
        y = np.maximum(np.searchsorted(made, h, side="right") - 1, 0)
        new = (made[y] == h) if len(made) else np.zeros(len(h), bool)   # ... allocated in it: renamed
        last = _events_before(records, new_end, P)
        return k, new_end, dict(zip(ids[new].tolist(), last.id[place[y[new]]].tolist()))

    # -- laps: a run broken periodically, folded a lap at a time (`Journal`) -----------------------------------
    def _lap_fold(self, here: Boundary, key: bytes, before: "Counts | None" = None, back: bool = False) -> None:
        """A fold from ``here`` is about to be made (a reuse; or a recorded window's, ``before`` the counts where
        it started): the journal's stretch walked since its last fold ends (recorded), or, where the run came
        ``back`` to a state a fold went through (a reuse, a resume: laps are runs that come back), the journal
        starts here -- for a policy whose fused loop records (`Replay.records_fused`: a stretch recorded costs
        about what walking it does), under the eager runtime (the only one a reuse, and so a lap, folds under).
        Where no lap comes round it costs 1-5 % of a small GPT's replay under `bestfit` and `cupy`; kept from the
        first window on, it cost them 10-24 %. Where this state's folds start is kept (`Journal.starts`)."""
        r = self.r
        journal = self.journal
        if journal is None:
            if not back or self.lap_misses >= LAP_TRIES or not r.records_fused or r.policy.renumber is not None \
                    or not r.runtime.eager:
                return
            journal = self.journal = Journal()
        else:
            self._lap_pause()       # (after a window: paused already)
            if self.journal is None:
                return
        starts = journal.starts.setdefault(key, [])
        starts.append((here, len(journal.parts), self._counts() if before is None else before))
        del starts[:-LAP_STARTS]

    def _lap_pause(self) -> None:
        """The journal's stretch walked since its last fold ends here (a fold, or a window recorded from here):
        kept as one of its parts, its `Recorder` ended, made into a `Program` only for a lap that comes round
        (`Recorder.program`: the check and the copies cost a tenth of a millisecond a stretch; a tape marked bad
        drops the journal now)."""
        journal = self.journal
        if journal is not None and journal.recorder is not None:
            recorder, journal.recorder = journal.recorder, None
            recorder.end()
            if any(tape.bad for tape in recorder.tapes.values()):
                self._drop_lap()
            elif recorder.adds_anything():
                journal.add(recorder, 1, len(recorder.tapes["clock"].incs))

    def _lap_walked(self, program: "Program | None") -> None:
        """A window walked that did not fold (``program`` its recording; None: it cannot be repeated exactly, and the
        journal is dropped) is the journal's next part; the journal records the walk on from here."""
        journal = self.journal
        if journal is None:
            return
        if program is None:
            self._drop_lap()
            return
        if program.adds_anything():
            journal.add(program, 1, len(program.incs["clock"]))
        self._lap_go_on()

    def _lap_folded(self, program: Program, k: int) -> None:
        """A fold added ``k`` windows of ``program``: the journal keeps it, and records the stretch walked from here."""
        journal = self.journal
        if journal is not None:
            journal.add(program, k, len(program.incs["clock"]))
            self._lap_go_on()

    def _lap_go_on(self) -> None:
        """Record the stretch walked from here onto a new `Recorder` (a journal past `LAP_INCREMENTS` starts
        afresh: its laps, longer than that, are not cut)."""
        journal, r = self.journal, self.r
        if journal.events > LAP_INCREMENTS:
            journal = self.journal = Journal()
        journal.recorder = Recorder(r.device, r.runtime, r.sections)

    def _lap_close(self, here: Boundary, key: bytes, p: int, until) -> bool:
        """A fold from ``here`` is asked (`_reuse`), whose state a fold in the journal started from (``b``, the
        most recent first, more than the state's window of ``p`` steps back, whose ALLOC counts the lap after
        ``here`` repeats: read for nothing): the journal from ``b`` is a lap, the template. If the laps after
        ``here`` repeat it record for record (`repeating_records`, every id ``D`` more: ``D`` the template's
        ALLOCs, its ids given in ALLOC order), and every FREE in it of an object older than the template frees
        the one holding the same block (by the two states' addresses) and allocated in the template, add them
        all as the template added (`Chain`), rename the live objects the template allocated, and move past them
        (True). A template whose records say no counts as a miss (`LAP_TRIES`).

        Record for record, as `_record_windows` argues for windows: the state at ``here`` is the state at ``b``;
        a FREE in a lap after ``here`` frees the object allocated ``R`` records after the one the FREE ``R`` records
        before freed, or, for an object older than ``here``, the one holding the same block as the template's freed
        object did at ``b`` (an object the template allocated: checked here, by address)."""
        journal, r = self.journal, self.r
        records, words = r.trace.records, _words(r.trace.records)
        stop = len(records) if until is None else min(len(records), until)
        for b, index, before in reversed(journal.starts.get(key, ())):
            q, R = here.mark - b.mark, here.at - b.at
            if q <= p or here.at + R > stop or not self.steps.counts_repeat(b.mark, q, q):
                continue
            got = self._lap_repeats(b, here, before, words, stop)
            if got is None:
                self.lap_misses += 1
                if self.lap_misses >= LAP_TRIES:
                    self._drop_lap()
                    return False
                continue
            k, D, (lo, ours), zero, after = got
            if k == 0:
                continue
            self._lap_pause()           # (the stretch walked since the last fold: the template's last part)
            if self.journal is None:
                return False            # (its tape was marked bad: the journal is dropped)
            parts = [(part.program() if isinstance(part, Recorder) else part, times)
                     for part, times in journal.parts[index:]]
            if any(program is None for program, _ in parts):    # (a stretch that cannot be repeated exactly)
                self._drop_lap()
                return False
            walked = [i for i in r.handles if lo <= i < lo + len(ours) and ours[i - lo]]    # live, made in the template
            self.journal = None
            self._skip(Chain(parts), k, before, after, here.at, here.at + k * R, 0, (q, here.mark + 1), zero,
                       {i: i + k * D for i in walked})
            return True
        return False

    def _lap_repeats(self, b: Boundary, here: Boundary, before: "Counts", words, stop: int) -> "tuple | None":
        """`_lap_close`'s comparison of the laps after ``here`` (up to ``stop``) with the template from ``b``: ``(k, D,
        (lo, ours), zero, after)`` -- the laps that repeat it (0: none whole before ``stop``), the ids' growth a lap,
        the ids the template allocated (``ours[i - lo]``), whether it allocates 0 bytes, the counts now -- or None
        where the template cannot be repeated."""
        r = self.r
        records = r.trace.records
        after = self._counts()
        D = int(self.steps.allocs[here.mark] - self.steps.allocs[b.mark])
        if after.walk.settled != before.walk.settled or words is None or D == 0:
            return None
        if any(here.addr.get(h + D) != a for h, a in b.addr.items() if h not in here.addr):
            return None         # an object freed in the lap whose follower holds another block: no record read
        kind = r.trace.kinds[b.at:here.at]
        allocs = np.flatnonzero(kind == ALLOC)
        ids = np.array(records["id"][b.at:here.at], np.int64)     # (one pass over the template's records)
        made, freed = ids[allocs], ids[np.flatnonzero(kind == FREE)]
        lo, hi = int(made.min()), int(made.max())
        if D <= hi - lo:
            return None         # (ids not given lap after lap)
        ours = np.zeros(hi - lo + 1, bool)
        ours[made - lo] = True
        inside = (freed >= lo) & (freed <= hi)
        older = freed[~inside | ~ours[np.clip(freed - lo, 0, hi - lo)]]    # freed, made before the template
        later = older + D           # what the next lap frees in their place: made in the template, same block
        if len(older) and not (((later >= lo) & (later <= hi)).all() and ours[later - lo].all() and all(
                b.addr.get(h) is not None and b.addr.get(h) == here.addr.get(g)
                for h, g in zip(older.tolist(), later.tolist()))):
            return None
        p, R = here.mark - b.mark, here.at - b.at
        laps = self.steps.repeating_for(b.mark, p, here.mark)  # (laps whose counts repeat: no more is read)
        if here.mark + laps * p < len(self.marks):
            stop = min(stop, int(self.marks[here.mark + laps * p]))
        q = repeating_records(words, here.at, R, D, stop) if laps else here.at
        k = (q - here.at) // R
        if k:
            self.steps.repeated(here.at, q, R, p, D)
        zero = bool((records["size"][b.at + allocs] == 0).any())   # the template's 0-byte ALLOCs
        return k, D, (lo, ours), zero, after

    def _drop_lap(self) -> None:
        """Stop keeping the journal (its totals go back to plain floats): no lap is cut from it."""
        if self.journal is not None:
            if self.journal.recorder is not None:
                self.journal.recorder.end()
            self.journal = None

    def _skip(self, program: Additions, k: int, before, after, start: int, end: int, P: int, how: tuple,
              zero: bool, rename: dict | None = None) -> None:
        """Add ``k`` windows as the recorded one added, rename the live ids (``rename``: ids to their new ones;
        None: `_rename`'s), and move the walk to ``end``; ``how``: (period in steps, the step it is said to start
        folding from)."""
        r = self.r
        w = r.walk
        program.repeat(k, r.device, r.runtime, r.sections, w.latency)
        for b, a, times in program.advances(before, after, k):
            w.advance(b.walk, a.walk, times)
            r.device.advance(b.device, a.device, times)
            r.runtime.advance(b.runtime, a.runtime, times)
            r.policy.fold_advance(b.policy, a.policy, times)
        if rename is None:
            self._rename(start, end, P)
        else:
            handles = r.handles
            handles.update({rename[i]: handles.pop(i) for i in [i for i in handles if i in rename]})
        passed = k * (after.walk.done - before.walk.done)
        skipped = r.move_to(end, None if zero else passed)   # without 0-byte ALLOCs, the chunks passed unread
        assert skipped == passed, (skipped, k)
        steps = int(np.searchsorted(self.marks, end) - np.searchsorted(self.marks, start))
        self.next_mark = int(np.searchsorted(self.marks, end))
        self.folded_events += skipped
        self.folded_steps += steps
        self.periods.append((*how, steps))

    def _rename(self, start: int, end: int, P: int) -> None:
        """The live ids after the skipped windows (`renaming`), applied to the engine's id -> handle table and to
        the gc runtime's records."""
        r = self.r
        rename = self.renaming(start, end, P)
        handles = r.handles
        moved = {rename[i]: handles.pop(i) for i in [i for i in handles if i in rename]}
        handles.update(moved)
        r.runtime.rename(rename)

    def renaming(self, start: int, end: int, P: int) -> dict:
        """``old id -> new id`` after the windows skipped from ``start`` to ``end``: an object allocated in the window
        walked last (the ``P`` events before ``start``) is the one allocated at the same place of the last window
        skipped (the ``P`` events before ``end``); an older one lived through the windows and is itself. (Where
        every window skipped was told by its records, ids one run, `_end_window` adds the windows' growth to the
        live ids instead, gathering no event: tests/test_fold.py holds it to this.)"""
        records = self.r.trace.records
        walked, skipped = _events_before(records, start, P), _events_before(records, end, P)
        allocs = np.flatnonzero(walked.kind == ALLOC)
        return dict(zip(walked.id[allocs].tolist(), skipped.id[allocs].tolist()))

    # -- what `replay` reports --------------------------------------------------------------------------
    def summary(self) -> dict | None:
        """How much was folded: events and steps skipped, the steps in the trace, the periods found."""
        if not self.folded_events:
            return None
        period, first, _ = self.periods[0]
        out = {"events": self.folded_events, "steps": self.folded_steps, "of_steps": len(self.marks),
               "period": period, "from_step": first, "folds": len(self.periods)}
        if self.gave_up_at is not None:
            out["gave_up_at_step"] = self.gave_up_at
        return out


_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def steps_of(trace) -> "Steps":
    """The trace's `Steps`, read once per trace (a tune or fit replays one trace many times)."""
    got = _STEPS.get(trace)
    if got is None:
        got = _STEPS[trace] = Steps(trace)
    return got


def _folded(kind: np.ndarray) -> np.ndarray:
    """Which records of these kinds are `FOLD_KINDS` (by table: a third of the time of a comparison per kind)."""
    return _FOLDED.take(kind)


_FOLDED = kind_table(FOLD_KINDS)
_FOLDED_BYTES = _FOLDED.view(np.uint8)      # (as `repeats` reads it)
#: What a window's comparison does not see (`Steps.unseen`): private-pool kinds, and a FREE flagged
#: ``IN_REQUEST`` (``kind | flags << 8``, as `Trace.kind_flags` holds them).
_UNSEEN = kind_table(np.array(POOL))
_UNSEEN_LEAST = min(POOL)
_HELD_MASK, _HELD_FREE = np.uint16(0xFF | IN_REQUEST << 8), np.uint16(FREE | IN_REQUEST << 8)


class Steps:
    """A trace's steps, as the folder reads them: the MARK indices, each step's ALLOCs and those before it,
    whether the trace holds what a window's comparison does not see (`unseen`) -- these in
    one pass over the kinds -- and, read only where the walk asks (a folded run never reads the steps it
    skips), the steps' signatures and which steps can take part in a fold that pays (`useful`)."""

    def __init__(self, trace):
        self.records = trace.records
        marks, allocs, unseen = [], [], False
        kind_flags = trace.kind_flags               # (kind and flags read once, kept with the trace)
        for start in range(0, len(kind_flags), trace_records.CHUNK):
            both = kind_flags[start:start + trace_records.CHUNK]
            kind = both.astype(np.uint8)            # the low byte
            at = np.flatnonzero(kind == MARK)
            marks.append(at + start)
            cuts = np.concatenate(([0], at))        # a MARK is no ALLOC: an empty piece's sum is 0
            allocs.append(np.add.reduceat(kind == ALLOC, cuts, dtype=np.int64))
            if not unseen:          # (no pool kind below the chunk's largest kind: no table read, a tenth the time)
                unseen = bool((kind.max(initial=0) >= _UNSEEN_LEAST and _UNSEEN.take(kind).any()) or (
                    (both & _HELD_MASK) == _HELD_FREE).any())
        self.marks = np.concatenate(marks) if marks else np.zeros(0, np.int64)
        n = len(self.marks)
        # pieces between MARKs, chunk after chunk: each chunk's first piece continues the step before it
        ends = np.cumsum([len(m) for m in marks]) if marks else np.zeros(0, np.int64)
        a = np.zeros(n + 1, np.int64)
        for end, pa in zip(ends, allocs):
            a[end + 1 - len(pa):end + 1] += pa   # from the step of the chunk's first piece (plus one)
        #: ALLOCs before each step's MARK; each step's ALLOCs
        self.allocs = np.cumsum(a)[:n]
        self.counts = a[1:, None]
        #: FREEs made inside a request (flag ``IN_REQUEST``: the runtime holds them for that request) or
        #: private-pool events (`POOL`: the pools' state is not in `Policy.fold_state`)
        self.unseen = unseen
        self.sig = np.zeros((n, 2), np.uint64)
        self.known = np.zeros(n, bool)          # which steps' signatures are read (or `repeated`)
        self.pmax = min(MAX_PERIOD, n // 5) if n > 2 else 0
        self._table = None                      # `repeating_steps` once every signature is read
        self._differ: dict[int, list[int]] = {}     # period p -> steps t seen to differ from step t + p (sorted)
        self._same: dict[int, tuple[int, int]] = {}     # period p -> (a, b): steps a..b-1 equal those p after (`_run`)
        self._may = None                        # `may_repeat`'s answer, once asked
        self._breaks: dict[int, np.ndarray | None] = {}     # period -> `_count_breaks` (None: past the bound)
        self._kept = 0                          # steps held in ``_breaks``
        self._by_reach: dict[int, np.ndarray] = {}  # reach -> `_candidates`

    def __len__(self) -> int:
        return len(self.marks)

    def may_repeat(self) -> bool:
        """False where no fold can pay: not one step has the ALLOC counts of the steps a period after it for
        ``4p`` steps (`repeating_steps` on the counts, the shortest periods first, up to the first found; equal
        steps have equal counts). A run whose shapes change every step is then walked with no folder at all: not
        stopped at each boundary, nothing fingerprinted (give up early: issue 31 asks at most 5 % over
        ``--no-fold`` where nothing repeats). Answered only for up to `COUNTED` steps (it costs steps x periods
        where nothing repeats); a longer trace may repeat."""
        if self._may is None:
            self._may = len(self) > COUNTED or bool(repeating_steps(self.counts, first=True).any())
        return self._may

    # -- signatures, read where asked -----------------------------------------------------------------
    def read(self, a: int, b: int) -> np.ndarray:
        """The signatures of steps ``a`` to ``b`` (clipped to the trace's), reading those not read yet, and
        short steps after them up to `SIG_READ` records (the boundaries ask step after step)."""
        n = len(self.marks)
        a, b = max(0, a), min(n, b)
        if self.known[a:b].all():           # the common case: asked again (a boundary reads a few steps at a time)
            return self.sig[a:b]
        todo = np.flatnonzero(~self.known[a:b]) + a
        if len(todo):
            ahead = int(np.searchsorted(self.marks, self.marks[todo[-1]] + SIG_READ))
            todo = np.flatnonzero(~self.known[a:max(b, min(n, ahead))]) + a
            runs = np.split(todo, np.flatnonzero(np.diff(todo) > 1) + 1)
            for run in runs:
                self._signatures(int(run[0]), int(run[-1]) + 1)
            if self.known.all() and self._table is None:
                self._table = repeating_steps(self.sig)
        return self.sig[a:b]

    def _signatures(self, a: int, b: int) -> None:
        """Read the signatures of steps ``a`` to ``b`` (one run of records): a hash of each step's events'
        kinds, sizes, streams, places in the step and, for a FREE, how many ALLOCs lie between its object's and
        it (by the ids, dense in ALLOC order in every recorder's traces), with their count. Equal steps have
        equal signatures (with ids given otherwise, repeats may differ and are then not folded), so a boundary
        tries the exact comparison only where the steps after it repeat those after the earlier one."""
        marks, n = self.marks, len(self.marks)
        lo, hi = int(marks[a]), int(marks[b]) if b < n else len(self.records)
        allocs = int(self.allocs[a])
        step, in_step = a - 1, 0            # the step of the records before the next MARK; its fold events read
        sig = self.sig
        words = _words(self.records)
        if repeats.COMPILED and words is not None:      # the same numbers, one C pass (`repeats`)
            repeats.signatures(words, _FOLDED_BYTES, lo, hi, step, allocs, sig)
            self.known[a:b] = True
            return
        C = [np.uint64(c) for c in (*repeats.KEYS, 32, 16, 0xFFFF)]
        for s in range(lo, hi, SIG_READ):
            rec = np.asarray(self.records[s:min(hi, s + SIG_READ)])
            kind = rec["kind"].copy()                   # read once: the passes below go over a compact copy
            keep = np.flatnonzero(_folded(kind))
            cut = np.searchsorted(keep, np.flatnonzero(kind == MARK))    # the fold events before each MARK
            m = len(keep)
            if not m:
                step, in_step = step + len(cut), in_step if not len(cut) else 0
                continue
            starts = np.concatenate(([0], cut))                 # where each piece's fold events start
            pieces = np.diff(np.append(starts, m))
            head = words[s:s + len(rec), 0][keep] if words is not None else None    # kind, stream, id at once
            k = kind[keep].astype(np.uint64)
            is_alloc = k == ALLOC
            before = np.cumsum(is_alloc) - is_alloc + allocs            # the ALLOCs before each
            allocs = int(before[-1]) + bool(is_alloc[-1])
            place = np.arange(m) - np.repeat(np.concatenate(([-in_step], cut)), pieces)   # its place in its step
            ids = head >> C[7] if head is not None else rec["id"][keep].astype(np.uint64)
            stream = (head >> C[8]) & C[9] if head is not None else rec["stream"][keep].astype(np.uint64)
            with np.errstate(over="ignore"):
                v = k * C[0]
                v ^= rec["size"][keep] * C[1]
                v ^= stream * C[2]
                v ^= (before.astype(np.uint64) - ids) * (k == FREE) * C[3]   # two's complement, as an int64's
                v ^= place.astype(np.uint64) * C[4]
                v ^= v >> C[6]
                v *= C[5]
            firsts = starts[starts < m]                 # where each step's events start here (sorted)
            firsts = firsts[np.diff(firsts, prepend=-1) != 0]
            steps = step + np.searchsorted(starts, firsts, side="right") - 1    # the MARKs before them
            with np.errstate(over="ignore"):
                sig[steps, 0] += np.add.reduceat(v, firsts)
            sig[steps, 1] += np.diff(np.append(firsts, m)).astype(np.uint64)
            step, in_step = step + len(cut), (in_step + m if not len(cut) else m - int(cut[-1]))
        self.known[a:b] = True

    def repeated(self, lo: int, hi: int, R: int, p: int, D: int) -> None:
        """Records ``lo`` to ``hi`` are the ``R`` records before each again, with every id ``D`` more
        (`repeating_records`, which a fold reads through the windows it skips). Where the ``R`` records before
        ``lo``'s first MARK hold ``p`` steps (so do any ``R`` of them from ``lo - R`` to ``hi``) and ``D`` ALLOCs
        (so each FREE lies as far from its object's ALLOC), the steps wholly among them have the signatures of
        the steps ``p`` before, known without reading them (the boundaries after a fold ask about the steps it
        skipped, `useful` looking behind)."""
        marks = self.marks
        t0 = int(np.searchsorted(marks, lo))            # the first step from a MARK at or after lo
        t1 = int(np.searchsorted(marks, hi)) - 1        # the steps before it end at a MARK before hi
        if t1 <= t0 or t0 < p or int(marks[t0] - marks[t0 - p]) != R \
                or D != int(self.allocs[t0] - self.allocs[t0 - p]) or not self.known[t0 - p:t0].all():
            return
        todo = np.flatnonzero(~self.known[t0:t1]) + t0
        self.sig[todo] = self.sig[t0 - p + (todo - t0) % p]
        self.known[todo] = True
        if self.known.all() and self._table is None:
            self._table = repeating_steps(self.sig)

    def long_period(self, m: int) -> int | None:
        """The shortest period ``p`` of the steps' breaks from step ``m``: the ALLOC counts of the ``3p`` steps from
        ``m`` (at least ``2p``, to the trace's end) are those of the steps ``p`` after them, and not all equal within
        ``p`` (an evaluation every 100 steps and a logging step every 50: 100). None where there is none up to
        `MAX_PERIOD` (a run of one shape). A `counts_repeat` a period tried."""
        c, n = self.counts[:, 0], len(self.marks)
        if m >= n:
            return None
        differ = np.flatnonzero(c[m:] != c[m])
        if not len(differ):
            return None
        for p in range(int(differ[0]) + 1, self.pmax + 1):     # (a shorter period holds no break: all equal)
            span = min(3 * p, n - m - p)
            if span < 2 * p:
                return None
            if self.counts_repeat(m, p, span):
                return p
        return None

    # -- which steps can take part in a fold ------------------------------------------------------------
    def useful(self, m: int, longest: int | None = None) -> bool:
        """`repeating_steps`'s answer for step ``m`` (but see below for long periods ahead of an early step),
        reading only the signatures it needs: those of the ``p``
        steps either side for the periods ``p`` whose step equals ``m`` (the others cannot answer yes), then,
        for each such ``p``, the ``4p`` steps after, as far as they are equal; periods up to 8 first, then up to
        32, 128 and `MAX_PERIOD` (a fixed-shape run answers at period 1 or 2, having read a few steps), or up to
        ``longest`` (the answer for those periods only; once every signature is read, the table's). Ahead of
        ``m``, only periods up to ``max(8, m)``: a longer one would read up to ``5p`` steps the walk may never walk
        (a first step unlike the rest read 200 steps ahead, a tenth of a cheap run's walk); its fold is found a
        period later, looking behind from ``m + p``, or, where the run is too short for that (``4p`` steps from a
        step before ``p``), not at all: such a fold skips at most two periods."""
        if self._table is not None:
            return bool(self._table[m])
        n, pmax = len(self.marks), self.pmax if longest is None else min(self.pmax, longest)
        if not pmax or (longest is not None and pmax <= CANDIDATE_REACH and n * pmax <= CANDIDATE_COUNTS
                        and not self._candidates(pmax)[m]):
            return False
        for p in sorted(self._same):        # a run found before, read on as far as signatures are read: O(1) mostly
            if p > pmax:
                break
            if (m + 5 * p <= n and p <= max(8, m) and self._run(p, m, 4 * p)) or \
                    (m >= p and m + 4 * p <= n and self._run(p, m - p, 4 * p)):
                return True
        counts = self.counts                # steps of other ALLOC counts have other signatures: not read
        done = 0
        for reach in (8, 32, 128, pmax):    # the short periods first: most folds are found there, reading little
            reach = min(reach, pmax)
            if reach <= done:
                continue
            lo = max(0, m - reach)
            far = min(reach, max(8, m))     # ahead, periods up to the steps walked (else found from behind later)
            ahead = 1 + np.flatnonzero((counts[m + 1:m + far + 1] == counts[m]).all(axis=1))  # m starts a run
            behind = m - lo - np.flatnonzero((counts[lo:m] == counts[m]).all(axis=1))         # m - p starts one
            ahead, behind = ahead[ahead > done], behind[behind > done]
            ahead = ahead[self.counts_repeat_all(np.full_like(ahead, m), ahead, 4 * ahead)]
            behind = behind[self.counts_repeat_all(m - behind, behind, 4 * behind)]
            if len(ahead) + len(behind) > 8:    # many: read the signatures either side at once, keep the equal
                sig = self.read(lo, m + far + 1)
                ahead = ahead[(sig[m - lo + ahead] == sig[m - lo]).all(axis=1)]
                behind = behind[(sig[m - lo - behind] == sig[m - lo]).all(axis=1)]
            for p, q in sorted([(int(p), m) for p in ahead] + [(int(p), m - int(p)) for p in behind]):
                if q + 5 * p <= n and self._equal(q, q + p, 4 * p):
                    return True
            done = reach
        return False

    def _run(self, p: int, q: int, k: int) -> bool:
        """Whether steps ``q`` to ``q + k`` are known to have the signatures of the steps ``p`` after them, by the
        run of such steps `_equal` last found for ``p``, read on over the signatures read since (up to `RUN_READ`
        steps a call). A fixed-shape run answers `useful` here at each boundary, for one comparison of signatures
        already read at most, where the periods' counts and signatures were compared anew (0.1-0.2 ms a boundary,
        as much as the fingerprint it guards). Yes only where `_equal` would say yes."""
        a, b = self._same[p]
        if q < a:
            return False
        if q + k > b:
            known, n = self.known, len(self.marks)
            hi = min(n - p, b + RUN_READ)
            if hi > b:
                both = known[b:hi] & known[b + p:hi + p]
                stop = b + (int(np.argmin(both)) if not both.all() else hi - b)
                differ = (self.sig[b:stop] != self.sig[b + p:stop + p]).any(axis=1)
                b = b + int(np.argmax(differ)) if differ.any() else stop
                self._same[p] = (a, b)
        return q + k <= b

    def _candidates(self, reach: int) -> np.ndarray:
        """Which steps `useful` may answer yes for with periods up to ``reach``, by the ALLOC counts alone
        (`repeating_steps` of the counts): a step the counts rule out is answered at once. Made once a reach
        (O(steps x reach)): the boundaries of a folded run ask with one reach, a few cycles' (`Folder._boundary`'s
        ``longest``)."""
        got = self._by_reach.get(reach)
        if got is None:
            got = self._by_reach[reach] = repeating_steps(self.counts, reach)
        return got

    def counts_repeat(self, q: int, p: int, n: int) -> bool:
        """Whether the ``n`` steps from step ``q`` have the ALLOC counts of the steps ``p`` after them (and the trace
        holds them): what equal steps need, read for nothing. `useful` reads no signature where the ``4p`` steps it
        would compare say no (the steps about an evaluation, each period looked for); the folder asks it where a run
        may come back to a cycle (`Folder._coming_back`) and whether a window can repeat (`Folder._differs`).
        O(log steps) by the steps where the counts change with period ``p`` (`_count_breaks`), else O(n)."""
        if q < 0 or q + n + p > len(self.marks):
            return False
        breaks = self._count_breaks(p) if p > 0 else None
        if breaks is None:
            c = self.counts
            return bool((c[q:q + n] == c[q + p:q + p + n]).all())
        k = int(np.searchsorted(breaks, q))
        return k == len(breaks) or breaks[k] >= q + n

    def counts_repeat_all(self, q: np.ndarray, p: np.ndarray, n: np.ndarray) -> np.ndarray:
        """`counts_repeat` for each ``(q, p, n)`` of three arrays (`useful` asks for dozens of periods at each
        boundary): one gather of the counts compared where that is small (`COUNTS_AT_ONCE`), else one by one."""
        if not len(p) or len(p) * int(n.max()) > COUNTS_AT_ONCE:
            return np.array([self.counts_repeat(*x) for x in zip(q.tolist(), p.tolist(), n.tolist())], bool)
        c, N = self.counts[:, 0], len(self.marks)
        t = q[:, None] + np.arange(int(n.max()))         # the steps compared, a row per question
        inside = t < (q + n)[:, None]
        a, b = np.clip(t, 0, N - 1), np.clip(t + p[:, None], 0, N - 1)     # (out of the trace: answered no)
        return (q >= 0) & (q + n + p <= N) & ((c[a] == c[b]) | ~inside).all(axis=1)

    def repeating_for(self, q: int, p: int, m: int) -> int:
        """How many whole periods of ``p`` steps from step ``m`` have the ALLOC counts of the ``p`` steps before
        each, the steps from ``q`` (at most ``m``) on repeating with period ``p`` (a `Folder` lap: the laps after the
        walked one that may repeat it, read no further)."""
        n = len(self.marks)
        whole = max(0, (n - m) // p)
        breaks = self._count_breaks(p)
        if breaks is None:
            while whole and not self.counts_repeat(q, p, m - q + whole * p - p):
                whole -= 1
            return whole
        k = int(np.searchsorted(breaks, q))
        if k < len(breaks):         # steps t and t + p differ: no lap holding t + p repeats
            whole = min(whole, max(0, (int(breaks[k]) + p - m) // p))
        return whole

    def _count_breaks(self, p: int) -> np.ndarray | None:
        """The steps ``t`` whose ALLOC count is not step ``t + p``'s, kept per period asked (a boundary asks about
        dozens of periods, each boundary about the same ones): O(steps) once a period, then each `counts_repeat` a
        binary search. At most `COUNT_BREAKS` kept in all (a run whose counts never repeat would keep a step per
        step and period): past it, None (compared directly)."""
        got = self._breaks.get(p)
        if got is None and p not in self._breaks:
            c = self.counts[:, 0]
            got = np.flatnonzero(c[:-p] != c[p:]) if p < len(c) else np.zeros(0, np.int64)
            if self._kept + len(got) > COUNT_BREAKS:
                got = None
            else:
                self._kept += len(got)
            self._breaks[p] = got
        return got

    def _equal(self, a: int, b: int, n: int) -> bool:
        """Whether the ``n`` steps from ``a`` have the signatures of the ``n`` from ``b`` (``a < b``), read in
        doubling pieces up to the first difference. A difference found is kept (by ``b - a``): the boundaries
        before a break ask about the same steps again, period after period, and are answered without reading."""
        p = b - a
        seen = self._differ.get(p)
        if seen:
            k = bisect_left(seen, a)
            if k < len(seen) and seen[k] < a + n:
                return False
        done, piece = 0, 8
        while done < n:
            take = min(n - done, piece)
            if p <= take:                   # the two pieces overlap: one read
                s = self.read(a + done, b + done + take)
                x, y = s[:take], s[p:p + take]
            else:
                x, y = self.read(a + done, a + done + take), self.read(b + done, b + done + take)
            differ = (x != y).any(axis=1)
            if differ.any():
                insort(self._differ.setdefault(p, []), a + done + int(np.argmax(differ)))
                return False
            done += take
            piece *= 2
        a0, b0 = self._same.get(p, (a, a))
        self._same[p] = (min(a, a0), max(a + n, b0)) if a <= b0 and a + n >= a0 else (a, a + n)
        return True


def repeating_steps(sig: np.ndarray, most: int = MAX_PERIOD, first: bool = False) -> np.ndarray:
    """For each step ``m``, whether it can start a fold that pays (a template of ``p`` steps from ``m``, up to
    ``most`` (`MAX_PERIOD`), then the period recorded, then at least two more to skip: ``4p`` steps with the
    signatures of the steps ``p`` before them) or be where such a template repeats (``m - p`` can start one). Only
    these boundaries are fingerprinted, so a short trace, or one whose steps never repeat, costs no fingerprint.
    ``sig``: a row a step (signatures, or ALLOC counts); ``first``: up to the shortest period that has any (whether
    any step can is then ``.any()``). Compiled, one C pass a period (`repeats.repeating_table`), else `_starts`'s."""
    out = np.zeros(len(sig) + 1, bool)
    if repeats.COMPILED:
        repeats.repeating_table(sig.view(np.uint64), most, out.view(np.uint8), first)
        return out
    for p, starts in _starts(sig, most):
        out[starts] = True
        out[starts + p] = True
        if first and len(starts):
            break
    return out


def _starts(sig: np.ndarray, most: int = MAX_PERIOD):
    """``(p, steps)`` for each period ``p`` up to ``most`` (`MAX_PERIOD`), shortest first: the steps from which
    ``4p`` steps have the signatures of the steps ``p`` after them (`repeating_steps`; O(steps) a period)."""
    n = len(sig)
    for p in range(1, min(most, n // 5) + 1):
        eq = (sig[:-p] == sig[p:]).all(axis=1)          # step q equals step q + p
        q = np.arange(len(eq))
        bad = np.append(np.flatnonzero(~eq), len(eq))
        run = bad[np.searchsorted(bad, q)] - q          # how many steps from q on equal the steps p later
        yield p, np.flatnonzero(run >= 4 * p)


def _words(records) -> np.ndarray | None:
    """The records as rows of five 64-bit words (kind, flags, stream and id in the first; size the third), or
    None where they are not laid out so (a copy of another layout)."""
    rec = np.asarray(records)
    if rec.dtype != RECORD_DTYPE or not rec.flags.c_contiguous:
        return None
    return rec.view(np.uint64).reshape(-1, 5)


def repeating_records(words: np.ndarray, end: int, R: int, D: int, stop: int) -> int:
    """The first trace index from ``end`` on (``stop`` if none before it) whose record is not the one ``R``
    before it again: the same kind, flags, stream and size, and an id ``D`` more where the record ``R`` before
    it has an id. ``words`` are the records' words (`_words`); read a few periods at a time, or, for a period
    longer than `SPAN` (a `Folder` lap), `SPAN` records at a time (a whole period's temporaries left the cache:
    twice the time). Compiled, one C pass (`repeats.repeating`) gives the same index."""
    if repeats.COMPILED:
        return repeats.repeating(words, end, R, D, stop)
    if R > SPAN:
        no_id, shift = np.uint64(NO_ID), np.uint64(D << 32)
        x = end
        while x < stop:
            y = min(stop, x + SPAN)
            back = words[x - R:y - R, 0]
            same = np.subtract(words[x:y, 0], back) == np.where(back >> np.uint64(32) != no_id, shift, np.uint64(0))
            same &= words[x:y, 2] == words[x - R:y - R, 2]
            if not same.all():
                return x + int(np.argmin(same))
            x = y
        return stop
    first = words[end - R:end, 0]
    pattern = np.where(first >> np.uint64(32) != np.uint64(NO_ID), np.uint64(D << 32), np.uint64(0))
    reps = max(1, SPAN // R)
    tiled = np.tile(pattern, reps)
    x = end
    while x < stop:
        y = min(stop, x + reps * R)
        same = np.subtract(words[x:y, 0], words[x - R:y - R, 0]) == tiled[:y - x]   # (strided: no copy first,
        same &= words[x:y, 2] == words[x - R:y - R, 2]                             # half the time)
        if not same.all():
            return x + int(np.argmin(same))
        x = y
    return stop


def _by_address(addr: dict) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, addresses)`` of an ``id -> address`` table, in address order (searched with ``searchsorted``)."""
    n = len(addr)
    ids, at = np.fromiter(addr.keys(), np.int64, n), np.fromiter(addr.values(), np.int64, n)
    order = np.argsort(at)
    return ids[order], at[order]


def _holders(addr: dict, holder: np.ndarray, held_at: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(ids, holders)``: the live objects of ``addr`` (id -> address) in address order, and who held each one's
    block after a recorded window (``holder``/``held_at``: `_by_address` of that window's end), or None where a
    live object's block was nobody's then (a reuse's renaming)."""
    ids, at = _by_address(addr)
    x = np.minimum(np.searchsorted(held_at, at), max(0, len(held_at) - 1))
    if len(at) and (not len(held_at) or not (held_at[x] == at).all()):
        return None
    return ids, holder[x]


def _count_between(records, lo: int, hi: int) -> int:
    """How many `FOLD_KINDS` records lie in trace indices [lo, hi)."""
    n = 0
    while lo < hi:
        rec = records[lo:min(hi, lo + READ)]
        n += int(np.count_nonzero(_folded(rec["kind"])))
        lo += len(rec)
    return n


def _reading(n: int) -> int:
    """Records to read for ``n`` more `FOLD_KINDS` events: twice as many (most records are), up to `READ`."""
    return min(READ, max(4096, 2 * n))


def _events_before(records, end: int, n: int) -> Events:
    """The last ``n`` `FOLD_KINDS` records before trace index ``end``."""
    lo = end
    got = 0
    while lo > 0 and got < n:
        step = min(lo, _reading(n - got))
        rec = records[lo - step:lo]
        got += int(np.count_nonzero(_folded(rec["kind"])))
        lo -= step
    ev = Events(records, lo, got)
    keep = slice(max(0, len(ev) - n), len(ev))
    for name in ("at", "kind", "id", "size", "stream"):
        setattr(ev, name, getattr(ev, name)[keep])
    return ev


def _index_after(records, lo: int, n: int) -> int:
    """The trace index just past the ``n``-th `FOLD_KINDS` record from ``lo``."""
    while True:
        rec = records[lo:lo + READ]
        keep = np.flatnonzero(_folded(rec["kind"]))
        if len(keep) >= n:
            return lo + int(keep[n - 1]) + 1
        n -= len(keep)
        lo += len(rec)


