"""`cupy`: CuPy's ``SingleDeviceMemoryPool``, step for step.

Source: `docs/models/cupy.md` (``cupy/cuda/memory.pyx``, v13.6 and
v14.1/v14.2/main). What the model does, as CuPy does:

- every request is rounded up to 512 B (``_round_size``);
- one arena per stream; a free chunk goes back to its own stream's arena and no
  other stream ever takes it (no cross-stream reuse, no events);
- best fit: the smallest free chunk whose size is >= the rounded request; a larger
  chunk is split, the remainder (a multiple of 512 B, no minimum) goes back into
  the arena without merging;
- the chunks of one device allocation (one ``Memory``) are a doubly linked list;
  on free a chunk merges with a free ``next`` and then a free ``prev``, so chunks of
  different device allocations never merge;
- ``free_all_blocks`` releases only whole chunks (no ``prev`` and no ``next``): a
  split allocation stays reserved until its pieces have merged back into one. It
  goes arena by arena (in the order they were made) and, in each, in the order the
  chunks became free (CuPy walks its free index, smallest first: not modelled, see
  docs/models/cupy.md). Named a stream, it releases only that stream's arena (none
  made if it has none);
- ``_try_malloc``'s escalation: (v14) a request larger than the limit itself -> OOM at
  once, nothing released; over the limit -> ``free_all_blocks``; still over ->
  ``gc.collect()`` + ``free_all_blocks``; still over -> OOM. Device allocation
  failure -> ``free_all_blocks`` + retry -> ``gc.collect()`` (twice in v14, once in
  v13) + ``free_all_blocks`` + retry -> OOM. ``gc.collect()`` is
  ``runtime.collect(full=True)``.

The limit is the smaller of the ``limit`` option (``set_limit(size=...)`` /
``CUPY_GPU_MEMORY_LIMIT``) and the device's cap (``--cap``, or the program's own
``set_limit`` calls, recorded as SET_LIMIT events), read at each check; it is
checked against the pool's total (reserved) bytes, so cached free chunks count
against it. Each comparison the cap takes part in is told to the device
(``ctx.note``), so `allocsim fit` certifies caps by it. The device capacity (the
GPU) is what makes a device allocation fail. A recorded OOM (the walk attempts the
request again) runs this same escalation; a cache release (CACHE_RELEASE,
``release_cache``) is ``free_all_blocks()``.

Ties between free chunks of the same size (the only place v13 and v14 differ in
the lookup, since v13's bins ``(n - 1) // 512`` hold exactly one rounded size):

- ``version=14`` (default, ``std::set<(size, id(chunk))>``): CuPy breaks ties by the
  address of the chunk *object*, which is arbitrary; the model takes the chunk at
  the lowest device address instead, deterministically.
- ``version=13`` (``set.pop()`` from the first non-empty bin): arbitrary in CuPy; the
  model takes the most recently freed chunk (LIFO).
- ``follow_ties`` (default on), replaying a trace CuPy's pool recorded (``framework`` cupy):
  the chunk at the place the recorded request got (its segment by number, and the offset:
  `RecordedPlaces`), when it is one of the tied chunks (`RecordedTiesCuPyPool`; the replay
  then takes the plain walk). Since CuPy's tie order
  comes from where its chunk objects lie in host memory, two runs of one program may break
  a tie differently; this is what lets a replay follow the run it was recorded from
  (docs/models/cupy.md, "Ties").

Known differences: v14's ``_pending_free`` and v13's ``_compact_index`` change
only locking and speed, not placement, and are not modeled; hooks are not modeled.

Data structures and costs. A chunk is a `_Chunk`, a record of seven slots (a slot
read or write is one specialised instruction, no dict): its address, size, the
neighbouring chunks of its device allocation, its arena, its key and when it last
became a whole free chunk (``seq``). Per arena, ``keys`` is the sorted list of the free
chunks' keys, one int per chunk that orders them as the lookup prefers and names it,
and ``chunks`` the free chunks in the same order (``chunks[i]`` is the chunk of
``keys[i]``: found and dropped by position, no dict); `free_all_blocks` releases the
whole ones in the order they became whole, their ``seq``'s:

- v14: ``units << A | offset``, ``units`` the size in 512 B units, ``offset`` the
  address minus the pool's lowest device address ``lo``, ``A`` (``abits``) bits
  wide: the smallest size first, then the lowest address;
- v13: ``(units << 64 | tie) << A | offset``, where ``tie`` falls with every chunk
  filed (the last freed first).

These fields are the pool's `_FreeIndex` (``_ix``), with v13's ``tie`` and the spare chunk records.
``A`` covers every device allocation the pool has made (with room to double); a
device allocation outside ``[lo, lo + 2**A)`` moves ``lo`` or widens ``A`` and
re-keys the free chunks (`_cover`: O(f log f), only on a device allocation, and
the order of the keys does not change). So a v14 key stays within 63 bits (one
machine word, no big-integer arithmetic) while the largest chunk's units times the
address span stay below 2**63: 1 GiB chunks over 4 TiB of addresses, 64 GiB over
64 GiB; past that it is a longer int, still exact. v13 keys are longer ints.
Best fit is one bisect for the first key >= the request's ``units << shift``; the
chunk there is taken by position. Insert/remove: O(log f) search + O(f) memmove (in
C) of both lists for f free chunks in the arena; a split's remainder and a merged
chunk take the entry of the chunk they came from (the keys between move by one).
f stays small in practice (at most ~250 in every recorded and synthetic trace), so a
hit, a split and a free with merges are each a handful of list operations (fewer
than size buckets plus a sorted size list). The memmove starts to dominate past a
few thousand free chunks in one arena. ``free_all_blocks`` is O(f + w log w) for w
whole free chunks. Chunks that ``free`` merges away are kept and reused for the next
split's remainder, so the chunk records never outnumber the most chunks held at once.

The hot path: `malloc` and `free` serve the plain walk; `walk_chunk` is the same
two inlined over a run of events (docs/architecture.md, "The fast path"), held to
them by tests/test_fast_path.py; all three split and file chunks through
`_split_off` and `_file_freed`.

The compiled build (docs/architecture.md, "The compiled build") compiles this file as it is: ``cupy.pxd``
makes `_Chunk`, `_Arena` and `_FreeIndex` C records (sizes, addresses, ``seq`` and the key fields as C
integers, a v14 key below 2**62 made in C arithmetic), the ``@cython`` decorators type the hot loop's locals
and make the split and the filing C calls. Under v14 an arena's ``keys`` are C words in an ``array('q')``
(`_Arena.words`), searched without a branch and moved by ``memmove`` (`_sorted`'s ``word_place``,
``move_key``), until a key past 63 bits is filed (`_Arena.widen`), from when they are Python ints as
interpreted; a split's remainder and a merged chunk take their entry with one move of the entries between
(``move_key``/``move_item``; interpreted, an entry whose chunk still sorts there is overwritten, else it is
dropped and inserted: the same order).

Validation hooks: ``segment_log`` is a list of ``(SEGMENT_ALLOC | SEGMENT_FREE,
size, event_index)``, one per device call; ``track_total=True`` keeps
``total_log``, an ``array('q')`` of the pool's total bytes after each malloc/free
call that reached the pool.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right, insort

import numpy as np

try:
    import cython                   # the compiled build (docs/architecture.md, "The compiled build")
except ImportError:
    from ..compiled import cython   # interpreted: its decorators and types change nothing

from ..errors import UsageError
from ..trace.events import ALLOC, SEGMENT_ALLOC, SEGMENT_FREE
from ._columns import address_order
from .registry import register
from .base import Param, Policy

if not cython.compiled:             # compiled, cupy.pxd cimports their C loops
    from ._latency import add_latency
    from ._sorted import drop_key, key_place, move_item, move_key, put_item, put_key, word_place

UNIT = 512          # ALLOCATION_UNIT_SIZE; a key counts sizes in these units (``size >> 9``)
TIE_BITS = 64       # v13: the width of a key's tie field
MIN_ABITS = 32      # the first address field's width (4 GiB of addresses)
COMPILED = cython.compiled      # a C constant compiled (cupy.pxd): the split and the filing take one move

# Section names, numbered in escalation order (sections print children by name).
S_LOOKUP = "1.1 best fit"
S_MALLOC = "1.2 cudaMalloc"
S_LIMIT_FLUSH = "2.1 free_all_blocks (limit)"
S_LIMIT_GC = "2.2 gc.collect (limit)"
S_LIMIT_FLUSH2 = "2.3 free_all_blocks (limit)"
S_FAIL_FLUSH = "3.1 free_all_blocks"
S_FAIL_RETRY = "3.2 cudaMalloc"
S_FAIL_GC = "3.3 gc.collect"
S_FAIL_FLUSH2 = "3.4 free_all_blocks"
S_FAIL_RETRY2 = "3.5 cudaMalloc"


class _Chunk:
    """A piece of one device allocation; ``prev``/``next`` link the pieces of the same one,
    ``arena`` is its stream's arena.

    ``key``: the chunk's key in its arena's ``keys`` while it is free, 0 while in use
    (one slot serves as both the free flag and the handle to remove it by).

    ``seq``: when it last became a whole free chunk (a device allocation of its own, free: `_FreeIndex.filed`),
    the order `free_all_blocks` releases them in.
    """

    __slots__ = ("ptr", "size", "prev", "next", "arena", "key", "seq")

    def __init__(self, ptr, size, prev, next_, arena):
        self.ptr = ptr
        self.size = size
        self.prev = prev
        self.next = next_
        self.arena = arena
        self.key = 0
        self.seq = 0

    @property
    def is_free(self) -> bool:
        return self.key != 0


def _filing_order(c: _Chunk) -> int:
    return c.seq


class _Arena:
    """The free chunks of one stream (see the module docstring for the costs): ``chunks[i]`` is the chunk of
    ``keys[i]``, found and dropped by position (no dict).

    ``words``: the keys are C words in an ``array('q')`` (the compiled build under v14, until a key past 63 bits
    is filed), else a list of Python ints; `_sorted`'s ``key_place``, ``put_key`` and ``drop_key`` take either."""

    __slots__ = ("keys", "chunks", "words")

    def __init__(self, words: bool):
        self.words = words
        self.keys = array("q") if words else []     # sorted keys of the free chunks
        self.chunks: list[_Chunk] = []              # the free chunks, in key order

    def whole(self) -> list:
        """The free chunks that are a whole device allocation, in the order they became so (`free_all_blocks`'s
        order; a chunk with a neighbour is released only once its pieces have merged, which files it anew)."""
        return sorted((c for c in self.chunks if c.prev is None and c.next is None), key=_filing_order)

    def widen(self) -> None:
        """Keep the keys as Python ints from here on (a key past 63 bits is to be filed)."""
        if self.words:
            self.keys, self.words = self.keys.tolist(), False

    def rekey(self, keys: list) -> None:
        """Take ``keys`` (sorted) as the keys, words while every one is within 63 bits."""
        self.keys = keys
        if self.words:
            if keys and keys[-1] >> 63:
                self.words = False
            else:
                self.keys = array("q", keys)


