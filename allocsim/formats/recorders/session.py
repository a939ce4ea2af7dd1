"""Recording from inside a Python program: ``with allocsim.recording("run.bin"):`` and
``allocsim.start_recording`` / ``allocsim.stop_recording`` (docs/recording.md).

The trace is the one ``allocsim record`` writes (the same recorder, started and finished by `recorders.begin` and
`recorders.end`): framework chosen from what the program has imported, optimizer steps marked, streamed to a
temporary that becomes the trace only when finished. A recording started with `start_recording` and never
stopped is finished by `UntilExit` however the process ends, as each process of a run is
(`recorders.processes`). Nothing here imports torch or cupy before a recording starts.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import signal
import sys

from ...errors import UsageError
from ...outputs import CATCHABLE, Terminated, claim_outputs, signals_unwind

#: The variable that carries a recording into the processes of a program (JSON: `processes.program_env`).
ENV_RUN = "ALLOCSIM_RECORD_RUN"


def choose_framework(framework: str | None) -> str:
    """The framework to record: the one named, else the one the program has imported (torch if both are and only
    torch's CUDA has started), else the one installed."""
    from . import FRAMEWORKS
    if framework not in (None, "auto"):
        if framework not in FRAMEWORKS:
            raise UsageError(f"framework={framework!r}: unknown (known: {', '.join(FRAMEWORKS)})")
        return framework
    loaded = [fw for fw in FRAMEWORKS if fw in sys.modules]
    if len(loaded) > 1:
        torch = sys.modules["torch"]
        if getattr(getattr(torch, "cuda", None), "is_initialized", lambda: False)():
            return "torch"
        raise UsageError("both torch and cupy are imported: pass framework='torch' or framework='cupy'")
    if loaded:
        return loaded[0]
    installed = [fw for fw in FRAMEWORKS if importlib.util.find_spec(fw) is not None]
    if len(installed) == 1:
        return installed[0]
    raise UsageError("neither torch nor cupy is imported" + (" and both are installed" if installed else
                                                             " or installed")
                     + ": pass framework='torch' or framework='cupy'")


def start_recording(path: str, framework: str | None = None, *, stacks: bool | str = False,
                    max_events: int | None = None, force: bool = False):
    """Start recording this process's GPU allocations into ``path`` (and ``path.stats.json`` when stopped);
    return the recorder. One recording at a time: a second is refused in one line. ``force`` replaces an
    existing trace at ``path``. Blocks already live on the device are seeded into the trace (`TorchRecorder`);
    what that leaves out is said in a warning and in the trace's metadata (``started_late``)."""
    from . import _active, begin, prepare
    if _active is not None:
        raise UsageError(f"a recording is already running in this process (into {_active.out}): stop it first "
                         "(allocsim.stop_recording()), or let allocsim.mark() label the one running")
    if os.environ.get(ENV_RUN):
        raise UsageError(f"this process is recorded by allocsim record ({ENV_RUN} is set), from when CUDA starts: "
                         "let allocsim.mark() label that recording")
    known = {False: False, None: False, True: "python", "python": "python", "all": "all"}
    stacks = known.get(stacks, stacks) if isinstance(stacks, (bool, str, type(None))) else stacks    # ([]: unhashable)
    if not isinstance(stacks, (bool, str)) or stacks not in (False, "python", "all"):
        raise UsageError(f"stacks={stacks!r}: give False, True or 'python' (Python frames), or 'all' (C++ too)")
    fw = choose_framework(framework)
    cls = prepare(fw, path)
    claim_outputs([("path", path), ("path", f"{path}.stats.json")], force=force)
    rec = cls(path, command=[sys.executable, *sys.argv], stacks=stacks, max_events=max_events)
    rec.started_from = "python"
    begin(rec)
    UntilExit(rec)
    return rec


def stop_recording(status: int = 0) -> dict:
    """Finish the recording `start_recording` started: the trace and its stats file; return the stats. Refused
    in one line when none is running (or when the one running is `allocsim record`'s own)."""
    from . import _active, end
    watch = UntilExit.of(_active)
    if watch is None:
        raise UsageError("no recording started by allocsim.start_recording() is running" +
                         (f" (this process is recorded by allocsim record into {_active.out})"
                          if _active is not None else ""))
    watch.remove()
    return end(watch.rec, status)


@contextlib.contextmanager
def recording(path: str, framework: str | None = None, *, stacks: bool | str = False,
              max_events: int | None = None, force: bool = False):
    """Record the GPU allocations of the ``with`` body into ``path``, as `start_recording` (its arguments) and
    `stop_recording` would; the trace is finished also when the body raises, and a signal left at its default
    action unwinds the body like ``exit(128 + N)`` first. Yields the recorder."""
    with signals_unwind():
        rec = start_recording(path, framework, stacks=stacks, max_events=max_events, force=force)
        status = 1
        try:
            yield rec
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e, Terminated):
                rec.note(f"terminated by {signal.Signals(e.signum).name}")
            raise
        except KeyboardInterrupt:
            status = 130
            rec.note("interrupted (SIGINT)")
            raise
        except BaseException as e:
            rec.note(f"the recorded block raised {type(e).__name__}: {e}")
            raise
        finally:
            if UntilExit.of(rec) is not None:         # not stopped inside the body
                stop_recording(status)


