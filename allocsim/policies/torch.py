"""`torch`: PyTorch's CUDA caching allocator (native backend), step for step.

Source: `docs/models/torch.md` (c10/cuda/CUDACachingAllocator.cpp,
rev A 001074d2 and later); its options, and how they are read and written, are
`allocsim.frameworks.torch`.

What is modeled: 512-byte rounding and ``roundup_power2_divisions``; small (<= 1 MiB)
and large pools, one best-fit set of free blocks per (pool, stream) ordered by
(size, address) -- PyTorch's single set ordered by (stream, size, address) split by
stream; ``get_allocation_size`` (2 MiB, 20 MiB, 2 MiB-rounded from 10 MiB);
``should_split``; ``max_split_size_mb`` and ``max_non_split_rounding_mb`` in
``get_free_block``; merging a freed block with free neighbours; the escalation
``get_free_block`` -> (free-memory callbacks: none) -> ``garbage_collect_cached_blocks``
-> ``alloc_block`` -> ``release_available_cached_blocks`` -> ``release_cached_blocks``
+ ``alloc_block`` (retry) -> OOM; the allowed memory of ``set_per_process_memory_fraction``
(`AllowedMemory`: the fraction, else ``--cap``; the memory fraction as rev B keeps it);
``empty_cache`` (`release_cache`); expandable segments (per stream and pool, a virtual
range of 1.125 x device memory, 2**44 where no capacity is known, never the cap's, mapped in 2 MiB / 20 MiB
pages).

Where the model knowingly differs:
- A trace's FREE is ``free_completed``: cross-stream frees (``record_stream``) are
  already resolved, so there are never pending events. ``release_cached_blocks``'s
  ``synchronize_and_free_events`` therefore frees nothing, and issue #189504 (no pool
  re-search after that synchronisation) cannot bite; ``fix_189504`` adds the re-search
  for fidelity with the fix, and it only matters for blocks the flush itself made fit.
- Private pools (CUDA graphs, graph trees, MemPool) follow the trace's pool events (`pool_event`,
  docs/models/torch.md "Private pools"); a use_mem_pool's thread filter is taken as every stream (a trace
  does not say which thread allocated). ``cudaMallocAsync`` backend is not modeled.
- ``--cap`` is the allowed memory of ``set_per_process_memory_fraction`` (`AllowedMemory`);
  cudaMalloc fails on the simulated capacity, where the real limit is the device's total
  memory minus the CUDA context, workspaces and other processes. The simulated device
  also refuses past the cap, so an expandable-segment map that crosses it fails here,
  where PyTorch (which checks the fraction once per ``alloc_block``) maps it.
- Expandable segments map a block's pages with one ``device.map(pages)`` (after checking the
  whole range fits, as PyTorch maps all or nothing), so device mallocs count map calls, as
  ``num_device_alloc`` does (103 on ``traces/resnet50-expandable.bin``, as recorded).

The compiled build (docs/architecture.md, "The compiled build") compiles this file as it is: ``torch.pxd`` makes
`Block`, `BlockPool` and `KeyField` C records, the ``@cython`` decorators type the fused loop's locals (its hot
path C end to end: a pool's keys C words in an ``array('q')`` while they fit one, `BlockPool`; a key below 2**62
made in C arithmetic, searched for and filed unboxed, `word_place` and `put_word`; a pool's entries dropped and
inserted by one ``memmove``; each served ALLOC's latency appended in C, `add_latency`) and the plain walk's
block and pool variables; the rare paths stay the Python they read as.

Segment log: every device malloc/free/map/unmap appends ``(kind, size, event_index)``
to ``segment_log`` (kinds from `allocsim.trace.events`), for `allocsim validate`, and
``(address, stream)`` to ``segment_where``; `layout` gives the segments and their blocks
as PyTorch's ``snapshot()`` reports them (both for `allocsim.formats.exporters.torch_snapshot`).
"""
from __future__ import annotations

from array import array
from collections import namedtuple

try:
    import cython                   # the compiled build (docs/architecture.md, "The compiled build")
except ImportError:
    from ..compiled import cython   # interpreted: its decorators and types change nothing

import numpy as np

from ..errors import UsageError
from ..frameworks.torch import (MiB, N_DIVISION_INTERVALS, NO_DIVISIONS, PARAMS, SIZE_MAX, divisions_table,
                                format_value, options_in_force)
from ..trace.events import (POOL, POOL_ANY_STREAM, POOL_BEGIN, POOL_EMPTY, POOL_END, POOL_RELEASE, SEGMENT_ALLOC,
                            SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)
from .base import Policy
from .registry import register

if not cython.compiled:             # compiled, torch.pxd cimports their C loops
    from ._latency import add_latency
    from ._sorted import drop_item, drop_key, file_key, first_at_least, key_place, put_item, put_word, word_place

#: Compiled: a pool's keys are C words in an ``array('q')`` while every one is within 63 bits (`BlockPool`).
COMPILED = cython.compiled

K_MIN_BLOCK = 512
K_SMALL_SIZE = MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
WORD_END = 1 << 63                 # compiled, a pool's keys below it are C words (`BlockPool`)
LONG_MAX = 1 << 62                 # above every size (at most 2**50 bytes, docs/trace-format.md): max_split in C
assert (K_SMALL_SIZE, K_MIN_BLOCK) == (1048576, 512)     # written as literals in the fused loop


# ---- sizes -------------------------------------------------------------------------
def roundup_power2_next_division(n: int, d: int) -> int:
    """Round ``n`` up to the next of ``d`` equal steps between two powers of two."""
    if n & (n - 1) == 0:
        return n
    floor2 = 1 << (n.bit_length() - 1)
    step = floor2 >> (d.bit_length() - 1)
    if step == 0:
        return floor2 << 1
    lo = n & ~(step - 1)
    return n if lo == n else lo + step


