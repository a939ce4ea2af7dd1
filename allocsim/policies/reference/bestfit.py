"""`bestfit-ref`: the best-fit baseline, written to be read.

The reference model of `bestfit` (rules in docs/models/bestfit-oracle.md):

- a request is rounded up to 512 B; the smallest free block that holds it is taken,
  ties to the lowest address, and its tail stays free;
- a miss takes a new segment from the device: ``segment`` bytes, or the request
  rounded up to a multiple of that; the segment's tail is free for others;
- a freed block merges at once with the free blocks just before and after it in
  the same segment; with ``release=true`` a block that is then its whole segment
  goes back to the device;
- when the device refuses a segment: release every wholly free segment (a cache
  flush) and ask again; under the ``gc`` runtime, then a full collection, one more
  best fit and one more segment; then OOM.

Free blocks are kept twice, plainly: by (size, address) for best fit and by address
for the neighbours. A handle is the tuple (address, size).
"""
from __future__ import annotations

from sortedcontainers import SortedDict, SortedList

from ...errors import UsageError
from ..base import Policy
from ..bestfit import BestFit
from ..registry import reference_of


def round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


@reference_of(BestFit)
class BestFitReference(Policy):
    summary = "the best-fit baseline over two plain sorted containers (slow)"
    models = BestFit.models

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        if not self.segment or self.segment % 512:
            raise UsageError(f"policy {self.name!r} option segment: expected a positive multiple of 512 bytes, "
                             f"got {self.segment!r}")
        self.by_size = SortedList()             # (size, address) of every free block
        self.by_address = SortedDict()          # address -> size of every free block
        self.segments: dict[int, int] = {}      # address -> size, in the order they were made
        self.flushes = 0

    # ---- free blocks ----------------------------------------------------------------------
    def add_free(self, address: int, size: int) -> None:
        self.by_size.add((size, address))
        self.by_address[address] = size

    def remove_free(self, address: int) -> int:
        size = self.by_address.pop(address)
        self.by_size.remove((size, address))
        return size

    def best_fit(self, n: int) -> int | None:
        """Take ``n`` bytes from the smallest free block that holds them (lowest address on ties)."""
        i = self.by_size.bisect_left((n, 0))
        if i == len(self.by_size):
            return None
        size, address = self.by_size[i]
        self.remove_free(address)
        if size > n:
            self.add_free(address + n, size - n)
        return address

    # ---- malloc ---------------------------------------------------------------------------
    def malloc(self, req: int, stream: int):
        n = round_up(req, 512)
        self.ctx.charge(self.costs.pool_hit_s)
        address = self.best_fit(n)
        if address is None:
            address = self.grow(n)
            if address is None:
                return None
        self.allocated += n
        return address, n

    def new_segment(self, n: int) -> int | None:
        size = round_up(n, self.segment)
        address = self.ctx.malloc(size)
        if address is None:
            return None
        self.segments[address] = size
        if size > n:
            self.add_free(address + n, size - n)
        return address

    def grow(self, n: int) -> int | None:
        """A new segment for ``n`` bytes; on refusal a cache flush, then (gc runtime) a collection."""
        address = self.new_segment(n)
        if address is not None:
            return address
        self.flushes += 1
        self.release_free_segments()
        address = self.new_segment(n)
        if address is not None or self.ctx.eager:
            return address
        self.ctx.collect(True)
        address = self.best_fit(n)
        if address is not None:
            return address
        return self.new_segment(n)

    def release_cache(self) -> None:
        self.release_free_segments()

    def release_free_segments(self) -> None:
        for address, size in list(self.segments.items()):
            if self.by_address.get(address) == size:
                self.remove_free(address)
                self.release_segment(address, size)

    def release_segment(self, address: int, size: int) -> None:
        del self.segments[address]
        self.ctx.free(address, size)

    # ---- free -----------------------------------------------------------------------------
    def free(self, handle) -> None:
        address, size = handle
        self.allocated -= size
        self.ctx.charge(self.costs.pool_free_s)
        before = self.free_block_ending_at(address)
        if before is not None and address not in self.segments:     # same segment
            size += self.remove_free(before)
            address = before
        end = address + size
        if end in self.by_address and end not in self.segments:     # same segment
            size += self.remove_free(end)
        if self.release and self.segments.get(address) == size:
            self.release_segment(address, size)
            return
        self.add_free(address, size)

    def free_block_ending_at(self, address: int) -> int | None:
        i = self.by_address.bisect_left(address)
        if i == 0:
            return None
        start, size = self.by_address.peekitem(i - 1)
        return start if start + size == address else None

    # ---- reporting ------------------------------------------------------------------------
    def block(self, handle):
        return handle

    def largest_free(self) -> int:
        return self.by_size[-1][0] if self.by_size else 0

    def free_blocks(self) -> list[tuple[int, int]]:
        """``(address, size)`` of every free block, by address (tests)."""
        return list(self.by_address.items())

    def counters(self) -> dict:
        return {"cache_flushes": self.flushes, "segments": len(self.segments), "free_blocks": len(self.by_address)}
