"""The argument parser of ``allocsim`` and of each command (`allocsim.cli.make_parser`), and of the parse that
``record --stacks all`` makes again (`commands.record.stacks_choice`)."""
from __future__ import annotations

import argparse
import re
import sys


class _StoreOnce(argparse._StoreAction):
    """An option that takes one value refuses a second one (``--cap 4GB ... --cap 8GB`` in a script
    that adds to a command line): argparse would silently keep the last."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given", {})
        if self.option_strings and self.dest in given:
            raise argparse.ArgumentError(self, f"given twice ({given[self.dest]}, then {values}); give it once")
        given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


class Parser(argparse.ArgumentParser):
    """argparse's parser, but an error is one line (exit 2), an option given twice is refused (`_StoreOnce`), a
    value that starts with ``-`` is named with the spelling that passes it, and an option is spelled whole: a
    prefix of one was taken for it (``validate --cap 100MB`` ran as ``--capacity 100MB``, a device of 100 MB)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    #: The command line being parsed (`allocsim.cli.main` sets it): what an error may quote back.
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
