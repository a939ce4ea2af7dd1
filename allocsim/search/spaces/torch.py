"""The PyTorch caching allocator's search space, and the canonical form of its settings.

The grid: every value the `torch` model takes, a few per option (``expandable_segments``,
``max_split_size_mb``, ``roundup_power2_divisions`` in its single and per-size forms,
``max_non_split_rounding_mb``, and ``garbage_collection_threshold`` when a ``--cap`` gives
the allocator an allowed memory). The canonical rules (`canonical`), each read off the
model (docs/models/torch.md, rules 1, 5, 6 and 13): a divisions entry of 1, or for a size
interval (1 MiB .. 64 GiB, by powers of two) that no request of the trace falls in, rounds
nothing (0); all-zero divisions are none. ``max_split_size_mb`` above the largest segment
any request can create (``get_allocation_size`` of the largest rounded request; without
expandable segments a block never outgrows its segment) compares like no limit.
``max_non_split_rounding_mb`` is read only for requests of at least ``max_split_size_mb``:
without one, or with no request that large, it is dropped. ``garbage_collection_threshold``
acts only under an allowed memory: without a cap, or where the model does not turn its GC
on under the cap (`Facts`' ``gc_acts``), it is dropped.

The families (`FAMILIES`, `allocsim.search.spaces.family`): a setting with a GC threshold, a larger
``max_non_split_rounding_mb`` or a ``max_split_size_mb`` replays as the same setting without it up to a point
the latter's replay shows (`watch`, `TorchWatcher`: the only code of the search that reads the torch model's
members).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...frameworks import torch as torch_settings
from ...frameworks.torch import (MIN_MB, N_DIVISION_INTERVALS, NO_DIVISIONS, MiB, divisions_table, parse_divisions,
                                  settings_from_trace)
from ...policies.torch import get_allocation_size, has_pool_events, round_size
from ...engine.spec import PolicySpec
from ...trace import ALLOC
from ...trace.events import CATCHES_OOM, OOM, SEGMENT_ALLOC, SET_LIMIT
from ...engine.replay import Replay, driving, kept_for
from ...trace.trace import Chunk, LiveBytes
from .family import FamilyRule, Watcher
from .labels import option_text

POLICY = "torch"
#: The counters a row's ``retries`` reads, the first the replay reports (`allocsim.search.tune`).
RETRIES = ("num_alloc_retries", "cache_flushes")

# the grid: every value the model takes, a few per option (the canonical rules shrink it per trace)
TORCH_MAX_SPLIT_MB = (None, 32, 64, 128, 256, 512)
TORCH_DIVISIONS = (None, "2", "4", "8", "16", "[64:8,256:4,>:2]", "[256:4,>:1]")
TORCH_NON_SPLIT_MB = (20, 64, 256)
TORCH_GC_THRESHOLDS = (None, 0.6, 0.8)


def spec(values: dict) -> PolicySpec:
    """A `torch` spec of these option values, those at their declared default left out (``trace_settings`` kept):
    short labels and conf lines."""
    div = values.get("roundup_power2_divisions")
    if div is not None and not any(d > 1 for d in divisions_table(div)):
        values = {**values, "roundup_power2_divisions": None}        # rounds nothing, as the model reads it
    full = PolicySpec.parse(POLICY).with_values(values)
    defaults = {p.name: p.default for p in full.policy_class().params}
    kept = tuple((k, v) for k, v in full.options if k == "trace_settings" or defaults.get(k) != v)
    return PolicySpec(full.ref, kept, full.shown)


def label(setting: PolicySpec, cap: int | None) -> str:
    """A setting's name: its options alone, ``trace_settings`` left out (the target's cap is every setting's)."""
    return option_text(setting, left_out=("trace_settings",)) or "defaults"


def recorded(trace) -> PolicySpec:
    """The recorded settings spelled out: its conf line, and the same canonical form as the grid's."""
    return spec({**settings_from_trace(trace.meta, trace.path), "trace_settings": False})


