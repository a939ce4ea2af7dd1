"""`allocsim` command line. Each subcommand is one module in `allocsim.commands`
with ``NAME``, ``HELP``, ``EXAMPLE``, ``add_arguments(parser)`` and ``run(args) -> int``."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import commands
from .errors import AllocsimError

ORDER = ["record", "import", "info", "synth", "replay", "compare", "fit", "plot", "sweep", "validate",
         "calibrate", "policies"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _modules():
    found = {m.name.rstrip("_"): m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")}
    names = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    return [importlib.import_module(f"{commands.__name__}.{found[n]}") for n in names]


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="allocsim", description="Record GPU allocation traces; replay them against allocator policies.",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="show tracebacks")
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
    parser = make_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except AllocsimError as e:
        if getattr(args, "debug", False):
            raise
        print(f"allocsim: {e}", file=sys.stderr)
        return e.exit_status
    except OSError as e:          # a file system refusal the command did not foresee: still one line
        if getattr(args, "debug", False):
            raise
        where = f"{e.filename}: " if e.filename else ""
        print(f"allocsim: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("allocsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
