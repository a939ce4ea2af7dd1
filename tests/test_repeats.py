"""`allocsim.engine.repeats` (the compiled build's C loops over the records) against folding's plain numpy passes
(`fold.Steps._signatures`, `fold.repeating_records`): the same numbers on real runs and on records a property test
makes. In the compiled build the loops run in C; interpreted, the same source runs in Python (tests/test_compiled.py
runs this file on the other build too)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from allocsim.engine import fold, repeats
from allocsim.trace import Trace
from allocsim.trace.events import ALLOC, FREE, FREE_REQUESTED, MARK, NO_ID, OOM, RECORD_DTYPE

from test_fold import real_steps

KINDS = [ALLOC, ALLOC, FREE, FREE, MARK, OOM, FREE_REQUESTED]


def plain_signatures(trace: Trace, monkeypatch) -> np.ndarray:
    """Every step's signature by the numpy pass."""
    with monkeypatch.context() as m:
        m.setattr(repeats, "COMPILED", False)
        steps = fold.Steps(trace)
        return steps.read(0, len(steps)).copy()


def loop_signatures(trace: Trace, a: int, b: int) -> np.ndarray:
    """The signatures of steps ``a`` to ``b`` by the loop of `repeats` (one call, as `Steps._signatures` makes it)."""
    steps = fold.Steps(trace)
    lo = int(steps.marks[a])
    hi = int(steps.marks[b]) if b < len(steps) else len(trace.records)
    sig = np.zeros((len(steps), 2), np.uint64)
    assert repeats.signatures(fold._words(trace.records), fold._FOLDED_BYTES, lo, hi, a - 1, int(steps.allocs[a]),
                              sig) == 0
    return sig[a:b]


def made(rows: list[tuple]) -> Trace:
    """A trace of records ``(kind, flags, stream, id, size)``, a MARK first."""
    rec = np.zeros(len(rows) + 1, RECORD_DTYPE)
    rec["kind"][0], rec["id"][0] = MARK, NO_ID
    for name, col in zip(("kind", "flags", "stream", "id", "size"), zip(*rows)):
        rec[name][1:] = col
    return Trace(rec, {})


records = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 3), st.sampled_from([0, 1, 2, 0x1FF, 0xFFFF]),
                             st.one_of(st.integers(0, 40), st.just(NO_ID)),
                             st.one_of(st.integers(0, 1 << 12), st.integers((1 << 64) - 4, (1 << 64) - 1))),
                   min_size=1, max_size=60)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=records)
def test_the_loops_signatures_are_the_numpy_passes(monkeypatch, rows):
    """Any records (sizes up to 2**64 - 1, ids past the ALLOCs before them, records without an id, kinds a signature
    does not read): the loop's signature of every step is the numpy pass's, bit for bit."""
    trace = made(rows)
    want = plain_signatures(trace, monkeypatch)
    n = len(want)
    assert np.array_equal(loop_signatures(trace, 0, n), want)
    if n > 2:                   # from a step within the trace, after the ALLOCs before it
        assert np.array_equal(loop_signatures(trace, 1, n - 1), want[1:n - 1])


def test_a_real_runs_signatures_are_the_numpy_passes(monkeypatch):
    """The first 40 steps of a real GPT run (traces/fold/gpt-eval50), read as `Steps` reads them in the build at
    hand and by the numpy pass: the same signatures; and changing one event's size changes its step's alone."""
    trace = real_steps("gpt-eval50", 40)
    want = plain_signatures(trace, monkeypatch)
    steps = fold.Steps(trace)
    assert np.array_equal(steps.read(0, len(steps)), want)
    assert np.array_equal(loop_signatures(trace, 3, 17), want[3:17])
    rec = np.array(trace.records)
    x = int(steps.marks[20]) + int(np.argmax(rec["kind"][int(steps.marks[20]):] == ALLOC))    # step 20's first ALLOC
    rec["size"][x] += 1
    changed = loop_signatures(Trace(rec, dict(trace.meta)), 0, len(steps))
    assert [int(s) for s in np.flatnonzero((changed != want).any(axis=1))] == [20]


