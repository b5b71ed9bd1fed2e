"""SWAG multiple-choice data (Zellers et al. 2018; the BERT paper's section 4.4): reading and features.

Input: the CSV files of rowanz/swagaf `data/` (`train.csv`, `val.csv`, `test.csv`), comma separated with
standard CSV quoting and a header line naming the columns: an unnamed index column, then `video-id,
fold-ind, startphrase, sent1, sent2, gold-source, ending0, ending1, ending2, ending3, label` (test.csv
has no `label`). Columns are found by their header names, so the unnamed index column may be absent.

Each example becomes four sequences, one per ending, as BERT's SWAG recipe (the paper; the PyTorch port
`run_swag.py` of huggingface): `[CLS] sent1 [SEP] sent2 ending_i [SEP]`, segment ids 0 for the context
part and 1 for the ending part, the pair truncated by popping from the longer side (`truncate_seq_pair`),
zero padding to `max_seq_length`. The model scores each of the four and a softmax over them picks one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert.errors import InputError
from bert.formats.results import write_test_results
from bert.metrics import accuracy
from bert.tasks.common import FinetuneTask, model_inputs, pad_2d, softmax, truncate_seq_pair
from bert.tasks.glue import read_rows
from bert.tokenization import printable_text

if TYPE_CHECKING:
    from bert.commands.swag import SwagArgs
    from bert.tokenization import FullTokenizer

logger = logging.getLogger(__name__)

__all__ = [
    "NUM_CHOICES",
    "MultipleChoiceFeatures",
    "SwagExample",
    "convert_swag_examples_to_features",
    "read_swag_examples",
    "swag_features_to_arrays",
    "swag_metrics",
]

NUM_CHOICES = 4
_TEXT_COLUMNS = ("fold-ind", "sent1", "sent2", "ending0", "ending1", "ending2", "ending3")


@dataclass
class SwagExample:
    """One SWAG question.

    Args:
        swag_id: the `fold-ind` column.
        context_sentence: `sent1`, the first sentence.
        start_ending: `sent2`, the start of the second sentence (a noun phrase), shared by the endings.
        endings: the four candidate endings of the second sentence.
        label: the index (0..3) of the right ending; None in test files.
    """

    swag_id: str
    context_sentence: str
    start_ending: str
    endings: list[str]
    label: int | None = None


@dataclass
class MultipleChoiceFeatures:
    """One example as model inputs: one sequence per choice.

    Args:
        example_id: the example's `swag_id`.
        input_ids: [num_choices][max_seq_length] (each unpadded when made with `pad=False`).
        input_mask: 1 for real tokens, 0 for padding, per choice.
        segment_ids: 0 for `[CLS]` sent1 `[SEP]`, 1 for sent2 + ending and its `[SEP]`, per choice.
        label: the right choice; 0 as a placeholder when the example has no label (test files).
    """

    example_id: str
    input_ids: list[list[int]]
    input_mask: list[list[int]]
    segment_ids: list[list[int]]
    label: int


def read_swag_examples(path: str | os.PathLike, has_label: bool | None = None) -> list[SwagExample]:
    """The examples of a SWAG CSV file.

    Args:
        path: `train.csv`, `val.csv` or `test.csv` (or any file in that layout).
        has_label: True to require the `label` column (training, evaluation), False to ignore it; None
            (default) to read it when the header has it.
    """
    path = os.fspath(path)
    rows = [(line, row) for line, row in read_rows(path, ",", '"') if row]
    if not rows:
        raise InputError(f"{path} is empty; expected a SWAG CSV file with a header line")
    header = rows[0][1]
    missing = [c for c in _TEXT_COLUMNS if c not in header]
    if missing:
        raise InputError(
            f"{path}:{rows[0][0]}: the header has no column {', '.join(missing)}; a SWAG file starts with the "
            f"header ',video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label'"
        )
    if has_label is None:
        has_label = "label" in header
    elif has_label and "label" not in header:
        raise InputError(
            f"{path}:{rows[0][0]}: no 'label' column; training and evaluation need labelled data (train.csv, "
            f"val.csv; test.csv has no labels)"
        )
    col = {name: header.index(name) for name in (*_TEXT_COLUMNS, *(("label",) if has_label else ()))}
    needed = max(col.values()) + 1
    examples = []
    for line, row in rows[1:]:
        if len(row) < needed:
            raise InputError(
                f"{path}:{line}: expected {len(header)} comma-separated columns, found {len(row)}; fix this row "
                f"(a field holding a comma must be in double quotes)"
            )
        label = None
        if has_label:
            text = row[col["label"]].strip()
            if text not in [str(i) for i in range(NUM_CHOICES)]:
                raise InputError(
                    f"{path}:{line}: label {row[col['label']]!r} is not an ending index 0..{NUM_CHOICES - 1}; "
                    f"fix the label column"
                )
            label = int(text)
        examples.append(
            SwagExample(
                swag_id=row[col["fold-ind"]],
                context_sentence=row[col["sent1"]],
                start_ending=row[col["sent2"]],
                endings=[row[col[f"ending{i}"]] for i in range(NUM_CHOICES)],
                label=label,
            )
        )
    if not examples:
        raise InputError(f"{path} has a header line but no examples")
    return examples


def convert_swag_examples_to_features(
    examples: Sequence[SwagExample],
    max_seq_length: int,
    tokenizer: FullTokenizer,
    pad: bool = True,
) -> list[MultipleChoiceFeatures]:
    """Four sequences per example, `[CLS] sent1 [SEP] sent2 ending [SEP]` (see the module docstring).

    Args:
        examples: the examples.
        max_seq_length: the length of each sequence; longer pairs are truncated from the longer side.
        tokenizer: a `FullTokenizer`.
        pad: False for unpadded sequences (same ids), for batches padded to their longest sequence.
    """
    if max_seq_length < 3:
        raise InputError(f"--max_seq_length={max_seq_length} leaves no room for text; use at least 3 (128 is usual)")
    features = []
    for ex_index, example in enumerate(examples):
        if ex_index % 10000 == 0:
            logger.info("Writing example %d of %d", ex_index, len(examples))
        context_tokens = tokenizer.tokenize(example.context_sentence)
        start_ending_tokens = tokenizer.tokenize(example.start_ending)
        ids, masks, segments = [], [], []
        for choice, ending in enumerate(example.endings):
            # The context is copied: each choice truncates its own pair. "- 3" for [CLS], [SEP], [SEP].
            context_tokens_choice = context_tokens[:]
            ending_tokens = start_ending_tokens + tokenizer.tokenize(ending)
            truncate_seq_pair(context_tokens_choice, ending_tokens, max_seq_length - 3)
            tokens = ["[CLS]", *context_tokens_choice, "[SEP]", *ending_tokens, "[SEP]"]
            segment_ids = [0] * (len(context_tokens_choice) + 2) + [1] * (len(ending_tokens) + 1)
            input_ids = tokenizer.convert_tokens_to_ids(tokens)
            input_mask = [1] * len(input_ids)
            if pad:
                padding = [0] * (max_seq_length - len(input_ids))
                input_ids += padding
                input_mask += padding
                segment_ids += padding
            ids.append(input_ids)
            masks.append(input_mask)
            segments.append(segment_ids)
            if ex_index < 5:
                logger.info("*** Example ***")
                logger.info("swag_id: %s", example.swag_id)
                logger.info("choice: %d", choice)
                logger.info("tokens: %s", " ".join(printable_text(x) for x in tokens))
                logger.info("input_ids: %s", " ".join(str(x) for x in input_ids))
                logger.info("input_mask: %s", " ".join(str(x) for x in input_mask))
                logger.info("segment_ids: %s", " ".join(str(x) for x in segment_ids))
        if ex_index < 5 and example.label is not None:
            logger.info("label: %d", example.label)
        label = example.label if example.label is not None else 0
        features.append(
            MultipleChoiceFeatures(
                example_id=example.swag_id, input_ids=ids, input_mask=masks, segment_ids=segments, label=label
            )
        )
    return features


def swag_features_to_arrays(
    features: Sequence[MultipleChoiceFeatures], pad_to: int | None = None
) -> dict[str, np.ndarray]:
    """A batch as int64 NumPy arrays: `input_ids`, `input_mask`, `segment_ids` [B, num_choices, S] (padded
    with 0 to `pad_to` or the longest sequence) and `labels` [B]."""
    if not features:
        raise ValueError("no features")
    num_choices = len(features[0].input_ids)
    length = pad_to if pad_to is not None else max(len(seq) for f in features for seq in f.input_ids)

    def stack(name: str) -> np.ndarray:
        flat = [seq for f in features for seq in getattr(f, name)]
        return pad_2d(flat, length).reshape(len(features), num_choices, length)  # [B * C, S] -> [B, C, S]

    return {
        "input_ids": stack("input_ids"),
        "input_mask": stack("input_mask"),
        "segment_ids": stack("segment_ids"),
        "labels": np.asarray([f.label for f in features], dtype=np.int64),
    }


def swag_metrics(logits: Any, labels: Any) -> dict[str, float]:
    """`{"accuracy": ...}` of the argmax over the choices of `logits` [N, num_choices] against `labels` [N]."""
    scores = np.asarray(logits)
    if scores.ndim != 2:
        raise ValueError(f"logits must be [N, num_choices], got shape {scores.shape}")
    return {"accuracy": accuracy(scores.argmax(axis=-1), np.asarray(labels))}


# --------------------------------------------------------------------------------------------------
# The fine-tuning task


class SwagTask(FinetuneTask):
    """Four-way multiple choice (`bert swag`).

    Args:
        args: the flags of `bert swag` (`data_dir`, `train_file`, `dev_file`, `test_file`).
    """

    command = "swag"
    head = "BertForMultipleChoice"
    default_metric = "eval_accuracy"

    def __init__(self, args: SwagArgs):
        self.args = args

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
        return model_inputs(swag_features_to_arrays(features, pad_to))

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:
        found = swag_metrics(np.stack(outputs), [f.label for f in features])
        return {f"eval_{k}": v for k, v in found.items()}

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:
        probs = softmax(np.stack(outputs))  # [N, 4]
        path = output_dir / "test_results.tsv"
        write_test_results(path, probs, num_examples=len(examples))
        return {"test_results": str(path), "num_examples": len(examples)}
