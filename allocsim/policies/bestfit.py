"""`bestfit`: a plain online baseline, address-ordered best fit with coalescing over segments.

Source: `docs/models/bestfit-oracle.md`, section "bestfit" (TensorFlow's BFC allocator is
the nearest real design; this one has no bins and no power-of-two rounding).

- Requests are rounded up to 512 B. The smallest free block that fits is taken,
  ties to the lowest address, and split; the rest stays free.
- Memory comes from the device in segments obtained on demand: ``segment`` bytes
  (default 2 MiB), or a request larger than that rounded up to a multiple of it
  (its own segment, whose tail is free for others). Blocks never span segments.
- A freed block merges with free address neighbours in its segment at once.
- Fully free segments are kept (``release=true`` returns each to the device as
  soon as it is wholly free).
- When the device refuses a segment: release every wholly free segment and retry
  once (a cache flush); under the ``gc`` runtime, then a full collection and one
  more best fit + retry; then OOM.

Sections: ``1. best fit`` (every request, counted on the hot path), then
``2. segment alloc``, ``3a. release free segments`` + ``3b. segment alloc``,
``4.0 gc(true)`` + ``4.1 best fit`` + ``4.2 segment alloc`` (gc runtime).

Data structures (the hot path, as `split`'s): blocks are columns indexed by block id (address, size, the
address neighbours ``prev``/``next`` in the segment, and ``filed``: 1 while the block is in the free list, else
0), so a block costs no object and its neighbours are one read each. Id 0 is a sentinel "no neighbour" that
is never filed, so a neighbour walk needs no test for None; the ids of merged-away and released blocks are kept
in ``spare`` for the next split. A freed block absorbs its free right neighbour, and is absorbed by its free
left one, so a segment's first block keeps its id. The free list is one sorted column of keys ``size << abits
| address - lo`` (`KeyField`, shared with `torch`: every segment lies in ``[lo, lo + 2**abits)``, widened and
re-keyed when a new one does not; so the keys order free blocks by (size, address), best fit ties to the lowest
address, and a key of a size below ``fit`` is below 2**62, one machine word) ending with a key above them all,
beside the column of their block ids (the end's is 0): best fit is one search and the block is taken out of
both by position; a free neighbour's key is made again from its size and address and found (unique: one block
per address), so the list holds the free blocks and nothing else. Compiled, the ids are C words in an
``array('q')``, and so are the keys (ending with `WORD_END`) while every one is below that, as `torch`'s pools
keep theirs: the filing of a larger key makes them a list of Python ints ending with `END` (`_widen`) until a
re-key finds them all within a word again (`_rekey`); interpreted, both are lists and the keys end with `END`.
A handle is the block id.
"""
from __future__ import annotations

from array import array

import numpy as np

try:
    import cython                   # the compiled build (docs/architecture.md, "The compiled build")
except ImportError:
    from ..compiled import cython   # interpreted: its decorators and types change nothing

from .registry import register
from ._columns import addresses_of, words_of
from ._freelists import END
from .base import Param, Policy
from .torch import KeyField, _wide_key
from ..errors import UsageError

if not cython.compiled:             # compiled, bestfit.pxd cimports their C loops
    from ._latency import add_latency
    from ._sorted import drop_key, key_place, put_key, put_word, word_place, words_at

COMPILED = cython.compiled
#: The free list's last key while its keys are C words (compiled): above every key within 63 bits.
WORD_END = (1 << 63) - 1


def _column(n: int):
    """``n`` zeros, a column of numbers by block id: a C array compiled, which the fused loop reads and writes as
    a typed memoryview (no Python int per write), a list interpreted (where a list is the faster to index)."""
    return array("q", bytes(8 * n)) if cython.compiled else [0] * n


def _free_list(keys: list):
    """The free list's keys column holding the sorted ``keys`` and its end: C words ending with `WORD_END`
    compiled where every key is below it, else Python ints ending with `END`."""
    if COMPILED and not (keys and keys[-1] >= WORD_END):
        return array("q", keys + [WORD_END])
    return keys + [END]


@cython.cfunc
@cython.locals(s=cython.longlong, a=cython.longlong, shift=cython.longlong, lo=cython.longlong,
               fit=cython.longlong, x=cython.Py_ssize_t)
