"""Plug-in policies and `PolicySpec`: the example plug-in runs wherever a built-in does, every entry point
parses a policy the same way, and `check_policy` passes a good pool and names what a broken one breaks."""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
from importlib.metadata import EntryPoint

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import allocsim
from allocsim import policies
from allocsim.engine import spec
from allocsim.errors import UsageError
from allocsim.engine.spec import PolicySpec
from allocsim.testing import check_policy
from conftest import ROOT, random_trace, run_cli

EXAMPLES = os.path.join(ROOT, "examples", "policies")
FIRST_FIT = "examples/policies/first_fit.py:FirstFit"


def cli(*argv, cwd=ROOT):
    """`allocsim ARGV` in this process: (status, stdout, stderr)."""
    from allocsim.cli import main
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(list(argv))
    finally:
        os.chdir(old)
    return status, out.getvalue(), err.getvalue()


def first_fit():
    return PolicySpec.parse(f"{EXAMPLES}/first_fit.py:FirstFit").policy_class()


# ---- the example runs everywhere --------------------------------------------------------------
def test_replay_json_of_the_plugin_equals_the_python_api(small_trace_path):
    status, out, err = cli("replay", small_trace_path, "--policy", FIRST_FIT, "-O", "segment=8MiB", "--json")
    assert status == 0, err
    got = json.loads(out)
    want = allocsim.replay(small_trace_path, first_fit(), options={"segment": 8 << 20}).to_dict()
    assert got["policy"] == "first_fit" and got["options"] == {"segment": 8 << 20}
    for k in ("peak_reserved_bytes", "device_mallocs", "alloc_time_seconds", "ooms"):
        assert got[k] == want[k], k


def test_compare_in_worker_processes(small_trace_path):
    status, out, err = cli("compare", small_trace_path, "-p", f"split,{FIRST_FIT}[segment:4MiB]", "--caps", "none,40MB",
                           "-j", "2", "--json")
    assert status == 0, err
    rows = json.loads(out)
    assert sorted({(r["policy"], r["options"]) for r in rows}) == [(FIRST_FIT, "segment:4MiB"), ("split", "")]
    ff = [r for r in rows if r["policy"] == FIRST_FIT and r["cap_bytes"] is None][0]
    single = allocsim.replay(small_trace_path, f"{FIRST_FIT}[segment=4MiB]")
    assert ff["peak_reserved_bytes"] == single.peak_reserved_bytes


def test_fit_and_plot(small_trace_path, tmp_path):
    status, out, err = cli("fit", small_trace_path, "-p", FIRST_FIT, "--no-oracle", "-j", "1", "--json")
    assert status == 0, err
    f = json.loads(out)["fits"][0]
    assert f["policy"] == FIRST_FIT and f["load_bytes"] <= f["capacity_bytes"] <= f["unlimited_peak_bytes"]
    png = str(tmp_path / "m.png")
    status, out, err = cli("plot", small_trace_path, "-p", f"split,{FIRST_FIT}", "-o", png, "-j", "1")
    assert status == 0, err
    assert os.path.getsize(png) > 1000


def test_sweep_on_a_local_dask_cluster(small_trace_path, tmp_path):
    pytest.importorskip("dask.distributed")
    out = str(tmp_path / "s.csv")
    res = run_cli("sweep", small_trace_path, "-p", f"none,{FIRST_FIT}", "-o", out, "--dask-local", "2", "-q",
                  cwd=str(tmp_path))      # a relative plug-in path, from another folder, fails here...
    assert res.returncode == 2 and "first_fit.py" in res.stderr
    res = run_cli("sweep", small_trace_path, "-p", f"none,{FIRST_FIT}", "-o", out, "--dask-local", "2", "-q",
                  cwd=ROOT)
    assert res.returncode == 0, res.stderr
    import csv
    rows = {r["policy"]: r for r in csv.DictReader(open(out))}
    assert sorted(rows) == [FIRST_FIT, "none"]
    single = allocsim.replay(small_trace_path, f"{EXAMPLES}/first_fit.py:FirstFit")
    assert int(rows[FIRST_FIT]["peak_reserved_bytes"]) == single.peak_reserved_bytes


