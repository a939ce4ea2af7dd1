"""`split`: CuArrays' SplittingPool after PR #427, step for step.

Source: `docs/models/cuarrays.md`, section "split: SplittingPool"
(`src/memory/split.jl` @ a6fc8af, the same code as v1.3.0).

- Classes: SMALL <= 1 MiB < LARGE <= 32 MiB < HUGE. A request is rounded up to
  512 B / 128 KiB / 1 MiB by its class, then the class is recomputed from the
  rounded size. A device malloc asks for exactly the rounded size.
- Free lists: one per class, ordered by (size, block id); best fit, ties to the
  lowest id (the oldest block). Ids grow monotonically, and a split remainder gets
  a fresh id, as `Block(...)` does. We order by the v1.6 key (size, id); the
  #516 key collision of the 24-bit shift is not modeled.
- `free` only marks the block FREED and appends it to `freed`; the pool sees it
  at the next `malloc`, under any runtime.
- Each phase (1: none, 2: after ``gc(false)``, 3: after ``gc(true)``):
  ``x.1a repopulate`` + ``x.1b compact`` (merge each newly freed block with its
  AVAILABLE address neighbours, nothing else), ``x.2 scan`` (best fit),
  ``x.3 alloc`` (device malloc), then for HUGE, LARGE, SMALL in turn
  ``x.4a reclaim`` (whole blocks, ascending key, until the target is freed) +
  ``x.4b alloc``, then ``x.5a reclaim`` (every whole block; a cache flush) +
  ``x.5b alloc``. The pool reclaims its cache before it asks for a collection.
- Split: only if class != HUGE, the remainder is > 0 and of the same class; so a
  LARGE block keeps up to 1 MiB of slack, and HUGE blocks are never split.
- The HUGE "exact size only" check is dead in the merged code: a HUGE request
  takes the smallest larger cached HUGE block whole. ``huge_exact=true`` gives
  the intended behaviour (exact size only).

Knowing differences: repopulate and compact run as one pass over the batch
(same resulting free lists: the same heads, sizes and ids); their modeled time
is ``pool_free_s`` per repopulated block (1a) and per block merged away (1b).
A scan costs ``pool_hit_s`` (hit or miss). The pre-#427 form is not modeled.

Data structures (the hot path): blocks are parallel columns indexed by block id
(size, address, prev, next, free state): C words in an ``array('q')`` in the
compiled build (which the fused loop reads through typed memoryviews), lists of
ints interpreted; grown by doubling, so a block costs no object and each field is
O(1). The free state is the block's free-list entry while it is AVAILABLE (in a
free list; `OUTSIZE`, -2, for a block of 1 TiB or more), FREED (-1) while it
waits in ``freed``, and 0 otherwise (ALLOCATED, or merged away); so "free or
freed" is one truth test, and an entry ``e`` of block ``b`` is live iff
``fsize[b] == e``: one comparison voids stale entries. Id 0 is a
sentinel "no neighbour" whose state is 0, so neighbour walks need no None test. Ids
follow creation order (the tie order needs it); when they pass 4x the live blocks
(and `RENUMBER_MIN`) the live blocks are renumbered 1..L in the same order between
chunks (`renumber`; the engine renames the handles it holds), so memory is
O(live blocks + one chunk), about 100 bytes each (interpreted). The
free lists are `SizeBuckets` (``_freelists.py``): one sorted list of entries
``size >> 9 << 32 | id`` (sizes are multiples of 512 B, ids stay below 2**31)
for every block below 1 TiB (`WORD_SIZE`), within 63 bits and ending with
`WORD_END` (2**63 - 1), a C array compiled; the blocks of 1 TiB or more, whose
entries are past 63 bits, in a list of their own ending with `END`, searched
after a HUGE request's miss in the first (all its entries are larger); best fit
O(log k) plus a short memmove, removal O(1) (lazy). A handle is the block id.
"""
from __future__ import annotations

try:
    import cython                   # the compiled build (docs/architecture.md, "The compiled build")
except ImportError:
    from ..compiled import cython   # interpreted: its decorators and types change nothing

from array import array

import numpy as np

from .registry import register
from ._columns import address_order, addresses_of, words_of
from ._freelists import SizeBuckets
from .base import Param, Policy

if not cython.compiled:             # compiled, split.pxd cimports their C loops
    from ._latency import add_latency
    from ._sorted import file_key, words_at, words_drop, words_file, words_first_at_least

