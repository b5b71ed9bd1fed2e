"""`bert swag`: multiple choice on SWAG (Zellers et al. 2018; the BERT paper's §4.4 recipe).

The original repository has no SWAG script; this one takes the common fine-tuning flags of
`bert classify` (`bert.finetune`). Data: `--data_dir` holds `train.csv`, `val.csv` and `test.csv` in the
layout of rowanz/swagaf `data/` (read by `bert.tasks.swag`; `test.csv` may lack the `label` column).
Each example becomes four sequences `[CLS] sent1 [SEP] sent2 ending_i [SEP]`; `BertForMultipleChoice`
scores each from its pooled output and a softmax over the four is trained with cross-entropy.

Outputs: `eval_results.txt` with `eval_accuracy`, `eval_loss` (mean cross-entropy per example), `loss`
and `global_step`; with `--do_predict`, `test_results.tsv` in `bert classify`'s layout: one line per test
example, in input order, no header, the four endings' probabilities tab separated (the predicted ending
is the column of the largest).
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
from bert.formats.results import write_test_results
from bert.modeling import BertForMultipleChoice
from bert.tasks.swag import convert_swag_examples_to_features, read_swag_examples, swag_features_to_arrays, swag_metrics


@dataclass(kw_only=True)
class SwagArgs(FinetuneArgs):
    """Fine-tune and evaluate BERT on SWAG multiple choice.

    Resumes from the newest checkpoint in --output_dir when there is one.
    """

    train_file: str = field(default="train.csv", metadata={"help": "Training file in --data_dir."})
    dev_file: str = field(default="val.csv", metadata={"help": "Dev file in --data_dir (--do_eval)."})
    test_file: str = field(default="test.csv", metadata={"help": "Test file in --data_dir (--do_predict)."})


class SwagTask(FinetuneTask):
    """Four-way multiple choice."""

    command = "swag"
    default_metric = "eval_accuracy"

    def __init__(self, args: SwagArgs):

        self.args = args
        self.model_class = BertForMultipleChoice

    def read_examples(self, split: str) -> list:

        name = {"train": self.args.train_file, "dev": self.args.dev_file, "test": self.args.test_file}[split]
        if not os.path.isdir(self.args.data_dir):
            raise InputError(f"--data_dir={self.args.data_dir}: no such directory")
        return read_swag_examples(os.path.join(self.args.data_dir, name), has_label=None if split == "test" else True)

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:

        return convert_swag_examples_to_features(examples, max_seq_length, tokenizer, pad=pad)

    def feature_length(self, feature) -> int:
        return max(int(sum(m)) for m in feature.input_mask)

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:

        a = swag_features_to_arrays(features, pad_to)
        return {
            "input_ids": a["input_ids"],
            "attention_mask": a["input_mask"],
            "token_type_ids": a["segment_ids"],
            "labels": a["labels"],
        }

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:

        found = swag_metrics(np.stack(outputs), [f.label for f in features])
        return {f"eval_{k}": v for k, v in found.items()}

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:

        probs = torch.softmax(torch.from_numpy(np.stack(outputs)), dim=-1)  # [N, 4]
        path = output_dir / "test_results.tsv"
        write_test_results(path, probs.numpy(), num_examples=len(examples))
        return {"test_results": str(path), "num_examples": len(examples)}


def run_swag(args: SwagArgs) -> dict[str, Any]:
    """Train, evaluate and/or predict (see the module docstring); returns the runner's summary."""
    return run_finetune(args, SwagTask(args))
