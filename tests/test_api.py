"""The Python API carries the command line's names and imports no GPU framework or plotting library."""
import subprocess
import sys

import pytest

import allocsim
from conftest import ROOT


def test_api_names_work(tmp_path):
    t = allocsim.synthesize("mlp", seed=1, iterations=2)
    p = str(tmp_path / "m.bin")
    t.save(p)
    r = allocsim.replay(p, "split")
    rows = allocsim.compare(p, ["split", "torch[expandable_segments:True]"], caps=[None])
    assert [row["policy"] for row in rows] == ["split", "torch"]
    assert rows[0]["peak_reserved_bytes"] == r.peak_reserved_bytes
    f = allocsim.fit_capacity(p, "none", resolution=1)
    assert f["capacity_bytes"] == t.load_bytes
    assert allocsim.validate_trace(f"{ROOT}/traces/resnet50.bin").match


def test_import_is_light():
    code = "import sys, allocsim; print(sorted(m for m in ('torch','cupy','matplotlib','dask','tqdm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_replay_from_the_command_line_leaves_numpy_ma_unimported():
    """`numpy.unique`'s first call in a process imports `numpy.ma` (10-20 ms: more than a folded replay of a small
    GPT takes); a replay does not call it (`Trace.kinds_present` counts the kinds instead)."""
    code = ("import sys, numpy; early = 'numpy.ma' in sys.modules; from allocsim.cli import main; "
            "rc = main(['replay', 'traces/gpt2.bin', '--policy', 'torch', '--json']); "
            "print(early, rc, 'numpy.ma' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    early, *rest = out.stderr.split()[-3:]
    if early == "True":
        pytest.skip("this numpy imports numpy.ma with itself (numpy 1.x)")
    assert rest == ["0", "False"], out.stderr[-2000:]


def _figures(result) -> dict:
    d = result.to_dict()
    d.pop("replay_seconds"), d.pop("load_seconds")
    return d


def test_a_trace_is_a_path_of_any_spelling_and_nothing_else(small_trace_path):
    """The entry points take a trace's file name as a str, a `pathlib.Path` or bytes, with the same result; another
    type is a TypeError saying what a trace is (``allocsim.replay(Path(...))`` was an AttributeError deep inside), a
    missing file the one-line `InputError`, in `compare` too (it was os.stat's FileNotFoundError)."""
    import os
    import pathlib
    from allocsim.errors import InputError
    plain = _figures(allocsim.replay(small_trace_path, "split"))
    assert _figures(allocsim.replay(pathlib.Path(small_trace_path), "split")) == plain
    assert _figures(allocsim.replay(os.fsencode(small_trace_path), "split")) == plain
    assert _figures(allocsim.Replay(pathlib.Path(small_trace_path), "split").run()) == plain      # (the class too)
    for call in (lambda: allocsim.replay(5), lambda: allocsim.validate_trace(None), lambda: allocsim.Replay(7),
                 lambda: allocsim.compare(3.5, ["split"])):
        with pytest.raises(TypeError, match="a trace is a Trace or its file's name"):
            call()
    with pytest.raises(InputError, match="No such file"):
        allocsim.compare(small_trace_path + ".missing", ["split"])
    rows = allocsim.compare(pathlib.Path(small_trace_path), "split", caps=["64MiB", None])
    assert [r["policy"] for r in rows] == ["split", "split"] and [r["cap_bytes"] for r in rows] == [None, 64 << 20]
    one = allocsim.compare(small_trace_path, "split", caps="64MiB", runtimes="gc")    # one of each, not its letters
    assert [(r["cap_bytes"], r["runtime"]) for r in one] == [(64 << 20, "gc")]
    assert [r["cap_bytes"] for r in allocsim.compare(small_trace_path, "split", caps=64 << 20)] == [64 << 20]


@pytest.mark.parametrize("change,error", [({"cap": -1}, ValueError), ({"gc_every": 0}, ValueError),
                                          ({"cap": True}, TypeError), ({"cap": float("nan")}, TypeError),
                                          ({"cap": 1.5e9}, TypeError), ({"capacity": -5}, ValueError),
                                          ({"gc_every": -1}, ValueError), ({"cap": 2**63}, ValueError),
                                          ({"capacity": 0}, ValueError)])
def test_replay_settings_refuse_what_no_replay_can_mean(change, error):
    """A cap, a capacity or ``gc_every`` is a size in bytes, not negative (``gc_every`` positive; a cap of 0 bytes
    refuses every request, which `fit`'s certified intervals reach): ``cap=-1`` replayed with one OOM, ``cap=nan``
    with no cap at all."""
    with pytest.raises(error, match="replay setting"):
        allocsim.ReplaySettings(**change)


def test_replay_settings_read_a_size_as_the_command_line_does(small_trace_path):
    """``cap="8GB"`` is the cap of 8,000,000,000 bytes (text as `parse_size` reads it; numpy's integers too);
    `fit_capacity` takes a `ReplaySettings` for the replays it makes (it wanted a sweep's `Settings`)."""
    import numpy as np
    assert allocsim.ReplaySettings(cap="8GB").cap == 8 * 10**9 == allocsim.ReplaySettings(cap=np.int64(8 * 10**9)).cap
    assert allocsim.ReplaySettings(capacity="trace").capacity == "trace"
    assert _figures(allocsim.replay(small_trace_path, "split", cap="64MiB")) == \
        _figures(allocsim.replay(small_trace_path, "split", cap=64 << 20))
    fitted = allocsim.fit_capacity(small_trace_path, "split", settings=allocsim.ReplaySettings(gc_every="1GiB"))
    assert fitted["capacity_bytes"] > 0


@pytest.mark.parametrize("call,error", [(lambda r: r.run(until="5"), TypeError), (lambda r: r.run(until=5.0), TypeError),
                                        (lambda r: r.run(until=-1), ValueError), (lambda r: r.step("3"), TypeError),
                                        (lambda r: r.step(True), TypeError), (lambda r: r.step(-2), ValueError)])
def test_a_stepped_replay_takes_an_index_or_a_count_and_nothing_else(small_trace_path, call, error):
    """``Replay.run(until=...)`` is a trace index and ``Replay.step(n)`` a count of events: text was compared with the
    trace's indices as text (``run(until='5')`` walked nothing and returned None), a negative one walked nothing. A
    refused call walks nothing: the replay then runs to the result a fresh one gives."""
    import numpy as np
    r = allocsim.Replay(small_trace_path, "split")
    with pytest.raises(error, match=r"Replay\.(run|step)"):
        call(r)
    assert _figures(r.run()) == _figures(allocsim.Replay(small_trace_path, "split").run())
    stepped = allocsim.Replay(small_trace_path, "split")
    assert stepped.step(np.int64(10)) == 10 and stepped.step(0) == 0 and stepped.run(until=np.int32(0)) is None


def test_compare_and_fit_take_a_trace_object_loaded_or_built_in_memory(small_trace_path):
    """A `Trace` is a trace wherever a file's name is (``compare`` and ``fit_capacity`` refused one, saying a trace
    is a Trace or its file's name): one `Trace.load` read is read from its file, one cut in memory from a temporary
    copy, with the figures a file of the same records gives."""
    import numpy as np
    t = allocsim.Trace.load(small_trace_path)
    assert t.file_as_read() == small_trace_path
    def timeless(rows):
        return [{k: v for k, v in row.items() if k != "replay_seconds"} for row in rows]
    assert timeless(allocsim.compare(t, ["split", "torch"], caps=[None, "64MiB"])) == \
        timeless(allocsim.compare(small_trace_path, ["split", "torch"], caps=[None, "64MiB"]))
    assert allocsim.fit_capacity(t, "split") == allocsim.fit_capacity(small_trace_path, "split")
    cut = allocsim.Trace(np.asarray(t.records[:len(t) // 2]), t.meta, streams=t.streams, sites=t.sites,
                         labels=t.labels)
    assert cut.file_as_read() is None
    rows = allocsim.compare(cut, "split", jobs=2)
    assert rows[0]["trace"] == "<trace in memory>"
    assert rows[0]["peak_reserved_bytes"] == allocsim.replay(cut, "split").to_dict()["peak_reserved_bytes"]
    fitted = allocsim.fit_capacity(cut, "split")
    assert 0 < fitted["capacity_bytes"] <= allocsim.fit_capacity(t, "split")["capacity_bytes"]
