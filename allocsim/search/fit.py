"""The capacity frontier: the smallest pool cap from which a policy is safe.

OOM is not monotone in the cap (a smaller cap can make a pool flush or collect
earlier and so pass where a larger one fails), so a bisection finds a passing
cap, not a threshold. `fit_capacity` reports the **safe** cap: the smallest
point of its grid (multiples of ``resolution``, and the unlimited peak on top)
from which every grid point up to the unlimited peak replays without OOM —
each one certified by a replay, none assumed.

Certification: a replay depends on the cap only through the comparisons of
``reserved + n`` with the device's limit (device mallocs, `fits`, and a
policy's own comparisons reported by `SimulatedDevice.note`): the replay at C
goes exactly the same way at every C' from the largest granted need S to the
smallest refused need F minus one, so one replay certifies the grid points of
[S, F − 1] (`ReplayResult.certified_limits`). The walk starts from the
unlimited replay (which certifies from the largest need it granted up: its peak, or more where a policy
asked for more than it took), probes the grid point just
below the lowest certified one, and stops at the first OOM: every replay
certifies at least its own cap, and usually many more.

The rule for policies that read the cap otherwise (checked module by module):
`cupy`'s limit (``min(limit, cap)``) and `knet`'s soft-limit cap (device memory
− headroom) report their comparisons through ``note``, so they certify like
the rest, and so does `torch`'s allowed memory (the cap, checked before cudaMalloc; its expandable segments'
range is 9/8 of the capacity, or of 2**44 with none, never of the cap: `tests/test_torch_pressure.py` holds a
trace whose replays differed within one certified interval when it was the cap's);
`torch` pins the device where it reads the cap's value itself: a GC threshold with
the cap as allowed memory, or ``per_process_memory_fraction`` with no device capacity
(a replay certifies only its own cap: the walk then probes every grid point it passes, the unlimited peak first;
where that fails no cap up to it is safe, and with ``top`` the walk starts from ``top``); the oracle
makes one device malloc of its planned heap; the real GPU policies are not fitted.

Budget: a policy that fills its pool up to the cap behaves differently at almost every
grid point (its replays certify a MiB or less), so its walk costs about one replay per
grid point — tens of thousands under ``--runtime gc``, where the pools grow to the
device. The walk therefore stops after ``max_replays`` replays (0: no limit): the cap
it reached is still safe (everything above it is certified) but may not be the
threshold, and ``threshold`` is then False.

Parallel walks (``-j``): a walk is a sequence of replays each chosen by the one before, so
`fit_many` runs every walk of a command together on the pool, each walk's next cap first;
a worker left over replays a cap a walk will need if the usual outcome comes (a probe down
from the peak certifies its own grid point alone, a bisection probe fails: `Walk.ahead`).
Each walk reads the outcomes in its own order, so its answer and replay count are those of
the walk alone; a replay ahead that the walk skips is work lost, never a different answer.

Up to a cap (``top``, `tune --cap`): the question is then the smallest allowed memory from which every
larger one *up to the cap* fits. Where the unlimited peak lies above the cap, the walk goes on from a
replay at the cap itself (which certifies its own cap and below, down to the largest need it granted),
not from the peak: the caps above it cost no replay (a setting whose peak lies far above the cap used to
spend its whole budget up there). Where the peak lies below the cap, the walk is the one without ``top``.

To a few significant figures (``digits``, `tune`'s "fits on"): the walk down certifies a MiB or a few per
replay where a policy fills its pool up to the cap (hundreds of replays over a GiB), which no user reads to
the byte. With ``digits``, after the start (the unlimited replay, and the cap's where the peak lies above
it) the walk bisects between the largest cap known to fail (LOAD − 1 at first) and the smallest known to fit
(the lowest its replay certified) until the two lie within one unit of the start's ``digits``-th
significant figure (`step_of`; two grid points at least). Its first probe is a step below the start (where
that fails, as on most walks without a cap, the walk ends there); a probe that passes certifies [its lowest,
its cap] and becomes the smallest known to fit, one that fails the largest known to fail. The answer is a cap
certified to fit with one known to fail less than a step below it (``fails_bytes``) — not that every larger
one fits (OOM is not monotone in the cap: between the answer and the start a cap no probe replayed may
fail; the exact walk above says so, and ``allocsim fit`` keeps it). It takes about 2 + log2(range / step)
replays: 7–10 at three figures, where the walk down took hundreds.

Resumed probes: a probe under cap C' goes exactly as an earlier probe of its walk under C up to the first limit
comparison that comes out otherwise, so it can go on from that probe's state instead of from event 0. Each probe
reads the device's certified interval (`SimulatedDevice.certified`: the largest need granted so far, the smallest
refused) at `TRAIL_BOUNDS` even points of the trace and leaves a few checkpoints (`Replay.checkpoint`) at the last
of them before the point where the previous probe's intervals say a cap the walk asks in its next two replays
(`Walk.task`) leaves the interval (a cap above this one leaves where this one is refused: where the previous probe
grew past this limit); the next probe in the same process resumes from the last checkpoint whose interval holds its
limit (`_Trail`). The intervals only narrow as a replay goes, so the checkpoints that hold a limit come first.
Results, answers and replay counts are those of the walk from event 0 (`tests/test_fit_resume.py` compares every
probe whole, and fails with either half of the rule left out). Why it holds, path by path, for what `_resumable`
lets resume (a trace of `TRAIL_LEAST` records or more, where it pays): the built-in `torch` policy (a subclass may
read the cap otherwise) on the simulated device with a capacity, its limit not pinned, under a cap (never the
unlimited replay, whose limit the recorded SET_LIMITs change, nor a checkpoint of it), eager, no timeline
(`Replay.can_checkpoint`):

- the device: `malloc` and `map` compare ``reserved + n`` with the limit, a refusal noted, a grant raising the peak
  reserved to it; `fits` notes both; the placement (recorded addresses, the driver model) runs only after a grant
  and never reads the limit; `free` and `reserve_address_range` compare nothing; `set_cap` runs only with no cap.
- `torch`: it reads the cap only in `AllowedMemory` and in ``total_memory``. The allowed memory is the cap below the
  capacity, compared and noted before the device call; with a fraction it is a fraction of the capacity (not of the
  cap: with no capacity the device is pinned and nothing resumes); the GC threshold's "allowed" is the cap itself
  (pinned) or that fixed fraction. ``total_memory`` (expandable segments' range) is the capacity. A cap below the
  capacity and one at or above it check otherwise (the allowed memory, or none), so a checkpoint is taken up only
  by a cap on the same side of the capacity.
- the engine: a recorded failed request served keeps the device's limit in the result; a resume names its own
  (`Replay.resume`'s ``own_limit``), as it keeps its own cap.
- private pools (`TorchPoolsPath`): no pool path reads the cap (routing, the no-flush rule while a pool is begun,
  releases and a MemPool's own empty_cache follow the trace's pool events), and a checkpoint copies the pools'
  state with the rest (`TorchCachingAllocator.checkpoint`). Resuming pays where the walk is long (a trace of 12,000
  records with three kept graph pools: the exact walk 0.61x, the bisection 0.80x the CPU from event 0) and costs
  about nothing where no probe resumes (a periodic capture-and-release trace, 11,000-31,000 records: 1.00-1.10x,
  as noisy as the bisection's two probes); `benchmarks/bench_fit_resume.py`.
- excluded: the other policies (none copies its own state yet), `--runtime gc`, pinned replays, plug-ins.

Islands: below the safe cap, a bisection between LOAD − 1 (always fails:
reserved ≥ allocated ≥ live) and the safe cap looks for a smaller passing cap;
one found is reported as ``island_bytes`` (a cap that passes, below one that
fails), never as the answer.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

from ..engine.spec import PolicySpec
from .sweep import Cell, Settings, cached_trace, run_cell, trace_file, trace_on_disk
from ..trace.scopes import sure_load
from ..params import count_argument
from ..units import parse_size

MiB = 1 << 20
MAX_REPLAYS = 1000      # per policy, for the walk down from the peak


@dataclass(frozen=True)
class Probe:
    """One replay of the walk: passed (no OOM), the lowest cap certified to behave the same, and the
    unlimited replay's LOAD and peak reserved (what the walk starts from)."""

    passed: bool
    lowest: int
    load: int
    peak: int
    pinned: bool = False        # it certifies its own cap alone (the policy read the cap's value)
    survived: int = 0           # OOMs the program survives (a TRY scope, CATCHES_OOM): it lives through them
    least: int | None = None    # the least memory any replay that lives needs (`sure_load`; None: LOAD)


