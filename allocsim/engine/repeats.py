"""The passes folding makes over a trace's records, as C loops in the compiled build (docs/architecture.md,
"Folding" and "The compiled build"): each step's signature (`signatures`), how far records repeat those a period
before (`repeating`), which steps start or end runs that repeat with a period (`repeating_table`), what a window's
record-for-record view reads of its records (`window`), whether a later window's records are a view's
(`same`), and a recorded window's increments in units of a binade (`units`).

`allocsim.engine.fold` keeps the plain versions, in numpy (`Steps._signatures`, `repeating_records`,
`repeating_steps`, `_window_plain`, `RecordView._same_plain`, `_units_plain`), and takes these only where this
module is compiled (`COMPILED`): interpreted, a loop here is a Python loop, many times numpy's time, which only the
tests run. Compiled, each is one pass over the records' machine words (or the increments) with no temporaries. The
two give the same answers, number for number: tests/test_repeats.py holds them to each other on real runs and on
records a property test makes, in both builds.

The records are read as `fold._words` lays them out: five 64-bit words a record, the first holding the kind (its
low byte), the flags, the stream (bits 16-31) and the id (the high 32 bits), the third the size. O(records read)
each, O(1) memory beyond the signatures written.
"""
from __future__ import annotations

import numpy as np

try:
    import cython                   # the compiled build (docs/architecture.md, "The compiled build")
except ImportError:                 # pragma: no cover - where Cython is not installed
    from ..compiled import cython   # interpreted: its decorators and types change nothing

from ..trace.events import ALLOC, FREE, MARK, NO_ID

if not cython.compiled:             # compiled, repeats.pxd cimports C's
    from math import floor

#: Whether these loops run compiled (else `allocsim.engine.fold` reads with numpy).
COMPILED = cython.compiled

#: The signature's constants (`Steps._signatures` mixes the same ones: a signature is one number either way).
K_KIND, K_SIZE, K_STREAM = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
K_GAP, K_PLACE, K_MIX, K_SHIFT = 0xD6E8FEB86659FD93, 0x100000001B3, 0xBF58476D1CE4E5B9, 29
#: The same, as Python sees them (compiled, the names above are C numbers no other module reads).
KEYS = (K_KIND, K_SIZE, K_STREAM, K_GAP, K_PLACE, K_MIX, K_SHIFT)
#: A machine word's bits: compiled, masking with it changes nothing; interpreted, it wraps Python's ints as C does.
WORD = 0xFFFFFFFFFFFFFFFF


def _exact(words):
    """Interpreted, the words as Python ints (exact: the masks wrap them), so that no numpy scalar warns of
    the overflows C's unsigned arithmetic makes on purpose."""
    return np.asarray(words).astype(object)


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.overflowcheck(False)
@cython.locals(x=cython.Py_ssize_t, back=cython.ulonglong, shift=cython.ulonglong, want=cython.ulonglong,
               no_id=cython.ulonglong)
def repeating(words, end, R, D, stop):
    """The first trace index from ``end`` on (``stop`` if none before it) whose record is not the one ``R`` before
    it again: the same kind, flags, stream and size, and an id ``D`` more where the record ``R`` before it has an
    id (`fold.repeating_records`'s answer, for ids below `NO_ID` as a valid trace's are: one that a shift makes
    `NO_ID` is read as no id here, and by numpy's pass from the first period's pattern; ``stop`` itself where it
    lies before ``end``, as a stepped replay's target may). ``words``: the records' words; ``0 < R <= end`` and
    ``stop <= len(words)`` (else ValueError: the loop reads without bounds checks)."""
    if not 0 < R <= end or stop > words.shape[0]:
        raise ValueError(f"repeating: R={R}, end={end}, stop={stop} out of bounds for {words.shape[0]} records")
    if not cython.compiled:
        words = _exact(words)
    shift = (D << 32) & WORD
    no_id = NO_ID
    for x in range(end, stop):
        back = words[x - R, 0]
        want = shift if back >> 32 != no_id else 0
        if ((words[x, 0] - back) & WORD) != want or words[x, 2] != words[x - R, 2]:
            return x
    return stop


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.overflowcheck(False)
@cython.locals(x=cython.Py_ssize_t, in_step=cython.ulonglong, w=cython.ulonglong, k=cython.ulonglong,
               v=cython.ulonglong, alloc=cython.ulonglong, free=cython.ulonglong, mark=cython.ulonglong)
