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


# Sorted keys that may be words: the compiled build keeps a free index's keys as C words in an ``array('q')``
# while every one is within 63 bits (`cupy`'s arenas), a sorted list of Python ints otherwise; these take either.
# Interpreted (where the keys are always a list) they are the bisect module's and the list's own C functions.
#: Where a key goes in sorted ``keys`` (``bisect_left``); ``key_place(keys, key)``.
key_place = first_at_least
#: `key_place` for a key within 63 bits, a C number compiled; ``word_place(keys, key)``.
word_place = first_at_least
#: Insert ``key`` at position ``x`` of ``keys`` (``list.insert``); ``put_key(keys, x, key)``.
put_key = list.insert
#: `put_key` for a key within 63 bits, a C number compiled (no int object into words); ``put_word(keys, x, key)``.
put_word = list.insert
#: Drop the key at position ``x`` of ``keys`` (``list.pop``; compiled, it returns nothing); ``drop_key(keys, x)``.
drop_key = list.pop
#: Insert an object at position ``x`` of a list (``list.insert``; compiled, one ``memmove`` where CPython's
#: insert moves the items one by one); ``put_item(items, x, item)``.
put_item = list.insert


def drop_item(items: list, x: int) -> None:
    """``del items[x]`` (compiled, one ``memmove``, where CPython's ``del`` goes through a slice assignment; a hot
    loop does ``del`` inline interpreted, without the call)."""
    del items[x]


def move_key(keys, x: int, key) -> int:
    """Replace the key at position ``x`` of the sorted ``keys`` by ``key``, moved to its place; return where it
    went. Compiled, one move of the keys between; interpreted, what a hot loop does inline instead (a drop and
    an insert, without the call)."""
    del keys[x]
    y = first_at_least(keys, key)
    keys.insert(y, key)
    return y


def move_item(items: list, x: int, y: int, item) -> None:
    """Replace the item at position ``x`` of ``items`` by ``item``, moved to position ``y`` (`move_key`'s
    companion for a list beside the keys)."""
    del items[x]
    items.insert(y, item)


__all__ = ["first_at_least", "first_at_least_word", "file_key", "words_first_at_least", "words_file", "words_at",
           "words_drop", "key_place", "word_place", "put_key", "put_word", "drop_key", "put_item", "drop_item",
           "move_key", "move_item"]
