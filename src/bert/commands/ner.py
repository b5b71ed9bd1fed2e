"""`bert ner`: named-entity recognition on CoNLL-2003 (the BERT paper's §5.3 recipe).

The original repository has no NER script (spec §10 item 5); this one takes the common fine-tuning
flags of `bert classify` (`bert.finetune`). Data: `--data_dir` holds `train.txt`, `valid.txt` and
`test.txt` (CoNLL-2003: `token POS chunk NER` per line, a blank line between sentences, `-DOCSTART-`
lines between documents; any layout with the word first and the tag last works, as long as every line
of a file has the same number of columns). `bert.tasks.ner` reads them and puts each word's label on
its first sub-token; other positions are ignored by the loss. Sentences longer than `--max_seq_length`
are split into windows at word boundaries, so every word gets a prediction. `num_train_steps` counts
sentences, as run_squad counts examples.

Model: `BertForTokenClassification` (dropout, then a linear layer on every token). Labels: the nine
CoNLL-2003 tags (`O`, `B-/I-` `MISC`, `PER`, `ORG`, `LOC`) or `--labels`; saved with the model.

Outputs: `eval_results.txt` with conlleval's entity-level `eval_precision`, `eval_recall`, `eval_f1`,
the word-level tag accuracy `eval_accuracy`, `eval_loss` (mean cross-entropy per labelled word),
`loss` and `global_step`; `eval_predictions.txt` (the dev set); and with `--do_predict`
`test_predictions.txt` (`token gold pred` per line, a blank line after each sentence: conlleval's
input) and `test_results.txt` with the same scores on the test set (`test_f1`, ...).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bert.errors import InputError
from bert.finetune import FinetuneArgs, FinetuneTask, run_finetune
from bert.formats.results import write_results
from bert.metrics import ner_metrics
from bert.modeling import BertForTokenClassification
from bert.tasks.common import label_list_flag, pad_2d
from bert.tasks.ner import (
    CONLL2003_LABELS,
    IGNORE_INDEX,
    convert_ner_examples_to_features,
    ner_features_to_arrays,
    read_conll,
    word_predictions,
    write_conll_predictions,
)

_METRICS = ("precision", "recall", "f1", "accuracy")


@dataclass(kw_only=True)
class NerArgs(FinetuneArgs):
    """Fine-tune and evaluate BERT on named-entity recognition (CoNLL-2003 files).

    Resumes from the newest checkpoint in --output_dir when there is one.
    """

    labels: str | None = field(
        default=None,
        metadata={"help": "The tags in id order, comma separated. Default: the nine CoNLL-2003 tags."},
    )
    train_file: str = field(default="train.txt", metadata={"help": "Training file in --data_dir."})
    dev_file: str = field(default="valid.txt", metadata={"help": "Dev file in --data_dir (--do_eval)."})
    test_file: str = field(default="test.txt", metadata={"help": "Test file in --data_dir (--do_predict)."})


class NerTask(FinetuneTask):
    """Token classification of CoNLL files."""

    command = "ner"
    default_metric = "eval_f1"

    def __init__(self, args: NerArgs):

        self.args = args
        self.model_class = BertForTokenClassification
        self.label_list: list[str] = []

    def check_flags(self) -> None:
        label_list_flag(self.args.labels)

    def metric_names(self) -> list[str]:
        return [f"eval_{m}" for m in _METRICS]

    def setup(self, saved_labels: list[str] | None, do_train: bool) -> None:

        given = label_list_flag(self.args.labels)
        self.label_list = given or (saved_labels if saved_labels and not do_train else list(CONLL2003_LABELS))

    def read_examples(self, split: str) -> list:

        name = {"train": self.args.train_file, "dev": self.args.dev_file, "test": self.args.test_file}[split]
        if not os.path.isdir(self.args.data_dir):
            raise InputError(f"--data_dir={self.args.data_dir}: no such directory")
        return read_conll(os.path.join(self.args.data_dir, name), num_columns=None, label_list=self.label_list)

    def labels(self) -> list | None:
        return self.label_list

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": len(self.label_list)}

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:

        return convert_ner_examples_to_features(examples, self.label_list, max_seq_length, tokenizer, pad=pad)

    def feature_length(self, feature) -> int:
        return int(sum(feature.input_mask))

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:

        a = ner_features_to_arrays(features, pad_to)
        return {
            "input_ids": a["input_ids"],
            "attention_mask": a["input_mask"],
            "token_type_ids": a["segment_ids"],
            "labels": a["label_ids"],
        }

    def loss_terms(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:

        B, T, L = logits.shape
        losses = torch.nn.functional.cross_entropy(
            logits.float().reshape(B * T, L), labels.reshape(-1).long(), ignore_index=IGNORE_INDEX, reduction="none"
        ).view(B, T)  # [B*T] -> [B, T]
        return losses.sum(-1), (labels != IGNORE_INDEX).sum(-1).to(losses.dtype)

    def count(self, labels: torch.Tensor) -> torch.Tensor:

        return (labels != IGNORE_INDEX).sum().float()

    def feature_outputs(self, logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> list[np.ndarray]:
        ids = logits.argmax(-1).cpu().numpy()  # [B, T]
        lengths = batch["attention_mask"].sum(-1).cpu().tolist()
        return [row[:n] for row, n in zip(ids, lengths)]

    def _word_predictions(self, examples: Sequence, features: Sequence, outputs: list) -> list[list[str]]:

        return word_predictions(examples, features, pad_2d(outputs), self.label_list)

    def _scores(self, prefix: str, examples: Sequence, predicted: list[list[str]]) -> dict[str, Any]:

        scores = ner_metrics([ex.labels for ex in examples], predicted)
        return {f"{prefix}_{m}": scores[m] for m in _METRICS}

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:
        return self._scores("eval", examples, self._word_predictions(examples, features, outputs))

    def write_eval_files(self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list) -> None:

        write_conll_predictions(
            output_dir / "eval_predictions.txt", examples, self._word_predictions(examples, features, outputs)
        )

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:

        predicted = self._word_predictions(examples, features, outputs)
        path = output_dir / "test_predictions.txt"
        write_conll_predictions(path, examples, predicted)
        scores = self._scores("test", examples, predicted)
        write_results(output_dir, scores, name="test_results")
        return {"test_predictions": str(path), **scores}


def run_ner(args: NerArgs) -> dict[str, Any]:
    """Train, evaluate and/or predict (see the module docstring); returns the runner's summary."""
    return run_finetune(args, NerTask(args))
