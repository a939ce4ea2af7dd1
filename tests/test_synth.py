"""`allocsim synth`: determinism, validity, training-step structure, alloc-heavy shape, CLI."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import allocsim
from allocsim.formats import synth
from allocsim.cli import main
from allocsim.errors import UsageError
from allocsim.trace import ALLOC, FREE, MARK, RECORD_DTYPE, Trace

# Small shapes so each trace takes milliseconds.
SMALL = {
    "mlp": dict(batch=32, d_in=64, hidden=128, layers=3, classes=10),
    "cnn": dict(batch=2, image=64, width=8, blocks="1,2,1,1", classes=10),
    "transformer": dict(batch=2, seq=64, max_seq=128, d_model=32, heads=2, layers=2, vocab=100),
    "alloc-heavy": dict(n_allocs=5000),
}
MODELS = ["mlp", "cnn", "transformer"]


def small(preset, **kw):
    return synth.generate(preset, **{**SMALL[preset], **kw})


def site_names(t: Trace) -> np.ndarray:
    """Site string of every event ('' where none)."""
    names = np.array(list(t.sites) + [""], dtype=object)
    s = np.asarray(t.site).astype(np.int64)
    return names[np.where(s < len(t.sites), s, len(t.sites))]


def iteration_spans(t: Trace):
    """(start, end) event ranges between consecutive MARKs (the last runs to the end)."""
    starts = [i for i, _ in t.marks()]
    return list(zip(starts, starts[1:] + [len(t)]))


@pytest.mark.parametrize("preset", list(SMALL))
def test_same_seed_same_bytes_and_file_matches_memory(preset, tmp_path):
    a, b = small(preset, seed=7, iterations=3), small(preset, seed=7, iterations=3)
    assert a.records.tobytes() == b.records.tobytes()
    p1, p2 = tmp_path / "1.bin", tmp_path / "2.bin"
    f1 = small(preset, seed=7, iterations=3, path=str(p1))
    small(preset, seed=7, iterations=3, path=str(p2))
    assert p1.read_bytes() == p2.read_bytes()
    assert np.asarray(f1.records).tobytes() == a.records.tobytes()


@pytest.mark.parametrize("preset", list(SMALL))
def test_different_seeds_differ(preset):
    assert small(preset, seed=1).records.tobytes() != small(preset, seed=2).records.tobytes()


@pytest.mark.parametrize("variable", [False, True])
@pytest.mark.parametrize("preset", list(SMALL))
def test_valid_marks_and_metadata(preset, variable):
    if variable and preset == "alloc-heavy":
        with pytest.raises(UsageError):
            small(preset, variable=True)
        return
    t = small(preset, iterations=4, variable=variable)
    t.validate()
    assert [label for _, label in t.marks()] == [f"iter {k}" for k in range(4)]
    assert np.all(np.diff(np.asarray(t.time_ns).astype(np.int64)) >= 0)
    assert t.live_curve.min() >= 0
    assert t.meta["producer"] == "allocsim synth" and t.meta["framework"] == "synthetic"
    assert t.meta["preset"] == preset and t.meta["seed"] == 0 and t.meta["device"]["total_memory"] > 0


@pytest.mark.parametrize("preset", MODELS)
def test_activations_freed_in_reverse_order(preset):
    """Backprop is LIFO: each iteration frees its saved activations in exactly the reverse allocation order."""
    t = small(preset, iterations=3, variable=True)
    kind, ids, names = np.asarray(t.kind), np.asarray(t.id), site_names(t)
    act_ids = set(ids[(kind == ALLOC) & np.array([n.endswith(":activation") for n in names])].tolist())
    for s, e in iteration_spans(t):
        allocated = [int(i) for k, i in zip(kind[s:e], ids[s:e]) if k == ALLOC and int(i) in act_ids]
        freed = [int(i) for k, i in zip(kind[s:e], ids[s:e]) if k == FREE and int(i) in act_ids]
        assert len(allocated) > 5
        assert freed == allocated[::-1]


@pytest.mark.parametrize("preset", MODELS)
def test_persistent_state_and_lazy_adam(preset):
    """Parameters come first; Adam's 2x-params state appears in the first step only; grads are per iteration."""
    t = small(preset, iterations=3)
    kind, size, names = np.asarray(t.kind), np.asarray(t.size).astype(np.int64), site_names(t)
    alloc = kind == ALLOC
    first_mark = t.marks()[0][0]
    is_param = alloc & np.array([n.endswith(":param") for n in names])
    assert is_param.any() and np.flatnonzero(is_param).max() < first_mark
    param_bytes = int(size[is_param].sum())
    adam = alloc & np.array([n in ("adam:exp_avg", "adam:exp_avg_sq") for n in names])
    (s0, e0), (s1, _), _ = iteration_spans(t)
    adam_at = np.flatnonzero(adam)
    assert s0 < adam_at.min() and adam_at.max() < e0
    assert int(size[adam].sum()) == 2 * param_bytes
    grads = alloc & np.array([n.endswith(":grad") for n in names])
    for s, e in iteration_spans(t):
        assert int(size[s:e][grads[s:e]].sum()) == param_bytes


