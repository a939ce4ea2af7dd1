"""`split-ref`: CuArrays' SplittingPool after PR #427, written to be read.

The reference model of `split` (rules in docs/models/cuarrays.md). It follows
``src/memory/split.jl`` and keeps its names:

    alloc (here `malloc`): round by class; then up to three phases, each
      x.0 gc(false) / gc(true)          (phases 2 and 3)
      x.1 repopulate! + incremental_compact!   (when blocks were freed since the last call)
      x.2 scan                          best fit: smallest size >= n, ties to the lowest id
      x.3 actual_alloc
      x.4 reclaim! + actual_alloc       for HUGE, LARGE, SMALL in turn, target n bytes
      x.5 reclaim! everything + actual_alloc
    then split the block if the remainder is of the same class (never HUGE).
    free: mark the block FREED and push it onto ``freed``; nothing else.

Blocks are objects with the source's fields (address, size, state, prev, next, id);
the free lists are three sorted sets, one per class, ordered by (size, id), the v1.6
key. A handle is the block.

It shares nothing with `split` but the class it is registered against (for its name
and options): the size classes, the rounding by class and the split rule are stated
again here from docs/models/cuarrays.md ("split: SplittingPool"), so that a slip in
one is a difference tests/test_reference_models.py sees.
"""
from __future__ import annotations

import math
from enum import Enum, IntEnum

from sortedcontainers import SortedKeyList

from ..base import Policy
from ..split import SplittingPool
from ..registry import reference_of


class SizeClass(IntEnum):
    """split.jl's block classes, in the source's order."""
    SMALL = 0
    LARGE = 1
    HUGE = 2


SMALL, LARGE, HUGE = SizeClass.SMALL, SizeClass.LARGE, SizeClass.HUGE

# split.jl's constants (docs/models/cuarrays.md, "split: SplittingPool"), stated again here
SMALL_CUTOFF = 2**20                # SMALL: up to 1 MiB
LARGE_CUTOFF = 2**25                # LARGE: up to 32 MiB; HUGE above
ROUNDOFF = {SMALL: 2**9, LARGE: 2**17, HUGE: 2**20}     # SMALL_ROUNDOFF, LARGE_ROUNDOFF, HUGE_ROUNDOFF


def size_class(sz: int) -> SizeClass:
    """``size_class``: SMALL <= 1 MiB < LARGE <= 32 MiB < HUGE."""
    if sz <= SMALL_CUTOFF:
        return SMALL
    if sz <= LARGE_CUTOFF:
        return LARGE
    return HUGE


def round_request(sz: int) -> tuple[int, SizeClass]:
    """``pool_alloc``'s first lines: round ``sz`` up by its class's roundoff, then the class of the rounded size."""
    roundoff = ROUNDOFF[size_class(sz)]
    sz = cld(sz, roundoff) * roundoff
    return sz, size_class(sz)


