"""`allocsim` command line. Each subcommand is one module in `allocsim.commands`
with ``NAME``, ``HELP``, ``EXAMPLE``, ``add_arguments(parser)`` and ``run(args) -> int``."""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import re
import signal
import sys

from . import commands
from .commands._common import WARNINGS
from .compiled import ENV_PROBLEM, build
from .errors import AllocsimError
from .filenames import let_stdout_write_names, printable
from .outputs import Terminated, guard_stdout, undo_stdout

ORDER = ["record", "import", "info", "synth", "replay", "compare", "fit", "tune", "plot", "sweep", "validate",
         "calibrate", "policies"]


MAIN_PATH = """the main path:
  allocsim record -o run.bin train.py --epochs 1       # record a training run's allocations
  allocsim replay run.bin --policy torch --cap 8GB      # replay them against one allocator
  allocsim compare run.bin --policies split,torch,cupy  # or: allocsim plot run.bin --report out/"""


def version() -> str:
    """The installed distribution's version, else the package's own."""
    try:
        from importlib.metadata import version as dist_version
        return dist_version("allocsim")
    except Exception:
        from .version import __version__
        return __version__


class _StoreOnce(argparse._StoreAction):
    """An option that takes one value refuses a second one (``--cap 4GB ... --cap 8GB`` in a script
    that adds to a command line): argparse would silently keep the last."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given", {})
        if self.option_strings and self.dest in given:
            raise argparse.ArgumentError(self, f"given twice ({given[self.dest]}, then {values}); give it once")
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    #: The command line being parsed (`main` sets it): what an error may quote back.
    argv: list = []

    def _print_message(self, message, file=None):
        """As argparse's, but a failed write (``--help`` to a full disk or a closed stdout) is not swallowed."""
        if message:
            (file or sys.stderr).write(message)

    def error(self, message):  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}{self._dash_value(message)}\n")

    def _dash_value(self, message: str) -> str:
        """``--cap -1GB``: argparse takes a value that starts with ``-`` (and is not a plain negative number) for
        an option and says only "expected one argument"; name the value and the spelling that passes it."""
        m = re.fullmatch(r"argument (\S+): expected one argument", message)
        flags = m.group(1).split("/") if m else []
        argv = list(self.argv)
        for k, arg in enumerate(argv[:-1]):
            value = argv[k + 1]
            if arg in flags and value.startswith("-") and value.split("=")[0] not in self._option_string_actions \
                    and value not in ("-", "--"):
                spelled = f"{arg}={value}" if arg.startswith("--") else f"{arg}{value}"
                return f" ({value!r} starts with -, so it reads as an option; to give it as the value: {spelled})"
        return ""


def _modules():
    found = {m.name.rstrip("_"): m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")}
    names = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    return [importlib.import_module(f"{commands.__name__}.{found[n]}") for n in names]


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="allocsim", description="Record GPU allocation traces; replay them against allocator policies.",
                epilog=MAIN_PATH, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--version", action="version", version=f"allocsim {version()} ({build()})")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in _modules():
        sp = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP,
                            epilog=f"example:\n  {mod.EXAMPLE}" if getattr(mod, "EXAMPLE", None) else None,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        mod.add_arguments(sp)
        sp.set_defaults(_run=mod.run)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _stand_in_for_closed_streams()
    parser = make_parser()
    _Parser.argv = list(argv)
    try:
        args = parser.parse_args(argv)
    except OSError as e:            # --help or --version to a full disk or a closed stdout
        return _write_failed(e, debug="--debug" in argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    if ENV_PROBLEM:         # ALLOCSIM_INTERPRETED=maybe: which build would run is unclear
        print(f"allocsim: {ENV_PROBLEM}", file=sys.stderr)
        return 2
    let_stdout_write_names()
    WARNINGS.clear()
    try:
        status = int(args._run(args) or 0)
        for line in WARNINGS.values():      # after the report: an error instead would have been the one line
            print(f"allocsim: warning: {printable(line, keep='')}", file=sys.stderr)
        if sys.stdout:
            sys.stdout.flush()      # a closed pipe or a full disk shows here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except AllocsimError as e:
        if getattr(args, "debug", False):
            raise
        print(f"allocsim: {printable(str(e), keep='')}", file=sys.stderr)     # one line, whatever a plug-in raised
        return e.exit_status
    except OSError as e:          # a file system refusal the command did not foresee: still one line
        return _write_failed(e, debug=getattr(args, "debug", False))
    except KeyboardInterrupt:
        print("allocsim: interrupted", file=sys.stderr)
        return 130
    except Terminated as e:         # a signal unwound a write or a process pool: temporaries and workers are gone
        print(f"allocsim: stopped by {signal.Signals(e.signum).name}", file=sys.stderr)
        return e.code


def _stand_in_for_closed_streams() -> None:
    """Started with stderr closed (``2>&-``), Python has None there: what would go to it goes nowhere, and
    the exit status still tells (a bad input is 2, not a crash's 1). A stdout that cannot take the report
    (closed, or a disk that fills) is an error: `guard_stdout`."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    guard_stdout()


def _write_failed(e: OSError, *, debug: bool) -> int:
    """One line for a write the command did not foresee failing; a failed stdout's half report is cut off."""
    if debug:
        raise e
    name = e.filename or _unnamed_writer(e)
    if not e.filename and (e.errno in _WRITE_FAILED or e.errno == errno.EBADF):     # stdout's write
        undo_stdout()
    print(f"allocsim: {name + ': ' if name else ''}{e.strerror or e}", file=sys.stderr)
    return 2


#: Errors of a write that failed for want of room or a device: every file output names itself
#: (`outputs.atomic_path`, the sweep's partial table), so one without a name was a write to stdout.
_WRITE_FAILED = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def _unnamed_writer(e: OSError) -> str:
    return "standard output" if e.errno in _WRITE_FAILED else ""   # EBADF: `guard_stdout`'s line names it


def _stdout_closed() -> int:
    """The reader of our stdout went away (``| head``): end quietly, as a shell expects, with 128 + SIGPIPE.

    Later writes (the interpreter's final flush) go to devnull, as the Python docs recommend."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):    # stdout is not a file (tests capture it)
        pass
    return 128 + getattr(signal, "SIGPIPE", 13)


if __name__ == "__main__":
    sys.exit(main())
