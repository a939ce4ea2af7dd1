"""Fidelity check: replay a trace with the model of the allocator that recorded it and
compare the model's device calls with the recorded allocator's own upstream events.

A trace recorded under PyTorch carries SEGMENT_ALLOC/FREE/MAP/UNMAP events (the
snapshot's ``segment_*`` entries); one recorded under CuPy carries SEGMENT_ALLOC
(memory hooks) and, from `allocsim record`, every SEGMENT_FREE (read from the pool's
``total_bytes()``; the first recorder wrapped the upstream allocator), so its reserved
bytes are compared even where the pool released nothing. An imported DebugPrintHook log
sees no segment free: there the frees and reserved bytes are compared only where it
holds a free (`Spec.always_on`).
The matching model (`torch`, `cupy`) is replayed with the recorded settings (each
model reads ``trace.meta`` itself) and logs its own device calls in
``policy.segment_log`` as ``(kind, size, event_index)``, kinds from
`allocsim.trace.events`. A new model plugs in with one `Spec` in ``SPECS``.

Compared: the number of segment allocations (cudaMalloc + page maps) and releases,
their kinds and sizes in order, each for the same request (the first ALLOC at or
after the call, on both sides: the walk files a cache release's or a recorded
OOM's calls under that event), peak and final reserved bytes (from
each side's segment events, starting from the recorded initial segments when the
trace had them), and the OOMs: how many and at which events (the recording's OOM
records, which the replay attempts again, against the model's failed requests). The
segment frees one call made are compared as a set where the recorder cannot see
their order (CuPy: ``Spec.free_order``). On a mismatch the first diverging segment
event is reported with both sides' trace event index, kind, size and reserved bytes.

Limitation: a trace whose ring buffer wrapped starts with PRE_EXISTING blocks and
``meta["initial_segments"]``. The reserved totals start from those segments on the
recorded side, but the models are not seeded with that layout: they place the
pre-existing blocks themselves, so their segment calls during the first iteration
differ. Such a result is labelled ``unseeded``.

Costs: one replay, plus O(segment events) to compare.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..filenames import shown_name
from ..engine.replay import Replay
from ..errors import InputError
from ..trace import Trace
from ..trace import events as ev
from ..trace.analysis import catches_oom_known
from ..trace.scopes import scopes_of

GROW = (ev.SEGMENT_ALLOC, ev.SEGMENT_MAP)
SHRINK = (ev.SEGMENT_FREE, ev.SEGMENT_UNMAP)
SEGMENT_KINDS = GROW + SHRINK


@dataclass(frozen=True)
class Spec:
    """How to validate one framework's traces: the model and what its recorder sees."""

    framework: str
    policy: str
    #: segment kinds every trace of the framework holds whenever its allocator made them; kinds not listed (nor in
    #: `recorded`) are compared only when the trace holds at least one (CuPy's hooks cannot see upstream frees)
    always: tuple = (ev.SEGMENT_ALLOC,)
    #: whether the recorder sees the order of the segment frees one call makes (CuPy's reads
    #: them from the pool's ``total_bytes()`` and writes them by address: they are compared as a set)
    free_order: bool = True
    #: segment kinds `allocsim record` always writes besides ``always``: CuPy's recorder sees every segment free (from
    #: the pool's ``total_bytes()``; its first version, from a wrapped upstream allocator), where an imported
    #: DebugPrintHook log cannot; with them the trace carries the pool's reserved bytes (formats/recorders/cupy.py)
    recorded: tuple = ()

    def always_on(self, meta: dict) -> tuple:
        """The kinds a trace with metadata ``meta`` holds whenever its allocator made them: `recorded` too for a
        trace `allocsim record` wrote (its producer ``allocsim VERSION record``)."""
        producer = meta.get("producer")
        mine = isinstance(producer, str) and producer.startswith("allocsim ") and producer.endswith(" record")
        return self.always + self.recorded * mine


SPECS = {
    "torch": Spec("torch", "torch", always=SEGMENT_KINDS),
    "cupy": Spec("cupy", "cupy", always=(ev.SEGMENT_ALLOC,), free_order=False, recorded=(ev.SEGMENT_FREE,)),
}


