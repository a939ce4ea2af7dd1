# What Cython reads beside repeats.py in the compiled build (docs/architecture.md, "The compiled build"):
# repeats.py stays the definition; interpreted, this is not read. The records are C words read through typed
# memoryviews, the constants C words.

from libc.math cimport floor

cdef unsigned long long K_KIND, K_SIZE, K_STREAM, K_GAP, K_PLACE, K_MIX, WORD
cdef int K_SHIFT

cpdef Py_ssize_t repeating(const unsigned long long[:, ::1] words, Py_ssize_t end, Py_ssize_t R,
                           unsigned long long D, Py_ssize_t stop) except? -1

cpdef int signatures(const unsigned long long[:, ::1] words, const unsigned char[::1] folded, Py_ssize_t lo,
                     Py_ssize_t hi, Py_ssize_t step, unsigned long long allocs,
                     unsigned long long[:, ::1] sig) except -1

cpdef bint repeating_table(const unsigned long long[:, :] rows, Py_ssize_t most, unsigned char[::1] out,
                           bint first) except -1

cpdef tuple window(const unsigned long long[:, ::1] words, const unsigned char[::1] folded, Py_ssize_t lo,
                   Py_ssize_t R, Py_ssize_t windows, long long live_max, unsigned char[::1] shifted,
                   long long[::1] older, long long[::1] old)

cpdef bint units(const double[::1] incs, double u, double[::1] out) except -1

cpdef bint same(const unsigned long long[:, ::1] words, Py_ssize_t lo, Py_ssize_t base,
                const unsigned char[::1] mode, long long shift) except -1
