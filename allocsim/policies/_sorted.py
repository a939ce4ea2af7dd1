"""Sorted lists of ints, as the free indexes of `cupy` and `split` keep them: where a key goes
(`first_at_least`, the bisect module's ``bisect_left``) and inserting a key no other equals (`file_key`,
``insort``).

Interpreted, these are the bisect module's own C functions. In the compiled build (docs/architecture.md,
"The compiled build") a compiled policy's ``.pxd`` cimports the C loops of ``_sorted.pxd`` under the same
names instead, which the compiled hot loops call without a Python call (a call into the bisect module costs
more there than the search), and which compare C numbers where the key is within 63 bits (an int of the list
past 63 bits counts as larger); tests/test_compiled.py holds both to the same answers.
"""
from bisect import bisect_left as first_at_least, insort as file_key
from operator import getitem

#: `first_at_least` for a key within 63 bits, which the compiled build takes as a C number (a hot loop calls it
#: where ``cython.compiled`` and the key's operands show it fits; interpreted, the same function).
first_at_least_word = first_at_least

#: `first_at_least`, `file_key` and ``keys[i]`` for a sorted column of C words within 63 bits (an ``array('q')``
#: compiled, whose `_sorted.pxd` versions work on its C buffer, without an int object per key; interpreted, an
#: owner keeps a list and these are the list's own functions); `words_drop` deletes ``keys[i]``.
words_first_at_least, words_file, words_at = first_at_least, file_key, getitem


def words_drop(keys, i: int) -> None:
    """``del keys[i]``."""
    del keys[i]


__all__ = ["first_at_least", "first_at_least_word", "file_key", "words_first_at_least", "words_file", "words_at",
           "words_drop"]
