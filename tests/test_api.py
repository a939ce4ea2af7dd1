"""The Python API carries the command line's names and imports no GPU framework or plotting library."""
import re
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
    """``import allocsim`` loads none of the heavy modules, numpy included (the API's names load on first use)."""
    code = ("import sys, allocsim; print(sorted(m for m in ('torch','cupy','matplotlib','dask','tqdm','numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    code = "import allocsim; print(allocsim.policies.names()[0], allocsim.Replay.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["bestfit", "Replay"], out.stderr     # (a subpackage as an attribute, as before)
    for name in allocsim.__all__:
        assert getattr(allocsim, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        allocsim.nope


def test_an_interrupt_while_the_command_line_loads_is_one_line():
    """Ctrl-C in the console script's first 0.2 s (numpy and every command loading) printed a traceback of 10-30
    lines; it is "interrupted", exit status 130, as later. The interrupt is raised where ``allocsim.cli`` loads."""
    code = ("import builtins, sys\nreal = builtins.__import__\n"
            "def imp(name, *a, **k):\n    if name == 'cli' or name == 'allocsim.cli':\n        raise KeyboardInterrupt\n"
            "    return real(name, *a, **k)\nbuiltins.__import__ = imp\n"
            "from allocsim._start import main\nsys.exit(main())\n")
    out = subprocess.run([sys.executable, "-c", code, "info"], capture_output=True, text=True, cwd=ROOT)
    assert (out.returncode, out.stderr) == (130, "allocsim: interrupted\n"), out.stderr
    with open(f"{ROOT}/pyproject.toml") as f:      # (the console script is this entry; tomllib is Python 3.11's)
        assert 'allocsim = "allocsim._start:main"' in f.read().splitlines()


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


def test_none_as_text_is_no_limit_as_the_command_line_reads_it(small_trace_path):
    """``cap="none"``, ``capacity="off"`` and ``caps=["none", "4GB"]`` are no limit, as ``--cap none``,
    ``--capacity off`` and ``--caps none,4GB`` (they were "cannot parse size 'none'")."""
    assert allocsim.ReplaySettings(cap="none").cap is None and allocsim.ReplaySettings(capacity="off").capacity is None
    assert _figures(allocsim.replay(small_trace_path, "split", cap="none")) == \
        _figures(allocsim.replay(small_trace_path, "split"))
    rows = allocsim.compare(small_trace_path, "split", caps=["none", "4GB"], jobs=1)
    assert [r["cap_bytes"] for r in rows] == [None, 4 * 10**9]


@pytest.mark.parametrize("text,size", [("8e3", 8000), ("8e+3", 8000), ("1e-3GB", 10**6), ("5e-1KiB", 512),
                                       ("0.1GiB", 107374182), ("1.5KB", 1500), ("0e-5GB", 0)])
def test_a_size_takes_an_exponent_of_either_sign(text, size):
    """An exponent may be negative as well as positive (``1e-3GB`` was refused while ``8e3`` was taken); a size with a
    unit is rounded to the nearest byte as before."""
    from allocsim.units import parse_size
    assert parse_size(text) == size == allocsim.ReplaySettings(cap=text).cap


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


def test_compare_replays_the_trace_object_as_it_is_not_its_file_as_it_was(tmp_path, small_trace_path):
    """A loaded `Trace` whose metadata the caller changed, or whose file was replaced since, is replayed as the
    object holds it (its file held another trace: `compare` gave the file's figures)."""
    import shutil
    src = f"{ROOT}/traces/gpt2-maxsplit128-rp2div4.bin"
    t = allocsim.Trace.load(src)
    on_file = allocsim.compare(src, "torch")[0]["peak_reserved_bytes"]
    t.meta["allocator_settings"] = {}               # the recorded settings gone: another peak
    assert t.file_as_read() is None
    changed = allocsim.replay(t, "torch").to_dict()["peak_reserved_bytes"]
    assert changed != on_file and allocsim.compare(t, "torch")[0]["peak_reserved_bytes"] == changed
    mine = str(tmp_path / "mine.bin")
    shutil.copy(small_trace_path, mine)
    u = allocsim.Trace.load(mine)
    assert u.file_as_read() == mine
    before = allocsim.replay(u, "split").to_dict()["peak_reserved_bytes"]
    allocsim.synthesize("mlp", iterations=2, path=mine, force=True)       # the file replaced under the object
    assert allocsim.compare(mine, "split")[0]["peak_reserved_bytes"] != before
    assert allocsim.compare(u, "split")[0]["peak_reserved_bytes"] == before


@pytest.mark.parametrize("policy,options,says", [
    ("torch", {"max_split_size_mb": -5}, "option max_split_size_mb: too small, must be >= 20"),
    ("torch", {"garbage_collection_threshold": 5.0}, "option garbage_collection_threshold: must lie in (0.0, 1.0)"),
    ("torch", {"expandable_segments": 1.5}, "option expandable_segments: expected true or false, got 1.5"),
    ("torch", {"max_split_size_mb": 128.5}, "option max_split_size_mb: expected an integer, got 128.5"),
    ("cupy", {"limit": -1}, "option limit: size: negative size"),
    ("cupy", {"limit": [1]}, "option limit: expected a size in bytes (an integer), got [1]")])
def test_options_given_as_a_dict_meet_the_command_lines_checks(policy, options, says):
    """A dict's typed values are checked as ``-O``'s text is (each replayed, with another peak, where the command
    line refuses it); values of the parameter's type, numpy's too, None and the declared default are taken."""
    import numpy as np
    from allocsim.errors import UsageError
    with pytest.raises(UsageError, match=re.escape(says)):
        allocsim.PolicySpec.of(policy, options)
    taken = allocsim.PolicySpec.of("torch", {"max_split_size_mb": np.int64(128), "expandable_segments": np.bool_(True),
                                             "garbage_collection_threshold": np.float64(0.5)})
    assert taken == allocsim.PolicySpec.of("torch[max_split_size_mb:128,expandable_segments:true,"
                                           "garbage_collection_threshold:0.5]")
    assert allocsim.PolicySpec.of("torch", {"garbage_collection_threshold": 0.0, "max_split_size_mb": None}).options \
        == (("garbage_collection_threshold", 0.0), ("max_split_size_mb", None))


def test_a_replay_closed_part_way_gives_no_result(small_trace_path):
    """``run()`` after ``close()`` part-way returned the events walked until then as the run's result; it is refused,
    as are ``step``, ``result`` and ``finish``. A finished replay keeps its result after ``close``."""
    r = allocsim.Replay(small_trace_path, "split")
    r.run(until=50)
    r.close()
    for call in (r.run, r.step, r.result, r.finish):
        with pytest.raises(ValueError, match="closed part-way"):
            call()
    done = allocsim.Replay(small_trace_path, "split")
    res = done.run()
    done.close()
    assert done.run() is res and done.result() is res


def test_the_api_writes_no_device_and_no_trace_without_force(tmp_path, small_trace_path):
    """`Trace.save`, ``synthesize(path=)`` and ``import_trace`` write as the command line does: a pipe or a device is
    refused (``Trace.save("/dev/null")`` run as root replaced /dev/null with the trace: here a FIFO stands in), a
    trace already there is replaced only with ``force`` (both replaced it silently), a failed synthesis leaves no
    file, and what is no GPU's index, memory or name is refused by name."""
    import os
    import shutil
    import stat
    from allocsim.errors import InputError, UsageError
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    t = allocsim.Trace.load(small_trace_path)
    with pytest.raises(InputError, match="is a pipe or a device, not a file"):
        t.save(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    kept = str(tmp_path / "kept.bin")
    shutil.copy(small_trace_path, kept)
    with pytest.raises(InputError, match="exists and is an allocsim trace"):
        allocsim.synthesize("mlp", iterations=2, path=kept)
    log = f"{ROOT}/tests/fixtures/log.csv"
    with pytest.raises(InputError, match="exists and is an allocsim trace"):
        allocsim.import_trace(log, kept)
    assert open(kept, "rb").read() == open(small_trace_path, "rb").read()
    assert len(allocsim.synthesize("mlp", iterations=2, path=kept, force=True).marks()) == 2
    allocsim.import_trace(log, kept, force=True, total_memory="8GiB")
    assert allocsim.Trace.load(kept).meta["device"]["total_memory"] == 8 << 30
    with pytest.raises(UsageError, match="out of range"):
        allocsim.synthesize("mlp", iterations=2, batch=10**30, path=str(tmp_path / "half.bin"))
    assert "half.bin" not in os.listdir(tmp_path) and not any(".tmp" in f for f in os.listdir(tmp_path))
    with pytest.raises(UsageError, match="path: the name of the file"):
        allocsim.synthesize("mlp", iterations=2, path=1)          # (it was taken as a file descriptor)
    for bad, says in (({"total_memory": 1.5}, "total_memory: the GPU's memory"), ({"device": "0"}, "device: a GPU's"),
                      ({"device_name": "a\nb"}, "device_name 'a\\\\x0ab': a GPU's name")):
        with pytest.raises(UsageError, match=says):
            allocsim.import_trace(log, str(tmp_path / "o.bin"), **bad)
    assert not os.path.exists(tmp_path / "o.bin")


@pytest.mark.parametrize("call,error,says", [
    (lambda t: allocsim.replay(t, "split", {"cap": 1}), TypeError, "settings: a ReplaySettings"),
    (lambda t: allocsim.replay(t, "split", costs="x"), TypeError, "replay setting costs: a CostModel"),
    (lambda t: allocsim.replay(t, "split", device=5), TypeError, "device: a device that make_device made"),
    (lambda t: allocsim.replay(t, "split", runtime=[]), TypeError, "replay setting runtime: a name"),
    (lambda t: allocsim.replay(t, "split", keep_going="no"), TypeError, "replay setting keep_going: True or False"),
    (lambda t: allocsim.compare(t, "split", settings={"cap": 1}), TypeError, "settings: a Settings or a ReplaySettings"),
    (lambda t: allocsim.compare(t, "split", jobs="2"), TypeError, "jobs: an integer"),
    (lambda t: allocsim.compare(t, "split", jobs=0), ValueError, r"jobs=0 \(at least 1\)"),
    (lambda t: allocsim.compare(t, "split", caps=1.5), TypeError, "replay setting cap: a size in bytes"),
    (lambda t: allocsim.fit_capacity(t, "split", resolution=1.5), TypeError, "resolution: an integer"),
    (lambda t: allocsim.fit_capacity(t, "split", resolution=True), TypeError, "resolution: an integer"),
    (lambda t: allocsim.fit_capacity(t, "split", top=-1), ValueError, r"top=-1 \(at least 1\)"),
    (lambda t: allocsim.fit_capacity(t, "split", max_replays=-1), ValueError, r"max_replays=-1 \(at least 0\)"),
    (lambda t: allocsim.fit_capacity(t, "split", max_replays=1.5), TypeError, "max_replays: an integer")])
def test_api_arguments_of_the_wrong_kind_are_refused_by_name(small_trace_path, call, error, says):
    """Each failed deep inside (an AttributeError, an unhashable type, a comparison of str and int), named an
    argument the caller never gave ("replay setting cap" for fit's ``resolution``), or ran with another meaning
    (``keep_going="no"`` kept going, ``max_replays=-1`` gave another capacity, ``jobs=0`` ran)."""
    with pytest.raises(error, match=says):
        call(small_trace_path)


def test_fit_reads_its_sizes_as_the_command_line_does(small_trace_path):
    """``resolution`` and ``top`` as text (``"1MiB"``) are the sizes their integers are."""
    assert allocsim.fit_capacity(small_trace_path, "split", resolution="1MiB", top="2GiB") == \
        allocsim.fit_capacity(small_trace_path, "split", resolution=1 << 20, top=2 << 30)


@pytest.mark.parametrize("policy,options,says", [
    ("torch", {"expandable_segments": None}, "option expandable_segments: expected true or false, got 'none'"),
    ("torch", {"roundup_power2_divisions": "abc"}, "option roundup_power2_divisions: expected an integer"),
    ("cupy", {"version": 14}, "option version: expected one of the choices, got 14"),
    ("torch", {"roundup_power2_divisions": 5.5}, "option roundup_power2_divisions: expected text or a table, got 5.5")])
def test_a_dict_takes_none_text_and_choices_as_the_command_line_does(policy, options, says):
    """None only where "none" is a value (an unset default), a text option's own parser on its text (a bad
    divisions text died inside the replay with a bare ValueError), a choice only as its text; 0 and numpy's 0.0 are
    ``garbage_collection_threshold``'s default 0.0 (a snapshot records "none set" as 0)."""
    import numpy as np
    from allocsim.errors import UsageError
    with pytest.raises(UsageError, match=re.escape(says)):
        allocsim.PolicySpec.of(policy, options)
    off = allocsim.PolicySpec.of("torch", {"garbage_collection_threshold": 0.0})
    assert allocsim.PolicySpec.of("torch", {"garbage_collection_threshold": 0}) == off == \
        allocsim.PolicySpec.of("torch", {"garbage_collection_threshold": np.float64(0.0)})
    assert allocsim.PolicySpec.of("torch", {"roundup_power2_divisions": "[256:4,>:1]"}) == \
        allocsim.PolicySpec.parse("torch[roundup_power2_divisions:[256:4,>:1]]") == \
        allocsim.PolicySpec.of("torch", {"roundup_power2_divisions": {"256": 4, ">": 1}})   # (as PyTorch spells it)
    assert allocsim.PolicySpec.of("torch", {"roundup_power2_divisions": 4}) == \
        allocsim.PolicySpec.parse("torch[roundup_power2_divisions:4]")


def test_a_presets_parameters_are_checked_by_their_type():
    """``synthesize(batch=1.5)`` made a batch of 1, ``batch=None`` failed in a comparison; a numpy integer is one."""
    import numpy as np
    from allocsim.errors import UsageError
    for bad, says in ((1.5, "expected an integer, got 1.5"), (True, "expected an integer, got True"),
                      (None, "expected a value, got None")):
        with pytest.raises(UsageError, match=re.escape(f"parameter batch: {says}")):
            allocsim.synthesize("mlp", iterations=2, batch=bad)
    assert len(allocsim.synthesize("mlp", iterations=2, batch=np.int64(64))) == \
        len(allocsim.synthesize("mlp", iterations=2, batch="64"))