def test_an_installed_entry_point(monkeypatch, small_trace_path):
    monkeypatch.syspath_prepend(EXAMPLES)
    ep = EntryPoint(name="firstfit", value="first_fit:FirstFit", group=spec.ENTRY_POINT_GROUP)
    monkeypatch.setattr(spec, "entry_points", lambda: {"firstfit": ep})
    r = allocsim.replay(small_trace_path, "firstfit[align:1024]")
    assert r.policy == "first_fit" and r.options == {"align": 1024}
    status, out, _ = cli("policies")
    assert status == 0 and "\nfirstfit " in out and "\nfirst_fit " not in out   # (the name -p takes, not the class's)
    with pytest.raises(UsageError, match="known: .*firstfit"):
        PolicySpec.parse("firstfitt")


# ---- check_policy -------------------------------------------------------------------------------
def test_check_policy_passes_the_example():
    check_policy(first_fit())
    check_policy(first_fit(), [random_trace(200, seed=4)], options=["segment=1MiB", "align=256"], seed=1)


def test_check_policy_names_what_the_broken_example_breaks():
    broken = PolicySpec.parse(f"{EXAMPLES}/broken.py:ForgetfulFirstFit").policy_class()
    with pytest.raises(AssertionError, match="bytes not conserved"):
        check_policy(broken)


def test_check_policy_names_a_block_without_an_address():
    class NoAddress(first_fit()):
        def block(self, handle):
            return None, handle[1]
    with pytest.raises(AssertionError, match=r"block without an address: event \d+: block of id \d+ is \(None, "):
        check_policy(NoAddress, examples=2)


def test_the_guard_refuses_a_page_map_of_no_bytes():
    """``ctx.map`` (expandable segments' pages) is checked like ``ctx.malloc``: a non-positive size is refused."""
    class MapsNothing(first_fit()):
        def malloc(self, size, stream):
            self.ctx.map(-size)
            return super().malloc(size, stream)
    with pytest.raises(allocsim.errors.PluginError, match=r"ctx.map\(-\d+\): expected a positive number of bytes"):
        allocsim.replay(random_trace(50, seed=2), MapsNothing)


def test_replay_guards_a_plugin_only():
    """The contract checks run for a plug-in (its broken block is refused) and cost a built-in nothing."""
    class Negative(first_fit()):
        def block(self, handle):
            return -handle[0], handle[1]
    trace = random_trace(200, seed=4)
    with pytest.raises(allocsim.errors.PluginError, match="expected a non-negative address"):
        allocsim.replay(trace, Negative)
    assert allocsim.replay(trace, Negative, guard=False).peak_reserved_bytes > 0
    guarded = allocsim.Replay(trace, "split")
    assert guarded.context.malloc == guarded.device.malloc and guarded.fast_path


def test_an_unguarded_replay_takes_its_deferred_peak_state_unguarded():
    """A replay made with ``guard=False`` that leaves its peak's state to a second walk (`defer_peak_state`; also
    past its share of time for them, on a loaded machine) walks that one unguarded too: guarded, a plug-in the
    first walk was asked not to check broke the contract there (found with every peak deferred by force)."""
    class Negative(first_fit()):
        def block(self, handle):
            return -handle[0], handle[1]
    trace = random_trace(200, seed=4)
    want = allocsim.Replay(trace, Negative, guard=False).run().to_dict()
    deferred = allocsim.Replay(trace, Negative, guard=False)
    deferred.defer_peak_state()
    got = deferred.run().to_dict()
    for d in (want, got):
        d.pop("replay_seconds"), d.pop("load_seconds")
    assert got == want and got["largest_free_fragmentation_at_peak"] is not None


# ---- one parser ----------------------------------------------------------------------------------
def _option_values(p):
    """A strategy of values ``Param`` p can hold (sizes and choices included)."""
    if isinstance(p.kind, tuple):
        return st.sampled_from(p.kind)
    return {"int": st.integers(1, 10**6), "float": st.floats(0.01, 0.99), "bool": st.booleans(),
            "size": st.integers(1, 1 << 40)}.get(p.kind)


