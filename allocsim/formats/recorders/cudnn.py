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

from ...trace import events as ev
from ...trace.format import read_trace_file
from ...trace.scopes import plan_searches


def flag_plan_searches(path: str, program_releases=()) -> int:
    """Flag `plan_searches` of the trace file ``path`` (finished, not yet published) `events.CATCHES_OOM` in
    place; return how many were flagged (those flagged already not counted)."""
    _, records, _, _, _ = read_trace_file(path)
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
    cudnn = getattr(getattr(recorder.torch, "backends", None), "cudnn", None)     # a torch built without cuDNN
    if recorder.stacks != "all" and getattr(cudnn, "benchmark", False):
        n = flag_plan_searches(path, recorder.program_releases)
        recorder.note(f"cudnn.benchmark: {n} plan-search workspace requests flagged CATCHES_OOM (each followed by "
                      f"the emptyCache cuDNN makes after a search)")