def _unfile(keys, ids, s, a, shift, lo, fit):
    """Take the free block of ``s`` bytes at ``a`` out of the free list ``keys``/``ids`` (a merge): its key is
    made again (`KeyField`: in C below ``fit``) and found, unique (one block per address). A C call compiled."""
    x = word_place(keys, s << shift | a - lo) if s < fit else key_place(keys, _wide_key(s, a, shift, lo))
    drop_key(keys, x)
    drop_key(ids, x)


@register
class BestFit(Policy):
    name = "bestfit"
    summary = "baseline: address-ordered best fit with coalescing over on-demand segments"
    models = "no real allocator: an online best-fit baseline (docs/models/bestfit-oracle.md)"
    params = (
        Param("segment", "size", 2 << 20, "segment size; a larger request gets a segment rounded up to a multiple"),
        Param("release", "bool", False, "return a segment to the device as soon as it is wholly free"),
    )

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        if not self.segment or self.segment % 512:
            raise UsageError(f"policy 'bestfit' option segment: expected a positive multiple of 512 bytes, "
                             f"got {self.segment!r}")
        self._addr = _column(1)                 # block id -> address (id 0: the "no neighbour" sentinel)
        self._size = _column(1)                 # block id -> size
        self._prev = _column(1)                 # block id -> the block before it in its segment, 0 if none
        self._next = _column(1)                 # block id -> the block after it, 0 if none
        self._filed = _column(1)                # block id -> 1 while it is in the free list, else 0
        self._spare: list[int] = []             # ids free for a new block
        self._keys = _free_list([])             # the free list: the free blocks' keys, sorted, then its end
        self._ids = array("q", [0]) if COMPILED else [0]    # the block id of each key (the end's: 0)
        self._field = KeyField()                # how a key is made (`_cover` widens it)
        self._segments: dict[int, int] = {}     # segment address -> size
        self._flushes = 0
        self._fits = 0                          # best fits on the hot path (section "1. best fit")
        self._charge, self._hit_s, self._free_s = self.ctx.charge, self.costs.pool_hit_s, self.costs.pool_free_s

    # ---- the hot path: `malloc` and `free`, and the same two inlined in `walk_chunk` --------
    def _more_ids(self) -> None:
        """Make ``spare`` hold ids again: every column twice as long (a new object: the fused loop binds them
        again)."""
        n = len(self._addr)
        self._addr, self._size, self._prev, self._next, self._filed = (
            c + _column(n) for c in (self._addr, self._size, self._prev, self._next, self._filed))
        self._spare.extend(range(2 * n - 1, n - 1, -1))

    def _rekey(self) -> None:
        """Make every key again after the key field widened (`_cover`): the order stays the same; C words again
        where every one fits (compiled). A new keys column: the fused loop binds it again."""
        f, addr, size = self._field, self._addr, self._size
        self._keys = _free_list([_wide_key(size[b], addr[b], f.abits, f.lo) for b in self._ids[:-1]])

    def _widen(self):
        """The free list's keys as Python ints from here on (compiled, before a key past 63 bits is filed);
        returns them."""
        if type(self._keys) is array:
            self._keys = self._keys.tolist()[:-1] + [END]
        return self._keys

    def malloc(self, req, stream):
        n = (req + 511) & -512
        self._fits += 1
        self._charge(self._hit_s)
        b = self._pop_fit(n)
        if b:
            self._take(b, n)
        else:
            b = self._grow(n)
            if not b:
                return None
        self.allocated += n
        return b

    def free(self, b):
        size, prev, nxt, filed = self._size, self._prev, self._next, self._filed
        n = size[b]
        self.allocated -= n
        self._charge(self._free_s)
        p, q = prev[b], nxt[b]
        if filed[p]:                    # the block before is free: it absorbs this one
            self._unfile(p)
            self._spare.append(b)
            b, n = p, n + size[p]
        if filed[q]:                    # the block after is free: this one absorbs it
            self._unfile(q)
            self._spare.append(q)
            q, n = nxt[q], n + size[q]
        nxt[b], prev[q], size[b] = q, b, n      # (prev[0], the sentinel's, where q is 0: never read)
        if self.release and not prev[b] and not q:
            self._release(b)
            return
        self._file(b)

    records_fused = True        # `walk_chunk` records a folded window onto the clock's tape (`Policy.fused_tape`)

    @cython.locals(handles=dict, addr=cython.longlong[::1], size=cython.longlong[::1], prev=cython.longlong[::1],
                   nxt=cython.longlong[::1], filed=cython.longlong[::1], spare=list, k=cython.longlong,
                   req=cython.longlong, peak=cython.longlong, allocated=cython.longlong, clock=cython.double,
                   t0=cython.double, hit_s=cython.double, free_s=cython.double, x=cython.Py_ssize_t,
                   n0=cython.Py_ssize_t, b=cython.Py_ssize_t, p=cython.Py_ssize_t, q=cython.Py_ssize_t,
                   r=cython.Py_ssize_t, n=cython.longlong, s=cython.longlong, e=cython.longlong,
                   rem=cython.longlong, ra=cython.longlong, shift=cython.longlong, lo=cython.longlong,
                   fit=cython.longlong, slow=cython.bint, release=cython.bint, compiled=cython.bint,
                   rec=cython.bint, m0=cython.Py_ssize_t)
    def walk_chunk(self, events, handles, lat, peak, dev, served, tape=None):
        """The replay's fused loop (docs/architecture.md, "The fast path"): `malloc` and `free`
        inlined over ``events``, the clock and ``allocated`` kept in locals, the state bound to locals here.

        A miss runs `_grow` as `malloc` does (clock and ``allocated`` written back around it, the key field, the
        keys and the columns read again: a new segment may widen the one, re-key the next and lengthen the
        others) and is reported to ``served``; a pressure event or the FREE of an id not live is handed back:
        returns ``(its index or None at the end, peak allocated)``. Compiled, the columns are C arrays read
        through typed memoryviews, a key of a size below ``fit`` is made in C, searched for and filed unboxed
        (`word_place`, `put_word`: into the C words of the free list where it keeps them), a block id is read
        from and filed into the ids' C words (`words_at`, `put_word`), and each latency is appended in C
        (`add_latency`); a larger key is filed by `_file`, in Python ints.

        With ``tape`` (a window the folder records, `Policy.fused_tape`) each increment to the clock goes onto it
        and each served latency's end; around a call out (`_grow`, a segment's release) the clock is the tape's
        running total, so the call's additions go onto it as the plain walk's do, and a grown ALLOC's latency is
        a difference on it (`Tape.between`), as `split`'s loop records."""
        addr, size, prev, nxt, filed = self._addr, self._size, self._prev, self._next, self._filed
        keys, ids, spare, field = self._keys, self._ids, self._spare, self._field
        shift, lo, fit = field.abits, field.lo, field.fit
        hit_s, free_s, release = self._hit_s, self._free_s, self.release
        grow, release_segment, more_ids = self._grow, self._release, self._more_ids
        pop_fit, file = self._pop_fit, self._file
        clock, allocated = float(dev.clock), self.allocated     # (a recorded total: its value)
        lat_append, n0 = lat.append, len(lat)
        compiled = cython.compiled          # compiled: the ids' C words (`words_at`), C appends (`add_latency`)
        rec, m0 = tape is not None, 0
        if rec:
            incs, ends = tape.incs, tape.latency_ends
        for j, k, i, req, _ in events:
            if k == 1:                      # ALLOC: malloc, as `_pop_fit` and `_take` do
                n = (req + 511) & -512
                t0 = clock
                clock += hit_s
                if rec:
                    m0 = len(incs)
                    add_latency(incs, hit_s)
                if n < fit:                 # `_pop_fit`, the key in one word
                    x = word_place(keys, n << shift)
                    b = words_at(ids, x) if compiled else ids[x]
                    if b:                   # (the end's id is 0)
                        drop_key(keys, x)
                        drop_key(ids, x)
                        filed[b] = 0
                else:
                    b = pop_fit(n)
                if b:
                    rem = size[b] - n
                    if rem:                 # split: the tail stays free, a block of its own
                        if not spare:
                            more_ids()
                            addr, size, prev, nxt, filed = self._addr, self._size, self._prev, self._next, self._filed
                        r = spare.pop()
                        ra = addr[b] + n
                        addr[r] = ra
                        size[r] = rem
                        size[b] = n
                        q = nxt[r] = nxt[b]
                        prev[q] = r
                        prev[r] = b
                        nxt[b] = r
                        if rem < fit:       # `_file`, the key in one word
                            e = rem << shift | ra - lo
                            x = word_place(keys, e)
                            put_word(keys, x, e)
                            put_word(ids, x, r)
                            filed[r] = 1
                        else:
                            file(r)
                            keys = self._keys
                    slow = False
                else:
                    dev.clock = tape.at(clock) if rec else clock    # (recorded: the growth adds onto the tape)
                    self.allocated = allocated
                    b = grow(n)
                    clock = float(dev.clock)
                    shift, lo, fit = field.abits, field.lo, field.fit
                    addr, size, prev, nxt, filed = self._addr, self._size, self._prev, self._next, self._filed
                    keys = self._keys
                    if not b:
                        lat_append(tape.between(t0, m0, dev.clock) if rec else clock - t0)
                        if served(j, None):
                            break
                        continue
                    slow = True
                allocated += n
                if allocated > peak:
                    peak = allocated
                if rec:
                    if slow:                # (what the growth added lies between)
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
                n = size[b]
                allocated -= n
                clock += free_s
                if rec:
                    add_latency(incs, free_s)
                p = prev[b]
                q = nxt[b]
                if filed[p]:
                    s = size[p]
                    _unfile(keys, ids, s, addr[p], shift, lo, fit)
                    filed[p] = 0
                    spare.append(b)
                    b = p
                    n += s
                if filed[q]:
                    s = size[q]
                    _unfile(keys, ids, s, addr[q], shift, lo, fit)
                    filed[q] = 0
                    spare.append(q)
                    n += s
                    q = nxt[q]
                nxt[b] = q
                prev[q] = b
                size[b] = n
                if release and not prev[b] and not q:
                    dev.clock = tape.at(clock) if rec else clock
                    release_segment(b)
                    if rec:
                        tape.follows(dev.clock)     # (else the tape is marked bad: nothing is folded)
                    clock = float(dev.clock)
                    continue
                if n < fit:                 # `_file`, the key in one word
                    e = n << shift | addr[b] - lo
                    x = word_place(keys, e)
                    put_word(keys, x, e)
                    put_word(ids, x, b)
                    filed[b] = 1
                else:
                    file(b)
                    keys = self._keys
            else:
                break
        else:
            j = None
        dev.clock, self.allocated = tape.at(clock) if rec else clock, allocated
        self._fits += len(lat) - n0     # one best fit per malloc, as `malloc` counts them
        return j, peak

    # ---- the free list and the blocks, outside the fused loop ------------------------------------------
    def _file(self, b: int) -> None:
        """Put free block ``b`` (its size and address set) in the free list."""
        f = self._field
        e = _wide_key(self._size[b], self._addr[b], f.abits, f.lo)     # (Python ints: any width)
        keys = self._keys if not COMPILED or e < WORD_END else self._widen()
        x = key_place(keys, e)
        put_key(keys, x, e)
        put_word(self._ids, x, b)
        self._filed[b] = 1

    def _unfile(self, b: int) -> None:
        """Take free block ``b`` out of the free list (a merge)."""
        f = self._field
        _unfile(self._keys, self._ids, self._size[b], self._addr[b], f.abits, f.lo, f.fit)
        self._filed[b] = 0

    def _pop_fit(self, n: int) -> int:
        """Take the smallest free block of size >= ``n``, lowest address first, out of the free list; its id,
        0 if none."""
        keys, ids = self._keys, self._ids
        x = key_place(keys, self._field.least(n))
        b = ids[x] if x < len(ids) else 0       # (compiled, a key past the words' end: a miss)
        if b:
            drop_key(keys, x)
            drop_key(ids, x)
            self._filed[b] = 0
        return b

    def _new_block(self, a: int, n: int, before: int, after: int) -> int:
        """A block of ``n`` bytes at ``a`` between blocks ``before`` and ``after`` of its segment (0: none)."""
        if not self._spare:
            self._more_ids()
        b = self._spare.pop()
        self._addr[b], self._size[b], self._filed[b] = a, n, 0
        self._prev[b], self._next[b] = before, after
        self._prev[after] = self._next[before] = b
        return b

    def _take(self, b: int, n: int) -> None:
        """Allocate the first ``n`` bytes of free block ``b`` (just taken out of the free list); the tail stays
        free, a block of its own."""
        rem = self._size[b] - n
        if rem:
            self._size[b] = n
            self._file(self._new_block(self._addr[b] + n, rem, b, self._next[b]))

    # ---- the slow path ---------------------------------------------------------------
    def _release(self, b: int) -> None:
        """Return block ``b``, which is its whole segment and free (out of the free list), to the device."""
        a, n = self._addr[b], self._size[b]
        self._spare.append(b)
        del self._segments[a]
        self.ctx.free(a, n)

    def _release_free_segments(self) -> int:
        whole = {self._addr[b]: b for b in self._ids[:-1] if not self._prev[b] and not self._next[b]}
        freed = 0
        for a, n in list(self._segments.items()):
            if a in whole:
                self._unfile(whole[a])
                self._release(whole[a])
                freed += n
        return freed

    def release_cache(self) -> None:
        """Every wholly free segment goes back to the device (the escalation's step 3a)."""
        self._release_free_segments()

    def _cover(self, a: int, n: int) -> None:
        """Widen the key field to a new segment at ``a`` where it lies outside, making every key again."""
        if not self._field.covers(a, n):
            self._field.widen(a, n)
            self._rekey()

    def _new_segment(self, n: int) -> int:
        seg = -(-n // self.segment) * self.segment
        a = self.ctx.malloc(seg)
        if a is None:
            return 0
        self._segments[a] = seg
        self._cover(a, seg)
        b = self._new_block(a, n, 0, 0)
        if seg > n:
            self._file(self._new_block(a + n, seg - n, b, 0))
        return b

    def _grow(self, n: int) -> int:
        """A new segment for ``n`` bytes, escalating as the module docstring says; its block's id, 0 if OOM."""
        ctx = self.ctx
        with ctx.section("2. segment alloc"):
            b = self._new_segment(n)
        if b:
            return b
        self._flushes += 1
        with ctx.section("3a. release free segments"):
            self._release_free_segments()
        with ctx.section("3b. segment alloc"):
            b = self._new_segment(n)
        if b or ctx.eager:
            return b
        with ctx.section("4.0 gc(true)"):
            ctx.collect(True)
        with ctx.section("4.1 best fit"):
            b = self._pop_fit(n)
            if b:
                self._take(b, n)
                return b
        with ctx.section("4.2 segment alloc"):
            return self._new_segment(n)

    # ---- folding (`Policy.fold_state`) ------------------------------------------------
    fold_counters = ("_flushes", "_fits")

    def fold_state(self, held):
        """Free blocks, segments and held blocks by address, and ``allocated``: best fit's ties go to the lowest
        address, so nothing else steers it (block ids and the key field do not). The held blocks, thousands in a
        transformer's run, as their addresses' and sizes' words in address order (gathered by numpy: a tuple a block
        and their pickle were most of a look at a boundary, 0.3 of 0.6 ms on GPT-2 small)."""
        if type(self).block is not BestFit.block:       # a subclass that says where its blocks lie
            return self.free_blocks(), sorted(self._segments.items()), sorted(map(self.block, held)), self.allocated
        ids = np.fromiter(held, np.int64)
        addr, size = words_of(self._addr, ids), words_of(self._size, ids)
        order = np.lexsort((size, addr))
        return (self.free_blocks(), sorted(self._segments.items()), addr[order].tobytes() + size[order].tobytes(),
                self.allocated)

    def addresses(self, held: dict) -> dict:
        """`Policy.addresses`: the held blocks' addresses gathered from their column (unless a subclass says where
        its blocks lie itself)."""
        if type(self).block is not BestFit.block:
            return Policy.addresses(self, held)
        return addresses_of(self._addr, held)

    # ---- reporting -----------------------------------------------------------------
    def block(self, h):
        return self._addr[h], self._size[h]

    def largest_free(self):
        return self._size[self._ids[-2]] if len(self._ids) > 1 else 0

    def free_breakdown(self, stream):
        """A wholly free segment is one free block of its size (neighbours merge at once): soft; every
        other free block shares its segment with a live one: hard. No streams."""
        size, prev, nxt = self._size, self._prev, self._next
        free = soft = 0
        for b in self._ids[:-1]:
            free += size[b]
            if not prev[b] and not nxt[b]:
                soft += size[b]
        return {"hard": free - soft, "soft": soft, "stream": 0}

    def free_blocks(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every free block, by address."""
        return sorted(map(self.block, self._ids[:-1]))

    def counters(self):
        return {"cache_flushes": self._flushes, "segments": len(self._segments), "free_blocks": len(self._ids) - 1}

    def finish(self):
        fits = self._fits
        if fits:
            self.ctx.add_section("1. best fit", fits * self.costs.pool_hit_s, fits)