def repeated_records(rows: list[tuple], times: int, D: int) -> np.ndarray:
    """``rows`` (kind, flags, stream, id, size) ``times`` over, each time with every id (not `NO_ID`) ``D`` more."""
    rec = np.zeros(len(rows) * times, RECORD_DTYPE)
    for t in range(times):
        for x, (kind, flags, stream, i, size) in enumerate(rows):
            rec[t * len(rows) + x] = (kind, flags, stream, i if i == NO_ID else i + t * D, 0, 0, size, 0, 0)
    return rec


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=records, times=st.integers(2, 4), D=st.integers(0, 50), data=st.data())
def test_the_loops_repeat_ends_where_numpys_does(monkeypatch, rows, times, D, data):
    """Records repeating with a period (ids a constant more each time), then one field of one record changed, or
    the whole read with another id shift: the loop stops at the first record the numpy pass stops at."""
    rec = repeated_records(rows, times, D)
    R = len(rows)
    x = data.draw(st.integers(0, len(rec) - 1))
    field = data.draw(st.sampled_from(["kind", "flags", "stream", "id", "size", None]))
    if field is not None:
        rec[field][x] = (int(rec[field][x]) + 1) % (1 << (8 * rec.dtype[field].itemsize))
    shift = data.draw(st.sampled_from([D, D + 1]))
    end = data.draw(st.integers(R, len(rec)))
    stop = data.draw(st.one_of(st.integers(end, len(rec)), st.integers(-1, end)))     # (before ``end``: a stepped
    #                                                                                    replay's target, -1)
    words = fold._words(rec)
    got = repeats.repeating(words, end, R, shift, stop)
    with monkeypatch.context() as m:
        m.setattr(repeats, "COMPILED", False)
        assert got == fold.repeating_records(words, end, R, shift, stop)
    assert end <= got <= stop or got == stop < end


@pytest.mark.parametrize("period", [1, 7])
def test_a_real_runs_records_repeat_as_far_by_either(monkeypatch, period):
    """The real GPT run's records from step 20 compared a period of steps back (its ids a period's ALLOCs more):
    the loop and the numpy pass stop at the same record (the run's next logging step breaks both)."""
    trace = real_steps("gpt-eval50", 60)
    steps = fold.Steps(trace)
    at, back = int(steps.marks[20 + period]), int(steps.marks[20])
    R, D = at - back, int(steps.allocs[20 + period] - steps.allocs[20])
    words = fold._words(trace.records)
    got = repeats.repeating(words, at, R, D, len(trace.records))
    with monkeypatch.context() as m:
        m.setattr(repeats, "COMPILED", False)
        assert got == fold.repeating_records(words, at, R, D, len(trace.records))
    assert at < got < len(trace.records)


def test_the_loops_refuse_what_they_would_read_out_of_bounds():
    """Compiled, the loops read without bounds checks: asked outside the records or the steps, each raises
    ValueError (in both builds) rather than read or write past an array."""
    trace = made([(ALLOC, 0, 0, 0, 8), (MARK, 0, 0, NO_ID, 0), (FREE, 0, 0, 0, 8)])
    words, n = fold._words(trace.records), len(trace.records)
    sig = np.zeros((2, 2), np.uint64)
    for end, R, stop in [(1, 2, n), (1, 0, n), (2, 1, n + 1)]:
        with pytest.raises(ValueError):
            repeats.repeating(words, end, R, 0, stop)
    for lo, hi, step in [(1, n, -1), (0, n + 1, -1), (0, n, 2)]:    # an ALLOC before any MARK; past the records
        with pytest.raises(ValueError):
            repeats.signatures(words, fold._FOLDED_BYTES, lo, hi, step, 0, sig)
    with pytest.raises(ValueError):                                 # two MARKs for one step
        repeats.signatures(words, fold._FOLDED_BYTES, 0, n, -1, 0, np.zeros((1, 2), np.uint64))
    with pytest.raises(ValueError):                                 # one word a step
        repeats.signatures(words, fold._FOLDED_BYTES, 0, n, -1, 0, np.zeros((2, 1), np.uint64))
    with pytest.raises(ValueError):                                 # a table short of the kinds
        repeats.signatures(words, fold._FOLDED_BYTES[:4], 0, n, -1, 0, sig)
    assert repeats.signatures(words, fold._FOLDED_BYTES, 0, n, -1, 0, sig) == 0
    assert sig[:, 1].tolist() == [1, 1]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n=st.integers(0, 70), cols=st.integers(1, 2), most=st.integers(1, 30), first=st.booleans())
