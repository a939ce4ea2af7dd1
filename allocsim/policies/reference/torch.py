"""`torch-ref`: PyTorch's CUDA caching allocator (native backend), written to be read.

The reference model of `torch` (rules in docs/models/torch.md). It follows
CUDACachingAllocator.cpp function by function and keeps its names:

    malloc
      round_size, get_pool, get_allocation_size
      get_free_block                             best fit; the oversize rules of max_split_size
      trigger_free_memory_callbacks              none are registered in a replay
      garbage_collect_cached_blocks              only with a memory fraction and a GC threshold
      alloc_block
      release_available_cached_blocks + alloc_block
      release_cached_blocks + alloc_block (retry)
      alloc_found_block                          should_split, split off the remainder
    free -> free_block -> try_merge_blocks

Free blocks live in two `BlockPool`s (small: rounded size <= 1 MiB, large), each one
sorted set ordered by (stream, size, address) as PyTorch's ``BlockPool::blocks``; the
stream is ordered by its recorded ``cudaStream_t`` value. A block's ``prev``/``next``
are its address neighbours inside its segment.

It supports every option of `torch` except ``expandable_segments``, which it refuses.
A trace's FREE is PyTorch's ``free_completed``, so no block ever waits on events.
"""
from __future__ import annotations

from sortedcontainers import SortedKeyList

from ...errors import UsageError
from ...trace.events import SEGMENT_ALLOC, SEGMENT_FREE
from ..base import Policy
from ..torch import (K_MIN_BLOCK, K_SMALL_SIZE, NO_DIVISIONS, SIZE_MAX, MiB, TorchCachingAllocator, _divisions,
                     get_allocation_size, options_in_force, round_size)
from . import reference_of


class Block:
    """A piece of a segment."""

    def __init__(self, stream: int, size: int, pool: "BlockPool", ptr: int):
        self.stream = stream
        self.size = size
        self.pool = pool
        self.ptr = ptr
        self.allocated = False
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
    """The free blocks of one pool, all streams, ordered by (stream, size, address)."""

    def __init__(self, is_small: bool, stream_order):
        self.is_small = is_small
        self.blocks = SortedKeyList(key=lambda b: (stream_order(b.stream), b.size, b.ptr))
        self.get_free_blocks_call_count = 0

    def insert_into_blocks(self, block: Block) -> None:
        block.gc_count_base = self.get_free_blocks_call_count
        self.blocks.add(block)


class AllocParams:
    """One request: its stream, rounded size, pool, segment size, and the block found for it."""

    def __init__(self, stream: int, size: int, pool: BlockPool, alloc_size: int, stream_key):
        self.stream = stream
        self.size = size
        self.pool = pool
        self.alloc_size = alloc_size
        self.search_key = (stream_key, size, 0)
        self.block: Block | None = None