def settings(space) -> list[tuple[PolicySpec, int | None]]:
    """The grid (the GC thresholds only under a cap)."""
    gcs = TORCH_GC_THRESHOLDS if space.target.cap is not None else (None,)
    out = []
    for es in (False, True):
        for ms in TORCH_MAX_SPLIT_MB:
            for div in TORCH_DIVISIONS:
                for ns in (TORCH_NON_SPLIT_MB if ms is not None else (MIN_MB,)):
                    for gc in gcs:
                        v = {"trace_settings": False, "expandable_segments": es, "max_split_size_mb": ms,
                             "max_non_split_rounding_mb": ns, "garbage_collection_threshold": gc or 0.0}
                        if div is not None:
                            v["roundup_power2_divisions"] = parse_divisions(div)
                        out.append((spec(v), None))
    return out


class Facts(NamedTuple):
    """What the canonical rules read of one trace under one target, found once per search (`facts`)."""

    intervals: set          # the size intervals of ``roundup_power2_divisions`` a request of the trace falls in
    gc_acts: bool           # whether the model turns ``garbage_collection_threshold`` on under the target's cap


def facts(space) -> Facts:
    """`Facts` of ``space`` (an `allocsim.search.tune.Space`): the intervals of its request sizes, and whether the
    model's ``gc_on()`` holds under its cap (not when the cap is the whole device, fraction 1)."""
    bits = np.array([int(n).bit_length() for n in space.request_sizes], dtype=np.int64)
    intervals = set(np.minimum(np.maximum(bits - 21, 0), N_DIVISION_INTERVALS - 1).tolist())
    target = space.target
    if target.cap is None:
        return Facts(intervals, False)
    r = Replay(space.trace, spec({"garbage_collection_threshold": 0.5, "trace_settings": False}), cap=target.cap,
               capacity=target.capacity)
    pol = r.policy
    r.close()
    return Facts(intervals, pol.gc_on())


def canonical(space, values: dict) -> dict:
    """Option values equal for settings whose replays of ``space.trace`` are equal (the module's rules)."""
    v = {"max_non_split_rounding_mb": MIN_MB, **values}
    div = divisions_table(v["roundup_power2_divisions"]) if v.get("roundup_power2_divisions") else NO_DIVISIONS
    div = tuple(d if d > 1 and i in space.facts.intervals else 0 for i, d in enumerate(div))
    v["roundup_power2_divisions"] = div if any(div) else None
    ms = v.get("max_split_size_mb")
    largest = space.largest_request
    largest_segment = get_allocation_size(round_size(largest, div)) if largest else 0
    if ms is not None and not v.get("expandable_segments") and ms * MiB > largest_segment:
        v["max_split_size_mb"] = ms = None
    if ms is None or round_size(largest, div) < ms * MiB:
        v["max_non_split_rounding_mb"] = MIN_MB
    if not (space.facts.gc_acts and v.get("garbage_collection_threshold")):
        v["garbage_collection_threshold"] = 0.0
    return {k: x for k, x in v.items() if x not in (None, False) or k == "trace_settings"}


def promise(values: dict) -> int:
    """Expandable segments first (`allocsim.search.tune.Space.order`): they map what they need, so they are often
    the fastest and smallest, a tight bound early."""
    return 0 if values.get("expandable_segments") else 1


def least_costs(ref: str, costs) -> tuple[float, float]:
    """The least each ALLOC and each FREE adds to the clock (`allocsim.search.tune.Bound`): the model charges
    ``pool_hit_s`` at every malloc and ``pool_free_s`` at every free, whatever else it does (docs/metrics.md,
    "The cost model"; `tests/test_tune_bound.py` holds every replay to it)."""
    return costs.pool_hit_s, costs.pool_free_s


_PEAKS: dict = {}


