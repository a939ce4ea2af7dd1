"""Sorted lists of ints, as the free indexes of `cupy` and `split` keep them: where a key goes
(`first_at_least`, the bisect module's ``bisect_left``) and inserting a key no other equals (`file_key`,
``insort``).

Interpreted, these are the bisect module's own C functions. In the compiled build (docs/architecture.md,
"The compiled build") a compiled policy's ``.pxd`` cimports the C loops of ``_sorted.pxd`` under the same
names instead, which the compiled hot loops call without a Python call (a call into the bisect module costs
more there than the search); tests/test_compiled.py holds both to the same answers.
"""
from bisect import bisect_left as first_at_least, insort as file_key

__all__ = ["first_at_least", "file_key"]
