"""`allocsim tune`: which allocator settings make this trace fit, searched offline.

The space is the trace's framework's (`allocsim.search.spaces`: the caching allocator's settings
for a PyTorch trace, the pool's ``set_limit`` for a CuPy trace, the ``split`` and ``binned``
pools under a few pool caps for anything else, the Julia CuArrays pools). The recorded
settings (trace metadata) are the first candidate and the baseline every table shows.

The search is exhaustive over what can differ, and replays nothing twice:

1. **Canonical settings** (`Space.canonical`): an option that cannot change a
   replay of *this* trace is reset to its default before anything runs, and
   settings that become equal replay once; the rules are each space's own
   (`allocsim.search.spaces.torch`; CuPy limits and Julia pool caps are generated
   below the target only, so they all differ). Equal canonical settings give
   equal replays, so this never discards the optimum (`tests/test_tune.py`
   brute-forces small spaces and compares every point's replay with its class's).
2. **First OOM stops a replay**: a setting that fails at the target stops there
   (the default replay does) and is out of the running.
2b. **Branch and bound**: a replay also stops as soon as it cannot matter any more (`Bound`): its
   figures so far are lower bounds of its final ones (peak reserved, device mallocs and the modeled clock
   only grow; the clock grows by at least the space's least cost of each event still to come,
   `least_costs`, and by the device calls that must still reserve what the live blocks to come need beyond
   what is reserved now, `live_ahead`: `least_clock`), and once they rank it below the ``top`` best settings
   replayed to the end *and* one of those strictly dominates it (no better in reserved and time, better in
   one), it can be neither a finalist nor on the frontier: every figure the report and ``--json`` show is the exhaustive search's.
   The row keeps what it reached (``pruned``: lower bounds) instead of figures. The recorded settings
   run to the end (the baseline), then the settings the space expects to be good (`Space.order`), so
   that a tight bound comes early; no replay stops before the last recorded OOM (the rescue reads them all).
   Where the program may survive an OOM (a TRY scope, a request flagged CATCHES_OOM:
   `allocsim.trace.scopes.may_survive`) the requests still to come bound nothing (a survived OOM drops some):
   only the figures a replay reached bound it.
2c. **Families**: settings that replay as another up to a point the other's replay can tell are replayed with it
   as one task (`_replay_family`): each resumes from a checkpoint taken before that point, or takes the other's
   row where it never came. Which settings, and what tells the point, are the space's rule
   (`allocsim.search.spaces.family.FamilyRule`, the space's ``FAMILIES``): the search names no option and reads
   no policy member (`tests/test_tune_generic.py`).
3. **Dominated settings are pruned** before the costly step: of the replayed
   settings that fit, only the Pareto frontier of (peak reserved, modeled
   time) can hold the best setting of any objective (``fastest``, the default:
   the least time among those that leave the headroom under the limit, then the
   rest that fit by time; ``reserved``: least peak reserved, then least time;
   ``time``: the reverse; ``both``: least sum of the two, each over its best
   value on the frontier) — a dominated one is no better in either figure, and
   what dominates it leaves the headroom whenever it does, so dropping it never
   drops an optimum. Only the
   recorded settings and the frontier among the best few get the capacity walk
   (`fit_capacity` bisecting to `FIT_DIGITS` significant figures, about ten replays each).
4. **Parallel**: the distinct settings are cells replayed by the process pool
   `compare` and `fit` use (``-j``), or by any executor given (Dask's included), as many at a time as
   it has workers, each with the bound as it stands when it starts. The recorded settings' capacity walk
   (always shown: a chain of replays, each chosen by the one before) takes one of the workers meanwhile.

With ``max_replays``, the settings nearest the recorded ones (fewest options
changed) are replayed first, and the answer is the best of those.

OOM rescue: for each ``OOM`` record of the trace (a request the recorded run
failed) the replay's walk gives the request to the policy where it was made:
a setting that fails it again counts an OOM there (and does not fit); one that
serves it lists it in ``ooms_avoided``. The setting's own replay reads the headroom
left under the target while the request was held (limit − reserved, `rescue_of`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from ..machine.costs import CostModel
from ..errors import UsageError
from ..filenames import shown_name
from ..machine.capacity import check_caps, device_capacity
from ..machine.metrics import COLUMNS
from ..engine.replay import Replay, driving, driving_count, kept_for
from .spaces import space_of
from .spaces.family import NO_FAMILIES, FamilyRule, Watcher
from ..engine.spec import PolicySpec
from .sweep import Cell, Settings, cached_trace, result_row
from ..trace import ALLOC, FREE, Trace
from ..trace.events import OOM
from ..trace.scopes import may_survive, sure_load
from ..units import fmt_bytes

OBJECTIVES = ("fastest", "reserved", "time", "both")
TOP = 3
#: The modeled time tune compares: the whole replay's clock (device calls, pool work, cache releases).
TIME = "total_time_seconds"
#: The significant figures of "fits on": the capacity walks bisect to them (`allocsim.search.fit`, module docstring).
FIT_DIGITS = 3
#: ``fastest``'s default headroom, a share of the limit (docs/metrics.md, "What `tune` recommends").
HEADROOM = 0.05

@dataclass(frozen=True)
class Candidate:
    """One setting to replay: a policy spec and its pool cap (None: the target's)."""

    spec: PolicySpec
    cap: int | None = None
    recorded: bool = False

    @property
    def label(self) -> str:
        """``recorded`` (a policy of no recorder: ``split (baseline)``), or its space's name of the setting (the
        options that differ from the defaults, with the policy and pool cap where they vary)."""
        if self.recorded:
            return "recorded" if self.spec.policy_class().framework else f"{self.spec.name} (baseline)"
        return space_of(self.spec.policy_class().framework).label(self.spec, self.cap)


@dataclass
class Target:
    """Where the run must fit: the device's memory (``capacity``) and the allocator's allowed memory (``cap``)."""

    capacity: int | None
    cap: int | None

    @property
    def limit(self) -> int | None:
        known = [v for v in (self.capacity, self.cap) if v is not None]
        return min(known) if known else None


def check_target(target: Target, load: int, capacity_name: str = "--capacity", *, survivable: bool = False) -> None:
    """An impossible target is one line: a limit below LOAD (nothing fits), named as the user gave it
    (``capacity_name``: `allocsim.machine.capacity.device_capacity`'s); ``survivable``: ``load`` is what no survived OOM can
    drop (`allocsim.trace.scopes.sure_load`)."""
    for what, v in ((capacity_name, target.capacity), ("--cap", target.cap)):
        if v is not None and v < load:
            raise UsageError(f"{what} {fmt_bytes(v)} is below {load_words(load, survivable)}: "
                             f"no allocator setting fits; the target is impossible")


def load_words(load: int, survivable: bool = False) -> str:
    """The LOAD a target must hold, in `check_target`'s words (``survivable``: of the objects no survived OOM drops)."""
    return (f"the trace's LOAD {fmt_bytes(load)} (its peak live bytes"
            f"{', of those no OOM the program survives can drop' if survivable else ''})")


# ---- the space ------------------------------------------------------------------------------
class Space:
    """The settings worth trying on one trace, and the canonical form that tells which replay alike."""

    def __init__(self, trace: Trace, target: Target):
        self.trace, self.target = trace, target
        self.framework = trace.meta.get("framework")
        kinds, sizes = trace.column("kind"), trace.column("size")
        requests = sizes[((kinds == ALLOC) | (kinds == OOM)) & (sizes > 0)].astype(np.int64)
        self.request_sizes = np.unique(requests)        # the distinct sizes asked, ascending
        self.largest_request = int(requests.max()) if len(requests) else 0
        self.facts = space_of(self.framework).facts(self)     # what its canonical rules read of this trace, once

    # the candidates, recorded settings first
    def candidates(self) -> list[Candidate]:
        fw = space_of(self.framework)
        return [Candidate(fw.recorded(self.trace), recorded=True)] + [Candidate(spec, cap) for spec, cap in
                                                                       fw.settings(self)]

    def canonical(self, c: Candidate):
        """A key equal for candidates whose replays of this trace are equal (module docstring, step 1)."""
        v = space_of(c.spec.policy_class().framework).canonical(self, c.spec.values())
        return (c.spec.ref, tuple(sorted(v.items())), c.cap)

    @staticmethod
    def order(c: Candidate) -> int:
        """Smaller for a candidate its space expects to be good (replayed early, for a tight bound: step 2b)."""
        return space_of(c.spec.policy_class().framework).promise(c.spec.values())

    def least_peak(self, c: Candidate) -> int:
        """The least peak reserved a replay under ``c`` reaches unless it runs out first (`Bound`: a bound on
        reserved from the start; 0 where the space knows none)."""
        return space_of(c.spec.policy_class().framework).least_peak(self.trace, c.spec.values())

    def live_ahead(self, c: Candidate) -> tuple[np.ndarray, int] | None:
        """``(ahead, largest)``: per check of a bounded replay under ``c`` (`_to_come`'s ``at``), the least
        reserved memory it must still reach from there on unless it runs out, and the most bytes one of its
        device calls reserves (`Bound`: the bytes it lacks cost at least `CostModel.least_malloc_seconds`);
        None where the space knows no such bound."""
        fw = space_of(c.spec.policy_class().framework)
        if fw.live_ahead is None:
            return None
        values = c.spec.values()
        return fw.live_ahead(self.trace, values, _to_come(self.trace)[4]), fw.largest_device_call(self, values)

    @staticmethod
    def least_costs(c: Candidate, costs: CostModel | None) -> tuple[float, float]:
        """The least modeled seconds each ALLOC and each FREE still to come adds to a replay's clock under
        ``c`` (`Bound`)."""
        return space_of(c.spec.policy_class().framework).least_costs(c.spec.ref, costs or CostModel())

    def least(self, c: Candidate, costs: CostModel | None) -> "Least":
        """Every lower bound the space knows of a replay under ``c`` (`Least`)."""
        return Least(*self.least_costs(c, costs), self.least_peak(c), self.live_ahead(c))


# ---- the search -----------------------------------------------------------------------------
def score(row: dict, objective: str, best: tuple = (1, 1), room: int | None = None):
    """Sort key of a fitting row under ``objective`` (smaller is better); ``best``: (reserved, time) scales for
    both; ``room``: the most a setting may reserve and still leave the headroom (None: no limit)."""
    r, t = row["peak_reserved_bytes"], row[TIME]
    if objective == "fastest":
        return (room is not None and r > room, t, r, row["device_mallocs"])
    if objective == "reserved":
        return (r, t, row["device_mallocs"])
    if objective == "time":
        return (t, r, row["device_mallocs"])
    return (r / max(best[0], 1) + t / max(best[1], 1e-12), r, t)


def fits(row: dict) -> bool:
    """Whether a row's setting fits the target: replayed to the end (not pruned) without an OOM."""
    return row.get("pruned") is None and not row["ooms"]


def pareto(rows: list[dict]) -> list[dict]:
    """The rows no other row beats in both peak reserved and modeled time (ties kept once), by reserved."""
    out, best_t = [], float("inf")
    for row in sorted(rows, key=lambda r: (r["peak_reserved_bytes"], r[TIME])):
        if row[TIME] < best_t:
            out.append(row)
            best_t = row[TIME]
    return out


def ranked(rows: list[dict], objective: str, room: int | None = None) -> list[dict]:
    """The fitting rows, best first under ``objective`` (the best is on the frontier, whatever the objective;
    ``room``: `score`'s); with none fitting, the rows that got furthest before their first OOM."""
    fitting = [r for r in rows if fits(r)]
    if not fitting:
        return sorted(rows, key=lambda r: -(r["first_oom_event"] or 0))
    front = pareto(fitting)
    best = (min(r["peak_reserved_bytes"] for r in front), min(r[TIME] for r in front))
    return sorted(fitting, key=lambda r: score(r, objective, best, room))


def margin(target: "Target", headroom: float | int) -> int | None:
    """The bytes ``fastest`` keeps free under ``target``'s limit: ``headroom`` is a share of the limit (a float)
    or bytes (an int); None with no limit."""
    limit = target.limit
    if limit is None:
        return None
    if not isinstance(headroom, float) and headroom >= limit:
        raise UsageError(f"--headroom {fmt_bytes(headroom)} is not below the limit {fmt_bytes(limit)}: "
                         f"nothing could leave it free")
    return int(limit * headroom) if isinstance(headroom, float) else int(headroom)


#: The clock's lower bound is taken this much lower (relative): the final clock is a sum of floats, each
#: addition rounded, so it may fall short of the exact sum by far less than this.
SLACK = 1e-9
#: A bounded replay is checked every this many driving events at least, every 1/`SPREAD` of the trace (to 4,096):
#: most replays under a cap stop in the first step, where every ALLOC is a segment call; checked every 64 events
#: they stop a fifth sooner (gpt2 --cap 1.2x: 257k events walked in all instead of 329k).
WINDOW = 64
SPREAD = 256
#: A family's head replay takes a checkpoint at most every this many driving events (`_Trunk`), and twice
#: as far apart after each one no member resumed from: a copy costs about as much as walking 500 events (bert_mlm
#: at its first step's peak: 1.8 ms against 3.8 us an event), and most go unused (the setting's replay stops
#: before the next threshold: bert_mlm --cap 1.2x took 224 at 256 events, 74 resumed from; 114 at 2,048, the same
#: events walked; gpt2 60 -> 15 for 6 % more events).
CHECKPOINT_EVERY = 2048


@dataclass(frozen=True)
class Bound:
    """What a replay must still be able to beat (module docstring, step 2b): ``worst``, the `score` of the
    ``top``-th best fitting row replayed to the end, and ``front``, the (peak reserved, modeled time) of the
    Pareto frontier of those rows. A replay whose figures so far (lower bounds of its final ones) score
    worse than ``worst`` and are strictly dominated by a point of ``front`` can be neither a finalist nor on
    the frontier, whatever it does next."""

    objective: str
    room: int | None
    worst: tuple
    front: tuple

    def hopeless(self, reserved: int, clock: float, mallocs: int) -> bool:
        """Whether a replay that has reserved ``reserved`` at its peak, made ``mallocs`` device mallocs and
        will end with a clock of at least ``clock`` can stop."""
        partial = {"peak_reserved_bytes": reserved, TIME: clock, "device_mallocs": mallocs}
        if not score(partial, self.objective, room=self.room) > self.worst:
            return False
        return any((r < reserved and t <= clock) or (r <= reserved and t < clock) for r, t in self.front)


def bound_of(done: list[dict], objective: str, room: int | None, top: int) -> Bound | None:
    """The `Bound` the rows replayed to the end so far (``done``) set; None while fewer than ``top`` of them
    fit, or under ``both`` (whose score reads the frontier's best values, not known before the end)."""
    fitting = [r for r in done if fits(r)]
    if objective == "both" or len(fitting) < top:
        return None
    worst = sorted(score(r, objective, room=room) for r in fitting)[top - 1]
    return Bound(objective, room, worst, tuple((r["peak_reserved_bytes"], r[TIME]) for r in pareto(fitting)))


# ---- the jobs: what a worker is handed, and what it hands back ------------------------------------------
class Least(NamedTuple):
    """What a bounded replay under one setting reaches at least, from the space (`Bound`, `least_clock`): the
    modeled seconds each ALLOC and each FREE still to come adds (`Space.least_costs`), the peak reserved it
    reaches unless it runs out (`Space.least_peak`; 0: none known) and `Space.live_ahead`'s ``(ahead, largest)``
    (None: none known)."""

    per_alloc: float
    per_free: float
    peak: int = 0
    ahead: tuple | None = None


#: No lower bound beyond what a replay reached: where the program may survive an OOM (`tune`'s step 2b).
NOTHING_KNOWN = Least(0.0, 0.0)


@dataclass(frozen=True)
class Job:
    """One setting's replay (`_replay_job`): its cell, the `Settings`, the space's `Least` bounds, the recorded
    OOMs (`recorded_ooms`), the `Bound` that may stop it (None: replayed to the end) and whether to put off the
    peak's free state while bounded (`Replay.defer_peak_state`: `_replay_all` does while fewer rows ran out than
    the bound stopped; a replay the bound stops never reads it, one that runs out reads it, walking again)."""

    cell: Cell
    settings: Settings | None
    least: Least
    ooms: list
    bound: Bound | None = None
    defer: bool = True


class Member(NamedTuple):
    """A setting replayed with its family's head (`_replay_family`): its cell and what its space's rule watches."""

    cell: Cell
    watch: object


@dataclass(frozen=True)
class Family:
    """A head's job and its members (`_families`), replayed as one task (`_replay_family`)."""

    head: Job
    members: list


class Outcome(NamedTuple):
    """A setting's row and how it came (``way``: None, its own replay from the first event; "row": its family's
    head's figures, `_as_variant`; "resumed": from a checkpoint of the head's replay): `Tuning.shared`,
    `Tuning.resumed` count them."""

    row: dict
    way: str | None = None


@dataclass
class Tuning:
    """What `tune` found; `to_dict` is the ``--json`` output."""

    trace: str
    load_bytes: int
    target: Target
    objective: str
    settings_total: int
    settings_distinct: int
    rows: list[dict] = field(default_factory=list)      # one per distinct setting replayed, recorded first
    frontier: list[dict] = field(default_factory=list)
    finalists: list[dict] = field(default_factory=list)
    replays: int = 0
    bounded: bool = False
    rescue: list[dict] = field(default_factory=list)
    headroom_bytes: int | None = None     # the margin ``fastest`` keeps under the limit (None: no limit)
    pruned: int = 0                       # settings whose replay stopped early: they could not matter (`Bound`)
    shared: int = 0                       # settings given another's row: they behave alike (`_replay_family`)
    resumed: int = 0                      # settings resumed from another's checkpoint
    family_rule: FamilyRule = NO_FAMILIES  # how the space's settings share a replay (the report's words)

    @property
    def room(self) -> int | None:
        """The most a setting may reserve and leave the headroom."""
        return None if self.headroom_bytes is None else self.target.limit - self.headroom_bytes

    @property
    def recorded(self) -> dict:
        return self.rows[0]

    @property
    def fitting(self) -> list[dict]:
        """The rows whose setting fits (`fits`), in the rows' order."""
        return [r for r in self.rows if fits(r)]

    @property
    def shown(self) -> list[dict]:
        """The rows the report shows (and the fit walk measures): the recorded settings, then the finalists."""
        return [self.recorded] + [r for r in self.finalists if r is not self.recorded]

    @property
    def best(self) -> dict | None:
        """The recommended setting: the best that fits, None if none does."""
        return self.finalists[0] if self.finalists and not self.finalists[0]["ooms"] else None

    def to_dict(self) -> dict:
        return {"trace": self.trace, "load_bytes": self.load_bytes, "capacity_bytes": self.target.capacity,
                "cap_bytes": self.target.cap, "objective": self.objective,
                "headroom_bytes": self.headroom_bytes, "settings_total": self.settings_total,
                "settings_distinct": self.settings_distinct,
                "settings_replayed": len(self.rows), "settings_pruned": self.pruned,
                "settings_shared": self.shared, "settings_resumed": self.resumed, "replays": self.replays,
                "bounded": self.bounded,
                "recommended": self.best and conf_lines(self.best), "recorded": self.recorded,
                "finalists": self.finalists, "frontier": [r["setting"] for r in self.frontier],
                "rescue": self.rescue, "candidates": self.rows}


def tune(trace: str, *, capacity="trace", cap: int | None = None, objective: str = "fastest",
         headroom: float | int = HEADROOM, jobs: int = 1, top: int = TOP, fit: bool = True, max_replays: int = 0,
         settings: Settings | None = None, executor=None, progress=None) -> Tuning:
    """Search the allocator settings of ``trace`` for the best under ``objective`` at the target
    (``capacity``: device memory, "trace" for the recorded device's; ``cap``: allowed memory; ``headroom``:
    the margin ``fastest`` keeps under their limit, a share of it or bytes). The replays run
    on ``executor`` (any `concurrent.futures.Executor`, a Dask client's included; ``jobs`` above 1: its workers),
    else on one local process pool of ``jobs`` workers kept for every step. ``progress`` (a `allocsim.commands._common.PhaseReport`)
    hears of each step as it starts and ends."""
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective: unknown objective {objective!r} (known: {', '.join(OBJECTIVES)})")
    from contextlib import nullcontext
    from .sweep import process_pool
    with nullcontext(executor) if executor is not None or jobs <= 1 else process_pool(jobs) as ex:
        return _search(trace, capacity, cap, objective, top, fit, max_replays, settings, ex, progress, headroom,
                       jobs if executor is not None and jobs > 1 else None)


def _search(trace, capacity, cap, objective, top, fit, max_replays, settings, ex, progress=None,
            headroom: float | int = HEADROOM, slots: int | None = None) -> Tuning:
    """`tune`'s steps (module docstring), the replays mapped on ``ex`` (None: here)."""
    t = cached_trace(trace)
    check_caps([cap], capacity, t)
    total, capacity_name = device_capacity(capacity, t)
    target = Target(total, cap)
    check_target(target, sure_load(t), capacity_name, survivable=may_survive(t))
    headroom_bytes = margin(target, headroom)         # a headroom above the limit is refused before any replay
    space = Space(t, target)
    everything = space.candidates()
    distinct: dict = {}
    for c in everything:
        distinct.setdefault(space.canonical(c), c)
    chosen = [distinct[k] for k in nearest_first(list(distinct))]
    bounded = bool(max_replays) and len(chosen) > max_replays
    chosen = chosen[:max_replays] if bounded else chosen
    cells = [Cell(trace, c.spec, c.cap if c.cap is not None else cap, "eager", capacity=target.capacity)
             for c in chosen]
    ooms = recorded_ooms(t)
    step = _Steps(progress)
    step.start(f"replaying {len(cells)} settings")
    costs = (settings or Settings()).replay.costs
    survives = may_survive(t)       # a survived OOM drops requests: no bound from the requests still to come
    jobs = [Job(cell, settings, NOTHING_KNOWN if survives else space.least(c, costs), ooms)
            for cell, c in zip(cells, chosen)]
    order = [0] + sorted(range(1, len(cells)), key=lambda i: Space.order(chosen[i]))     # the recorded first
    families = _families(space, chosen)
    room = None if headroom_bytes is None else target.limit - headroom_bytes
    slots = slots or _workers(ex)
    from .fit import walk_of
    recorded_walk = walk_of(trace, chosen[0].spec, settings=settings, islands=False, top=target.cap,
                            digits=FIT_DIGITS) \
        if fit and ex is not None else None     # it is always walked: it goes on beside the settings' replays
    outcomes = _replay_all(jobs, order, ex, objective, room, top, slots, recorded_walk, families)
    rows, ways = [o.row for o in outcomes], [o.way for o in outcomes]
    for cell, c, row in zip(cells, chosen, rows):
        row.update(setting=c.label, spec=str(c.spec), cap_bytes=cell.cap, recorded=c.recorded)
        row.update(conf_lines(row, c, target.capacity))
    out = Tuning(trace, t.load_bytes, target, objective, len(everything), len(distinct), rows, bounded=bounded,
                 replays=len(rows) - ways.count("row"), headroom_bytes=headroom_bytes,
                 pruned=sum(bool(r["pruned"]) for r in rows), shared=ways.count("row"), resumed=ways.count("resumed"),
                 family_rule=space_of(space.framework).FAMILIES)
    step.end((f"{len(rows)} settings ({len(rows) - out.shared} replayed, {out.shared} by their setting's replay)"
              if out.shared else f"{len(rows)} settings replayed")
             + (f", {out.pruned} of them stopped early" if out.pruned else ""), left=fit)
    if ooms:
        out.rescue = _rescued(rows, ooms)
    out.frontier = pareto(out.fitting)
    out.finalists = ranked(rows, objective, out.room)[:top]
    for r in rows:
        r["pareto"] = any(r is f for f in out.frontier)
    if fit:     # dominated settings are pruned here: only the recorded and the frontier get the walk
        walked = [r for r in out.shown if r["recorded"] or r["pareto"]]
        step.start(f"capacity walks of {len(walked)} settings")
        n = _fit_all(trace, walked, settings, ex, slots, target.cap, recorded_walk)
        out.replays += n
        step.end(f"capacity walks of {len(walked)} settings: {n} replays")
    return out


class _Steps:
    """``progress``'s start/end, or nothing without one."""

    def __init__(self, progress):
        self.progress = progress

    def start(self, desc):
        if self.progress is not None:
            self.progress.start(desc)

    def end(self, what, left=None):
        if self.progress is not None:
            self.progress.end(what, left)


def nearest_first(keys: list) -> list:
    """Canonical keys, the recorded settings' (the first) first, then by how many options differ from them:
    a ``max_replays`` bound keeps the settings nearest to what ran."""
    policy, options, cap = keys[0]
    base = dict(options)

    def distance(key):
        other = dict(key[1])
        return (key[0] != policy) + (key[2] != cap) + sum(base.get(k) != other.get(k) for k in base.keys() | other.keys())
    return sorted(keys, key=distance)          # stable: the space's order among equals


def _replay_all(jobs: list[Job], order: list[int], ex, objective: str, room: int | None, top: int,
                slots: int = 1, walk=None, families: dict | None = None) -> list[Outcome]:
    """`_replay_job` of each of ``jobs`` (without their bound), started in ``order``, each with the bound the rows
    done so far set (`bound_of`; the first of ``order`` with none); on ``ex`` (None: here), ``slots`` running and
    as many queued (a replay the bound stops is a few milliseconds: a worker waiting for its next task idles).
    The outcomes in the order of ``jobs``. ``walk`` (an `allocsim.search.fit.Walk`) takes one of the slots while the rows
    are replayed, one replay at a time: a walk is a chain of replays, each chosen by the one before, which
    would otherwise run after them with the other workers idle. ``families`` (`_families`: a job -> the members
    of its family) are one task each, `_replay_family`, with the bound as it stands when it starts."""
    families = families or {}
    inside = {v for members in families.values() for v, _ in members}
    order = [i for i in order if i not in inside]
    got: list = [None] * len(jobs)
    fitting: list[dict] = []        # the rows done so far that fit: only they set the bound
    made = [None, -1]               # the bound, and how many fitting rows it was made of
    ended = {"pruned": 0, "ran out": 0}     # how the rows done so far ended early

    def task(i):
        if made[1] != len(fitting):     # made again only when a row that fits is done, not for every task
            made[:] = bound_of(fitting, objective, room, top), len(fitting)
        job = replace(jobs[i], bound=made[0] if i != order[0] else None, defer=ended["ran out"] <= ended["pruned"])
        if i not in families:
            return _replay_job, job
        return _replay_family, Family(job, [Member(jobs[v].cell, w) for v, w in families[i]])

    def done(i, result):
        if i in families:
            for k, o in zip([i] + [v for v, _ in families[i]], result):
                done1(k, o)
        else:
            done1(i, Outcome(result))

    def done1(i, o: Outcome):
        got[i] = o
        if fits(o.row):
            fitting.append(o.row)
        elif o.row["pruned"] or o.row["ooms"]:
            ended["pruned" if o.row["pruned"] else "ran out"] += 1
    if ex is None:
        for i in order:
            fn, job = task(i)
            done(i, fn(job))
        return got
    from concurrent.futures import FIRST_COMPLETED, wait
    from .fit import probe
    waiting, flying, left = iter(order), {}, len(order)
    try:
        while left or flying:
            if left and walk is not None and not walk.done and None not in flying.values():
                flying[ex.submit(probe, walk.task(walk.need))] = None
            while len(flying) < 2 * slots:      # one queued behind each running: a replay that stops early is short
                i = next(waiting, None)
                if i is None:
                    break
                flying[ex.submit(*task(i))] = i
            finished, _ = wait(flying, return_when=FIRST_COMPLETED)
            for f in finished:
                i = flying.pop(f)
                if i is None:
                    walk.take(f.result())
                    continue
                done(i, f.result())
                left -= 1
        return got
    finally:
        for f in flying:
            f.cancel()


def _replay_job(job: Job, start=None, trunk: "_Trunk | None" = None) -> dict:
    """One setting's replay as a row: the sweep row, its retries (the first of its space's ``RETRIES`` counters the
    engine reports: the failed device calls retried, or the pool's cache flushes, each followed by a retry), the
    recorded OOMs it served (``rescue``: `rescue_of`), and the free breakdown where it matters: at its first OOM, else at its
    reserved peak. A replay the bound stops is a row of None figures with ``pruned``: where it stopped and
    the lower bounds it had reached (`_walk_bounded`). ``start``: a checkpoint to resume from (`Replay.resume`);
    ``trunk``: a `_Trunk` that watches the walk (`_replay_family`)."""
    cell, bound, ooms = job.cell, job.bound, job.ooms
    s = job.settings or Settings()
    t_start = time.perf_counter()
    r = Replay(cached_trace(cell.trace), cell.policy, s.replay, runtime=cell.runtime, cap=cell.cap,
               capacity=cell.capacity)
    try:
        if start is not None:                           # resumed from a checkpoint of its family's replay
            r.resume(start)
        if trunk is not None:
            trunk.begin(r)
        if bound is not None and job.defer:     # a replay the bound stops never reads its peak's free state; one
            r.defer_peak_state()                # that runs out reads it, walking again
        pruned = _walk_bounded(r, bound, job.least, ooms, trunk) if bound is not None else None
        res = None if pruned else r.run()
    finally:
        r.close()
    if pruned:
        row = dict.fromkeys(COLUMNS)
        row.update(trace=shown_name(cell.trace), policy=cell.policy.name, cap_bytes=cell.cap, runtime=cell.runtime,
                   options=cell.policy.option_text, retries=None, ooms_avoided=None, breakdown=None)
    else:
        res.replay_seconds = time.perf_counter() - t_start
        row = result_row(res, cell)
        counters = res.counters
        row["retries"] = next((int(counters[k]) for k in space_of(cell.policy.policy_class().framework).RETRIES
                               if k in counters), 0)
        row["ooms_avoided"] = res.ooms_avoided
        row["breakdown"] = res.first_oom.breakdown if res.first_oom else res.breakdown_at_peak
    row["pruned"] = pruned
    if ooms:
        row["rescue"] = rescue_of(r, ooms)
    return row


def _walk_bounded(r: Replay, bound: Bound, least: Least, ooms, trunk=None) -> dict | None:
    """Step ``r`` until it ends (None) or ``bound`` says it cannot matter (never before the last of the recorded
    ``ooms``): then what it reached, ``event`` (the trace index it stopped before) and lower bounds of its
    final peak reserved (what it reached, or ``least.peak``, the peak its live blocks reach, if higher:
    unless it runs out, a row that does not fit either), modeled time (`least_clock`) and device mallocs.
    ``trunk`` (`_Trunk`) hears of each window before and after it is walked."""
    come = _to_come(r.trace)
    n, window, _, _, at = come
    dev = r.device
    while True:
        if trunk is not None:
            trunk.before(r.events_done // window)
        r.step(window)
        if trunk is not None:
            trunk.after()
        d = r.events_done
        if r.at_end or d >= n:
            return None
        k = d // window             # a step walks ``window`` events unless it ends (or stops at an OOM)
        if at[k] <= (ooms[-1][0] if ooms else -1):
            continue
        clock = least_clock(dev, k, come, least)
        reserved = max(dev.peak_reserved, least.peak)
        if bound.hopeless(reserved, clock, dev.n_malloc):
            return {"event": int(at[k]), "peak_reserved_bytes": reserved, TIME: clock,
                    "device_mallocs": dev.n_malloc}


def least_clock(dev, k: int, come: tuple, least: Least) -> float:
    """A lower bound of the final modeled clock of a replay on ``dev`` that has walked ``k`` windows of
    `_to_come` (``come``) and goes on to the end: its clock so far, ``least``'s cost of each ALLOC and FREE still
    to come (`Space.least_costs`) and, where ``least`` holds `Space.live_ahead`'s ``(ahead, largest)``, the device
    calls that must still reserve the bytes it lacks (`CostModel.least_malloc_seconds` of ``ahead[k]`` less what
    it holds now, in calls of ``largest`` bytes at most: reserved memory grows only by them), taken `SLACK` lower."""
    _, _, allocs, frees, _ = come
    clock = dev.clock + allocs[k] * least.per_alloc + frees[k] * least.per_free
    if least.ahead is not None:
        ahead, largest = least.ahead
        if ahead[k] > dev.reserved:
            clock += dev.costs.least_malloc_seconds(int(ahead[k]) - dev.reserved, largest)
    return float(clock) * (1 - SLACK)


# ---- families: one replay, its checkpoints, and the settings that behave as it up to a point -------------
def _families(space: Space, chosen: list[Candidate]) -> dict[int, list[tuple[int, object]]]:
    """``{i: [(j, watch), ...]}``: for each setting ``chosen[i]`` of the space's policy that heads a family (the
    first of the heads its rule names for a member that is replayed here, `FamilyRule.heads`; not the recorded
    settings, which run unbounded first), the settings ``chosen[j]`` that differ from it only where its replay can
    tell how far they behave alike, and what to watch (`FamilyRule.watch`; `_replay_family` replays them together).
    None where the space's rule shares nothing on this trace (`FamilyRule.shares`) or where the program may survive an
    OOM (`allocsim.trace.scopes.may_survive`: the watches do not follow an unwound try)."""
    fw = space_of(space.framework)
    rule = fw.FAMILIES
    if may_survive(space.trace) or not rule.shares(space.trace):    # (a survived OOM unwinds: not watched)
        return {}
    index, values = {}, {}
    for i, c in enumerate(chosen):
        if c.spec.ref == fw.POLICY and not c.recorded:
            key = space.canonical(c)
            index[key], values[i] = i, dict(key[1])
    out: dict = {}
    for j, v in values.items():
        for h in rule.heads(v):
            head = index.get(space.canonical(Candidate(h, chosen[j].cap)))
            if head == j:
                break
            w = None if head is None else rule.watch(values[head], v)
            if w is not None:
                out.setdefault(head, []).append((j, w))
                break
    return out


def _rule_of(cell: Cell) -> FamilyRule:
    """The family rule of ``cell``'s setting: its space's (`allocsim.search.spaces.family`)."""
    return space_of(cell.policy.policy_class().framework).FAMILIES


class _Trunk:
    """What `_replay_family`'s replay of the family's head keeps for the other members: the checkpoints they
    resume from. Before each window in which a member could start to differ (``watcher``: the space's `Watcher`
    of the members' watches) a checkpoint is taken; once a member does, it starts from the checkpoint before that
    window (None: from the first event). A member that never got there behaves as the head throughout.
    ``start``: the checkpoint the head resumed from."""

    def __init__(self, watcher: Watcher, start=None):
        self.watcher = watcher
        self.starts: dict = {}
        self.r, self.here = None, start
        self.taken, self.used, self.every = 0, False, CHECKPOINT_EVERY

    @property
    def pending(self) -> dict:
        """The members that have not parted from the head yet (`Watcher.pending`)."""
        return self.watcher.pending

    def begin(self, r: Replay) -> None:
        self.r, self.taken = r, r.events_done
        self.watcher.begin(r)

    def before(self, k: int) -> None:
        r = self.r
        if not (k and self.watcher.could_part(k)):
            self.here = None
        elif self.here is None or r.events_done - self.taken >= self.every:
            if self.here is not None and not self.used:
                self.every *= 2         # the last one went unused: the next ones further apart
            self.here = r.checkpoint() if r.can_checkpoint() else None
            self.taken, self.used = r.events_done, False

    def after(self) -> None:
        for v in self.watcher.parted():
            self.starts[v] = self.here
            self.used = True


def _replay_family(family: Family, start=None) -> list[Outcome]:
    """`_replay_job` of the head of ``family`` and of its members, as outcomes in that order. A member behaves as
    the head, figure for figure, up to where its watch fires (`_Trunk`; the space's rule, `FamilyRule`): it resumes
    from the head's checkpoint before that, or where the head's replay never got there, its row is the head's (the
    same figures, or the same stop: the same walk meets the same bound, whose least costs and peaks the options
    watched do not change). Members that resume from one checkpoint are again a family where one of them can watch
    the others (`_regroup`), replayed so from there. ``start``: a checkpoint the head resumes from."""
    head, members = family.head, family.members
    rule, values = _rule_of(head.cell), head.cell.policy.values()
    if head.bound is None:      # no checkpoints: only the members alike throughout share
        row = _replay_job(head, start=start)
        return [Outcome(row)] + [_as_variant(row, m.cell) if rule.alike_throughout(values, m.watch) else
                                 Outcome(_replay_job(replace(head, cell=m.cell))) for m in members]
    t = cached_trace(head.cell.trace)
    _, window, *_ = _to_come(t)
    trunk = _Trunk(rule.watcher(t, values, [m.watch for m in members], window), start)
    out = [Outcome(_replay_job(head, start=start, trunk=trunk))]
    got: dict = {}
    groups: dict = {}
    for v, m in enumerate(members):
        if v in trunk.pending:
            got[v] = _as_variant(out[0].row, m.cell)
        else:
            groups.setdefault(id(trunk.starts[v]), []).append(v)
    for vs in groups.values():          # each group resumes from one checkpoint: a family again where it can
        begun = trunk.starts[vs[0]]
        for sub, under in _regroup([members[v].cell for v in vs], rule):
            job = replace(head, cell=members[vs[sub]].cell)
            done = _replay_family(Family(job, [Member(members[vs[u]].cell, w) for u, w in under]), start=begun) \
                if under else [Outcome(_replay_job(job, start=begun))]
            for u, o in zip([sub] + [u for u, _ in under], done):
                got[vs[u]] = o._replace(way="resumed") if begun is not None and o.way is None else o
    return out + [got[v] for v in range(len(members))]


def _regroup(cells: list[Cell], rule: FamilyRule) -> list[tuple[int, list[tuple[int, object]]]]:
    """``cells`` (members resumed from one checkpoint) as families: ``[(head, [(member, watch), ...]), ...]`` by
    position, each cell under the first head that can watch it (`FamilyRule.watch`), the cells taken in the rule's
    order (`FamilyRule.order`: an earlier one can head a later one, not the reverse); a cell no head can watch heads
    its own."""
    heads: list = []
    for i in sorted(range(len(cells)), key=lambda i: rule.order(cells[i].policy.values())):
        v = cells[i].policy.values()
        for h, under in heads:
            w = rule.watch(cells[h].policy.values(), v)
            if w is not None:
                under.append((i, w))
                break
        else:
            heads.append((i, []))
    return heads


def _as_variant(row: dict, cell: Cell) -> Outcome:
    """``row`` (its family's setting's) as the row of ``cell``'s setting, which replays alike (`_replay_family`)."""
    import copy
    out = copy.deepcopy(row)
    out["options"] = cell.policy.option_text
    return Outcome(out, "row")


_TO_COME: dict = {}


def _to_come(trace: Trace) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """``(n, window, allocs, frees, at)`` of ``trace``: its ``n`` driving events (`allocsim.engine.replay.driving`), the
    ``window`` a bounded replay is checked every (1/`SPREAD` of them, `WINDOW` to 4,096), and at each multiple ``k`` of
    it the ALLOCs and the FREEs from there on and the trace index of the event there (memory: 24 bytes a window,
    not an event); kept for the trace's next replays."""
    return kept_for(_TO_COME, (id(trace), WINDOW), trace, lambda: _count_to_come(trace), 4)


def _count_to_come(trace: Trace) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """`_to_come`, not kept."""
    n = driving_count(trace)
    window = min(max(n // SPREAD, WINDOW), 4096)
    before_a, before_f, at = [], [], []
    done = n_alloc = n_free = 0
    for start, rec, local in driving(trace):
        kinds = rec["kind"][local]
        is_alloc, is_free = np.cumsum(kinds == ALLOC), np.cumsum(kinds == FREE)
        p = np.arange(-done % window, len(local), window)       # the multiples of ``window`` in this chunk
        before_a.append(n_alloc + np.where(p > 0, is_alloc[p - 1], 0))
        before_f.append(n_free + np.where(p > 0, is_free[p - 1], 0))
        at.append(local[p] + start)
        done, n_alloc, n_free = done + len(local), n_alloc + int(is_alloc[-1]), n_free + int(is_free[-1])
    join = (lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64))
    return n, window, n_alloc - join(before_a), n_free - join(before_f), join(at)


def _fit_all(trace: str, rows: list[dict], settings, ex, slots: int = 1, top: int | None = None,
             started=None) -> int:
    """Each row's "fits on" (`fit_capacity` bisecting to `FIT_DIGITS` significant figures: a capacity certified
    to fit, with one less than a unit of its last figure below it that runs out; under a cap ``top``, the walk
    starts there), stored in the row; the number of replays it took. The walk varies the cap, so rows of one spec (a pool under several caps) share one walk;
    the walks run together, ``slots`` replays at a time (`allocsim.search.fit.walk_all`); ``started``: a walk already on
    its way (its spec's: the recorded settings')."""
    from .fit import walk_all, walk_of
    specs = list(dict.fromkeys(r["spec"] for r in rows))
    walks = [started if started is not None and s == str(started.spec) else
             walk_of(trace, PolicySpec.parse(s), settings=settings, islands=False, top=top, digits=FIT_DIGITS)
             for s in specs]
    fits = walk_all(walks, ex, slots)
    by_spec = dict(zip(specs, fits))
    for r in rows:
        f = by_spec[r["spec"]]
        r["fit_capacity_bytes"], r["fit_threshold"], r["fit_digits"] = f["capacity_bytes"], f["threshold"], f.get("digits")
    return sum(f["replays"] for f in fits)


def _workers(ex) -> int:
    """How many replays keep ``ex`` busy: a local pool's workers (`concurrent.futures`), else this machine's cores
    (a Dask cluster's executor does not say)."""
    import os
    return getattr(ex, "_max_workers", None) or os.cpu_count() or 1


# ---- what to paste ----------------------------------------------------------------------------
#: The keys of a row that say how to select its setting: the environment lines, and where the framework has one,
#: the same in Python for a running process (`allocsim.frameworks.torch.python_lines`).
PASTE_KEYS = ("conf", "legacy_conf", "note", "python", "python_fraction", "fraction", "python_note")


def conf_lines(row: dict, c: Candidate | None = None, total: int | None = None) -> dict:
    """The lines that select a row's setting, ready to paste (``{"conf": ..., "legacy_conf": ...}``, `PASTE_KEYS`):
    its framework's (`allocsim.frameworks`); ``total``: the device memory its cap is a fraction of."""
    if c is None:
        return {k: row[k] for k in PASTE_KEYS if k in row}
    space = space_of(c.spec.policy_class().framework)
    lines = space.conf_lines(c.spec, c.cap)
    if space.python_lines is not None:
        lines.update(space.python_lines(c.spec, row.get("cap_bytes", c.cap), total))
    return lines


# ---- OOM rescue ---------------------------------------------------------------------------------
def recorded_ooms(trace: Trace) -> list[tuple[int, int, int]]:
    """``(event index, request, stream)`` of each OOM record: the requests the recorded run failed."""
    kinds = trace.column("kind")
    at = np.flatnonzero(kinds == OOM)
    return list(zip(at.tolist(), trace.column("size")[at].tolist(), trace.column("stream")[at].tolist()))


def rescue_of(r: Replay, ooms) -> list[dict]:
    """Per recorded failed request of ``ooms``, what the replay ``r`` (walked past them) did with it: the walk
    gives each to the policy where it was made (`Replay`); reached, served or not, and the headroom left while it
    was held: the device's limit then (the target, or a limit the program set itself) less what was reserved.

    A walk that runs out of memory itself reaches no OOM record after that point."""
    served = {at: (limit - reserved if limit is not None else None) for at, reserved, limit in r.served_ooms}
    stopped_at = next((o.event for o in r.ooms if not o.recorded), None)
    return [{"event": at, "size": size, "reached": stopped_at is None or at < stopped_at, "served": at in served,
             "headroom_bytes": served.get(at)} for at, size, _ in ooms]


def _rescued(rows: list[dict], ooms) -> list[dict]:
    """Per recorded OOM, the settings that serve it, most headroom first (a row whose replay failed it again
    already counts that OOM)."""
    out = []
    for k, (at, size, _) in enumerate(ooms):
        served = [{"setting": r["setting"], "headroom_bytes": r["rescue"][k]["headroom_bytes"]}
                  for r in rows if r["rescue"][k]["served"]]
        served.sort(key=lambda s: -(s["headroom_bytes"] or 0))
        out.append({"event": at, "size": size, "recorded": rows[0]["rescue"][k], "served_by": served})
    return out


# ---- the picture ---------------------------------------------------------------------------------
