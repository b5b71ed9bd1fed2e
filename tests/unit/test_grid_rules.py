"""The fine-tuning grid's flags and rules (`bert.grid`): comma lists parsed into lists and checked value by value,
the cells a grid expands into and the command line each runs with, the best row, and why a cell failed. The runs
themselves are in tests/e2e/test_grid.py."""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass, field

import pytest

from bert import cli, grid
from bert.commands.classify import ClassifyArgs
from bert.errors import InputError
from conftest import cli_error

BASE = ["--task_name=sst-2", "--data_dir=data", "--output_dir=out"]


def _parse(argv: list[str], args_cls: type = ClassifyArgs):
    parser = cli._command_parser("classify", args_cls)
    ns = vars(parser.parse_args(argv))
    ns.pop("verbose")
    return args_cls(**ns)


def _argparse_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        _parse(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    return err


def test_a_comma_list_is_a_list_and_one_value_stays_a_scalar():
    args = _parse([*BASE, "--learning_rate=3e-4,1e-4,5e-5,3e-5", "--train_batch_size=8,16,32,64,128"])
    assert args.learning_rate == [3e-4, 1e-4, 5e-5, 3e-5] and args.train_batch_size == [8, 16, 32, 64, 128]
    assert all(type(b) is int for b in args.train_batch_size)
    assert args.num_train_epochs == 3.0
    single = _parse([*BASE, "--learning_rate=2e-5", "--train_batch_size", "16", "--num_train_epochs=4"])
    assert (single.learning_rate, single.train_batch_size, single.num_train_epochs) == (2e-5, 16, 4.0)
    assert not grid.is_grid(single) and grid.is_grid(args)
    # Pre-training and sentence training keep scalar flags: the grid is the fine-tuning commands'.
    from bert.commands.pretrain import PretrainArgs

    assert not grid.grid_fields(PretrainArgs)
    assert [f.name for f in grid.grid_fields(ClassifyArgs)] == ["train_batch_size", "learning_rate", "num_train_epochs"]


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--learning_rate=1e-4,-1", "--learning_rate=0.0001,-1.0: the value -1.0 must be positive"),
        ("--train_batch_size=8,0", "--train_batch_size=8,0: the value 0 must be at least 1"),
        ("--num_train_epochs=4,nan", "--num_train_epochs=4.0,nan: the value nan must be a finite number"),
    ],
)
def test_each_value_of_a_list_is_checked_as_the_flag_is(capsys, flag, message):
    err = cli_error(capsys, "classify", *BASE, "--do_train", "--do_eval", flag)
    assert err == f"bert classify: error: {message}"


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--learning_rate=1e-4,fast", "argument --learning_rate: '1e-4,fast': invalid float value 'fast'"),
        ("--train_batch_size=8,16.5", "argument --train_batch_size: '8,16.5': invalid int value '16.5'"),
        ("--learning_rate=1e-4,,3e-5", "'1e-4,,3e-5' has an empty value"),
        ("--train_batch_size=8,16,8", "'8,16,8' lists a value twice"),
    ],
)
def test_a_malformed_list_is_one_line(capsys, flag, message):
    assert message in _argparse_error(capsys, [*BASE, flag])


def test_a_grid_needs_training_and_the_dev_set_and_grid_jobs_needs_a_grid(capsys, tmp_path):
    out = tmp_path / "out"
    flags = ["--task_name=sst-2", f"--data_dir={tmp_path}", f"--output_dir={out}", "--learning_rate=1e-4,3e-5"]
    err = cli_error(capsys, "classify", *flags, "--do_train")
    assert err.endswith(
        "a grid (--learning_rate=0.0001,3e-05) trains a run per combination and keeps the best on "
        "the dev set: it needs --do_train=true and --do_eval=true"
    )
    # bert squad scores the dev set by predicting a file with answers.
    squad = ["--train_file=t.json", f"--output_dir={out}", "--train_batch_size=8,16", "--do_train"]
    assert cli_error(capsys, "squad", *squad).endswith("it needs --do_train=true and --do_predict=true")
    err = cli_error(capsys, "classify", *flags[:3], "--do_train", "--do_eval", "--grid_jobs=2")
    assert "--grid_jobs=2 runs the cells of a grid at once: give several values to --train_batch_size" in err
    assert not out.exists()