def _block_chunks(trace, div):
    """``(start, records)`` per chunk of ``trace``, each ALLOC's size its block's (`least_peak`)."""
    divisions = NO_DIVISIONS if div is None else divisions_table(div)
    rounded = {0: 0}
    for start, rec in trace.chunks():
        rec = rec.copy()
        a = rec["kind"] == ALLOC
        sizes, at = np.unique(rec["size"][a], return_inverse=True)
        for n in set(sizes.tolist()) - rounded.keys():
            rounded[n] = round_size(n, divisions)
        blocks = np.array([rounded[n] for n in sizes.tolist()], np.uint64)[at]
        blocks[(rec["flags"][a] & CATCHES_OOM) != 0] = 0
        rec["size"][a] = blocks
        yield start, rec


def least_peak(trace, values: dict) -> int:
    """The least peak reserved a replay of ``trace`` under these settings reaches unless it runs out first
    (`allocsim.search.tune.Bound`): the peak over the trace of its live objects' blocks, each request rounded as the
    model rounds it (`round_size` under ``roundup_power2_divisions``; docs/models/torch.md): reserved memory
    holds every live block, and a block is never smaller than its request rounded. A 0-byte request takes no
    block and one the program catches (CATCHES_OOM) may fail: both count 0. Kept per trace and divisions."""
    div = values.get("roundup_power2_divisions")

    def make():
        live = LiveBytes()
        for start, rec in _block_chunks(trace, div):
            live.add(Chunk(start, rec))
        return live.peak
    return kept_for(_PEAKS, (id(trace), repr(div)), trace, make, 64)


_AHEAD: dict = {}


def live_ahead(trace, values: dict, at: np.ndarray) -> np.ndarray:
    """Per trace index of ``at`` (increasing), the most bytes of live blocks (as `least_peak` counts them) at
    any point from just before that event to the trace's end: the reserved memory a replay under these settings
    must still hold at some point from there on, unless it runs out first (`allocsim.search.tune.Bound`). Memory: 8
    bytes an entry of ``at``, not an event. Kept per trace, divisions and ``at``."""
    div = values.get("roundup_power2_divisions")
    key = (id(trace), repr(div), len(at), int(at[-1]) if len(at) else -1)
    return kept_for(_AHEAD, key, trace, lambda: _live_ahead(trace, div, at), 64)


def _live_ahead(trace, div, at: np.ndarray) -> np.ndarray:
    """`live_ahead`, not kept."""
    edges = np.maximum(np.asarray(at, np.int64) - 1, 0)      # the state before event at[k]: after at[k] - 1
    most = np.zeros(len(edges), np.int64)               # per span [edges[k], edges[k + 1]): its most live
    live = LiveBytes()
    for start, rec in _block_chunks(trace, div):
        curve = live.curve(Chunk(start, rec))
        # the spans this chunk's events fall in, and where in the chunk each begins
        lo = max(int(np.searchsorted(edges, start, "right")) - 1, 0)
        hi = int(np.searchsorted(edges, start + len(curve)))
        if not len(curve) or hi <= lo:
            continue
        cuts = np.maximum(edges[lo:hi] - start, 0)
        first = cuts == 0                               # spans begun before the chunk: the last of them only
        first[:-1] &= ~first[1:]
        keep = first | (cuts > 0)
        np.maximum.at(most, np.arange(lo, hi)[keep], np.maximum.reduceat(curve, cuts[keep]))
    return np.maximum.accumulate(most[::-1])[::-1].copy()


def largest_device_call(space, values: dict) -> int:
    """The most bytes one device malloc or map of a replay under these settings reserves (`allocsim.search.tune.Bound`:
    the missing bytes take at least that many calls): a segment is ``get_allocation_size`` of a rounded request
    (docs/models/torch.md, rules 5 and 6); an expandable segment maps the pages over one rounded request's block,
    which may start and end inside a page (``K_LARGE_BUFFER``, its largest page), so two pages more at most."""
    from ...policies.torch import K_LARGE_BUFFER
    div = values.get("roundup_power2_divisions")
    divisions = NO_DIVISIONS if div is None else divisions_table(div)
    block = round_size(space.largest_request, divisions) if space.largest_request else 0
    return get_allocation_size(block) + 2 * K_LARGE_BUFFER if values.get("expandable_segments") else \
        get_allocation_size(block)


