"""The replay's state as a contract (docs/architecture.md, "Folding" and "The policy contract"): each piece
declares its copy (`checkpoint`/`restore`, named records), its fingerprint and its counters; no module reads
another's private attributes, nothing probes a member outside the base classes, and a plug-in that declares
``checkpoint``/``restore`` is resumed while one that does not is walked in full."""
from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest

from allocsim.engine.replay import Replay, replay
from allocsim.policies.base import Policy
from allocsim.trace import TraceWriter

from conftest import random_trace

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "allocsim"
#: Libraries whose private members a module may read (their own API, not allocsim's).
LIBRARIES = {"torch", "cupy", "np", "os", "sys", "argparse"}
#: The base classes, which may probe what a subclass or plug-in declares.
BASES = {"policies/base.py"}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text())


def _own_private_names(tree) -> set:
    """The private names a module defines: its functions, classes and class-body names, ``self._x``/``cls._x``
    attributes and ``__slots__``."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            out.add(node.attr)
        elif isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)             # __slots__ and the like
    return {n for n in out if n.startswith("_") and not n.startswith("__")}


def _root(node) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def test_no_module_reads_another_modules_private_attributes():
    """``x._name`` (x not self or cls) only where the module defines ``_name`` itself: a private name of another
    allocsim module is read through what that module declares."""
    modules = dict(_modules())
    own = {name: _own_private_names(tree) for name, tree in modules.items()}
    everyone = set().union(*own.values())
    bad = []
    for name, tree in modules.items():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and node.attr not in own[name] and node.attr in everyone and _root(node) not in LIBRARIES):
                bad.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "\n".join(bad)


def test_nothing_probes_a_member_outside_the_base_classes():
    """No ``hasattr(x, ...)`` and no ``getattr(x, "name", default)`` in the engine and the machine: what a piece
    offers is declared on its base class, with a default (Python's own ``__dunder__`` attributes, and an object's
    look at its own lazily made members, aside)."""
    bad = []
    for name, tree in _modules():
        if name in BASES or not name.startswith(("engine/", "machine/")):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args and not (
                    isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls")) and (
                    node.func.id == "hasattr" or node.func.id == "getattr" and len(node.args) == 3
                    and isinstance(node.args[1], ast.Constant) and not node.args[1].value.startswith("__")):
                bad.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "\n".join(bad)


# ---- a plug-in's checkpoints ------------------------------------------------------------------------------
class Direct(Policy):
    """A plug-in that asks the device for every block and keeps nothing: declares no checkpoint."""

    name = "direct-plugin"

    def malloc(self, size, stream):
        addr = self.ctx.malloc(size)
        if addr is None:
            return None
        self.allocated += size
        return addr, size

    def free(self, handle):
        self.ctx.free(*handle)
        self.allocated -= handle[1]

    def block(self, handle):
        return handle


class Resumable(Direct):
    """The same plug-in, declaring its copy: its state is ``allocated``, its handles are immutable."""

    def checkpoint(self, handles):
        return self.allocated, dict(handles)

    def restore(self, state):
        self.allocated, handles = state
        return dict(handles)


def _strip(res) -> dict:
    d = res.to_dict()
    d.pop("replay_seconds")
    return d


@pytest.mark.parametrize("at", [1, 700, 1999])
def test_a_plugin_that_declares_its_copy_is_resumed_as_it_walked_on(at):
    """Its replay checkpoints (a record with named parts) and a fresh one resumed from it ends as the full walk."""
    t = random_trace(2000, seed=3, max_size=1 << 22, streams=2)
    whole = replay(t, Resumable, guard=False)
    r = Replay(t, Resumable, guard=False)
    assert r.can_checkpoint()
    r.step(at)
    state = r.checkpoint()
    names = {f.name for f in dataclasses.fields(state)}
    assert {"policy", "device", "walk", "sections", "runtime"} <= names
    again = Replay(t, Resumable, guard=False)
    again.resume(state)
    assert _strip(again.run()) == _strip(whole)
    assert _strip(r.run()) == _strip(whole)


def test_a_plugin_that_declares_no_copy_is_walked_in_full():
    t = random_trace(500, seed=4)
    assert not Policy.can_checkpoint(Policy.__new__(Direct))
    r = Replay(t, Direct, guard=False)
    assert not r.can_checkpoint()
    with pytest.raises(ValueError):
        r.checkpoint()


def test_a_plugin_subclass_of_a_checkpointing_builtin_is_resumed_only_if_it_declares_its_own():
    """As with folding: what a subclass made outside allocsim adds is its to declare."""
    from allocsim.policies.torch import TorchCachingAllocator

    class Counting(TorchCachingAllocator):
        pass
    Counting.__module__ = "elsewhere"
    t = random_trace(500, seed=4)
    assert Replay(t, TorchCachingAllocator).can_checkpoint()
    assert not Replay(t, Counting, guard=False).can_checkpoint()


class Folded(Direct):
    """The plug-in declaring the state folding compares: its blocks by address, and what it holds."""

    def fold_state(self, held):
        return sorted(held), self.allocated


def _periodic(steps: int = 40):
    """Steps of the same requests, each between two MARKs: a trace whose state repeats."""
    w = TraceWriter()
    for k in range(steps):
        w.mark(f"iter {k}")
        held = [w.alloc(size) for size in (3 << 20, 1 << 20, 5 << 20)]
        for h in held:
            w.free(h)
    return w.finish()


def test_a_plugin_that_declares_its_fold_state_is_folded_and_one_that_does_not_is_walked():
    t = _periodic()
    assert Replay(t, Folded, guard=False)._folder is not None
    assert Replay(t, Direct, guard=False)._folder is None


def test_the_counts_a_period_adds_to_are_declared_once_and_copied_by_the_checkpoints():
    """The device's and the runtime's `COUNTS` are fields of their checkpoint records, and a checkpoint taken
    after a walk holds them as the piece does."""
    from allocsim.machine.device import DeviceState, SimulatedDevice
    from allocsim.machine.runtime import Runtime, RuntimeState
    assert set(SimulatedDevice.COUNTS) <= set(DeviceState.__dataclass_fields__)
    assert set(Runtime.COUNTS) <= set(RuntimeState.__dataclass_fields__)
    r = Replay(random_trace(500, seed=4), "torch")
    r.step(300)
    state = r.checkpoint()
    assert tuple(getattr(state.device, n) for n in SimulatedDevice.COUNTS) == r.device.counts()
    assert tuple(getattr(state.runtime, n) for n in Runtime.COUNTS) == r.runtime.counts()
    assert state.device.n_malloc > 0