@settings(max_examples=15, deadline=None)
@given(preset=st.sampled_from(MODELS), seed=st.integers(0, 2**32 - 1), variable=st.booleans(),
       iterations=st.integers(3, 5))
def test_live_bytes_at_iteration_boundaries_are_the_persistent_state(preset, seed, variable, iterations):
    """From iteration 2 on, everything but params, buffers, Adam state (2x) and last grads (1x) is freed."""
    t = small(preset, seed=seed, variable=variable, iterations=iterations)
    t.validate()
    names, size = site_names(t), np.asarray(t.size).astype(np.int64)
    alloc = np.asarray(t.kind) == ALLOC
    persistent = alloc & np.array([n.endswith((":param", ":buffer")) for n in names])
    params = alloc & np.array([n.endswith(":param") for n in names])
    expect = int(size[persistent].sum()) + 3 * int(size[params].sum())
    for i, _ in t.marks()[2:]:
        assert t.live_curve[i] == expect


def test_variable_sizes_drift_between_iterations():
    def per_iter_sizes(t):
        kind, size = np.asarray(t.kind), np.asarray(t.size)
        return [tuple(size[s:e][kind[s:e] == ALLOC].tolist()) for s, e in iteration_spans(t)][1:]  # skip Adam init

    fixed = per_iter_sizes(small("transformer", iterations=6))
    assert len(set(fixed)) == 1
    drifting = per_iter_sizes(small("transformer", iterations=6, variable=True))
    assert len(set(drifting)) > 1
    assert len({len(s) for s in drifting}) == 1     # same graph, different shapes


def test_scale_multiplies_load():
    base = small("transformer", iterations=2).load_bytes
    assert small("transformer", iterations=2, scale=2.0).load_bytes == pytest.approx(2 * base, rel=0.01)


def test_iteration_time_follows_iter_ms():
    t = small("cnn", iterations=4, iter_ms=50.0)
    starts = [int(t.time_ns[i]) for i, _ in t.marks()]
    for a, b in zip(starts[1:], starts[2:]):
        assert 40e6 < b - a < 65e6