def test_cells_are_named_by_short_names_and_every_other_flag_is_passed_on():
    args = _parse(
        [*BASE, "--do_train", "--do_eval", "--learning_rate=3e-5,1e-4", "--train_batch_size=32,8"]
        + ["--num_train_epochs=4", "--grid_jobs=3", "--labels=a,b", "--nodo_lower_case", "--warmup_proportion=0.2"]
    )
    cells = grid.expand(args, "do_eval")
    assert [c.name for c in cells] == [
        "bs=32,lr=3e-05,ep=4",
        "bs=32,lr=0.0001,ep=4",
        "bs=8,lr=3e-05,ep=4",
        "bs=8,lr=0.0001,ep=4",
    ]
    cell = cells[1]
    assert cell.values == {"train_batch_size": 32, "learning_rate": 1e-4, "num_train_epochs": 4.0}
    assert cell.args.output_dir == "out/grid/bs=32,lr=0.0001,ep=4" and cell.args.grid_jobs == 1
    line = grid.command_line(cell.args)
    assert "--warmup_proportion=0.2" in line and "--do_lower_case=false" in line and "--labels=a,b" in line
    assert not any(flag.startswith("--grid_jobs") for flag in line)  # a cell is an ordinary run
    # The command line gives the cell's Args back, value for value.
    assert _parse(line) == cell.args


def test_a_flag_added_later_reaches_the_cells_unchanged():
    """Nothing lists the flags a cell gets: a command's new flag (the distillation flags, say) is passed on."""

    @dataclass(kw_only=True)
    class DistillArgs(ClassifyArgs):
        teacher: str | None = field(default=None, metadata={"help": "a teacher model"})
        transfer_file: str | None = field(default=None, metadata={"help": "texts to distill on"})
        temperature: float = field(default=1.0, metadata={"help": "softmax temperature", "positive": True})

    argv = [*BASE, "--do_train", "--do_eval", "--learning_rate=1e-4,3e-5", "--teacher=teachers/big"]
    args = _parse([*argv, "--transfer_file=t.txt", "--temperature=2"], DistillArgs)
    for cell in grid.expand(args, "do_eval"):
        line = grid.command_line(cell.args)
        assert {"--teacher=teachers/big", "--transfer_file=t.txt", "--temperature=2.0"} <= set(line)
        assert _parse(line, DistillArgs) == cell.args


def test_a_distillation_grid_gives_its_cells_one_teacher_cache():
    """No grid flag changes what the teacher says, so the cells share the grid's cache: the teacher labels the
    training and transfer sets once, not once a cell (a cache entry is computed under a lock that others wait on)."""
    argv = [*BASE, "--do_train", "--do_eval", "--learning_rate=1e-4,3e-5", "--train_batch_size=8,16"]
    for extra, want in (
        (["--teacher=teachers/big"], "out/teacher_cache"),
        (["--teacher=teachers/big", "--teacher_cache_dir=elsewhere"], "elsewhere"),  # as given
        ([], None),  # no teacher, no cache
    ):
        cells = grid.expand(_parse([*argv, *extra]), "do_eval")
        assert {cell.args.teacher_cache_dir for cell in cells} == {want}, extra
        if want:
            assert all(f"--teacher_cache_dir={want}" in grid.command_line(cell.args) for cell in cells)


def test_a_value_no_command_line_can_give_is_an_error():
    args = dataclasses.replace(_parse([*BASE, "--do_train", "--do_eval"]), long_document=None)
    with pytest.raises(InputError, match="--long_document=None"):
        grid.command_line(args)


def test_the_best_row_maximises_a_score_minimises_a_loss_and_skips_failures():
    rows = [
        {"cell": "a", "status": "ok", "eval_accuracy": 0.8, "eval_loss": 0.5},
        {"cell": "b", "status": "failed", "eval_accuracy": None, "eval_loss": None},
        {"cell": "c", "status": "ok", "eval_accuracy": 0.9, "eval_loss": 0.6},
        {"cell": "d", "status": "ok", "eval_accuracy": 0.9, "eval_loss": 0.4},
    ]
    assert grid.best_row(rows, "eval_accuracy")["cell"] == "c"  # the first of equal scores
    assert grid.best_row(rows, "eval_loss")["cell"] == "d"
    assert grid.best_row(rows[1:2], "eval_accuracy") is None
    lines = grid.table_lines(rows, ["learning_rate"], "eval_loss")
    assert lines[0].split() == ["cell", "learning_rate", "eval_loss", "global_step", "seconds", "status", "error"]
    assert lines[4].startswith("* d ") and lines[1].startswith("  a ")


def test_why_a_cell_failed(tmp_path):
    terminal = tmp_path / "terminal.txt"
    terminal.write_text("train: 10%|#  \r train: 20%|##\nbert classify: error: step 3: loss is nan; lower it\n")
    assert grid._error_of(terminal, "classify", 2) == "step 3: loss is nan; lower it"
    terminal.write_text("Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory.\n")
    assert grid._error_of(terminal, "classify", 1) == "torch.OutOfMemoryError: CUDA out of memory."
    assert grid._error_of(terminal, "classify", -signal.SIGKILL) == "killed by SIGKILL (out of memory?)"
