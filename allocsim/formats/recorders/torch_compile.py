"""What the PyTorch recorder adds for torch.compile: scopes around compilation, autotuning and the code that
survives an OOM (docs/compile.md).

A cold run of a compiled program (empty compile caches) compiles each frame (dynamo, then inductor), and
inductor benchmarks candidate kernels and configs, allocating example inputs, clones of mutated arguments and a
buffer to flush the L2 cache; a later run with warm caches loads the compiled code and the chosen configs and
does none of it. The recorder writes the scopes that tell the two apart (`HOOKS`):

- PHASE "compile" around dynamo's compilation of a frame and inductor's of a graph (a backward graph may be
  compiled later, at its first call: it gets a phase of its own);
- PHASE "autotune" around the benchmarking of a Triton kernel's configs at its first launch (in a
  reduce-overhead run, inside the CUDA graph tree's warm-up), coordinate descent and the choice among a
  template's candidates (max-autotune);
- TRY "inductor autotune" around each template candidate's benchmark, which inductor runs inside a ``try``
  that turns its failure (an OOM included) into an infinite timing and goes on to the next candidate. A Triton
  kernel's config benchmarks catch nothing (an H200 run found no OOM caught there): they are a phase, no try.

**Lazily and cheaply.** Nothing here imports torch._dynamo or torch._inductor: a module of `HOOKS` already
imported when recording starts is patched at once, one imported later is patched as its import finishes (a
finder at the front of ``sys.meta_path`` wraps its loader; it looks only at the few names of `HOOKS`), so a
program that never compiles pays one set look-up per import. Each scope is written after a drain of the
allocator's history (`Recorder.scope_begin`), so it lands exactly between the entries before and after it.
A hook's own failure never breaks the program: it is noted in the stats file and the call goes on. `remove`
puts every original back and takes the finder out.
"""
from __future__ import annotations

import functools
import sys

from ...trace import events as ev

#: ``(module, attribute, scope kind, label)``: the calls written as scopes; ``attribute`` is a function of the
#: module or ``Class.method`` (a classmethod or staticmethod stays one). A name the installed torch lacks is
#: skipped and counted (`Hooks.summary`).
HOOKS = (
    ("torch._dynamo.convert_frame", "_compile", ev.PHASE_BEGIN, "compile"),
    ("torch._inductor.compile_fx", "_compile_fx_inner", ev.PHASE_BEGIN, "compile"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.autotune_to_one_config", ev.PHASE_BEGIN,
     "autotune"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.coordinate_descent_tuning", ev.PHASE_BEGIN,
     "autotune"),
    ("torch._inductor.select_algorithm", "AlgorithmSelectorCache.benchmark_choices", ev.PHASE_BEGIN, "autotune"),
    ("torch._inductor.select_algorithm", "AlgorithmSelectorCache.benchmark_choice", ev.TRY_BEGIN,
     "inductor autotune"),
)


class Hooks:
    """The scopes of `HOOKS` (or ``hooks``) for one recorder: `install` patches what is imported and watches for
    the rest, `remove` restores everything."""

    def __init__(self, recorder, hooks=HOOKS):
        self.rec = recorder
        self.pending: dict[str, list[tuple]] = {}
        for module, attribute, kind, label in hooks:
            self.pending.setdefault(module, []).append((attribute, kind, label))
        self.patched: list[tuple[object, str, object, bool]] = []  # owner, name, original, was in owner.__dict__
        self.finder = None
        self.missing: list[str] = []
        self.scopes = {ev.KIND_NAMES[k]: 0 for k in ev.SCOPES}
        self.errors = 0

    def install(self) -> None:
        for name in [m for m in self.pending if m in sys.modules]:
            self.loaded(sys.modules[name])
        if self.pending:
            self.finder = _Watch(self)
            sys.meta_path.insert(0, self.finder)

    def remove(self) -> None:
        if self.finder is not None:
            self.finder.hooks = None
            if self.finder in sys.meta_path:
                sys.meta_path.remove(self.finder)
            self.finder = None
        for owner, name, original, own in reversed(self.patched):
            if own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self.patched.clear()

    def summary(self) -> dict:
        return {"scopes": dict(self.scopes), "missing": list(self.missing), "hook_errors": self.errors}

    def loaded(self, module) -> None:
        """``module`` (one of `HOOKS`) is imported: patch its calls."""
        for attribute, kind, label in self.pending.pop(module.__name__, ()):
            *path, name = attribute.split(".")
            owner = module
            for part in path:
                owner = getattr(owner, part, None)
            if owner is None or _raw(owner, name) is None:
                self.missing.append(f"{module.__name__}.{attribute}")
                continue
            self.patch(owner, name, kind, label)

    def patch(self, owner, name: str, kind: int, label: str) -> None:
        """Replace ``owner.name`` by the same call inside a scope of ``kind`` named ``label``."""
        raw = _raw(owner, name)
        fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        hooks = self

        @functools.wraps(fn)
        def scoped(*args, **kwargs):
            serial = hooks.begin(kind, label)
            try:
                return fn(*args, **kwargs)
            finally:
                hooks.end(kind, label, serial)
        wrapper = type(raw)(scoped) if isinstance(raw, (classmethod, staticmethod)) else scoped
        self.patched.append((owner, name, raw, name in vars(owner)))
        setattr(owner, name, wrapper)

    def begin(self, kind: int, label: str):
        try:
            serial = self.rec.scope_begin(kind, label)
        except Exception as e:                      # a hook's own failure: noted, the program goes on
            return self.failed(e)
        if serial is not None:
            self.scopes[ev.KIND_NAMES[kind]] += 1
        return serial

    def end(self, kind: int, label: str, serial) -> None:
        try:
            self.rec.scope_end(ev.SCOPES[kind], label, serial)
        except Exception as e:
            self.failed(e)

    def failed(self, e: Exception) -> None:
        self.errors += 1
        if self.errors <= 3:
            self.rec.note(f"compile hook failed ({type(e).__name__}: {e}); the scopes around it may be missing")


def _raw(owner, name: str):
    """``owner.name`` as defined (a classmethod as the classmethod), looked up along a class's MRO."""
    for space in (getattr(owner, "__mro__", None) or (owner,)):
        if name in vars(space):
            return vars(space)[name]
    return None


class _Watch:
    """A ``sys.meta_path`` finder that sees the modules of `Hooks.pending` imported: it finds each with the
    finders after it and wraps its loader, so that `Hooks.loaded` runs once the module has executed."""

    def __init__(self, hooks: Hooks):
        self.hooks = hooks

    def find_spec(self, name, path=None, target=None):
        hooks = self.hooks
        if hooks is None or name not in hooks.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, self)
        return spec

    def invalidate_caches(self) -> None:
        pass


class _Loader:
    """A module's own loader, which tells `_Watch` when the module has executed (every other call handed on)."""

    def __init__(self, loader, watch: _Watch):
        self._loader, self._watch = loader, watch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        hooks = self._watch.hooks
        if hooks is not None:
            try:
                hooks.loaded(module)
            except Exception as e:
                hooks.failed(e)

    def __getattr__(self, name):
        return getattr(self._loader, name)