SIMPLE = [(n, p) for n in policies.names() for p in policies.get(n).params if _option_values(p) is not None]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.data())
def test_spec_text_round_trips(data):
    """text -> spec -> text -> the same spec, for every built-in's typed options and the example's."""
    name = data.draw(st.sampled_from(sorted({n for n, _ in SIMPLE})))
    params = [p for n, p in SIMPLE if n == name]
    chosen = data.draw(st.lists(st.sampled_from(params), unique_by=lambda p: p.name, max_size=3))
    values = {p.name: data.draw(_option_values(p)) for p in chosen}
    try:
        s = PolicySpec.parse(name).with_values(values)
    except UsageError:
        assume(False)                       # a value the policy refuses (torch: max_split_size_mb < 20), as -O does
    back = PolicySpec.parse(str(s))         # (what a dict takes, its text takes)
    assert back == s == PolicySpec.parse(s.label)
    assert pickle.loads(pickle.dumps(s)) == s


def test_spec_equal_however_written():
    a = PolicySpec.parse("torch[max_split_size_mb:64,expandable_segments:True]")
    b = PolicySpec.parse("torch").with_options(["expandable_segments=true", "max_split_size_mb=64"])
    c = PolicySpec.of("torch", {"expandable_segments": "yes", "max_split_size_mb": 64})
    assert a == b == c and a.label == "torch[expandable_segments:True,max_split_size_mb:64]"
    with pytest.raises(UsageError, match="policy 'cupy': option limit: .*'lots'"):
        PolicySpec.of("cupy", {"limit": "lots"})
    div = PolicySpec.parse("torch[roundup_power2_divisions:[256:1,512:2,>:8]]")
    assert PolicySpec.parse(str(div)) == div
    ff = PolicySpec.parse(f"{FIRST_FIT}[segment=64MiB]")
    assert ff.ref.startswith("/") and ff.label == f"{FIRST_FIT}[segment:64MiB]"


TYPO = "policy 'split': unknown option 'bogus'"


@pytest.mark.parametrize("argv", [
    ["replay", "{t}", "-p", "split", "-O", "bogus=1"],
    ["replay", "{t}", "-p", "split[bogus:1]"],
    ["compare", "{t}", "-p", "torch,split[bogus=1]", "-j", "1"],
    ["sweep", "{t}", "-p", "split", "-O", "bogus=1", "-o", "{d}/s.csv", "-j", "1"],
    ["fit", "{t}", "-p", "split[bogus=1]"],
    ["plot", "{t}", "-p", "split[bogus=1]", "-o", "{d}/p.png"],
], ids=lambda a: a[0] + ("-O" if "-O" in a else "-bracket"))
def test_a_typo_fails_the_same_everywhere(argv, small_trace_path, tmp_path):
    status, out, err = cli(*[a.format(t=small_trace_path, d=tmp_path) for a in argv])
    assert status == 2 and err.count("\n") == 1 and TYPO in err, err
    assert not os.path.exists(tmp_path / "s.csv") and not os.path.exists(tmp_path / "p.png")


@pytest.mark.parametrize("call", [
    lambda t: allocsim.replay(t, "split[bogus=1]"),
    lambda t: allocsim.replay(t, "split", options=["bogus=1"]),
    lambda t: allocsim.replay(t, "split", options={"bogus": 1}),
    lambda t: allocsim.compare(t, ["split[bogus:1]"]),
    lambda t: allocsim.fit_capacity(t, "split", options=("bogus=1",)),
])
def test_a_typo_fails_the_same_from_python(call, small_trace_path):
    with pytest.raises(UsageError, match=TYPO):
        call(small_trace_path)


def _write(d, name, text):
    with open(os.path.join(d, name), "w") as f:
        f.write(text)


