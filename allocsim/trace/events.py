"""The event model: kinds, flags and the fixed-width record layout.

Driving events (`ALLOC`, `FREE`) drive a replay, and so do the pressure events
(`PRESSURE`: a recorded `OOM` is attempted again, `CACHE_RELEASE` and `SET_LIMIT`
reach the policy and the device). The others record what the traced program's own
allocator and runtime did, for validation and plots.
"""
from __future__ import annotations

import struct

import numpy as np

ALLOC = 1            # id, size (requested bytes), stream, addr (original pointer, 0 unknown), site
FREE = 2             # id (of the ALLOC it ends); for PyTorch this is free_completed
SEGMENT_ALLOC = 3    # upstream device allocation by the recorded allocator: addr, size, stream
SEGMENT_FREE = 4     # upstream release: addr, size, stream
SEGMENT_MAP = 5      # expandable segments: pages mapped at addr, size bytes
SEGMENT_UNMAP = 6    # expandable segments: pages unmapped
GC = 7               # the program ran a collection; aux = 0 incremental, 1 full
OOM = 8              # the recorded allocator raised OOM: size = request, addr = device free bytes
MARK = 9             # iteration boundary or user label; aux = index into the label table
FREE_REQUESTED = 10  # PyTorch free_requested (informational; FREE is free_completed): id
CACHE_RELEASE = 11   # the program released its allocator's cache: aux 0 torch.cuda.empty_cache(),
                     # aux 1 CuPy MemoryPool.free_all_blocks() (stream = the stream it named, else 0)
SET_LIMIT = 12       # the program set its allocator's limit: size = allowed bytes (0 = no limit); aux 0 torch
                     # set_per_process_memory_fraction (addr = the fraction's float64 bits), aux 1 CuPy set_limit
# PyTorch private memory pools (CUDA graphs, torch.compile's CUDA graph trees, torch.cuda.MemPool); aux = the
# pool's number in the trace (1, 2, ... in order of first appearance), addr = its MempoolId_t (first << 32 | second)
POOL_BEGIN = 13      # allocations start going to the pool (beginAllocateToPool; the pool is made or gains a user):
                     # stream = the stream routed; flags POOL_CAPTURE (a graph capture on that stream) or
                     # POOL_ANY_STREAM (use_mem_pool, graph trees: the thread's allocations, every stream)
POOL_END = 14        # the pool's latest begin ends (endAllocateToPool)
POOL_RETAIN = 15     # the pool is made or gains a user without routing (a torch.cuda.MemPool is constructed)
POOL_RELEASE = 16    # the pool loses a user (releasePool: a graph reset or deleted, use_mem_pool left, a MemPool
                     # deleted); at no users left its free segments go at the next cache release; flags
                     # POOL_EMPTY: that release of the pool's own cache follows at once (MemPool's destructor)
GRAPH_REPLAY = 17    # informational: a captured graph was replayed (aux = its pool; it allocates nothing)
# Scopes (version 3): what the program was doing, nested, each END closing the innermost open BEGIN of its pair;
# aux = index into the label table naming the scope, size = the scope's serial number in the trace (1, 2, ...), the
# same on its BEGIN and END. A trace cut short may leave scopes open.
TRY_BEGIN = 18       # the program enters code that catches an OOM raised inside it and goes on (inductor's autotuning,
                     # cuDNN's workspace tries, `allocsim.tries()`): label = who catches ("inductor autotune", ...)
TRY_END = 19         # that code is left (normally or by the caught exception)
PHASE_BEGIN = 20     # a phase of the run begins: label = its name ("compile", "autotune", "eval", "checkpoint", ...)
PHASE_END = 21       # the innermost open phase ends

