"""bert.flags: each flag's constraints live in its field's metadata and one function enforces them, for the CLI
and for callers that build their Args in Python."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest

from bert import cli
from bert.commands.classify import ClassifyArgs
from bert.commands.embed import EmbedArgs
from bert.commands.fill_mask import FillMaskArgs
from bert.commands.predict import PredictArgs
from bert.commands.serve import ServeArgs
from bert.errors import InputError
from bert.finetune import FinetuneArgs, _check_flags
from bert.flags import InferenceArgs, check_batch_division, check_flag_values
from bert.tasks.classification import ClassificationTask


@dataclass
class _Flags:
    steps: int = field(default=1, metadata={"min": 1})
    patience: int = field(default=0, metadata={"min": 0})
    proportion: float = field(default=0.1, metadata={"min": 0, "max": 1})
    rate: float = field(default=1e-3, metadata={"positive": True})
    mode: str = field(default="a", metadata={"choices": ["a", "b"]})
    length: int | None = field(default=None, metadata={"min": 1})


@pytest.mark.parametrize(
    "change, message",
    [
        ({"steps": 0}, "--steps=0 must be at least 1"),
        ({"patience": -1}, "--patience=-1 must not be negative"),
        ({"proportion": 1.5}, "--proportion=1.5 must be between 0 and 1"),
        ({"rate": 0.0}, "--rate=0.0 must be positive"),
        ({"rate": float("inf")}, "--rate=inf must be a finite number"),
        ({"mode": "c"}, "--mode=c is not one of a, b"),
    ],
)
def test_metadata_constraints_are_enforced(change, message):
    check_flag_values(_Flags())  # the defaults pass; None ("the model's own") is not checked
    with pytest.raises(InputError) as e:
        check_flag_values(_Flags(**change))
    assert str(e.value) == message


def test_batch_division_names_the_factors():
    check_batch_division(32, 2, 4)
    with pytest.raises(InputError, match=r"--train_batch_size=30 must be divisible by .* = 2 x 4 = 8"):
        check_batch_division(30, 2, 4)


def test_finetune_runner_checks_choices_from_metadata_for_python_callers(tmp_path):
    """Args built in Python skip the parser's choices: the runner's check reads the same metadata."""
    args = ClassifyArgs(task_name="sst-2", data_dir=str(tmp_path), output_dir=str(tmp_path / "o"), do_train=True)
    task = ClassificationTask(args)
    with pytest.raises(InputError, match="--precision=fp8 is not one of fp32, bf16, fp16"):
        _check_flags(dataclasses.replace(args, precision="fp8"), task, 1)
    with pytest.raises(InputError, match="--train_batch_size=30 must be divisible"):
        _check_flags(dataclasses.replace(args, train_batch_size=30, gradient_accumulation_steps=4), task, 1)
    with pytest.raises(InputError, match="--early_stopping_patience needs evaluations during training"):
        _check_flags(dataclasses.replace(args, early_stopping_patience=2), task, 1)
    with pytest.raises(InputError, match="--metric_for_best_model=eval_f1 is not an evaluation result of `bert cl"):
        _check_flags(dataclasses.replace(args, metric_for_best_model="eval_f1"), task, 1)
    assert issubclass(ClassifyArgs, FinetuneArgs)


def test_inference_window_flags_are_defined_once():
    """--max_seq_length and --doc_stride of the inference commands are InferenceArgs' fields, one help text."""
    base = {f.name: f for f in dataclasses.fields(InferenceArgs)}
    for args_cls in (PredictArgs, EmbedArgs, FillMaskArgs, ServeArgs):
        fields = {f.name: f for f in dataclasses.fields(args_cls)}
        assert fields["max_seq_length"].metadata["help"] == base["max_seq_length"].metadata["help"], args_cls
    for args_cls in (PredictArgs, EmbedArgs):  # both read long inputs in windows (--long_document=windows)
        assert {f.name: f for f in dataclasses.fields(args_cls)}["doc_stride"].metadata is base["doc_stride"].metadata
    # fill-mask cuts long inputs: no stride flag offered
    assert "--doc_stride" not in cli._command_parser("fill-mask", cli._resolve("fill-mask")[0])._option_string_actions


def test_cli_refuses_a_bad_value_before_loading_the_model(tmp_path, capsys):
    assert cli.main(["predict", f"--model={tmp_path / 'absent'}", "--doc_stride=0"]) == 2
    assert capsys.readouterr().err.strip() == "bert predict: error: --doc_stride=0 must be at least 1"
