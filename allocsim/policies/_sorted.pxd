# The compiled build's `first_at_least` and `file_key` (see _sorted.py, whose bisect-module functions they
# equal): C loops over a list of Python ints, inlined where a compiled policy cimports them.

cdef inline Py_ssize_t first_at_least(list keys, object key) except -1:
    """Where ``key`` goes in the sorted ``keys`` (``bisect_left``)."""
    cdef Py_ssize_t lo = 0, hi = len(keys), mid
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
