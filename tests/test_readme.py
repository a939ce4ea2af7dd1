"""The README's commands, and the manuals', do what their comments and shown outputs say.

Every `allocsim` command of the shell blocks of README.md and the manuals it sends readers to (`DOCS`) (``sh`` blocks, and ``$ allocsim`` lines of the
blocks that show an output) runs here, in a temporary folder holding the shipped traces it names, bounded
in time: it must exit 0, write the files it says it writes, and print the lines the README shows (wall-clock
seconds masked, spacing collapsed, ``...`` standing for lines left out). `run.bin` in the Usage block is a
small shipped PyTorch recording. Commands that need a GPU, a network or minutes are skipped with their
reason, or run shortened (fewer policies or traces) where the reason says so.
"""
from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from conftest import ROOT, run_cli

README = os.path.join(ROOT, "README.md")
#: the documents whose commands run here: the front page and the manuals it links to (each command once, where it
#: first stands)
DOCS = ("README.md", "docs/cli.md", "docs/tune.md", "docs/policies.md")
#: the Usage block's run.bin: a small PyTorch recording (ResNet-18, 8 steps; side stream, no OOM)
RUN_BIN = os.path.join(ROOT, "traces", "pressure-side-stream.bin")
#: README traces a command names are linked into the folder; `traces/*.bin` then globs only these
NAMED_TRACES = ("resnet50.bin", "gpt2.bin", "gpt2-maxsplit128-rp2div4.bin", "pressure-fraction-oom.bin")
TIMEOUT = 120
#: the installed package's data folder, `<embedded>` in the README
EMBEDDED = os.path.join(ROOT, "allocsim", "data")

#: why a command does not run here; matched as a prefix of the command line
SKIP = {
    "python3 -m pip install": "installs the package (this test runs from the checkout); .ci/run does that",
    "allocsim record": "needs a GPU and PyTorch or CuPy (tests/test_record.py covers the CLI without one)",
    "allocsim calibrate": "times a real GPU's cudaMalloc/cudaFree",
    "python3 -m pytest": "the suite itself, this test included",
    "allocsim sweep traces/*.bin --policies torch,examples/policies/first_fit.py:FirstFit -o r.csv --dask-local":
        "starts a Dask cluster (tests/test_compare_fit_sweep.py runs --dask-local against a local sweep)",
}
#: heavy commands run with fewer policies or cells; the README's rows for what is left must still show
SHORTEN = {
    # knet (619 replays), binned and split take most of the walk; each row is its own policy's
    "allocsim fit traces/resnet50.bin --policies": ("binned,split,knet,torch,torch[expandable_segments:True],cupy,"
                                                    "bestfit", "torch,torch[expandable_segments:True],cupy,bestfit"),
    # 36 cells; the command's form is what is checked here
    "allocsim compare run.bin --policies": ("binned,split,knet,torch,cupy,bestfit", "split,torch"),
    # the walk of knet (every capacity where it collects) and binned; the command's form is what is checked
    "allocsim fit run.bin": ("allocsim fit run.bin", "allocsim fit run.bin --policies torch,cupy,bestfit"),
    "allocsim plot run.bin --report": ("--report out/", "--report out/ --policies split,torch"),
    # 225 settings and the finalists' walks; the tune outputs the README shows run whole below
    "allocsim tune run.bin": ("--capacity 24GB", "--capacity 24GB --max-replays 30 --no-fit"),
}
#: wall-clock figures: the only ones that differ between runs (and how many replays `tune -j N` made: a setting with
#: a GC threshold takes its setting's figures where that setting's replay, bounded as it stood then, stopped first)
WALL = [re.compile(r"(load|replay|total) [\d.]+s"), re.compile(r"\d+ replays in [\d.]+s")]


@dataclass
class Command:
    line: str                       # as the document writes it (comment and `$ ` removed)
    where: int                      # line number in the document
    doc: str = "README.md"
    comment: str = ""
    shown: list = field(default_factory=list)       # the output lines the README prints under it

    @property
    def id(self) -> str:
        return f"{self.doc.removesuffix('.md')}:L{self.where}:" + " ".join(self.line.split()[:3])