def test_alloc_heavy_count_sizes_and_short_lifetimes():
    n, mean_life = 20_000, 32
    t = synth.generate("alloc-heavy", n_allocs=n, lifetime=mean_life, min_size=64, max_size="1MiB", iterations=8)
    t.validate()
    kind, ids, size = np.asarray(t.kind), np.asarray(t.id).astype(np.int64), np.asarray(t.size).astype(np.int64)
    assert t.n_allocs == n and np.count_nonzero(kind == FREE) == n and np.count_nonzero(kind == MARK) == 8
    s = size[kind == ALLOC]
    assert s.min() >= 64 and s.max() <= 2**20 + 3
    # Log-uniform: as many requests below the geometric midpoint (8 KiB) as above it.
    assert 0.45 < np.mean(s < 8192) < 0.55
    # Lifetime in allocations between an object's ALLOC and its FREE.
    alloc_no = np.cumsum(kind == ALLOC)
    born, died = np.zeros(n, np.int64), np.zeros(n, np.int64)
    born[ids[kind == ALLOC]] = alloc_no[kind == ALLOC]
    died[ids[kind == FREE]] = alloc_no[kind == FREE]
    life = (died - born)[born + mean_life * 10 < n]        # objects not cut off by the end
    assert abs(life.mean() - mean_life) < 0.1 * mean_life
    assert np.median(life) < mean_life
    assert t.live_curve[-1] == 0
    assert t.load_bytes < 0.01 * s.sum()                    # a modest live set


def test_alloc_heavy_million_is_fast():
    t0 = time.perf_counter()
    t = synth.generate("alloc-heavy")
    assert time.perf_counter() - t0 < 5.0
    assert t.n_allocs == 1_000_000


def test_bad_arguments_raise_usage_error():
    for kw in (dict(preset="nope"), dict(preset="mlp", nope=1), dict(preset="mlp", batch="x"),
               dict(preset="mlp", batch=0), dict(preset="mlp", iterations=0), dict(preset="mlp", scale=-1),
               dict(preset="transformer", seq=4096)):
        with pytest.raises(UsageError):
            synth.generate(**kw)


def test_cli_writes_a_trace(tmp_path, capsys):
    out = tmp_path / "t.bin"
    args = ["synth", "transformer", "-o", str(out), "--iterations", "3", "--seed", "5", "--variable"]
    args += [f"--param={k}={v}" for k, v in SMALL["transformer"].items()]
    assert main(args) == 0
    t = Trace.load(str(out))
    assert len(t.marks()) == 3 and t.meta["seed"] == 5 and t.meta["variable"] is True
    line = capsys.readouterr().out.strip()
    assert "LOAD" in line and "\n" not in line
    assert os.listdir(tmp_path) == ["t.bin"]


@pytest.mark.parametrize("argv", [["bogus"], ["mlp", "--param", "nope=1"], ["mlp", "--param", "batch"]])
def test_cli_rejects_bad_input_in_one_line(tmp_path, capsys, argv):
    out = tmp_path / "t.bin"
    assert main(["synth", *argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("allocsim: ") and "\n" not in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("too_big,fits,events", [
    (["alloc-heavy", "-P", "n_allocs=20000", "-n", "4"], ["alloc-heavy", "-P", "n_allocs=400", "-n", "4"], "40k"),
    (["mlp", "-n", "20"], ["mlp", "-n", "4"], "1.95k")])
def test_cli_refuses_a_trace_the_disk_cannot_hold(tmp_path, capsys, monkeypatch, too_big, fits, events):
    """synth estimates the trace's bytes before writing it (alloc-heavy: 2 events an allocation and a MARK an
    iteration; a model: the first iteration's events each iteration) and refuses one past the free space."""
    monkeypatch.setattr(synth.shutil, "disk_usage", lambda p: SimpleNamespace(free=1000 * RECORD_DTYPE.itemsize))
    assert main(["synth", *too_big, "-o", str(tmp_path / "t.bin"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "t.bin: cannot write: the trace would take about" in err, err
    assert f"({events} events), more than the 39.06 KiB free on its disk" in err, err
    assert os.listdir(tmp_path) == []
    assert main(["synth", *fits, "-o", str(tmp_path / "t.bin"), "-q"]) == 0


def test_shipped_trace_is_the_small_transformer():
    here = os.path.join(os.path.dirname(allocsim.__file__), "data", "synthetic-transformer.bin")
    t = Trace.load(here)
    assert t.meta["preset"] == "transformer" and os.path.getsize(here) < 1_000_000
    regenerated = synth.generate("transformer", seed=t.meta["seed"], iterations=t.meta["iterations"])
    assert np.asarray(t.records).tobytes() == regenerated.records.tobytes()
