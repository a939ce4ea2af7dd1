"""Every command that writes a file says so in one line when it cannot (exit 2, no traceback)."""
import pytest

from conftest import ROOT, run_cli

TRACE = f"{ROOT}/traces/cupy_mlp.bin"


@pytest.mark.parametrize("args", [
    ["plot", TRACE, "--policies", "none", "-o", "{d}/x.png"],
    ["synth", "mlp", "-o", "{d}/x.bin"],
    ["import", f"{ROOT}/tests/fixtures/log.csv", "-o", "{d}/x.bin"],
    ["sweep", TRACE, "--policies", "none", "-o", "{d}/x.csv"],
    ["compare", TRACE, "--policies", "none", "--csv", "{d}/x.csv"],
    ["calibrate", "-o", "{d}/x.json"],
])
def test_unwritable_output_is_one_line(tmp_path, args):
    missing = str(tmp_path / "no" / "such" / "dir")
    out = run_cli(*[a.format(d=missing) for a in args])
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_every_option_of_every_command_says_what_it_does():
    """--help is the first thing a user in a hurry reads: no option in it without a line of help."""
    import argparse

    from allocsim.cli import make_parser
    sub = next(a for a in make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    bare = [f"{name} {a.option_strings[0]}" for name, p in sub.choices.items() for a in p._actions
            if a.option_strings and not a.help]
    assert not bare, bare


@pytest.mark.parametrize("where", ["make_parser", "parse_args"])
def test_a_ctrl_c_while_the_arguments_are_read_is_one_line(monkeypatch, capsys, where):
    """A Ctrl-C while the plug-ins load (making the parser) or the arguments are read: status 130 and one line, as
    anywhere later, not a traceback."""
    from allocsim import cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    if where == "make_parser":
        monkeypatch.setattr(cli, "make_parser", interrupted)
    else:
        monkeypatch.setattr(cli.Parser, "parse_args", interrupted)
    try:
        status = cli.main(["replay", TRACE])
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped main")
    assert status == 130
    err = capsys.readouterr().err
    assert err == "allocsim: interrupted\n", err


def test_stdouts_error_handler_writes_a_names_bytes_and_spells_the_rest_in_ascii():
    """What stdout writes where its encoding lacks a character (`filenames.let_stdout_write_names`): a file name's
    undecodable byte (a lone surrogate) as the byte itself, a report's own characters in ASCII, any other as an
    escape -- character by character, whatever run of them the encoder hands over."""
    from allocsim import filenames
    text = "o\udcff\u03bcs \u2500\u2500 \u2603."
    assert text.encode("ascii", filenames._WRITES_ANYTHING) == b"o\xffus -- \\u2603."
    assert text.encode("latin-1", filenames._WRITES_ANYTHING) == b"o\xffus -- \\u2603."
    assert text.encode("utf-8", filenames._WRITES_ANYTHING) == b"o\xff" + "\u03bcs \u2500\u2500 \u2603.".encode()


@pytest.mark.parametrize("argv, says", [
    (["validate", TRACE, "--cap", "100MB"], "unrecognized arguments: --cap 100MB"),    # (ran as --capacity 100MB)
    (["replay", TRACE, "--polic", "split"], "unrecognized arguments: --polic split"),
])
def test_an_option_is_spelled_whole(argv, says, capsys):
    """A prefix of an option is refused, not taken for it: ``validate --cap 100MB`` validated on a device of 100 MB."""
    from allocsim.cli import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_version_refuses_an_unclear_build_as_every_command_does(monkeypatch, capsys):
    """``ALLOCSIM_INTERPRETED=maybe allocsim --version`` said "compiled", exit 0, where every command refuses it."""
    import allocsim.cli as cli
    monkeypatch.setattr(cli, "ENV_PROBLEM", "ALLOCSIM_INTERPRETED='maybe': expected ...")
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == "" and "ALLOCSIM_INTERPRETED='maybe'" in out.err


def test_compare_csv_refuses_a_json_name(tmp_path, capsys):
    from allocsim.cli import main
    assert main(["compare", TRACE, "-p", "none", "-q", "--csv", str(tmp_path / "x.json")]) == 2
    assert "--csv writes CSV, which its .json name contradicts" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