@reference_of(TorchCachingAllocator)
class TorchCachingAllocatorReference(Policy):
    summary = "PyTorch's CUDACachingAllocator function by function, plain data (slow)"
    models = TorchCachingAllocator.models
    wants_event_index = True

    def __init__(self, device, runtime, sections, options: dict | None = None, trace=None):
        super().__init__(device, runtime, sections, options_in_force(options, trace), trace=trace)
        if self.expandable_segments:
            raise UsageError(f"policy {self.name!r} does not model expandable_segments (use --policy torch)")
        # CUDAAllocatorConfig
        self.max_split_size = SIZE_MAX if self.max_split_size_mb is None else self.max_split_size_mb * MiB
        self.max_non_split_rounding = (self.max_non_split_rounding_mb or 20) * MiB
        divisions = self.roundup_power2_divisions
        self.divisions = NO_DIVISIONS if divisions is None else _divisions(divisions)
        # set_per_process_memory_fraction
        self.set_fraction = self.per_process_memory_fraction is not None
        self.allowed_memory_maximum = SIZE_MAX
        if self.set_fraction:
            total = device.capacity if device.capacity is not None else device.cap
            if total is None:
                raise UsageError("per_process_memory_fraction needs a device capacity (--capacity)")
            self.allowed_memory_maximum = int(self.per_process_memory_fraction * total)
        self.gc_enabled = self.set_fraction and (self.garbage_collection_threshold or 0.0) > 0.0
        streams = list(trace.streams) if trace is not None else []
        self.stream_key = lambda s: (streams[s] if s < len(streams) else s, s)     # cudaStream_t order
        self.large_blocks = BlockPool(False, self.stream_key)
        self.small_blocks = BlockPool(True, self.stream_key)
        self.total_allocated_memory = 0
        self.event_index = -1
        self.segment_log: list[tuple[int, int, int]] = []
        self.num_device_alloc = self.num_device_free = 0
        self.num_alloc_retries = self.num_ooms = self.num_sync_all_streams = self.cache_flushes = 0
        self.segment_current = self.segment_allocated = 0
        self.inactive_split_bytes = self.inactive_split_bytes_peak = 0

    # ---- malloc -------------------------------------------------------------------------
    def malloc(self, orig_size: int, stream: int):
        self.device.clock += self.costs.pool_hit_s
        size = round_size(orig_size, self.divisions)
        pool = self.get_pool(size)
        params = AllocParams(stream, size, pool, get_allocation_size(size), self.stream_key(stream))
        block_found = self.get_free_block(params)
        if not block_found:
            # trigger_free_memory_callbacks: no callbacks are registered in a replay
            if self.gc_enabled:
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

    def get_pool(self, size: int) -> BlockPool:
        return self.small_blocks if size <= K_SMALL_SIZE else self.large_blocks

    def get_free_block(self, p: AllocParams) -> bool:
        """The smallest free block of the stream that holds ``p.size``, unless the oversize rules say no."""
        pool = p.pool
        if self.gc_enabled:
            pool.get_free_blocks_call_count += 1
        i = pool.blocks.bisect_key_left(p.search_key)
        if i == len(pool.blocks) or pool.blocks[i].stream != p.stream:
            return False
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
        if self.set_fraction and self.total_allocated_memory + size > self.allowed_memory_maximum:
            return False
        ptr = self.device.malloc(size)
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
        if block.pool.is_small:
            return remaining >= K_MIN_BLOCK
        return size < self.max_split_size and remaining > K_SMALL_SIZE

    def alloc_found_block(self, p: AllocParams, orig_size: int) -> Block:
        """Hand out ``p.block``, first splitting off what it does not need."""
        block = p.block
        already_split = block.is_split()
        if self.should_split(block, p.size):
            remaining = block
            block = Block(p.stream, p.size, p.pool, remaining.ptr)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.ptr += p.size
            remaining.size -= p.size
            p.pool.insert_into_blocks(remaining)
            if already_split:
                self.update_inactive_split_bytes(-block.size)
            else:
                self.update_inactive_split_bytes(remaining.size)
        elif already_split:
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
        self.device.clock += self.costs.pool_free_s
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
        self.update_inactive_split_bytes(net_change_inactive_split_size)

    @staticmethod
    def try_merge_blocks(dst: Block, src: Block | None, pool: BlockPool) -> int:
        """Absorb the free neighbour ``src`` into ``dst``; the bytes taken over (0 if none)."""
        if src is None or src.allocated:
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
        pool.blocks.remove(src)
        return src.size

    # ---- releasing cached memory --------------------------------------------------------
    def release_block(self, block: Block) -> None:
        """cudaFree a whole cached segment."""
        self.device.free(block.ptr, block.size)
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
        if i < len(blocks) and blocks[i].stream == p.stream:
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

    def release_blocks(self, pool: BlockPool) -> None:
        for block in list(pool.blocks):
            if not block.is_split():
                self.release_block(block)

    def garbage_collect_cached_blocks(self) -> None:
        """Free whole large segments that sat free at least as long as the average, down to the threshold."""
        gc_threshold = int(self.garbage_collection_threshold * self.allowed_memory_maximum)
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
                if not block.is_split() and block.gc_count() >= age_threshold:
                    block_freed = True
                    gc_reclaimed += block.size
                    total_age -= block.gc_count()
                    freeable_block_count -= 1
                    self.release_block(block)

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
            "segment_current": self.segment_current, "segment_allocated": self.segment_allocated,
            "inactive_split_bytes_peak": self.inactive_split_bytes_peak,
        }