class _FreeIndex:
    """What every arena's keys share (see the module docstring): the offset field ``[lo, lo + 2**abits)``
    over the device allocations (which end at or below ``hi``), where a key's units start (``shift``), v13's
    falling ``tie``, the chunk records `free` merged away (``spare``), reused by the next split, and how many
    chunks became whole free chunks so far (``filed``: the last one's `_Chunk.seq`).

    ``fit``: a v14 key of fewer units than this is below 2**62, one machine word (`_split_off` and
    `_file_freed` make it in C arithmetic in the compiled build); 0 under v13, whose keys `key` makes."""

    __slots__ = ("lifo", "lo", "hi", "abits", "shift", "tie", "spare", "fit", "filed")

    def __init__(self, lifo: bool):
        self.lifo = lifo                    # v13: ties go to the last freed chunk
        self.lo = 0                         # a key's offset is the address minus this ...
        self.hi = 0                         # ... and the device allocations end at or below this
        self.abits = MIN_ABITS              # the offset field's width, A
        self.shift = MIN_ABITS + (TIE_BITS if lifo else 0)      # a key's units: key >> shift
        self.tie = 1 << TIE_BITS            # v13: falls with every chunk filed
        self.spare: list[_Chunk] = []
        self.fit = 0 if lifo else 1 << 62 - self.shift
        self.filed = 0                      # whole free chunks filed so far: the last one's `_Chunk.seq`

    def widen(self, lo: int, hi: int, abits: int) -> None:
        """Move the offset field to ``[lo, lo + 2**abits)`` (`CuPyPool._cover`, which re-keys the chunks)."""
        self.lo, self.hi, self.abits = lo, hi, abits
        self.shift = abits + (TIE_BITS if self.lifo else 0)
        self.fit = 0 if self.lifo or self.shift >= 62 else 1 << 62 - self.shift

    def key(self, size: int, ptr: int, arena: _Arena):
        """The key that files a free chunk of ``size`` bytes at ``ptr`` in ``arena``; under v13 the next tie is
        taken; a key past 63 bits makes the arena's keys Python ints (`_Arena.widen`)."""
        k = size >> 9 << self.shift | ptr - self.lo
        if self.lifo:
            self.tie -= 1
            k |= self.tie << self.abits
        elif k >> 63 and arena.words:
            arena.widen()
        return k


