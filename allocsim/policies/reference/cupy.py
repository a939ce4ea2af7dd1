"""`cupy-ref`: CuPy's ``SingleDeviceMemoryPool``, written to be read.

The reference model of `cupy` (rules in docs/models/cupy.md). It follows
``cupy/cuda/memory.pyx`` and keeps its names:

    malloc -> _round_size -> _malloc
      the stream's arena: best fit among its free chunks, split off the remainder
      (append_to_free_list, no merging); on a miss _try_malloc:
        (v14) larger than the limit itself: OOM at once (_try_block_total_bytes)
        over the limit: free_all_blocks; still over: gc.collect + free_all_blocks; still over: OOM
        cudaMalloc fails: free_all_blocks + retry; gc.collect (x2 in v14) + free_all_blocks + retry; OOM
    free: merge with a free ``next``, then with a free ``prev`` (remove_from_free_list),
      then append_to_free_list
    free_all_blocks(stream=None): each arena (or only the stream's, if it has one), in the
      order its chunks were filed: release the free chunks that are whole device allocations
      (CuPy walks its free index instead, smallest first: docs/models/cupy.md)

An arena keeps its free chunks in bins, one list per size in a sorted dict, each
list in the order its chunks were filed, and ``free`` (address -> chunk) in the order
chunks were filed, which is the order free_all_blocks releases them. Ties between
free chunks of one size: v14's set of (size, chunk object) is arbitrary in CuPy, so
the lowest address wins; v13's ``set.pop()`` likewise, so the last filed wins; but with
``follow_ties``, replaying a CuPy recording, the chunk at the address the recorded
request got wins when it is one of them.
The limit is the smaller of option ``limit`` and the cap, which a recorded
``set_limit`` (SET_LIMIT) moves; each comparison the cap decides is told to the device.

It shares nothing with `cupy` but the class it is registered against (for its name and
options): the allocation unit and ``_round_size``, the tie rules, when the recorded ties
are followed and where the recording placed each request (`RecordedPlaces`) are stated
again here from docs/models/cupy.md ("Rules", "Ties", "Options"), so that a slip in one
is a difference tests/test_reference_models.py sees.
"""
from __future__ import annotations

from array import array

from sortedcontainers import SortedDict

from ...errors import UsageError
from ...trace.events import ALLOC, SEGMENT_ALLOC, SEGMENT_FREE
from ..base import Policy
from ..cupy import CuPyPool
from ..registry import reference_of

ALLOCATION_UNIT_SIZE = 512      # memory.pyx: every request is rounded up to a multiple of this (rule 1)


