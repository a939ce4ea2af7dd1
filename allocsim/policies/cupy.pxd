# The C layout of cupy.py's records in the compiled build (docs/architecture.md, "The compiled build"):
# Cython reads this beside cupy.py, which stays the definition; interpreted, it is not read.

from allocsim.policies._sorted cimport drop_key, key_place, move_item, move_key, put_item, put_key, word_place
from allocsim.policies._latency cimport add_latency

cdef bint COMPILED

cdef class _Arena

cdef class _Chunk:
    cdef public long long ptr, size, seq
    cdef public _Chunk prev, next
    cdef public _Arena arena
    cdef public object key

cdef class _Arena:
    cdef public object keys
    cdef public list chunks
    cdef public bint words

cdef class _FreeIndex:
    cdef public bint lifo
    cdef public long long lo, hi, fit, filed
    cdef public int abits, shift
    cdef public object tie
    cdef public list spare
    cpdef key(self, size, ptr, _Arena arena)
