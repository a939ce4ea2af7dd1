"""Phases of a run (PHASE scopes): what was requested inside them, what of a peak they hold, and the view of a
recording that a later run with warm compile caches would make (docs/compile.md).

A request belongs to the innermost phase open when it is made (an autotuning inside a compilation is the
autotuning's), so the phases' shares add up. `PhaseTally` finds them in one pass, a chunk at a time, beside
`Trace.load`'s validation: memory bounded by the live objects allocated inside phases. `warm_view` is the
transform behind ``--warm-cache``.
"""
from __future__ import annotations

import numpy as np

from . import events as ev
from .scopes import label_of, scopes_of
from .trace import LiveBytes, Trace, _find

#: The phases a later run with warm caches does not go through again: torch.compile's compilation and
#: autotuning, whose results it loads from the caches (docs/compile.md).
COLD_PHASES = ("compile", "autotune")


class PhaseTally:
    """The requests made inside each phase label and the live bytes they hold at a point; a walker
    (`Trace.walk`). ``at``: the event whose live bytes are split (None: where LOAD, the peak of live requested
    bytes, is first reached)."""

    def __init__(self, at: int | None = None, n_labels: int | None = None):
        self.at = at
        self.n_labels = n_labels        # the footer's labels: an index past them counts as one unknown label
        self.stack: list[int] = []          # the open phases' label indices, innermost last
        self.begins = np.zeros(0, np.int64)     # PHASE_BEGINs per label index
        self.requests = np.zeros(0, np.int64)
        self.request_bytes = np.zeros(0, np.int64)
        self.held = np.zeros(0, np.int64)   # live bytes allocated inside each label's phases, now
        self.ids = np.zeros(0, np.int64)    # the live objects allocated inside a phase: ids (sorted), sizes, labels
        self.sizes = np.zeros(0, np.int64)
        self.labels = np.zeros(0, np.int64)
        self.live = LiveBytes()
        self.split_at: int | None = None    # the event `split` is of, and its live bytes
        self.split_live = 0
        self.split = np.zeros(0, np.int64)

    def _grow(self, n: int) -> None:
        if n > len(self.requests):
            for name in ("begins", "requests", "request_bytes", "held", "split"):
                a = getattr(self, name)
                setattr(self, name, np.concatenate([a, np.zeros(n - len(a), np.int64)]))

    def add(self, chunk) -> None:
        rec, start = chunk.rec, chunk.start
        curve = self.live.curve(chunk)
        p = np.sort(np.concatenate([chunk.where(ev.PHASE_BEGIN), chunk.where(ev.PHASE_END)]))
        after = np.empty(len(p) + 1, np.int64)      # the innermost open label after each phase event (-1: none)
        after[0] = self.stack[-1] if self.stack else -1
        for k, (kind, label) in enumerate(zip(rec["kind"][p].tolist(), rec["aux"][p].tolist())):
            if self.n_labels is not None:
                label = min(label, self.n_labels)
            if kind == ev.PHASE_BEGIN:
                self.stack.append(label)
                self._grow(label + 1)
                self.begins[label] += 1
            elif self.stack:
                self.stack.pop()
            after[k + 1] = self.stack[-1] if self.stack else -1
        a = chunk.where(ev.ALLOC)
        a_label = after[np.searchsorted(p, a)]
        inside = a_label >= 0
        sizes = chunk.alloc_sizes.astype(np.int64)
        if inside.any():
            self._grow(int(a_label.max()) + 1)
            n = len(self.requests)
            self.requests += np.bincount(a_label[inside], minlength=n)
            self.request_bytes += np.bincount(a_label[inside], sizes[inside], minlength=n).astype(np.int64)
        # what each event adds to or takes from a label's held bytes: its phase ALLOCs, the FREEs of their objects
        ids = np.concatenate([self.ids, chunk.ids(ev.ALLOC)[inside]])
        obj_sizes = np.concatenate([self.sizes, sizes[inside]])
        obj_labels = np.concatenate([self.labels, a_label[inside]])
        order = np.argsort(ids, kind="stable")
        ids, obj_sizes, obj_labels = ids[order], obj_sizes[order], obj_labels[order]
        f, f_ids = chunk.where(ev.FREE), chunk.ids(ev.FREE)
        pos = _find(ids, f_ids) if len(ids) else np.zeros(len(f_ids), np.intp)
        freed = (ids[pos] == f_ids) if len(ids) else np.zeros(len(f_ids), bool)
        at = np.concatenate([a[inside], f[freed]])
        delta = np.concatenate([sizes[inside], -obj_sizes[pos[freed]]])
        label = np.concatenate([a_label[inside], obj_labels[pos[freed]]])
        j = self._split_here(start, curve)
        if j is not None:
            upto = at <= j
            self.split = self.held + np.bincount(label[upto], delta[upto], minlength=len(self.held)).astype(np.int64)
        if len(label):
            self.held += np.bincount(label, delta, minlength=len(self.held)).astype(np.int64)
        keep = np.ones(len(ids), bool)
        keep[pos[freed]] = False
        self.ids, self.sizes, self.labels = ids[keep], obj_sizes[keep], obj_labels[keep]

    def _split_here(self, start: int, curve: np.ndarray) -> int | None:
        """The position in this chunk of the event to split, if it is here."""
        if not len(curve):
            return None
        if self.at is None:
            j = int(np.argmax(curve))
            if self.split_at is not None and curve[j] <= self.split_live:
                return None
        elif start <= self.at < start + len(curve):
            j = self.at - start
        else:
            return None
        self.split_at, self.split_live = start + j, int(curve[j])
        return j

    def summary(self, names: list[str]) -> dict | None:
        """``{"phases": {label: {scopes, requests, request_bytes, live_bytes}}, "event", "live_bytes"}``: the
        phases' requests and their live bytes at the split event (None when the trace has no phase)."""
        if not self.begins.any():
            return None
        split = self.split if len(self.split) else np.zeros(len(self.begins), np.int64)
        phases = {}
        for k in np.flatnonzero(self.begins).tolist():
            name = names[k] if k < len(names) else "(a label index past the footer's table)"
            phases[name] = {"scopes": int(self.begins[k]), "requests": int(self.requests[k]),
                            "request_bytes": int(self.request_bytes[k]), "live_bytes": int(split[k])}
        return {"phases": phases, "event": self.split_at, "live_bytes": self.split_live,
                "requests": int(self.requests.sum()), "request_bytes": int(self.request_bytes.sum())}