def cld(a: int, b: int) -> int:
    """Julia's ``cld``: integer division rounding up."""
    return -(-a // b)


class State(Enum):
    INVALID = 0
    AVAILABLE = 1
    ALLOCATED = 2
    FREED = 3


class Block:
    """A piece of one device buffer; ``prev``/``next`` are the address-adjacent pieces of that buffer."""

    def __init__(self, id: int, addr: int, size: int):
        self.id = id
        self.addr = addr
        self.size = size
        self.state = State.INVALID
        self.prev: Block | None = None
        self.next: Block | None = None

    def iswhole(self) -> bool:
        return self.prev is None and self.next is None


@reference_of(SplittingPool)
class SplittingPoolReference(Policy):
    summary = "CuArrays' SplittingPool as split.jl reads, plain data (slow)"
    models = SplittingPool.models

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.available = {c: SortedKeyList(key=lambda b: (b.size, b.id)) for c in (SMALL, LARGE, HUGE)}
        self.freed: list[Block] = []
        self.last_id = 0
        self.flushes = self.splits = self.compacted = self.reclaimed = 0

    def available_for(self, block: Block) -> SortedKeyList:
        return self.available[size_class(block.size)]

    def new_block(self, addr: int, size: int) -> Block:
        self.last_id += 1
        return Block(self.last_id, addr, size)

    # ---- alloc --------------------------------------------------------------------------
    def malloc(self, req: int, stream: int):
        n, cls = round_request(req)
        block = None
        for phase in (1, 2, 3):
            if phase > 1:
                self.ctx.collect(phase == 3)                # x.0 gc(false) / gc(true)
            if self.freed:
                self.incremental_compact(self.repopulate())     # x.1a, x.1b
            block = self.scan(n, cls)                       # x.2
            if block is None:
                block = self.actual_alloc(n)                # x.3
            for c in (HUGE, LARGE, SMALL):                  # x.4a reclaim, x.4b alloc
                if block is not None:
                    break
                self.reclaim(c, n)
                block = self.actual_alloc(n)
            if block is None:                               # x.5a reclaim, x.5b alloc
                self.flushes += 1
                for c in (SMALL, LARGE, HUGE):
                    self.reclaim(c, math.inf)
                block = self.actual_alloc(n)
            if block is not None:
                break
        if block is None:
            return None
        remainder = block.size - n
        if cls != HUGE and remainder > 0 and size_class(remainder) == cls:
            self.split(block, n)
        block.state = State.ALLOCATED
        self.allocated += block.size
        return block

    def scan(self, n: int, cls: int) -> Block | None:
        """Best fit in the class's set; taken out of it. The HUGE check is dead unless ``huge_exact``."""
        self.ctx.charge(self.costs.pool_hit_s)
        candidates = self.available[cls]
        i = candidates.bisect_key_left((n, 0))
        if i == len(candidates):
            return None
        block = candidates[i]
        if cls == HUGE and self.huge_exact and block.size != n:
            return None
        candidates.remove(block)
        return block

    def split(self, block: Block, n: int) -> None:
        """Cut ``block`` after ``n`` bytes; the rest becomes an AVAILABLE block with a fresh id."""
        rest = self.new_block(block.addr + n, block.size - n)
        rest.prev, rest.next = block, block.next
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = n
        rest.state = State.AVAILABLE
        self.available_for(rest).add(rest)
        self.splits += 1

    def actual_alloc(self, n: int) -> Block | None:
        addr = self.ctx.malloc(n)
        return None if addr is None else self.new_block(addr, n)

    # ---- free, and what the next alloc makes of it --------------------------------------
    def free(self, block: Block) -> None:
        block.state = State.FREED
        self.freed.append(block)
        self.allocated -= block.size

    def repopulate(self) -> list[Block]:
        """``repopulate!``: every FREED block becomes AVAILABLE, in the set of its class."""
        blocks, self.freed = self.freed, []
        for block in blocks:
            block.state = State.AVAILABLE
            self.available_for(block).add(block)
        self.ctx.charge(len(blocks) * self.costs.pool_free_s)
        return blocks

    def release_cache(self) -> None:
        """``CuArrays.reclaim()``: repopulate and compact, then every whole free block of every class back."""
        if self.freed:
            self.incremental_compact(self.repopulate())
        for c in (SMALL, LARGE, HUGE):
            self.reclaim(c, math.inf)

    def incremental_compact(self, blocks: list[Block]) -> None:
        """``incremental_compact!``: merge each newly freed block's run of AVAILABLE neighbours into its head."""
        for block in blocks:
            if block.state != State.AVAILABLE:
                continue                # merged into an earlier head
            head = block
            while head.prev is not None and head.prev.state == State.AVAILABLE:
                head = head.prev
            chain = [head]
            while chain[-1].next is not None and chain[-1].next.state == State.AVAILABLE:
                chain.append(chain[-1].next)
            if len(chain) > 1:
                for b in chain:
                    self.available_for(b).remove(b)
                for b in chain[1:]:
                    head.size += b.size
                    b.state = State.INVALID
                head.next = chain[-1].next
                if head.next is not None:
                    head.next.prev = head
                self.available_for(head).add(head)
                self.compacted += len(chain) - 1
                self.ctx.charge((len(chain) - 1) * self.costs.pool_free_s)

    def reclaim(self, cls: int, target: float) -> int:
        """``reclaim!``: give whole blocks of the class back to the device, smallest first, until ``target`` bytes."""
        freed = 0
        for block in list(self.available[cls]):
            if freed >= target:
                break
            if not block.iswhole():
                continue
            self.available[cls].remove(block)
            block.state = State.INVALID
            self.ctx.free(block.addr, block.size)
            self.reclaimed += 1
            freed += block.size
        return freed

    # ---- reporting ----------------------------------------------------------------------
    def block(self, handle: Block):
        return handle.addr, handle.size

    def largest_free(self) -> int:
        sizes = [b.size for b in self.freed] + [s[-1].size for s in self.available.values() if s]
        return max(sizes, default=0)

    def free_blocks(self) -> list[tuple[int, int, int]]:
        """``(class, size, id)`` of every block in the free lists, in that order."""
        return [(c, b.size, b.id) for c in (SMALL, LARGE, HUGE) for b in self.available[c]]

    def counters(self) -> dict:
        return {"cache_flushes": self.flushes, "splits": self.splits, "compacted_blocks": self.compacted,
                "reclaimed_blocks": self.reclaimed, "pending_freed": len(self.freed)}
