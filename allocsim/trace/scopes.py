"""What a replay reads of the OOMs a program survives, once per trace: its scopes (`events.SCOPES`) as extents,
which TRY scope a failed request lies in (what a replay unwinds, docs/allocator-dependent.md, "Try scopes"), the
requests no failure can drop, and cuDNN's plan searches (`plan_searches`: a failed one asks again for half).

A scope's END closes the open BEGIN of its serial (``size``), and with it any open inside it; an END without an open
BEGIN is ignored; a scope left open (a trace cut short) ends at the trace's end.
"""
from __future__ import annotations

import weakref

import numpy as np

from . import events as ev

#: what `_kept` read of each trace, while the trace lives
_KEPT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class Scopes:
    """The scopes of one kind: ``begin`` and ``end`` (trace indices of the BEGIN and END records, int64) and
    ``label`` (index into the trace's labels), ordered by ``begin``; inner scopes begin later and end earlier."""

    def __init__(self, begin: np.ndarray, end: np.ndarray, label: np.ndarray):
        self.begin, self.end, self.label = begin, end, label

    def __len__(self) -> int:
        return len(self.begin)

    def innermost(self, at: int) -> int | None:
        """The scope open at trace index ``at`` (begun before it, ended after it) that began last, or None."""
        inside = np.flatnonzero((self.begin < at) & (self.end > at))
        return int(inside[-1]) if len(inside) else None

    def inside(self, n: int) -> np.ndarray:
        """Per record of a trace of ``n`` records: whether it lies inside a scope (strictly between a BEGIN and its
        END)."""
        depth = np.zeros(n + 1, np.int64)
        np.add.at(depth, self.begin + 1, 1)
        np.add.at(depth, self.end, -1)
        return np.cumsum(depth[:n]) > 0


def scopes_of(trace, begin_kind: int = ev.TRY_BEGIN) -> Scopes:
    """The scopes of ``begin_kind`` (`events.TRY_BEGIN` or `events.PHASE_BEGIN`) in ``trace``, kept for its next
    reads (the last few traces)."""
    return _kept(trace, begin_kind, lambda: _read(trace, begin_kind))


def _kept(trace, what, make):
    """``make()``, read from ``trace``, kept for its next reads while the trace lives."""
    kept = _KEPT.setdefault(trace, {})
    if what not in kept:
        kept[what] = make()
    return kept[what]


def _read(trace, begin_kind: int) -> Scopes:
    end_kind = ev.SCOPES[begin_kind]
    empty = np.zeros(0, np.int64)
    if begin_kind not in trace.kinds_present:
        return Scopes(empty, empty, empty)
    kind = trace.kind
    at = np.flatnonzero((kind == begin_kind) | (kind == end_kind))
    rec = trace.records[at]
    begins, ends, labels = [], [], []
    open_: list[tuple[int, int]] = []       # (serial, position in the lists) of the open scopes, innermost last
    for x, k, serial, label in zip(at.tolist(), rec["kind"].tolist(), rec["size"].tolist(), rec["aux"].tolist()):
        if k == begin_kind:
            open_.append((serial, len(begins)))
            begins.append(x)
            ends.append(len(trace))
            labels.append(label)
        elif any(s == serial for s, _ in open_):
            while open_:
                s, pos = open_.pop()
                ends[pos] = x
                if s == serial:
                    break
    return Scopes(np.array(begins, np.int64), np.array(ends, np.int64), np.array(labels, np.int64))


def label_of(trace, scopes: Scopes, k: int) -> str:
    """The label text of scope ``k``."""
    a = int(scopes.label[k])
    return trace.labels[a] if a < len(trace.labels) else f"label {a}"


def may_survive(trace) -> bool:
    """Whether a replay of ``trace`` may survive a failed request: it holds TRY scopes or ALLOCs flagged
    `events.CATCHES_OOM`."""
    return _kept(trace, "survive", lambda: bool(len(scopes_of(trace))) or bool(
        np.any((trace.kind == ev.ALLOC) & (trace.flags & ev.CATCHES_OOM != 0))))


