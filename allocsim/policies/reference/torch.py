"""`torch-ref`: PyTorch's CUDA caching allocator (native backend), written to be read.

The reference model of `torch` (rules in docs/models/torch.md). It follows
CUDACachingAllocator.cpp function by function and keeps its names:

    malloc
      round_size, get_pool, get_allocation_size
      get_free_block                             best fit; the oversize rules of max_split_size
      trigger_free_memory_callbacks              none are registered in a replay
      garbage_collect_cached_blocks              only with an allowed memory and a GC threshold
      alloc_block
      release_available_cached_blocks + alloc_block
      release_cached_blocks + alloc_block (retry)
      alloc_found_block                          should_split, split off the remainder
    free -> free_block -> try_merge_blocks

Free blocks live in two `BlockPool`s (small: rounded size <= 1 MiB, large), each one
sorted set ordered by (stream, size, address) as PyTorch's ``BlockPool::blocks``; the
stream is ordered by its recorded ``cudaStream_t`` value. A block's ``prev``/``next``
are its address neighbours inside its segment.

With ``expandable_segments`` a pool's segments are instead virtual ranges of 1.125 x
the device memory, per stream, mapped page by page (2 MiB small, 20 MiB large):
``alloc_block`` -> ``try_allocate_expandable_block`` -> ``find_expandable_block`` ->
``map_block``; ``release_cached_blocks`` -> ``unmap_block`` -> ``release_expandable_segment``.
The unmapped ranges sit in each pool's ``unmapped`` set, ordered by (stream, address).
As in `torch`, a page range is mapped all or nothing with one device `map` (counted as a malloc).

It supports every option of `torch`. A trace's FREE is PyTorch's ``free_completed``,
so no block ever waits on events.

It shares nothing with `torch` but the option parsing (`allocsim.frameworks.torch`): the
constants, ``round_size``, ``get_allocation_size`` and the allowed memory of
``set_per_process_memory_fraction`` are stated again here from docs/models/torch.md, as
``_pydecimal`` restates ``_decimal``, so that a slip in one is a difference the
differential test (tests/test_reference_models.py) sees.
"""
from __future__ import annotations

from sortedcontainers import SortedKeyList

from ...trace.events import SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP
from ..base import Policy
from ...errors import UsageError
from ...frameworks.torch import divisions_table, options_in_force
from ..torch import TorchCachingAllocator
from ..registry import reference_of

# CUDACachingAllocator.cpp's constants (docs/models/torch.md, Constants), stated again here
kMinBlockSize = 512                 # every request is rounded up to a multiple of this
kSmallSize = 1048576                # a rounded size up to this goes to the small pool
kSmallBuffer = 2097152              # small-pool segment; small expandable page
kLargeBuffer = 20971520             # segment for 1-10 MiB requests; large expandable page
kMinLargeAlloc = 10485760           # from here a segment is the request rounded to kRoundLarge
kRoundLarge = 2097152
kRoundUpPowerOfTwoIntervals = 16    # roundup_power2_divisions entries: 1 MiB, 2 MiB, ... 64 GiB and up
kMB = 1048576
SIZE_MAX = 18446744073709551615     # max_split_size when unset


