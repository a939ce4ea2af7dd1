"""Long commands show progress on a terminal (and nothing elsewhere); replay reports load and replay time apart."""
import io
import json
import re
import time

from allocsim.engine.replay import replay
from allocsim.commands import _common
from allocsim.policies import oracle

from conftest import random_trace, run_cli


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_keeps_its_clock_moving_between_updates(monkeypatch):
    # a long step with no update (validation, an oracle's plan) must not look frozen
    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    _, close = _common.progress_bar(None, "load x", unit=None)
    time.sleep(1.3)
    close()
    assert "load x 00:01" in term.getvalue()


def test_progress_bar_is_silent_off_a_terminal(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    update, close = _common.progress_bar(10, "replay")
    update(5)
    close()
    assert out.getvalue() == ""


def test_oracle_plan_reports_every_buffer_of_every_order(monkeypatch):
    monkeypatch.setattr(oracle, "PROGRESS_EVERY", 16)
    t = random_trace(300, seed=2)
    seen = []
    res = replay(t, "oracle", plan_progress=lambda done, total: seen.append((done, total)))
    total = seen[-1][1]
    assert seen[-1] == (total, total) and total == len(oracle.ORDERS) * res.allocs
    assert [d for d, _ in seen] == sorted(d for d, _ in seen) and len(seen) > len(oracle.ORDERS)


def test_replay_reports_load_and_replay_time_apart(small_trace_path):
    out = run_cli("replay", small_trace_path, "--policy", "none", "--no-sections")
    assert out.returncode == 0, out.stderr
    load, walk, total = map(float, re.search(r"load ([\d.]+)s  replay ([\d.]+)s  total ([\d.]+)s", out.stdout).groups())
    assert abs(load + walk - total) <= 0.002
    res = json.loads(run_cli("replay", small_trace_path, "--policy", "none", "--json").stdout)
    assert res["load_seconds"] > 0 and res["replay_seconds"] > 0
    assert replay(small_trace_path, "none").load_seconds > 0        # the API loads a path too



def test_phases_off_a_terminal_are_one_line_each_with_what_is_left(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    phases = _common.PhaseReport("fit", 3, "policy")
    for name in ("torch", "cupy", "split"):
        phases.start(name)
        phases.end(f"{name}: 2 replays")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert re.fullmatch(r"allocsim fit: torch: 2 replays in [\d.]+s \(1 of 3 policies; about \d+s left\)", lines[0])
    assert re.fullmatch(r"allocsim fit: split: 2 replays in [\d.]+s \(3 of 3 policies\)", lines[2])
    later = _common.PhaseReport("tune")            # a total learnt on the way
    later.end("100 settings replayed", left=1)
    assert "(1 of 2 phases; about" in out.getvalue().splitlines()[-1]


def test_phases_on_a_terminal_are_the_bar_and_quiet_is_silent(monkeypatch):
    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    phases = _common.PhaseReport("tune", 2)
    phases.start("replaying 7 settings")
    time.sleep(0.6)
    phases.end("7 settings replayed")
    assert "tune: replaying 7 settings" in term.getvalue() and "settings replayed" not in term.getvalue()
    quiet = io.StringIO()
    monkeypatch.setattr("sys.stderr", quiet)
    _common.PhaseReport("fit", 1, quiet=True).end("torch: 1 replay")
    assert quiet.getvalue() == ""


def test_plural():
    assert [_common.plural(n, w) for n, w in ((1, "policy"), (7, "policy"), (1, "replay"), (2, "replay"),
                                              (2, "day"))] == ["1 policy", "7 policies", "1 replay", "2 replays",
                                                               "2 days"]


def test_fit_bar_counts_its_policies_in_english(monkeypatch, small_trace_path):
    from allocsim.commands.fit import frontier
    from allocsim.engine.spec import PolicySpec
    term = Terminal()
    monkeypatch.setattr("sys.stderr", term)
    frontier(small_trace_path, [PolicySpec.parse("bestfit")], quiet=False, oracle=False)
    assert "fit 1 policy" in term.getvalue() and "1 policies" not in term.getvalue()


def test_long_commands_off_a_terminal_print_a_line_per_phase(small_trace_path, tmp_path):
    fit = run_cli("fit", small_trace_path, "-p", "bestfit,torch", "-j", "1")
    assert fit.returncode == 0, fit.stderr
    lines = fit.stderr.splitlines()
    assert [ln.split(":")[1].strip() for ln in lines] == ["bestfit", "torch", "oracle"], lines
    assert re.search(r"allocsim fit: torch: \d+ replays in [\d.]+s \(2 of 3 policies; about \d+s left\)", lines[1])
    assert run_cli("fit", small_trace_path, "-p", "bestfit", "-q").stderr == ""
    tune = run_cli("tune", small_trace_path, "--capacity", "1GB", "-j", "1")
    assert tune.returncode == 0, tune.stderr
    assert re.search(r"^allocsim tune: \d+ settings replayed(, \d+ of them stopped early)? in [\d.]+s "
                     r"\(1 of 2 phases; about \d+s left\)$",
                     tune.stderr, re.M), tune.stderr
    assert "capacity walks of" in tune.stderr.splitlines()[-1]
    plot = run_cli("plot", small_trace_path, "-p", "bestfit", "--report", str(tmp_path / "rep"), "-j", "1")
    assert plot.returncode == 0, plot.stderr
    steps = [ln for ln in plot.stderr.splitlines() if ln.startswith("allocsim plot: ")]
    assert len(steps) == 5 and "(5 of 5 phases)" in steps[-1] and "allocsim fit: bestfit" in plot.stderr


def test_count_lines_off_a_terminal_come_rarer_as_the_run_goes_on():
    """issue 29: a sweep of 600 cells said nothing off a terminal for 7.7 s. Lines now: none before `FIRST` seconds,
    then one each time a tenth more of the time so far has passed (`FIRST` at least, `MOST` at most), none at the
    end."""
    from allocsim.commands._progress import FIRST, MOST, CountLines
    now, out = [0.0], io.StringIO()
    lines = CountLines("sweep", 100_000, "cells", clock=lambda: now[0], out=out)
    said = []
    for done in range(1, 100_000):
        now[0] = done * 0.1                 # a cell each 0.1 s: 10,000 s in all
        before = out.getvalue().count("\n")
        lines.update(done)
        if out.getvalue().count("\n") > before:
            said.append(now[0])
    lines.update(100_000)
    gaps = [b - a for a, b in zip(said, said[1:])]
    assert said[0] == FIRST and all(FIRST <= g <= MOST + 0.1 for g in gaps), gaps[:5]
    assert max(gaps) > MOST - 1 and len(said) < 10_000 / MOST + 40, len(said)
    done = round(FIRST / 0.1)
    first = out.getvalue().splitlines()[0]
    assert first == f"allocsim sweep: {done:,} of 100,000 cells in {FIRST:.1f}s (about " \
                    f"{FIRST / done * (100_000 - done):.0f}s left)", first


def _in_process(*argv):
    """``allocsim ARGV`` in this process (stderr not a terminal): ``(status, stderr)``."""
    import contextlib
    from allocsim.cli import main
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, err.getvalue()


def test_sweep_and_compare_say_their_progress_off_a_terminal(monkeypatch, tmp_path):
    from allocsim.commands import _progress
    monkeypatch.setattr(_progress, "FIRST", 0.0)        # a line at the first cell, then as they come due
    path = str(tmp_path / "t.bin")
    random_trace(200, seed=4).save(path)
    status, err = _in_process("sweep", path, "-p", "none,split", "--caps", "none,1GB", "-j", "1", "-o",
                              str(tmp_path / "r.csv"))
    assert status == 0, err
    said = [ln.split(" in ")[0] for ln in err.splitlines()]
    assert said[0] == "allocsim sweep: 1 of 4 cells" and set(said) <= {f"allocsim sweep: {k} of 4 cells" for k in
                                                                        (1, 2, 3)}, err     # none at the end
    status, err = _in_process("compare", path, "-p", "none,split", "-j", "1")
    assert status == 0 and err.startswith("allocsim compare: 1 of 2 replays in "), err
    assert _in_process("compare", path, "-p", "none,split", "-j", "1", "-q") == (0, "")


def test_fit_lines_give_each_policy_its_own_replays_time_and_estimate_from_the_replays_left(monkeypatch):
    """issue 29: under -j the walks run side by side, and a policy's line took the wall time since the line before
    (the first had all of them, the next almost nothing); its first estimate, that time × the policies left, was 7×
    too long. A line now has the policy's own replays' time, and the estimate the replays the walks still need."""
    import types
    from math import inf
    from allocsim.commands.fit import _FitProgress
    from allocsim.engine.spec import PolicySpec
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    progress = _FitProgress([PolicySpec.parse("split"), PolicySpec.parse("torch")], False, 2, False, lambda n: None)
    walks = [types.SimpleNamespace(done=False, replays=0, left=lambda: 4.0),
             types.SimpleNamespace(done=False, replays=0, left=lambda: inf)]
    for _ in range(3):                  # side by side: split's replays take 1 s, torch's 3 s
        progress.replayed(walks, 0, 1.0)
        progress.replayed(walks, 1, 3.0)
    walks[1].done, walks[1].replays = True, 3
    progress.fitted(1, {"replays": 3})
    per_replay = (3 * 1.0 + 3 * 3.0) / 6
    assert out.getvalue() == f"allocsim fit: torch: 3 replays in 9.0s (1 of 2 policies; about " \
                             f"{per_replay * 4.0 / 2:.0f}s left)\n"
