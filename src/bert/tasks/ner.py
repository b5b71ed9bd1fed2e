"""Named-entity recognition data (CoNLL-2003): reading, token-level features and back to word labels.

The original repository has no NER script (users asked for one: google-research/bert issues #223, #345,
#581); this follows the BERT paper's recipe (its section 5.3): each word is split into WordPiece sub-tokens,
the word's label goes on its first sub-token, and the model's prediction there is the word's prediction.
Every other position (later sub-tokens, [CLS], [SEP], padding) has the label id -100, which
`torch.nn.functional.cross_entropy` ignores by default.

Input: `token POS chunk NER` per line, separated by whitespace; a blank line ends a sentence; a
`-DOCSTART-` line separates documents (it is skipped and ends any open sentence).

Sentences longer than `max_seq_length - 2` sub-tokens are split into several windows at word boundaries,
never truncated, so every word gets exactly one prediction; a single word with more sub-tokens than fit
keeps its first ones (its label stays on the first). The windows do not overlap, so a word near a window
edge sees context on one side only.

Output: `token gold pred` lines with a blank line between sentences, the input layout of conlleval
(and of `read_prediction_file` here); `bert.metrics.ner_metrics` scores it as conlleval does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert.errors import InputError
from bert.formats.results import write_results
from bert.metrics import ner_metrics
from bert.tasks.common import FinetuneTask, label_list_flag, model_inputs, pad_2d
from bert.tokenization import printable_text
from bert.utils import atomic_write, iter_lines

if TYPE_CHECKING:
    from bert.commands.ner import NerArgs
    from bert.tokenization import FullTokenizer

logger = logging.getLogger(__name__)

__all__ = [
    "CONLL2003_LABELS",
    "IGNORE_INDEX",
    "NerExample",
    "NerFeatures",
    "convert_ner_examples_to_features",
    "labels_from_examples",
    "ner_features_to_arrays",
    "read_conll",
    "read_prediction_file",
    "word_predictions",
    "write_conll_predictions",
]

#: The nine CoNLL-2003 NER tags (IOB2, as the usual distributions of the data set), in a fixed id order.
CONLL2003_LABELS = ["O", "B-MISC", "I-MISC", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]

#: Label id of positions that are not a word's first sub-token (PyTorch's cross-entropy ignore_index).
IGNORE_INDEX = -100

DOCSTART = "-DOCSTART-"


@dataclass
class NerExample:
    """One sentence.

    Args:
        guid: `"<set>-<sentence index>"`, 0-based.
        words: the tokens of the sentence, as in the file.
        labels: one tag per word (the last column).
    """

    guid: str
    words: list[str]
    labels: list[str]


@dataclass
class NerFeatures:
    """One window of a sentence as model inputs.

    Args:
        input_ids: `[CLS] sub-tokens [SEP]`, zero-padded to `max_seq_length` unless unpadded.
        input_mask: 1 for real tokens, 0 for padding.
        segment_ids: all 0.
        label_ids: the word's label id on each word's first sub-token, `IGNORE_INDEX` everywhere else.
        example_index: index of the sentence in the example list.
        word_index: for each position, the index in the sentence of the word whose first sub-token is
            there, -1 everywhere else (so `label_ids[p] != IGNORE_INDEX` exactly where `word_index[p] >= 0`).
    """

    input_ids: list[int]
    input_mask: list[int]
    segment_ids: list[int]
    label_ids: list[int]
    example_index: int
    word_index: list[int]


# --------------------------------------------------------------------------------------------------
# Reading


def read_conll(
    path: str | os.PathLike,
    set_type: str | None = None,
    num_columns: int | None = 4,
    label_list: Sequence[str] | None = None,
    placeholder: str | None = None,
) -> list[NerExample]:
    """The sentences of a CoNLL file.

    Args:
        path: the file (UTF-8).
        set_type: the set name in guids; default the file name without extension (`train`, `valid`, ...).
        num_columns: columns every token line must have (4 for CoNLL-2003); None for whatever the first
            token line has. The word is the first column, the label the last.
        label_list: when given, a label outside it is an error naming the line.
        placeholder: unlabelled text (a distillation transfer set): every word gets this label, and lines
            may hold the word alone.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file; check --data_dir and the file name")
    set_type = set_type or os.path.splitext(os.path.basename(path))[0]
    allowed = set(label_list) if label_list is not None else None
    examples: list[NerExample] = []
    words: list[str] = []
    labels: list[str] = []

    def end_sentence() -> None:
        if words:
            examples.append(NerExample(guid=f"{set_type}-{len(examples)}", words=list(words), labels=list(labels)))
            words.clear()
            labels.clear()

    for line_no, line in enumerate(iter_lines(path, "utf-8-sig", hint=None), start=1):
        parts = line.split()
        if not parts:
            end_sentence()
            continue
        if parts[0] == DOCSTART:
            end_sentence()
            continue
        if num_columns is None:
            num_columns = len(parts)
        if len(parts) != num_columns or len(parts) < (2 if placeholder is None else 1):
            raise InputError(
                f"{path}:{line_no}: expected {max(num_columns, 2)} whitespace-separated columns "
                f"(token POS chunk NER for CoNLL-2003), found {len(parts)}; fix this line, or leave a blank "
                f"line between sentences"
            )
        if placeholder is None and allowed is not None and parts[-1] not in allowed:
            raise InputError(
                f"{path}:{line_no}: label {parts[-1]!r} is not one of {list(label_list or ())}; fix the label "
                f"or use a label list that has it"
            )
        words.append(parts[0])
        labels.append(parts[-1] if placeholder is None else placeholder)
    end_sentence()
    if not examples:
        raise InputError(f"{path} holds no sentences; expected 'token POS chunk NER' lines (CoNLL-2003 layout)")
    return examples