@dataclass
class Side:
    """One side's segment events: kinds, sizes, trace event indices; derived totals.

    ``requests`` names the request each call served: the trace index of the ALLOC whose
    malloc made it (a recorded segment event precedes the ALLOC it was made for).
    Equal (kind, size, request) sequences mean equal reserved bytes after every event.
    """

    kinds: list
    sizes: list
    events: list
    initial_reserved: int = 0
    requests: list | None = None

    def reserved_after(self) -> np.ndarray:
        sign = np.where(np.isin(np.asarray(self.kinds, np.int64), SHRINK), -1, 1)
        return self.initial_reserved + np.cumsum(sign * np.asarray(self.sizes, np.int64))

    def frees_by_size(self) -> "Side":
        """The same calls with each run of frees made for one request in size order (the order a
        recorder that cannot see it would compare them in)."""
        order = sorted(range(len(self.kinds)), key=lambda j: (self._run_start(j), self.sizes[j]))
        pick = lambda xs: [xs[j] for j in order]        # noqa: E731
        return Side(pick(self.kinds), pick(self.sizes), pick(self.events), self.initial_reserved,
                    pick(self.requests))

    def _run_start(self, j: int) -> int:
        """Where the run of consecutive frees for one request that holds call j starts (j: any other call)."""
        while j > 0 and self.kinds[j] in SHRINK and self.kinds[j - 1] in SHRINK \
                and self.requests[j - 1] == self.requests[j]:
            j -= 1
        return j

    def totals(self) -> dict:
        r = self.reserved_after()
        grows = sum(1 for k in self.kinds if k in GROW)
        return {"segment_allocs": grows, "segment_frees": len(self.kinds) - grows,
                "peak_reserved": int(max(self.initial_reserved, r.max())) if len(r) else self.initial_reserved,
                "final_reserved": int(r[-1]) if len(r) else self.initial_reserved}


@dataclass
class Validation:
    trace: str | None
    framework: str
    policy: str
    options: dict
    kinds_compared: list
    match: bool
    seeded: bool
    pre_existing: int
    checks: list = field(default_factory=list)          # {name, recorded, model, ok}
    first_divergence: dict | None = None
    recorded_events: int = 0
    model_events: int = 0
    #: segment allocations the recording made in private pools (CUDA graphs, MemPool)
    private_pool_segments: int = 0
    #: requests flagged CATCHES_OOM (the program survives failing them: docs/allocator-dependent.md); None when
    #: the trace cannot tell (no C++ stacks)
    catches_oom: int | None = None
    #: the trace's private-pool events (`events.POOL`), which the model follows; with private segments and none
    #: of these the pools were not seen, so the segment calls, reserved bytes and OOMs cannot be trusted
    pool_events: int = 0
    #: TRY scopes (code that catches an OOM raised inside it and goes on), which the model follows
    try_scopes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def recorded_side(trace: Trace, kinds) -> Side:
    kind = np.asarray(trace.kind)
    idx = np.flatnonzero(np.isin(kind, list(kinds)))
    initial = sum(int(s.get("total_size", 0)) for s in trace.meta.get("initial_segments") or []
                  if isinstance(s, dict))
    return Side(kind[idx].tolist(), np.asarray(trace.size)[idx].tolist(), idx.tolist(), initial,
                request_of(trace, idx))


def request_of(trace: Trace, events) -> list:
    """The request each segment event served: the first ALLOC at or after it (-1: none). A recorded
    segment event precedes its ALLOC; a model's call is logged at its ALLOC, or at the cache release or
    recorded OOM that made it, which the recording also shows before the next ALLOC."""
    allocs = np.flatnonzero(np.asarray(trace.kind) == ev.ALLOC)
    if not len(allocs):
        return [-1] * len(events)
    nxt = np.searchsorted(allocs, np.asarray(events, np.int64))
    return np.where(nxt < len(allocs), allocs[np.minimum(nxt, len(allocs) - 1)], -1).tolist()


def model_side(log, kinds, initial_reserved: int, trace: Trace) -> Side:
    keep = [(k, s, e) for k, s, e in log if k in kinds]
    events = [e for _, _, e in keep]
    return Side([k for k, _, _ in keep], [s for _, s, _ in keep], events, initial_reserved,
                request_of(trace, events))


