"""The argument parser of ``allocsim`` and of each command (`allocsim.cli.make_parser`), and of the parse that
``record --stacks all`` makes again (`commands.record.stacks_choice`)."""
from __future__ import annotations

import argparse
import re
import sys

from ..errors import closest


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
    prefix of one was taken for it (``validate --cap 100MB`` ran as ``--capacity 100MB``, a device of 100 MB). What
    it does not know is refused under the command's name, with a hint (`_unrecognized`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    #: The command line being parsed (`allocsim.cli.main` sets it): what an error may quote back.
    argv: list = []

    #: On a command's own parser (`allocsim.cli.make_parser` sets it), every command's parser by name: this one
    #: then refuses what it does not know itself, and can say which other commands take an option it lacks.
    commands: dict | None = None

    def parse_known_args(self, args=None, namespace=None):
        """As argparse's, but a command's parser refuses what it does not know: argparse passed it up to
        ``allocsim``'s parser, whose line named neither the command nor the option meant."""
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self.commands is not None:
            self.error(self._unrecognized(extras))
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        """As argparse's, with `_unrecognized`'s hint."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self._unrecognized(extras))
        return namespace

    def _unrecognized(self, extras: list) -> str:
        """argparse's "unrecognized arguments" message and a hint at what the first of them was meant to be: this
        parser's option of the other number (``--policies`` for ``--policy``, ``--caps`` for ``--cap``) or in
        other capitals, else the commands that take it where it is another command's (``validate --policy``), else
        this parser's nearest option (`closest`); for a word (``-`` too), how many this command takes (``policies
        split torch``)."""
        message = f"unrecognized arguments: {' '.join(extras)}"
        first = extras[0]
        if not first.startswith("-") or first == "-":
            return message + self._takes()
        name = first.split("=", 1)[0]
        mine = list(self._option_string_actions)
        near = closest(name, mine)
        other_number = ([name[:-3] + "y"] if name.endswith("ies") else [name[:-1]] if name.endswith("s")
                        else [name[:-1] + "ies"] if name.endswith("y") else []) + [name + "s"]
        meant = next((o for o in other_number if name.startswith("--") and o in mine),
                     near if near and near.lower() == name.lower() else None)
        if meant is None and self.commands:
            takers = [c for c, p in self.commands.items() if p is not self and name in p._option_string_actions]
            if takers:
                return message + f" ({name} is an option of {_listed(takers)}, not of {self.prog.split()[-1]})"
        meant = meant or near
        return message + (f" (did you mean {meant}?)" if meant else "")

    def _takes(self) -> str:
        """How many words this command takes, for one too many: `` (policies takes at most one policy)``."""
        words = [a for a in self._actions if not a.option_strings]
        command = self.prog.split()[-1]
        if not words:
            return f" ({command} takes options only)"
        if len(words) == 1 and words[0].nargs in (None, "?"):
            most = "at most one" if words[0].nargs == "?" else "one"
            return f" ({command} takes {most} {words[0].metavar or words[0].dest})"
        return ""

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


def _listed(names: list) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
