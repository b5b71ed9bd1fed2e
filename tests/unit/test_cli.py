"""The CLI is a table of subcommands: every documented command exists, parses the original's flag
spellings, and reports bad command lines in one line with exit code 2."""

import dataclasses
import re
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from bert import cli
from conftest import REPO


def test_every_command_is_documented_in_the_readme_and_back():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^### `bert ([a-z-]+)`", readme, flags=re.M))
    assert documented == set(cli.COMMANDS)


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_builds_its_parser_and_help(name, capsys):
    args_cls, run = cli._resolve(name)
    assert dataclasses.is_dataclass(args_cls) and callable(run)
    for f in dataclasses.fields(args_cls):
        assert f.metadata.get("help"), f"{name}: flag --{f.name} has no help text"
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--help"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"usage: bert {name} ")
    for f in dataclasses.fields(args_cls):
        if f.metadata.get("cli") is not False:
            shown = f.name.upper() if f.metadata.get("positional") else f.metadata.get("flag", f"--{f.name}")
            assert shown in printed, f"{name}: {shown} is not in --help"


def test_help_through_the_module_entry_point():
    """`python -m bert CMD --help` in a process of its own (the in-process test above covers every command)."""
    result = subprocess.run([sys.executable, "-m", "bert", "squad", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.startswith("usage: bert squad ") and not result.stderr
    assert "--version_2_with_negative" in result.stdout


@dataclass
class _Args:
    name: str = field(metadata={"help": "a required string"})
    do_train: bool = field(default=False, metadata={"help": "a boolean"})
    do_lower_case: bool = field(default=True, metadata={"help": "a boolean, true by default"})
    rate: float = field(default=0.5, metadata={"help": "a float"})
    layers: str = field(default="-1", metadata={"help": "a list"})
    optional: str | None = field(default=None, metadata={"help": "optional"})


def _parse(argv):
    parser = cli._OneLineParser(prog="bert test")
    cli.add_dataclass_flags(parser, _Args)
    return _Args(**vars(parser.parse_args(cli._attach_negative_values(argv))))


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--name=x", "--do_train=true"], {"do_train": True}),
        (["--name", "x", "--do_train", "True"], {"do_train": True}),
        (["--name=x", "--do_train"], {"do_train": True}),
        (["--name=x", "--do_lower_case=false"], {"do_lower_case": False}),
        (["--name=x", "--nodo_lower_case"], {"do_lower_case": False}),
        (["--name=x", "--rate", "2e-5", "--layers", "-1,-2,-3"], {"rate": 2e-5, "layers": "-1,-2,-3"}),
        (["--name=x"], {"optional": None, "do_train": False, "do_lower_case": True}),
    ],
)
def test_flag_spellings(argv, expected):
    args = _parse(argv)
    for key, value in expected.items():
        assert getattr(args, key) == value


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--do_train=true"], "the following arguments are required: --name"),
        (["--name=x", "--do_train=maybe"], "expected true or false"),
        (["--name=x", "--rate=fast"], "invalid float value"),
        (["--name=x", "--unknown_flag=1"], "unrecognized arguments: --unknown_flag=1"),
    ],
)
def test_bad_command_lines_one_line_exit_2(capsys, argv, fragment):
    with pytest.raises(SystemExit) as exc:
        _parse(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "extract-features" in capsys.readouterr().out