def first_divergence(rec: Side, mod: Side) -> dict | None:
    """The first position where the two sequences of (kind, size, request) differ, with context."""
    n = min(len(rec.kinds), len(mod.kinds))
    i = next((j for j in range(n) if rec.kinds[j] != mod.kinds[j] or rec.sizes[j] != mod.sizes[j]
              or rec.requests[j] != mod.requests[j]), n)
    if i == n and len(rec.kinds) == len(mod.kinds):
        return None
    out = {"index": i}
    for name, side in (("recorded", rec), ("model", mod)):
        after = side.reserved_after()
        before = int(after[i - 1]) if i > 0 else side.initial_reserved
        out[name + "_reserved"] = before
        if i < len(side.kinds):
            out[name] = {"event": int(side.events[i]), "request": int(side.requests[i]),
                         "kind": ev.KIND_NAMES[side.kinds[i]],
                         "size": int(side.sizes[i]), "reserved_before": before,
                         "reserved_after": int(after[i])}
        else:
            out[name] = None
    return out


def spec_of(trace: Trace) -> Spec:
    """The `Spec` of the framework that recorded ``trace``; `InputError` when it has none."""
    fw = str(trace.meta.get("framework") or "")
    spec = SPECS.get(fw)
    if spec is None:
        raise InputError(f"framework {fw or 'unknown'!r} has no allocator model to validate against "
                         f"(known: {', '.join(sorted(SPECS))})", path=trace.path or "<trace>", position="metadata")
    return spec


def compared_kinds(trace: Trace, spec: Spec) -> tuple:
    """The segment kinds compared on ``trace`` (`Spec.always_on` its metadata, and those it holds); `InputError` when
    it holds none."""
    present = set(np.unique(np.asarray(trace.kind)).tolist())
    if not present & set(SEGMENT_KINDS):
        raise InputError("the trace holds no upstream segment events of the recorded allocator; nothing to "
                         "validate", path=trace.path or "<trace>", position="events")
    always = spec.always_on(trace.meta)
    return tuple(k for k in SEGMENT_KINDS if k in always or k in present)


def model_run(trace: Trace, spec: Spec, options, capacity, cap):
    """``(result, segment log, seeded)``: ``trace`` replayed by the model, its device calls logged."""
    r = Replay(trace, spec.policy, options=options, capacity=capacity, cap=cap, keep_going=True, log_events=True)
    if r.segment_log is None:
        r.close()
        raise InputError(f"policy {spec.policy!r} keeps no segment_log", path=trace.path or "<trace>")
    try:
        return r.run(), r.segment_log, r.policy.seeded
    finally:
        r.close()