def labels_from_examples(examples: Sequence[NerExample]) -> list[str]:
    """The labels that occur in `examples`: "O" first (when present), then the others sorted."""
    seen = {label for ex in examples for label in ex.labels}
    return (["O"] if "O" in seen else []) + sorted(seen - {"O"})


# --------------------------------------------------------------------------------------------------
# Features


def _windows(pieces: list[list[str]], budget: int) -> list[list[int]]:
    """Split word indexes into consecutive windows whose sub-tokens fit in `budget` (a word never spans two;
    an over-long word is cut to `budget` sub-tokens by the caller)."""
    windows: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, p in enumerate(pieces):
        n = min(len(p), budget)
        if current and used + n > budget:
            windows.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        windows.append(current)
    return windows


def convert_ner_examples_to_features(
    examples: Sequence[NerExample],
    label_list: Sequence[str],
    max_seq_length: int,
    tokenizer: FullTokenizer,
    pad: bool = True,
) -> list[NerFeatures]:
    """Token-level features, one or more windows per sentence (see the module docstring).

    Args:
        examples: the sentences.
        label_list: the labels in id order (e.g. `CONLL2003_LABELS`).
        max_seq_length: the length of a window with [CLS] and [SEP]; also the padded length when `pad`.
        tokenizer: a `FullTokenizer`; each word is tokenized on its own (a word that gives no sub-token,
            e.g. only control characters, becomes `[UNK]`).
        pad: False for unpadded features (same ids), for batches padded to their longest window.
    """
    if max_seq_length < 3:
        raise InputError(f"--max_seq_length={max_seq_length} leaves no room for a word; use at least 3 (128 is usual)")
    label_map = {label: i for i, label in enumerate(label_list)}
    budget = max_seq_length - 2
    features: list[NerFeatures] = []
    for ex_index, example in enumerate(examples):
        for label in example.labels:
            if label not in label_map:
                raise InputError(
                    f"sentence {example.guid}: label {label!r} is not one of {list(label_list)}; use the label "
                    f"list of this data (labels_from_examples) or of the model"
                )
        pieces = [tokenizer.tokenize(word) or ["[UNK]"] for word in example.words]
        for window in _windows(pieces, budget):
            tokens = ["[CLS]"]
            label_ids = [IGNORE_INDEX]
            word_index = [-1]
            for w in window:
                p = pieces[w][:budget]
                tokens += p
                label_ids += [label_map[example.labels[w]]] + [IGNORE_INDEX] * (len(p) - 1)
                word_index += [w] + [-1] * (len(p) - 1)
            tokens.append("[SEP]")
            label_ids.append(IGNORE_INDEX)
            word_index.append(-1)
            input_ids = tokenizer.convert_tokens_to_ids(tokens)
            input_mask = [1] * len(input_ids)
            if pad:
                n = max_seq_length - len(input_ids)
                input_ids += [0] * n
                input_mask += [0] * n
                label_ids += [IGNORE_INDEX] * n
                word_index += [-1] * n
            if len(features) < 5:
                logger.info("*** Example ***")
                logger.info("guid: %s", example.guid)
                logger.info("tokens: %s", " ".join(printable_text(x) for x in tokens))
                logger.info("input_ids: %s", " ".join(str(x) for x in input_ids))
                logger.info("input_mask: %s", " ".join(str(x) for x in input_mask))
                logger.info("label_ids: %s", " ".join(str(x) for x in label_ids))
            features.append(
                NerFeatures(
                    input_ids=input_ids,
                    input_mask=input_mask,
                    segment_ids=[0] * len(input_ids),
                    label_ids=label_ids,
                    example_index=ex_index,
                    word_index=word_index,
                )
            )
    return features