# The split and the filing, shared by `malloc`, `free` and the fused loop (one call each, about 5 % of the
# interpreted fused loop's time, for one copy of the model's rules; compiled, a C call).
@cython.cfunc
@cython.locals(ix=_FreeIndex, c=_Chunk, n=cython.longlong, arena=_Arena, rest=_Chunk, nx=_Chunk, r=cython.longlong,
               p=cython.longlong, u=cython.longlong, spare=list, chunks=list, x=cython.Py_ssize_t)
def _split_off(ix, c, n, arena, x) -> None:
    """Cut chunk ``c``, just taken from position ``x`` of ``arena``'s index (still there), to ``n`` bytes; the
    remainder after it goes back into ``arena``, unmerged (``_split`` + ``_append_to_free_list``), taking
    ``c``'s entry, moved to its own key's place."""
    r, nx, p = c.size - n, c.next, c.ptr + n
    spare = ix.spare
    if spare:                                # a chunk `_file_freed` merged away: reset it
        rest = spare.pop()
        rest.ptr = p
        rest.size = r
        rest.prev = c
        rest.next = nx
        rest.arena = arena
    else:
        rest = _Chunk(p, r, c, nx, arena)
    c.next = rest
    if nx is not None:
        nx.prev = rest
    c.size = n
    u = r >> 9
    rest.key = k = u << ix.shift | p - ix.lo if u < ix.fit else ix.key(r, p, arena)
    keys, chunks = arena.keys, arena.chunks
    if COMPILED:                             # one move of the entries between (`_sorted.move_key`)
        move_item(chunks, x, move_key(keys, x, k), rest)
    elif x and keys[x - 1] > k:              # the same interpreted, without a Python call: drop, then insert
        del keys[x], chunks[x]
        x = bisect_left(keys, k, 0, x)       # (below ``c``'s key)
        keys.insert(x, k)
        chunks.insert(x, rest)
    else:                                    # it sorts where ``c`` did (a remainder at least the request's size)
        keys[x], chunks[x] = k, rest


