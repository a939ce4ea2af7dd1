"""Recorders: run a training program and write its GPU allocation trace.

A recorder wraps one framework's allocator (`torch` or `cupy`), turns what it
sees into allocsim events through a `TraceWriter`, and writes the real
allocator's own counters beside the trace as ``<trace>.stats.json``.

`record()` is the one entry point: it checks the framework and the GPU before
anything is written, runs the program exactly as ``python train.py args`` (or
``python -m pkg.module args``) would, and finishes the trace in a ``finally``
so that an exception, Ctrl-C or SIGTERM in the program still leaves a whole
trace. `mark(label)` lets the program put its own labels in the trace.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import runpy
import signal
import sys

from ...errors import GPUUnavailable, UsageError
from ...outputs import Terminated, check_input_file, signals_ignored, signals_unwind

FRAMEWORKS = ("torch", "cupy")

#: The recorder running in this process (at most one), for `mark`.
_active = None


def active():
    """The recorder running in this process (`record`, `allocsim.recording`, a trainer's callback), or None."""
    return _active


def mark(label: str = "") -> None:
    """Put a MARK with ``label`` into the trace being recorded; a no-op when nothing records.

    Training scripts call it at points they want to see in plots and tables
    (``allocsim.mark("eval")``). PyTorch optimizer steps are marked automatically.
    """
    if _active is not None:
        _active.mark(str(label))


@contextlib.contextmanager
def scope(begin_kind: int, label: str):
    """Write a scope around the ``with`` body into the trace being recorded (``begin_kind``: `events.TRY_BEGIN`
    or `events.PHASE_BEGIN`; the END is the pair's, written also when the body raises); a no-op when nothing
    records. The recorder's own hooks and `allocsim.tries()` use it."""
    rec = _active
    serial = rec.scope_begin(begin_kind, str(label)) if rec is not None else None
    try:
        yield
    finally:
        if rec is not None and serial is not None:
            from ...trace.events import SCOPES
            rec.scope_end(SCOPES[begin_kind], str(label), serial)


def tries(label: str = "user"):
    """Mark the ``with`` body as code that catches an OOM raised inside it and goes on (a TRY scope named
    ``label``): a replay under a cap that fails a request there counts an OOM the program survives and unwinds the
    try as the exception would (docs/allocator-dependent.md, "Try scopes"); a no-op when nothing records.
    ``with allocsim.tries("batch back-off"): try: ... except torch.OutOfMemoryError: ...``"""
    from ...trace.events import TRY_BEGIN
    return scope(TRY_BEGIN, label)


def recorder_class(framework: str):
    """The recorder class for ``framework`` (imported lazily: no torch/cupy import here)."""
    if framework not in FRAMEWORKS:
        raise UsageError(f"unknown framework {framework!r} (known: auto, {', '.join(FRAMEWORKS)})")
    mod = importlib.import_module(f"{__name__}.{framework}")
    return mod.RECORDER


def _import_pattern(names: str):
    """``import a, NAME as x`` or ``from NAME.sub import y`` at the start of a line."""
    return re.compile(rf"^\s*(?:import\s+(?:[\w.]+(?:\s+as\s+\w+)?\s*,\s*)*|from\s+)(?:{names})\b", re.M)


_IMPORT = {"torch": _import_pattern("torch|torchvision|transformers|timm"), "cupy": _import_pattern("cupy")}


def detect_framework(source_path: str | None) -> str:
    """Which framework a program uses, from the imports in its source.

    Only the program's own file is read (a cheap, side-effect-free look); a
    program that imports a framework through another module of its own needs
    ``--framework``.
    """
    text = ""
    if source_path and os.path.isfile(source_path):
        with open(source_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    found = [fw for fw in FRAMEWORKS if _IMPORT[fw].search(text)]
    where = source_path or "the program"
    if not found:
        raise UsageError(f"{where}: cannot tell which framework it uses (no import of torch or cupy found); "
                         "pass --framework torch|cupy")
    if len(found) > 1:
        raise UsageError(f"{where}: imports both torch and cupy; pass --framework torch|cupy")
    return found[0]


def check_available(framework: str) -> None:
    """Fail at once, with one line, when the framework or a GPU is missing."""
    if importlib.util.find_spec(framework) is None:
        raise GPUUnavailable(f"cannot record: {framework} is not installed in this Python ({sys.executable})")
    recorder_class(framework).check_gpu()


class Target:
    """The program to run: a script path or a module name, and its arguments."""

    def __init__(self, script: str | None = None, module: str | None = None, args=()):
        self.script, self.module, self.args = script, module, list(args)

    @property
    def name(self) -> str:
        return self.module or self.script

    def source_path(self) -> str | None:
        if self.script:
            return self.script
        try:
            spec = importlib.util.find_spec(self.module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise UsageError(f"no module named {self.module!r}")
        if spec.submodule_search_locations:          # a package: python -m runs its __main__
            main = os.path.join(list(spec.submodule_search_locations)[0], "__main__.py")
            if os.path.isfile(main):
                return main
            # (find_spec of "pkg.__main__" imports pkg: its __init__ would run in allocsim, before any recording)
            found = importlib.machinery.PathFinder.find_spec("__main__", list(spec.submodule_search_locations))
            if found is None:       # (it said: cannot tell which framework the program uses)
                raise UsageError(f"{self.module} is a package with no __main__ module: python -m cannot run it")
            return found.origin
        return spec.origin

    def check(self) -> None:
        if self.script and not os.path.exists(self.script):
            raise UsageError(f"{self.script}: no such script")
        if self.script:
            check_input_file(self.script)           # a folder, or a FIFO (which python would wait on)
        if self.module:
            self.source_path()

    def argv(self) -> list[str]:
        return [self.script or self.module, *self.args]

    def run(self) -> None:
        """Run it as ``python script args`` / ``python -m module args`` would (sys.argv, sys.path[0])."""
        saved_argv, saved_path = sys.argv[:], sys.path[:]
        try:
            if self.script:
                sys.argv = [self.script, *self.args]
                sys.path.insert(0, os.path.dirname(os.path.abspath(self.script)))
                runpy.run_path(self.script, run_name="__main__")
            else:
                sys.argv = [self.module, *self.args]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(self.module, run_name="__main__", alter_sys=True)
        finally:
            sys.argv[:] = saved_argv
            sys.path[:] = saved_path


def prepare(framework: str, out: str):
    """The recorder class of ``framework``, once the framework, a GPU and ``out``'s folder are known to be there
    (nothing is written before)."""
    cls = recorder_class(framework)
    check_available(framework)
    out_dir = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(out_dir):
        raise UsageError(f"{out}: output folder {out_dir} does not exist")
    return cls


def record(target: Target, out: str, framework: str = "auto", **options) -> tuple[int, dict]:
    """Run ``target`` under the framework's recorder; write ``out`` and ``out.stats.json``.

    Returns ``(exit status the program would have had, stats dict)``. Every
    check (script exists, framework installed, GPU visible, output folder
    exists) runs before any file is created, so a refusal leaves nothing behind.
    SIGTERM, SIGHUP and SIGQUIT unwind the program like an exit (status
    128 + signal), SIGINT like Ctrl-C; either way the trace is finished, and
    while it is, those signals are ignored.
    """
    target.check()
    if framework == "auto":
        framework = detect_framework(target.source_path())
    cls = prepare(framework, out)
    command = [sys.executable, "-m", "allocsim", "record", *(["-m", target.module] if target.module else
                                                              [target.script]), *target.args]
    rec = cls(out, command=command, **options)
    status = 0
    with signals_unwind():
        begin(rec)
        try:
            target.run()
        except SystemExit as e:
            code = e.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
            if isinstance(e, Terminated):
                rec.note(f"terminated by {signal.Signals(e.signum).name}")
            elif code not in (None, 0) and not isinstance(code, int):
                print(code, file=sys.stderr)
        except KeyboardInterrupt:
            status = 130
            rec.note("interrupted (SIGINT)")
        except BaseException as e:   # the program's own error: show it as python would, keep the trace
            _print_program_traceback(e)
            status = 1
            rec.note(f"program raised {type(e).__name__}: {e}")
        finally:
            stats = end(rec, status)
    return status, stats


def begin(rec) -> None:
    """Start ``rec`` as this process's recording (`mark` and `scope` write into it); a start that fails leaves
    no file behind. `record`, `allocsim.start_recording` and each process of a run start this way."""
    global _active
    try:
        rec.start()
    except BaseException:
        rec.abort()
        raise
    _active = rec


def end(rec, status: int = 0) -> dict:
    """Finish ``rec`` (the trace, renamed into place, and its stats file) with the catchable signals ignored, so
    that no second unwind cuts the file short; return the stats."""
    global _active
    if _active is rec:
        _active = None
    with signals_ignored():
        return rec.finish(exit_status=status)


def _print_program_traceback(e: BaseException) -> None:
    """The traceback as ``python script`` would print it: the program's frames, not ours or runpy's."""
    import traceback
    here = os.path.dirname(os.path.abspath(__file__))
    tb = e.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith(here)
                              or "runpy" in tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb or e.__traceback__)


