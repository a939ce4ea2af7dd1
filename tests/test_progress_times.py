"""Long commands show progress on a terminal (and nothing elsewhere); replay reports load and replay time apart."""
import io
import json
import re
import time

from allocsim.replay import replay
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
    from allocsim.spec import PolicySpec
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
