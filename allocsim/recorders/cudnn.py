"""cuDNN's benchmark-mode plan searches, flagged in a torch recording made without C++ stacks
(docs/allocator-dependent.md, "cuDNN without C++ stacks").

With ``torch.backends.cudnn.benchmark`` on, a convolution of a new shape searches for a plan
(``generate_and_filter_plans``): it asks for the largest workspace its plans want, halving the request on
each OOM it catches, times the plans with it, frees it, and ``run_single_conv`` then calls the caching
allocator's ``emptyCache()`` from C++. The workspace is the largest request of the search and has a segment
of its own, so that release frees at least its segment: in the trace, the workspace's FREE is followed at
once by segment frees that no Python ``torch.cuda.empty_cache()`` made (none, or a CACHE_RELEASE the
recorder inferred from them). That ALLOC is flagged `events.CATCHES_OOM`, as C++ stacks would flag it,
after the recording, in one pass over the finished trace (no cost per step).
"""
from __future__ import annotations

import numpy as np

from ..trace import events as ev
from ..trace.format import read_trace_file

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
    nxt = np.append(k[1:], 0)
    after = np.append(k[2:], [0, 0])
    inferred = (nxt == ev.CACHE_RELEASE) & np.isin(after, _RELEASING)
    if len(program_releases):
        inferred &= ~np.isin(np.append(at[1:], -1), np.asarray(list(program_releases), np.int64))
    frees = at[(k == ev.FREE) & (np.isin(nxt, _RELEASING) | inferred)]
    if not len(frees):
        return np.zeros(0, np.int64)
    allocs = at[k == ev.ALLOC]
    ids = np.asarray(records["id"])
    order = np.argsort(ids[allocs], kind="stable")
    sorted_ids = ids[allocs][order]
    want = ids[frees]
    pos = np.minimum(np.searchsorted(sorted_ids, want), len(sorted_ids) - 1)
    found = sorted_ids[pos] == want
    return np.sort(allocs[order[pos[found]]])


def flag_plan_searches(path: str, program_releases=()) -> int:
    """Flag `plan_searches` of the trace file ``path`` (finished, not yet published) `events.CATCHES_OOM` in
    place; return how many were flagged (those flagged already not counted)."""
    _, records, _, _ = read_trace_file(path)
    at = plan_searches(records, program_releases)
    at = at[(np.asarray(records["flags"][at]) & ev.CATCHES_OOM) == 0]
    if len(at):
        rw = np.memmap(path, records.dtype, mode="r+", offset=records.offset, shape=records.shape)
        rw["flags"][at] |= ev.CATCHES_OOM
        rw.flush()
        del rw
    return len(at)


def seal(recorder, path: str) -> None:
    """The torch recorder's `Recorder.seal`: with ``torch.backends.cudnn.benchmark`` on at the end and no C++ stacks
    (which flag them from their frames), flag the plan searches of ``path``; the count goes to the stats' notes."""
    if recorder.stacks != "all" and recorder.torch.backends.cudnn.benchmark:
        n = flag_plan_searches(path, recorder.program_releases)
        recorder.note(f"cudnn.benchmark: {n} plan-search workspace requests flagged CATCHES_OOM (each followed by "
                      f"the emptyCache cuDNN makes after a search)")