SMALL, LARGE, HUGE = 0, 1, 2
CLASS_NAMES = ("small", "large", "huge")
SMALL_CUTOFF = 1 << 20          # SMALL <= 1 MiB
LARGE_CUTOFF = 1 << 25          # LARGE <= 32 MiB
ROUNDOFF = (1 << 9, 1 << 17, 1 << 20)
CLASS_LIMIT = (SMALL_CUTOFF, LARGE_CUTOFF, 1 << 62)
CLASS_RANGE = ((0, SMALL_CUTOFF), (SMALL_CUTOFF, LARGE_CUTOFF), (LARGE_CUTOFF, 1 << 62))

FREED = -1          # free-state value of a block waiting in `freed`; AVAILABLE blocks hold their entry
OUTSIZE = -2        # free-state value of an AVAILABLE block of `WORD_SIZE` or more, whose entry is past 63 bits
UNIT_SHIFT, ID_BITS = 9, 32     # a free-list entry: size >> UNIT_SHIFT << ID_BITS | block id
ID_MASK = (1 << ID_BITS) - 1
WORD_SIZE = 1 << 40     # a block below 1 TiB has an entry within 63 bits (ids stay below 2**31: `_grow`)
WORD_END = (1 << 63) - 1        # above every such entry: the end of their free list, and a HUGE request's bound


def size_class(n: int) -> int:
    return SMALL if n <= SMALL_CUTOFF else LARGE if n <= LARGE_CUTOFF else HUGE


assert all(cut % r == 0 for cut in (SMALL_CUTOFF, LARGE_CUTOFF) for r in ROUNDOFF[:2])
assert (SMALL_CUTOFF, LARGE_CUTOFF) == (1048576, 33554432)     # written as literals in the hot path
assert (UNIT_SHIFT, ID_BITS, ID_MASK, WORD_SIZE) == (9, 32, 0xFFFFFFFF, 1099511627776)     # likewise
assert (FREED, OUTSIZE) == (-1, -2)                                                          # likewise
assert (WORD_SIZE - 1) >> UNIT_SHIFT << ID_BITS | (1 << 31) - 1 < WORD_END == 9223372036854775807
assert all(r % (1 << UNIT_SHIFT) == 0 for r in ROUNDOFF)        # every block size is a multiple of 512 B
#: Free-list bounds of the SMALL and LARGE classes: the first entry above the class's largest size.
SMALL_STOP, LARGE_STOP = (SMALL_CUTOFF >> 9) + 1 << 32, (LARGE_CUTOFF >> 9) + 1 << 32
assert (SMALL_STOP, LARGE_STOP) == (8800387989504, 281479271677952)     # written as literals in the hot path


def _zeros(n: int):
    """A block column of ``n`` zeros: C words compiled (an ``array('q')``, which the hot loops read through typed
    memoryviews, no int object per field), a list interpreted (where an array's element costs more to read)."""
    return array("q", bytes(8 * n)) if cython.compiled else [0] * n


def _column(values):
    """A block column holding ``values`` (`_zeros`)."""
    return array("q", values) if cython.compiled else list(values)


def _outsize_entry(size: int, b: int) -> int:
    """The free-list entry of block ``b`` of `WORD_SIZE` bytes or more, in Python ints (past 63 bits)."""
    return size >> UNIT_SHIFT << ID_BITS | b