def phase_shares(trace: Trace, at: int | None = None) -> dict | None:
    """`PhaseTally.summary` of ``trace`` (a pass of its own), split at event ``at`` (None: the LOAD peak)."""
    tally = PhaseTally(at, len(trace.labels))
    trace.walk(tally)
    return tally.summary(trace.labels)


def cold_spans(trace: Trace, cold=COLD_PHASES) -> np.ndarray:
    """``[[begin, end], ...]``: the event indices of each outermost phase named in ``cold`` (one inside another
    is its part) and of its END (the trace's length when it never ended), in order."""
    phases = scopes_of(trace, ev.PHASE_BEGIN)
    cold_labels = [k for k, name in enumerate(trace.labels) if name in cold]
    spans, last_end = [], -1
    for k in np.flatnonzero(np.isin(phases.label, cold_labels)).tolist():    # ordered by begin
        if phases.begin[k] > last_end:
            spans.append((int(phases.begin[k]), int(phases.end[k])))
            last_end = int(phases.end[k])
    return np.array(spans, np.int64).reshape(-1, 2)


def step_ends(kind: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """For each span of `cold_spans`, where the step it ends in ends: the first MARK after it (the recorder marks
    each optimizer step), else the end of the trace."""
    marks = np.flatnonzero(kind == ev.MARK)
    k = np.searchsorted(marks, spans[:, 1])
    return np.where(k < len(marks), marks[np.minimum(k, max(len(marks) - 1, 0))] if len(marks) else 0, len(kind))


def warm_view(trace: Trace, cold=COLD_PHASES) -> Trace:
    """What a later run of the recorded program with warm compile caches would make (docs/compile.md): the
    trace without the objects allocated inside a ``cold`` phase that die in the step it ends in (freed before
    the next MARK, or the end of the trace without one; or failed) and their FREE_REQUESTEDs, the OOMs and TRY scopes inside those phases, and the recorded allocator's segment
    events (a run nobody recorded has none); what outlives that step is kept. Object ids are renumbered densely.
    The metadata's ``warm_cache`` says what was left out; the view is in memory, without a path."""
    rec = np.asarray(trace.records)
    kind, ids = rec["kind"], rec["id"].astype(np.int64)
    spans = cold_spans(trace, cold)
    span = np.searchsorted(spans[:, 0], np.arange(len(rec)), side="right") - 1 if len(spans) \
        else np.full(len(rec), -1)
    if len(spans):
        span[(span >= 0) & (np.arange(len(rec)) >= spans[np.maximum(span, 0), 1])] = -1     # between spans
    a = np.flatnonzero(kind == ev.ALLOC)
    n_ids = int(ids[a].max()) + 1 if len(a) else 0
    born_in = np.full(n_ids, -1, np.int64)
    born_in[ids[a]] = span[a]
    dies = np.zeros(n_ids, bool)             # allocated inside a cold phase, freed before its step ends (or failed)
    f = np.flatnonzero(kind == ev.FREE)
    born = born_in[ids[f]]
    step_end = step_ends(kind, spans)
    inside_f = f[(born >= 0) & (f < step_end[np.maximum(born, 0)])] if len(spans) else f[:0]
    dies[ids[inside_f]] = True
    failed = a[(span[a] >= 0) & (rec["flags"][a] & ev.FAILED != 0)]
    dies[ids[failed]] = True
    drop = np.zeros(len(rec), bool)
    of_object = np.isin(kind, (ev.ALLOC, ev.FREE, ev.FREE_REQUESTED))
    drop[of_object] = dies[np.minimum(ids[of_object], max(n_ids - 1, 0))] if n_ids else False
    drop |= (span >= 0) & np.isin(kind, (ev.OOM, ev.TRY_BEGIN, ev.TRY_END))
    segments = np.isin(kind, (ev.SEGMENT_ALLOC, ev.SEGMENT_FREE, ev.SEGMENT_MAP, ev.SEGMENT_UNMAP))
    drop |= segments
    out = rec[~drop].copy()
    kept_ids = ids[a][~dies[ids[a]]]
    new = np.full(n_ids, ev.NO_ID, np.int64)
    new[kept_ids] = np.arange(len(kept_ids))
    obj = np.isin(out["kind"], (ev.ALLOC, ev.FREE, ev.FREE_REQUESTED))
    out["id"][obj] = new[out["id"][obj].astype(np.int64)]
    in_cold = a[span[a] >= 0]
    died = in_cold[dies[ids[in_cold]]]
    outlived = in_cold[~dies[ids[in_cold]]]
    size = rec["size"].astype(np.int64)
    left_out = {"phases": len(spans), "allocs": len(died), "alloc_bytes": int(size[died].sum()),
                "kept_allocs": len(outlived), "kept_alloc_bytes": int(size[outlived].sum()),
                "ooms": int(np.count_nonzero(drop & (kind == ev.OOM))),
                "tries": int(np.count_nonzero(drop & (kind == ev.TRY_BEGIN))),
                "segment_events": int(np.count_nonzero(segments))}
    meta = {**trace.meta, "warm_cache": left_out}
    return Trace(out, meta, streams=trace.streams, sites=trace.sites, labels=trace.labels,
                 finished=trace.finished)


def checked_warm_view(trace: Trace, name: str) -> Trace:
    """`warm_view`, where ``trace`` (named ``name`` in the error) holds a cold phase: one that holds none is refused
    (`InputError`), as ``replay``, ``compare``, ``tune`` and ``validate --warm-cache`` refuse it, since nothing in it
    tells what a warm run leaves out (its view would be the recording less its segment calls)."""
    from ..errors import InputError
    view = warm_view(trace)
    if not view.meta["warm_cache"]["phases"]:
        raise InputError(f"--warm-cache: the trace holds no {' or '.join(COLD_PHASES)} phase (a program that does "
                         f"not compile, or a recording made before allocsim marked them): nothing tells what a "
                         f"warm run leaves out", path=name)
    return view


def open_phase(trace: Trace, at: int) -> str | None:
    """The innermost phase open at event ``at`` (its label), None outside every phase."""
    phases = scopes_of(trace, ev.PHASE_BEGIN)
    k = phases.innermost(at) if len(phases) else None
    return None if k is None else label_of(trace, phases, k)


def recorded_peak(trace: Trace) -> tuple[str, int]:
    """``(what, event)``: where the recorded run first reached its peak: the reserved bytes of the recorded
    allocator's segment events where the trace has them, else LOAD (live requested bytes)."""
    kind = np.asarray(trace.kind)
    seg = np.flatnonzero(np.isin(kind, (ev.SEGMENT_ALLOC, ev.SEGMENT_MAP, ev.SEGMENT_FREE, ev.SEGMENT_UNMAP)))
    if len(seg):
        sign = np.where(np.isin(kind[seg], (ev.SEGMENT_ALLOC, ev.SEGMENT_MAP)), 1, -1)
        return "peak reserved", int(seg[np.argmax(np.cumsum(sign * np.asarray(trace.size)[seg].astype(np.int64)))])
    return "LOAD", int(np.argmax(trace.live_curve)) if len(trace) else 0
