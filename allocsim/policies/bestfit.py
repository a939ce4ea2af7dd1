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

Data structures: ``start`` (address -> size) and ``end`` (end address -> size)
dicts of the free blocks, so both neighbours of a freed block are found in O(1);
``segments`` (start address -> size); `SizeBuckets` of entries ``size << 64 | address`` for best
fit in O(log k) plus a short memmove, with O(1) lazy removal (an entry of ``a`` with size ``s``
is live iff ``start[a] == s``), compacted when void entries outnumber live ones. A handle is the tuple (address, size).
"""
from __future__ import annotations

try:
    import cython                   # the compiled build (docs/architecture.md, "The compiled build")
except ImportError:
    from ..compiled import cython   # interpreted: its decorators and types change nothing

from .registry import register
from ._freelists import END, SizeBuckets
from .base import Param, Policy
from ..errors import UsageError

if not cython.compiled:             # compiled, bestfit.pxd cimports their C loops
    from ._latency import add_latency
    from ._sorted import file_key, first_at_least

KEY_BITS = 64                   # a free-list entry: size << KEY_BITS | address (addresses are below 2**64)
assert (1 << KEY_BITS) - 1 == 0xFFFFFFFFFFFFFFFF               # written as a literal in the hot path


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
        self._start: dict[int, int] = {}        # free block address -> size
        self._end: dict[int, int] = {}          # free block end address -> size
        self._segments: dict[int, int] = {}     # segment address -> size
        start_get = self._start.get
        self._avail = SizeBuckets(lambda e: start_get(e & 0xFFFFFFFFFFFFFFFF) == e >> 64, KEY_BITS)
        self._flushes = 0
        self._fits = 0                          # best fits on the hot path (section "1. best fit")
        self._compact_at = SizeBuckets.COMPACT_MIN
        self._charge, self._hit_s, self._free_s = self.ctx.charge, self.costs.pool_hit_s, self.costs.pool_free_s

    # ---- the hot path: `malloc` and `free`, and the same two inlined in `walk_chunk` --------
    def _compact(self) -> int:
        """Drop the free list's void entries; return (and keep) the length that next calls for it."""
        self._compact_at = at = 2 * max(self._avail.compact(), SizeBuckets.COMPACT_MIN)
        return at

    def malloc(self, req, stream):
        n = (req + 511) & -512
        self._fits += 1
        self._charge(self._hit_s)
        start, entries = self._start, self._avail.entries
        i = first_at_least(entries, n << 64)       # SizeBuckets.pop_fit(n), inlined: END stops it
        e = entries[i]
        while e != END:
            del entries[i]
            a = e & 0xFFFFFFFFFFFFFFFF
            s = e >> 64
            if start.get(a) == s:
                break
            e = entries[i]
        else:
            a = 0
        if a:
            del start[a]
            rem = s - n
            if rem:                     # split: the tail stays free
                b = a + n
                start[b] = self._end[a + s] = rem
                file_key(entries, rem << 64 | b)      # SizeBuckets.push, inlined
                if len(entries) > self._compact_at:
                    self._compact()
            else:
                del self._end[a + s]
        else:
            a = self._grow(n)
            if not a:
                return None
        self.allocated += n
        return a, n

    def free(self, h):
        a, n = h
        self.allocated -= n
        self._charge(self._free_s)
        start, end, segments = self._start, self._end, self._segments
        e = a + n
        ls = end.get(a)
        if ls is not None and a not in segments:    # merge with the free block before
            del end[a]
            a -= ls
            n += ls                     # start[a] is rewritten below, voiding its old entry
        rs = start.get(e)
        if rs is not None and e not in segments:    # merge with the free block after
            del start[e]
            e += rs
            n += rs                     # end[e] is rewritten below
        if self.release and segments.get(a) == n:
            self._release(a, n, e)
            return
        start[a] = end[e] = n
        entries = self._avail.entries
        file_key(entries, n << 64 | a)    # SizeBuckets.push, inlined
        if len(entries) > self._compact_at:
            self._compact()

    @cython.locals(handles=dict, start=dict, end=dict, segments=dict, entries=list, k=cython.longlong,
                   peak=cython.longlong, allocated=cython.longlong, clock=cython.double, t0=cython.double,
                   hit_s=cython.double, free_s=cython.double, x=cython.Py_ssize_t, n0=cython.Py_ssize_t,
                   slow=cython.bint, release=cython.bint, compact_at=cython.Py_ssize_t)
    def walk_chunk(self, events, handles, lat, peak, dev, served):
        """The replay's fused loop (docs/architecture.md, "The fast path"): `malloc` and `free`
        inlined over ``events``, the clock and ``allocated`` kept in locals, the state bound to locals here.

        A miss runs `_grow` as `malloc` does (clock and ``allocated`` written back around it) and
        is reported to ``served``; a pressure event or the FREE of an id not live is handed back:
        returns ``(its index or None at the end, peak allocated)``."""
        start, end, segments, entries = self._start, self._end, self._segments, self._avail.entries
        hit_s, free_s, release, last = self._hit_s, self._free_s, self.release, END
        grow, compact, release_segment, compact_at = self._grow, self._compact, self._release, self._compact_at
        clock, allocated = dev.clock, self.allocated
        lat_append, n0 = lat.append, len(lat)
        compiled = cython.compiled          # compiled: `add_latency`, a C append
        for j, k, i, req, _ in events:
            if k == 1:                      # ALLOC: malloc, as above
                n = (req + 511) & -512
                t0 = clock
                clock += hit_s
                x = first_at_least(entries, n << 64)
                e = entries[x]
                while e != last:
                    del entries[x]
                    a = e & 0xFFFFFFFFFFFFFFFF
                    s = e >> 64
                    if start.get(a) == s:
                        break
                    e = entries[x]
                else:
                    a = 0
                if a:
                    del start[a]
                    rem = s - n
                    if rem:
                        b = a + n
                        start[b] = end[a + s] = rem
                        file_key(entries, rem << 64 | b)
                        if len(entries) > compact_at:
                            compact_at = compact()
                    else:
                        del end[a + s]
                    slow = False
                else:
                    dev.clock, self.allocated = clock, allocated
                    a = grow(n)
                    clock = dev.clock
                    if not a:
                        lat_append(clock - t0)
                        if served(j, None):
                            break
                        continue
                    slow = True
                allocated += n
                if allocated > peak:
                    peak = allocated
                if compiled:
                    add_latency(lat, clock - t0)
                else:
                    lat_append(clock - t0)
                handles[i] = h = a, n
                if slow:
                    self.allocated = allocated
                    served(j, h)
            elif k == 2:                    # FREE: free, as above
                h = handles.pop(i, None)
                if h is None:
                    break
                a, n = h
                allocated -= n
                clock += free_s
                e = a + n
                ls = end.get(a)
                if ls is not None and a not in segments:
                    del end[a]
                    a -= ls
                    n += ls
                rs = start.get(e)
                if rs is not None and e not in segments:
                    del start[e]
                    e += rs
                    n += rs
                if release and segments.get(a) == n:
                    dev.clock = clock
                    release_segment(a, n, e)
                    clock = dev.clock
                    continue
                start[a] = end[e] = n
                file_key(entries, n << 64 | a)
                if len(entries) > compact_at:
                    compact_at = compact()
            else:
                break
        else:
            j = None
        dev.clock, self.allocated = clock, allocated
        self._fits += len(lat) - n0     # one best fit per malloc, as `malloc` counts them
        return j, peak

    # ---- the slow path ---------------------------------------------------------------
    def _release(self, a: int, n: int, e: int) -> None:
        """Return the wholly free segment at ``a`` to the device (its free-list entry, if any, is voided)."""
        self._start.pop(a, None)
        self._end.pop(e, None)
        del self._segments[a]
        self.ctx.free(a, n)

    def _release_free_segments(self) -> int:
        freed = 0
        for a, n in list(self._segments.items()):
            if self._start.get(a) == n:
                self._release(a, n, a + n)
                freed += n
        return freed

    def release_cache(self) -> None:
        """Every wholly free segment goes back to the device (the escalation's step 3a)."""
        self._release_free_segments()

    def _new_segment(self, n: int) -> int:
        seg = -(-n // self.segment) * self.segment
        a = self.ctx.malloc(seg)
        if a is None:
            return 0
        self._segments[a] = seg
        if seg > n:
            self._add_free(a + n, seg - n)
        return a

    def _grow(self, n: int) -> int:
        """A new segment for ``n`` bytes, escalating as the module docstring says; its address, 0 if OOM."""
        ctx = self.ctx
        with ctx.section("2. segment alloc"):
            a = self._new_segment(n)
        if a:
            return a
        self._flushes += 1
        with ctx.section("3a. release free segments"):
            self._release_free_segments()
        with ctx.section("3b. segment alloc"):
            a = self._new_segment(n)
        if a or ctx.eager:
            return a
        with ctx.section("4.0 gc(true)"):
            ctx.collect(True)
        with ctx.section("4.1 best fit"):
            a = self._avail.pop_fit(n)
            if a:
                self._take(a, n)
                return a
        with ctx.section("4.2 segment alloc"):
            return self._new_segment(n)

    def _take(self, a: int, n: int) -> None:
        """Allocate ``n`` bytes at the start of free block ``a`` (just popped); the tail stays free."""
        s = self._start.pop(a)
        del self._end[a + s]
        if s > n:
            self._add_free(a + n, s - n)

    def _add_free(self, a: int, n: int) -> None:
        self._start[a] = self._end[a + n] = n
        self._avail.push(a, n)

    # ---- folding (`Policy.fold_state`) ------------------------------------------------
    fold_counters = ("_flushes", "_fits")

    def fold_state(self, held):
        """Free blocks, segments and held blocks by address, and ``allocated``: best fit's ties go to the lowest
        address, so nothing else steers it (the free list's void entries only pace its compaction)."""
        return sorted(self._start.items()), sorted(self._segments.items()), sorted(held), self.allocated

    # ---- reporting -----------------------------------------------------------------
    def block(self, h):
        return h

    def largest_free(self):
        return self._avail.largest()

    def free_breakdown(self, stream):
        """A wholly free segment is one free block of its size (neighbours merge at once): soft; every
        other free block shares its segment with a live one: hard. No streams."""
        free = sum(self._start.values())
        soft = sum(n for a, n in self._segments.items() if self._start.get(a) == n)
        return {"hard": free - soft, "soft": soft, "stream": 0}

    def free_blocks(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every free block, by address (tests)."""
        return sorted(self._start.items())

    def counters(self):
        return {"cache_flushes": self._flushes, "segments": len(self._segments), "free_blocks": len(self._start)}

    def finish(self):
        fits = self._fits
        if fits:
            self.ctx.add_section("1. best fit", fits * self.costs.pool_hit_s, fits)