def _round_size(size: int) -> int:
    """``_round_size``: ``size`` rounded up to a multiple of the allocation unit (docs/models/cupy.md rule 1)."""
    unit = ALLOCATION_UNIT_SIZE
    return ((size + unit - 1) // unit) * unit


class Chunk:
    """A piece of one device allocation; ``prev``/``next`` are the pieces beside it in that allocation."""

    def __init__(self, ptr: int, size: int, arena: "Arena"):
        self.ptr = ptr
        self.size = size
        self.arena = arena
        self.prev: Chunk | None = None
        self.next: Chunk | None = None


class Arena:
    """The free chunks of one stream."""

    def __init__(self, lifo: bool):
        self.lifo = lifo
        self.bins = SortedDict()                # size -> free chunks of that size, in filing order
        self.free: dict[int, Chunk] = {}        # address -> free chunk, in filing order

    def append_to_free_list(self, chunk: Chunk) -> None:
        self.bins.setdefault(chunk.size, []).append(chunk)
        self.free[chunk.ptr] = chunk

    def remove_from_free_list(self, chunk: Chunk) -> bool:
        """Take ``chunk`` out of the free lists; False if it was not free."""
        if self.free.get(chunk.ptr) is not chunk:
            return False
        del self.free[chunk.ptr]
        same_size = self.bins[chunk.size]
        same_size.remove(chunk)
        if not same_size:
            del self.bins[chunk.size]
        return True

    def best_fit(self, size: int, recorded: int = 0) -> Chunk | None:
        """The free chunk of the smallest size >= ``size``; ties: the one at address ``recorded`` if it is one of
        them, else the last filed (v13) or the lowest address (v14)."""
        i = self.bins.bisect_left(size)
        if i == len(self.bins):
            return None
        same_size = self.bins.peekitem(i)[1]
        taken = [c for c in same_size if c.ptr == recorded]
        if taken:
            return taken[0]
        return same_size[-1] if self.lifo else min(same_size, key=lambda c: c.ptr)


class RecordedPlaces:
    """Where a CuPy recording placed each request (docs/models/cupy.md, "Ties"): the recorded segment it lay in,
    numbered in the order the recording made its segments, and the offset in it. The model's own segments,
    appended to ``model`` as it makes them, carry the same numbers, so `address` is the recorded place in the
    model's address space, whatever addresses the device gave."""

    def __init__(self, trace):
        self.place: dict[int, tuple[int, int]] = {}     # trace index of an ALLOC -> (segment number, offset)
        self.model: list[int] = []                      # the model's segment addresses, in the order it made them
        live = SortedDict()                             # a live recorded segment's address -> (number, size)
        made = 0
        for ev in trace:
            if ev.kind == SEGMENT_ALLOC:
                live[ev.addr] = (made, ev.size)
                made += 1
            elif ev.kind == SEGMENT_FREE:
                live.pop(ev.addr, None)
            elif ev.kind == ALLOC and ev.addr:
                i = live.bisect_right(ev.addr) - 1      # the live segment starting at or below the address
                if i >= 0:
                    base, (number, size) = live.peekitem(i)
                    if ev.addr < base + size:
                        self.place[ev.index] = (number, ev.addr - base)

    def address(self, at: int) -> int:
        """The model's address for the place the request at trace index ``at`` got; 0 if unknown (not in a
        recorded segment, or in one the model has not made)."""
        if at not in self.place:
            return 0
        number, offset = self.place[at]
        return self.model[number] + offset if number < len(self.model) else 0


@reference_of(CuPyPool)
class CuPyPoolReference(Policy):
    summary = "CuPy's SingleDeviceMemoryPool as memory.pyx reads, plain bins (slow)"
    models = CuPyPool.models
    wants_event_index = True

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        if str(self.version) not in ("13", "14"):
            raise UsageError(f"policy {self.name!r} option version: expected 13 or 14, got {self.version!r}")
        self.version = int(self.version)
        self._arenas: dict[int, Arena] = {}
        self.total = 0
        self.cache_flushes = self.limit_ooms = self.device_ooms = 0
        self.event_index = -1
        self.segment_log: list[tuple[int, int, int]] = []
        self.total_log = array("q") if self.track_total else None
        self.follows_recording = self.follows_ties()
        self._places = RecordedPlaces(self.ctx.trace) if self.follows_recording else None

    def follows_ties(self) -> bool:
        """Whether ties go to the recorded run's choice (docs/models/cupy.md, "Ties"): option ``follow_ties`` (on
        by default) and a trace that CuPy's pool recorded (``framework`` cupy), whose ALLOCs hold its addresses."""
        return bool(self.follow_ties) and self.ctx.trace is not None and self.ctx.meta.get("framework") == "cupy"

    @property
    def _limit(self) -> int:
        """``set_limit``'s bytes: the smaller of ``limit`` and the cap (recorded limits included); 0 none."""
        limits = [x for x in (self.limit, self.ctx.cap) if x]
        return min(limits) if limits else 0

    def _arena(self, stream: int) -> Arena:
        if stream not in self._arenas:
            self._arenas[stream] = Arena(lifo=self.version < 14)
        return self._arenas[stream]

    def total_bytes(self) -> int:
        return self.total

    def _log_total(self) -> None:
        if self.track_total:
            self.total_log.append(self.total)

    # ---- malloc ---------------------------------------------------------------------------
    def malloc(self, size: int, stream: int):
        chunk = self._malloc(_round_size(size), stream)
        self._log_total()
        return chunk

    def _malloc(self, size: int, stream: int) -> Chunk | None:
        self.ctx.charge(self.costs.pool_hit_s)
        arena = self._arena(stream)
        chunk = arena.best_fit(size, self._recorded_address())
        if chunk is not None:
            arena.remove_from_free_list(chunk)
            if chunk.size > size:
                arena.append_to_free_list(self._split(chunk, size))
        else:
            ptr = self._try_malloc(size)
            if ptr is None:
                return None
            chunk = Chunk(ptr, size, arena)
        self.allocated += chunk.size
        return chunk

    def _recorded_address(self) -> int:
        """Following a CuPy recording's ties: where the recorded request was placed, as an address of this
        model's segments (0: unknown, or not following)."""
        at = self.event_index
        return self._places.address(at) if self.follows_recording and at >= 0 else 0

    @staticmethod
    def _split(chunk: Chunk, size: int) -> Chunk:
        """Cut ``chunk`` after ``size`` bytes; return the remainder."""
        remaining = Chunk(chunk.ptr + size, chunk.size - size, chunk.arena)
        remaining.prev = chunk
        remaining.next = chunk.next
        if chunk.next is not None:
            chunk.next.prev = remaining
        chunk.next = remaining
        chunk.size = size
        return remaining

    def _within_limit(self, need: int) -> bool:
        """``need <= limit`` (no limit: true); the device hears of it when the cap, not option ``limit``, decides."""
        if self.limit and need > self.limit:
            return False
        ok = not self.ctx.cap or need <= self.ctx.cap
        self.ctx.note(need, ok)
        return ok

    def _try_malloc(self, size: int) -> int | None:
        """A new device allocation, with CuPy's escalation; None on OOM."""
        if self.version >= 14 and not self._within_limit(size):
            self.limit_ooms += 1                    # _try_block_total_bytes: size > limit raises at once
            return None
        if not self._within_limit(size + self.total_bytes()):
            self.free_all_blocks()
            if not self._within_limit(size + self.total_bytes()):
                self.ctx.collect(True)              # gc.collect()
                self.free_all_blocks()
                if not self._within_limit(size + self.total_bytes()):
                    self.limit_ooms += 1
                    return None
        ptr = self._alloc(size)
        if ptr is None:
            self.free_all_blocks()
            ptr = self._alloc(size)
        if ptr is None:
            for _ in range(2 if self.version >= 14 else 1):
                self.ctx.collect(True)              # gc.collect()
            self.free_all_blocks()
            ptr = self._alloc(size)
        if ptr is None:
            self.device_ooms += 1
        return ptr

    def _alloc(self, size: int) -> int | None:
        """cudaMalloc."""
        ptr = self.ctx.malloc(size)
        if ptr is not None:
            if self._places is not None:
                self._places.model.append(ptr)
            self.total += size
            self.segment_log.append((SEGMENT_ALLOC, size, self.event_index))
        return ptr

    # ---- free -----------------------------------------------------------------------------
    def free(self, chunk: Chunk) -> None:
        self.allocated -= chunk.size
        self.ctx.charge(self.costs.pool_free_s)
        arena = chunk.arena
        c = chunk.next
        if c is not None and arena.remove_from_free_list(c):
            chunk = self._merge(chunk, c)
        c = chunk.prev
        if c is not None and arena.remove_from_free_list(c):
            chunk = self._merge(c, chunk)
        arena.append_to_free_list(chunk)
        self._log_total()

    @staticmethod
    def _merge(head: Chunk, remaining: Chunk) -> Chunk:
        """``head`` absorbs the chunk after it."""
        head.size += remaining.size
        head.next = remaining.next
        if head.next is not None:
            head.next.prev = head
        return head

    def release_cache(self) -> None:
        self.free_all_blocks()

    def free_all_blocks(self, stream=None) -> int:
        """Release every free chunk that is a whole device allocation; the bytes released."""
        self.cache_flushes += 1
        released = 0
        if stream is None:
            arenas = list(self._arenas.values())
        else:
            arenas = [self._arenas[stream]] if stream in self._arenas else []
        for arena in arenas:
            for chunk in [c for c in arena.free.values() if c.prev is None and c.next is None]:
                arena.remove_from_free_list(chunk)
                self.ctx.free(chunk.ptr, chunk.size)
                self.total -= chunk.size
                released += chunk.size
                self.segment_log.append((SEGMENT_FREE, chunk.size, self.event_index))
        return released

    # ---- reporting ------------------------------------------------------------------------
    def block(self, handle: Chunk):
        return handle.ptr, handle.size

    def largest_free(self) -> int:
        return max((a.bins.peekitem(-1)[0] for a in self._arenas.values() if a.bins), default=0)

    def n_free_blocks(self) -> int:
        return sum(len(a.free) for a in self._arenas.values())

    def counters(self) -> dict:
        return {"cache_flushes": self.cache_flushes, "used_bytes": self.allocated, "total_bytes": self.total,
                "free_bytes": self.total - self.allocated, "n_free_blocks": self.n_free_blocks(),
                "limit": self._limit, "limit_ooms": self.limit_ooms, "device_ooms": self.device_ooms,
                "version": self.version}
