"""What an `allocsim` subcommand declares (docs/architecture.md, "Commands")."""
from __future__ import annotations

import argparse
from typing import Callable


class Command:
    """One subcommand of ``allocsim``: all that `allocsim.cli` needs to offer it, explain it and run it.

    Each module of `allocsim.commands` whose name is not private declares exactly one, ``COMMAND``, and
    `allocsim.cli.COMMANDS` lists them in the order ``allocsim --help`` shows them::

        COMMAND = Command(
            name="replay",
            help="replay a trace against one allocator policy",
            example="allocsim replay traces/resnet50.bin --policy split --cap 8GB")


        @COMMAND.arguments
        def add_arguments(p): ...


        @COMMAND.runs
        def run(args) -> int: ...

    The two functions stay module functions, so another command may build on them (``sweep`` adds
    ``compare``'s arguments).

    ``name``
        the word after ``allocsim`` that picks the command.
    ``help``
        one line: the command's entry in ``allocsim --help``, and the description atop ``allocsim NAME --help``.
    ``example``
        a command line (or several, one a line) shown under "example:" at the end of ``allocsim NAME --help``.
    ``add_arguments(parser)``
        adds the command's options and positionals to its own `Parser` (``--debug`` is already there). Called
        by `allocsim.cli.make_parser` for every parser it makes, before anything is parsed.
    ``run(args) -> int``
        does the work with the parsed `argparse.Namespace`, once the whole line parsed (`allocsim.cli.main`),
        and returns the exit status: 0 done, 1 where the command's own check fails (validate's mismatch), 2 bad
        input. A bad input raises `AllocsimError` rather than printing: `main` writes its one line (the
        traceback only with ``--debug``) and exits with its status.
    """

    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]

    def __init__(self, *, name: str, help: str, example: str):
        self.name, self.help, self.example = name, help, example

    def arguments(self, add_arguments: Callable[[argparse.ArgumentParser], None]):
        """Decorator: ``add_arguments`` is this command's (see the class)."""
        self.add_arguments = add_arguments
        return add_arguments

    def runs(self, run: Callable[[argparse.Namespace], int]):
        """Decorator: ``run`` is this command's (see the class)."""
        self.run = run
        return run

    def __repr__(self):
        return f"Command({self.name!r})"