@cython.cfunc
@cython.locals(ix=_FreeIndex, c=_Chunk, nx=_Chunk, pv=_Chunk, nn=_Chunk, chunks=list, arena=_Arena,
               p=cython.longlong, u=cython.longlong, x=cython.Py_ssize_t, y=cython.Py_ssize_t)
def _file_freed(ix, c) -> None:
    """File the freed chunk ``c`` in its arena, merged first with a free ``next``, then with a free
    ``prev`` (``_remove`` inlined: a call would cost as much as the work); the merged chunk takes a merged
    neighbour's entry in the index, moved to its own key's place."""
    arena = c.arena
    keys, chunks = arena.keys, arena.chunks
    x = -1                                   # the entry of a merged neighbour, if any
    nx = c.next
    if nx is not None and nx.key:            # merge the next chunk into this one
        x = key_place(keys, nx.key)
        c.size += nx.size
        c.next = nn = nx.next
        if nn is not None:
            nn.prev = c
        ix.spare.append(nx)
    pv = c.prev
    if pv is not None and pv.key:            # merge this chunk into the previous one
        y = key_place(keys, pv.key)
        if x >= 0:                           # merged with both: the next one's entry goes
            drop_key(keys, x)
            del chunks[x]
            if x < y:
                y -= 1
        x = y
        pv.size += c.size
        pv.next = nn = c.next
        if nn is not None:
            nn.prev = pv
        ix.spare.append(c)
        c = pv
    p, u = c.ptr, c.size >> 9
    if u < ix.fit:
        c.key = k = u << ix.shift | p - ix.lo
    else:
        c.key = k = ix.key(c.size, p, arena)
        keys = arena.keys                    # Python ints from here on, if this key took them past words
    if c.prev is None and c.next is None:   # whole: `free_all_blocks` may release it, in this order
        c.seq = ix.filed = ix.filed + 1
    if x < 0:                                # no merge: a new entry
        x = key_place(keys, k)
        put_key(keys, x, k)
        put_item(chunks, x, c)
    elif COMPILED:                           # one move of the entries between (`_sorted.move_key`)
        move_item(chunks, x, move_key(keys, x, k), c)
    elif x + 1 == len(keys) or keys[x + 1] > k:
        keys[x], chunks[x] = k, c            # interpreted: it sorts where the neighbour did
    else:                                    # interpreted: drop, then insert (above the neighbour's key)
        del keys[x], chunks[x]
        x = bisect_left(keys, k, x)
        keys.insert(x, k)
        chunks.insert(x, c)


@cython.locals(c=_Chunk, w=cython.longlong[:], k=cython.Py_ssize_t, width=cython.Py_ssize_t)
def _words(chunks, place) -> np.ndarray:
    """Each chunk's address, size, and its neighbours' addresses (-1: none), and with ``place`` (``id(arena)`` ->
    its place) its arena's place, as int64 words in the chunks' order (`CuPyPool.fold_state`), written into a C
    array (compiled, a C store a word: a list of ints made into an array cost 45 ns a word). Addresses and sizes
    fit in 63 bits (the device's addresses lie below 2**63; one past it would raise, never wrap), so -1 names no
    neighbour unmistakably. O(chunks)."""
    chunks = list(chunks)
    width = 4 if place is None else 5
    buf = array("q", bytes(8 * width * len(chunks)))
    w = buf
    k = 0
    for c in chunks:
        w[k] = c.ptr
        w[k + 1] = c.size
        w[k + 2] = -1 if c.prev is None else c.prev.ptr
        w[k + 3] = -1 if c.next is None else c.next.ptr
        if width == 5:
            w[k + 4] = place[id(c.arena)]
        k += width
    return np.frombuffer(buf, np.int64)


