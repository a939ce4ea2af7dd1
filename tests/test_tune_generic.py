"""The search is generic (docs/tune.md, "The search and its spaces"): `allocsim.search.tune` names no framework's option nor reads a
policy member the contract does not declare, and a space's own family rule (`allocsim.search.spaces.family`), made
up here, drives how its settings share a replay, every figure the same."""
import ast
import os

import allocsim.search.tune as tune_mod
from allocsim.policies.torch import TorchCachingAllocator
from allocsim.search.spaces import torch as torch_space
from allocsim.search.spaces.family import NO_FAMILIES, FamilyRule, Watcher
from allocsim.search.sweep import cached_trace
from allocsim.search.tune import tune

from test_tune import small_grid, torch_trace  # noqa: F401  (the fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
#: The torch members a family's watch reads (`allocsim.search.spaces.torch.TorchWatcher`) that `Policy` does not declare.
TORCH_MEMBERS = {"allowed", "keep_gc_ages", "max_split", "num_alloc_retries", "expandable", "gc_high", "oversize_slack"}


def test_the_search_names_no_framework_option():
    """No option of the torch model (its declared parameters), no torch member it reads, no framework module."""
    path = tune_mod.__file__
    source = open(path).read()
    options = {p.name for p in TorchCachingAllocator.params}
    assert len(options) >= 5
    named = sorted(o for o in options if o in source)
    assert not named, f"{path} names torch options {named}"
    tree = ast.parse(source)
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
        {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & TORCH_MEMBERS, f"{path} reads torch members {sorted(names & TORCH_MEMBERS)}"
    imported = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not [m for m in imported if "torch" in m or m.split(".")[0] in ("frameworks", "policies")]


class PartAtOnce(Watcher):
    """A made-up watch: every member may part in any window and parts in the first (resumed from the start)."""

    def __init__(self, watches):
        self.pending = dict(enumerate(watches))
        self.began = 0

    def begin(self, replay):
        self.began += 1

    def could_part(self, k):
        return bool(self.pending)

    def parted(self):
        out = list(self.pending)
        self.pending.clear()
        return out


class ThresholdsOnly(FamilyRule):
    """A made-up rule for the torch space: a GC threshold's setting under the same setting without one, parted
    from it at once (so every member is replayed, from the first event: always right)."""

    def __init__(self):
        self.watchers = []

    def shares(self, trace):
        return True

    def heads(self, values):
        return [torch_space.spec({**values, "garbage_collection_threshold": 0.0})]

    def watch(self, head, member):
        return "threshold" if head.get("garbage_collection_threshold") != member.get("garbage_collection_threshold") \
            else None

    def watcher(self, trace, head, watches, window):
        self.watchers.append(PartAtOnce(watches))
        return self.watchers[-1]


def answer(res) -> tuple:
    """What a search found: the best and the frontier, and the figures of every setting replayed to the end (a
    setting the bound stopped may stop at another point, under the bound as it stood when it started)."""
    full = {r["setting"]: {k: v for k, v in r.items() if k != "replay_seconds"} for r in res.rows if not r["pruned"]}
    return res.best and res.best["setting"], [r["setting"] for r in res.frontier], full


def test_a_space_s_own_rule_drives_the_families(tmp_path, small_grid, monkeypatch):  # noqa: F811
    """The search with a made-up rule on the torch space forms its families (and calls its watcher), with no rule
    shares nothing; both give the torch rule's figures, row for row."""
    steps = [("a", 30 * MiB), ("a", 3 * MiB), ("f", 0), ("a", 50 * MiB), ("a", 12 * MiB), ("f", 1), ("a", 40 * MiB),
             ("f", 0), ("a", 70 * MiB), ("f", 2), ("a", 8 * MiB)] * 3
    path = torch_trace(str(tmp_path / "t.bin"), steps)
    cap = int(1.3 * cached_trace(path).load_bytes)
    monkeypatch.setattr(tune_mod, "WINDOW", 4)
    theirs = tune(path, cap=cap, jobs=1, fit=False)
    assert theirs.shared + theirs.resumed > 0
    made_up = ThresholdsOnly()
    monkeypatch.setattr(torch_space, "FAMILIES", made_up)
    ours = tune(path, cap=cap, jobs=1, fit=False)
    assert made_up.watchers and all(w.began and not w.pending for w in made_up.watchers)
    monkeypatch.setattr(torch_space, "FAMILIES", NO_FAMILIES)
    alone = tune(path, cap=cap, jobs=1, fit=False)
    assert alone.shared == alone.resumed == 0
    mine, bare, torch_rule = answer(ours), answer(alone), answer(theirs)
    assert mine[:2] == bare[:2] == torch_rule[:2]
    for got in (mine[2], torch_rule[2]):
        both = got.keys() & bare[2].keys()
        assert len(both) > len(bare[2]) // 2 and all(got[k] == bare[2][k] for k in both)


def test_allocsim_tune_checks_the_trace_once(tmp_path, monkeypatch, capsys):
    """The command and the search (its replays and capacity walks in this process) read one checked copy."""
    from allocsim.cli import main
    from allocsim.trace import Trace
    path = torch_trace(str(tmp_path / "t.bin"), [("a", 30 * MiB), ("a", 3 * MiB), ("f", 0), ("a", 50 * MiB)])
    checked = []
    real = Trace.validate
    monkeypatch.setattr(Trace, "validate", lambda self, *a, **k: checked.append(self.path) or real(self, *a, **k))
    assert main(["tune", path, "-j", "1", "--cap", "1.5x"]) == 0
    assert "recommended" in capsys.readouterr().out
    assert checked == [path]