@pytest.mark.parametrize("ref, files, expect", [
    ("nosuch.py:Pool", {}, "no such file"),
    ("p.py:Pool", {"p.py": "X = 1\n"}, "has no class 'Pool'"),
    ("p.py:Pool", {"p.py": "class Pool:\n    pass\n"}, "'Pool' is not a subclass of allocsim.policies.Policy"),
    ("p.py:Pool", {"p.py": "import os\n\nraise RuntimeError('boom')\n"}, "p.py:3: RuntimeError: boom"),
    ("p.py:Pool", {"p.py": "def f(:\n"}, "p.py:1: SyntaxError"),
    ("nosuch_pkg.mod:Pool", {}, "no module named 'nosuch_pkg'"),
    ("p.py:Pool[x=1]", {"p.py": "from allocsim.policies import Policy\nclass Pool(Policy):\n    pass\n"},
     "policy 'p.py:Pool': unknown option 'x' (known: none)"),
    ("nosuch", {}, "unknown policy 'nosuch'"),
], ids=["file-missing", "class-missing", "not-a-policy", "import-error", "syntax-error", "module-missing",
        "plugin-option", "unknown-name"])
def test_a_bad_plugin_is_one_line(ref, files, expect, tmp_path, small_trace_path):
    for name, text in files.items():
        _write(tmp_path, name, text)
    status, out, err = cli("replay", small_trace_path, "-p", ref, cwd=str(tmp_path))
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert expect in err and "Traceback" not in err, err


RAISES_IN_MALLOC = (f"import sys\nsys.path.append({EXAMPLES!r})\nfrom first_fit import FirstFit\n"
                    "class Pool(FirstFit):\n    def malloc(self, size, stream):\n        raise KeyError(size)\n")


def test_a_plugin_that_raises_in_malloc_is_one_line_with_debug_for_the_traceback(tmp_path, small_trace_path):
    _write(tmp_path, "p.py", RAISES_IN_MALLOC)
    status, out, err = cli("replay", small_trace_path, "-p", "p.py:Pool", cwd=str(tmp_path))
    assert status == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert "policy 'p.py:Pool' failed while replaying: KeyError:" in err and "p.py:6)" in err, err
    # --debug: the plug-in's own exception's traceback, chained under allocsim's, then the one line; the status kept
    status, out, debug = cli("--debug", "replay", small_trace_path, "-p", "p.py:Pool", cwd=str(tmp_path))
    assert status == 2 and out == "" and debug.endswith(err), debug
    own, ours = debug.split("The above exception was the direct cause of the following exception:")
    assert "Traceback" in own and 'p.py", line 6' in own and own.rstrip().splitlines()[-1].startswith("KeyError"), own
    assert "allocsim.errors.PluginError: policy 'p.py:Pool' failed while replaying" in ours, ours


PLUGIN_HEAD = f"import sys\nsys.path.append({EXAMPLES!r})\nfrom first_fit import FirstFit\nclass Pool(FirstFit):\n"


@pytest.mark.parametrize("body, says", [
    ("    def malloc(self, size, stream):\n        h = super().malloc(size, stream)\n        self.allocated = 0\n"
     "        return h\n", "allocated is 0 B, outside the"),
    ("    def counters(self):\n        return {'cache_flushes': -7}\n", "cache_flushes is -7, not a count"),
    ("    def counters(self):\n        return {'mine': float('nan')}\n", "counters() holds 'mine': nan"),
    ("    def counters(self):\n        return [1]\n", "counters() returned list, not a dict"),
], ids=["allocated-below-held", "negative-flushes", "nan-counter", "counters-not-a-dict"])
def test_the_guard_refuses_a_plugins_figures_that_no_allocator_has(body, says, tmp_path, small_trace_path):
    """``allocated`` below the bytes its live blocks were asked for (it printed 0 B, 100 % fragmentation) and
    counters that are no counts (a negative flush count printed, then wedged a sweep's partial table)."""
    _write(tmp_path, "p.py", PLUGIN_HEAD + body)
    status, out, err = cli("replay", small_trace_path, "-p", "p.py:Pool", cwd=str(tmp_path))
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert "policy 'p.py:Pool' broke the policy contract" in err and says in err, err


def test_a_plugins_counter_named_as_a_figure_is_said_to_be_its_own(tmp_path, small_trace_path):
    _write(tmp_path, "p.py", PLUGIN_HEAD + "    def counters(self):\n        return {'device_mallocs': 0, 'mine': 3}\n")
    status, out, err = cli("replay", small_trace_path, "-p", "p.py:Pool", cwd=str(tmp_path))
    assert status == 0, err
    assert "\n  first_fit's own counters\n    device mallocs (policy counter)" in out and "\n    mine " in out
    assert "\n  device mallocs   " not in out