def signatures(words, folded, lo, hi, step, allocs, sig):
    """Add to ``sig`` (two words a step: the sum of its events' hashes, their count) the signatures of records
    ``lo`` to ``hi``, the first of them in step ``step`` (each MARK starts the next) with ``allocs`` ALLOCs before
    it: `Steps._signatures`'s numbers. ``folded``: a table by kind, nonzero for the kinds a signature reads
    (`fold.FOLD_KINDS`); an event's hash mixes its kind, size, stream, place among its step's events and, for a
    FREE, how many ALLOCs lie between its object's and it (by the ids, dense in ALLOC order). ValueError where the
    records or steps lie outside ``words`` or ``sig`` (the loop reads and writes without bounds checks)."""
    if not 0 <= lo <= hi <= words.shape[0] or step >= sig.shape[0] or sig.shape[1] < 2 or folded.shape[0] < 256:
        raise ValueError(f"signatures: records {lo}..{hi} of {words.shape[0]}, step {step} of {sig.shape[0]}, "
                         f"{sig.shape[1]} words a step, {folded.shape[0]} kinds")
    if not cython.compiled:
        words, out, sig = _exact(words), sig, np.asarray(sig).astype(object)
    alloc, free, mark = ALLOC, FREE, MARK
    in_step = 0
    for x in range(lo, hi):
        w = words[x, 0]
        k = w & 0xFF
        if k == mark:
            step += 1
            in_step = 0
            if step >= sig.shape[0]:
                raise ValueError(f"signatures: step {step} past the {sig.shape[0]} given")
            continue
        if not folded[k]:
            continue
        if step < 0:
            raise ValueError(f"signatures: record {x} is an event before the first MARK")
        v = (k * K_KIND) & WORD
        v ^= (words[x, 2] * K_SIZE) & WORD
        v ^= (((w >> 16) & 0xFFFF) * K_STREAM) & WORD
        if k == free:
            v ^= (((allocs - (w >> 32)) & WORD) * K_GAP) & WORD
        v ^= (in_step * K_PLACE) & WORD
        v ^= v >> K_SHIFT
        v = (v * K_MIX) & WORD
        sig[step, 0] = (sig[step, 0] + v) & WORD
        sig[step, 1] += 1
        in_step += 1
        if k == alloc:
            allocs += 1
    if not cython.compiled:
        out[...] = sig.astype(np.uint64)
    return 0


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(n=cython.Py_ssize_t, cols=cython.Py_ssize_t, top=cython.Py_ssize_t, p=cython.Py_ssize_t,
               q=cython.Py_ssize_t, c=cython.Py_ssize_t, run=cython.Py_ssize_t, found=cython.bint,
               same=cython.bint)
