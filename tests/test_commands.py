"""The command protocol (docs/architecture.md, "Commands"): each module of `allocsim.commands` declares one
`Command`, `allocsim.cli.COMMANDS` lists them all, and ``allocsim --help`` shows them in that order."""
from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import re

import pytest

from conftest import ROOT

from allocsim import cli, commands
from allocsim.commands import Command


def command_modules():
    """Every module of `allocsim.commands` whose name is not private."""
    return [importlib.import_module(f"allocsim.commands.{m.name}")
            for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_")]


@pytest.mark.parametrize("mod", command_modules(), ids=lambda m: m.__name__.rpartition(".")[2])
def test_every_command_module_declares_one_command(mod):
    declared = [name for name, value in vars(mod).items() if isinstance(value, Command)]
    assert declared == ["COMMAND"], f"{mod.__name__} declares {declared or 'no Command'}"
    command = mod.COMMAND
    assert command.name and command.help and command.example
    assert command.add_arguments.__module__ == command.run.__module__ == mod.__name__


def test_cli_lists_every_command_once():
    listed = [c.name for c in cli.COMMANDS]
    assert sorted(listed) == sorted(mod.COMMAND.name for mod in command_modules())
    assert len(set(listed)) == len(listed)


def test_help_lists_the_commands_in_order(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    top = capsys.readouterr().out
    section = top.split("\n  COMMAND\n", 1)[1]
    shown = re.findall(r"^    (\S+)", section, flags=re.M)
    assert shown == [c.name for c in cli.COMMANDS]


def test_each_command_help_shows_its_help_and_example():
    sub = next(a for a in cli.make_parser()._actions if a.dest == "command")
    for command in cli.COMMANDS:
        text = sub.choices[command.name].format_help()
        assert f"\n\n{command.help}\n\n" in text and text.endswith(f"example:\n  {command.example}\n")


def private_imports(path: str, package: str) -> list[str]:
    """What the module at ``path`` (in ``package``) imports that is private to another package or module: a
    dotted name whose owner, the part before its first ``_``-name, is not ``package``."""
    out = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            private = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None)
            if parts[0] == "allocsim" and private is not None and ".".join(parts[:private]) != package:
                out.append(name)
    return out


def test_the_command_line_imports_nothing_private_of_another_package():
    """`cli` takes what it uses of the commands from the package (`allocsim.commands.Parser`, ...), and no
    command reaches up into `cli`."""
    folder = os.path.join(ROOT, "allocsim", "commands")
    files = [(os.path.join(ROOT, "allocsim", "cli.py"), "allocsim")]
    files += [(os.path.join(folder, f), "allocsim.commands") for f in sorted(os.listdir(folder)) if f.endswith(".py")]
    found = {os.path.relpath(path, ROOT): private_imports(path, package) for path, package in files}
    assert {path: names for path, names in found.items() if names} == {}


def test_the_private_import_check_can_fail(tmp_path):
    command = tmp_path / "command.py"
    command.write_text("from __future__ import annotations\nfrom ..cli import _Parser\nfrom ._common import WARNINGS\n"
                       "from ..trace.trace import _find\nimport allocsim._z\n")
    assert private_imports(str(command), "allocsim.commands") == ["allocsim.cli._Parser", "allocsim.trace.trace._find",
                                                                  "allocsim._z"]
    top = tmp_path / "top.py"
    top.write_text("from .commands import Parser\nfrom .commands._common import WARNINGS\n")
    assert private_imports(str(top), "allocsim") == ["allocsim.commands._common.WARNINGS"]