def validate(trace: Trace | str, *, options=None, capacity="trace", cap=None) -> Validation:
    """Replay ``trace`` (a `Trace` or its file's name) with its recorder's allocator model; compare the segment calls."""
    if not isinstance(trace, Trace):
        trace = Trace.load(trace)       # (a str, a pathlib.Path; anything else a TypeError saying so)
    spec = spec_of(trace)
    fw = spec.framework
    kinds = compared_kinds(trace, spec)
    res, log, seeded = model_run(trace, spec, options, capacity, cap)
    flags, kind = np.asarray(trace.flags), np.asarray(trace.kind)
    pre = int(np.count_nonzero((kind == ev.ALLOC) & (flags & ev.PRE_EXISTING != 0)))
    private = int(np.count_nonzero((kind == ev.SEGMENT_ALLOC) & (flags & ev.PRIVATE_POOL != 0)))
    catches = catches_oom_known(int(np.count_nonzero((kind == ev.ALLOC) & (flags & ev.CATCHES_OOM != 0))),
                                trace.meta)
    pool_events = int(np.count_nonzero(np.isin(kind, ev.POOL)))
    tries = len(scopes_of(trace))
    rec = recorded_side(trace, kinds)
    mod = model_side(log, kinds, rec.initial_reserved if seeded else 0, trace)
    if not spec.free_order:
        rec, mod = rec.frees_by_size(), mod.frees_by_size()
    rt_, mt = rec.totals(), mod.totals()

    def same(*totals):
        return [{"name": k.replace("_", " "), "recorded": rt_[k], "model": mt[k], "ok": rt_[k] == mt[k]}
                for k in totals]
    checks = same("segment_allocs", "segment_frees")
    div = first_divergence(rec, mod)
    checks.append({"name": "same calls, same requests", "recorded": len(rec.kinds), "model": len(mod.kinds),
                   "ok": div is None})
    compare_reserved = ev.SEGMENT_FREE in kinds or ev.SEGMENT_UNMAP in kinds
    if compare_reserved:
        checks += same("peak_reserved", "final_reserved")
    rec_ooms = np.flatnonzero(kind == ev.OOM).tolist()
    mod_ooms = [o.event for o in res.oom_events]
    checks.append({"name": "OOMs", "recorded": len(rec_ooms), "model": res.ooms, "ok": len(rec_ooms) == res.ooms})
    checks.append({"name": "OOM events", "recorded": _events_text(rec_ooms), "model": _events_text(mod_ooms),
                   "ok": rec_ooms == mod_ooms})
    if catches or tries:    # the recorded run served every ALLOC it holds: a model that fails one diverged there
        # (the OOMs the recorded run survived are its OOM records, checked above)
        checks.append({"name": "OOMs survived", "recorded": 0, "model": res.caught_ooms, "ok": not res.caught_ooms})
    return Validation(trace=shown_name(trace.path), framework=fw, policy=spec.policy, options=res.options,
                      kinds_compared=list(kinds), match=all(c["ok"] for c in checks), seeded=seeded,
                      pre_existing=pre, private_pool_segments=private, pool_events=pool_events, catches_oom=catches, try_scopes=tries, checks=checks, first_divergence=div, recorded_events=len(rec.kinds),
                      model_events=len(mod.kinds))


def _events_text(events: list) -> str:
    """Trace indices as a short text for the check table: ``-`` when none, the first few then ``...``."""
    if not events:
        return "-"
    return ",".join(map(str, events[:3])) + (",..." if len(events) > 3 else "")


def validate_warm(cold: Trace, warm: Trace, *, options=None, capacity="trace") -> Validation:
    """Check ``--warm-cache`` (docs/compile.md): the model's replay of the warm view of ``cold`` (a first run's
    recording) against ``warm``, a recording of a later run with warm caches. The two runs' requests need not be
    the same ones, so the calls are not matched one by one: the checks are the requests made, the segment calls
    and the peak and final reserved bytes, and the OOMs."""
    from ..trace.phases import checked_warm_view
    spec = spec_of(warm)
    if spec_of(cold) != spec:
        raise InputError(f"recorded under {cold.meta.get('framework')}, the warm run under {spec.framework}",
                         path=cold.path or "<trace>", position="metadata")
    kinds = compared_kinds(warm, spec)
    view = checked_warm_view(cold, shown_name(cold.path) if cold.path else "<trace>")
    res, log, seeded = model_run(view, spec, options, capacity, None)
    rec = recorded_side(warm, kinds)
    # the model starts from the first run's segments (its warm view's), the recorded side from the later run's
    start = recorded_side(view, kinds).initial_reserved if seeded else 0
    rt_, mt = rec.totals(), model_side(log, kinds, start, view).totals()
    # the requests are shown, not held: a warm run may still autotune a kernel or two, more so under the recorder
    # (traces/README.md, "Programs that react to memory"), with the same segments and peak
    checks = [{"name": "requests", "recorded": warm.n_allocs, "model": view.n_allocs, "ok": None}]
    checks += [{"name": k.replace("_", " "), "recorded": rt_[k], "model": mt[k], "ok": rt_[k] == mt[k]}
               for k in ("segment_allocs", "segment_frees", "peak_reserved", "final_reserved")]
    ooms = int(np.count_nonzero(np.asarray(warm.kind) == ev.OOM))
    checks.append({"name": "OOMs", "recorded": ooms, "model": res.ooms, "ok": ooms == res.ooms})
    return Validation(trace=f"{shown_name(cold.path)} (--warm-cache) vs {shown_name(warm.path)}",
                      framework=spec.framework, policy=spec.policy, options=res.options, kinds_compared=list(kinds),
                      match=all(c["ok"] is not False for c in checks), seeded=seeded, pre_existing=0, checks=checks,
                      recorded_events=len(rec.kinds), model_events=len(log))