@register
class CuPyPool(Policy):
    name = "cupy"
    framework = "cupy"
    summary = "CuPy MemoryPool: 512 B rounding, per-stream best fit, split/merge per cudaMalloc, flush + gc.collect"
    models = "CuPy SingleDeviceMemoryPool v13/v14 (docs/models/cupy.md)"
    params = (
        Param("version", ("14", "13"), "14",
              "14: std::set lookup, ties to the lowest address, gc.collect() x2 on a failed cudaMalloc; "
              "13: binned lookup, ties to the most recently freed chunk, gc.collect() x1"),
        Param("limit", "size", None, "pool limit (set_limit / CUPY_GPU_MEMORY_LIMIT); with --cap the smaller wins"),
        Param("track_total", "bool", False, "keep total_log: pool total bytes after each malloc/free (validation)"),
        Param("follow_ties", "bool", True,
              "replaying a CuPy recording: of the free chunks tying for best fit, take the one the recorded request "
              "got (CuPy's tie order is not repeatable); else the version's own tie rule"),
    )
    wants_event_index = True

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        if str(self.version) not in ("13", "14"):
            raise UsageError(f"policy 'cupy' option version: expected 13 or 14, got {self.version!r}")
        self.version = int(self.version)
        self._ix = _FreeIndex(self.version < 14)
        self._gc_calls = 2 if self.version >= 14 else 1
        self._raises_at_once = self.version >= 14    # a request above the limit itself: OOM, nothing released
        self._arenas: dict[int, _Arena] = {}
        self.total = 0                      # total_bytes(): reserved from the device
        self.cache_flushes = 0              # free_all_blocks calls
        self.limit_ooms = 0
        self.device_ooms = 0
        self._n_lookup = 0
        self._n_malloc = 0
        self._t_malloc = 0.0
        self._hit_s = self.costs.pool_hit_s
        self._free_s = self.costs.pool_free_s
        self._charge = self.ctx.charge            # bound once: the hot path calls it per event
        self.event_index = -1               # set by the engine before each malloc
        self.segment_log: list[tuple[int, int, int]] = []
        self.total_log = array("q") if self.track_total else None

    @classmethod
    def variant(cls, ctx, options):
        """`Policy.variant`: with ``track_total``, `TrackedCuPyPool` (which keeps the log off the untracked hot path);
        following a CuPy recording's ties (`follows_ties`), `RecordedTiesCuPyPool`; both, their union."""
        if cls is not CuPyPool:
            return cls
        return _VARIANTS[bool(options.get("track_total")), follows_ties(ctx, options)]

    def _arena(self, stream) -> _Arena:
        """The stream's arena, made on first use (``SingleDeviceMemoryPool._arena``)."""
        arena = self._arenas.get(stream)
        if arena is None:
            arena = self._arenas[stream] = _Arena(cython.compiled and not self._ix.lifo)    # v14 compiled: words
        return arena

    # ---- free index --------------------------------------------------------------------
    def _cover(self, addr: int, n: int) -> None:
        """Make the keys' offset field cover a new device allocation of ``n`` bytes at ``addr``: if it lies
        outside ``[lo, lo + 2**A)``, lower ``lo`` and widen ``A`` (to twice the span) and re-key every
        free chunk (the new keys order the chunks as the old ones did: size, tie, address; each keeps its
        place in ``chunks``). Per device allocation; O(f log f) for f free chunks when it acts."""
        ix = self._ix
        if not ix.hi:                       # the first: the field starts here
            ix.lo, ix.hi = addr, addr + n
        lo, hi = min(ix.lo, addr), max(ix.hi, addr + n)
        if lo == ix.lo and hi - lo <= 1 << ix.abits:
            ix.hi = hi
            return
        old_abits = ix.abits
        abits = max(old_abits, (2 * (hi - lo) - 1).bit_length())
        ix.widen(lo, hi, abits)
        for arena in self._arenas.values():
            for c in arena.chunks:
                c.key = (c.key >> old_abits) << abits | c.ptr - lo
            arena.rekey([c.key for c in arena.chunks])

    def _remove(self, arena: _Arena, c: _Chunk) -> None:
        x = key_place(arena.keys, c.key)
        drop_key(arena.keys, x)
        del arena.chunks[x]
        c.key = 0

    # ---- the hot path: `malloc` and `free`, and the same two fused in `walk_chunk` ---------------
    # All three split and file chunks through `_split_off` and `_file_freed` (above).
    def malloc(self, size, stream):
        n = (size + UNIT - 1) & -UNIT
        self._n_lookup += 1
        self._charge(self._hit_s)
        arena = self._arenas.get(stream) or self._arena(stream)
        keys = arena.keys
        i = key_place(keys, n >> 9 << self._ix.shift)   # best fit: smallest size, then the tie order
        if i == len(keys):
            c = self._try_malloc(n, arena)
            if c is None:
                return None
        else:
            c = arena.chunks[i]
            c.key = 0
            if c.size > n:
                _split_off(self._ix, c, n, arena, i)
            else:
                drop_key(keys, i)
                del arena.chunks[i]
        self.allocated += n
        return c

    def free(self, c):
        self.allocated -= c.size
        self._charge(self._free_s)
        _file_freed(self._ix, c)

    records_fused = True        # `walk_chunk` records a folded window onto the clock's tape (`Policy.fused_tape`)

    @cython.locals(handles=dict, peak=cython.longlong, k=cython.longlong, req=cython.longlong, n=cython.longlong,
                   allocated=cython.longlong, clock=cython.double, t0=cython.double, hit_s=cython.double,
                   free_s=cython.double, x=cython.Py_ssize_t, n0=cython.Py_ssize_t, slow=cython.bint,
                   ix=_FreeIndex, arena=_Arena, c=_Chunk, shift=object, rec=cython.bint, m0=cython.Py_ssize_t)
    def walk_chunk(self, events, handles, lat, peak, dev, served, tape=None):
        """The replay's fused loop (docs/architecture.md, "The fast path"): `malloc` and `free` inlined over
        ``events`` (the split and the filing called as they call them), the clock and ``allocated`` kept
        in locals.

        A miss runs `_try_malloc` as `malloc` does (the locals written back around it; a device allocation
        may re-key, so ``shift`` is read again after it) and is reported to ``served``; a pressure event or
        the FREE of an id not live is handed back: returns ``(its index or None at the end, peak allocated)``.

        With ``tape`` (a window the folder records, `Policy.fused_tape`) each increment to the clock goes onto it
        and each served latency's end; around `_try_malloc` the clock is the tape's running total, so its additions
        go onto it as the plain walk's do, and that ALLOC's latency is a difference on it (`Tape.between`), as
        `split`'s loop records."""
        arenas_get, new_arena, try_malloc = self._arenas.get, self._arena, self._try_malloc
        ix, hit_s, free_s = self._ix, self._hit_s, self._free_s
        shift = ix.shift                    # a Python int: a request's units shifted may pass 63 bits
        clock, allocated = float(dev.clock), self.allocated     # (a recorded total: its value)
        pop, lat_append, n0 = handles.pop, lat.append, len(lat)
        compiled = cython.compiled          # compiled: C appends and searches (`add_latency`, `word_place`)
        arena_st, arena = None, None        # the last ALLOC's stream and its arena (arenas are never dropped)
        rec, m0 = tape is not None, 0
        if rec:
            incs, ends = tape.incs, tape.latency_ends
        for j, k, i, req, st in events:
            if k == 1:                      # ALLOC: malloc, as above
                n = (req + 511) & -512
                t0 = clock
                clock += hit_s
                if rec:
                    m0 = len(incs)
                    add_latency(incs, hit_s)
                if st is not arena_st and st != arena_st:
                    arena_st, arena = st, arenas_get(st) or new_arena(st)
                keys = arena.keys
                if compiled and n >> 9 < ix.fit:    # the key below 2**62: made and searched in C
                    x = word_place(keys, n >> 9 << ix.shift)
                else:
                    x = key_place(keys, n >> 9 << shift)
                if x < len(keys):
                    c = arena.chunks[x]
                    c.key = 0
                    if c.size > n:
                        _split_off(ix, c, n, arena, x)
                    else:
                        drop_key(keys, x)
                        del arena.chunks[x]
                    slow = False
                else:
                    dev.clock = tape.at(clock) if rec else clock    # (recorded: the call adds onto the tape)
                    self.allocated = allocated
                    c = try_malloc(n, arena)
                    clock, shift = float(dev.clock), ix.shift
                    if c is None:
                        lat_append(tape.between(t0, m0, dev.clock) if rec else clock - t0)
                        if served(j, None):
                            break
                        continue
                    slow = True
                allocated += n
                if allocated > peak:
                    peak = allocated
                if rec:
                    if slow:                # (what the call added lies between)
                        lat_append(tape.between(t0, m0, dev.clock))
                    else:
                        add_latency(ends, len(incs))        # (a count as a double: exact)
                        lat_append(clock - t0)
                elif compiled:
                    add_latency(lat, clock - t0)
                else:
                    lat_append(clock - t0)
                handles[i] = c
                if slow:
                    self.allocated = allocated
                    served(j, c)
            elif k == 2:                    # FREE: free, as above
                c = handles.pop(i, None) if compiled else pop(i, None)     # each build's cheaper call
                if c is None:
                    break
                allocated -= c.size
                clock += free_s
                if rec:
                    add_latency(incs, free_s)
                _file_freed(ix, c)
            else:
                break
        else:
            j = None
        dev.clock, self.allocated = tape.at(clock) if rec else clock, allocated
        self._n_lookup += len(lat) - n0     # one best fit per malloc, as `malloc` counts them
        return j, peak

    # ---- the miss path -------------------------------------------------------------------
    def _step(self, name, fn, *args):
        with self.ctx.section(name):
            return fn(*args)

    @property
    def _limit(self) -> int:
        """The pool limit: the smaller of ``limit`` and the cap (``--cap`` or the program's recorded limit); 0 none."""
        limits = [x for x in (self.limit, self.ctx.cap) if x]
        return min(limits) if limits else 0

    def _within(self, need: int) -> bool:
        """CuPy's limit check, ``need <= limit`` (no limit: always). Told to the device whenever the cap
        decides it (the ``limit`` option alone refusing leaves every cap the same outcome)."""
        if self.limit and need > self.limit:
            return False
        cap = self.ctx.cap
        ok = not cap or need <= cap
        self.ctx.note(need, ok)
        return ok

    def _over(self, n) -> bool:
        """Whether ``n`` more bytes would take the pool's total past the limit."""
        return not self._within(self.total + n)

    def _gc(self) -> None:
        for _ in range(self._gc_calls):
            self.ctx.collect(True)

    def _device_malloc(self, n):
        addr = self.ctx.malloc(n)
        if addr is not None:
            self._cover(addr, n)
            self.total += n
            self.segment_log.append((SEGMENT_ALLOC, n, self.event_index))
        return addr

    def _try_malloc(self, n, arena: _Arena):
        """A new device allocation of ``n`` bytes, with CuPy's escalation; None on OOM."""
        if self._raises_at_once and not self._within(n):    # v14: larger than the limit itself
            self.limit_ooms += 1
            return None
        if self._over(n):
            self._step(S_LIMIT_FLUSH, self.free_all_blocks)
            if self._over(n):
                self._step(S_LIMIT_GC, self.ctx.collect, True)
                self._step(S_LIMIT_FLUSH2, self.free_all_blocks)
                if self._over(n):
                    self.limit_ooms += 1
                    return None
        t0 = self.ctx.clock
        addr = self._device_malloc(n)
        self._n_malloc += 1
        self._t_malloc += self.ctx.clock - t0
        if addr is None:
            self._step(S_FAIL_FLUSH, self.free_all_blocks)
            addr = self._step(S_FAIL_RETRY, self._device_malloc, n)
        if addr is None:
            self._step(S_FAIL_GC, self._gc)
            self._step(S_FAIL_FLUSH2, self.free_all_blocks)
            addr = self._step(S_FAIL_RETRY2, self._device_malloc, n)
        if addr is None:
            self.device_ooms += 1
            return None
        return _Chunk(addr, n, None, None, arena)

    def release_cache(self) -> None:
        """The program called ``MemoryPool.free_all_blocks()``."""
        self.free_all_blocks()

    def free_all_blocks(self, stream=None) -> int:
        """Release every free chunk that is a whole device allocation, arena by arena, each in the order
        its chunks became free (CuPy's own order differs: docs/models/cupy.md); only ``stream``'s arena if
        named (none is made for it). Return the bytes released."""
        self.cache_flushes += 1
        released = 0
        ev = self.event_index
        arenas = list(self._arenas.values()) if stream is None else [self._arenas.get(stream)]
        for arena in filter(None, arenas):
            whole = arena.whole()
            for c in whole:
                self._remove(arena, c)
                self.ctx.free(c.ptr, c.size)
                self.total -= c.size
                released += c.size
                self.segment_log.append((SEGMENT_FREE, c.size, ev))
        return released

    # ---- folding (`Policy.fold_state`) ------------------------------------------------------
    fold_counters = ("cache_flushes", "limit_ooms", "device_ooms", "_n_lookup", "_n_malloc")

    def fold_state(self, held):
        """The arenas in the order they were made, each with its free chunks in key order (best fit's order, v13's
        ties included) and the addresses of the whole ones in the order `free_all_blocks` releases them (the
        order of the others steers nothing: a chunk is filed anew when it becomes whole); the held chunks in address
        order, each with its arena's place; the keys' address field and the pool's totals. Chunks by address, never
        by object: each as the words of its address, size and neighbours' addresses (-1: none), packed (`_words`;
        a tuple a chunk and their pickle were most of a look at a boundary, 0.6 of 0.85 ms on GPT-2 small)."""
        place = {id(a): k for k, a in enumerate(self._arenas.values())}
        arenas = [(s, _words(a.chunks, None).tobytes(), _words(a.whole(), None)[::4].tobytes())
                  for s, a in self._arenas.items()]
        held_words = _words(held, place).reshape(-1, 5)
        ix = self._ix
        return (arenas, held_words[address_order(*held_words.T)].tobytes(), ix.lo, ix.hi, ix.abits, self.total,
                self.allocated)

    def fold_counts(self) -> tuple:
        """`fold_counters`, and where the segment log (and ``total_log``) end: their entries repeat too."""
        return super().fold_counts() + (len(self.segment_log), None if self.total_log is None else len(self.total_log))

    def fold_advance(self, before, after, k) -> None:
        super().fold_advance(before, after, k)
        self.segment_log += self.segment_log[before[-2]:after[-2]] * k
        if self.total_log is not None:
            self.total_log.extend(self.total_log[before[-1]:after[-1]] * k)

    # ---- reporting ----------------------------------------------------------------------
    def addresses(self, held: dict) -> dict:
        """`Policy.addresses`: each held chunk's own address (unless a subclass says where its blocks lie itself)."""
        if type(self).block is not CuPyPool.block:
            return Policy.addresses(self, held)
        return {i: h.ptr for i, h in held.items()}

    def block(self, handle):
        return handle.ptr, handle.size

    def largest_free(self):
        return max(((a.keys[-1] >> self._ix.shift) << 9 for a in self._arenas.values() if a.keys), default=0)

    def free_breakdown(self, stream):
        """The free chunks by their arena's stream. A free chunk merges with its free neighbours, so it
        shares its device allocation with a live chunk exactly when it has a neighbour: hard; a whole one: soft."""
        return self.free_parts(((s, c.size, c.prev is not None or c.next is not None)
                                for s, a in self._arenas.items() for c in a.chunks), stream)

    def n_free_blocks(self) -> int:
        return sum(len(a.chunks) for a in self._arenas.values())

    def counters(self):
        return {"cache_flushes": self.cache_flushes, "used_bytes": self.allocated, "total_bytes": self.total,
                "free_bytes": self.total - self.allocated, "n_free_blocks": self.n_free_blocks(),
                "limit": self._limit, "limit_ooms": self.limit_ooms, "device_ooms": self.device_ooms,
                "version": self.version}

    def finish(self):
        self.ctx.add_section(S_LOOKUP, self._n_lookup * self._hit_s, self._n_lookup)
        if self._n_malloc:
            self.ctx.add_section(S_MALLOC, self._t_malloc, self._n_malloc)