def roundup_power2_divisions(divisions: tuple, size: int) -> int:
    """The divisions entry of ``size``'s interval: floor(log2 size) - 20, clamped to 0 .. 15 (rule 1)."""
    log_size = size.bit_length() - 1
    index = log_size - 20
    return divisions[max(0, min(index, kRoundUpPowerOfTwoIntervals - 1))]


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``size`` rounded up to the next of ``divisions`` equal steps between the powers of two around it."""
    power2_floor = 1 << (size.bit_length() - 1)
    if power2_floor == size:
        return size
    step = power2_floor // divisions
    if step == 0:
        return 2 * power2_floor
    return -(-size // step) * step


def round_size(size: int, divisions: tuple) -> int:
    """The block size a request of ``size`` bytes is given (docs/models/torch.md rule 1)."""
    if size < kMinBlockSize:
        return kMinBlockSize
    d = roundup_power2_divisions(divisions, size)
    if d > 1 and size > kMinBlockSize * d:
        return roundup_power2_next_division(size, d)
    return -(-size // kMinBlockSize) * kMinBlockSize


def get_allocation_size(size: int) -> int:
    """The size of a new segment for a rounded request of ``size`` bytes (rule 6)."""
    if size <= kSmallSize:
        return kSmallBuffer
    if size < kMinLargeAlloc:
        return kLargeBuffer
    return -(-size // kRoundLarge) * kRoundLarge



class Block:
    """A piece of a segment."""

    def __init__(self, stream: int, size: int, pool: "BlockPool", ptr: int, expandable_segment=None):
        self.stream = stream
        self.size = size
        self.pool = pool
        self.ptr = ptr
        self.allocated = False
        self.mapped = True
        self.expandable_segment = expandable_segment
        self.prev: Block | None = None        # address neighbours in the same segment
        self.next: Block | None = None
        self.requested_size = 0
        self.gc_count_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def gc_count(self) -> int:
        """How many get_free_block calls of its pool this block has sat through, free."""
        return self.pool.get_free_blocks_call_count - self.gc_count_base


class BlockPool:
    """The free mapped blocks of one pool, all streams, ordered by (stream, size, address),
    and its unmapped ranges of expandable segments, ordered by (stream, address)."""

    def __init__(self, is_small: bool, stream_order):
        self.is_small = is_small
        self.blocks = SortedKeyList(key=lambda b: (stream_order(b.stream), b.size, b.ptr))
        self.unmapped = SortedKeyList(key=lambda b: (stream_order(b.stream), b.ptr))
        self.get_free_blocks_call_count = 0

    def insert_into_blocks(self, block: Block) -> None:
        block.gc_count_base = self.get_free_blocks_call_count
        self.blocks.add(block)


class ExpandableSegment:
    """A virtual address range of ``size`` bytes whose pages of ``segment_size`` are mapped on demand."""

    def __init__(self, ptr: int, size: int, segment_size: int):
        self.ptr = ptr
        self.size = size
        self.segment_size = segment_size

    def segment_left(self, p: int) -> int:
        return (p - self.ptr) // self.segment_size

    def segment_right(self, p: int) -> int:
        return (p - self.ptr + self.segment_size - 1) // self.segment_size

    def map_range(self, ptr: int, size: int) -> tuple[int, int]:
        """The page-aligned range that mapping [ptr, ptr + size) covers."""
        begin, end = self.segment_left(ptr), self.segment_right(ptr + size)
        return self.ptr + begin * self.segment_size, (end - begin) * self.segment_size

    def unmap_range(self, ptr: int, size: int) -> tuple[int, int]:
        """The whole pages inside [ptr, ptr + size); size 0 if there are none."""
        begin, end = self.segment_right(ptr), self.segment_left(ptr + size)
        if begin >= end:
            return ptr, 0
        return self.ptr + begin * self.segment_size, (end - begin) * self.segment_size


class AllocParams:
    """One request: its stream, rounded size, pool, segment size, and the block found for it."""

    def __init__(self, stream: int, size: int, pool: BlockPool, alloc_size: int, stream_key):
        self.stream = stream
        self.size = size
        self.pool = pool
        self.alloc_size = alloc_size
        self.search_key = (stream_key, size, 0)
        self.block: Block | None = None


def expandable_size(b: Block) -> int:
    """A block's size counting the unmapped space right after it, which it could grow into."""
    return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)


def splice(block: Block, before: Block | None, after: Block | None) -> None:
    """Link ``block`` between its new address neighbours ``before`` and ``after``."""
    block.prev, block.next = before, after
    if before is not None:
        before.next = block
    if after is not None:
        after.prev = block