def readme_commands(text: str) -> list[Command]:
    """The `allocsim` commands of the README's shell and output blocks, in order."""
    out, block, lang, start = [], None, "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if block is None:
                block, lang, start = [], line[3:].strip(), n
            else:
                out += _block_commands(block, lang, start)
                block = None
        elif block is not None:
            block.append(line)
    return out


def _block_commands(lines, lang, start) -> list[Command]:
    if lang not in ("", "sh"):
        return []
    cmds = []
    for k, line in enumerate(lines):
        where = start + 1 + k
        if line.startswith("$ "):
            cmds.append(Command(line[2:].strip(), where))
        elif cmds and lines[0].startswith("$ ") and lang == "":
            cmds[-1].shown.append(line)
        elif lang == "sh" or line.startswith("allocsim "):
            code, _, comment = line.partition("  #")
            code = code.strip()
            if code and not code.startswith("#"):
                for part in code.split(" && "):
                    cmds.append(Command(part.strip(), where, comment.strip()))
    return cmds


def documented_commands() -> list[Command]:
    """The commands of every document in `DOCS`, each command line once: where it shows the most output to check,
    else where it first stands."""
    seen: dict[str, Command] = {}
    for doc in DOCS:
        for cmd in readme_commands(open(os.path.join(ROOT, doc), encoding="utf-8").read()):
            cmd.doc = doc
            if cmd.line not in seen or len(cmd.shown) > len(seen[cmd.line].shown):
                seen[cmd.line] = cmd
    return list(seen.values())


COMMANDS = documented_commands()


def _skip_reason(line: str) -> str | None:
    return next((why for prefix, why in SKIP.items() if line.startswith(prefix)), None)


def _shortened(line: str) -> tuple[str, set]:
    """The command as run here, and the policies left out of it."""
    for prefix, (old, new) in SHORTEN.items():
        if line.startswith(prefix):
            assert old in line, f"README changed: {line!r} no longer holds {old!r}; update SHORTEN"
            return line.replace(old, new, 1), set(old.split(",")) - set(new.split(","))
    return line, set()


def _without_alternatives(line: str) -> str:
    """``… [--dask-local 4 | --scheduler tcp://host:8786]`` -> the command without the optional part."""
    return re.sub(r"\s*\[--[^\]]*\]", "", line)


def written_files(argv) -> list[str]:
    """The files and folders a command says it writes: ``-o X``, ``--snapshot X``, ``--plot X``, ``--report D``."""
    out = []
    for flag, value in zip(argv, argv[1:]):
        if flag in ("-o", "--output", "--snapshot", "--plot", "--report", "--csv"):
            out.append(value)
    return out


