"""What every fine-tuning task shares: the interface the fine-tuning runner drives (`FinetuneTask`), the
one renaming of the original's feature names to the model's argument names, padding, pair truncation,
the original's step arithmetic, and the flags that name columns and labels. Torch-free: a task turns
text into NumPy batches and NumPy outputs into metrics and files; `bert.finetune` runs the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bert.errors import InputError

T = TypeVar("T")  # a token or its id

# The original's feature names (run_classifier.py `InputFeatures`, the pre-training records) -> the
# model's argument names (transformers').
MODEL_INPUT_NAMES = {"input_ids": "input_ids", "input_mask": "attention_mask", "segment_ids": "token_type_ids"}


# The tasks a model head serves (`bert.inference.Predictor.task`, `bert serve`'s routes): here, without
# torch, so that a command can name them before it loads a model.
CLASSIFICATION = "classification"
NER = "ner"
QUESTION_ANSWERING = "question-answering"
MULTIPLE_CHOICE = "multiple-choice"
FILL_MASK = "fill-mask"
EMBEDDINGS = "embeddings"


def model_inputs(features: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`input_ids`, `input_mask`, `segment_ids` arrays under the model's names `input_ids`,
    `attention_mask`, `token_type_ids`; every other key is kept as it is."""
    return {MODEL_INPUT_NAMES.get(k, k): v for k, v in features.items()}


class FinetuneTask:
    """What a fine-tuning command tells the runner (`bert.finetune.run_finetune`) about its task.

    Subclasses set the attributes and implement the methods; features are made unpadded (the runner
    pads each batch). Everything here is NumPy: the runner owns the model and its losses (the heads').

    Attributes:
        command: the subcommand's name (recorded in args.json).
        head: the `bert.modeling` head class name (also the exported config's `architectures`).
        default_metric: the eval_results key that picks the best checkpoint (and a grid's best run) by default.
        dev_flag: the flag that makes a run score the dev set into eval_results.json, which a grid of runs
            (`bert.grid`) ranks its runs by.
        classifier_dropout: dropout before the head when the config sets none (the original's classifier
            hard-codes 0.1); None leaves the config's choice (hidden_dropout_prob).
    """

    command: str = ""
    head: str = ""
    default_metric: str = "eval_accuracy"
    dev_flag: str = "do_eval"
    classifier_dropout: float | None = None

    def check_flags(self) -> None:
        """Task flags that can be checked before any file is read."""

    def setup(self, saved_labels: list[str] | None, do_train: bool) -> None:
        """Called once the model files are known: `saved_labels` is the `id2label` list of the checkpoint
        the run starts from (None when it has none)."""

    def read_examples(self, split: str) -> list:
        """The examples of `split` ("train", "dev" or "test"); raises InputError on bad data."""
        raise NotImplementedError

    def read_unlabelled(self, path: str) -> list:
        """The examples of a distillation transfer file (`--transfer_file`): the task's own input format, the
        test set's where it has one; their labels are placeholders, the teacher's outputs replace them."""
        raise InputError(f"`bert {self.command}` reads no --transfer_file")

    def labels(self) -> list | None:
        """The label list saved with the model as id2label (None: nothing to save)."""
        return None

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the head's constructor (e.g. num_labels)."""
        return {}

    def inference_config(self) -> dict[str, Any]:
        """What inference needs besides the labels, saved in the exported model's config.json (e.g.
        `problem_type`, SQuAD's `doc_stride`)."""
        return {}

    def use_saved_config(self, config: dict[str, Any]) -> None:
        """Called after `setup` in runs that evaluate or predict without training: the config.json keys
        (besides the architecture's) of the fine-tuned model the run uses, e.g. what `inference_config`
        and `tuned_config` saved (multi-label thresholds)."""

    def tuned_config(self) -> dict[str, Any]:
        """Inference settings the last `metrics` call chose on the dev set (e.g. multi-label thresholds);
        the runner saves them into the config.json of the model the final evaluation scored."""
        return {}

    def metric_names(self) -> list[str]:
        """The eval_results keys the evaluation produces, besides eval_loss, loss and global_step."""
        return ["eval_accuracy"]

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:
        raise NotImplementedError

    def feature_length(self, feature) -> int:
        """The number of real tokens (of the longest sequence of a multi-sequence feature)."""
        raise NotImplementedError

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:
        """A batch under the head's argument names: `input_ids`, `attention_mask`, `token_type_ids` and
        the labels (`labels`, or QA's `start_positions` and `end_positions`)."""
        raise NotImplementedError

    def feature_outputs(self, logits: np.ndarray, batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """What to keep of a batch's float32 logits: one array per feature (its logits; NER keeps the
        predicted label ids of its real tokens)."""
        return list(logits)

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:
        """eval_* metrics of the dev set from the kept outputs (in feature order)."""
        raise NotImplementedError

    def write_eval_files(self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list) -> None:
        """Extra evaluation files (NER: the dev predictions)."""

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:
        """Write the test-set prediction files; returns what to report (file names, test metrics)."""
        raise NotImplementedError


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, computed in float64 and returned as float32 (the original prints
    float32 probabilities)."""
    x = np.asarray(logits, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """The logistic function elementwise, computed in float64 and returned as float32."""
    x = np.asarray(logits, dtype=np.float64)
    return (0.5 * (1.0 + np.tanh(0.5 * x))).astype(np.float32)  # = 1 / (1 + exp(-x)), without overflow


def truncate_seq_pair(tokens_a: list[T], tokens_b: list[T], max_length: int) -> None:
    """Truncates a sequence pair in place to `max_length` tokens in all, one token at a time from the end
    of the longer sequence (of B when they are equal), as the original's `_truncate_seq_pair`."""
    # Truncating the longer side makes more sense than an equal share: when one sequence is very short,
    # each of its tokens likely carries more information (the original's comment).
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_length:
            break
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def pad_2d(rows: Sequence[Sequence[int]], length: int | None = None, value: int = 0, dtype=np.int64) -> np.ndarray:
    """Rows of varying length as one [len(rows), length] array, each right-padded with `value`.

    `length` defaults to the longest row; longer rows are an error.
    """
    longest = max((len(r) for r in rows), default=0)
    length = longest if length is None else length
    if longest > length:
        raise ValueError(f"a row has {longest} entries, more than the padded length {length}")
    out = np.full((len(rows), length), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def num_train_steps(num_examples: int, train_batch_size: int, num_train_epochs: float) -> int:
    """`int(num_examples / train_batch_size * num_train_epochs)`, truncated as the original (MRPC: 3668
    examples, batch 32, 3 epochs -> 343)."""
    return int(num_examples / train_batch_size * num_train_epochs)


def num_warmup_steps(num_train_steps: int, warmup_proportion: float) -> int:
    """`int(num_train_steps * warmup_proportion)` (MRPC: 343 steps, 0.1 -> 34)."""
    return int(num_train_steps * warmup_proportion)


def column_spec(value: str | None) -> int | str | None:
    """A column flag: a 0-based number (negative counts from the end) or a header name."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value


def label_list_flag(value: str | None) -> list[str] | None:
    """`--labels=a,b,c` -> ["a", "b", "c"]."""
    if value is None:
        return None
    labels = [x.strip() for x in value.split(",")]
    if not all(labels) or len(set(labels)) != len(labels):
        raise InputError(f"--labels={value!r}: give distinct, non-empty labels separated by commas")
    return labels