def ner_features_to_arrays(features: Sequence[NerFeatures], pad_to: int | None = None) -> dict[str, np.ndarray]:
    """A batch as int64 NumPy arrays [B, S], padded to `pad_to` or the longest feature: `input_ids`,
    `input_mask`, `segment_ids` (padded with 0) and `label_ids` (padded with `IGNORE_INDEX`)."""
    return {
        "input_ids": pad_2d([f.input_ids for f in features], pad_to),
        "input_mask": pad_2d([f.input_mask for f in features], pad_to),
        "segment_ids": pad_2d([f.segment_ids for f in features], pad_to),
        "label_ids": pad_2d([f.label_ids for f in features], pad_to, value=IGNORE_INDEX),
    }


# --------------------------------------------------------------------------------------------------
# Predictions


def word_predictions(
    examples: Sequence[NerExample],
    features: Sequence[NerFeatures],
    predictions: Any,
    label_list: Sequence[str],
) -> list[list[str]]:
    """Word-level predicted labels from token-level model output (each word's first sub-token).

    Args:
        examples: the sentences the features were made from.
        features: the features, in the order of `predictions`.
        predictions: logits [F, S, num_labels] or predicted label ids [F, S] (S at least each feature's
            length; NumPy, nested lists or a CPU tensor).
        label_list: the labels in id order.

    Returns one list of labels per example, one label per word. A word no feature covers (none does when
    the features come from `convert_ner_examples_to_features` on the same examples) gets "O".
    """
    preds = np.asarray(predictions)
    if preds.ndim == 3:
        preds = preds.argmax(axis=-1)
    if preds.ndim != 2 or preds.shape[0] != len(features):
        raise ValueError(f"predictions must be [num_features={len(features)}, S(, num_labels)], got {preds.shape}")
    out: list[list[str | None]] = [[None] * len(ex.words) for ex in examples]
    for f, row in zip(features, preds):
        for p, w in enumerate(f.word_index):
            if w >= 0:
                out[f.example_index][w] = label_list[int(row[p])]
    missing = sum(label is None for sent in out for label in sent)
    if missing:
        logger.warning("%d words have no prediction; labelled 'O'", missing)
    return [[label if label is not None else "O" for label in sent] for sent in out]


def write_conll_predictions(
    path: str | os.PathLike, examples: Sequence[NerExample], predictions: Sequence[Sequence[str]]
) -> None:
    """Write `token gold pred` lines, a blank line after each sentence (conlleval's input layout)."""
    if len(predictions) != len(examples):
        raise ValueError(f"{len(predictions)} predicted sentences for {len(examples)} examples")
    with atomic_write(path) as f:
        for ex, pred in zip(examples, predictions):
            if len(pred) != len(ex.words):
                raise ValueError(f"sentence {ex.guid}: {len(pred)} predictions for {len(ex.words)} words")
            for word, gold, p in zip(ex.words, ex.labels, pred):
                f.write(f"{word} {gold} {p}\n")
            f.write("\n")


def read_prediction_file(path: str | os.PathLike) -> tuple[list[list[str]], list[list[str]]]:
    """(gold sentences, predicted sentences) from a `token ... gold pred` file (the last two columns), as
    conlleval reads it; ready for `bert.metrics.ner_metrics(gold, pred)`."""
    gold: list[list[str]] = []
    pred: list[list[str]] = []
    g: list[str] = []
    p: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            parts = line.split()
            if not parts or parts[0] == DOCSTART:
                if g:
                    gold.append(g)
                    pred.append(p)
                    g, p = [], []
                continue
            if len(parts) < 3:
                raise InputError(f"{os.fspath(path)}:{line_no}: expected 'token gold pred', found {len(parts)} columns")
            g.append(parts[-2])
            p.append(parts[-1])
    if g:
        gold.append(g)
        pred.append(p)
    return gold, pred


# --------------------------------------------------------------------------------------------------
# The fine-tuning task

_METRICS = ("precision", "recall", "f1", "accuracy")


class NerTask(FinetuneTask):
    """Token classification of CoNLL files (`bert ner`).

    Args:
        args: the flags of `bert ner` (`data_dir`, `labels`, `train_file`, `dev_file`, `test_file`).
    """

    command = "ner"
    head = "BertForTokenClassification"
    default_metric = "eval_f1"

    def __init__(self, args: NerArgs):
        self.args = args
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

    def read_unlabelled(self, path: str) -> list:
        # The first label stands in for the teacher's: the features need one on each word's first piece.
        return read_conll(path, set_type="transfer", num_columns=None, placeholder=self.label_list[0])

    def labels(self) -> list | None:
        return self.label_list

    def model_kwargs(self) -> dict[str, Any]:
        return {"num_labels": len(self.label_list)}

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:
        return convert_ner_examples_to_features(examples, self.label_list, max_seq_length, tokenizer, pad=pad)

    def feature_length(self, feature) -> int:
        return int(sum(feature.input_mask))

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:
        a = model_inputs(ner_features_to_arrays(features, pad_to))
        a["labels"] = a.pop("label_ids")
        return a

    def feature_outputs(self, logits: np.ndarray, batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        ids = logits.argmax(-1)  # [B, T]
        lengths = batch["attention_mask"].sum(-1).tolist()
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
