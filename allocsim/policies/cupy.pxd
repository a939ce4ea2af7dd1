# The C layout of cupy.py's records in the compiled build (docs/architecture.md, "The compiled build"):
# Cython reads this beside cupy.py, which stays the definition; interpreted, it is not read.

from allocsim.policies._sorted cimport first_at_least, first_at_least_word, file_key
from allocsim.policies._latency cimport add_latency

cdef class _Chunk:
    cdef public long long ptr, size
    cdef public object prev, next, arena, key

cdef class _Arena:
    cdef public list keys
    cdef public dict by_key

cdef class _FreeIndex:
    cdef public bint lifo
    cdef public long long lo, hi, fit
    cdef public int abits, shift
    cdef public object tie
    cdef public list spare
    cpdef key(self, size, ptr)
