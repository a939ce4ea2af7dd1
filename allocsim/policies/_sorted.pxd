# The compiled build's `first_at_least` and `file_key` (see _sorted.py, whose bisect-module functions they
# equal): C loops over a list of Python ints, inlined where a compiled policy cimports them. Where the key is
# within 63 bits, each step compares C numbers (a list's int read as one, an int past 63 bits counting as
# larger or smaller by its sign), not two Python ints through a generic comparison.

cimport cython
from cpython.array cimport array, resize_smart
from cpython.object cimport Py_SIZE
from libc.string cimport memmove

cdef extern from *:
    """
    /* items.insert(x, o) for a list and 0 <= x <= len(items): appended, then the tail moved up by one memmove
       (CPython's own insert moves the items one by one). */
    static CYTHON_INLINE int allocsim_put_item(PyObject *items, Py_ssize_t x, PyObject *o) {
        Py_ssize_t n = PyList_GET_SIZE(items);
        PyObject **it;
        if (PyList_Append(items, o) < 0) return -1;         /* items[n] holds the new reference to o */
        it = ((PyListObject *)items)->ob_item;
        memmove(it + x + 1, it + x, (size_t)(n - x) * sizeof(PyObject *));
        it[x] = o;
        return 0;
    }

    /* del items[x] for a list and 0 <= x < len(items): the tail moved down by one memmove (CPython's del goes
       through a slice assignment); the list keeps its room, as a list.pop that does not shrink it does. */
    static CYTHON_INLINE int allocsim_drop_item(PyObject *items, Py_ssize_t x) {
        Py_ssize_t n = PyList_GET_SIZE(items);
        PyObject **it = ((PyListObject *)items)->ob_item;
        PyObject *old = it[x];
        memmove(it + x, it + x + 1, (size_t)(n - x - 1) * sizeof(PyObject *));
        Py_SET_SIZE(items, n - 1);
        Py_DECREF(old);
        return 0;
    }

    /* items[x] replaced by o, which goes to position y (0 <= x, y < len(items)): the items between shift by one
       memmove. */
    static CYTHON_INLINE int allocsim_move_item(PyObject *items, Py_ssize_t x, Py_ssize_t y, PyObject *o) {
        PyObject **it = ((PyListObject *)items)->ob_item;
        PyObject *old = it[x];
        if (y < x) memmove(it + y + 1, it + y, (size_t)(x - y) * sizeof(PyObject *));
        else if (y > x) memmove(it + x, it + x + 1, (size_t)(y - x) * sizeof(PyObject *));
        Py_INCREF(o);
        it[y] = o;
        Py_DECREF(old);
        return 0;
    }

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
    int allocsim_put_item(list items, Py_ssize_t x, object o) except -1
    int allocsim_drop_item(list items, Py_ssize_t x) except -1
    int allocsim_move_item(list items, Py_ssize_t x, Py_ssize_t y, object o) except -1
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

@cython.overflowcheck(False)   # positions within one array
cdef inline Py_ssize_t _word_place_in(long long *w, Py_ssize_t at, Py_ssize_t n, long long key) noexcept:
    """Where ``key`` goes among the sorted words ``w[at:at + n]``: the range halved with no branch on the words
    (a conditional move), so a search costs the same steps wherever the key falls."""
    cdef Py_ssize_t half
    if n == 0:
        return at
    while n > 1:                # without a branch to mispredict: the answer stays in [at, at + n]
        half = n >> 1
        at = at + half if w[at + half] < key else at
        n -= half
    return at + (w[at] < key)


@cython.overflowcheck(False)   # positions within one array
cdef inline int _put_word_in(array a, Py_ssize_t x, long long key) except -1:
    """Insert ``key`` at position ``x`` of the words (0 <= x <= len(a)): the tail moved up by one ``memmove``."""
    cdef Py_ssize_t n = Py_SIZE(a)
    resize_smart(a, n + 1)
    memmove(a.data.as_longlongs + x + 1, a.data.as_longlongs + x, <size_t>(n - x) * sizeof(long long))
    a.data.as_longlongs[x] = key
    return 0


@cython.overflowcheck(False)   # positions within one array
cdef inline int _drop_word_in(array a, Py_ssize_t x) except -1:
    """Drop the word at position ``x`` (0 <= x < len(a)): the tail moved down by one ``memmove``."""
    cdef Py_ssize_t n = Py_SIZE(a)
    memmove(a.data.as_longlongs + x, a.data.as_longlongs + x + 1, <size_t>(n - x - 1) * sizeof(long long))
    return resize_smart(a, n - 1)


cdef inline Py_ssize_t words_first_at_least(array keys, long long key) noexcept:
    """Where ``key`` goes in the sorted ``keys`` (``bisect_left``), without a branch on the keys."""
    return _word_place_in(keys.data.as_longlongs, 0, Py_SIZE(keys), key)


cdef inline int words_file(array keys, long long key) except -1:
    """Insert ``key``, which no key in the sorted ``keys`` equals (``insort``)."""
    return _put_word_in(keys, words_first_at_least(keys, key), key)


cdef inline int words_drop(array keys, Py_ssize_t i) except -1:
    """``del keys[i]`` (``i`` within the column)."""
    return _drop_word_in(keys, i)


cdef inline long long words_at(array keys, Py_ssize_t i) noexcept:
    """``keys[i]`` (``i`` within the column)."""
    return keys.data.as_longlongs[i]

# Keys that may be words (see _sorted.py): an array('q') of C words, or a sorted list of Python ints.

@cython.overflowcheck(False)   # positions within one array
cdef inline Py_ssize_t word_place(object keys, long long key) except -1:
    """Where the C number ``key`` goes in the sorted ``keys`` (``bisect_left``)."""
    if type(keys) is not array:
        return first_at_least_word(<list>keys, key)
    return _word_place_in((<array>keys).data.as_longlongs, 0, len(<array>keys), key)


cdef inline Py_ssize_t key_place(object keys, object key) except -1:
    """Where ``key`` goes in the sorted ``keys`` (``bisect_left``); past 63 bits, beyond every word."""
    cdef int over = 0
    cdef long long k
    if type(keys) is not array:
        return first_at_least(<list>keys, key)
    k = PyLong_AsLongLongAndOverflow(key, &over)
    if over:
        return 0 if over < 0 else len(<array>keys)
    return word_place(keys, k)


cdef inline int put_key(object keys, Py_ssize_t x, object key) except -1:
    """Insert ``key`` at position ``x`` (0 <= x <= len(keys)); into words, it must be one (else OverflowError)."""
    if type(keys) is not array:
        return allocsim_put_item(<list>keys, x, key)
    return put_word(keys, x, key)


@cython.overflowcheck(False)   # positions within one array
cdef inline int put_word(object keys, Py_ssize_t x, long long key) except -1:
    """Insert the C number ``key`` at position ``x`` (0 <= x <= len(keys)): into words, without an int object."""
    if type(keys) is not array:
        return allocsim_put_item(<list>keys, x, key)
    return _put_word_in(<array>keys, x, key)


@cython.overflowcheck(False)   # positions within one array
cdef inline int drop_key(object keys, Py_ssize_t x) except -1:
    """Drop the key at position ``x`` (0 <= x < len(keys))."""
    if type(keys) is not array:
        return allocsim_drop_item(<list>keys, x)
    return _drop_word_in(<array>keys, x)


cdef inline int put_item(list items, Py_ssize_t x, object item) except -1:
    """Insert ``item`` at position ``x`` (0 <= x <= len(items))."""
    return allocsim_put_item(items, x, item)


cdef inline int drop_item(list items, Py_ssize_t x) except -1:
    """Drop the item at position ``x`` (0 <= x < len(items))."""
    return allocsim_drop_item(items, x)


@cython.overflowcheck(False)   # positions within one array
cdef inline Py_ssize_t move_key(object keys, Py_ssize_t x, object key) except -1:
    """Replace the key at position ``x`` by ``key``, moved to its place (the keys between shift by one, one
    ``memmove`` of words); return where it went."""
    cdef long long *w
    cdef long long k
    cdef Py_ssize_t n, y
    if type(keys) is not array:
        del (<list>keys)[x]
        y = first_at_least(<list>keys, key)
        allocsim_put_item(<list>keys, y, key)
        return y
    k = key
    w = (<array>keys).data.as_longlongs
    n = len(<array>keys)
    if k < w[x]:
        y = _word_place_in(w, 0, x, k)
        memmove(w + y + 1, w + y, <size_t>(x - y) * sizeof(long long))
    else:
        y = _word_place_in(w, x + 1, n - x - 1, k) - 1
        memmove(w + x, w + x + 1, <size_t>(y - x) * sizeof(long long))
    w[y] = k
    return y


cdef inline int move_item(list items, Py_ssize_t x, Py_ssize_t y, object item) except -1:
    """Replace the item at position ``x`` by ``item``, moved to position ``y`` (the items between shift by
    one)."""
    return allocsim_move_item(items, x, y, item)
