"""Block columns, read for folding: a policy that keeps its blocks' fields in columns by block id (`split`,
`bestfit`: a C array of 64-bit words compiled, a list interpreted) reads those of many blocks at once here, and a
policy that packs its blocks' words (`split`, `cupy`) puts them in address order here."""
from __future__ import annotations

from array import array

import numpy as np


def words_of(c, ids: np.ndarray) -> np.ndarray:
    """Block column ``c`` at ``ids``, an int64 array: gathered from its C words compiled, read one by one from the
    list interpreted (a copy of a whole list column would cost O(ids ever made)). O(len(ids))."""
    if isinstance(c, array):
        return np.frombuffer(c, np.int64)[ids]
    return np.array([c[b] for b in ids.tolist()], np.int64)


def addresses_of(c, held: dict) -> dict:
    """``id -> address`` of the blocks the engine holds (``held``: id -> block id) from address column ``c``: a
    policy's `Policy.addresses`, gathered at once (the default asks `Policy.block` for each). O(len(held))."""
    return dict(zip(held, words_of(c, np.fromiter(held.values(), np.int64, len(held))).tolist()))


def address_order(addr: np.ndarray, *ties: np.ndarray) -> np.ndarray:
    """The order that sorts blocks as tuples of (``addr``, then ``ties``, the most significant first): an argsort of
    the addresses where each is one block's (nearly always: a fifth of a lexsort's time), else a lexsort of them
    all. O(n log n)."""
    order = np.argsort(addr, kind="stable")
    by_address = addr[order]
    if (by_address[1:] == by_address[:-1]).any():
        return np.lexsort((*ties[::-1], addr))
    return order