def follows_ties(ctx, options) -> bool:
    """Whether a replay of ``ctx``'s trace with these options takes tied chunks as the recorded run did: option
    ``follow_ties`` (default on) and a trace CuPy's pool recorded, whose ALLOCs hold the addresses it gave."""
    return options.get("follow_ties", True) and ctx.trace is not None and ctx.meta.get("framework") == "cupy"


class TrackedCuPyPool(CuPyPool):
    """`cupy` with ``track_total`` (`CuPyPool.variant` makes it): ``total_log`` gets the pool's total bytes
    after each malloc and free (`validate`)."""

    def malloc(self, size, stream):
        c = super().malloc(size, stream)
        self.total_log.append(self.total)
        return c

    def free(self, c):
        super().free(c)
        self.total_log.append(self.total)


class RecordedPlaces:
    """Where a CuPy recording placed each request: its segment, numbered in the order the recording made them,
    and the offset in it; with the model's own segments by the same numbers (``model``, appended as the model
    makes them), `address` is the recorded place in the model's address space. So following the recorded ties
    does not depend on the device handing out the recorded segment addresses. O(records) once, two numbers
    per record."""

    def __init__(self, trace):
        self.segment = np.full(len(trace), -1, np.int64)
        self.offset = np.zeros(len(trace), np.int64)
        self.model: list[int] = []
        bases: list[int] = []                       # the live recorded segments' addresses, sorted
        live: dict[int, tuple[int, int]] = {}       # address -> (number, size)
        made = 0                                    # segments the recording made so far
        for start, rec in trace.chunks():
            at = np.flatnonzero(np.isin(rec["kind"], (ALLOC, SEGMENT_ALLOC, SEGMENT_FREE)))
            for j, kind, a, n in zip(at.tolist(), rec["kind"][at].tolist(), rec["addr"][at].tolist(),
                                     rec["size"][at].tolist()):
                if kind == SEGMENT_ALLOC:
                    insort(bases, a)
                    live[a] = (made, n)
                    made += 1
                elif kind == SEGMENT_FREE:
                    if live.pop(a, None) is not None:
                        del bases[bisect_left(bases, a)]
                elif a:
                    x = bisect_right(bases, a) - 1
                    if x >= 0 and a < bases[x] + live[bases[x]][1]:
                        self.segment[start + j] = live[bases[x]][0]
                        self.offset[start + j] = a - bases[x]

    def address(self, at: int) -> int:
        """The model's address for the place the recorded request at trace index ``at`` got; 0 if unknown."""
        k = int(self.segment[at])
        return self.model[k] + int(self.offset[at]) if 0 <= k < len(self.model) else 0