KIND_NAMES = {
    ALLOC: "ALLOC", FREE: "FREE", SEGMENT_ALLOC: "SEGMENT_ALLOC", SEGMENT_FREE: "SEGMENT_FREE",
    SEGMENT_MAP: "SEGMENT_MAP", SEGMENT_UNMAP: "SEGMENT_UNMAP", GC: "GC", OOM: "OOM",
    MARK: "MARK", FREE_REQUESTED: "FREE_REQUESTED", CACHE_RELEASE: "CACHE_RELEASE", SET_LIMIT: "SET_LIMIT",
    POOL_BEGIN: "POOL_BEGIN", POOL_END: "POOL_END", POOL_RETAIN: "POOL_RETAIN", POOL_RELEASE: "POOL_RELEASE",
    GRAPH_REPLAY: "GRAPH_REPLAY", TRY_BEGIN: "TRY_BEGIN", TRY_END: "TRY_END", PHASE_BEGIN: "PHASE_BEGIN",
    PHASE_END: "PHASE_END",
}
KINDS_BY_NAME = {v: k for k, v in KIND_NAMES.items()}
DRIVING = (ALLOC, FREE)
#: What the program did to its allocator under pressure: the replay's walk drives these too
#: (a recorded OOM is attempted again, a cache release and a limit reach the policy and device).
PRESSURE = (OOM, CACHE_RELEASE, SET_LIMIT)
#: Where a private pool's allocations go and when its memory may be released: the walk hands these to the
#: policy (`Policy.pool_event`); a trace holding any takes the plain walk.
POOL = (POOL_BEGIN, POOL_END, POOL_RETAIN, POOL_RELEASE)
#: The scope kinds (version 3): BEGIN -> its END.
SCOPES = {TRY_BEGIN: TRY_END, PHASE_BEGIN: PHASE_END}
SCOPE_KINDS = (TRY_BEGIN, TRY_END, PHASE_BEGIN, PHASE_END)

#: ``aux`` of CACHE_RELEASE and SET_LIMIT: the framework whose call the program made.
TORCH_AUX = 0
CUPY_AUX = 1


def kind_table(kinds) -> np.ndarray:
    """A table by kind (the kinds are bytes) that is True at ``kinds``: ``kind_table(K).take(kinds_column)`` tells
    which records are of those kinds, about five times faster than ``np.isin`` (a pass a kind, or a sort)."""
    table = np.zeros(256, bool)
    table[list(kinds)] = True
    return table


def fraction_bits(fraction: float) -> int:
    """A memory fraction as the integer holding its IEEE-754 float64 bits (a torch SET_LIMIT's ``addr``)."""
    return struct.unpack("<Q", struct.pack("<d", float(fraction)))[0]


def bits_fraction(bits: int) -> float:
    """The memory fraction a torch SET_LIMIT's ``addr`` holds (`fraction_bits` undone)."""
    return struct.unpack("<d", struct.pack("<Q", int(bits)))[0]


# flags
PRE_EXISTING = 1     # ALLOC synthesised at t=0 for a block live before the trace began
FAILED = 2           # ALLOC that failed in the recorded run (it has no FREE)
PRIVATE_POOL = 4     # SEGMENT_*: the segment belongs to a CUDA graph private pool (torch.cuda.graph, ...)
POOL_CAPTURE = 8     # POOL_BEGIN: a CUDA graph capture (the allocations of the capturing stream)
POOL_ANY_STREAM = 16 # POOL_BEGIN: every stream's allocations (the filter is the calling thread)
POOL_EMPTY = 32      # POOL_RELEASE: the pool's own cache is released right after (torch.cuda.MemPool deleted)
IN_REQUEST = 64      # FREE: made inside the request of the next ALLOC or OOM, after its best-fit lookup (CuPy: the
                     # arrays a gc.collect() on the pool's limit or OOM path collected); aux = which collection of
                     # that request it came from (1, 2, ...), 0 none
CATCHES_OOM = 128    # ALLOC made on a path that catches an OOM from it and goes on without it (a cuDNN
                     # workspace try; docs/allocator-dependent.md): failing under a cap, it is a caught OOM


def pool_id_bits(mempool_id) -> int:
    """A PyTorch ``MempoolId_t`` ``(first, second)`` as one integer (a pool event's ``addr``)."""
    first, second = (int(x) for x in mempool_id)
    return (first << 32) | second

NO_SITE = 0xFFFFFFFF
NO_ID = 0xFFFFFFFF

#: Largest size a single event may carry (1 PiB). Anything larger is a corrupt trace.
MAX_SIZE = 2**50

#: One record, 40 bytes, little-endian; `numpy.memmap` reads the records region directly.
RECORD_DTYPE = np.dtype([
    ("kind", "<u1"),
    ("flags", "<u1"),
    ("stream", "<u2"),   # index into the stream table (footer); 0 is the first stream seen
    ("id", "<u4"),       # dense object id (ALLOC/FREE/FREE_REQUESTED), else NO_ID
    ("site", "<u4"),     # index into the call-site table, NO_SITE if none
    ("aux", "<u4"),      # kind-specific: GC full flag, MARK label index
    ("size", "<u8"),     # requested bytes (ALLOC), segment bytes, OOM request
    ("time_ns", "<u8"),  # nanoseconds since the start of the trace
    ("addr", "<u8"),     # original address where known, else 0; OOM: device free bytes
])
assert RECORD_DTYPE.itemsize == 40