def repeating_table(rows, most, out, first):
    """Mark in ``out`` (a byte a step, and one more) each step ``q`` from which ``4p`` steps equal (every column of
    ``rows``, a row a step) the steps ``p`` after them, and ``q + p``, for every period ``p`` up to ``most`` and a
    fifth of the steps: `fold.repeating_steps`'s table; ``first``: up to the shortest period that marks any. One
    pass a period, from the last step back, counting how many steps from each on equal those a period later.
    Returns whether any step was marked."""
    n, cols = rows.shape[0], rows.shape[1]
    if out.shape[0] < n + 1:
        raise ValueError(f"repeating_table: {out.shape[0]} marks for {n} steps")
    top = min(most, n // 5)
    found = False
    for p in range(1, top + 1):
        run = 0
        for q in range(n - p - 1, -1, -1):
            same = True
            for c in range(cols):
                if rows[q, c] != rows[q + p, c]:
                    same = False
                    break
            run = run + 1 if same else 0
            if run >= 4 * p:
                out[q] = 1
                out[q + p] = 1
                found = True
        if found and first:
            break
    return found


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.overflowcheck(False)
@cython.locals(N=cython.Py_ssize_t, x=cython.Py_ssize_t, D=cython.Py_ssize_t, P=cython.Py_ssize_t,
               folds=cython.Py_ssize_t, n_older=cython.Py_ssize_t, n_old=cython.Py_ssize_t,
               first_alloc=cython.Py_ssize_t, last=cython.Py_ssize_t, lo_rel=cython.Py_ssize_t, w=cython.ulonglong,
               k=cython.ulonglong, low=cython.ulonglong, i=cython.longlong, lo_id=cython.longlong,
               hi_id=cython.longlong, b=cython.longlong, zero=cython.bint, no_id=cython.longlong,
               alloc=cython.ulonglong, free=cython.ulonglong, table=cython.longlong[::1])
def window(words, folded, lo, R, windows, live_max, shifted, older, old):
    """What `fold.RecordView.of` reads of the ``windows`` (1 or 2) windows of ``R`` records from trace index ``lo``,
    in one pass a question over their words: ``(D, P, first_alloc, lo_id, hi_id, n_older, n_old, end_rel, lo_rel,
    zero)`` (lo_rel -1 for one window), with ``shifted`` (a byte a record: it has an id and is no older object's
    record), ``older`` (the positions of the records with an id of objects older than the first window, ascending)
    and ``old`` (those of them that are FREEs) written, the first ``n_older`` and ``n_old`` of each; None where the
    view's conditions fail (`RecordView`'s docstring): the second window differs from the first but for its ids, an
    ALLOC or FREE has no id, the first window's ALLOC ids are not one run of its ``D`` ALLOCs above ``live_max`` (the
    highest live id, -1 for none), or the second's are not the first's plus ``D``, an old object's FREE lies in the
    second window, no event or not ``windows`` times the first window's ``P`` events. ``folded``: a table by kind,
    nonzero for `fold.FOLD_KINDS`. ValueError where the windows or outputs lie outside the arrays given."""
    N = windows * R
    if windows not in (1, 2) or R <= 0 or lo < 0 or lo + N > words.shape[0] or words.shape[1] < 3 or \
            folded.shape[0] < 256 or shifted.shape[0] < N or older.shape[0] < N or old.shape[0] < N:
        raise ValueError(f"window: {windows} windows of {R} records from {lo} of {words.shape[0]}, outputs "
                         f"{shifted.shape[0]}, {older.shape[0]}, {old.shape[0]}")
    if not cython.compiled:
        words = _exact(words)
    alloc, free, no_id = ALLOC, FREE, NO_ID
    low = 0xFFFFFFFF
    D, first_alloc, lo_id, hi_id = 0, -1, 0, 0
    for x in range(N):                  # every ALLOC and FREE has an id; F is W but for the ids; W's ALLOC ids
        w = words[lo + x, 0]
        k = w & 0xFF
        i = w >> 32
        if (k == alloc or k == free) and i == no_id:
            return None
        if x >= R:
            if (w & low) != (words[lo + x - R, 0] & low) or words[lo + x, 2] != words[lo + x - R, 2]:
                return None
            b = words[lo + x - R, 0] >> 32
            if k == alloc and i - b != D:
                return None
        elif k == alloc:
            if not D:
                first_alloc, lo_id, hi_id = x, i, i
            lo_id, hi_id = min(lo_id, i), max(hi_id, i)
            D += 1
    if not D or hi_id - lo_id != D - 1 or lo_id <= live_max:
        return None
    table = np.full(windows * D, -1, np.int64)     # id - lo_id -> where its object was allocated
    for x in range(N):
        w = words[lo + x, 0]
        if w & 0xFF == alloc:
            table[(w >> 32) - lo_id] = x
    n_older, n_old, P, folds, last, lo_rel, zero = 0, 0, 0, 0, -1, -1, False
    for x in range(N):
        w = words[lo + x, 0]
        k = w & 0xFF
        i = w >> 32
        shifted[x] = i != no_id
        if i != no_id and k != alloc:
            b = table[i - lo_id] if lo_id <= i < lo_id + windows * D else -1
            if b < 0 or b >= x:         # a record of an object older than W
                shifted[x] = 0
                older[n_older] = x
                n_older += 1
                if k == free:
                    if x >= R:
                        return None
                    old[n_old] = x
                    n_old += 1
        if folded[k]:
            if x < R:
                P += 1
            elif folds == P:
                lo_rel = x
            folds += 1
            last = x
        if x < R and k == alloc and words[lo + x, 2] == 0:
            zero = True
    if not P or folds != windows * P:
        return None
    return D, P, first_alloc, lo_id, hi_id, n_older, n_old, last + 1, lo_rel, zero


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.locals(L=cython.Py_ssize_t, x=cython.Py_ssize_t, r=cython.double, whole=cython.double, frac=cython.double,
               total=cython.double, unit=cython.double)
def units(incs, u, out):
    """Write into ``out`` the running sum from 0 of ``incs`` (finite, not negative: a clock's increments) in units
    ``u``, each rounded to nearest, `fold._units`'s numbers added in the same order (numpy's cumsum adds one after
    another); False, ``out`` part written, where one ends in exactly half a unit or reaches ``2**53`` units (left
    to the additions). ValueError where ``out`` is shorter than ``incs`` and one."""
    L = incs.shape[0]
    if out.shape[0] < L + 1:
        raise ValueError(f"units: {out.shape[0]} totals for {L} increments")
    if not cython.compiled:
        incs = np.asarray(incs).tolist()        # Python floats: as C's, with no numpy scalar's overflow warning
    unit, total = u, 0.0
    out[0] = 0.0
    for x in range(L):
        r = incs[x] / unit          # exact: a power-of-two scaling
        if not r < 9007199254740992.0:      # 2**53
            return False
        whole = floor(r)
        frac = r - whole
        if frac == 0.5:
            return False
        total += whole + 1.0 if frac > 0.5 else whole
        out[x + 1] = total
    return True


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.overflowcheck(False)
@cython.locals(N=cython.Py_ssize_t, x=cython.Py_ssize_t, w=cython.ulonglong, t=cython.ulonglong,
               up=cython.ulonglong, low=cython.ulonglong, m=cython.uchar)
def same(words, lo, base, mode, shift):
    """Whether the ``len(mode)`` records from trace index ``lo`` are a window view's, those from ``base``
    (`fold.RecordView`): record ``x``'s first word that of ``base + x`` again where ``mode[x]`` is 0, with its id
    ``shift`` more where 1 (the words' difference, wrapped to 64 bits, is ``shift << 32``), the same but for the id
    where 2 (an older object's record), and its size that of ``base + x`` each; `RecordView._same_plain`'s answer.
    (The view reads its window where it lies in the records: a copy of its columns cost more than the pass that
    made the view, 0.5 ms of GPT-2 small's 80k records, most of it the first touch of the copy's memory.)
    ValueError where either window lies outside the records, or ``shift`` outside 0 to 2**32 - 1 (an id's range)."""
    N = mode.shape[0]
    if lo < 0 or base < 0 or lo > words.shape[0] - N or base > words.shape[0] - N or words.shape[1] < 3 or \
            not 0 <= shift <= 0xFFFFFFFF:
        raise ValueError(f"same: {N} records from {lo} and from {base} of {words.shape[0]}, shift {shift}")
    if not cython.compiled:
        words = _exact(words)
    up, low = (shift << 32) & WORD, 0xFFFFFFFF
    for x in range(N):
        w = words[lo + x, 0]
        t = words[base + x, 0]
        m = mode[x]
        if m == 1:
            if ((w - t) & WORD) != up:
                return False
        elif m == 2:
            if (w & low) != (t & low):
                return False
        elif w != t:
            return False
        if words[lo + x, 2] != words[base + x, 2]:
            return False
    return True
