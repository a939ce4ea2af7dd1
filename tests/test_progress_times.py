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