def sure_load(trace) -> int:
    """The peak live requested bytes of the objects no survived failure can drop: those allocated outside every TRY
    scope and not flagged `events.CATCHES_OOM` (LOAD where the trace holds neither). A replay that lives (no OOM that
    stops it) holds at least these: the least memory any policy needs."""
    return trace.load_bytes if not may_survive(trace) else _kept(trace, "sure load", lambda: _sure_load(trace))


def _sure_load(trace) -> int:
    kind, ids = trace.kind, trace.id.astype(np.int64)
    alloc = kind == ev.ALLOC
    sure = alloc & ~scopes_of(trace).inside(len(trace)) & (trace.flags & ev.CATCHES_OOM == 0)
    size = np.zeros(max(trace.n_ids, 1), np.int64)
    size[ids[sure]] = trace.size[sure].astype(np.int64)
    delta = np.zeros(len(trace), np.int64)
    delta[sure] = size[ids[sure]]
    free = kind == ev.FREE
    delta[free] = -size[np.minimum(ids[free], len(size) - 1)]
    return int(max(np.cumsum(delta).max(initial=0), 0))


#: Segment calls that give memory back (an emptyCache frees segments, or unmaps expandable ones).
_RELEASING = (ev.SEGMENT_FREE, ev.SEGMENT_UNMAP)
#: The kinds the rule reads, in order: the block, segment and release events (not FREE_REQUESTED, MARK, ...).
_SEEN = (ev.ALLOC, ev.FREE, ev.SEGMENT_ALLOC, ev.SEGMENT_MAP, *_RELEASING, ev.CACHE_RELEASE, ev.OOM)


def plan_searches(records: np.ndarray, program_releases=()) -> np.ndarray:
    """Trace indices of the ALLOCs whose FREE is followed at once by segment frees (or a CACHE_RELEASE that is
    not one of ``program_releases``, the trace indices of the program's own ``empty_cache()`` calls, then
    segment frees): the workspaces of cuDNN's plan searches in benchmark mode. O(records)."""
    kind = np.asarray(records["kind"])
    at = np.flatnonzero(np.isin(kind, _SEEN))
    k = kind[at]
    pad = np.append(k, [0, 0])      # (0: no kind) past the end
    nxt, after = pad[1:len(k) + 1], pad[2:len(k) + 2]
    inferred = (nxt == ev.CACHE_RELEASE) & np.isin(after, _RELEASING)
    if len(program_releases):
        inferred &= ~np.isin(np.append(at[1:], -1), np.asarray(list(program_releases), np.int64))
    frees = at[(k == ev.FREE) & (np.isin(nxt, _RELEASING) | inferred)]
    allocs = at[k == ev.ALLOC]
    if not len(frees) or not len(allocs):
        return np.zeros(0, np.int64)
    ids = np.asarray(records["id"])
    order = np.argsort(ids[allocs], kind="stable")
    sorted_ids = ids[allocs][order]
    want = ids[frees]
    pos = np.minimum(np.searchsorted(sorted_ids, want), len(sorted_ids) - 1)
    found = sorted_ids[pos] == want
    return np.sort(allocs[order[pos[found]]])


def plan_search_set(trace) -> frozenset:
    """Trace indices of the ALLOCs flagged `events.CATCHES_OOM` that are cuDNN plan searches (`plan_searches`): a
    replay that fails one asks again for half as much (docs/allocator-dependent.md, "cuDNN's halving")."""
    def make():
        if not np.any((trace.kind == ev.ALLOC) & (trace.flags & ev.CATCHES_OOM != 0)):
            return frozenset()
        at = plan_searches(trace.records)
        return frozenset(at[(np.asarray(trace.flags[at]) & ev.CATCHES_OOM) != 0].tolist())
    return _kept(trace, "plan searches", make)
