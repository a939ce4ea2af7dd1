"""`allocsim` command line. Each subcommand is one module in `allocsim.commands` that declares one
`Command` (its name, help, example, ``add_arguments(parser)`` and ``run(args) -> int``); `COMMANDS` lists them."""
from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import traceback

from .commands import WARNINGS, Parser
from .commands import (calibrate, compare, fit, import_, info, plot, policies, record, replay, sweep, synth, tune,
                       validate)
from .compiled import ENV_PROBLEM, build
from .errors import AllocsimError
from .filenames import clipped, let_stdout_write_names, printable
from .outputs import Terminated, guard_stdout, undo_stdout

#: The subcommands, in the order ``allocsim --help`` lists them: the main path first (docs/architecture.md,
#: "Commands").
COMMANDS = tuple(m.COMMAND for m in (record, import_, info, synth, replay, compare, fit, tune, plot, sweep, validate,
                                     calibrate, policies))


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


class _Version(argparse.Action):
    """``--version``: the version and the build that runs, read only when asked (the distribution's metadata took
    15 ms of every command's start, a third of a small trace's replay)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        if ENV_PROBLEM:     # which build runs is what --version answers: unclear, as every command says
            parser.exit(2, f"allocsim: {ENV_PROBLEM}\n")
        sys.stdout.write(f"allocsim {version()} ({build()})\n")
        sys.stdout.flush()          # a closed pipe or a full disk shows here, as one line (`main`), not at exit
        parser.exit()


def make_parser() -> argparse.ArgumentParser:
    p = Parser(prog="allocsim", description="Record GPU allocation traces; replay them against allocator policies.",
               epilog=MAIN_PATH, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--version", action=_Version, help="show the version and the build that runs, and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS:
        sp = sub.add_parser(command.name, help=command.help, description=command.help,
                            epilog=f"example:\n  {command.example}",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        sp.commands = sub.choices       # (what it does not know is refused under its own name: `Parser`)
        command.add_arguments(sp)
        sp.set_defaults(_run=command.run)
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _stand_in_for_closed_streams()
    try:                            # (a Ctrl-C while the plug-ins load or the arguments are read: one line too)
        parser = make_parser()
        Parser.argv = list(argv)
        try:
            args = parser.parse_args(argv)
        except BrokenPipeError:     # --help or --version to a reader that stopped reading
            return _stdout_closed()
        except OSError as e:        # --help or --version to a full disk or a closed stdout
            return _write_failed(e, debug="--debug" in argv)
    except KeyboardInterrupt:
        print("allocsim: interrupted", file=sys.stderr)
        return 130
    if not getattr(args, "_run", None):
        parser.print_help()
        print("allocsim: no command given (the list above; allocsim COMMAND --help for one)", file=sys.stderr)
        return 2
    if ENV_PROBLEM:         # ALLOCSIM_INTERPRETED=maybe: which build would run is unclear
        print(f"allocsim: {ENV_PROBLEM}", file=sys.stderr)
        return 2
    let_stdout_write_names()
    WARNINGS.clear()
    try:
        status = int(args._run(args) or 0)
        for line in WARNINGS.values():      # after the report: an error instead would have been the one line
            print(f"allocsim: warning: {clipped(printable(line, keep=''))}", file=sys.stderr)
        if sys.stdout:
            sys.stdout.flush()      # a closed pipe or a full disk shows here, not at interpreter exit
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except AllocsimError as e:
        if getattr(args, "debug", False):   # the traceback (a plug-in's own exception chained under it), then the
            traceback.print_exc()           # line; the exit status stays the error's (re-raised, it was Python's 1)
        print(f"allocsim: {clipped(printable(str(e), keep=''))}", file=sys.stderr)    # one line, whatever was read
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
        traceback.print_exception(e)
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