def folder_for(tmp, line: str) -> None:
    """The files the command reads: the named shipped traces, run.bin, snapshot.pickle, the examples."""
    os.makedirs(os.path.join(tmp, "traces"))
    for name in NAMED_TRACES:
        os.symlink(os.path.join(ROOT, "traces", name), os.path.join(tmp, "traces", name))
    for folder in ("raw", "reactive"):
        os.symlink(os.path.join(ROOT, "traces", folder), os.path.join(tmp, "traces", folder))
    os.symlink(os.path.join(ROOT, "examples"), os.path.join(tmp, "examples"))
    writes = written_files(shlex.split(line))
    if "run.bin" not in writes:
        shutil.copy(RUN_BIN, os.path.join(tmp, "run.bin"))
    shutil.copy(os.path.join(ROOT, "traces", "raw", "pressure", "plain.pickle"), os.path.join(tmp, "snapshot.pickle"))
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir)
    with open(os.path.join(bindir, "allocsim"), "w") as f:
        f.write(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m allocsim "$@"\n')
    os.chmod(os.path.join(bindir, "allocsim"), 0o755)


def normalized(lines) -> list[str]:
    """Lines as compared: wall-clock seconds masked, runs of spaces collapsed, rules and blank lines dropped."""
    out = []
    for line in lines:
        for pat in WALL:
            line = pat.sub(lambda m: ("<n> replays in" if "replays" in m.group(0) else m.group(0).split()[0]) + " <s>",
                           line)
        line = " ".join(line.replace(EMBEDDED, "<embedded>").split())
        if line and set(line) - set("─ "):
            out.append(line)
    return out


def missing_lines(shown, printed) -> list[str]:
    """The README's shown lines not printed in that order (``...`` lets lines go between)."""
    printed = normalized(printed)
    at, missing = 0, []
    for want in normalized(s for s in shown if s.strip() != "..."):
        try:
            at = printed.index(want, at) + 1
        except ValueError:
            missing.append(want)
    return missing


def _run(line, tmp):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PATH=os.path.join(tmp, "bin") + os.pathsep + os.environ["PATH"], COLUMNS="200")
    return subprocess.run(["bash", "-c", line], cwd=tmp, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def test_the_readme_has_the_commands_this_test_expects():
    lines = [c.line for c in COMMANDS]
    assert len(COMMANDS) >= 25 and any(c.shown for c in COMMANDS)
    for prefix in list(SKIP) + list(SHORTEN):
        assert any(line.startswith(prefix) for line in lines), f"no README command starts with {prefix!r}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.id for c in COMMANDS])
def test_readme_command(cmd, tmp_path):
    why = _skip_reason(cmd.line)
    if cmd.line.startswith("allocsim record"):      # not run, but parsed: its -o must be allocsim's own
        from allocsim.cli import make_parser
        args = make_parser().parse_args(shlex.split(cmd.line)[1:])
        assert [args.output] == written_files(shlex.split(cmd.line)), f"{cmd.line}: -o goes to the script"
    if why:
        pytest.skip(why)
    line, dropped = _shortened(_without_alternatives(cmd.line))
    shown = [s for s in cmd.shown if s.split()[:1] not in [[d] for d in dropped]]     # rows of policies left out
    tmp = str(tmp_path)
    folder_for(tmp, line)
    if line.startswith("allocsim replay --policy split"):       # the set-up's: the embedded trace
        assert os.path.exists(os.path.join(ROOT, "allocsim", "data", "resnet50.bin"))
    t0 = time.perf_counter()
    p = _run(line, tmp)
    took = time.perf_counter() - t0
    assert p.returncode == 0, (line, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    for out in written_files(shlex.split(line)):
        path = os.path.join(tmp, out)
        assert os.path.exists(path), f"{line}: says it writes {out}, which is not there"
        if os.path.isdir(path):
            assert os.listdir(path), f"{line}: {out} is empty"
    if shown:
        assert missing_lines(shown, p.stderr.splitlines() + p.stdout.splitlines()) == [], line
    if line.startswith("allocsim replay --policy split --cap 4GB"):     # the set-up block's, shown under it
        assert missing_lines(_setup_output(), p.stdout.splitlines()) == []
    assert took < TIMEOUT


def _setup_output() -> list[str]:
    """The output block the README shows after "The first command prints"."""
    text = open(README, encoding="utf-8").read()
    after = text.split("The first command prints", 1)[1]
    return after.split("```", 2)[1].splitlines()


def test_a_changed_figure_is_noticed():
    shown = ["policy  peak reserved", "torch      3.43 GiB", "...", "total 0.5s"]
    assert missing_lines(shown, ["policy peak reserved", "x", "torch 3.43 GiB", "total 9.1s"]) == []
    assert missing_lines(shown, ["policy peak reserved", "torch 3.44 GiB", "total 9.1s"]) == ["torch 3.43 GiB"]
    assert missing_lines(["b", "a"], ["a", "b"]) == ["a"]


def test_record_says_where_its_own_options_went(tmp_path, monkeypatch, capsys):
    """`allocsim record train.py -o run.bin`: -o is the script's; the note says so and names the trace written
    (the recorder itself, which needs a GPU, is replaced by one that only says what it was asked)."""
    from allocsim.formats import recorders
    from allocsim.cli import main
    asked = []

    def record(target, out, *args, **options):
        asked.append((target.args, out))
        return 0, {}
    monkeypatch.setattr(recorders, "record", record)
    (tmp_path / "train.py").write_text("import torch\n")
    monkeypatch.chdir(tmp_path)
    assert main(["record", "train.py", "--epochs", "1", "-o", "run.bin"]) == 0
    err = capsys.readouterr().err
    assert "-o after the script goes to the script" in err and "writing train.bin" in err, err
    assert asked == [(["--epochs", "1", "-o", "run.bin"], "train.bin")]
    assert main(["record", "-o", "run.bin", "train.py", "--epochs", "1"]) == 0
    assert "goes to the script" not in capsys.readouterr().err
    assert asked[-1] == (["--epochs", "1"], "run.bin")