def test_a_counters_override_alone_is_checked_and_numpys_numbers_are_counted(tmp_path, small_trace_path):
    """A subclass of a built-in that overrides ``counters`` alone runs unguarded, its counters checked all the same
    (a flush count of -3 printed); numpy's numbers are numbers, given back as Python's for ``--json``."""
    _write(tmp_path, "t.py", "from allocsim.policies.torch import TorchCachingAllocator\n"
                             "class T(TorchCachingAllocator):\n    name = 't-plugin'\n"
                             "    def counters(self):\n        return {**super().counters(), 'cache_flushes': -3}\n")
    status, out, err = cli("replay", small_trace_path, "-p", "t.py:T", cwd=str(tmp_path))
    assert status == 2 and "counters()' cache_flushes is -3, not a count" in err, err
    _write(tmp_path, "p.py", PLUGIN_HEAD + "    def counters(self):\n        import numpy as np\n"
                             "        return {'segments': np.int64(len(self.segments)), 'share': np.float32(0.5)}\n")
    status, out, err = cli("replay", small_trace_path, "-p", "p.py:Pool", "--json", cwd=str(tmp_path))
    assert status == 0, err
    counters = json.loads(out)["counters"]
    assert counters["share"] == 0.5 and type(counters["segments"]) is int and counters["segments"] > 0


@pytest.mark.parametrize("argv", [["compare", "{t}", "-p", "split,p.py:Pool", "-q", "--csv", "p.py", "--force"],
                                  ["sweep", "{t}", "-p", "split,p.py:Pool", "-q", "-o", "p.py", "--format", "csv",
                                   "--force"],
                                  ["compare", "{t}", "-p", "split", "-q", "--csv", "other.py"]],
                         ids=["compare-plugin", "sweep-plugin", "python-file-without-force"])
def test_an_output_never_replaces_a_plugins_file_and_a_python_file_needs_force(argv, tmp_path, small_trace_path):
    """A plug-in's file is an input (``compare --csv ff.py`` wrote its table over the plug-in's source): never
    replaced, ``--force`` or not; another Python file is replaced only with ``--force``."""
    _write(tmp_path, "p.py", PLUGIN_HEAD + "    pass\n")
    _write(tmp_path, "other.py", "X = 1\n")
    status, out, err = cli(*[a.replace("{t}", small_trace_path) for a in argv], cwd=str(tmp_path))
    assert status == 2 and err.count("\n") == 1, err
    assert ("would overwrite the input" if "p.py" in argv else "exists and is a Python source file") in err, err
    assert (tmp_path / "p.py").read_text().startswith("import sys") and (tmp_path / "other.py").read_text() == "X = 1\n"


def test_a_sweep_stopped_by_a_plugin_keeps_the_finished_rows_and_says_how_to_resume(tmp_path, small_trace_path):
    _write(tmp_path, "p.py", RAISES_IN_MALLOC)
    argv = ["sweep", small_trace_path, "-p", "split,p.py:Pool", "-j", "1", "-o", "r.csv"]
    status, out, err = cli(*argv, cwd=str(tmp_path))
    kept, failed = err.splitlines()
    assert status == 2 and kept == "sweep: 1 of 2 cells kept in r.csv.partial; the same command resumes from them"
    assert "policy 'p.py:Pool' failed while replaying" in failed
    assert not (tmp_path / "r.csv").exists() and len((tmp_path / "r.csv.partial").read_text().splitlines()) == 2
    status, out, err = cli(*argv[:3], "split", *argv[4:], cwd=str(tmp_path))     # the split cell is not replayed again
    assert status == 0 and "1 of 1 cells already done, resuming" in err, err