def probe(args) -> Probe:
    """Replay ``(trace, spec, cap, runtime, settings[, after])`` (a worker's task: the trace stays loaded,
    `cached_trace`); ``after``: the caps the walk may ask next, where this replay leaves checkpoints for them
    (`_Trail`). A replay that can resume goes on from the newest trail of its walk in this process, from the
    last checkpoint its cap shares (module docstring: resumed probes)."""
    trace, spec, cap, runtime, settings, *after = args
    cell = Cell(trace, spec, cap, runtime)
    r = _resumable(cell, settings or Settings())
    if r is None:
        row, res = run_cell(cell, settings, full=True)
        lo, hi = res.certified_limits
        return Probe(not row["ooms"], lo, row["load_bytes"], row["peak_reserved_bytes"], lo == hi,
                     row["caught_ooms"] or 0, sure_load(cached_trace(trace)))
    try:
        res = _Trail.walk(r, cell, after[0] if after else ())
    finally:
        r.close()
    lo, hi = res.certified_limits
    return Probe(not res.ooms, lo, res.load_bytes, res.peak_reserved_bytes, lo == hi, res.caught_ooms,
                 sure_load(r.trace))


def _resumable(cell: Cell, settings: Settings):
    """A `Replay` of ``cell`` that can leave and take checkpoints at another cap (`_Trail`), or None: the
    policies and device paths whose replay reads the cap only through the limit comparisons the device
    records (module docstring: resumed probes), and nothing else."""
    from ..machine.device import SimulatedDevice
    from ..policies.torch import TorchCachingAllocator
    from ..engine.replay import Replay
    t = cached_trace(cell.trace)
    if cell.policy.policy_class() is not TorchCachingAllocator or len(t) < TRAIL_LEAST:
        return None
    r = Replay(t, cell.policy, settings.replay, runtime=cell.runtime, cap=cell.cap, capacity=cell.capacity)
    dev = r.device
    if type(dev) is SimulatedDevice and dev.capacity is not None and not dev.pinned and r.can_checkpoint():
        return r
    r.close()
    return None