def family_heads(values: dict) -> list[dict]:
    """The settings a member of ``values``' family may be watched from (`watch`), the widest family first: the same
    options without a GC threshold and without ``max_split_size_mb`` (not with expandable segments), then without a
    GC threshold and with the least ``max_non_split_rounding_mb`` (`allocsim.search.tune` replays the first it has and
    resumes the others from it)."""
    out = {**values, "garbage_collection_threshold": 0.0}
    if out.get("max_split_size_mb") is None:
        return [out]
    out["max_non_split_rounding_mb"] = MIN_MB
    return ([{**out, "max_split_size_mb": None}] if not out.get("expandable_segments") else []) + [out]


def watch(root: dict, member: dict) -> tuple[float | None, int | None, int | None] | None:
    """What tells where a replay under ``member`` can first differ from one under ``root``, read off the root's
    replay (`allocsim.search.tune._Trunk`): ``(threshold, rounding, max_split)``, None where it cannot be watched
    (docs/models/torch.md, "Settings that behave alike").

    ``threshold``: the member's GC threshold where the root has none (None: the same); the member behaves as the
    root up to the root's first pool miss with more reserved than that share of the allowed memory (rule 13:
    `garbage_collect_cached_blocks` returns at once below it; the root keeps the GC's clocks,
    ``keep_gc_ages``). ``rounding``: the member's ``max_non_split_rounding_mb`` in bytes where it is larger than
    the root's under the same ``max_split_size_mb`` (None: the same); it is read only by rule 5's second clause,
    which refuses a best-fit candidate of at least ``n + rounding`` to a request of ``n >= max_split``: a block the
    root takes the member takes too, and the member differs only at a miss of the root where such a candidate
    was less than ``rounding`` above the request (the root's ``oversize_slack``). ``max_split``: the member's
    ``max_split_size_mb`` in bytes where the root has none (not with expandable segments); the member behaves as
    the root until the root allocates a segment of at least that size or fails an ``alloc_block``: rules 5, 7
    and 11 read it only for blocks (and requests) that large, none of which exists before (every block lies in
    a segment), and step 4 of rule 9 runs only after a failed ``alloc_block``; its rounding is then never read.
    Every other option the same (``fix_189504`` off: its second search reads the rounding too)."""
    if root.get("fix_189504") or member.get("fix_189504"):
        return None
    rest = ("garbage_collection_threshold", "max_non_split_rounding_mb", "max_split_size_mb")
    if {k: v for k, v in root.items() if k not in rest} != {k: v for k, v in member.items() if k not in rest}:
        return None
    gc_root, gc = root.get("garbage_collection_threshold") or 0.0, member.get("garbage_collection_threshold") or 0.0
    if gc_root and gc != gc_root:
        return None
    threshold = gc if gc != gc_root else None
    ms_root, ms = root.get("max_split_size_mb"), member.get("max_split_size_mb")
    if ms_root is None and ms is not None:
        return (threshold, None, ms * MiB) if not root.get("expandable_segments") else None
    r_root, r = root.get("max_non_split_rounding_mb") or MIN_MB, member.get("max_non_split_rounding_mb") or MIN_MB
    if ms != ms_root or r < r_root or (r != r_root and ms is None):
        return None
    return threshold, (r * MiB if r != r_root else None), None


