# What Cython reads beside torch.py in the compiled build (docs/architecture.md, "The compiled build"): the
# block and pool records as C structs; torch.py stays the definition (its @cython decorators type the fused
# loop's locals); interpreted, this is not read.

from cpython.long cimport PyLong_AsLongLongAndOverflow
from allocsim.policies._sorted cimport first_at_least, file_key


cdef inline Py_ssize_t seek_word(list keys, long long key) except -1:
    """``first_at_least`` for a key below 2**63, made in C and never boxed: each key of the list is read as a
    machine word (one past it, a wide key, is above ``key``)."""
    cdef Py_ssize_t lo = 0, hi = len(keys), mid
    cdef int over
    while lo < hi:
        mid = (lo + hi) >> 1
        if PyLong_AsLongLongAndOverflow(keys[mid], &over) < key and not over:
            lo = mid + 1
        else:
            hi = mid
    return lo

cdef class KeyField:
    cdef public long long lo, abits, fit, low, high

cdef class BlockPool:
    cdef public bint small
    cdef public object stream, owner
    cdef public KeyField field
    cdef public list keys, blocks, unmapped
    cdef public dict unmapped_blocks

cdef class Block:
    cdef public long long ptr, size, requested, gc_base
    cdef public BlockPool pool
    cdef public bint allocated, mapped
    cdef public Block prev, next
    cdef public object es

cdef object _key(KeyField f, long long size, long long ptr)
