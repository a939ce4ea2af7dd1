# What Cython reads beside torch.py in the compiled build (docs/architecture.md, "The compiled build"): the
# block and pool records as C structs; torch.py stays the definition (its @cython decorators type the fused
# loop's locals); interpreted, this is not read.

from allocsim.policies._sorted cimport (drop_item, drop_key, file_key, first_at_least, key_place, put_item, put_word,
                                       word_place)
from allocsim.policies._latency cimport add_latency


cdef class KeyField:
    cdef public long long lo, abits, fit, low, high

cdef class BlockPool:
    cdef public bint small
    cdef public object stream, owner
    cdef public KeyField field
    cdef public object keys
    cdef public list blocks, unmapped
    cdef public dict unmapped_blocks

cdef class Block:
    cdef public long long ptr, size, requested, gc_base
    cdef public BlockPool pool
    cdef public bint allocated, mapped
    cdef public Block prev, next
    cdef public object es

cdef bint COMPILED

cdef object _key(KeyField f, long long size, long long ptr)