class TorchFamilies(FamilyRule):
    """The caching allocator's families (docs/models/torch.md, "Settings that behave alike"): `family_heads`,
    `watch`, watched by a `TorchWatcher`."""

    alike = ("a GC threshold until it acts, a larger max_non_split_rounding_mb until a block it would take is refused, "
             "a max_split_size_mb until a segment that large or a failed segment call")
    taken = "it never came there, or the GC acted on expandable segments, where it frees nothing"

    def shares(self, trace) -> bool:
        """Not on a trace with private pools: no checkpoints there."""
        return not has_pool_events(trace)

    def heads(self, values: dict) -> list[PolicySpec]:
        return [spec(h) for h in family_heads(values)]

    def watch(self, head: dict, member: dict):
        return watch(head, member)

    def order(self, values: dict) -> int:
        """The least ``max_non_split_rounding_mb`` first (0: the default): a larger one can be watched from it."""
        return values.get("max_non_split_rounding_mb") or 0

    def alike_throughout(self, head: dict, watch) -> bool:
        """Only a GC threshold on expandable segments, which frees nothing: it never changes the replay."""
        return bool(head.get("expandable_segments")) and watch[1:] == (None, None)

    def watcher(self, trace, head: dict, watches: list, window: int) -> "TorchWatcher":
        return TorchWatcher(watches, (most_grown(trace, head, window), largest_asked(trace, head, window),
                                      largest_segment(trace, head, window)))


FAMILIES = TorchFamilies()


class TorchWatcher(Watcher):
    """A head's replay watched for its members (``watches``: per member, `watch`'s ``(threshold, rounding,
    max_split)`` against the head). With a threshold to watch, the head's policy keeps the GC's clocks
    (`TorchCachingAllocator.keep_gc_ages`). A member could start to differ in a window (``sizes``: per window the
    most the reserved bytes can grow, its largest request and the largest segment that could make: `most_grown`,
    `largest_asked`, `largest_segment`) once the reserved bytes could pass its GC threshold or the limit there, a
    request there is at least the head's ``max_split`` or a segment there could be at least its own. It does once
    the replay's highest reserved at a pool miss has passed its threshold (``int(threshold * allowed)``, where
    `garbage_collect_cached_blocks` starts to act; never with expandable segments, where it frees nothing), the
    least excess of a best fit refused to a request of at least the head's ``max_split`` is below its rounding
    (``oversize_slack``), or the replay has allocated a segment of at least its ``max_split`` or failed an
    ``alloc_block`` (a retry follows each: ``num_alloc_retries``)."""

    def __init__(self, watches: list[tuple], sizes):
        self.watches, (self.grown, self.asked, self.segment) = watches, sizes
        self.pending: dict[int, tuple] = {}
        self.r, self.max_split = None, 0
        self.largest = self.seen = self.retries = 0
        self.limits_move = False

    def begin(self, r: Replay) -> None:
        pol = r.policy
        if any(t for t, _, _ in self.watches):
            pol.keep_gc_ages()
        allowed = pol.allowed()
        self.r, self.max_split, self.retries = r, pol.max_split, pol.num_alloc_retries
        self.limits_move = SET_LIMIT in r.trace.kinds_present       # the limit may fall inside a window
        self.pending = {v: (None if not t or pol.expandable else int(t * allowed), rounding, split)
                        for v, (t, rounding, split) in enumerate(self.watches)}

    def could_part(self, k: int) -> bool:
        return any(self._could(k, *w) for w in self.pending.values())

    def _could(self, k: int, g, rounding, split) -> bool:
        """Whether a member watched so could start to differ in window ``k``: the reserved bytes could pass its GC
        threshold or the limit there (before the first failure, each request makes at most one segment), a
        request there is at least the head's ``max_split``, or a segment there could be at least its own."""
        if k >= len(self.grown):
            return True
        r = self.r
        room = r.device.reserved + int(self.grown[k])
        if g is not None and room > g:
            return True
        if rounding is not None and self.asked[k] >= self.max_split:
            return True
        if split is None:
            return False
        allowed = r.policy.allowed()
        return self.segment[k] >= split or self.limits_move or room > min(r.device.limit, allowed or r.device.limit)

    def parted(self) -> list[int]:
        pol = self.r.policy
        log = pol.segment_log
        for kind, size, _ in log[self.seen:]:
            if kind == SEGMENT_ALLOC and size > self.largest:
                self.largest = size
        self.seen = len(log)
        high, slack, failed = pol.gc_high, pol.oversize_slack, pol.num_alloc_retries > self.retries
        out = [v for v, (g, rounding, split) in self.pending.items()
               if ((g is not None and high > g) or (rounding is not None and slack < rounding)
                   or (split is not None and (failed or self.largest >= split)))]
        for v in out:
            del self.pending[v]
        return out