def test_a_broken_entry_point_is_one_line_and_the_rest_are_still_listed(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)
    eps = {"broken": EntryPoint(name="broken", value="nosuch_pkg_xyz.pools:Pool", group=spec.ENTRY_POINT_GROUP),
           "firstfit": EntryPoint(name="firstfit", value="first_fit:FirstFit", group=spec.ENTRY_POINT_GROUP)}
    monkeypatch.setattr(spec, "entry_points", lambda: eps)
    status, out, err = cli("policies")
    assert status == 2 and "split " in out and "firstfit " in out, out      # listed after the broken one
    assert err.count("\n") == 1 and "policy 'broken'" in err and "nosuch_pkg_xyz" in err, err
    status, out, err = cli("policies", "broken")         # asked for by name: the error itself
    assert status == 2 and out == "" and "policy 'broken'" in err, err


def _as_dict(res) -> dict:
    d = res.to_dict()
    d.pop("replay_seconds", None)
    return d


@pytest.mark.parametrize("base, options", [("split", {}), ("bestfit", {}), ("torch", {}), ("cupy", {"track_total": True})])
def test_a_plugin_subclass_of_a_builtin_has_its_malloc_and_free_called(base, options, small_trace_path):
    """Nothing is bound onto an instance: a plug-in that overrides a built-in's malloc and free has them called,
    through the plain loop (the built-in's fused loop inlines the built-in's own), and replays as the built-in."""
    from allocsim import Replay, Trace
    calls = {"malloc": 0, "free": 0}

    class Counting(policies.get(base)):
        def malloc(self, size, stream):
            calls["malloc"] += 1
            return super().malloc(size, stream)

        def free(self, handle):
            calls["free"] += 1
            super().free(handle)

    trace = Trace.load(small_trace_path)
    r = Replay(trace, Counting, options=options)
    assert not r.fast_path
    res = r.run()
    assert calls == {"malloc": res.allocs, "free": res.frees} and res.allocs and res.frees
    assert _as_dict(res) == _as_dict(Replay(trace, base, options=options).run())


def test_a_plugin_subclass_that_keeps_malloc_and_free_keeps_the_fused_loop(small_trace_path):
    """`Policy.fused_loop`: the built-in's fused loop stands for its malloc and free, so a subclass that overrides
    neither walks through it."""
    from allocsim import Replay, Trace

    class Quiet(policies.get("split")):
        def counters(self):
            return {}
    assert Replay(Trace.load(small_trace_path), Quiet).fast_path


# ---- plug-in folders kept apart -----------------------------------------------------------------
SIBLING_POLICY = (f"import sys\nsys.path.append({EXAMPLES!r})\nfrom first_fit import FirstFit\nfrom common import SEGMENT\n"
                  f"class P(FirstFit):\n    def __init__(self, *a, **k):\n        super().__init__(*a, **k)\n"
                  f"        self.segment = SEGMENT\n")


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_plugins_in_two_folders_each_import_their_own_module_of_one_name(order, jobs, tmp_path, small_trace_path):
    """Two plug-in folders each with a ``common.py``: each plug-in imports its own folder's, whatever the order of
    ``-p`` and in worker processes too (the first one loaded was shared by both)."""
    segments = {"a": 4 << 20, "b": 64 << 20}
    for d, seg in segments.items():
        os.mkdir(tmp_path / d)
        _write(tmp_path / d, "common.py", f"SEGMENT = {seg}\n")
        _write(tmp_path / d, "pol.py", SIBLING_POLICY)
    status, out, err = cli("compare", small_trace_path, "-p", ",".join(f"{d}/pol.py:P" for d in order), "-j", jobs,
                           "--json", cwd=str(tmp_path))
    assert status == 0, err
    got = {r["policy"][0]: r["peak_reserved_bytes"] for r in json.loads(out)}
    want = {d: allocsim.replay(small_trace_path, f"{EXAMPLES}/first_fit.py:FirstFit", options={"segment": seg})
            .peak_reserved_bytes for d, seg in segments.items()}
    assert got == want and want["a"] != want["b"]


# ---- a subclass of a built-in and the fused loop --------------------------------------------------
def _no_reuse(base: str, helper: str, how: str) -> type:
    """A subclass of ``base`` whose ``helper`` (a step of its malloc that its fused loop inlines) does nothing: in the
    class's body, from a mixin, or set on the instance."""
    def none(self, *a):
        return 0
    builtin = policies.get(base)
    if how == "mixin":
        return type("NoReuse", (type("Mixin", (), {helper: none}), builtin), {})
    if how == "instance":
        def __init__(self, *a, **k):
            builtin.__init__(self, *a, **k)
            setattr(self, helper, lambda *a: 0)
        return type("NoReuse", (builtin,), {"__init__": __init__})
    return type("NoReuse", (builtin,), {helper: none})