def round_request(req: int) -> tuple[int, int]:
    """(rounded size, class of the rounded size), as `pool_alloc` computes them."""
    r = ROUNDOFF[size_class(req)]
    n = -(-req // r) * r
    return n, size_class(n)


@cython.cfunc
@cython.locals(size=cython.longlong[::1], prev=cython.longlong[::1], nxt=cython.longlong[::1],
               fsize=cython.longlong[::1], freed=list, outsize=list, k=cython.longlong, b=cython.longlong,
               head=cython.longlong, m=cython.longlong, s=cython.longlong, e=cython.longlong)
@cython.returns(cython.longlong)
def _merge_freed(size, prev, nxt, fsize, freed, entries, outsize) -> int:
    """``repopulate!`` + ``incremental_compact!`` over the blocks in ``freed`` (emptied): return how many
    pieces merged away.

    Every block of the batch is FREED (so chain walks see the whole batch, as after the real repopulate);
    each one not yet merged is merged with its run of FREED/AVAILABLE neighbours into the run's head, which
    goes into the free list: ``entries`` below `WORD_SIZE`, else ``outsize``. Pieces merged away get state 0,
    which voids their free-list entries. A module function, not a method: the hot loop calls it once per malloc
    after frees (compiled, a C call on the columns' C words)."""
    k = 0
    for b in freed:
        if fsize[b] != -1:      # FREED
            continue            # merged into an earlier head of this batch
        head = b
        while fsize[prev[head]]:
            head = prev[head]
        m = nxt[b]
        if head == b and not fsize[m]:
            s = size[b]         # no free neighbour: plain repopulate
        else:
            s = size[head]
            m = nxt[head]
            while fsize[m]:
                s += size[m]
                fsize[m] = 0
                k += 1
                m = nxt[m]
            nxt[head] = m
            prev[m] = head      # m may be the sentinel 0: harmless
            size[head] = s
            b = head
        # below WORD_SIZE, 2**40 (a shift: compiled, the literal would be a Python int, compared boxed):
        if s >> 40 == 0:                        # SizeBuckets.push, the entry within 63 bits
            fsize[b] = e = s >> 9 << 32 | b
            words_file(entries, e)
        else:
            fsize[b] = -2                       # OUTSIZE
            file_key(outsize, _outsize_entry(s, b))
    freed.clear()
    return k


def _free_ids(fsize, next_id) -> list:
    """The block ids below ``next_id`` that are free or freed (their free state is set), ascending, for `renumber`
    and `fold_state`, which add the blocks the engine holds: compiled, numpy's pass over the column's C words (a
    loop over tens of thousands of ids, each made an int object, was most of a fold's fingerprint)."""
    if isinstance(fsize, array):
        return (np.flatnonzero(np.frombuffer(fsize, np.int64)[1:next_id]) + 1).tolist()
    return [b for b in range(1, next_id) if fsize[b]]


#: Fewest block ids before renumbering the live blocks is worth its pass (small traces never renumber).
RENUMBER_MIN = 1 << 16


@register
class SplittingPool(Policy):
    name = "split"
    summary = "CuArrays SplittingPool: small/large/huge classes, best fit, split, incremental compaction"
    models = "CuArrays SplittingPool post-#427, a6fc8af (docs/models/cuarrays.md)"
    params = (
        Param("huge_exact", "bool", False,
              "HUGE requests reuse only a cached block of exactly their size (the intended check; "
              "the merged code's check is dead and takes the smallest larger block)"),
    )

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        cap = 1024
        self._size = size = _zeros(cap)     # block id -> size
        self._addr = _zeros(cap)            # block id -> device address
        self._prev = _zeros(cap)            # block id -> address-preceding piece of the same buffer, 0 if none
        self._next = _zeros(cap)            # block id -> address-following piece, 0 if none
        self._fsize = fsize = _zeros(cap)   # block id -> free state: its entry (or OUTSIZE) if AVAILABLE, FREED, or 0

        def outsize_live(e: int) -> bool:
            b = e & 0xFFFFFFFF
            return fsize[b] == OUTSIZE and e == _outsize_entry(size[b], b)
        # every class in one list (their size ranges are disjoint), the blocks of WORD_SIZE or more in another
        self._avail = SizeBuckets(lambda e: e != WORD_END and fsize[e & 0xFFFFFFFF] == e, ID_BITS, UNIT_SHIFT,
                                  WORD_END, _column)
        self._outsize = SizeBuckets(outsize_live, ID_BITS, UNIT_SHIFT)
        self._freed: list[int] = []
        self._slow_blocks = self._slow_merged = 0       # repopulated / merged in phases 2 and 3
        self._flushes = self._reclaimed = 0
        self._next_id, self._id_cap = 1, cap    # block 0 is the sentinel "no neighbour"
        self._compact_at, self._renumber_at = SizeBuckets.COMPACT_MIN, RENUMBER_MIN
        # hot-path counts: mallocs (scans), repopulates, blocks repopulated, blocks merged away, splits
        self._scans = self._repops = self._repop_blocks = self._merged = self._splits = 0
        self._charge, self._hit_s, self._free_s = self.ctx.charge, self.costs.pool_hit_s, self.costs.pool_free_s
        # 29 attributes in all, no more: past 29, CPython 3.11 stops sharing an instance dict's keys, and every
        # ``self.x`` of the plain walk's `malloc` and `free` becomes a slower lookup (5 % of that walk)

    def _grow(self) -> None:
        if self._id_cap > 1 << (ID_BITS - 1):
            raise MemoryError("split: 2**32 block ids would not fit a free-list entry")
        for col in (self._size, self._addr, self._prev, self._next, self._fsize):
            col.extend(_zeros(len(col)))        # in place (the fused loop lets go of the columns' buffers first)
        self._id_cap = len(self._size)

    def _new_id(self) -> int:
        b = self._next_id
        if b == self._id_cap:
            self._grow()
        self._next_id = b + 1
        return b

    def _new_block(self, n: int) -> int:
        """``actual_alloc(n)``: a whole block of a fresh device buffer, 0 if the device refuses."""
        addr = self.ctx.malloc(n)
        if addr is None:
            return 0
        b = self._new_id()
        self._size[b] = n
        self._addr[b] = addr
        self._prev[b] = self._next[b] = 0
        return b

    def renumber(self, held):
        """`Policy.renumber`: once the ids pass 4x the live blocks (and `RENUMBER_MIN`), give the live blocks
        ids 1..L in their old order and drop the dead ids' slots; return the renaming (None: nothing to do).

        The order of ids is all best fit's tie-break sees, so choices stay the same; memory then follows
        the live blocks, not every block ever split. Live: free, freed, or ``held`` by the engine.
        """
        next_id = self._next_id
        if next_id <= self._renumber_at:
            return None
        size, addr, prev, nxt, fsize = self._size, self._addr, self._prev, self._next, self._fsize
        live = sorted(set(held).union(_free_ids(fsize, next_id)))
        new = dict(zip(live, range(1, len(live) + 1)))
        new[0] = 0
        for buckets in (self._avail, self._outsize):
            buckets.compact()
            entries = buckets.entries
            entries[:-1] = buckets.column([e >> 32 << 32 | new[e & 0xFFFFFFFF] for e in entries[:-1]])  # same order
        self._freed[:] = [new[b] for b in self._freed]
        for col in (size, addr):
            col[1:len(live) + 1] = _column([col[b] for b in live])
        fsize[1:len(live) + 1] = _column([f >> 32 << 32 | i if f > 0 else f
                                          for i, f in enumerate((fsize[b] for b in live), 1)])
        for col in (prev, nxt):
            col[1:len(live) + 1] = _column([new[col[b]] for b in live])
        self._next_id = next_id = len(live) + 1
        self._id_cap = id_cap = max(1024, 2 * next_id)
        for col in (size, addr, prev, nxt, fsize):     # in place, as `_grow`
            del col[id_cap:]
            col[next_id:] = _zeros(id_cap - next_id)
        self._renumber_at = max(RENUMBER_MIN, 4 * next_id)
        return new

    # ---- the hot path: `malloc` and `free`, and the same two inlined in `walk_chunk` --------
    # They run once or twice per driving event and inline `SizeBuckets.push` / `pop_fit` (same
    # logic; see ``_freelists.py``); `walk_chunk` binds the lists and constants to locals first.
    def _repopulate(self) -> float:
        """``repopulate!`` + ``incremental_compact!`` over the blocks freed since the last call (`_merge_freed`),
        with its counts and the free list's compaction; returns the modeled time, for the caller to charge."""
        nb = len(self._freed)
        k = _merge_freed(self._size, self._prev, self._next, self._fsize, self._freed, self._avail.entries,
                         self._outsize.entries)
        if len(self._avail.entries) > self._compact_at:
            self._compact()
        self._repop_blocks += nb
        self._merged += k
        return (nb + k) * self._free_s

    def _compact(self) -> int:
        """Drop the free list's void entries; return (and keep) the length that next calls for it."""
        self._compact_at = at = 2 * max(self._avail.compact(), SizeBuckets.COMPACT_MIN)
        return at

    def _split(self, b: int, n: int, rem: int) -> None:
        """Cut block ``b`` to ``n`` bytes; the remainder ``rem`` becomes a new AVAILABLE block after it."""
        r = self._new_id()
        size, prev, nxt = self._size, self._prev, self._next
        m = nxt[b]
        size[r] = rem
        self._addr[r] = self._addr[b] + n
        prev[r] = b
        nxt[r] = m
        prev[m] = r             # m may be the sentinel 0: harmless
        nxt[b] = r
        self._fsize[r] = e = rem >> 9 << ID_BITS | r     # rem is below 32 MiB: within 63 bits
        words_file(self._avail.entries, e)              # SizeBuckets.push
        size[b] = n
        self._splits += 1

    def malloc(self, req, stream):
        # round by class; the cutoffs are multiples of the roundoffs, so the class
        # recomputed from the rounded size is the same (see round_request).
        # Literals: SMALL_CUTOFF = 1048576, LARGE_CUTOFF = 33554432 (constants load fastest).
        # `cut` names the class by its cutoff: 1048576 SMALL, 33554432 LARGE, 0 HUGE.
        # `stop`: the class's free-list bound (SMALL_STOP, LARGE_STOP; HUGE: WORD_END, or n's own size if exact),
        # which ends the search among the entries within 63 bits from `key`, n's entry; blocks of 1 TiB or more
        # (`WORD_SIZE`: entries past 63 bits, in a list of their own) are searched for by `_scan` after a HUGE miss
        if req <= 1048576:
            n = (req + 511) & -512
            cut, stop, key = 1048576, 8800387989504, n >> 9 << 32  # best fit among the sizes of the class
        elif req <= 33554432:
            n = (req + 131071) & -131072
            cut, stop, key = 33554432, 281479271677952, n >> 9 << 32
        else:
            n = (req + 1048575) & -1048576
            cut = 0
            if n < 1099511627776:           # WORD_SIZE
                stop, key = (n >> 9) + 1 << 32 if self.huge_exact else WORD_END, n >> 9 << 32
            else:                           # WORD_END: past every entry of the list, a miss
                stop, key = 0, 9223372036854775807
        self._scans += 1
        if self._freed:
            self._repops += 1
            self._charge(self._hit_s + self._repopulate())
        else:
            self._charge(self._hit_s)
        # x.2 scan: SizeBuckets.pop_fit(n, limit) over the class's size range
        entries, fsize = self._avail.entries, self._fsize
        i = words_first_at_least(entries, key)
        e = entries[i]
        while e < stop:
            del entries[i]
            b = e & 0xFFFFFFFF
            if fsize[b] == e:
                break
            e = entries[i]
        else:
            b = 0
        if b:
            fsize[b] = 0
        else:
            b = 0 if cut else self._scan(n, HUGE)       # HUGE: then the blocks of WORD_SIZE or more
            if not b:
                b = self._escalate(n, size_class(n))
                if not b:
                    return None
        s = self._size[b]
        rem = s - n
        if rem and cut and (cut == 1048576 or rem > 1048576):   # not HUGE, and class(rem) == class
            self._split(b, n, rem)
            s = n
        self.allocated += s
        return b

    def free(self, b):
        self._fsize[b] = FREED
        self._freed.append(b)
        self.allocated -= self._size[b]

    records_fused = True        # `walk_chunk` records a folded window onto the clock's tape (`Policy.fused_tape`)

    @cython.locals(handles=dict, peak=cython.longlong, k=cython.longlong, req=cython.longlong, n=cython.longlong,
                   cut=cython.longlong, stop=cython.longlong, key=cython.longlong, huge_stop=cython.longlong,
                   e=cython.longlong, id_mask=cython.longlong,
                   b=cython.longlong, s=cython.longlong, rem=cython.longlong, r=cython.longlong,
                   m=cython.longlong, i0=cython.Py_ssize_t, next_id=cython.longlong, id_cap=cython.longlong,
                   repops=cython.longlong, splits=cython.longlong, allocated=cython.longlong, n0=cython.Py_ssize_t,
                   nb=cython.longlong, merged=cython.longlong, repop_blocks=cython.longlong, merged_all=cython.longlong,
                   compact_at=cython.Py_ssize_t, clock=cython.double, t0=cython.double, hit_s=cython.double,
                   free_s=cython.double, slow=cython.bint, compiled=cython.bint, size=cython.longlong[::1],
                   addr=cython.longlong[::1], prev=cython.longlong[::1], nxt=cython.longlong[::1],
                   fsize=cython.longlong[::1], outsize=list, freed=list, rec=cython.bint, inc=cython.double,
                   m0=cython.Py_ssize_t, called=cython.bint)
    def walk_chunk(self, events, handles, lat, peak, dev, served, tape=None):
        """The replay's fused loop (docs/architecture.md, "The fast path"): `malloc` (with `_split`) and
        `free` inlined over ``events``, the clock, ``allocated`` and the next block id kept in locals.

        A scan miss runs `_escalate` as `malloc` does (the locals written back around it) and is
        reported to ``served``; a pressure event or the FREE of an id not live is handed back:
        returns ``(its index or None at the end, peak allocated)``.

        Compiled, the block columns are typed memoryviews over their C words, the free list of the blocks below
        `WORD_SIZE` is a C array searched, read, cut and filed in place (`words_first_at_least`, `words_at`,
        `words_drop`, `words_file`) and each latency is appended in C (`add_latency`); around a call that may
        grow the columns (a new block id past their end, the escalation) the loop lets go of their buffers and
        takes them again.

        With ``tape`` (a window the folder records, `Policy.fused_tape`) each increment to the clock goes onto it
        and each served latency's end; around the escalation the clock is the tape's running total, so the
        escalation's additions go onto it as the plain walk's do, and that ALLOC's latency is a difference on it
        (`Tape.between`)."""
        size, addr, prev, nxt, fsize = self._size, self._addr, self._prev, self._next, self._fsize
        entries, outsize, freed = self._avail.entries, self._outsize.entries, self._freed
        escalate, scan = self._escalate, self._scan
        new_id, compact = self._new_id, self._compact
        hit_s, free_s, id_mask = self._hit_s, self._free_s, ID_MASK     # a C mask compiled
        huge_stop = 0 if self.huge_exact else WORD_END                  # 0: a HUGE request takes its exact size
        next_id, id_cap, compact_at = self._next_id, self._id_cap, self._compact_at
        repops = splits = repop_blocks = merged_all = 0
        clock, allocated = float(dev.clock), self.allocated     # (a recorded total: its value)
        lat_append, n0 = lat.append, len(lat)
        compiled = cython.compiled          # compiled: the free list's C buffer, C appends (`add_latency`)
        rec, m0 = tape is not None, 0
        if rec:
            incs, ends = tape.incs, tape.latency_ends
        for j, k, i, req, _ in events:
            if k == 1:                      # ALLOC: malloc, as above
                if req <= 1048576:
                    n = (req + 511) & -512
                    cut, stop, key = 1048576, 8800387989504, n >> 9 << 32
                elif req <= 33554432:
                    n = (req + 131071) & -131072
                    cut, stop, key = 33554432, 281479271677952, n >> 9 << 32
                else:
                    n = (req + 1048575) & -1048576
                    cut = 0
                    if n < 1099511627776:   # WORD_SIZE
                        stop, key = huge_stop or (n >> 9) + 1 << 32, n >> 9 << 32
                    else:                   # past every entry of the list: a miss, then `_scan`
                        stop, key = 0, 9223372036854775807
                t0 = clock
                if freed:                   # `_repopulate`, as `malloc` calls it
                    repops += 1
                    nb = len(freed)
                    merged = _merge_freed(size, prev, nxt, fsize, freed, entries, outsize)
                    if len(entries) > compact_at:
                        compact_at = compact()
                    repop_blocks += nb
                    merged_all += merged
                    inc = hit_s + (nb + merged) * free_s
                else:
                    inc = hit_s
                clock += inc
                if rec:
                    m0 = len(incs)
                    add_latency(incs, inc)
                i0 = words_first_at_least(entries, key)
                e = words_at(entries, i0) if compiled else entries[i0]
                while e < stop:
                    if compiled:
                        words_drop(entries, i0)
                    else:
                        del entries[i0]
                    b = e & id_mask
                    if fsize[b] == e:
                        break
                    e = words_at(entries, i0) if compiled else entries[i0]
                else:
                    b = 0
                called = not b              # a call out: the scan of the largest blocks, the escalation
                if b:
                    fsize[b] = 0
                    s = size[b]
                    slow = False
                else:
                    dev.clock = tape.at(clock) if rec else clock    # (recorded: the escalation adds onto the tape)
                    self.allocated, self._next_id, self._compact_at = allocated, next_id, compact_at
                    size = addr = prev = nxt = fsize = None     # compiled: their buffers let go, so they may grow
                    b = 0 if cut else scan(n, HUGE)             # HUGE: then the blocks of WORD_SIZE or more
                    slow = not b
                    if slow:
                        b = escalate(n, size_class(n))
                    size, addr, prev, nxt, fsize = self._size, self._addr, self._prev, self._next, self._fsize
                    clock, next_id, id_cap, compact_at = float(dev.clock), self._next_id, self._id_cap, self._compact_at
                    if not b:
                        lat_append(tape.between(t0, m0, dev.clock) if rec else clock - t0)
                        if served(j, None):
                            break
                        continue
                    s = size[b]
                rem = s - n
                if rem and cut and (cut == 1048576 or rem > 1048576):      # _split, inlined
                    r = next_id
                    if r == id_cap:
                        self._next_id = r
                        size = addr = prev = nxt = fsize = None
                        r = new_id()
                        size, addr, prev, nxt, fsize = self._size, self._addr, self._prev, self._next, self._fsize
                        id_cap = self._id_cap
                    next_id = r + 1
                    m = nxt[b]
                    size[r] = rem
                    addr[r] = addr[b] + n
                    prev[r] = b
                    nxt[r] = m
                    prev[m] = r
                    nxt[b] = r
                    fsize[r] = e = rem >> 9 << 32 | r
                    words_file(entries, e)
                    size[b] = s = n
                    splits += 1
                allocated += s
                if allocated > peak:
                    peak = allocated
                if rec:
                    if called:              # (what the call added lies between)
                        lat_append(tape.between(t0, m0, dev.clock))
                    else:
                        add_latency(ends, len(incs))        # (a count as a double: exact)
                        lat_append(clock - t0)
                elif compiled:
                    add_latency(lat, clock - t0)
                else:
                    lat_append(clock - t0)
                handles[i] = b
                if slow:
                    self.allocated = allocated
                    served(j, b)
            elif k == 2:                    # FREE: free, as above
                h = handles.pop(i, None)
                if h is None:
                    break
                b = h
                fsize[b] = -1               # FREED
                freed.append(h)
                allocated -= size[b]
            else:
                break
        else:
            j = None
        dev.clock = tape.at(clock) if rec else clock
        self.allocated, self._next_id, self._compact_at = allocated, next_id, compact_at
        self._scans += len(lat) - n0    # one scan per malloc, as `malloc` counts them
        self._repops += repops
        self._repop_blocks += repop_blocks
        self._merged += merged_all
        self._splits += splits
        return j, peak

    def block(self, b):
        return self._addr[b], self._size[b]

    def addresses(self, held: dict) -> dict:
        """`Policy.addresses`: each held block's address read from its column (a handle is a block id), not through
        `block` (unless a subclass says where its blocks lie itself)."""
        if type(self).block is not SplittingPool.block:
            return Policy.addresses(self, held)
        return addresses_of(self._addr, held)

    # ---- the slow path ---------------------------------------------------------------
    def _scan(self, n: int, c: int) -> int:
        """``scan!``: best fit in class ``c``'s free list, taken out of it; 0 if none."""
        limit = n if c == HUGE and self.huge_exact else CLASS_LIMIT[c]
        b = self._avail.pop_fit(n, limit) if n < WORD_SIZE else 0
        if not b and c == HUGE:
            b = self._outsize.pop_fit(n, limit)
        if b:
            self._fsize[b] = 0
        return b

    def _reclaim(self, cls: int, target: float) -> int:
        """``reclaim!(set, target)``: device-free whole blocks in ascending (size, id) until ``target`` bytes."""
        freed = 0
        prev, nxt, fsize = self._prev, self._next, self._fsize
        lo, hi = CLASS_RANGE[cls]
        for s, b in self._avail.members() + self._outsize.members():
            if not lo < s <= hi:
                continue
            if prev[b] or nxt[b]:
                continue            # a piece of a buffer, not the whole buffer
            fsize[b] = 0
            self.ctx.free(self._addr[b], s)
            self._reclaimed += 1
            freed += s
            if freed >= target:
                break
        return freed

    def _repopulate_now(self, step: str) -> None:
        """Repopulate and compact the pending frees off the hot path, timed as ``{step}a``/``{step}b``."""
        nb0, nm0 = self._repop_blocks, self._merged
        self.ctx.charge(self._repopulate())
        nb, nm = self._repop_blocks - nb0, self._merged - nm0
        self._slow_blocks += nb
        self._slow_merged += nm
        self.ctx.add_section(f"{step}a repopulate", nb * self.costs.pool_free_s)
        self.ctx.add_section(f"{step}b compact", nm * self.costs.pool_free_s)

    def release_cache(self) -> None:
        """``CuArrays.reclaim()`` (full): the pending frees repopulated and compacted, then every whole
        free buffer of every class given back to the device (the x.5a step without the alloc)."""
        if self._freed:
            self._repopulate_now("1")
        for cls in (SMALL, LARGE, HUGE):
            self._reclaim(cls, float("inf"))

    def _escalate(self, n: int, c: int) -> int:
        """The rest of phase 1 after a missed scan, then phases 2 and 3; 0 means OOM."""
        ctx, costs = self.ctx, self.costs
        for phase in (1, 2, 3):
            if phase > 1:
                with ctx.section(f"{phase}.0 gc({'true' if phase == 3 else 'false'})"):
                    ctx.collect(phase == 3)
                if self._freed:
                    self._repopulate_now(f"{phase}.1")
                ctx.charge(costs.pool_hit_s)
                ctx.add_section(f"{phase}.2 scan", costs.pool_hit_s)
                b = self._scan(n, c)
                if b:
                    return b
            with ctx.section(f"{phase}.3 alloc"):
                b = self._new_block(n)
            if b:
                return b
            for cls in (HUGE, LARGE, SMALL):
                with ctx.section(f"{phase}.4a reclaim"):
                    self._reclaim(cls, n)
                with ctx.section(f"{phase}.4b alloc"):
                    b = self._new_block(n)
                if b:
                    return b
            self._flushes += 1
            with ctx.section(f"{phase}.5a reclaim"):
                for cls in (SMALL, LARGE, HUGE):
                    self._reclaim(cls, float("inf"))
            with ctx.section(f"{phase}.5b alloc"):
                b = self._new_block(n)
            if b:
                return b
        return 0

    # ---- folding (`Policy.fold_state`) ------------------------------------------------
    fold_counters = ("_scans", "_repops", "_repop_blocks", "_merged", "_splits", "_slow_blocks", "_slow_merged",
                     "_flushes", "_reclaimed")

    def fold_state(self, held):
        """The live blocks by address: size, free state (AVAILABLE, FREED, allocated), the rank of their id
        (best fit's tie order; ids themselves are renamed by `renumber`) and whether a piece of the same buffer
        lies before and after; the freed blocks in the order they wait; ``allocated``. The free list's void
        entries and the id counter only pace housekeeping that changes no decision."""
        live = np.sort(np.concatenate((np.fromiter(held, np.int64),
                                       np.array(_free_ids(self._fsize, self._next_id), np.int64))))
        if (live[1:] == live[:-1]).any():
            live = np.unique(live)                      # (an id both held and free: none seen)
        size, addr, prev, nxt, fsize = (words_of(c, live) for c in (self._size, self._addr, self._prev, self._next,
                                                                       self._fsize))
        state = np.where(fsize == FREED, 2, fsize != 0)
        rank = np.arange(len(live))                     # (the rank of each id: ``live`` ascends)
        order = address_order(addr, size, state, rank, prev != 0, nxt != 0)     # the rows sorted as tuples
        flags = state * 4 + (prev != 0) * 2 + (nxt != 0)
        blocks = b"".join(c[order].tobytes() for c in (addr, size, rank.astype(np.int32), flags.astype(np.uint8)))
        freed = words_of(self._addr, np.array(self._freed, np.int64)).tobytes()
        return blocks, freed, self.allocated

    # ---- reporting -----------------------------------------------------------------
    def largest_free(self):
        pending = max((self._size[b] for b in self._freed), default=0)
        return max(pending, self._avail.largest(), self._outsize.largest())

    def free_breakdown(self, stream):
        """The free pieces (in the free lists, or freed and waiting for the next malloc) by buffer: hard
        in a buffer that holds an allocated piece; soft in one that holds none, merged back or not yet.
        No streams: any stream's request may take any piece."""
        prev, nxt, fsize, size = self._prev, self._next, self._fsize, self._size
        free = {e & ID_MASK for fl in (self._avail, self._outsize) for e in fl.entries if fl.live(e)}
        free.update(self._freed)
        head_of: dict[int, int] = {}
        for b in free:                  # each piece's buffer, named by its first piece
            path = []
            while b not in head_of and prev[b]:
                path.append(b)
                b = prev[b]
            head = head_of.get(b, b)
            head_of.update(dict.fromkeys(path + [b], head))
        shared = {}
        for head in set(head_of.values()):
            b, live = head, False
            while b and not live:
                live = not fsize[b]
                b = nxt[b]
            shared[head] = live
        return self.free_parts(((stream, size[b], shared[head_of[b]]) for b in free), stream)

    def free_blocks(self) -> list[tuple[int, int, int]]:
        """``(class, size, id)`` of every block in the free lists, in (class, size, id) order (tests, dumps)."""
        return [(size_class(s), s, b) for s, b in self._avail.members() + self._outsize.members()]

    def counters(self):
        return {"cache_flushes": self._flushes, "splits": self._splits, "compacted_blocks": self._merged,
                "reclaimed_blocks": self._reclaimed, "pending_freed": len(self._freed)}

    def finish(self):
        ctx, fr = self.ctx, self.costs.pool_free_s
        if self._repops:
            ctx.add_section("1.1a repopulate", (self._repop_blocks - self._slow_blocks) * fr, self._repops)
            ctx.add_section("1.1b compact", (self._merged - self._slow_merged) * fr, self._repops)
        if self._scans:
            ctx.add_section("1.2 scan", self._scans * self.costs.pool_hit_s, self._scans)