class UntilExit:
    """Finishes a recording started outside a ``with`` (`start_recording`, each process of a run) however the
    process ends: at its exit (``atexit``; not in a child forked from it, which holds a copy of the recorder),
    after an uncaught exception (``sys.excepthook``: exit status 1), and on a catchable signal left at its default
    action, which then unwinds like ``exit(128 + N)`` so that the exit hook runs (torchrun stops the other workers
    with SIGTERM when one fails). A ``sys.exit(N)`` of the program is not visible here. Signals can be set only
    from the main thread. `remove` undoes all of it."""

    _watching: dict[int, "UntilExit"] = {}          # id(recorder) -> its watch

    @classmethod
    def of(cls, rec) -> "UntilExit | None":
        return cls._watching.get(id(rec)) if rec is not None else None

    def __init__(self, rec):
        self.rec, self.pid = rec, os.getpid()
        self.exit_status, self.ended = 0, ""
        self.program_hook = sys.excepthook
        sys.excepthook = self.excepthook
        self.signals = {}
        try:
            for s in CATCHABLE:
                if s != signal.SIGINT and signal.getsignal(s) is signal.SIG_DFL:
                    self.signals[s] = signal.signal(s, self.unwind)
        except ValueError:                  # not the main thread
            pass
        atexit.register(self.at_exit)
        UntilExit._watching[id(rec)] = self

    def excepthook(self, kind, value, tb):
        self.exit_status, self.ended = 1, f"an uncaught {kind.__name__}"
        self.program_hook(kind, value, tb)

    def unwind(self, signum, frame):
        if os.getpid() != self.pid:         # a child forked from here holds this handler: it dies of the signal
            os._exit(128 + signum)
        self.exit_status, self.ended = 128 + signum, f"signal {signal.Signals(signum).name}"
        raise Terminated(signum)

    def remove(self) -> None:
        UntilExit._watching.pop(id(self.rec), None)
        atexit.unregister(self.at_exit)
        if sys.excepthook == self.excepthook:
            sys.excepthook = self.program_hook
        for s, old in self.signals.items():
            if signal.getsignal(s) == self.unwind:
                signal.signal(s, old)

    def at_exit(self) -> None:
        if os.getpid() != self.pid or UntilExit.of(self.rec) is not self:
            return
        from . import end
        from ._base import stderr
        UntilExit._watching.pop(id(self.rec), None)
        if self.ended:
            self.rec.note(f"the process ended by {self.ended}")
        try:
            end(self.rec, self.exit_status)
        except Exception as e:      # noqa: BLE001 - at exit, one line
            stderr(f"process {os.getpid()}: trace not finished: {type(e).__name__}: {e}")