@pytest.mark.parametrize("how", ["subclass", "mixin", "instance"])
@pytest.mark.parametrize("base, helper", [("bestfit", "_pop_fit"), ("split", "_repopulate")])
def test_a_plugin_subclass_that_overrides_a_helper_the_fused_loop_inlines_walks_plainly(base, helper, how,
                                                                                      small_trace_path):
    """`Policy.fused_loop`: a subclass that overrides a helper of its built-in's malloc (not malloc or free) takes
    the plain walk, and replays with its override (the fused loop, which inlines the built-in's, replayed it as
    the built-in)."""
    from allocsim import Replay, Trace
    trace, pcls = Trace.load(small_trace_path), _no_reuse(base, helper, how)
    r = Replay(trace, pcls)
    got, plain = _as_dict(r.run()), _as_dict(Replay(trace, pcls, fast_path=False).run())
    builtin = _as_dict(Replay(trace, base).run())
    assert got == plain and {**got, "policy": base} != builtin
    assert not r.fast_path


@pytest.mark.parametrize("base", ["bestfit", "split", "cupy"])
def test_a_plugin_subclass_that_overrides_only_what_no_fused_loop_inlines_keeps_it(base, small_trace_path):
    """`Policy.NOT_INLINED`: ``__init__`` and what the engine reads outside the walk (counters, largest_free) may be
    overridden, and a method of the plug-in's own added, with the built-in's fused loop kept, replaying as it."""
    from allocsim import Replay, Trace
    builtin = policies.get(base)

    class Reporting(builtin):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.note = "mine"

        def counters(self):
            return dict(super().counters(), notes=1)

        def largest_free(self):
            return super().largest_free()

        def describe(self):
            return self.note
    trace = Trace.load(small_trace_path)
    r = Replay(trace, Reporting)
    assert r.fast_path
    assert _as_dict(r.run()) == _as_dict(Replay(trace, Reporting, fast_path=False).run())


def test_two_versions_of_a_plugin_registering_one_name_compare_side_by_side(tmp_path, small_trace_path):
    """``@register`` under a name a built-in has is refused; under a name another plug-in registered (two versions of
    one plug-in) it is not: that name is the plug-ins' own ("a built-in policy's name" was said of it)."""
    body = (f"import sys\nsys.path.append({EXAMPLES!r})\nfrom allocsim.policies import register\n"
            "from first_fit import FirstFit\n\n\n@register\nclass FF(FirstFit):\n    name = 'myff'\n")
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        _write(tmp_path / d, "ff.py", body)
    status, out, err = cli("compare", small_trace_path, "-p", "a/ff.py:FF,b/ff.py:FF", "-q", "-j", "1",
                           cwd=str(tmp_path))
    assert status == 0 and "a/ff.py:FF" in out and "b/ff.py:FF" in out, err


def test_a_subclass_that_overrides_a_builtins_helper_is_guarded(tmp_path, small_trace_path):
    """A subclass of `bestfit` whose ``_pop_fit`` hands out a live block again walks plainly (its helper runs) and
    is guarded as a plug-in is: one line, where the unguarded replay gave two objects one block, exit 0."""
    _write(tmp_path, "twice.py", "from allocsim.policies.bestfit import BestFit\n\n\nclass Twice(BestFit):\n"
                                 "    name = 'twice'\n    last = 0\n\n    def _pop_fit(self, n):\n"
                                 "        b = super()._pop_fit(n)\n"
                                 "        return self.last if not b and self.last and self._size[self.last] >= n else b\n\n"
                                 "    def _grow(self, n):\n        b = self.last = super()._grow(n)\n        return b\n")
    status, out, err = cli("replay", small_trace_path, "-p", "twice.py:Twice", cwd=str(tmp_path))
    assert status == 2 and err.count("\n") == 1, err
    assert "policy 'twice.py:Twice' broke the policy contract" in err and "overlaps a live block" in err, err
