"""`bert classify`: sentence and sentence-pair classification, the original's run_classifier.py.

The same flags and defaults (`--task_name`, `--data_dir`, `--vocab_file`, `--bert_config_file`,
`--init_checkpoint`, `--do_train/--do_eval/--do_predict`, batch sizes 32/8/8, learning rate 5e-5,
3 epochs, warmup 0.1, ...), so a command from the original README ports by replacing
`python run_classifier.py` with `bert classify`. The model is `BertForSequenceClassification`: dropout
0.1 on the pooled output (hard-coded in the original; a config's `classifier_dropout` overrides it),
a linear layer, softmax cross-entropy, or the squared error for regression tasks (STS-B, or
`--task_name=generic --is_regression`). The runner (`bert.finetune`) does the rest; see it for the
batching, evaluation during training, early stopping and resuming.

Tasks (`--task_name`, case-insensitive): the original's `cola`, `mnli`, `mrpc`, `xnli` (language from
`--xnli_language`, "zh" by default as the original hard-codes), the other GLUE tasks `sst-2`, `sts-b`,
`qqp`, `qnli`, `rte`, `wnli`, `mnli-mm`, and `generic` for one's own TSV, CSV or JSON-lines files, whose
columns are named by `--text_a_column`, `--text_b_column` and `--label_column` (0-based numbers, or
header names with `--has_header`) and whose labels are `--labels` or, without it, the sorted labels of
the training file (saved with the model, so evaluation alone needs no training file).

Outputs: `eval_results.txt` with the original's keys `eval_accuracy`, `eval_loss` (the mean loss per
example; the mean squared error for regression, which has no `eval_accuracy`), `global_step`, `loss`
(the mean over batches of `--eval_batch_size` of the batch loss, as the Estimator reports it), plus the
task's GLUE metrics: `eval_f1` (MRPC, QQP), `eval_mcc` (CoLA), `eval_pearson`, `eval_spearman` and
their mean `eval_corr` (regression). `test_results.tsv`: one line per test example, in input order, no
header: the class probabilities in label-list order, tab separated, as the original prints them; for
regression the predicted score.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bert.errors import InputError
from bert.finetune import FinetuneArgs, FinetuneTask, run_finetune
from bert.formats.results import write_test_results
from bert.metrics import accuracy, glue_metrics, pearson, spearman
from bert.modeling import BertForSequenceClassification
from bert.tasks import ALIASES, TASKS, get_processor
from bert.tasks.common import column_spec, label_list_flag
from bert.tasks.glue import convert_examples_to_features, features_to_arrays

logger = logging.getLogger(__name__)

# Which GLUE metrics a task reports besides accuracy (the others: accuracy only).
_EXTRA_METRIC = {"cola": "mcc", "mrpc": "f1", "qqp": "f1"}
_REGRESSION_METRICS = ["eval_pearson", "eval_spearman", "eval_corr"]
_GENERIC_FLAGS = ("text_a_column", "text_b_column", "label_column", "labels", "train_file", "dev_file", "test_file")


@dataclass(kw_only=True)
class ClassifyArgs(FinetuneArgs):
    """Fine-tune and evaluate BERT on sentence (pair) classification (run_classifier.py).

    Resumes from the newest checkpoint in --output_dir when there is one.
    """

    task_name: str = field(
        metadata={
            "help": "The name of the task to train: cola, mnli, mrpc, xnli, sst-2, sts-b, qqp, qnli, rte, wnli, "
            "mnli-mm, or generic (one's own files, see --text_a_column)."
        }
    )
    xnli_language: str = field(default="zh", metadata={"help": "The XNLI language (the original hard-codes zh)."})
    text_a_column: str | None = field(
        default=None,
        metadata={"help": "generic: column of the first text, a 0-based number or a header name (default 0)."},
    )
    text_b_column: str | None = field(
        default=None, metadata={"help": "generic: column of the second text, for sentence pairs (default none)."}
    )
    label_column: str | None = field(
        default=None, metadata={"help": "generic: column of the label, a number (-1: the last) or a name (default -1)."}
    )
    labels: str | None = field(
        default=None,
        metadata={"help": "generic: the labels in id order, comma separated (default: sorted labels of train file)."},
    )
    has_header: bool = field(
        default=False, metadata={"help": "generic: the .tsv/.csv files start with a header line (skipped)."}
    )
    is_regression: bool = field(
        default=False, metadata={"help": "generic: the labels are numbers to regress on (as STS-B)."}
    )
    train_file: str | None = field(
        default=None, metadata={"help": "generic: training file in --data_dir: .tsv, .csv or .jsonl (train.tsv)."}
    )
    dev_file: str | None = field(default=None, metadata={"help": "generic: dev file in --data_dir (dev.tsv)."})
    test_file: str | None = field(default=None, metadata={"help": "generic: test file in --data_dir (test.tsv)."})


class ClassifyTask(FinetuneTask):
    """Sequence classification with a `bert.tasks` processor."""

    command = "classify"
    classifier_dropout = 0.1  # run_classifier.create_model: keep_prob=0.9, not read from the config

    def __init__(self, args: ClassifyArgs):

        self.args = args
        self.model_class = BertForSequenceClassification
        name = args.task_name.lower()
        self.name = ALIASES.get(name, name)
        self.processor = None

    @property
    def is_regression(self) -> bool:
        return self.name == "sts-b" or (self.name == "generic" and self.args.is_regression)

    @property
    def default_metric(self) -> str:  # type: ignore[override]
        if self.is_regression:
            return "eval_corr"
        return "eval_mcc" if self.name == "cola" else "eval_accuracy"

    def metric_names(self) -> list[str]:
        if self.is_regression:
            return list(_REGRESSION_METRICS)
        extra = _EXTRA_METRIC.get(self.name)
        return ["eval_accuracy"] + ([f"eval_{extra}"] if extra else [])

    def check_flags(self) -> None:

        if self.name not in TASKS:
            raise InputError(f"Task not found: {self.args.task_name!r}; --task_name must be one of {', '.join(TASKS)}")
        if self.name != "generic":
            given = [f"--{f}" for f in _GENERIC_FLAGS if getattr(self.args, f) is not None]
            if self.args.is_regression:
                given.append("--is_regression")
            if given:
                raise InputError(
                    f"{', '.join(given)} only apply to --task_name=generic; drop them for "
                    f"--task_name={self.args.task_name}"
                )
        label_list_flag(self.args.labels)

    def setup(self, saved_labels: list[str] | None, do_train: bool) -> None:

        a = self.args
        kwargs: dict[str, Any] = {}
        if self.name == "xnli":
            kwargs["language"] = a.xnli_language
        elif self.name == "generic":
            label_list = label_list_flag(a.labels)
            if label_list is None and not do_train and not a.is_regression:
                label_list = saved_labels  # the labels the model was trained with
            kwargs = dict(
                text_a_column=0 if a.text_a_column is None else column_spec(a.text_a_column),
                label_column=-1 if a.label_column is None else column_spec(a.label_column),
                text_b_column=column_spec(a.text_b_column),
                has_header=a.has_header,
                label_list=label_list,
                is_regression=a.is_regression,
                train_file=a.train_file or "train.tsv",
                dev_file=a.dev_file or "dev.tsv",
                test_file=a.test_file or "test.tsv",
            )
        self.processor = get_processor(self.name, **kwargs)

    def read_examples(self, split: str) -> list:
        data_dir = self.args.data_dir
        if not os.path.isdir(data_dir):
            raise InputError(f"--data_dir={data_dir}: no such directory")
        get = {
            "train": self.processor.get_train_examples,
            "dev": self.processor.get_dev_examples,
            "test": self.processor.get_test_examples,
        }[split]
        try:
            return get(data_dir)
        except NotImplementedError:
            raise InputError(f"--task_name={self.args.task_name} has no {split} set") from None

    def labels(self) -> list | None:
        return None if self.is_regression else self.processor.get_labels()

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": 1 if self.is_regression else len(self.processor.get_labels())}

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:

        label_list = [None] if self.is_regression else self.processor.get_labels()
        return convert_examples_to_features(examples, label_list, max_seq_length, tokenizer, pad=pad)

    def feature_length(self, feature) -> int:
        return int(sum(feature.input_mask))

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:

        a = features_to_arrays(features, pad_to)
        labels = a["label_ids"].astype(np.float32 if self.is_regression else np.int64)
        return {
            "input_ids": a["input_ids"],
            "attention_mask": a["input_mask"],
            "token_type_ids": a["segment_ids"],
            "labels": labels,
        }

    def loss_terms(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_regression:
            err = (logits.float().squeeze(-1) - labels.float()) ** 2  # the model's MSE, per example
            return err, torch.ones_like(err)
        return super().loss_terms(logits, labels)

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:

        logits = np.stack(outputs)  # [N, L]
        gold = np.array([f.label_id for f in features])
        if self.is_regression:
            preds = logits[:, 0]
            if self.name == "generic":
                r, rho = pearson(preds, gold), spearman(preds, gold)
                found = {"pearson": r, "spearman": rho, "corr": (r + rho) / 2}
            else:
                found = glue_metrics(self.name, preds, gold)
        else:
            preds = logits.argmax(-1)
            found = (
                {"accuracy": accuracy(preds, gold)} if self.name == "generic" else glue_metrics(self.name, preds, gold)
            )
        return {f"eval_{k}": v for k, v in found.items()}

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:

        logits = torch.from_numpy(np.stack(outputs))  # [N, L]
        values = logits[:, 0] if self.is_regression else torch.softmax(logits, dim=-1)
        path = output_dir / "test_results.tsv"
        write_test_results(path, values.numpy(), num_examples=len(examples))
        return {"test_results": str(path), "num_examples": len(examples)}


def run_classify(args: ClassifyArgs) -> dict[str, Any]:
    """Train, evaluate and/or predict (see the module docstring); returns the runner's summary."""
    return run_finetune(args, ClassifyTask(args))
