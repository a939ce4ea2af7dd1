# The compiled build's `first_at_least` and `file_key` (see _sorted.py, whose bisect-module functions they
# equal): C loops over a list of Python ints, inlined where a compiled policy cimports them. Where the key is
# within 63 bits, each step compares C numbers (a list's int read as one, an int past 63 bits counting as
# larger or smaller by its sign), not two Python ints through a generic comparison.

from cpython.array cimport array, resize_smart
from cpython.object cimport Py_SIZE
from libc.string cimport memmove

cdef extern from *:
    """
    /* keys[i] < k for a list of Python ints and a C key: CPython 3.11's int read in C where it has at most
       three 30-bit digits and is below 2**63 (a non-negative key within 63 bits), else through the C API. */
    static CYTHON_INLINE int allocsim_below(PyObject *keys, Py_ssize_t i, long long k) {
        PyObject *o = PyList_GET_ITEM(keys, i);
    #if PY_VERSION_HEX < 0x030C0000 && PyLong_SHIFT == 30
        const digit *d = ((PyLongObject *)o)->ob_digit;
        switch (Py_SIZE(o)) {
        case 0: return 0 < k;
        case 1: return (long long)d[0] < k;
        case 2: return ((long long)d[1] << 30 | d[0]) < k;
        case 3: if (d[2] < 8) return (((long long)d[2] << 30 | d[1]) << 30 | d[0]) < k; return 0;
        default: break;
        }
    #endif
        {
            int over;
            long long v = PyLong_AsLongLongAndOverflow(o, &over);
            return over < 0 || (over == 0 && v < k);
        }
    }
    """
    bint allocsim_below(list keys, Py_ssize_t i, long long k)
    long long PyLong_AsLongLongAndOverflow(object key, int *overflow) except? -1


cdef inline Py_ssize_t first_at_least_word(list keys, long long key) noexcept:
    """Where the C number ``key`` goes in the sorted ``keys`` (``bisect_left``)."""
    cdef Py_ssize_t lo = 0, hi = len(keys), mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if allocsim_below(keys, mid, key):
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline Py_ssize_t first_at_least(list keys, object key) except -1:
    """Where ``key`` goes in the sorted ``keys`` (``bisect_left``)."""
    cdef Py_ssize_t lo = 0, hi = len(keys), mid
    cdef int over = 0
    cdef long long k = PyLong_AsLongLongAndOverflow(key, &over)
    if over == 0:
        return first_at_least_word(keys, k)
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline int file_key(list keys, object key) except -1:
    """Insert ``key``, which no key in the sorted ``keys`` equals (``insort``)."""
    keys.insert(first_at_least(keys, key), key)
    return 0


# A sorted column of C words (an array('q'), see _sorted.py's `words_first_at_least`): its C buffer searched,
# read and moved in place; the array never shares its buffer (no memoryview over it), so it may resize.

cdef inline Py_ssize_t words_first_at_least(array keys, long long key) noexcept:
    """Where ``key`` goes in the sorted ``keys`` (``bisect_left``): the range halved with no branch on the keys
    (a conditional move), so a search costs the same steps wherever the key falls."""
    cdef const long long *k = keys.data.as_longlongs
    cdef Py_ssize_t n = Py_SIZE(keys), half, lo = 0
    if n == 0:
        return 0
    while n > 1:                # keys[:lo] < key <= keys[lo + n:]
        half = n >> 1
        lo = lo + half if k[lo + half] < key else lo
        n -= half
    return lo + (k[lo] < key)


cdef inline int words_file(array keys, long long key) except -1:
    """Insert ``key``, which no key in the sorted ``keys`` equals (``insort``)."""
    cdef Py_ssize_t n = Py_SIZE(keys), i = words_first_at_least(keys, key)
    resize_smart(keys, n + 1)
    memmove(keys.data.as_longlongs + i + 1, keys.data.as_longlongs + i, <size_t>(n - i) * sizeof(long long))
    keys.data.as_longlongs[i] = key
    return 0


cdef inline int words_drop(array keys, Py_ssize_t i) except -1:
    """``del keys[i]`` (``i`` within the column)."""
    cdef Py_ssize_t n = Py_SIZE(keys)
    memmove(keys.data.as_longlongs + i, keys.data.as_longlongs + i + 1, <size_t>(n - i - 1) * sizeof(long long))
    return resize_smart(keys, n - 1)


cdef inline long long words_at(array keys, Py_ssize_t i) noexcept:
    """``keys[i]`` (``i`` within the column)."""
    return keys.data.as_longlongs[i]