#: A trace of fewer records is replayed from event 0 (a probe of it takes 10-15 ms: what a resume skips there, the
#: checkpoint and the copy cost; `benchmarks/bench_fit_resume.py` on the pressure traces, 7,000 records).
TRAIL_LEAST = 10_000
#: The device's certified interval is read up to this many times a probe, at even trace indices (`_Trail`) ...
TRAIL_BOUNDS = 32
#: ... at least this many records apart (a window costs about 40 us to stop and read at).
TRAIL_WIDTH = 500
#: A probe leaves at most this many checkpoints of its own: each costs about what walking 500 events does, or 5-10 %
#: of a shipped trace's replay, and a resume from it as much again.
TRAIL_MARKS = 3
#: A checkpoint is left only this many records past the last one the trail holds: the events a resume from it skips
#: must pay for the checkpoint and the resume's copy (about 550 events' walk on the shipped traces, 1-2 ms).
TRAIL_GAIN = 1000
#: Walks whose newest trail a process keeps (a trail holds up to `TRAIL_BOUNDS` checkpoints).
TRAILS_KEPT = 8
_TRAILS: dict = {}


class _Trail:
    """What a probe leaves for the next probe of its walk in this process: ``bounds[b]``, the device's certified
    interval (`SimulatedDevice.certified`) after the records before ``b * width``, and ``marks[b]``, checkpoints
    there (`Replay.checkpoint`). A replay under a constant limit L' goes exactly as this one up to boundary b when
    ``bounds[b]`` holds L': every comparison it made with its limit so far comes out the same under L'. ``below``:
    the cap lies below the device's capacity (torch's allowed memory is the cap, else none: the two check
    otherwise); None for a replay under no cap (the recorded limits apply: its bounds only guide)."""

    #: A checkpoint at every boundary (the tests: where to resume is then the rule's choice alone, `_holds`).
    everywhere = False

    def __init__(self, trace, width: int, below):
        self.trace, self.width, self.below = trace, width, below
        self.bounds: list = [(0, None)]
        self.marks: dict = {}

    def start_for(self, limit: int, below) -> int:
        """The last boundary with a checkpoint a replay under ``limit`` (cap below the capacity or not: ``below``)
        shares, 0 for none (the certified intervals narrow as the replay goes: the boundaries that hold ``limit``
        come first)."""
        start = 0
        if below is not None and below == self.below:
            for b in sorted(self.marks):
                if not _holds(self.bounds[b], limit):
                    break
                start = b
        return start

    @staticmethod
    def walk(r, cell: Cell, after: tuple):
        """Run ``r`` (`_resumable`) to the end from the newest trail of its walk where it can, reading its bounds
        and leaving checkpoints where the previous probe's bounds say a cap of ``after`` (with none, its own limit)
        stops being held in the next window; the result, as the replay from the first event would give it."""
        t, dev = r.trace, r.device
        key = (cell.trace, str(cell.policy), r.settings.with_(cap=None))
        width = max(-(-len(t) // TRAIL_BOUNDS), TRAIL_WIDTH)
        old = _TRAILS.get(key)
        if old is not None and (old.trace is not t or old.width != width):
            old = None
        limit = dev.limit
        below = None if cell.cap is None else cell.cap < dev.capacity
        new = _Trail(t, width, below)
        b = old.start_for(limit, below) if old is not None else 0
        if b:
            r.resume(old.marks[b], own_limit=True)
            new.bounds = old.bounds[:b + 1]
            new.marks = {k: m for k, m in old.marks.items() if k <= b}
        guide = old.bounds if old is not None else []
        watched = [] if below is None else sorted(set(after) or {limit})
        left, last = TRAIL_MARKS, b
        while True:
            b += 1
            res = r.run(until=b * width if b * width < len(t) else None)
            if res is not None:
                break
            new.bounds.append(dev.certified())
            if _Trail.everywhere and below is not None:
                new.marks[b] = r.checkpoint()
            elif left and b + 1 < len(guide):
                # a cap above this one leaves where this replay is refused: where the guide grew past this limit
                leaving = [v for v in watched if _holds(new.bounds[b], v) and not _holds(guide[b + 1], min(v, limit))]
                watched = [v for v in watched if v not in leaving]
                if leaving and (b - last) * width >= TRAIL_GAIN:
                    new.marks[b] = r.checkpoint()
                    left, last = left - 1, b
        if len(_TRAILS) >= TRAILS_KEPT and key not in _TRAILS:
            _TRAILS.clear()
        _TRAILS[key] = new
        return res


def _holds(bounds: tuple, limit: int) -> bool:
    """Whether the certified interval ``bounds`` (lo, hi; hi None: unbounded) holds ``limit``."""
    lo, hi = bounds
    return lo <= limit and (hi is None or limit <= hi)


class Walk:
    """`fit_capacity`'s walk, one replay at a time: `need` is the cap to replay next (None: the unlimited
    replay it starts from), `take` its outcome, until `done`. Its state is a few numbers, so a copy can run
    ahead on guessed outcomes (`ahead`): the caps a parallel walk replays before the walk asks for them."""

    def __init__(self, trace: str, spec: PolicySpec, runtime: str, settings: Settings | None, resolution: int,
                 islands: bool, max_replays: int, top: int | None = None, digits: int | None = None):
        if resolution < 1:
            from ..errors import UsageError
            raise UsageError(f"fit resolution must be at least 1 byte, got {resolution}")
        self.trace, self.spec, self.runtime, self.settings = trace, spec, runtime, settings
        self.resolution, self.islands, self.max_replays = resolution, islands, max_replays
        self.replays = 0
        self.top, self.digits = top, digits
        self.step = None                # with ``digits``: the bisection's stopping width (`step_of`)
        self.phase = "unlimited"        # then "down" from the peak (or "bisect"), "islands" below the safe cap, "done"
        self.need: int | None = None
        self.load = self.peak = self.safe = self.island = None
        self.floor = self.lo = self.hi = self.survived = 0
        self.passed_unlimited = self.threshold = True

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def task(self, cap):
        """`probe`'s argument for a replay of this walk at ``cap``, with the caps the walk asks next whichever
        way that replay goes (where it is the next cap; a probe leaves checkpoints for them: `_Trail`)."""
        return self.trace, self.spec, cap, self.runtime, self.settings, self._after(cap)

    def _after(self, cap, depth: int = 2) -> tuple:
        """The caps this walk replays in the ``depth`` replays after ``cap``, each passing certifying its own cap
        alone or failing (two ahead: at ``-j 2`` the next probe in the same worker is mostly the one after the
        next); none before the unlimited replay, or for a cap the walk does not ask next."""
        if cap is None or cap != self.need or self.phase == "unlimited":
            return ()
        out: list = []
        for passed in (True, False):
            w = copy.copy(self)
            w.take(Probe(passed, cap, self.load, self.peak))
            if not w.done:
                out += [w.need, *(w._after(w.need, depth - 1) if depth > 1 else ())]
        return tuple(dict.fromkeys(out))

    def take(self, p: Probe) -> None:
        """The outcome of the replay at `need`: the walk moves on to its next cap (or is done)."""
        self.replays += 1
        res = self.resolution
        if self.phase == "unlimited":
            self.load, self.peak, self.passed_unlimited = p.load, p.peak, p.passed
            if not p.passed:            # it runs out even with no cap: no capacity is safe
                self.phase = "done"
                return
            # below LOAD every replay fails (below what no survived OOM can drop); a cap of 0 means none
            self.floor = max(p.load if p.least is None else p.least, 1)
            # what it certifies: from the largest need it granted (above its peak where the policy asked for more
            # than it got: expandable segments' `fits`); pinned, nothing else: the walk replays the peak first
            self.safe = p.peak if p.pinned else p.lowest
            self.survived = p.survived
            if self.top is not None and self.safe > self.top:     # above the cap: nothing to replay
                self.phase, self.need = "down", self.top
                return
            if p.pinned:        # the grid's top is certified by its own replay (a GC threshold at it may fail)
                self.phase, self.need, self.safe = "down", p.peak, None
                return
            self._down()
        elif self.phase == "down":
            if p.passed:        # the lowest grid point certified (at ``top``, not above it)
                self.safe, self.survived = min(-(-p.lowest // res) * res, self.need), p.survived
                self._down()
            elif self.safe is None and self.top is not None and self.need < self.top:
                self.need = self.top        # a pinned replay failed at its peak: the walk starts from the cap
            else:
                self._to_islands()
        elif self.phase == "bisect":
            if p.passed:        # certified from its lowest (grid point) up to its cap
                self.safe, self.survived = min(-(-p.lowest // res) * res, self.need), p.survived
            else:
                self.lo = self.need
            self._halve()
        else:
            if p.passed:
                self.hi = self.island = max(-(-p.lowest // res) * res, self.floor)
            else:
                self.lo = self.need
            self._bisect()

    def _down(self) -> None:
        if self.digits is not None:     # to a few significant figures: bisect from here
            res = self.resolution
            self.step = max(2 * res, step_of(self.safe, self.digits))    # a grid point between
            self.lo = self.floor - 1
            cap = -(-(self.safe - self.step) // res) * res      # first a step below: where it fails, done
            if cap <= self.lo:
                self._halve()
            else:
                self.phase, self.need = "bisect", cap
            return
        cap = (self.safe - 1) // self.resolution * self.resolution
        if cap < self.floor:
            self._to_islands()
        elif self.max_replays and self.replays >= self.max_replays:
            self.threshold = False      # safe from here; a lower safe capacity may exist
            self._to_islands()
        else:
            self.phase, self.need = "down", cap

    def _halve(self) -> None:
        """The bisection's next cap, between the largest known to fail and the smallest known to fit, on the
        grid; done once they lie within `step`."""
        mid = (self.lo + self.safe) // 2 // self.resolution * self.resolution
        if self.safe - self.lo <= self.step or mid <= self.lo or mid >= self.safe:
            self.phase = "done"
        else:
            self.phase, self.need = "bisect", mid

    def _to_islands(self) -> None:
        """Below the safe cap (none: the peak, which failed), a bisection between LOAD − 1 (always fails) and it."""
        if not self.islands:
            self.phase = "done"
            return
        self.lo, self.hi = self.floor - 1, self.need if self.safe is None else self.safe
        self._bisect()

    def _bisect(self) -> None:
        mid = (self.lo + self.hi) // 2 // self.resolution * self.resolution
        if mid <= self.lo or mid >= self.hi:
            self.phase = "done"
        else:
            self.phase, self.need = "islands", mid

    def ahead(self, known: dict):
        """The caps this walk will need, in order, each outcome taken from ``known`` (cap -> `Probe`) or
        guessed as the usual one: a probe down from the peak passes certifying its own cap alone (a policy
        that fills its pool to the cap, the long walks), a bisection probe fails (islands are rare).
        Nothing is guessed past the unlimited replay."""
        w = copy.copy(self)
        while not w.done:
            yield w.need
            p = known.get(w.need)
            if p is None:
                if w.phase == "unlimited":
                    return
                p = Probe(w.phase == "down", w.need, w.load, w.peak)     # a bisection probe: fails
            w.take(p)

    def left(self) -> float:
        """About how many replays this walk still takes: unknown before the unlimited replay; down from the peak,
        the grid points left to LOAD at the rate of replays per grid point so far; a bisection, its halvings."""
        from math import inf, log2
        res = self.resolution
        if self.phase == "unlimited":
            return inf
        if self.phase == "down":
            passed = max(1, (self.peak - self.need) // res)
            return (self.need - self.floor) / res * min(1.0, self.replays / passed)
        if self.phase == "bisect":
            return log2(max(2, (self.safe - self.lo) / self.step))
        return log2(max(2, (self.hi - self.lo) / res)) if self.phase == "islands" else 0.0

    def result(self) -> dict:
        out = {"policy": self.spec.name, "options": self.spec.option_text, "runtime": self.runtime,
               "capacity_bytes": None, "threshold": self.threshold, "island_bytes": None, "load_bytes": self.load,
               "unlimited_peak_bytes": self.peak, "replays": self.replays}
        if self.top is not None:        # `fit` itself walks with no cap over it: its JSON stays as it was
            out["top_bytes"] = self.top
        if self.digits is not None:     # bisected: it fits there, and fails less than ``step`` below
            out.update(digits=self.digits, step_bytes=self.step, fails_bytes=self.lo if self.step else None)
        if self.passed_unlimited:
            out.update(capacity_bytes=self.safe, island_bytes=self.island)
            if self.survived:           # at the answer the program lives through OOMs it catches
                out["survived_ooms"] = self.survived
        return out


def step_of(start: int, digits: int) -> int:
    """One unit of the ``digits``-th significant figure of ``start`` (bytes): the width a bisecting walk
    stops at (3 figures of 3.77e9: 10^7)."""
    return 10 ** max(0, len(str(max(start, 1))) - digits)


def fit_capacity(trace: str, policy, *, runtime: str = "eager", options: tuple = (),
                 settings: Settings | None = None, resolution: int = MiB, islands: bool = True,
                 on_replay=None, max_replays: int = MAX_REPLAYS, top: int | None = None,
                 digits: int | None = None) -> dict:
    """The safe capacity of ``policy`` (a `PolicySpec` or its text, ``options`` added) on ``trace`` (a `Trace` or a
    file's name: `allocsim.search.sweep.trace_on_disk`; see the module docstring; ``top``: up to that cap, the walk
    starting there; ``digits``: bisected to that many significant figures), and any island below it.

    ``on_replay()`` is called after each replay (progress: a policy that fills its pool up to
    the cap behaves differently at every grid point, so its walk takes one replay per point)."""
    _fit_arguments(resolution, max_replays, top, digits)       # (before a trace in memory is saved for the walk)
    with trace_on_disk(trace) as (path, _):
        (out,) = fit_many([dict(trace=path, policy=policy, runtime=runtime, options=options, settings=settings,
                                resolution=resolution, islands=islands, max_replays=max_replays, top=top,
                                digits=digits)],
                          on_replay=None if on_replay is None else lambda walks, i, seconds: on_replay())
    return out


def _fit_arguments(resolution, max_replays, top, digits) -> tuple:
    """`walk_of`'s counts, checked (`count_argument`): ``resolution`` and ``top`` sizes (text too: ``"1MiB"``)."""
    def size(value):                    # (text as the command line reads it)
        return parse_size(value) if isinstance(value, str) else value
    resolution = count_argument("resolution", size(resolution), 1)
    max_replays = count_argument("max_replays", max_replays, 0)
    if top is not None:
        top = count_argument("top", size(top), 1)
    if digits is not None:
        digits = count_argument("digits", digits, 1)
    return resolution, max_replays, top, digits


def walk_of(trace: str, policy, *, runtime: str = "eager", options: tuple = (), settings: Settings | None = None,
            resolution: int = MiB, islands: bool = True, max_replays: int = MAX_REPLAYS, top: int | None = None,
            digits: int | None = None) -> Walk:
    """The walk of `fit_capacity` (same arguments; ``top``: start at that cap; ``digits``: bisect to that many
    significant figures; module docstring), not started. ``trace``: its file's name (a `pathlib.Path` too); ``settings``:
    a sweep's `Settings`, or the `ReplaySettings` each replay runs under."""
    resolution, max_replays, top, digits = _fit_arguments(resolution, max_replays, top, digits)
    return Walk(trace_file(trace), PolicySpec.of(policy, options), runtime, Settings.of(settings), resolution, islands,
                max_replays, top, digits)


def fit_many(fits: list[dict], ex=None, slots: int = 1, on_replay=None, on_fit=None) -> list[dict]:
    """`fit_capacity` of each keyword set of ``fits``, results in order; with an executor ``ex``, the walks'
    replays keep ``slots`` of its workers busy: each walk's next cap first, then the caps it will need next
    if the usual outcomes come (`Walk.ahead`), every walk in turn. A walk reads the outcomes in its own order,
    so every answer (and its replay count) is the sequential walk's; a replay ahead that the walk skips is
    not counted. ``on_replay(walks, i, seconds)`` hears of each replay walk ``i`` takes and how long it ran (progress:
    `commands.fit`), ``on_fit(i, result)`` of each fit as it ends."""
    return walk_all([walk_of(**f) for f in fits], ex, slots, on_replay, on_fit)


def walk_all(walks: list[Walk], ex=None, slots: int = 1, on_replay=None, on_fit=None) -> list[dict]:
    """`fit_many` of walks already made (`walk_of`), some perhaps already on their way (`tune` starts one while
    it replays its settings): each goes on from where it is."""
    if ex is None:
        for i, w in enumerate(walks):
            while not w.done:
                t0 = time.perf_counter()
                w.take(probe(w.task(w.need)))
                if on_replay is not None:
                    on_replay(walks, i, time.perf_counter() - t0)
            if on_fit is not None:
                on_fit(i, w.result())
        return [w.result() for w in walks]
    return _walk_parallel(walks, ex, max(1, slots), on_replay, on_fit)


def _walk_parallel(walks: list[Walk], ex, slots: int, on_replay, on_fit) -> list[dict]:
    """`fit_many` on ``ex``: ``slots`` replays in flight (`_next_caps`), each walk taking its outcomes in order."""
    from concurrent.futures import FIRST_COMPLETED, wait
    known: list[dict] = [{} for _ in walks]     # per walk: cap -> Probe
    took: list[dict] = [{} for _ in walks]      # per walk: cap -> seconds from submission to result: its run, as
    flying: dict = {}                            # future -> (walk, cap, when sent)       no more than slots fly
    try:
        while True:
            for i, (w, k) in enumerate(zip(walks, known)):
                while not w.done and w.need in k:
                    seconds = took[i].pop(w.need, 0.0)
                    w.take(k[w.need])
                    if on_replay is not None:
                        on_replay(walks, i, seconds)
                    if w.done and on_fit is not None:
                        on_fit(i, w.result())
            if all(w.done for w in walks):
                return [w.result() for w in walks]
            for i, cap in _next_caps(walks, known, {(i, cap) for i, cap, _ in flying.values()},
                                     slots - len(flying)):
                flying[ex.submit(probe, walks[i].task(cap))] = (i, cap, time.perf_counter())
            finished, _ = wait(flying, return_when=FIRST_COMPLETED)
            for f in finished:
                i, cap, sent = flying.pop(f)
                known[i][cap] = f.result()
                took[i][cap] = time.perf_counter() - sent
    finally:
        for f in flying:                # replays ahead that no walk needs any more
            f.cancel()


def _next_caps(walks, known, flying: set, n: int) -> list[tuple[int, int]]:
    """Up to ``n`` (walk, cap) not replayed nor in flight, nearest first: every walk's next cap before any
    cap a walk needs only later (its place in `Walk.ahead`); among equals, the walk with most left first
    (`Walk.left`: the longest walk must not start last)."""
    from itertools import islice
    ranked = []
    for i, w in enumerate(walks):
        if not w.done:
            left = w.left()
            ahead = ((depth, -left, i, cap) for depth, cap in enumerate(w.ahead(known[i]))
                     if cap not in known[i] and (i, cap) not in flying)
            ranked += islice(ahead, n)
    return [(i, cap) for *_, i, cap in sorted(ranked)[:n]]