def test_the_loops_table_of_repeating_steps_is_the_numpy_passes(monkeypatch, data, n, cols, most, first):
    """Steps (rows of one or two words: ALLOC counts, or signatures) in two stretches, each repeating with a period
    of its own, with a few changed: the loop marks the steps the numpy pass marks (`fold.repeating_steps`), up to
    ``most`` steps a period, or up to the shortest period that marks any."""
    rows = []
    for part in (n // 2, n - n // 2):
        period = data.draw(st.integers(1, 6))
        pattern = data.draw(st.lists(st.lists(st.integers(0, 2), min_size=cols, max_size=cols), min_size=period,
                                     max_size=period))
        rows += [pattern[q % period] for q in range(part)]
    rows = np.array(rows, np.uint64).reshape(n, cols)
    for q in data.draw(st.lists(st.integers(0, max(0, n - 1)), max_size=3)) if n else []:
        rows[q, 0] += np.uint64(1)
    got = np.zeros(n + 1, np.uint8)
    assert repeats.repeating_table(rows, most, got, first) == bool(got.any())
    with monkeypatch.context() as m:
        m.setattr(repeats, "COMPILED", False)
        want = fold.repeating_steps(rows, most, first)
    assert np.array_equal(got.astype(bool), want)
    assert np.array_equal(fold.repeating_steps(rows, most, first), want)      # (as fold takes it, in this build)


@st.composite
def windows_of(draw):
    """A window's records (kind, flags, stream, id, size): ALLOCs whose ids run from a base, FREEs of its own objects
    or of older ones (ids below the base), other records with or without ids, in any order; and the ids' run."""
    n, base = draw(st.integers(0, 6)), draw(st.integers(1, 20))
    rows = [(ALLOC, 0, draw(st.sampled_from([0, 1])), base + i, draw(st.sampled_from([0, 8, 512]))) for i in range(n)]
    own = st.integers(base, base + n - 1) if n else st.integers(0, base)     # (a second window may free them)
    rows += [(FREE, 0, 0, draw(st.one_of(own, own, st.integers(0, base + n))), 8)
             for _ in range(draw(st.integers(0, 5)))]
    rows += [(draw(st.sampled_from([MARK, OOM, FREE_REQUESTED])), 0, 0, draw(st.sampled_from([NO_ID, base - 1, base])), 0)
             for _ in range(draw(st.integers(0, 2)))]
    return draw(st.permutations(rows)), base, n


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(got=windows_of(), windows=st.sampled_from([1, 2]), data=st.data())
def test_the_loops_window_view_is_the_numpy_passes(got, windows, data):
    """A window (and for two, the same records again with every id its ALLOC count more, or another shift), one field
    of one record changed or none, the highest live id below the window's ids or not: the loop reads what the numpy
    passes read (`fold._window_plain`), or refuses alike."""
    rows, base, n = got
    if not rows:
        return
    D = data.draw(st.sampled_from([n, n + 1]))
    rec = repeated_records(rows, windows, D)
    field = data.draw(st.sampled_from(["kind", "id", "size", "stream", None]))
    if field is not None:
        x = data.draw(st.integers(0, len(rec) - 1))
        bits = 8 * rec.dtype[field].itemsize
        rec[field][x] = data.draw(st.sampled_from([ALLOC, FREE])) if field == "kind" else (int(rec[field][x]) + 1) % (1 << bits)
    live_max = data.draw(st.sampled_from([-1, base - 1, base]))
    words, R, N = fold._words(rec), len(rows), len(rec)
    shifted, older, old = np.empty(N, np.uint8), np.empty(N, np.int64), np.empty(N, np.int64)
    loop = repeats.window(words, fold._FOLDED_BYTES, 0, R, windows, live_max, shifted, older, old)
    plain = fold._window_plain(words[:N, 0].copy(), words[:N, 2].copy(), R, windows, live_max)
    assert (loop is None) == (plain is None)
    if loop is None:
        return
    D_, P, first_alloc, lo_id, hi_id, n_older, n_old, end_rel, lo_rel, zero = loop
    assert (D_, P, first_alloc, lo_id, hi_id, end_rel, lo_rel if windows == 2 else None, zero) == plain[5]
    assert np.array_equal(shifted.view(bool), plain[2])
    assert np.array_equal(older[:n_older], plain[3]) and np.array_equal(old[:n_old], plain[4])


def test_a_real_runs_window_views_are_the_numpy_passes():
    """The real GPT run's windows of 1, 2 and 7 steps from its first 40 steps, one and two at a time, the highest
    live id below their ids or not: the loop (compiled, or its source run as Python) reads what the numpy passes
    read, and most are views (two of the period's windows among them)."""
    trace = real_steps("gpt-eval50", 60)
    marks, words = fold.Steps(trace).marks, fold._words(trace.records)
    views = pairs = 0
    for m in range(40):
        for p in (1, 2, 7):
            for windows in (1, 2):
                lo, R = int(marks[m]), int(marks[m + p] - marks[m])
                if int(marks[m + windows * p]) - lo != windows * R:
                    continue
                for live_max in (-1, 1 << 31):
                    N = windows * R
                    shifted, older, old = np.empty(N, np.uint8), np.empty(N, np.int64), np.empty(N, np.int64)
                    got = repeats.window(words, fold._FOLDED_BYTES, lo, R, windows, live_max, shifted, older, old)
                    want = fold._window_plain(words[lo:lo + N, 0].copy(), words[lo:lo + N, 2].copy(), R, windows,
                                              live_max)
                    assert (got is None) == (want is None)
                    if got is None:
                        continue
                    views += 1
                    pairs += windows == 2
                    D, P, first_alloc, lo_id, hi_id, n_older, n_old, end_rel, lo_rel, zero = got
                    assert (D, P, first_alloc, lo_id, hi_id, end_rel, lo_rel if windows == 2 else None, zero) == want[5]
                    assert np.array_equal(shifted.view(bool), want[2])
                    assert np.array_equal(older[:n_older], want[3]) and np.array_equal(old[:n_old], want[4])
    assert views > 100 and pairs > 20, (views, pairs)


@pytest.mark.parametrize("rows, D, view", [
    ([(FREE, 0, 0, 3, 8), (ALLOC, 0, 0, 10, 8), (ALLOC, 0, 0, 11, 8)], 2, False),   # F's first record frees an old object
    ([(ALLOC, 0, 0, 10, 8), (FREE, 0, 0, 3, 8), (ALLOC, 0, 0, 11, 8)], 2, False),   # ... and within F
    ([(ALLOC, 0, 0, 10, 8), (FREE, 0, 0, 10, 8), (ALLOC, 0, 0, 11, 8)], 2, True),   # its own objects only
    ([(ALLOC, 0, 0, 10, 8), (FREE, 0, 0, 10, 8), (ALLOC, 0, 0, 11, 8)], 3, False),  # F's ids not W's plus D
])
def test_a_second_window_that_frees_an_old_object_is_no_view(rows, D, view):
    """Two windows, the second the first with ids ``D`` more: where the second frees an object older than the first
    (at its very first record too), or its ids are shifted otherwise, neither the loop nor the numpy passes make a
    view; where each frees only its own objects, both do, alike."""
    rec = repeated_records(rows, 2, D)
    words, N = fold._words(rec), len(rec)
    shifted, older, old = np.empty(N, np.uint8), np.empty(N, np.int64), np.empty(N, np.int64)
    loop = repeats.window(words, fold._FOLDED_BYTES, 0, len(rows), 2, -1, shifted, older, old)
    plain = fold._window_plain(words[:N, 0].copy(), words[:N, 2].copy(), len(rows), 2, -1)
    assert (loop is not None, plain is not None) == (view, view)
    if view:
        assert loop[:5] + loop[7:] == plain[5][:5] + plain[5][5:]


def test_the_window_loop_refuses_what_it_would_read_out_of_bounds():
    """Compiled, `repeats.window` reads and writes without bounds checks: windows past the records, a third window,
    outputs shorter than the windows raise ValueError in both builds."""
    rec = repeated_records([(ALLOC, 0, 0, 1, 8), (FREE, 0, 0, 1, 8)], 2, 1)
    words, N = fold._words(rec), len(rec)
    out = lambda n: (np.empty(n, np.uint8), np.empty(n, np.int64), np.empty(n, np.int64))     # noqa: E731
    for lo, R, windows, n in [(1, 2, 2, N), (0, 2, 3, 6), (0, 0, 1, N), (0, 2, 2, N - 1), (-1, 1, 1, N)]:
        with pytest.raises(ValueError):
            repeats.window(words, fold._FOLDED_BYTES, lo, R, windows, -1, *out(n))
    assert repeats.window(words, fold._FOLDED_BYTES, 0, 2, 2, -1, *out(N)) is not None


@settings(max_examples=150, deadline=None)
@given(incs=st.lists(st.one_of(st.floats(0, 1e-3), st.integers(0, 1 << 12).map(lambda k: k * 2.0 ** -30),
                               st.just(2.0 ** -31), st.floats(0, 1e300)), max_size=40),
       e=st.integers(-60, 60))
def test_the_loops_units_are_the_numpy_passes(incs, e):
    """A clock's increments (finite, not negative: tiny, multiples of a power of two whose halves tie, huge) in
    units of a binade ``2**e``: the loop writes the running sums numpy's passes make (`fold._units_plain`), bit for
    bit, or refuses where they do (a tie, or 2**53 units or more)."""
    incs, u = np.array(incs, np.float64), 2.0 ** e
    out = np.empty(len(incs) + 1)
    got = repeats.units(incs, u, out)
    want = fold._units_plain(incs, u)
    assert got == (want is not None)
    if got:
        assert out.tobytes() == want.tobytes()
    with pytest.raises(ValueError):
        repeats.units(incs, u, np.empty(len(incs)))


class _View:
    """What `fold.RecordView._same_plain` reads of a view: its window's first and size words, which records have
    ids shifted, which are older objects'."""

    def __init__(self, w0, size, shifted, older):
        self.w0, self.size, self.shifted, self.older = w0, size, shifted, older


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(got=windows_of(), data=st.data())
def test_the_loops_comparison_with_a_view_is_the_numpy_passes(got, data):
    """A window's view (by the numpy passes) and the records of a later window: the window again with every id of its
    own objects ``shift`` more (the older objects' ids anything), or with one field of one record changed, or another
    shift: the loop answers whether they are the view's as numpy's passes answer (`RecordView._same_plain`)."""
    rows, base, n = got
    if not rows:
        return
    shift = data.draw(st.integers(0, 40))
    rec = repeated_records(rows, 2, shift)
    N, words = len(rows), fold._words(rec)
    view = fold._window_plain(words[:N, 0].copy(), words[:N, 2].copy(), N, 1, -1)
    if view is None:
        return
    w0, size, shifted, older = view[:4]
    older_ids = [x for x in older.tolist() if rec["id"][N + x] != NO_ID]
    for x in data.draw(st.lists(st.sampled_from(older_ids), max_size=2)) if older_ids else []:
        rec["id"][N + x] = data.draw(st.integers(0, 60))           # an older object's id: not compared
    field = data.draw(st.sampled_from(["kind", "id", "size", "stream", "flags", None]))
    if field is not None:
        x = N + data.draw(st.integers(0, N - 1))
        bits = 8 * rec.dtype[field].itemsize
        rec[field][x] = (int(rec[field][x]) + data.draw(st.integers(1, 3))) % (1 << bits)
    asked = data.draw(st.sampled_from([shift, shift + 1, max(0, shift - 1)]))
    words = fold._words(rec)
    mode = shifted.astype(np.uint8)
    mode[older] = 2
    want = fold.RecordView._same_plain(_View(w0, size, shifted, older), words, N, asked)
    assert repeats.same(words, N, 0, mode, asked) == want
    if field is None and asked == shift:
        assert want                                                 # the window again, by the view's own shift


def test_the_comparison_loop_refuses_what_it_would_read_out_of_bounds():
    """Compiled, `repeats.same` reads without bounds checks: either window past the records (or before them), a
    shift outside an id's range raise ValueError in both builds."""
    rec = repeated_records([(ALLOC, 0, 0, 1, 8), (FREE, 0, 0, 1, 8)], 2, 1)
    words = fold._words(rec)
    mode = np.ones(2, np.uint8)
    for lo, base, m, shift in [(3, 0, mode, 1), (-1, 0, mode, 1), (2, 3, mode, 1), (2, -1, mode, 1),
                               (1, 0, np.ones(4, np.uint8), 1), (2, 0, mode, -1), (2, 0, mode, 1 << 32),
                               ((1 << 63) - 1, 0, mode, 1), (2, (1 << 63) - 1, mode, 1)]:
        with pytest.raises(ValueError):
            repeats.same(words, lo, base, m, shift)
    assert repeats.same(words, 2, 0, mode, 1) and not repeats.same(words, 2, 0, mode, 2)
    assert repeats.same(words, 2, 0, mode[:1], 1)       # (the records the mode covers)
    assert repeats.same(words, 3, 1, mode[:1], 1) and not repeats.same(words, 3, 0, mode[:1], 1)   # (from ``base``)


@pytest.mark.parametrize("field", ["kind", "flags", "stream", "size"])
def test_a_record_without_an_id_is_compared_whole(field):
    """A window's record with no id (a MARK here) is its view's only if every word is: one changed field makes the
    window another's, for the loop as for numpy's passes."""
    rows = [(ALLOC, 0, 0, 5, 8), (MARK, 0, 0, NO_ID, 0), (FREE, 0, 0, 5, 8)]
    rec = repeated_records(rows, 2, 1)
    words = fold._words(rec)
    w0, size, shifted, older = fold._window_plain(words[:3, 0].copy(), words[:3, 2].copy(), 3, 1, -1)[:4]
    mode = shifted.astype(np.uint8)
    mode[older] = 2
    view = _View(w0, size, shifted, older)
    assert repeats.same(words, 3, 0, mode, 1) and fold.RecordView._same_plain(view, words, 3, 1)
    rec[field][4] += 1                      # the second window's MARK
    words = fold._words(rec)
    assert not repeats.same(words, 3, 0, mode, 1) and not fold.RecordView._same_plain(view, words, 3, 1)