@reference_of(TorchCachingAllocator)
class TorchCachingAllocatorReference(Policy):
    summary = "PyTorch's CUDACachingAllocator function by function, plain data (slow)"
    models = TorchCachingAllocator.models
    wants_event_index = True

    def __init__(self, ctx, options: dict | None = None, **extra):
        super().__init__(ctx, options_in_force(options, ctx.trace), **extra)
        trace = ctx.trace
        self._charge = ctx.charge
        # CUDAAllocatorConfig
        self.max_split_size = SIZE_MAX if self.max_split_size_mb is None else self.max_split_size_mb * kMB
        self.max_non_split_rounding = (self.max_non_split_rounding_mb or 20) * kMB
        divisions = self.roundup_power2_divisions
        self.divisions = (0,) * kRoundUpPowerOfTwoIntervals if divisions is None else divisions_table(divisions)
        self.total_memory = ctx.capacity if ctx.capacity is not None else ctx.cap
        self.set_memory_fraction(self.per_process_memory_fraction)
        streams = list(trace.streams) if trace is not None else []
        self.stream_key = lambda s: (streams[s] if s < len(streams) else s, s)     # cudaStream_t order
        self.large_blocks = BlockPool(False, self.stream_key)
        self.small_blocks = BlockPool(True, self.stream_key)
        self.expandable_segments_: list[ExpandableSegment] = []
        self.total_allocated_memory = 0
        self.event_index = -1
        self.segment_log: list[tuple[int, int, int]] = []
        self.num_device_alloc = self.num_device_free = 0
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = self.cache_flushes = 0
        self.segment_current = self.segment_allocated = 0
        self.inactive_split_bytes = self.inactive_split_bytes_peak = 0

    # ---- malloc -------------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int):
        self._charge(self.costs.pool_hit_s)
        size = round_size(orig_size, self.divisions)
        pool = self.get_pool(size)
        params = AllocParams(stream, size, pool, get_allocation_size(size), self.stream_key(stream))
        block_found = self.get_free_block(params)
        if not block_found:
            # trigger_free_memory_callbacks: no callbacks are registered in a replay
            if self.gc_enabled():
                self.garbage_collect_cached_blocks()
            block_found = self.alloc_block(params, is_retry=False)
            if not block_found and self.release_available_cached_blocks(params):
                block_found = self.alloc_block(params, is_retry=False)
            if not block_found:
                self.release_cached_blocks()
                if self.fix_189504:
                    block_found = self.get_free_block(params)
                if not block_found:
                    block_found = self.alloc_block(params, is_retry=True)
        if not block_found:
            self.num_ooms += 1
            return None
        return self.alloc_found_block(params, orig_size)

    # ---- set_per_process_memory_fraction (docs/models/torch.md rule 10) -------------------
    def set_memory_fraction(self, fraction: float | None) -> None:
        """``setMemoryFraction``: the allowed memory is ``int(fraction * total memory)``, none at 1.0.

        Without ``-O per_process_memory_fraction`` the device's cap stands for it (`allowed_memory_maximum`).
        A replay that reads the cap's exact value tells the context (``pin``): a fraction taken of the cap,
        or a GC threshold, which compares reserved with it."""
        self.fraction_given = fraction is not None
        self.fraction_limit = None
        if self.fraction_given and fraction < 1.0:
            if self.total_memory is None:
                raise UsageError("per_process_memory_fraction needs a device capacity (--capacity)")
            self.fraction_limit = int(fraction * self.total_memory)
            if self.ctx.capacity is None:
                self.ctx.pin()
        if not self.fraction_given and (self.garbage_collection_threshold or 0.0) > 0.0:
            self.ctx.pin()

    def allowed_memory_maximum(self) -> int | None:
        """The bytes ``alloc_block`` may reserve, or None: the fraction's, else the device's cap below its memory
        (read at each use: a SET_LIMIT event changes the cap mid-run)."""
        if self.fraction_given:
            return self.fraction_limit
        cap, capacity = self.ctx.cap, self.ctx.capacity
        if cap is None or (capacity is not None and cap >= capacity):
            return None
        return cap

    def gc_enabled(self) -> bool:
        """Garbage collection of cached blocks: a threshold, and an allowed memory in force now."""
        return (self.garbage_collection_threshold or 0.0) > 0.0 and self.allowed_memory_maximum() is not None

    def get_pool(self, size: int) -> BlockPool:
        return self.small_blocks if size <= kSmallSize else self.large_blocks

    def get_free_block(self, p: AllocParams) -> bool:
        """The smallest free block of the stream that holds ``p.size``, unless the oversize rules say no."""
        pool = p.pool
        if self.gc_enabled():
            pool.get_free_blocks_call_count += 1
        i = pool.blocks.bisect_key_left(p.search_key)
        if i == len(pool.blocks) or pool.blocks[i].stream != p.stream:
            return False
        if pool.blocks[i].expandable_segment is not None and self.expandable_segments:
            # best fit counts a block with the unmapped space after it: take the one that grows least
            while (pool.blocks[i].expandable_segment is not None and i + 1 < len(pool.blocks)
                   and pool.blocks[i + 1].stream == p.stream
                   and expandable_size(pool.blocks[i + 1]) < expandable_size(pool.blocks[i])):
                i += 1
        block = pool.blocks[i]
        # Do not return an oversized block for a large request
        if p.size < self.max_split_size and block.size >= self.max_split_size:
            return False
        # Do not return an oversized block for a large request
        if p.size >= self.max_split_size and block.size >= p.size + self.max_non_split_rounding:
            return False
        pool.blocks.remove(block)
        p.block = block
        return True

    def alloc_block(self, p: AllocParams, is_retry: bool) -> bool:
        """A new segment of ``p.alloc_size`` bytes from the device."""
        size = p.alloc_size
        if is_retry:
            self.num_alloc_retries += 1
        need = self.total_allocated_memory + size
        allowed = self.allowed_memory_maximum()
        if not self.fraction_given:
            self.ctx.note(need, allowed is None or need <= allowed)     # what a cap of another value would do
        if allowed is not None and need > allowed:
            return False
        if self.expandable_segments:
            p.block = self.try_allocate_expandable_block(p.stream, p.pool, p.size)
            return p.block is not None
        ptr = self.ctx.malloc(size)
        if ptr is None:
            return False
        self.total_allocated_memory += size
        p.block = Block(p.stream, size, p.pool, ptr)
        self.num_device_alloc += 1
        self.segment_current += 1
        self.segment_allocated += 1
        self.segment_log.append((SEGMENT_ALLOC, size, self.event_index))
        return True

    def should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.pool.is_small or self.expandable_segments:
            return remaining >= kMinBlockSize
        return size < self.max_split_size and remaining > kSmallSize

    def alloc_found_block(self, p: AllocParams, orig_size: int) -> Block:
        """Hand out ``p.block``, first splitting off what it does not need."""
        block = p.block
        already_split = block.is_split()
        if self.should_split(block, p.size):
            remaining = block
            block = Block(p.stream, p.size, p.pool, remaining.ptr, remaining.expandable_segment)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += p.size
            remaining.size -= p.size
            p.pool.insert_into_blocks(remaining)
            if block.expandable_segment is not None:
                pass                        # no inactive split statistics for expandable segments
            elif already_split:
                self.update_inactive_split_bytes(-block.size)
            else:
                self.update_inactive_split_bytes(remaining.size)
        elif already_split and block.expandable_segment is None:
            self.update_inactive_split_bytes(-block.size)
        block.allocated = True
        block.requested_size = orig_size
        self.allocated += block.size
        return block

    def update_inactive_split_bytes(self, delta: int) -> None:
        self.inactive_split_bytes += delta
        self.inactive_split_bytes_peak = max(self.inactive_split_bytes_peak, self.inactive_split_bytes)

    # ---- free ---------------------------------------------------------------------------
    def free(self, block: Block) -> None:
        self._charge(self.costs.pool_free_s)
        block.allocated = False
        self.allocated -= block.size
        self.free_block(block)

    def free_block(self, block: Block) -> None:
        """Merge ``block`` with its free neighbours and put it back in its pool."""
        pool = block.pool
        net_change_inactive_split_size = 0
        for merge_candidate in (block.prev, block.next):
            net_change_inactive_split_size -= self.try_merge_blocks(block, merge_candidate, pool)
        pool.insert_into_blocks(block)
        if block.is_split():
            net_change_inactive_split_size += block.size
        if block.expandable_segment is None:
            self.update_inactive_split_bytes(net_change_inactive_split_size)

    @staticmethod
    def try_merge_blocks(dst: Block, src: Block | None, pool: BlockPool) -> int:
        """Absorb the free neighbour ``src`` into ``dst``; the bytes taken over (0 if none)."""
        if src is None or src.allocated or dst.mapped != src.mapped:
            return 0
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        (pool.blocks if src.mapped else pool.unmapped).remove(src)
        return src.size

    # ---- releasing cached memory --------------------------------------------------------
    def release_block(self, block: Block) -> None:
        """cudaFree a whole cached segment."""
        self.ctx.free(block.ptr, block.size)
        self.total_allocated_memory -= block.size
        block.pool.blocks.remove(block)
        self.num_device_free += 1
        self.segment_current -= 1
        self.segment_log.append((SEGMENT_FREE, block.size, self.event_index))

    def release_available_cached_blocks(self, p: AllocParams) -> bool:
        """Free one cached oversize block that fits the request, else the largest ones until enough is free."""
        if self.max_split_size == SIZE_MAX:
            return False
        blocks = p.pool.blocks
        key_size = max(p.size, self.max_split_size)
        i = blocks.bisect_key_left((p.search_key[0], key_size, 0))
        if i < len(blocks) and blocks[i].stream == p.stream and blocks[i].expandable_segment is None:
            self.release_block(blocks[i])
            return True
        # No single block is large enough; free multiple oversize blocks, starting with the largest
        if i == 0:
            return False
        total_released = 0
        i -= 1                  # the largest block of the stream
        while total_released < key_size and blocks[i].size >= self.max_split_size and blocks[i].stream == p.stream:
            cur = blocks[i]
            is_first = i == 0
            if not is_first:
                i -= 1
            if cur.expandable_segment is None:
                total_released += cur.size
                self.release_block(cur)
            if is_first:
                break
        return total_released >= key_size

    def release_cached_blocks(self) -> None:
        """empty_cache(): free every cached whole segment, large pool first."""
        # synchronize_and_free_events: the trace's frees are complete, so nothing is pending
        self.num_sync_all_streams += 1
        self.cache_flushes += 1
        self.release_blocks(self.large_blocks)
        self.release_blocks(self.small_blocks)

    def release_cache(self) -> None:
        """torch.cuda.empty_cache(): emptyCache -> release_cached_blocks."""
        self.release_cached_blocks()

    def release_blocks(self, pool: BlockPool) -> None:
        """Free the whole cached segments; unmap the free pages of expandable ones."""
        to_unmap = []
        for block in list(pool.blocks):
            if block.expandable_segment is not None:
                to_unmap.append(block)
            elif not block.is_split():
                self.release_block(block)
        for block in to_unmap:
            self.unmap_block(block)
            if not block.is_split():
                self.release_expandable_segment(block)

    def garbage_collect_cached_blocks(self) -> None:
        """Free whole large segments that sat free at least as long as the average, down to the threshold."""
        gc_threshold = int(self.garbage_collection_threshold * self.allowed_memory_maximum())
        if self.total_allocated_memory <= gc_threshold:
            return
        target_size = self.total_allocated_memory - gc_threshold
        gc_reclaimed = 0
        total_age = 0
        freeable_block_count = 0
        for block in self.large_blocks.blocks:
            if not block.is_split():
                total_age += block.gc_count()
                freeable_block_count += 1
        if freeable_block_count == 0:
            return
        block_freed = True
        while gc_reclaimed < target_size and block_freed and freeable_block_count > 0:
            age_threshold = total_age / freeable_block_count
            block_freed = False
            for block in list(self.large_blocks.blocks):
                if not block.is_split() and block.expandable_segment is None and block.gc_count() >= age_threshold:
                    block_freed = True
                    gc_reclaimed += block.size
                    total_age -= block.gc_count()
                    freeable_block_count -= 1
                    self.release_block(block)

    # ---- expandable segments ------------------------------------------------------------
    def find_expandable_block(self, stream: int, pool: BlockPool, size: int) -> Block:
        """The lowest-address free (+ unmapped) run of the stream that holds ``size``, else a new segment."""
        def allocatable(b):
            return b is not None and not b.allocated

        def has_available_address_space(b):
            room = 0
            while room < size and allocatable(b):
                room += b.size
                b = b.next
            return room >= size

        for candidate in pool.unmapped.irange_key((self.stream_key(stream), 0)):
            if candidate.stream != stream:
                break
            if allocatable(candidate.prev):      # a free block just before the unmapped range
                candidate = candidate.prev
            if has_available_address_space(candidate):
                return candidate
        segment_size = kSmallBuffer if pool.is_small else kLargeBuffer
        total = self.ctx.capacity or (1 << 44)      # the device's memory, not a cap (torch's total_memory)
        va_size = -(-(total + total // 8) // segment_size) * segment_size
        es = ExpandableSegment(self.ctx.reserve_address_range(va_size), va_size, segment_size)
        self.expandable_segments_.append(es)
        candidate = Block(stream, es.size, pool, es.ptr, es)
        candidate.mapped = False
        pool.unmapped.add(candidate)
        return candidate

    def try_allocate_expandable_block(self, stream: int, pool: BlockPool, size: int) -> Block | None:
        candidate = self.find_expandable_block(stream, pool, size)
        # candidate: unmapped -> ..., or free -> unmapped -> ...
        if not candidate.mapped and not self.map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            # free -> unmapped: map some of the unmapped range, which merges into the free block
            remaining = size - candidate.size
            new_candidate = candidate.next
            if not self.map_block(new_candidate, min(remaining, new_candidate.size)):
                return None
            candidate = new_candidate
        pool.blocks.remove(candidate)
        return candidate

    def map_block(self, to_map: Block, size: int) -> bool:
        """Map the pages under the first ``size`` bytes of unmapped ``to_map``; merge it with free neighbours."""
        ptr, mapped_size = to_map.expandable_segment.map_range(to_map.ptr, size)
        if not self.ctx.fits(mapped_size):
            return False
        self.ctx.map(mapped_size)
        pool = to_map.pool
        pool.unmapped.remove(to_map)
        to_map.mapped = True
        if mapped_size < to_map.size:
            remaining = Block(to_map.stream, to_map.size - mapped_size, pool, to_map.ptr + mapped_size,
                              to_map.expandable_segment)
            remaining.mapped = False
            splice(remaining, to_map, to_map.next)
            pool.unmapped.add(remaining)
            to_map.size = mapped_size
        self.try_merge_blocks(to_map, to_map.prev, pool)
        self.try_merge_blocks(to_map, to_map.next, pool)
        pool.insert_into_blocks(to_map)
        self.total_allocated_memory += mapped_size
        self.num_device_alloc += 1
        self.segment_log.append((SEGMENT_MAP, mapped_size, self.event_index))
        return True

    def unmap_block(self, block: Block) -> None:
        """Unmap the whole pages inside free ``block``; the partial pages at its ends stay mapped and free."""
        ptr, size = block.expandable_segment.unmap_range(block.ptr, block.size)
        if size == 0:
            return
        pool = block.pool
        pool.blocks.remove(block)
        before_size = ptr - block.ptr
        if before_size > 0:
            before_free = Block(block.stream, before_size, pool, block.ptr, block.expandable_segment)
            splice(before_free, block.prev, block)
            pool.insert_into_blocks(before_free)
        after_size = block.size - (before_size + size)
        if after_size > 0:
            after_free = Block(block.stream, after_size, pool, ptr + size, block.expandable_segment)
            splice(after_free, block, block.next)
            pool.insert_into_blocks(after_free)
        block.ptr, block.size, block.mapped = ptr, size, False
        self.try_merge_blocks(block, block.prev, pool)
        self.try_merge_blocks(block, block.next, pool)
        pool.unmapped.add(block)
        self.ctx.free(ptr, size)
        self.total_allocated_memory -= size
        self.num_device_free += 1
        self.segment_log.append((SEGMENT_UNMAP, size, self.event_index))

    def release_expandable_segment(self, block: Block) -> None:
        """Forget a segment that is wholly unmapped again."""
        self.expandable_segments_.remove(block.expandable_segment)
        block.pool.unmapped.remove(block)

    # ---- reporting ----------------------------------------------------------------------
    def block(self, handle: Block):
        return handle.ptr, handle.size

    def largest_free(self) -> int:
        return max((b.size for pool in (self.small_blocks, self.large_blocks) for b in pool.blocks), default=0)

    def counters(self) -> dict:
        return {
            "num_device_alloc": self.num_device_alloc, "num_device_free": self.num_device_free,
            "num_alloc_retries": self.num_alloc_retries, "num_ooms": self.num_ooms,
            "num_sync_all_streams": self.num_sync_all_streams, "cache_flushes": self.cache_flushes,
            "inactive_split_bytes_peak": self.inactive_split_bytes_peak,
        } | ({} if self.expandable_segments else {      # as the fast model: PyTorch counts no expandable segment
            "segment_current": self.segment_current, "segment_allocated": self.segment_allocated})
