# The compiled build's `add_latency` (see _latency.py, whose function it equals): a C append to an array('d'),
# inlined where a compiled policy cimports it.

from cpython.array cimport array, resize_smart


cdef inline int add_latency(object lat, double seconds) except -1:
    """Append ``seconds`` to ``lat``: in C where it is an ``array('d')``, else through its own ``append``."""
    cdef array a
    cdef Py_ssize_t n
    if type(lat) is array and (<array>lat).ob_descr.typecode == b'd':
        a = <array>lat
        n = len(a)
        resize_smart(a, n + 1)
        a.data.as_doubles[n] = seconds
    else:
        lat.append(seconds)
    return 0