_WINDOWS: dict = {}


def most_grown(trace, values: dict, window: int) -> np.ndarray:
    """Per window of ``window`` driving events (`allocsim.search.tune` checks a replay at their ends), the most the
    reserved memory of a replay without expandable segments can grow inside it: each ALLOC and each recorded
    OOM tried again makes at most one pool miss, and a miss at most one segment, ``get_allocation_size`` of the
    request rounded (docs/models/torch.md, rules 5 and 6; the release paths only give memory back). A GC
    threshold cannot act in a window that starts below it by more than this (`tune` checkpoints before the
    windows where it can). Kept per trace, divisions and window."""
    return _windows(trace, values, window)[0]


def largest_asked(trace, values: dict, window: int) -> np.ndarray:
    """Per window of ``window`` driving events, the largest request of an ALLOC or a recorded OOM tried again,
    rounded (rule 1): rule 5's second clause reads ``max_non_split_rounding_mb`` only for a request of at least
    ``max_split_size_mb`` (`watch`), so a setting that differs in it alone cannot differ in a window whose
    requests are all below."""
    return _windows(trace, values, window)[1]


def largest_segment(trace, values: dict, window: int) -> np.ndarray:
    """Per window of ``window`` driving events, the largest segment one of its requests could make
    (``get_allocation_size`` of `largest_asked`, rule 6): a replay without expandable segments allocates none larger
    there (`watch`'s ``max_split``)."""
    return _windows(trace, values, window)[2]


def _windows(trace, values: dict, window: int) -> np.ndarray:
    """`most_grown`, `largest_asked` and `largest_segment`, kept per trace, divisions and window."""
    div = values.get("roundup_power2_divisions")
    return kept_for(_WINDOWS, (id(trace), repr(div), window), trace, lambda: _per_window(trace, div, window), 64)


def _per_window(trace, div, window: int) -> np.ndarray:
    """`_windows`, not kept: three rows, the segment bytes the requests of each window could make, its largest
    rounded request and the largest segment that could make."""
    divisions = NO_DIVISIONS if div is None else divisions_table(div)
    known: dict = {}
    grown_parts, asked_parts = [], []
    for _, rec, local in driving(trace):
        kinds, sizes = rec["kind"][local], rec["size"][local].astype(np.int64)
        asks = (kinds == ALLOC) | (kinds == OOM)
        uniq, at = np.unique(sizes[asks], return_inverse=True)
        for n in set(uniq.tolist()) - known.keys():
            block = round_size(n, divisions) if n > 0 else 0
            known[n] = (get_allocation_size(block) if n > 0 else 0, block)
        grown, asked = np.zeros(len(local), np.int64), np.zeros(len(local), np.int64)
        grown[asks] = np.array([known[n][0] for n in uniq.tolist()], np.int64)[at]
        asked[asks] = np.array([known[n][1] for n in uniq.tolist()], np.int64)[at]
        grown_parts.append(grown)
        asked_parts.append(asked)
    if not grown_parts:
        return np.zeros((3, 0), np.int64)
    starts = np.arange(0, sum(len(g) for g in grown_parts), window)
    asked = np.maximum.reduceat(np.concatenate(asked_parts), starts)
    return np.stack([np.add.reduceat(np.concatenate(grown_parts), starts), asked,
                     np.array([get_allocation_size(int(a)) if a else 0 for a in asked.tolist()], np.int64)])


def conf_lines(setting: PolicySpec, cap: int | None) -> dict:
    return torch_settings.conf_lines(setting.values())


def python_lines(setting: PolicySpec, cap: int | None, total: int | None) -> dict:
    """The setting, and the memory fraction of ``cap`` on a device of ``total`` bytes, as Python for a running
    process (`allocsim.frameworks.torch.python_lines`)."""
    return torch_settings.python_lines(setting.values(), cap, total)