def round_size(n: int, divisions=NO_DIVISIONS) -> int:
    """The block size PyTorch hands out for a request of ``n`` bytes."""
    if n < K_MIN_BLOCK:
        return K_MIN_BLOCK
    idx = min(max(n.bit_length() - 21, 0), N_DIVISION_INTERVALS - 1)
    d = divisions[idx]
    if d > 1 and n > K_MIN_BLOCK * d:
        return roundup_power2_next_division(n, d)
    return (n + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK


def get_allocation_size(n: int) -> int:
    """Size of a new segment for a rounded request of ``n`` bytes."""
    if n <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if n < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (n + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


# ---- data structures --------------------------------------------------------------------
class Block:
    """A block of a segment: address neighbours ``prev``/``next`` in the same segment."""

    __slots__ = ("ptr", "size", "pool", "allocated", "prev", "next", "requested", "es", "mapped", "gc_base")

    def __init__(self, ptr, size, pool, es=None, mapped=True):
        self.ptr = ptr
        self.size = size
        self.pool = pool
        self.allocated = False
        self.prev = None
        self.next = None
        self.requested = 0
        self.es = es
        self.mapped = mapped
        self.gc_base = 0


class KeyField:
    """How a free block's key is made: ``size << abits | address - lo``, every segment lying in ``[lo, lo +
    2**abits)``, so that the keys order free blocks by (size, address) as PyTorch's set does (a policy's one field,
    shared by its pools; `TorchCachingAllocator._cover` widens it for a new segment and re-keys the pools).

    ``fit``: a size below it makes a key below 2**62, one machine word, which the compiled build makes in C
    arithmetic (`_key`); a larger one makes a Python int, exact at any width (`_wide_key`). Interpreted, both are
    the same Python arithmetic. ``low``/``high``: the addresses the segments seen so far span (high 0: none)."""

    __slots__ = ("lo", "abits", "fit", "low", "high")

    def __init__(self):
        self.lo = self.abits = self.low = self.high = 0
        self.fit = 1 << 62

    def covers(self, ptr: int, size: int) -> bool:
        """Whether ``[ptr, ptr + size)`` lies in the field (Python ints: no C shift by ``abits``)."""
        return self.lo <= ptr and (ptr + size - self.lo) >> self.abits == 0

    def least(self, size: int) -> int:
        """The least key of a block of ``size`` bytes (a Python int: any width)."""
        return size << self.abits

    def widen(self, ptr: int, size: int) -> None:
        """Cover ``[ptr, ptr + size)`` and what was covered, with as much room again around them (so a run whose
        segments climb, or fall, re-keys O(log span) times)."""
        low = ptr if self.high == 0 else min(self.low, ptr)
        high = max(self.high, ptr + size)
        span = high - low
        abits = (2 * span).bit_length()
        self.lo = max(0, low - ((1 << abits) - span) // 2)
        self.low, self.high, self.abits = low, high, abits
        self.fit = 1 << (62 - abits) if abits < 62 else 0


def _wide_key(size, ptr, abits, lo):
    """A key in Python ints, at any width (`KeyField`)."""
    return size << abits | ptr - lo


@cython.cfunc
@cython.locals(f=KeyField, size=cython.longlong, ptr=cython.longlong)
def _key(f, size, ptr):
    """The key of a free block of ``size`` bytes at ``ptr`` (`KeyField`)."""
    if size < f.fit:
        return size << f.abits | ptr - f.lo
    return _wide_key(size, ptr, f.abits, f.lo)


class BlockPool:
    """Free blocks of one (small|large, stream): ``keys`` is the sorted list of the mapped
    free blocks' keys (``size << abits | address - lo``, `KeyField`), ``blocks`` the blocks in the same order
    (``blocks[i]`` is the block of ``keys[i]``: found and dropped by position, where a dict by key cost a hash
    and a probe per step). Compiled, ``keys`` are C words in an ``array('q')`` while every one is below 2**63
    (no int object per key, a search without a branch over the words), a list of Python ints from the filing
    of a larger key (`widen`) until a re-key finds them all within a word again (`rekey`); `_sorted`'s
    ``key_place``, ``word_place``, ``put_word`` and ``drop_key`` take either. Interpreted, always a list;
    ``unmapped`` is the sorted list of the addresses of the unmapped ranges of expandable
    segments (``unmapped_blocks``: ptr -> Block).

    Plain sorted lists: insert/remove is a bisect plus an O(f) memmove in C for f free
    blocks in the pool. f stays small in practice (at most ~190 in every recorded and
    synthetic trace), where this takes fewer Python steps than sorted runs with an index
    of their maxima (about 10 % less time per replay); past a few thousand free blocks in
    one pool the memmove dominates (10 k: about 1.7 x slower than the runs).
    """

    __slots__ = ("small", "stream", "keys", "blocks", "unmapped", "unmapped_blocks", "owner", "field")

    def __init__(self, small: bool, stream: int, field: KeyField, owner: "PrivatePool | None" = None):
        self.small = small
        self.stream = stream
        self.owner = owner              # the private pool these blocks belong to; None: the default pools
        self.field = field              # the policy's: how keys are made
        self.keys = array("q") if COMPILED else []     # list[int] interpreted (see the class docstring)
        self.blocks: list[Block] = []
        self.unmapped: list[int] = []
        self.unmapped_blocks: dict[int, Block] = {}

    def insert(self, b: Block) -> None:
        if b.mapped:
            f = self.field
            k = b.size << f.abits | b.ptr - f.lo       # `KeyField` in Python ints (b untyped: any width)
            keys = self.keys if not COMPILED or k < WORD_END else self.widen()
            i = key_place(keys, k)
            keys.insert(i, k)
            self.blocks.insert(i, b)
        else:
            file_key(self.unmapped, b.ptr)
            self.unmapped_blocks[b.ptr] = b

    def erase(self, b: Block) -> None:
        if b.mapped:
            f = self.field
            i = key_place(self.keys, b.size << f.abits | b.ptr - f.lo)
            del self.keys[i], self.blocks[i]
        else:
            unmapped = self.unmapped
            del unmapped[first_at_least(unmapped, b.ptr)]
            del self.unmapped_blocks[b.ptr]

    def widen(self):
        """The keys as Python ints from here on (compiled, before a key past 63 bits is filed); returns them."""
        if type(self.keys) is array:
            self.keys = self.keys.tolist()
        return self.keys

    def rekey(self) -> None:
        """Make every key again after the field changed (`KeyField.widen`), as C words again where every one
        fits (compiled); the blocks' list stays the same object, which the fused loop holds."""
        rekeyed = sorted((_key(self.field, b.size, b.ptr), b) for b in self.blocks)
        keys = [k for k, _ in rekeyed]
        self.keys = array("q", keys) if COMPILED and not (keys and keys[-1] >= WORD_END) else keys
        self.blocks[:] = [b for _, b in rekeyed]


class PrivatePool:
    """PyTorch's ``PrivatePool`` (a CUDA graph's or a ``MemPool``'s): its own small and large block pools per
    stream, its users (``use_count``: captures and ``use_mem_pool`` contexts begun, MemPools, graphs that keep it)
    and the device memory its segments hold (``reserved``: PyTorch counts its cudaMallocs, ``cudaMalloc_count``;
    bytes say the same, and also cover expandable pages). With no users left it is freeable: the next
    `release_cached_blocks` frees its whole free segments, and forgets it once it holds no memory."""

    __slots__ = ("number", "pools", "use_count", "reserved")

    def __init__(self, number: int):
        self.number = number
        self.pools: dict[int, tuple[BlockPool, BlockPool]] = {}
        self.use_count = 1
        self.reserved = 0


class ExpandableSegment:
    """A reserved virtual range mapped page by page. Which pages are mapped is in its blocks (``mapped``), not
    kept here again: a set of page indices cost O(pages) per map and unmap and was never read."""

    __slots__ = ("base", "size", "page")

    def __init__(self, base, size, page):
        self.base, self.size, self.page = base, size, page


def _carve(b: Block, n: int, pool: BlockPool) -> Block:
    """Split ``b`` after its first ``n`` bytes; return the remainder, linked after ``b``."""
    r = Block(b.ptr + n, b.size - n, pool, b.es)
    nxt = r.next = b.next
    r.prev = b
    if nxt is not None:
        nxt.prev = r
    b.next = r
    b.size = n
    return r


@cython.cfunc
@cython.locals(b=Block, nxt=Block)
@cython.returns(cython.longlong)
def _expandable_size(b: Block) -> int:
    nxt = b.next
    return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


@cython.cfunc
@cython.locals(blocks=list, i=cython.Py_ssize_t, y=cython.Py_ssize_t, b=Block, b2=Block, grow=cython.longlong,
               g2=cython.longlong)
@cython.returns(cython.Py_ssize_t)
def _grow_least(blocks: list, i: int) -> int:
    """`get_free_block` in an expandable pool: from the best fit ``blocks[i]`` on, the index of the candidate that
    can grow least (size + the unmapped space after it), walking on while the next one could grow less than the
    one held. O(candidates walked), by index: no copy of the blocks."""
    b = blocks[i]
    grow = _expandable_size(b)
    for y in range(i + 1, len(blocks)):
        b2 = blocks[y]
        if b.es is None:
            break
        g2 = _expandable_size(b2)
        if g2 >= grow:
            break
        i, b, grow = y, b2, g2
    return i


# ---- the memory fraction ----------------------------------------------------------------
class AllowedMemory:
    """PyTorch's ``allowed_memory_maximum``: the bytes ``alloc_block`` may reserve, or None.

    ``setMemoryFraction(f)`` sets it to ``int(f * total memory)`` when f < 1 and clears it
    at f = 1; with it set, ``alloc_block`` fails a segment that would pass it without
    calling cudaMalloc, and ``garbage_collection_threshold`` acts. Here it is
    ``-O per_process_memory_fraction`` when given, else the device's current cap
    (``--cap``, or a limit the engine set from the trace's ``SET_LIMIT`` events), read at
    each use because the engine changes it mid-run; a cap at or above the device memory
    is fraction 1, no limit.

    For `allocsim fit`: comparisons with the cap are reported to the device (``note``);
    the GC reads the cap's value itself (its threshold), so a replay with a GC threshold
    and no explicit fraction pins the device, as does a fraction taken of the cap.
    """

    __slots__ = ("ctx", "fixed", "explicit")

    def __init__(self, ctx, fraction: float | None, gc_threshold: float | None):
        self.ctx = ctx
        self.explicit = fraction is not None
        self.fixed = None
        if self.explicit and fraction < 1.0:
            total = ctx.capacity if ctx.capacity is not None else ctx.cap
            if total is None:
                raise UsageError("per_process_memory_fraction needs a device capacity (--capacity)")
            self.fixed = int(fraction * total)
            if ctx.capacity is None:
                ctx.pin()            # the allowed memory is a fraction of the cap itself
        if not self.explicit and (gc_threshold or 0.0) > 0.0:
            ctx.pin()                # whether the GC runs, and down to what, is the cap's value

    def __call__(self) -> int | None:
        if self.explicit:
            return self.fixed
        cap, total = self.ctx.cap, self.ctx.capacity
        return cap if cap is not None and (total is None or cap < total) else None

    def grants(self, need: int) -> bool:
        """Whether reserving up to ``need`` bytes stays within the allowed memory (`alloc_block`'s check)."""
        allowed = self()
        ok = allowed is None or need <= allowed
        if not self.explicit:
            self.ctx.note(need, ok)      # granted with no cap too: a cap below `need` would refuse
        return ok


# ---- the policy -------------------------------------------------------------------------
#: A copy of a `TorchCachingAllocator`'s state (its `checkpoint`, what `restore` takes): the pools, their key field,
#: the live blocks by id and the private pools, copied and linked alike; the `_WALKED` counters in that order; the GC
#: threshold's clocks, the expandable segments, the segment log and where each entry was made, the captures begun
#: and the private pools freeable.
TorchState = namedtuple("TorchState", "pools field handles private counters gfb_calls segments segment_log "
                                      "segment_where captures freeable")


@register
class TorchCachingAllocator(Policy):
    name = "torch"
    framework = "torch"
    summary = "PyTorch CUDA caching allocator (best fit, split, max_split, expandable segments)"
    models = "c10/cuda/CUDACachingAllocator.cpp (docs/models/torch.md)"
    params = PARAMS
    #: the engine sets ``event_index`` (trace index of the current ALLOC) before each malloc
    wants_event_index = True

    # ---- options --------------------------------------------------------------------------
    @classmethod
    def format_option(cls, key, value) -> str:
        """As ``PYTORCH_ALLOC_CONF`` writes it (the divisions table short: `allocsim.frameworks.torch`)."""
        return format_value(key, value)

    def __init__(self, ctx, options: dict | None = None, **extra):
        super().__init__(ctx, options_in_force(options, ctx.trace), **extra)
        trace = ctx.trace
        self._charge = ctx.charge
        ms = self.max_split_size_mb
        self.max_split = SIZE_MAX if ms is None else ms * MiB
        self.max_non_split_rounding = (self.max_non_split_rounding_mb or 20) * MiB
        div = self.roundup_power2_divisions
        self.divisions = NO_DIVISIONS if div is None else divisions_table(div)
        self._plain_rounding = not any(d > 1 for d in self.divisions)
        self.expandable = bool(self.expandable_segments)
        # the device's memory, None unknown: expandable segments' range is 9/8 of it (2**44 with none), never of the
        # cap, whose value the replay would then read (`allocsim fit` certifies caps by limit comparisons alone)
        self.total_memory = ctx.capacity
        self.allowed = AllowedMemory(ctx, self.per_process_memory_fraction, self.garbage_collection_threshold)
        self.gc_threshold_set = (self.garbage_collection_threshold or 0.0) > 0.0
        # pools: stream index -> (small, large); release paths visit them in cudaStream_t order
        self._pools: dict[int, tuple[BlockPool, BlockPool]] = {}
        self._field = KeyField()         # how every pool's keys are made (`_cover` widens it)
        self._stream_values = list(trace.streams) if trace is not None else []
        self._segments: list[ExpandableSegment] = []
        self.gfb_calls = [0, 0]          # get_free_block calls per pool (large, small) while GC is on
        self.gc_ages_only = False        # `keep_gc_ages`: the GC's clocks kept, nothing collected
        self.gc_misses: dict = {}        # with it: pool misses per open section path (`restore` counts them there)
        self.gc_high = 0                 # ... and the most reserved at one
        self.oversize_slack = SIZE_MAX   # the least excess of a best fit rule 5's second clause refused (`_escalate`)
        self.event_index = -1
        self.segment_log: list[tuple[int, int, int]] = []
        self.segment_where: list[tuple[int, int]] = []     # (address, stream) of each segment_log entry
        # memory_stats counters
        self.num_device_alloc = self.num_device_free = 0
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = 0
        self.cache_flushes = 0
        self.segments = self.segments_allocated = 0
        self.inactive_split_bytes = self.inactive_split_bytes_peak = 0
        self.n_malloc = self.n_free = 0
        self._hit_s = self.costs.pool_hit_s
        self._free_s = self.costs.pool_free_s
        self._spare: list[Block] = []  # free blocks `_free_fast` merged away, reused by `_malloc_fast`'s splits
        # private pools (`pool_event`): number -> pool; the routings begun and not ended ((number, stream index or
        # None for every stream), PyTorch's captures_underway, searched newest first); those without users
        self._private: dict[int, PrivatePool] = {}
        self._captures: list[tuple[int, int | None]] = []
        self._freeable: dict[int, PrivatePool] = {}

    @classmethod
    def variant(cls, ctx, options):
        """`Policy.variant`: the common case, no expandable segments and no GC threshold in force (the trace's
        settings included), is `TorchFastPath`, whose malloc and free are the inlined hot path; the others are
        `TorchOptionsPath`. Both declare the fused loop."""
        if cls is not TorchCachingAllocator:
            return cls
        if ctx.trace is not None and has_pool_events(ctx.trace):
            return TorchPoolsPath
        opts = options_in_force(options, ctx.trace)
        plain = not opts.get("expandable_segments") and not (opts.get("garbage_collection_threshold") or 0.0) > 0.0
        return TorchFastPath if plain else TorchOptionsPath

    def _make_pools(self, stream: int, owner: PrivatePool | None = None) -> tuple[BlockPool, BlockPool]:
        pools = self._pools if owner is None else owner.pools
        field = self._field
        pp = pools[stream] = (BlockPool(True, stream, field, owner), BlockPool(False, stream, field, owner))
        return pp

    def _pools_in_order(self, small: bool, owner: PrivatePool | None = None) -> list[BlockPool]:
        """The default pools (or ``owner``'s) of one size class, in cudaStream_t order, as PyTorch's set holds them."""
        pools, vals = self._pools if owner is None else owner.pools, self._stream_values
        order = sorted(pools, key=lambda s: (vals[s] if s < len(vals) else s, s))
        return [pools[s][0 if small else 1] for s in order]

    def _all_pools(self):
        """``(stream, (small, large))`` of the default pools, then of each private pool."""
        yield from self._pools.items()
        for owner in self._private.values():
            yield from owner.pools.items()

    def _routed(self, stream: int) -> tuple[BlockPool, BlockPool]:
        """PyTorch's ``get_pool`` while a pool is begun: the newest begun pool whose filter takes ``stream``
        (its stream, or every stream), else the default pools."""
        for number, routed in reversed(self._captures):
            if routed is None or routed == stream:
                owner = self._private[number]
                return owner.pools.get(stream) or self._make_pools(stream, owner)
        return self._pools.get(stream) or self._make_pools(stream)

    @cython.locals(pool=BlockPool, b=Block)
    def _insert(self, pool: BlockPool, b: Block) -> None:
        b.gc_base = self.gfb_calls[pool.small]      # the counts only tick while the GC is on
        pool.insert(b)

    def gc_on(self) -> bool:
        """Whether `garbage_collect_cached_blocks` runs now: a threshold and an allowed memory in force."""
        return self.gc_threshold_set and self.allowed() is not None

    # ---- malloc ---------------------------------------------------------------------------
    @cython.locals(b=Block, pool=BlockPool, pp=tuple)
    def malloc(self, size, stream):
        self._charge(self._hit_s)
        self.n_malloc += 1
        if self._plain_rounding:
            n = (size + 511) & ~511
        else:
            n = round_size(size, self.divisions)
        if self._captures:
            pp = self._routed(stream)
        else:
            pp = self._pools.get(stream) or self._make_pools(stream)
        small = n <= K_SMALL_SIZE
        pool = pp[0] if small else pp[1]
        b = self._get_free_block(pool, n)
        if b is None:
            b = self._escalate(pool, n)
            if b is None:
                return None
        # should_split + alloc_found_block
        rem = b.size - n
        already_split = b.prev is not None or b.next is not None
        if (rem >= K_MIN_BLOCK) if (small or self.expandable) else (n < self.max_split and rem > K_SMALL_SIZE):
            self._insert(pool, _carve(b, n, pool))
            if b.es is None:
                self._inactive_split(-n if already_split else rem)
        elif already_split and b.es is None:
            self._inactive_split(-b.size)
        b.allocated = True
        b.requested = size
        self.allocated += b.size
        return b

    @cython.locals(b=Block, r=Block, nxt=Block, pool=BlockPool, field=KeyField, spare=list, pp=tuple)
    def _malloc_fast(self, size, stream):
        """`malloc` without expandable segments or GC; inlines `_get_free_block` and `_carve`.

        A block of ``bsize`` passes the oversize rules when ``bsize < max_split`` or
        (``n >= max_split`` and ``bsize < n + max_non_split_rounding``): `_get_free_block`'s
        test, negated and reordered so that the default (no max_split) takes one compare.
        """
        self._charge(self._hit_s)
        self.n_malloc += 1
        n = (size + 511) & ~511 if self._plain_rounding else round_size(size, self.divisions)
        pp = self._pools.get(stream) or self._make_pools(stream)
        small = n <= K_SMALL_SIZE
        pool = pp[0] if small else pp[1]
        keys, field = pool.keys, self._field       # keys made in Python ints here, as in `BlockPool.insert`
        i = key_place(keys, n << field.abits)
        ms = self.max_split
        if i < len(keys) and ((bsize := keys[i] >> field.abits) < ms
                              or (n >= ms and bsize < n + self.max_non_split_rounding)):
            del keys[i]
            b = pool.blocks.pop(i)
        else:
            b = self._escalate(pool, n)
            if b is None:
                return None
            bsize = b.size
        rem = bsize - n
        if (rem >= K_MIN_BLOCK) if small else (n < ms and rem > K_SMALL_SIZE):
            nxt = b.next
            if nxt is not None or b.prev is not None:   # already split: n bytes leave the inactive split
                self.inactive_split_bytes -= n
            else:                                       # a whole segment: the remainder joins it
                v = self.inactive_split_bytes = self.inactive_split_bytes + rem
                if v > self.inactive_split_bytes_peak:
                    self.inactive_split_bytes_peak = v
            # _carve: the remainder r follows b in its segment
            rptr = b.ptr + n
            spare = self._spare
            if spare:                           # a free block `_free_fast` merged away: reset it
                r = spare.pop()
                r.ptr = rptr
                r.size = rem
                r.pool = pool
                r.next = nxt
            else:
                r = Block(rptr, rem, pool)
                r.next = nxt
            r.prev = b
            if nxt is not None:
                nxt.prev = r
            b.next = r
            b.size = bsize = n
            rk = rem << field.abits | rptr - field.lo
            keys = pool.keys if not COMPILED or rk < WORD_END else pool.widen()     # (the escalation may re-key)
            i = key_place(keys, rk)
            keys.insert(i, rk)
            pool.blocks.insert(i, r)
        elif b.prev is not None or b.next is not None:
            self.inactive_split_bytes -= bsize
        b.allocated = True
        b.requested = size
        self.allocated += bsize
        return b

    @cython.locals(b=Block, prev=Block, nxt=Block, pool=BlockPool, field=KeyField, blocks=list)
    def _free_fast(self, b):
        """`free` without expandable segments or GC: merge with free neighbours inline."""
        self._charge(self._free_s)
        b.allocated = False
        size = b.size
        self.allocated -= size
        pool = b.pool
        keys, blocks, field = pool.keys, pool.blocks, pool.field
        shift, lo = field.abits, field.lo       # keys made in Python ints here, as in `BlockPool.insert`
        prev, nxt = b.prev, b.next
        subsumed = 0                            # bytes taken over from free neighbours
        if prev is not None and not prev.allocated:
            subsumed = prev.size
            pk = subsumed << shift | prev.ptr - lo
            i = key_place(keys, pk)
            del keys[i], blocks[i]
            b.ptr = prev.ptr
            self._spare.append(prev)
            prev = b.prev = prev.prev
            if prev is not None:
                prev.next = b
        if nxt is not None and not nxt.allocated:
            nsize = nxt.size
            nk = nsize << shift | nxt.ptr - lo
            i = key_place(keys, nk)
            del keys[i], blocks[i]
            self._spare.append(nxt)
            nxt = b.next = nxt.next
            if nxt is not None:
                nxt.prev = b
            subsumed += nsize
        b.size = size = size + subsumed
        k = size << shift | b.ptr - lo
        if COMPILED and k >= WORD_END:
            keys = pool.widen()
        i = key_place(keys, k)
        keys.insert(i, k)
        blocks.insert(i, b)
        delta = size - subsumed if prev is not None or nxt is not None else -subsumed
        if delta:
            v = self.inactive_split_bytes = self.inactive_split_bytes + delta
            if v > self.inactive_split_bytes_peak:
                self.inactive_split_bytes_peak = v

    @cython.locals(handles=dict, peak=cython.longlong, k=cython.longlong, size=cython.longlong, n=cython.longlong,
                   bsize=cython.longlong, rem=cython.longlong, rptr=cython.longlong, subsumed=cython.longlong,
                   nsize=cython.longlong, allocated=cython.longlong, isb=cython.longlong, isb_peak=cython.longlong,
                   nsr=cython.longlong, clock=cython.double, t0=cython.double, hit_s=cython.double,
                   free_s=cython.double, x=cython.Py_ssize_t, n0=cython.Py_ssize_t, slow=cython.bint, hit=cython.bint,
                   small=cython.bint, es=cython.bint, stamp=cython.bint, gc=cython.bint, plain=cython.bint,
                   b=Block, r=Block, nxt=Block, prev=Block, pool=BlockPool, blocks=list, rk=cython.longlong,
                   fk=cython.longlong, spare=list, pp=tuple, pools=dict, field=KeyField, shift=cython.longlong,
                   lo=cython.longlong, fit=cython.longlong, ms=cython.longlong, calls_large=cython.longlong,
                   calls_small=cython.longlong, gfb=list, compiled=cython.bint, rec=cython.bint, m=cython.Py_ssize_t)
    def _walk_chunk_fused(self, events, handles, lat, peak, dev, served, tape=None):
        """The replay's fused loop (docs/architecture.md, "The fast path"): `malloc` and `free` (the common case:
        `_malloc_fast` and `_free_fast`) inlined over ``events``, the clock, ``allocated`` and the inactive split
        bytes in locals.

        Expandable segments and a GC threshold are flags read once per call (whether the GC is on reads the
        cap, which only a handed-back SET_LIMIT changes): with ``es`` every block is an expandable segment's,
        best fit prefers the candidate that can grow least (`_grow_least`), every remainder of 512 B or more is
        split off, only mapped neighbours merge and no inactive split bytes are counted; with a threshold each
        pool search ticks the GC's clock while it is on and every block entering a pool takes its age base
        (`_insert`). A pool miss runs `_escalate` as `malloc` does (the locals written back around it, the key
        field read again: a new segment may widen it) and is reported to ``served``; a pressure event or the FREE
        of an id not live is handed back: returns ``(its index or None at the end, peak allocated)``.

        Keys of a size below the field's ``fit`` are made in one machine word (C arithmetic in the compiled
        build), searched for with `word_place` and filed with `put_word` (compiled, into the pool's C words where
        it keeps them, `BlockPool`); larger ones take `_key`, in Python ints, and are filed by `BlockPool.insert`,
        which makes the pool's keys Python ints for one past 63 bits. Compiled, a
        served ALLOC's latency is appended in C (`add_latency`), as `cupy` and `split` do. ``max_split`` unset is
        ``SIZE_MAX``, held here as `LONG_MAX`, which no size reaches either (so is a ``max_non_split_rounding``
        past it).

        With ``tape`` (a window the folder records, `Policy.fused_tape`) each increment to the clock goes onto it
        and each latency's place on it, and a pool miss is handed back undone (the clock and the GC's clocks as
        they were), for the plain walk, whose escalation the recorder follows."""
        clock, allocated, field = float(dev.clock), self.allocated, self._field     # (a recorded total: its value)
        shift, lo, fit = field.abits, field.lo, field.fit
        isb, isb_peak = self.inactive_split_bytes, self.inactive_split_bytes_peak
        hit_s, free_s, ms = self._hit_s, self._free_s, min(self.max_split, LONG_MAX)
        pp_stream = pp = None               # the last ALLOC's stream and its pools (pools are never dropped)
        plain, divisions = self._plain_rounding, self.divisions
        nsr = min(self.max_non_split_rounding, LONG_MAX)    # up to a size_t: n + nsr kept within a C word
        pools, make_pools, escalate = self._pools, self._make_pools, self._escalate
        spare = self._spare
        es, stamp, gfb = self.expandable, self.gc_threshold_set, self.gfb_calls
        calls_large, calls_small = gfb      # the GC's clocks (`gfb_calls`), written back around every call out
        gc = self.gc_on()
        lat_append, n0 = lat.append, len(lat)
        compiled = cython.compiled          # compiled: C appends (`add_latency`)
        rec, m = tape is not None, 0
        if rec:
            incs, ends, m = tape.incs, tape.latency_ends, len(tape.incs)
        for j, k, i, size, stream in events:
            if k == 1:                          # ALLOC: malloc
                t0 = clock
                clock += hit_s
                n = (size + 511) & ~511 if plain else round_size(size, divisions)
                if stream is not pp_stream:     # (another int object of the same value only looks it up again)
                    pp_stream, pp = stream, pools.get(stream) or make_pools(stream)
                small = n <= 1048576            # K_SMALL_SIZE
                pool = pp[0] if small else pp[1]
                if gc:
                    if small:
                        calls_small += 1
                    else:
                        calls_large += 1
                keys, blocks = pool.keys, pool.blocks
                x = word_place(keys, n << shift) if n < fit else key_place(keys, field.least(n))
                if es and x < len(keys):
                    x = _grow_least(blocks, x)
                hit = False                     # no candidate: a miss below
                if x < len(keys):
                    b = blocks[x]
                    bsize = b.size
                    hit = bsize < ms or (n >= ms and bsize < n + nsr)
                if hit:
                    if compiled:
                        drop_key(keys, x)
                    else:
                        del keys[x]
                    b = blocks.pop(x)
                    slow = False
                elif rec:                       # recorded: the plain walk serves it (its escalation followed)
                    clock = t0
                    if gc:
                        if small:
                            calls_small -= 1
                        else:
                            calls_large -= 1
                    break
                else:
                    dev.clock, self.allocated = clock, allocated
                    self.inactive_split_bytes, self.inactive_split_bytes_peak = isb, isb_peak
                    gfb[0], gfb[1] = calls_large, calls_small
                    b = escalate(pool, n)
                    clock = dev.clock
                    calls_large, calls_small = gfb
                    isb, isb_peak = self.inactive_split_bytes, self.inactive_split_bytes_peak
                    shift, lo, fit = field.abits, field.lo, field.fit      # a new segment may widen the field
                    keys = pool.keys                                        # ... and re-key the pools
                    if b is None:
                        lat_append(clock - t0)
                        if served(j, None):
                            break
                        continue
                    bsize = b.size
                    slow = True
                rem = bsize - n
                if (rem >= 512) if small or es else (n < ms and rem > 1048576):
                    nxt = b.next
                    if es:
                        pass
                    elif nxt is not None or b.prev is not None:
                        isb -= n
                    else:
                        isb += rem
                        if isb > isb_peak:
                            isb_peak = isb
                    rptr = b.ptr + n
                    if spare:
                        r = spare.pop()
                        r.ptr = rptr
                        r.size = rem
                        r.pool = pool
                        r.next = nxt
                        if es:
                            r.es = b.es
                    else:
                        r = Block(rptr, rem, pool, b.es)
                        r.next = nxt
                    r.prev = b
                    if nxt is not None:
                        nxt.prev = r
                    b.next = r
                    b.size = bsize = n
                    if stamp:
                        r.gc_base = calls_small if small else calls_large
                    if rem < fit:                   # a key below 2**62, made in C and filed as a word compiled
                        rk = rem << shift | rptr - lo
                        x = word_place(keys, rk)
                        put_word(keys, x, rk)
                        put_item(blocks, x, r)
                    else:                           # a key in Python ints, at any width
                        pool.insert(r)
                elif not es and (b.prev is not None or b.next is not None):
                    isb -= bsize
                b.allocated = True
                b.requested = size
                allocated += bsize
                if allocated > peak:
                    peak = allocated
                if rec:
                    add_latency(incs, hit_s)
                    m += 1
                    add_latency(ends, m)                # (a count as a double: exact)
                    lat_append(clock - t0)
                elif compiled:
                    add_latency(lat, clock - t0)
                else:
                    lat_append(clock - t0)
                handles[i] = b
                if slow:
                    self.allocated = allocated
                    self.inactive_split_bytes, self.inactive_split_bytes_peak = isb, isb_peak
                    served(j, b)
            elif k == 2:                        # FREE: free
                b = handles.pop(i, None)
                if b is None:
                    break
                clock += free_s
                if rec:
                    add_latency(incs, free_s)
                    m += 1
                b.allocated = False
                size = b.size
                allocated -= size
                pool = b.pool
                keys, blocks = pool.keys, pool.blocks
                prev, nxt = b.prev, b.next
                subsumed = 0
                if prev is not None and not prev.allocated and prev.mapped:
                    subsumed = prev.size
                    x = (word_place(keys, subsumed << shift | prev.ptr - lo) if subsumed < fit
                         else key_place(keys, _key(field, subsumed, prev.ptr)))
                    if compiled:
                        drop_key(keys, x)
                        drop_item(blocks, x)
                    else:
                        del keys[x], blocks[x]
                    b.ptr = prev.ptr
                    spare.append(prev)
                    prev = b.prev = prev.prev
                    if prev is not None:
                        prev.next = b
                if nxt is not None and not nxt.allocated and nxt.mapped:
                    nsize = nxt.size
                    x = (word_place(keys, nsize << shift | nxt.ptr - lo) if nsize < fit
                         else key_place(keys, _key(field, nsize, nxt.ptr)))
                    spare.append(nxt)
                    if compiled:
                        drop_key(keys, x)
                        drop_item(blocks, x)
                    else:
                        del keys[x], blocks[x]
                    nxt = b.next = nxt.next
                    if nxt is not None:
                        nxt.prev = b
                    subsumed += nsize
                b.size = size = size + subsumed
                if stamp:
                    b.gc_base = calls_small if pool.small else calls_large
                if size < fit:
                    fk = size << shift | b.ptr - lo
                    x = word_place(keys, fk)
                    put_word(keys, x, fk)
                    put_item(blocks, x, b)
                else:
                    pool.insert(b)
                if not es:
                    isb += size - subsumed if prev is not None or nxt is not None else -subsumed
                    if isb > isb_peak:
                        isb_peak = isb
            else:
                break
        else:
            j = None
        dev.clock, self.allocated = tape.at(clock) if rec else clock, allocated
        self.inactive_split_bytes, self.inactive_split_bytes_peak = isb, isb_peak
        gfb[0], gfb[1] = calls_large, calls_small
        self.n_malloc += len(lat) - n0      # one per malloc, as `malloc` counts them
        return j, peak

    def _inactive_split(self, delta: int) -> None:
        v = self.inactive_split_bytes = self.inactive_split_bytes + delta
        if v > self.inactive_split_bytes_peak:
            self.inactive_split_bytes_peak = v

    @cython.locals(pool=BlockPool, b=Block)
    def _get_free_block(self, pool: BlockPool, n: int):
        """Best fit on this stream: smallest size >= n, lowest address; oversize rules."""
        if self.gc_on():
            self.gfb_calls[pool.small] += 1
        keys = pool.keys
        i = key_place(keys, pool.field.least(n))
        if i == len(keys):
            return None
        if self.expandable and pool.blocks[i].es is not None:
            i = _grow_least(pool.blocks, i)
        b = pool.blocks[i]
        size, ms = b.size, self.max_split
        if n < ms and size >= ms:
            return None
        if n >= ms and size >= n + self.max_non_split_rounding:
            return None
        del keys[i], pool.blocks[i]
        return b

    def _escalate(self, pool: BlockPool, n: int):
        """Steps 2-6 after a pool miss; None after counting an OOM."""
        ctx = self.ctx
        if n >= self.max_split:         # before anything is freed: the pool as the search saw it
            self._note_oversize(pool, n)
        # free-memory callbacks: none registered in a replay, so no second search
        if self.gc_on():
            if self.gc_ages_only:
                where = ctx.section_path()
                self.gc_misses[where] = self.gc_misses.get(where, 0) + 1
                self.gc_high = max(self.gc_high, ctx.reserved)
            else:
                ctx.push_section("2. garbage_collect_cached_blocks")
                self.garbage_collect_cached_blocks()
                ctx.pop_section()
        seg = get_allocation_size(n)
        ctx.push_section("3. alloc_block")
        b = self._alloc_block(pool, n, seg)
        ctx.pop_section()
        if b is None and self.max_split != SIZE_MAX:
            ctx.push_section("4. release_available_cached_blocks")
            if self.release_available_cached_blocks(pool, n):
                ctx.push_section("alloc_block")
                b = self._alloc_block(pool, n, seg)
                ctx.pop_section()
            ctx.pop_section()
        if b is None and not self._captures:       # skipped while a pool is begun (captures_underway)
            ctx.push_section("5. release_cached_blocks")
            self.release_cached_blocks()
            ctx.pop_section()
            if self.fix_189504:
                ctx.push_section("5.1 get_free_block (fix #189504)")
                b = self._get_free_block(pool, n)
                ctx.pop_section()
            if b is None:
                ctx.push_section("6. alloc_block (retry)")
                self.num_alloc_retries += 1
                b = self._alloc_block(pool, n, seg)
                ctx.pop_section()
        if b is None:
            self.num_ooms += 1
        return b

    def _note_oversize(self, pool: BlockPool, n: int) -> None:
        """A pool miss of a request of at least ``max_split``: keep the least excess over ``n`` of a best-fit
        candidate that rule 5's second clause refused (``oversize_slack``; none: the pool held no block as large).
        A larger ``max_non_split_rounding_mb`` would have taken it only if the excess is below it: `allocsim.search.tune`
        resumes such a setting from this one's replay up to there (`allocsim.search.spaces.torch.watch`)."""
        keys = pool.keys
        i = key_place(keys, pool.field.least(n))
        if i < len(keys):
            if self.expandable and pool.blocks[i].es is not None:
                i = _grow_least(pool.blocks, i)
            self.oversize_slack = min(self.oversize_slack, pool.blocks[i].size - n)

    def _cover(self, ptr: int, size: int) -> None:
        """A new segment at ``ptr``: widen the key field to it where it lies outside, re-keying every pool."""
        if not self._field.covers(ptr, size):
            self._field.widen(ptr, size)
            for _, pp in self._all_pools():
                for pool in pp:
                    pool.rekey()

    def _log(self, kind: int, size: int, addr: int, pool: BlockPool) -> None:
        self.segment_log.append((kind, size, self.event_index))
        self.segment_where.append((addr, pool.stream))

    def _alloc_block(self, pool: BlockPool, n: int, seg: int):
        """A new segment (or expandable pages) for ``n`` bytes; None if the device refuses."""
        if not self.allowed.grants(self.ctx.reserved + seg):
            return None
        if self.expandable:
            return self._try_allocate_expandable_block(pool, n)
        ptr = self.ctx.malloc(seg)
        if ptr is None:
            return None
        self._cover(ptr, seg)
        self.num_device_alloc += 1
        self.segments += 1
        self.segments_allocated += 1
        if pool.owner is not None:
            pool.owner.reserved += seg
        self._log(SEGMENT_ALLOC, seg, ptr, pool)
        return Block(ptr, seg, pool)

    # ---- free -----------------------------------------------------------------------------
    @cython.locals(b=Block, pool=BlockPool, prev=Block, nxt=Block)
    def free(self, b):
        self._charge(self._free_s)
        self.n_free += 1
        b.allocated = False
        self.allocated -= b.size
        pool = b.pool
        prev, nxt = b.prev, b.next
        if prev is None and nxt is None:
            self._insert(pool, b)
            return
        subsumed = self._try_merge(b, prev) + self._try_merge(b, nxt)
        self._insert(pool, b)
        if b.es is None:
            delta = -subsumed
            if b.prev is not None or b.next is not None:
                delta += b.size
            if delta:
                self._inactive_split(delta)

    @staticmethod
    @cython.locals(dst=Block, src=Block, p=Block, nx=Block)
    def _try_merge(dst: Block, src: Block | None) -> int:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return 0
        src.pool.erase(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            p = dst.prev = src.prev
            if p is not None:
                p.next = dst
        else:
            nx = dst.next = src.next
            if nx is not None:
                nx.prev = dst
        dst.size += src.size
        return src.size

    # ---- releasing cached memory ----------------------------------------------------------
    def _release_block(self, b: Block) -> None:
        """cudaFree a whole free non-expandable segment."""
        b.pool.erase(b)
        self.ctx.free(b.ptr, b.size)
        self.num_device_free += 1
        self.segments -= 1
        if b.pool.owner is not None:
            b.pool.owner.reserved -= b.size
        self._log(SEGMENT_FREE, b.size, b.ptr, b.pool)

    def release_available_cached_blocks(self, pool: BlockPool, n: int) -> bool:
        """Free one cached oversize block >= max(n, max_split), else the largest ones."""
        ms = self.max_split
        if ms == SIZE_MAX:
            return False
        key_size = max(n, ms)
        blocks = list(pool.blocks)
        pos = key_place(pool.keys, pool.field.least(key_size))
        if pos < len(blocks) and blocks[pos].es is None:
            self._release_block(blocks[pos])
            return True
        released = 0
        for b in reversed(blocks[:pos]):
            if released >= key_size or b.size < ms:
                break
            if b.es is None:
                released += b.size
                self._release_block(b)
        return released >= key_size

    def release_cached_blocks(self, only: int | None = None) -> None:
        """empty_cache(): unless a pool is begun, sync events and free every whole cached segment of the default
        pools (large, then small) and unmap their free pages; then the same for each freeable private pool (small,
        then large), forgetting one left with no segment. ``only``: ``emptyCache(pool)``, that private pool alone."""
        if only is None and not self._captures:
            self.num_sync_all_streams += 1          # synchronize_and_free_events: nothing is pending
            self.cache_flushes += 1
            for small in (False, True):
                for pool in self._pools_in_order(small):
                    self._release_blocks(pool)
        for number, owner in list(self._freeable.items()):
            if only is not None and number != only:
                continue
            for small in (True, False):
                for pool in self._pools_in_order(small, owner):
                    self._release_blocks(pool)
            if owner.reserved == 0:
                del self._private[number], self._freeable[number]

    def _release_blocks(self, pool: BlockPool) -> None:
        """PyTorch's ``release_blocks``: cudaFree the whole free segments of ``pool``, unmap its free pages."""
        to_unmap = []
        for b in list(pool.blocks):
            if b.es is not None:
                to_unmap.append(b)
            elif b.prev is None and b.next is None:
                self._release_block(b)
        for b in to_unmap:
            self._unmap_block(b)
            if b.prev is None and b.next is None and not b.mapped:
                pool.erase(b)                       # release_expandable_segment
                self._segments.remove(b.es)

    # ---- private pools --------------------------------------------------------------------
    def pool_event(self, kind: int, pool: int, stream: int, flags: int) -> None:
        """`Policy.pool_event`: ``beginAllocateToPool`` / ``endAllocateToPool`` / ``createOrIncrefPool`` /
        ``releasePool`` (+ ``emptyCache(pool)`` with POOL_EMPTY) as CUDACachingAllocator.cpp does them. A release
        or end of a pool the trace never began (recording started after) is ignored."""
        if kind == POOL_BEGIN:
            self._incref(pool)
            self._captures.append((pool, None if flags & POOL_ANY_STREAM else stream))
        elif kind == POOL_END:
            for i, (number, _) in enumerate(self._captures):
                if number == pool:
                    del self._captures[i]
                    break
        elif kind == POOL_RELEASE:
            owner = self._private.get(pool)
            if owner is None or owner.use_count == 0:
                return
            owner.use_count -= 1
            if owner.use_count == 0:
                self._freeable[pool] = owner
            if flags & POOL_EMPTY:
                self.ctx.push_section("empty_cache(pool)")
                self.release_cached_blocks(only=pool)
                self.ctx.pop_section()
        else:                                       # POOL_RETAIN
            self._incref(pool)

    def _incref(self, pool: int) -> None:
        """``create_or_incref_pool``: a new pool has one user; a known one gains one."""
        owner = self._private.get(pool)
        if owner is None:
            self._private[pool] = PrivatePool(pool)
        else:
            owner.use_count += 1
            self._freeable.pop(pool, None)

    def release_cache(self) -> None:
        """``torch.cuda.empty_cache()`` (a CACHE_RELEASE event): ``emptyCache`` is `release_cached_blocks`."""
        ctx = self.ctx
        ctx.push_section("empty_cache")
        self.release_cached_blocks()
        ctx.pop_section()

    def garbage_collect_cached_blocks(self) -> None:
        """Free large-pool cached segments at least as old as the average, down to the threshold."""
        gc_thr = int(self.garbage_collection_threshold * self.allowed())
        dev = self.ctx
        if dev.reserved <= gc_thr:
            return
        target = dev.reserved - gc_thr
        now = self.gfb_calls[False]
        large = self._pools_in_order(False)
        total_age = count = 0
        for pool in large:
            for b in pool.blocks:
                if b.prev is None and b.next is None:
                    total_age += now - b.gc_base
                    count += 1
        reclaimed, freed = 0, True
        while reclaimed < target and freed and count > 0:
            threshold = total_age / count
            freed = False
            for pool in large:
                for b in list(pool.blocks):
                    if b.prev is None and b.next is None and b.es is None and now - b.gc_base >= threshold:
                        freed = True
                        reclaimed += b.size
                        total_age -= now - b.gc_base
                        count -= 1
                        self._release_block(b)

    # ---- expandable segments --------------------------------------------------------------
    def _find_expandable_block(self, pool: BlockPool, n: int) -> Block:
        """Lowest-address free+unmapped run that fits ``n``, else a new segment's range."""
        def allocatable(b):
            return b is not None and not b.allocated

        for ptr in pool.unmapped:
            c = pool.unmapped_blocks[ptr]
            if allocatable(c.prev):
                c = c.prev
            room, x = 0, c
            while room < n and allocatable(x):
                room += x.size
                x = x.next
            if room >= n:
                return c
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        total = self.total_memory or (1 << 44)
        size = (total + total // 8 + page - 1) // page * page
        es = ExpandableSegment(self.ctx.reserve_address_range(size), size, page)
        self._cover(es.base, size)
        self._segments.append(es)
        c = Block(es.base, size, pool, es, mapped=False)
        pool.insert(c)
        return c

    def _try_allocate_expandable_block(self, pool: BlockPool, n: int):
        c = self._find_expandable_block(pool, n)
        if not c.mapped and not self._map_block(c, min(c.size, n)):
            return None
        while c.size < n:
            nc = c.next
            if not self._map_block(nc, min(n - c.size, nc.size)):
                return None
            c = nc
        pool.erase(c)
        return c

    def _map_block(self, b: Block, size: int) -> bool:
        es, dev = b.es, self.ctx
        page = es.page
        begin = (b.ptr - es.base) // page
        end = (b.ptr + size - es.base + page - 1) // page
        mapped = (end - begin) * page
        if not dev.fits(mapped):
            return False
        dev.map(mapped)                 # one map call, as num_device_alloc counts it
        pool = b.pool
        if pool.owner is not None:
            pool.owner.reserved += mapped
        pool.erase(b)
        b.mapped = True
        if mapped < b.size:
            r = Block(b.ptr + mapped, b.size - mapped, pool, es, mapped=False)
            r.prev, r.next = b, b.next
            if b.next is not None:
                b.next.prev = r
            b.next = r
            b.size = mapped
            pool.insert(r)
        self._try_merge(b, b.prev)
        self._try_merge(b, b.next)
        self._insert(pool, b)
        self.num_device_alloc += 1
        self._log(SEGMENT_MAP, mapped, es.base + begin * page, pool)
        return True

    def _unmap_block(self, b: Block) -> None:
        """Unmap the whole pages inside free block ``b``; the partial ends stay mapped."""
        es, pool = b.es, b.pool
        page = es.page
        begin = (b.ptr - es.base + page - 1) // page
        end = (b.ptr + b.size - es.base) // page
        if begin >= end:
            return
        pool.erase(b)
        uptr, usize = es.base + begin * page, (end - begin) * page
        before = uptr - b.ptr
        after = b.size - before - usize
        if before > 0:
            f = Block(b.ptr, before, pool, es)
            f.prev, f.next = b.prev, b
            if b.prev is not None:
                b.prev.next = f
            b.prev = f
            self._insert(pool, f)
        if after > 0:
            f = Block(uptr + usize, after, pool, es)
            f.prev, f.next = b, b.next
            if b.next is not None:
                b.next.prev = f
            b.next = f
            self._insert(pool, f)
        b.ptr, b.size, b.mapped = uptr, usize, False
        self._try_merge(b, b.prev)
        self._try_merge(b, b.next)
        pool.insert(b)
        self.ctx.free(uptr, usize)   # one unmap call, as num_device_free counts it
        if pool.owner is not None:
            pool.owner.reserved -= usize
        self.num_device_free += 1
        self._log(SEGMENT_UNMAP, usize, uptr, pool)

    # ---- checkpoints (`allocsim.engine.replay.Replay.checkpoint`) ------------------------------------
    def keep_gc_ages(self) -> None:
        """Keep the GC threshold's clocks (`gfb_calls`, each block's ``gc_base``) as a threshold in force keeps
        them, count the pool misses (``gc_misses``, per open section path) and the most reserved at one
        (``gc_high``), and collect nothing: before a replay starts, on a policy without a threshold, whose replay
        is then the same, figure for figure, and whose checkpoints a threshold ``t`` of the same options resumes
        from as long as ``gc_high <= int(t * allowed)`` (`garbage_collect_cached_blocks` returns at once below it:
        docs/models/torch.md; `allocsim.search.tune` resumes them so). ``malloc`` and ``free`` are the general ones,
        which keep the clocks (the fused loop keeps them too)."""
        if self.gc_threshold_set or self._captures or self._private:
            raise ValueError("keep_gc_ages: a policy without a GC threshold, before its replay")
        self.gc_threshold_set = self.gc_ages_only = True
        self.malloc = TorchCachingAllocator.malloc.__get__(self)
        self.free = TorchCachingAllocator.free.__get__(self)

    #: Counters and fields a walk changes, copied by `checkpoint` (the blocks, pools and logs apart).
    _WALKED = ("allocated", "event_index", "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms",
               "num_sync_all_streams", "cache_flushes", "segments", "segments_allocated", "inactive_split_bytes",
               "inactive_split_bytes_peak", "n_malloc", "n_free", "gc_misses", "gc_high", "oversize_slack")

    def checkpoint(self, handles: dict) -> "TorchState":
        """The state so far, copied, with ``handles`` (the replay's id -> live block) pointing into the copy:
        O(blocks). The private pools too (`TorchPoolsPath`'s: their blocks, users and reserved bytes, the pools
        begun and the freeable ones), so a replay of a trace with pool events resumes as well."""
        pools, field, handles, private = self._copied(self._pools, self._field, handles, self._private)
        counters = tuple(dict(v) if k == "gc_misses" else v for k, v in ((k, getattr(self, k)) for k in self._WALKED))
        return TorchState(pools, field, handles, private, counters,
                          self.gfb_calls[:], self._segments[:], self.segment_log[:], self.segment_where[:],
                          self._captures[:], list(self._freeable))

    def restore(self, state: "TorchState") -> dict:
        """Take a `checkpoint`'s state (copied again), this policy's options kept; the live blocks' handles, for
        the replay's table. Under a GC threshold (not `keep_gc_ages`), each pool miss of the walk before counts
        its ``garbage_collect_cached_blocks`` section, which returned at once (no time)."""
        pools, field, handles, private, values, calls, segments, log, where, captures, freeable = state
        pools, field, handles, private = self._copied(pools, field, handles, private)
        for k, v in zip(self._WALKED, values):
            setattr(self, k, dict(v) if k == "gc_misses" else v)
        self._pools, self._field, self.gfb_calls, self._segments = pools, field, calls[:], segments[:]
        self.segment_log, self.segment_where, self._spare = log[:], where[:], []
        self._private, self._captures = private, captures[:]
        self._freeable = {number: private[number] for number in freeable}
        if self.gc_threshold_set and not self.gc_ages_only and self.gc_misses:
            for path, n in self.gc_misses.items():      # under the section each miss was in (a recorded OOM's)
                self.ctx.add_section("2. garbage_collect_cached_blocks", 0.0, n, under=path)
            self.gc_misses, self.gc_high = {}, 0
        return handles

    @staticmethod
    def _copied(pools: dict, field: KeyField, handles: dict, private: dict) -> tuple:
        """Copies of ``pools`` (stream -> (small, large)), their key field, the ``private`` pools (number ->
        `PrivatePool`) and every block in them or held by ``handles``, linked as the originals are; ``handles``
        pointing to the copies."""
        f = KeyField()
        f.lo, f.abits, f.fit, f.low, f.high = field.lo, field.abits, field.fit, field.low, field.high
        new: dict = {}

        def copied(pools: dict, owner) -> dict:
            out = {}
            for stream, pp in pools.items():
                copies = []
                for pool in pp:
                    q = BlockPool(pool.small, stream, f, owner)
                    q.keys, q.unmapped = pool.keys[:], pool.unmapped[:]
                    new[id(pool)] = pool, q
                    copies.append(q)
                out[stream] = tuple(copies)
            return out
        out_pools = copied(pools, None)
        out_private = {}
        for number, owner in private.items():
            c = out_private[number] = PrivatePool(number)
            c.use_count, c.reserved = owner.use_count, owner.reserved
            c.pools = copied(owner.pools, c)
        blocks = [b for pool, _ in new.values() for b in (*pool.blocks, *pool.unmapped_blocks.values())]
        blocks += handles.values()
        seen = {}
        todo = blocks
        while todo:                     # every block linked to one of these (a segment's whole run)
            more = []
            for b in todo:
                if id(b) in seen:
                    continue
                c = Block(b.ptr, b.size, new[id(b.pool)][1], b.es, b.mapped)
                c.allocated, c.requested, c.gc_base = b.allocated, b.requested, b.gc_base
                seen[id(b)] = (b, c)
                for x in (b.prev, b.next):
                    if x is not None and id(x) not in seen:
                        more.append(x)
            todo = more
        for b, c in seen.values():
            c.prev = None if b.prev is None else seen[id(b.prev)][1]
            c.next = None if b.next is None else seen[id(b.next)][1]
        for pool, q in new.values():
            q.blocks = [seen[id(b)][1] for b in pool.blocks]
            q.unmapped_blocks = {p: seen[id(b)][1] for p, b in pool.unmapped_blocks.items()}
        return out_pools, f, {i: seen[id(b)][1] for i, b in handles.items()}, out_private

    # ---- folding (`Policy.fold_state`) ----------------------------------------------------------
    fold_counters = ("n_malloc", "n_free", "num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms",
                     "num_sync_all_streams", "cache_flushes", "segments_allocated")

    @cython.locals(b=Block, pool=BlockPool, w=cython.longlong[::1], k=cython.Py_ssize_t, small=cython.longlong,
                   large=cython.longlong)
    def fold_state(self, held):
        """Every block (the pools' free ones and the ``held`` ones) by address: mapped, size, allocated (with its
        requested bytes), pool (small, and its stream's place among the pools made), expandable segment,
        neighbours, and a free block's age in ``get_free_block`` calls (the GC threshold's clock: only ages matter),
        as eleven machine words a block (-1: no segment or neighbour), bytes to compare (a fingerprint is taken at
        every boundary: compiled, the words are written in C, no tuple per block to sort and pickle); the pools
        made, the expandable segments, and the counts a decision or a statistic's peak reads. None if a block's
        pool is not among them (a private pool's: never folded) or two blocks share an address."""
        large, small = self.gfb_calls     # (indexed by `BlockPool.small`)
        blocks = [b for pp in self._pools.values() for pool in pp
                  for b in (*pool.blocks, *pool.unmapped_blocks.values())]
        blocks += held
        streams = sorted(self._pools)
        place = {s: n for n, s in enumerate(streams)}
        words = array("q", bytes(88 * len(blocks)))
        w = words
        k = 0
        for b in blocks:                # (in address order below, by numpy: a dict and a sort of the addresses
            pool = b.pool               # were two thirds of a look's state on GPT-2 small)
            n = place.get(pool.stream)
            if n is None:
                return None
            w[k] = b.ptr
            w[k + 1] = b.mapped
            w[k + 2] = b.size
            w[k + 3] = b.allocated
            w[k + 4] = b.requested if b.allocated else 0
            w[k + 5] = pool.small
            w[k + 6] = n
            w[k + 7] = -1 if b.es is None else b.es.base
            w[k + 8] = -1 if b.prev is None else b.prev.ptr
            w[k + 9] = -1 if b.next is None else b.next.ptr
            w[k + 10] = 0 if b.allocated else (small if pool.small else large) - b.gc_base
            k += 11
        # (a block's pool outside the pools, above, and two blocks at one address, below, both give None: the two
        # checks need no order)
        rows = np.frombuffer(words, np.int64).reshape(-1, 11)
        rows = rows[np.argsort(rows[:, 0], kind="stable")]
        if (rows[1:, 0] == rows[:-1, 0]).any():
            return None                 # two blocks at one address (none seen): not told apart, not folded
        return (rows.tobytes(), streams, [(es.base, es.size, es.page) for es in self._segments],
                self.allocated, self.inactive_split_bytes, self.segments)

    def fold_counts(self) -> tuple:
        """`fold_counters`, and where the segment log ends (its entries repeat with the window)."""
        return super().fold_counts() + (len(self.segment_log),)

    def fold_advance(self, before, after, k) -> None:
        super().fold_advance(before, after, k)
        lo, hi = before[-1], after[-1]
        self.segment_log += self.segment_log[lo:hi] * k
        self.segment_where += self.segment_where[lo:hi] * k

    # ---- reporting ------------------------------------------------------------------------
    def block(self, handle):
        return handle.ptr, handle.size

    @cython.locals(out=dict, b=Block)
    def addresses(self, held: dict) -> dict:
        """`Policy.addresses`: each block's ``ptr`` read directly (compiled: a C field), not through `block` (unless
        a subclass says where its blocks lie itself)."""
        if type(self).block is not TorchCachingAllocator.block:
            return Policy.addresses(self, held)
        out = {}
        for i, h in held.items():
            b = h
            out[i] = b.ptr
        return out

    def layout(self, live) -> list[dict]:
        """The segments as PyTorch's ``snapshot()`` reports them, by address; read-only, O(blocks).

        ``live`` are the handles of the live blocks (an allocated block is known only to its
        holder; the free ones are in the pools). As in PyTorch, each run of mapped blocks is
        one segment, so an expandable segment gives one per mapped range. Each segment:
        ``address, size, stream`` (index), ``small``, ``expandable``, ``pool`` (the private pool's number, 0 for
        the default pools) and ``blocks``, a list of
        ``(address, size, requested bytes, allocated)`` in address order.
        """
        blocks = [b for _, pp in self._all_pools() for pool in pp for b in pool.blocks]
        blocks += live
        out = []
        for head in blocks:
            if head.prev is not None and head.prev.mapped:
                continue
            run, b = [], head
            while b is not None and b.mapped:
                run.append((b.ptr, b.size, b.requested if b.allocated else 0, b.allocated))
                b = b.next
            owner = head.pool.owner
            out.append({"address": head.ptr, "size": sum(r[1] for r in run), "stream": head.pool.stream,
                        "small": head.pool.small, "expandable": head.es is not None, "blocks": run,
                        "pool": 0 if owner is None else owner.number})
        return sorted(out, key=lambda s: s["address"])

    def largest_free(self) -> int:
        best = 0
        for _, pp in self._all_pools():
            for pool in pp:
                if pool.keys:
                    best = max(best, pool.keys[-1] >> pool.field.abits)
        return best

    def free_breakdown(self, stream):
        """The mapped free blocks (only mapped bytes are reserved) by their pool's stream. Free mapped
        neighbours are always merged, so a free block lies in a segment (a mapped run) holding a live block
        exactly when a neighbour is allocated: hard; else the whole run is free: soft."""
        def beside_live(b):
            return (b.prev is not None and b.prev.allocated) or (b.next is not None and b.next.allocated)
        return self.free_parts(((s, b.size, beside_live(b)) for s, pp in self._all_pools() for pool in pp
                                for b in pool.blocks), stream)

    def counters(self) -> dict:
        """``torch.cuda.memory_stats()``'s counters. PyTorch's ``segment`` stat counts cudaMalloc'd segments only,
        never expandable ones (0 in ``traces/resnet50-expandable.bin.stats.json`` beside 103 maps), so with
        expandable segments it is left out rather than shown as a misleading 0."""
        out = {
            "num_device_alloc": self.num_device_alloc, "num_device_free": self.num_device_free,
            "num_alloc_retries": self.num_alloc_retries, "num_ooms": self.num_ooms,
            "num_sync_all_streams": self.num_sync_all_streams, "cache_flushes": self.cache_flushes,
            "segment_current": self.segments, "segment_allocated": self.segments_allocated,
            "inactive_split_bytes_peak": self.inactive_split_bytes_peak,
        }
        if self.expandable:
            del out["segment_current"], out["segment_allocated"]
        return out

    def finish(self):
        self.ctx.add_section("1. get_free_block", self.n_malloc * self._hit_s, self.n_malloc)


class TorchFastPath(TorchCachingAllocator):
    """`torch` without expandable segments or a GC threshold (`TorchCachingAllocator.variant` makes it): the
    inlined hot path declared as this class's malloc, free and fused loop, so the engine may use the loop."""

    malloc = TorchCachingAllocator._malloc_fast
    free = TorchCachingAllocator._free_fast
    walk_chunk = TorchCachingAllocator._walk_chunk_fused
    records_fused = True


class TorchOptionsPath(TorchCachingAllocator):
    """`torch` with expandable segments or a GC threshold (`TorchCachingAllocator.variant` makes it): `malloc`
    and `free` as they read, with the fused loop that inlines them under those options declared beside them,
    so the engine may use the loop (a plug-in subclass of `torch` declares none and takes the plain walk)."""

    malloc = TorchCachingAllocator.malloc
    free = TorchCachingAllocator.free
    walk_chunk = TorchCachingAllocator._walk_chunk_fused
    records_fused = True


class TorchPoolsPath(TorchCachingAllocator):
    """`torch` on a trace with pool events (`TorchCachingAllocator.variant` makes it): `malloc` and `free` as
    they read, which route to the private pools; no fused loop (its inlined malloc knows only the default
    pools), so the engine takes the plain walk."""

    malloc = TorchCachingAllocator.malloc
    free = TorchCachingAllocator.free


def has_pool_events(trace) -> bool:
    """Whether ``trace`` holds private-pool events (`allocsim.trace.events.POOL`). O(events) once per trace
    (`Trace.kinds_present`)."""
    return not trace.kinds_present.isdisjoint(POOL)