class RecordedTiesCuPyPool(CuPyPool):
    """`cupy` following a CuPy recording's ties (`CuPyPool.variant` makes it): of the free chunks tying for best
    fit, the one at the place the recorded request got (`RecordedPlaces`), if it is one of them; else the
    version's rule.

    The engine stores each request's trace index in ``event_index`` (`Policy.follows_recording`); the replay
    takes the plain walk. The tied chunks ahead of the recorded one step out of the lookup's way while
    `CuPyPool.malloc` takes it: a tie costs a scan of the tied keys and their re-insertion."""

    follows_recording = True

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._places = RecordedPlaces(self.ctx.trace)

    def _device_malloc(self, n):
        addr = super()._device_malloc(n)
        if addr is not None:
            self._places.model.append(addr)
        return addr

    def malloc(self, size, stream):
        at = self.event_index
        arena = self._arenas.get(stream)
        want = self._places.address(at) if at >= 0 else 0
        if arena is None or not want:
            return super().malloc(size, stream)
        keys, shift = arena.keys, self._ix.shift
        n = (size + UNIT - 1) & -UNIT
        i = j = bisect_left(keys, n >> 9 << shift)
        units = keys[i] >> shift if i < len(keys) else -1
        chunks = arena.chunks
        while j < len(keys) and keys[j] >> shift == units and chunks[j].ptr != want:
            j += 1
        if j == i or j == len(keys) or keys[j] >> shift != units:
            return super().malloc(size, stream)     # no tie, the rule's own pick, or not among the tied chunks
        ahead = list(zip(keys[i:j], chunks[i:j]))   # the tied chunks the rule prefers: out of the lookup's way
        del keys[i:j], chunks[i:j]
        try:
            return super().malloc(size, stream)
        finally:
            for k, c in ahead:
                x = bisect_left(keys, k)
                keys.insert(x, k)
                chunks.insert(x, c)


class TrackedRecordedTiesCuPyPool(TrackedCuPyPool, RecordedTiesCuPyPool):
    """`cupy` with ``track_total``, following a CuPy recording's ties."""


#: `CuPyPool.variant`'s choice, by (track_total, following ties).
_VARIANTS = {(False, False): CuPyPool, (True, False): TrackedCuPyPool, (False, True): RecordedTiesCuPyPool,
             (True, True): TrackedRecordedTiesCuPyPool}
