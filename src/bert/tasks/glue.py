"""Sentence and sentence-pair classification data: run_classifier.py's processors and feature conversion.

What run_classifier.py has, with the same files, columns, labels and guids: `ColaProcessor`,
`MnliProcessor`, `MrpcProcessor`, `XnliProcessor` (its language is a constructor argument here instead of
the hard-coded "zh"). What it lacks and users asked for (google-research/bert issues #24, #151, #195, #548),
with the layouts of the GLUE download script: SST-2, STS-B (regression: float labels), QQP, QNLI, RTE, WNLI,
MNLI mismatched, and `GenericProcessor` for one's own TSV, CSV or JSON-lines files.

Reading follows the original's `_read_tsv`: tab separated with quoting disabled, so a `"` is text (MRPC and
MNLI have lines a quote-aware reader would merge). Files are read as UTF-8; a byte-order mark (MRPC has one)
is dropped. The original kept it in the first cell of the header line, which it skips, so nothing changes.
Blank lines are skipped (the original fails on them). Test sets carry a placeholder label (the first label,
as the original's "0" and "contradiction"), so their features convert like the others.

Bad input raises `InputError` naming the file, the line and the fix: a missing file, an empty file, a
row with too few columns, a label outside the label list, a test file without its header line.

`convert_single_example` is the original's, line for line: [CLS] A [SEP] B [SEP], the pair truncated by
popping the last token of the longer side, segment ids 0 then 1, zero padding to `max_seq_length`, the
first five examples logged field by field. `convert_examples_to_features(..., pad=False)` gives the same
ids without the padding, for batches padded to their own longest sequence.

Not in the original: long documents read whole in windows of `max_seq_length` (`window_spans`,
`convert_examples_to_windows`) whose logits are pooled per example (`pool_windows`), and multi-label
examples (`GenericProcessor(multi_label=True)`: a label set per example, a 0/1 row as its label id).
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert.errors import InputError
from bert.formats.results import write_test_results
from bert.metrics import (
    accuracy,
    best_f1_threshold,
    glue_metrics,
    multi_label_metrics,
    pearson,
    per_label_scores,
    spearman,
)
from bert.tasks.common import (
    FinetuneTask,
    column_spec,
    label_list_flag,
    model_inputs,
    pad_2d,
    sigmoid,
    softmax,
    truncate_seq_pair,
)
from bert.tasks.squad import DocSpan, doc_spans_for
from bert.tokenization import printable_text
from bert.utils import atomic_write, finite_number, iter_lines, parse_json_line

if TYPE_CHECKING:
    from bert.tokenization import FullTokenizer

logger = logging.getLogger(__name__)

__all__ = [
    "ALIASES",
    "TASKS",
    "ClassificationTask",
    "get_processor",
    "ColaProcessor",
    "DataProcessor",
    "GenericProcessor",
    "InputExample",
    "InputFeatures",
    "MnliMismatchedProcessor",
    "MnliProcessor",
    "MrpcProcessor",
    "PaddingInputExample",
    "QnliProcessor",
    "QqpProcessor",
    "RteProcessor",
    "Sst2Processor",
    "StsbProcessor",
    "WnliProcessor",
    "XnliProcessor",
    "WINDOW_POOLINGS",
    "convert_examples_to_features",
    "convert_examples_to_windows",
    "convert_single_example",
    "features_to_arrays",
    "is_regression_labels",
    "pool_windows",
    "read_rows",
    "window_spans",
]


# --------------------------------------------------------------------------------------------------
# Data structures (run_classifier.py, `InputExample`, `PaddingInputExample`, `InputFeatures`)


@dataclass
class InputExample:
    """A single training/test example for simple sequence classification.

    Args:
        guid: unique id for the example, `"<set>-<line index>"` or `"<set>-<id column>"`.
        text_a: the untokenized text of the first sequence.
        text_b: the untokenized text of the second sequence; None for single-sequence tasks.
        label: the label string (a float for regression; for multi-label the list of its labels); a placeholder
            for test examples.
    """

    guid: str
    text_a: str
    text_b: str | None = None
    label: str | float | None = None


class PaddingInputExample:
    """A fake example that pads an eval/predict set to a multiple of the batch size (the original's TPU
    device). It converts to all-zero features with `label_id` 0 and `is_real_example=False`."""


@dataclass
class InputFeatures:
    """One example as model inputs.

    Args:
        input_ids: token ids, `[CLS] A [SEP] (B [SEP])`, zero-padded to `max_seq_length` unless unpadded.
        input_mask: 1 for real tokens, 0 for padding.
        segment_ids: 0 for `[CLS]`, A and the first `[SEP]`; 1 for B and its `[SEP]`; 0 for padding.
        label_id: the label's index in the label list (the float label for regression; for multi-label a
            0/1 row over the label list).
        is_real_example: False only for `PaddingInputExample`s.
        example_index: for a window of a long document (`convert_examples_to_windows`), the index of
            its example; None for the one feature of an example (`convert_examples_to_features`).
    """

    input_ids: list[int]
    input_mask: list[int]
    segment_ids: list[int]
    label_id: int | float | list[int]
    is_real_example: bool = True
    example_index: int | None = None


# --------------------------------------------------------------------------------------------------
# Reading delimited files


def read_rows(
    path: str | os.PathLike, delimiter: str = "\t", quotechar: str | None = None
) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) for every record of a delimited file, blank lines included (as `[]`).

    With `quotechar=None` quoting is off (the original's `_read_tsv`); otherwise standard CSV quoting.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file; check --data_dir and the file name")
    quoting = csv.QUOTE_NONE if quotechar is None else csv.QUOTE_MINIMAL
    # Decoded by `iter_lines`, which names the line of an undecodable byte (a text-mode file decodes 8 KB
    # ahead of the line being parsed, so its errors cannot say where they are).
    lines = (line + "\n" for line in iter_lines(path, "utf-8-sig", hint=None))
    reader = csv.reader(lines, delimiter=delimiter, quotechar=quotechar, quoting=quoting)
    line_num = 0
    try:
        for row in reader:
            # line_num counts physical lines read so far; a quoted CSV record may span several.
            start = line_num + 1
            line_num = reader.line_num
            yield start, row
    except csv.Error as e:
        raise InputError(f"{path}:{line_num + 1}: {e}; fix this line") from e


def _require_rows(path: str | os.PathLike, rows: list[tuple[int, list[str]]], what: str) -> None:
    if not any(row for _, row in rows):
        raise InputError(f"{os.fspath(path)} is empty; it should hold {what}")


def _columns_error(path: str | os.PathLike, line: int, row: list[str], needed: int, sep: str = "tab") -> InputError:
    return InputError(
        f"{os.fspath(path)}:{line}: expected at least {needed} {sep}-separated columns, found {len(row)}; "
        f"fix or remove this line (quotes are plain text in .tsv files, so a stray tab or line break splits a field)"
    )


def _label_error(path: str | os.PathLike, line: int, label: Any, labels: Sequence[Any], where: str) -> InputError:
    return InputError(
        f"{os.fspath(path)}:{line}: label {label!r} ({where}) is not one of {list(labels)}; "
        f"fix the label, or use the --task_name (or label list) that matches this file"
    )


def _float_label(path: str | os.PathLike, line: int, text: str, where: str) -> float:
    return finite_number(text, f"{os.fspath(path)}:{line}", "label", f" ({where})")


# --------------------------------------------------------------------------------------------------
# Processors (run_classifier.py, `DataProcessor` and its subclasses)


class DataProcessor:
    """Base class for data converters for sequence classification data sets."""

    #: True when labels are real numbers (STS-B); `get_labels()` is then `[None]`.
    is_regression: bool = False

    def get_train_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """Gets a collection of `InputExample`s for the train set."""
        raise NotImplementedError()

    def get_dev_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """Gets a collection of `InputExample`s for the dev set."""
        raise NotImplementedError()

    def get_test_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """Gets a collection of `InputExample`s for prediction."""
        raise NotImplementedError()

    def get_labels(self) -> list[Any]:
        """Gets the list of labels for this data set."""
        raise NotImplementedError()

    def get_unlabelled_examples(self, path: str | os.PathLike) -> list[InputExample]:
        """The examples of a file in the test set's format (texts only, each with the placeholder label): a
        distillation transfer set, which the teacher labels."""
        raise NotImplementedError()

    @classmethod
    def _read_tsv(cls, input_file: str | os.PathLike, quotechar: str | None = None) -> list[list[str]]:
        """Reads a tab separated value file (quoting off unless `quotechar` is given), as the original."""
        return [row for _, row in read_rows(input_file, "\t", quotechar)]


class _TsvProcessor(DataProcessor):
    """A GLUE task described by its files and columns; the subclasses only set the class attributes.

    Train and dev rows give `text_a`, `text_b` and the label from the columns below; test rows give the
    texts from the `test_*` columns and get the placeholder label. Guids are `"<set>-<line index>"`
    (0-based, header included) or, with `guid_column`, `"<set>-<that column>"`.
    """

    name: str = ""
    labels: tuple[Any, ...] = ()
    train_file = "train.tsv"
    dev_file = "dev.tsv"
    test_file = "test.tsv"
    dev_set = "dev"  # the set name in dev guids (MNLI: "dev_matched")
    has_header = True  # train and dev (test files always have one)
    test_header: tuple[str, ...] = ("index",)  # the expected test header; its first cell is checked
    text_a_column = 0
    text_b_column: int | None = None
    label_column = -1
    min_columns = 0  # train/dev rows must have at least this many columns (MNLI: 11)
    test_text_a_column = 1
    test_text_b_column: int | None = None
    guid_column: int | None = None

    def get_train_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        return self._create_examples(os.path.join(data_dir, self.train_file), "train")

    def get_dev_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        return self._create_examples(os.path.join(data_dir, self.dev_file), self.dev_set)

    def get_test_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        return self._create_examples(os.path.join(data_dir, self.test_file), "test")

    def get_unlabelled_examples(self, path: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        return self._create_examples(str(path), "test")

    def get_labels(self) -> list[Any]:
        """See base class."""
        return list(self.labels)

    def _placeholder_label(self) -> Any:
        return 0.0 if self.is_regression else self.labels[0]

    def _create_examples(self, path: str, set_type: str) -> list[InputExample]:
        is_test = set_type == "test"
        rows = list(read_rows(path))
        what = f"the {set_type} examples of {self.name}"
        _require_rows(path, rows, what)
        if is_test:
            cols = [self.test_text_a_column, self.test_text_b_column]
            self._check_test_header(path, rows[0][1])
        else:
            cols = [self.text_a_column, self.text_b_column, self.label_column]
        needed = max(self.min_columns if not is_test else 0, *(c + 1 if c >= 0 else -c for c in cols if c is not None))
        if self.guid_column is not None:
            needed = max(needed, self.guid_column + 1)
        skip_header = is_test or self.has_header
        examples = []
        for line, row in rows:
            i = line - 1  # each record is one line: quoting is off
            if (skip_header and i == 0) or not row:
                continue
            if len(row) < needed:
                raise _columns_error(path, line, row, needed)
            guid = f"{set_type}-{row[self.guid_column] if self.guid_column is not None else i}"
            if is_test:
                text_a = row[self.test_text_a_column]
                text_b = row[self.test_text_b_column] if self.test_text_b_column is not None else None
                label = self._placeholder_label()
            else:
                text_a = row[self.text_a_column]
                text_b = row[self.text_b_column] if self.text_b_column is not None else None
                label = row[self.label_column]
                where = f"column {self.label_column % len(row) + 1}"
                if self.is_regression:
                    label = _float_label(path, line, label, where)
                elif label not in self.labels:
                    raise _label_error(path, line, label, self.labels, where)
            examples.append(InputExample(guid=guid, text_a=text_a, text_b=text_b, label=label))
        if not examples:
            has = "a header line but no examples" if skip_header else "no examples"
            raise InputError(f"{path} has {has}; it should hold {what}")
        return examples

    def _check_test_header(self, path: str, first_row: list[str]) -> None:
        if not first_row or first_row[0] != self.test_header[0]:
            expected = ", ".join(self.test_header)
            raise InputError(
                f"{path}:1: expected the header line of the {self.name} test set (columns {expected}), found "
                f"{chr(9).join(first_row)[:80]!r}; the first line of a test file is skipped as its header, as "
                f"in the original, so add the header line (or check that this is the test file)"
            )


class ColaProcessor(_TsvProcessor):
    """Processor for the CoLA data set (GLUE version): train/dev have no header, test has one."""

    name = "CoLA"
    labels = ("0", "1")
    has_header = False  # only the test set has a header
    test_header = ("index", "sentence")
    text_a_column = 3
    label_column = 1


class MnliProcessor(_TsvProcessor):
    """Processor for the MultiNLI data set (GLUE version), matched dev and test sets."""

    name = "MNLI"
    labels = ("contradiction", "entailment", "neutral")
    dev_file = "dev_matched.tsv"
    test_file = "test_matched.tsv"
    dev_set = "dev_matched"
    test_header = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse")
    text_a_column = 8
    text_b_column = 9
    label_column = -1  # gold_label: the last column
    min_columns = 11  # ..., sentence1, sentence2, label1, ..., gold_label
    test_text_a_column = 8
    test_text_b_column = 9
    guid_column = 0


class MnliMismatchedProcessor(MnliProcessor):
    """MultiNLI with the mismatched dev and test sets (not in the original)."""

    name = "MNLI-mm"
    dev_file = "dev_mismatched.tsv"
    test_file = "test_mismatched.tsv"
    dev_set = "dev_mismatched"


class MrpcProcessor(_TsvProcessor):
    """Processor for the MRPC data set (GLUE version)."""

    name = "MRPC"
    labels = ("0", "1")
    test_header = ("index", "#1 ID", "#2 ID", "#1 String", "#2 String")
    text_a_column = 3
    text_b_column = 4
    label_column = 0
    test_text_a_column = 3
    test_text_b_column = 4


class Sst2Processor(_TsvProcessor):
    """Processor for the SST-2 data set (GLUE version): `sentence<TAB>label`; test `index<TAB>sentence`."""

    name = "SST-2"
    labels = ("0", "1")
    test_header = ("index", "sentence")
    text_a_column = 0
    label_column = 1


class StsbProcessor(_TsvProcessor):
    """Processor for the STS-B data set (GLUE version): a regression task with scores 0..5 as float labels."""

    name = "STS-B"
    is_regression = True
    labels = (None,)
    test_header = ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2")
    text_a_column = 7
    text_b_column = 8
    label_column = 9
    test_text_a_column = 7
    test_text_b_column = 8
    guid_column = 0


class QqpProcessor(_TsvProcessor):
    """Processor for the QQP data set (GLUE version): `id qid1 qid2 question1 question2 is_duplicate`."""

    name = "QQP"
    labels = ("0", "1")
    test_header = ("id", "question1", "question2")
    text_a_column = 3
    text_b_column = 4
    label_column = 5
    test_text_a_column = 1
    test_text_b_column = 2
    guid_column = 0


class QnliProcessor(_TsvProcessor):
    """Processor for the QNLI data set (GLUE version): `index question sentence label`."""

    name = "QNLI"
    labels = ("entailment", "not_entailment")
    test_header = ("index", "question", "sentence")
    text_a_column = 1
    text_b_column = 2
    label_column = 3
    test_text_a_column = 1
    test_text_b_column = 2
    guid_column = 0


class RteProcessor(QnliProcessor):
    """Processor for the RTE data set (GLUE version): `index sentence1 sentence2 label`."""

    name = "RTE"
    test_header = ("index", "sentence1", "sentence2")


class WnliProcessor(RteProcessor):
    """Processor for the WNLI data set (GLUE version): as RTE, with labels 0/1."""

    name = "WNLI"
    labels = ("0", "1")


class XnliProcessor(DataProcessor):
    """Processor for the XNLI data set, as the original but with the language as an argument.

    Train: `<data_dir>/multinli/multinli.train.<language>.tsv` (XNLI-MT: premise, hypo, label; the label
    `contradictory` is read as `contradiction`). Dev: `<data_dir>/xnli.dev.tsv` (XNLI-1.0: 0 language,
    1 gold_label, 6 sentence1, 7 sentence2), only the rows of `language`. Test (not in the original, which
    raises NotImplementedError): `<data_dir>/xnli.test.tsv`, the dev layout, with its gold labels.

    Args:
        language: the XNLI language code; the original hard-codes "zh".
    """

    labels = ("contradiction", "entailment", "neutral")

    def __init__(self, language: str = "zh") -> None:
        self.language = language

    def get_train_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        path = os.path.join(data_dir, "multinli", f"multinli.train.{self.language}.tsv")
        rows = list(read_rows(path))
        _require_rows(path, rows, f"the XNLI training examples in {self.language!r}")
        examples = []
        for line, row in rows:
            i = line - 1
            if i == 0 or not row:
                continue
            if len(row) < 3:
                raise _columns_error(path, line, row, 3)
            label = "contradiction" if row[2] == "contradictory" else row[2]
            if label not in self.labels:
                raise _label_error(path, line, row[2], self.labels, "column 3")
            examples.append(InputExample(guid=f"train-{i}", text_a=row[0], text_b=row[1], label=label))
        return examples

    def get_dev_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        return self._create_xnli_examples(os.path.join(data_dir, "xnli.dev.tsv"), "dev")

    def get_test_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        return self._create_xnli_examples(os.path.join(data_dir, "xnli.test.tsv"), "test")

    def get_unlabelled_examples(self, path: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        return self._create_xnli_examples(str(path), "test")

    def get_labels(self) -> list[Any]:
        """See base class."""
        return list(self.labels)

    def _create_xnli_examples(self, path: str, set_type: str) -> list[InputExample]:
        rows = list(read_rows(path))
        _require_rows(path, rows, f"the XNLI {set_type} examples")
        examples = []
        for line, row in rows:
            i = line - 1
            if i == 0 or not row:
                continue
            if len(row) < 8:
                raise _columns_error(path, line, row, 8)
            if row[0] != self.language:
                continue
            if row[1] not in self.labels:
                raise _label_error(path, line, row[1], self.labels, "column 2")
            examples.append(InputExample(guid=f"{set_type}-{i}", text_a=row[6], text_b=row[7], label=row[1]))
        if not examples:
            raise InputError(
                f"{path} has no rows for language {self.language!r} (column 1); pass one of the languages "
                f"the file has, e.g. XnliProcessor(language='zh')"
            )
        return examples


class GenericProcessor(DataProcessor):
    """Classification (or regression) data from one's own files: TSV, CSV or JSON lines.

    The format follows each file's extension: `.tsv` and `.txt` are tab separated with quoting off (as
    GLUE), `.csv` is comma separated with standard CSV quoting, `.jsonl`/`.ndjson`/`.json` hold one JSON
    object per line. Columns are 0-based indexes (negative counts from the end) or, for files with a header
    line and for JSON lines, names. Test files are read with the same columns; their labels are ignored
    (they may be absent) and replaced by the placeholder first label.

    Without `label_list` the labels are read from the training file: in sorted (string) order by
    default, so a label keeps its id whatever the row order; or in order of first appearance with
    `label_order="first-seen"`. Guids are `"<set>-<line number>"` (1-based).

    Multi-label data (`multi_label=True`): the label cell holds a set of labels separated by
    `label_separator` ("," by default: `a,b` in a .tsv, `"a,b"` in a .csv, where any CSV writer quotes a
    cell holding commas; a JSON list or a separated string in JSON lines). Labels are stripped of
    surrounding spaces, repeats are dropped, and the example's `label` is the list of its labels in
    label-list order. The label list is the union of the training file's labels (sorted, or first-seen).
    An empty label cell is an error unless `allow_empty_labels` (an example none of the labels applies
    to; an empty cell is more often a shifted column than that, and all-negative examples silently
    teach the model to predict nothing). Test examples get the empty set as placeholder.

    Args:
        text_a_column: column of the first text.
        label_column: column of the label.
        text_b_column: column of the second text, or None for single sentences.
        has_header: whether TSV/CSV files start with a header line (skipped; gives the column names).
        label_list: the labels, in id order; None to read them from the training file.
        label_order: "sorted" or "first-seen", when the labels are read from the training file.
        is_regression: float labels (like STS-B); `get_labels()` is then `[None]`.
        train_file, dev_file, test_file: file names inside `data_dir` (or absolute paths).
        multi_label: each label cell holds a set of labels (see above).
        label_separator: what separates the labels of a multi-label cell.
        allow_empty_labels: multi-label examples may have no label at all.
    """

    def __init__(
        self,
        text_a_column: int | str = 0,
        label_column: int | str = -1,
        text_b_column: int | str | None = None,
        *,
        has_header: bool = False,
        label_list: Sequence[str] | None = None,
        label_order: str = "sorted",
        is_regression: bool = False,
        train_file: str = "train.tsv",
        dev_file: str = "dev.tsv",
        test_file: str = "test.tsv",
        multi_label: bool = False,
        label_separator: str = ",",
        allow_empty_labels: bool = False,
    ) -> None:
        if label_order not in ("sorted", "first-seen"):
            raise InputError(f"label_order={label_order!r}: use 'sorted' or 'first-seen'")
        if multi_label and is_regression:
            raise InputError("a task is either multi-label or regression: drop --multi_label or --is_regression")
        if multi_label and not label_separator:
            raise InputError("--label_separator is empty; give the string that separates labels in a cell, e.g. ','")
        self.text_a_column = text_a_column
        self.text_b_column = text_b_column
        self.label_column = label_column
        self.has_header = has_header
        self.label_list = [str(x) for x in label_list] if label_list is not None else None
        self.label_order = label_order
        self.is_regression = is_regression
        self.multi_label = multi_label
        self.label_separator = label_separator
        self.allow_empty_labels = allow_empty_labels
        self.train_file, self.dev_file, self.test_file = train_file, dev_file, test_file
        self._data_dir: str | os.PathLike | None = None
        self._labels_from_data: list[str] | None = None

    def get_train_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        self._data_dir = data_dir
        return self._examples(os.path.join(data_dir, self.train_file), "train")

    def get_dev_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        self._data_dir = data_dir
        return self._examples(os.path.join(data_dir, self.dev_file), "dev")

    def get_test_examples(self, data_dir: str | os.PathLike) -> list[InputExample]:
        """See base class."""
        self._data_dir = data_dir
        return self._examples(os.path.join(data_dir, self.test_file), "test")

    def get_unlabelled_examples(self, path: str | os.PathLike) -> list[InputExample]:
        """See base class (the label cells of the test file's layout are read as the test file's are)."""
        return self._examples(str(path), "test")

    def get_labels(self) -> list[Any]:
        """The given label list, or the labels of the training file of the last `data_dir` read."""
        if self.is_regression:
            return [None]
        if self.label_list is not None:
            return list(self.label_list)
        if self._labels_from_data is None:
            if self._data_dir is None:
                raise InputError(
                    "the label list is unknown: pass label_list, or read examples from a data_dir first "
                    "(the labels are then read from its training file)"
                )
            path = os.path.join(self._data_dir, self.train_file)
            self._labels_from_data = self._label_list_of(self._records(path, "train"))
        return list(self._labels_from_data)

    def _label_list_of(self, records: Iterable[tuple[int, str, tuple]]) -> list[str]:
        """The labels of training records, sorted or first-seen (multi-label: the union of the sets)."""
        seen: dict[str, None] = {}
        for _, _, (_, _, label) in records:
            for name in self._split_labels(label) if self.multi_label else [label]:
                seen.setdefault(name, None)
        return sorted(seen) if self.label_order == "sorted" else list(seen)

    def _split_labels(self, cell: str | list | None) -> list[str]:
        """A multi-label cell (a separated string, or a JSON list) -> its distinct labels, in cell order."""
        if cell is None:
            return []
        names = cell if isinstance(cell, list) else cell.split(self.label_separator)
        names = (x if isinstance(x, str) else json.dumps(x) for x in names if x is not None)
        return list(dict.fromkeys(x.strip() for x in names if x.strip()))

    # --- reading ---------------------------------------------------------------------------------

    def _format(self, path: str) -> str:
        ext = os.path.splitext(path)[1].lower()
        if ext in (".tsv", ".txt"):
            return "tsv"
        if ext == ".csv":
            return "csv"
        if ext in (".jsonl", ".ndjson", ".json"):
            return "jsonl"
        raise InputError(f"{path}: unknown file type {ext!r}; use .tsv, .csv or .jsonl (JSON lines)")

    def _records(self, path: str, set_type: str) -> Iterator[tuple[int, str, tuple[str, str | None, Any]]]:
        """(line, guid, (text_a, text_b, label or None)) per record; label None only for test records."""
        fmt = self._format(path)
        want_label = set_type != "test"
        cols = [self.text_a_column, self.text_b_column, self.label_column if want_label else None]
        if fmt == "jsonl":
            yield from self._json_records(path, set_type, cols)
            return
        delimiter, quotechar, sep = ("\t", None, "tab") if fmt == "tsv" else (",", '"', "comma")
        rows = list(read_rows(path, delimiter, quotechar))
        _require_rows(path, rows, f"the {set_type} examples")
        index: list[int | None] = [None, None, None]
        first: tuple[int, int] | None = None  # (line, number of columns) of the first record
        count = 0
        for line, row in rows:
            if not row:
                continue
            if first is None:
                first = (line, len(row))
                header = row if self.has_header else None
                index = [self._column_index(c, header, path) for c in cols]
                if header is not None:
                    continue
            needed = max((i + 1 if i >= 0 else -i) for i in index if i is not None)
            if len(row) < needed:
                raise _columns_error(path, line, row, needed, sep)
            if len(row) != first[1] and any(i is not None and i < 0 for i in index):
                # A column counted from the end moves when a row has fewer columns: a text would become a label.
                raise InputError(
                    f"{path}:{line}: {len(row)} {sep}-separated columns, but line {first[0]} has {first[1]}; "
                    "every line needs the same columns (a column counted from the end, such as the default label "
                    "column -1, would take another field here): fix or remove this line"
                )
            a, b, lab = (row[i] if i is not None else None for i in index)
            count += 1
            yield line, f"{set_type}-{line}", (a, b, lab)
        if not count:
            raise InputError(f"{path} has a header line but no examples; add the {set_type} examples")

    def _column_index(self, column: int | str | None, header: list[str] | None, path: str) -> int | None:
        if column is None or isinstance(column, int):
            return column
        if header is None:
            raise InputError(
                f"{path}: column {column!r} is a name but the file has no header line; give the column as a "
                f"0-based number, or set has_header=True"
            )
        if column not in header:
            raise InputError(f"{path}:1: the header has no column {column!r} (it has {header}); fix the column name")
        return header.index(column)

    def _json_records(self, path: str, set_type: str, cols: list[Any]) -> Iterator[tuple[int, str, tuple]]:
        if not os.path.isfile(path):
            raise InputError(f"{path}: no such file; check --data_dir and the file name")
        count = 0
        lines = list(iter_lines(path, "utf-8-sig", hint=None))
        if not any(s.strip() for s in lines):
            raise InputError(f"{path} is empty; it should hold the {set_type} examples, one JSON object per line")
        for line, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            try:
                record = parse_json_line(text)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{line}: not a JSON object ({e.msg}); write one JSON object per line") from e
            except InputError as e:
                raise InputError(f"{path}:{line}: {e}") from None
            if not isinstance(record, dict):
                raise InputError(f"{path}:{line}: expected a JSON object per line, found {type(record).__name__}")
            values = []
            for c in cols:
                if c is None:
                    values.append(None)
                    continue
                if c not in record:
                    raise InputError(
                        f"{path}:{line}: the object has no key {c!r} (it has {sorted(record)}); add it or fix "
                        f"the column name"
                    )
                value = record[c]
                # Non-string labels (0, 1, true) become their JSON text; a null text is no text; a list is a
                # multi-label set.
                keep = isinstance(value, str) or value is None or (self.multi_label and isinstance(value, list))
                values.append(value if keep else json.dumps(value))
            count += 1
            yield line, f"{set_type}-{line}", tuple(values)

    def _examples(self, path: str, set_type: str) -> list[InputExample]:
        records = list(self._records(path, set_type))
        where = f"column {self.label_column!r}"
        if set_type == "train" and self.label_list is None and not self.is_regression:
            # The label list is made of these labels.
            self._labels_from_data = self._label_list_of(records)
        labels = None if self.is_regression else self.get_labels()
        examples = []
        for line, guid, (a, b, label) in records:
            if self.multi_label:
                label = [] if set_type == "test" else self._label_set(path, line, label, labels, where, set_type)
            elif set_type == "test":
                label = 0.0 if labels is None else labels[0]
            elif labels is None:
                label = _float_label(path, line, label, where)
            elif label not in labels:
                raise _label_error(path, line, label, labels, where)
            examples.append(InputExample(guid=guid, text_a=a, text_b=b, label=label))
        return examples

    def _label_set(self, path: str, line: int, cell: Any, labels: list[str], where: str, set_type: str) -> list[str]:
        names = self._split_labels(cell)
        if not names and not self.allow_empty_labels:
            raise InputError(
                f"{path}:{line}: no label ({where}); a multi-label {set_type} example needs at least one label, "
                f"separated by {self.label_separator!r} (or pass --allow_empty_labels if no label may apply)"
            )
        order = {name: i for i, name in enumerate(labels)}
        for name in names:
            if name not in order:
                raise _label_error(path, line, name, labels, where)
        return sorted(names, key=order.__getitem__)


# --------------------------------------------------------------------------------------------------
# Feature conversion (run_classifier.py, `convert_single_example`, `convert_examples_to_features`)


def is_regression_labels(label_list: Sequence[Any] | None) -> bool:
    """True for a regression task's label list: None or `[None]` (STS-B)."""
    return label_list is None or list(label_list) == [None]


def _label_id(example: InputExample, label_list: Sequence[Any] | None) -> int | float | list[int]:
    if is_regression_labels(label_list):
        if example.label is None:
            raise InputError(f"example {example.guid}: no label; a regression example needs a numeric label")
        return float(example.label)
    label_map = {label: i for i, label in enumerate(label_list)}
    # A multi-label example's label is a list of labels: its id is the 0/1 row over the label list.
    names = example.label if isinstance(example.label, list) else [example.label]
    for name in names:
        if name not in label_map:
            raise InputError(
                f"example {example.guid}: label {name!r} is not one of {list(label_list)}; use the label "
                f"list of this task (or of the model being evaluated)"
            )
    if isinstance(example.label, list):
        return [int(label in names) for label in label_list]
    return label_map[example.label]


def _check_max_seq_length(max_seq_length: int, pair: bool) -> None:
    least = 3 if pair else 2
    if max_seq_length < least:
        raise InputError(
            f"--max_seq_length={max_seq_length} leaves no room for text: [CLS] and [SEP] need {least} positions; "
            f"use a larger --max_seq_length (128 is the default)"
        )


def _assemble(
    tokens_a: list[str], tokens_b: list[str] | None, tokenizer: FullTokenizer, max_seq_length: int, pad: bool
) -> tuple[list[str], list[int], list[int], list[int]]:
    """(tokens, input_ids, input_mask, segment_ids) of `[CLS] A [SEP] (B [SEP])`, zero-padded when `pad`."""
    # The convention in BERT is:
    # (a) For sequence pairs:
    #  tokens:   [CLS] is this jack ##son ##ville ? [SEP] no it is not . [SEP]
    #  type_ids: 0     0  0    0    0     0       0 0     1  1  1  1   1 1
    # (b) For single sequences:
    #  tokens:   [CLS] the dog is hairy . [SEP]
    #  type_ids: 0     0   0   0  0     0 0
    tokens = ["[CLS]", *tokens_a, "[SEP]"]
    segment_ids = [0] * len(tokens)
    if tokens_b:
        tokens += [*tokens_b, "[SEP]"]
        segment_ids += [1] * (len(tokens_b) + 1)

    input_ids = tokenizer.convert_tokens_to_ids(tokens)
    input_mask = [1] * len(input_ids)  # 1 for real tokens: only those are attended to
    if pad:
        padding = [0] * (max_seq_length - len(input_ids))
        input_ids += padding
        input_mask += padding
        segment_ids += padding
        assert len(input_ids) == len(input_mask) == len(segment_ids) == max_seq_length
    return tokens, input_ids, input_mask, segment_ids


def _log_feature(example: InputExample, tokens: list[str], feature: InputFeatures) -> None:
    logger.info("*** Example ***")
    logger.info("guid: %s", example.guid)
    logger.info("tokens: %s", " ".join(printable_text(x) for x in tokens))
    logger.info("input_ids: %s", " ".join(str(x) for x in feature.input_ids))
    logger.info("input_mask: %s", " ".join(str(x) for x in feature.input_mask))
    logger.info("segment_ids: %s", " ".join(str(x) for x in feature.segment_ids))
    logger.info("label: %s (id = %s)", example.label, feature.label_id)


def _convert(
    ex_index: int,
    example: InputExample | PaddingInputExample,
    label_list: Sequence[Any] | None,
    max_seq_length: int,
    tokenizer: FullTokenizer,
    pad: bool,
) -> InputFeatures:
    if isinstance(example, PaddingInputExample):
        n = max_seq_length if pad else 0
        return InputFeatures(
            input_ids=[0] * n, input_mask=[0] * n, segment_ids=[0] * n, label_id=0, is_real_example=False
        )

    tokens_a = tokenizer.tokenize(example.text_a)
    tokens_b = None
    if example.text_b:
        tokens_b = tokenizer.tokenize(example.text_b)
    _check_max_seq_length(max_seq_length, bool(tokens_b))

    if tokens_b:
        # Modifies `tokens_a` and `tokens_b` in place; "- 3" accounts for [CLS], [SEP], [SEP].
        truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
    elif len(tokens_a) > max_seq_length - 2:  # "- 2" for [CLS] and [SEP]
        tokens_a = tokens_a[0 : (max_seq_length - 2)]

    tokens, input_ids, input_mask, segment_ids = _assemble(tokens_a, tokens_b, tokenizer, max_seq_length, pad)
    feature = InputFeatures(
        input_ids=input_ids,
        input_mask=input_mask,
        segment_ids=segment_ids,
        label_id=_label_id(example, label_list),
        is_real_example=True,
    )
    if ex_index < 5:
        _log_feature(example, tokens, feature)
    return feature


def convert_single_example(
    ex_index: int,
    example: InputExample | PaddingInputExample,
    label_list: Sequence[Any] | None,
    max_seq_length: int,
    tokenizer: FullTokenizer,
) -> InputFeatures:
    """Converts a single `InputExample` into a single `InputFeatures`, exactly as the original.

    Args:
        ex_index: the example's position; the first five (0..4) are logged field by field.
        example: the example (a `PaddingInputExample` gives all-zero features, `is_real_example=False`).
        label_list: the labels in id order; `[None]` (or None) for regression, where the label is the float.
        max_seq_length: length of the padded features; longer inputs are truncated.
        tokenizer: a `FullTokenizer` (`tokenize`, `convert_tokens_to_ids`).
    """
    return _convert(ex_index, example, label_list, max_seq_length, tokenizer, pad=True)


def convert_examples_to_features(
    examples: Sequence[InputExample | PaddingInputExample],
    label_list: Sequence[Any] | None,
    max_seq_length: int,
    tokenizer: FullTokenizer,
    pad: bool = True,
) -> list[InputFeatures]:
    """Convert a set of `InputExample`s to a list of `InputFeatures` (`convert_single_example` on each).

    Args:
        examples: the examples.
        label_list: see `convert_single_example`.
        max_seq_length: the truncation length, and the padded length when `pad`.
        tokenizer: a `FullTokenizer`.
        pad: False to leave out the padding (same ids, truncated the same way), for batches padded
            to their longest sequence; `features_to_arrays` pads them.
    """
    features = []
    for ex_index, example in enumerate(examples):
        if ex_index % 10000 == 0:
            logger.info("Writing example %d of %d", ex_index, len(examples))
        features.append(_convert(ex_index, example, label_list, max_seq_length, tokenizer, pad))
    return features


def window_spans(num_tokens_a: int, num_tokens_b: int, max_seq_length: int, doc_stride: int) -> tuple[int, list]:
    """How `long_document="windows"` cuts an example: (the number of text_b pieces kept, the windows over
    text_a as `DocSpan(start, length)`s).

    Text_b (when there is one) goes into every window after text_a. It is kept whole unless that would
    leave text_a less than half of the room, `(max_seq_length - 3) // 2` pieces, while text_a needs more:
    it is then cut at its end to leave text_a that half (or whatever less text_a needs). Text_a is read in
    windows of the remaining room, starting `doc_stride` pieces apart, as run_squad.py's `doc_spans`
    loop (`bert.tasks.squad.doc_spans_for`). An example that fits `max_seq_length` is one window, the
    `truncate` feature itself; an empty text_a is one empty window.
    """
    specials = 3 if num_tokens_b else 2  # [CLS] A [SEP] (B [SEP])
    room = max_seq_length - specials
    if num_tokens_b:
        num_tokens_b = min(num_tokens_b, max(room // 2, room - num_tokens_a))
    room -= num_tokens_b
    if room < 1:
        raise InputError(
            f"--max_seq_length={max_seq_length} leaves no room for windows of text: [CLS] and [SEP] need "
            f"{specials} positions; use a larger --max_seq_length"
        )
    return num_tokens_b, doc_spans_for(num_tokens_a, room, doc_stride) or [DocSpan(start=0, length=0)]


def convert_examples_to_windows(
    examples: Sequence[InputExample],
    label_list: Sequence[Any] | None,
    max_seq_length: int,
    tokenizer: FullTokenizer,
    doc_stride: int,
    pad: bool = True,
) -> list[InputFeatures]:
    """Features for long documents read whole: one feature per window of each example (`window_spans`),
    `[CLS] window of A [SEP] (B [SEP])`, each with its example's label and `example_index`, in example
    order. The first five features are logged as `convert_single_example` logs them.

    Args:
        examples: the examples.
        label_list: see `convert_single_example`.
        max_seq_length: the length of every window's feature (padded to it when `pad`).
        tokenizer: a `FullTokenizer`.
        doc_stride: pieces of text_a between the starts of consecutive windows.
        pad: as for `convert_examples_to_features`.
    """
    features = []
    for ex_index, example in enumerate(examples):
        if ex_index % 10000 == 0:
            logger.info("Writing example %d of %d", ex_index, len(examples))
        tokens_a = tokenizer.tokenize(example.text_a)
        tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else []
        num_b, spans = window_spans(len(tokens_a), len(tokens_b), max_seq_length, doc_stride)
        label_id = _label_id(example, label_list)
        for span in spans:
            window = tokens_a[span.start : span.start + span.length]
            tokens, input_ids, input_mask, segment_ids = _assemble(
                window, tokens_b[:num_b], tokenizer, max_seq_length, pad
            )
            feature = InputFeatures(input_ids, input_mask, segment_ids, label_id, example_index=ex_index)
            if len(features) < 5:
                _log_feature(example, tokens, feature)
            features.append(feature)
    return features


WINDOW_POOLINGS = ("mean", "max")


def pool_windows(outputs: Sequence[np.ndarray], features: Sequence[InputFeatures], num_examples: int, pooling: str):
    """One row of logits per example from one row per feature: [num_examples, L] float32.

    Features without `example_index` (`truncate`) are one per example, in order. Windows of one example
    are pooled by `pooling`: "mean" (the average of their logits) or "max" (each logit's largest value).
    """
    logits = np.stack(outputs).astype(np.float32)  # [F, L]
    owners = [f.example_index for f in features]
    if all(i is None for i in owners):
        if len(logits) != num_examples:
            raise ValueError(f"{len(logits)} features for {num_examples} examples")
        return logits
    if pooling not in WINDOW_POOLINGS:
        raise ValueError(f"pooling={pooling!r} must be one of {', '.join(WINDOW_POOLINGS)}")
    owners = np.asarray(owners, dtype=np.int64)
    counts = np.bincount(owners, minlength=num_examples)
    if len(counts) != num_examples or not counts.all():
        raise ValueError(f"windows of {len(counts)} examples, some missing, for {num_examples} examples")
    if pooling == "max":
        pooled = np.full((num_examples, logits.shape[1]), -np.inf, dtype=np.float32)
        np.maximum.at(pooled, owners, logits)
        return pooled
    pooled = np.zeros((num_examples, logits.shape[1]), dtype=np.float64)
    np.add.at(pooled, owners, logits)
    return (pooled / counts[:, None]).astype(np.float32)


def features_to_arrays(features: Sequence[InputFeatures], pad_to: int | None = None) -> dict[str, np.ndarray]:
    """A batch of features as NumPy arrays, padded (with 0) to `pad_to` or to the longest feature.

    Returns `input_ids`, `input_mask`, `segment_ids` int64 [B, S]; `label_ids` [B] (int64, float32 for
    regression; float32 [B, L] 0/1 rows for multi-label); `is_real_example` int64 [B]. Works for padded
    and unpadded features alike.
    """
    # Regression labels are floats; multi-label ids are 0/1 rows, float targets of the sigmoid loss.
    floats = any(isinstance(f.label_id, (float, list)) for f in features)
    return {
        "input_ids": pad_2d([f.input_ids for f in features], pad_to),
        "input_mask": pad_2d([f.input_mask for f in features], pad_to),
        "segment_ids": pad_2d([f.segment_ids for f in features], pad_to),
        "label_ids": np.asarray([f.label_id for f in features], dtype=np.float32 if floats else np.int64),
        "is_real_example": np.asarray([int(f.is_real_example) for f in features], dtype=np.int64),
    }


# --------------------------------------------------------------------------------------------------
# The task registry (run_classifier.py's `processors` dict, extended) and the fine-tuning task

TASKS: dict[str, type[DataProcessor]] = {
    "cola": ColaProcessor,
    "mnli": MnliProcessor,
    "mrpc": MrpcProcessor,
    "xnli": XnliProcessor,
    "mnli-mm": MnliMismatchedProcessor,
    "sst-2": Sst2Processor,
    "sts-b": StsbProcessor,
    "qqp": QqpProcessor,
    "qnli": QnliProcessor,
    "rte": RteProcessor,
    "wnli": WnliProcessor,
    "generic": GenericProcessor,
}

# Other spellings in use (the GLUE folder names lower-cased, HF's names).
ALIASES = {
    "sst2": "sst-2",
    "stsb": "sts-b",
    "mnli-m": "mnli",
    "mnli_mismatched": "mnli-mm",
    "mnli-mismatched": "mnli-mm",
}


def get_processor(task_name: str, **kwargs: Any) -> DataProcessor:
    """The processor of `task_name` (case-insensitive, aliases allowed), built with `kwargs`
    (e.g. `language="de"` for XNLI, the column arguments for `generic`)."""
    name = task_name.lower()
    name = ALIASES.get(name, name)
    if name not in TASKS:
        raise InputError(f"Task not found: {task_name!r}; --task_name must be one of {', '.join(TASKS)}")
    return TASKS[name](**kwargs)


# Which GLUE metrics a task reports besides accuracy (the others: accuracy only).
_EXTRA_METRIC = {"cola": "mcc", "mrpc": "f1", "qqp": "f1"}
_REGRESSION_METRICS = ["eval_pearson", "eval_spearman", "eval_corr"]
_MULTI_LABEL_METRICS = [
    f"eval_{k}" for k in ("micro_f1", "micro_precision", "micro_recall", "macro_f1", "macro_precision", "macro_recall")
] + ["eval_subset_accuracy"]
_TUNED_METRICS = ["eval_tuned_micro_f1", "eval_tuned_macro_f1"]
# Flags of --task_name=generic (None unless given), its switches, and those of --multi_label among them.
_GENERIC_FLAGS = (
    "text_a_column",
    "text_b_column",
    "label_column",
    "labels",
    "train_file",
    "dev_file",
    "test_file",
    "label_separator",
    "threshold",
)
_GENERIC_SWITCHES = ("is_regression", "multi_label", "allow_empty_labels", "tune_thresholds")
_MULTI_LABEL_FLAGS = ("label_separator", "threshold", "allow_empty_labels", "tune_thresholds")
MULTI_LABEL = "multi_label_classification"
LONG_DOCUMENT = ("truncate", "windows")
DEFAULT_THRESHOLD = 0.5
DEFAULT_LABEL_SEPARATOR = ","
PREDICTED_LABELS_NAME = "test_predicted_labels.tsv"
LABEL_SCORES_NAME = "eval_label_scores.tsv"


class ClassificationTask(FinetuneTask):
    """Sequence (pair) classification, multi-label classification and regression with a processor of
    `TASKS` (`bert classify`).

    Long documents (`long_document="windows"`) are read in windows (`convert_examples_to_windows`), each a
    training feature with its example's label; at evaluation and prediction the windows' logits of an
    example are pooled (`pool_windows`, `window_pooling`) into one prediction per example.

    Multi-label (`--task_name=generic --multi_label`): sigmoid outputs, one yes/no decision per label at
    its threshold. The thresholds in force: tuned on the dev set in this run (`tune_thresholds`, by the
    last `metrics` call), else `threshold` for every label, else the `label_thresholds` saved with the
    model evaluated (`use_saved_config`), else 0.5.

    Args:
        args: the flags of `bert classify` (`task_name`, `data_dir`, `xnli_language`, `long_document`,
            `doc_stride`, `window_pooling`, and the `generic` task's `text_a_column`, `text_b_column`,
            `label_column`, `labels`, `has_header`, `is_regression`, `train_file`, `dev_file`,
            `test_file`, `multi_label`, `label_separator`, `allow_empty_labels`, `threshold`,
            `tune_thresholds`).
    """

    command = "classify"
    head = "BertForSequenceClassification"
    classifier_dropout = 0.1  # run_classifier.create_model: keep_prob=0.9, not read from the config

    def __init__(self, args: Any):
        self.args = args
        name = args.task_name.lower()
        self.name = ALIASES.get(name, name)
        self.processor = None
        self.saved_thresholds: dict[str, float] = {}
        self.tuned_thresholds: np.ndarray | None = None

    @property
    def is_regression(self) -> bool:
        return self.name == "sts-b" or (self.name == "generic" and self.args.is_regression)

    @property
    def is_multi_label(self) -> bool:
        return self.name == "generic" and self.args.multi_label

    @property
    def default_metric(self) -> str:  # type: ignore[override]
        if self.is_regression:
            return "eval_corr"
        if self.is_multi_label:
            return "eval_micro_f1"
        return "eval_mcc" if self.name == "cola" else "eval_accuracy"

    def metric_names(self) -> list[str]:
        if self.is_regression:
            return list(_REGRESSION_METRICS)
        if self.is_multi_label:
            return _MULTI_LABEL_METRICS + (_TUNED_METRICS if self.args.tune_thresholds else [])
        extra = _EXTRA_METRIC.get(self.name)
        return ["eval_accuracy"] + ([f"eval_{extra}"] if extra else [])

    def check_flags(self) -> None:
        a = self.args
        if self.name not in TASKS:
            raise InputError(f"Task not found: {a.task_name!r}; --task_name must be one of {', '.join(TASKS)}")
        given = [f for f in _GENERIC_FLAGS if getattr(a, f) is not None]
        given += [f for f in _GENERIC_SWITCHES if getattr(a, f)]
        if self.name != "generic" and given:
            raise InputError(
                f"{', '.join('--' + f for f in given)} only apply to --task_name=generic; drop them for "
                f"--task_name={a.task_name}"
            )
        multi_label_only = [f"--{f}" for f in _MULTI_LABEL_FLAGS if f in given]
        if multi_label_only and not a.multi_label:
            raise InputError(f"{', '.join(multi_label_only)} only apply with --multi_label; add it or drop them")
        if a.multi_label and a.is_regression:
            raise InputError("a task is either multi-label or regression: drop --multi_label or --is_regression")
        if a.threshold is not None and not 0.0 < a.threshold < 1.0:
            raise InputError(f"--threshold={a.threshold} must be a probability between 0 and 1 (exclusive)")
        if a.tune_thresholds and not a.do_eval:
            raise InputError("--tune_thresholds tunes the thresholds on the dev set: add --do_eval")
        # Not "choices" metadata: bert classify names the choices in its own one-line error.
        if a.long_document not in LONG_DOCUMENT:
            raise InputError(f"--long_document={a.long_document} must be one of {', '.join(LONG_DOCUMENT)}")
        if a.window_pooling not in WINDOW_POOLINGS:
            raise InputError(f"--window_pooling={a.window_pooling} must be one of {', '.join(WINDOW_POOLINGS)}")
        label_list_flag(a.labels)

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
                multi_label=a.multi_label,
                label_separator=self.label_separator,
                allow_empty_labels=a.allow_empty_labels,
            )
        self.processor = get_processor(self.name, **kwargs)

    def use_saved_config(self, config: dict[str, Any]) -> None:
        thresholds = config.get("label_thresholds")
        if isinstance(thresholds, dict):
            self.saved_thresholds = {str(k): float(v) for k, v in thresholds.items()}

    @property
    def label_separator(self) -> str:
        return DEFAULT_LABEL_SEPARATOR if self.args.label_separator is None else self.args.label_separator

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

    def read_unlabelled(self, path: str) -> list:
        return self.processor.get_unlabelled_examples(path)

    def labels(self) -> list | None:
        if self.is_regression:
            return None
        labels = self.processor.get_labels()
        if not labels:
            raise InputError(
                "no labels: every label cell of the training file is empty; label the examples, or give the "
                "label list with --labels"
            )
        return labels

    def model_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"num_labels": 1 if self.is_regression else len(self.labels())}
        if self.is_multi_label:
            kwargs["problem_type"] = MULTI_LABEL
        return kwargs

    def base_thresholds(self) -> np.ndarray:
        """[L] each label's threshold before any tuning: --threshold, else the saved one, else 0.5."""
        if self.args.threshold is not None:
            return np.full(len(self.labels()), self.args.threshold)
        return np.array([self.saved_thresholds.get(label, DEFAULT_THRESHOLD) for label in self.labels()])

    def thresholds(self) -> np.ndarray:
        """[L] the thresholds in force (see the class docstring)."""
        return self.tuned_thresholds if self.tuned_thresholds is not None else self.base_thresholds()

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:
        a = self.args
        label_list = [None] if self.is_regression else self.labels()
        if a.long_document == "truncate":
            return convert_examples_to_features(examples, label_list, max_seq_length, tokenizer, pad=pad)
        features = convert_examples_to_windows(examples, label_list, max_seq_length, tokenizer, a.doc_stride, pad)
        logger.info(
            "%d examples -> %d windows of at most %d tokens, %d apart (%.2f per example)",
            len(examples),
            len(features),
            max_seq_length,
            a.doc_stride,
            len(features) / max(len(examples), 1),
        )
        return features

    def feature_length(self, feature) -> int:
        return int(sum(feature.input_mask))

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:
        a = model_inputs(features_to_arrays(features, pad_to))
        del a["is_real_example"]  # the original's TPU padding examples; there are none here
        floats = self.is_regression or self.is_multi_label
        a["labels"] = a.pop("label_ids").astype(np.float32 if floats else np.int64)
        return a

    def inference_config(self) -> dict[str, Any]:
        a = self.args
        problem_type = "regression" if self.is_regression else "single_label_classification"
        config: dict[str, Any] = {
            "problem_type": MULTI_LABEL if self.is_multi_label else problem_type,
            "long_document": a.long_document,
            "doc_stride": a.doc_stride,
            "window_pooling": a.window_pooling,
        }
        if self.is_multi_label:
            config["label_thresholds"] = self._threshold_map(self.thresholds())
        return config

    def tuned_config(self) -> dict[str, Any]:
        if self.tuned_thresholds is None:
            return {}
        return {"label_thresholds": self._threshold_map(self.tuned_thresholds)}

    def _threshold_map(self, thresholds: np.ndarray) -> dict[str, float]:
        return {label: float(t) for label, t in zip(self.labels(), thresholds)}

    def example_logits(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> np.ndarray:
        """[N, L] one row of logits per example: a long document's windows pooled (`window_pooling`)."""
        return pool_windows(outputs, features, len(examples), self.args.window_pooling)

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:
        logits = self.example_logits(examples, features, outputs)  # [N, L]
        gold = np.array(_example_label_ids(features, len(examples)))
        if self.is_regression:
            preds = logits[:, 0]
            if self.name == "generic":
                r, rho = pearson(preds, gold), spearman(preds, gold)
                found = {"pearson": r, "spearman": rho, "corr": (r + rho) / 2}
            else:
                found = glue_metrics(self.name, preds, gold)
        elif self.is_multi_label:
            found = self._multi_label_metrics(sigmoid(logits), gold)
        else:
            preds = logits.argmax(-1)
            found = (
                {"accuracy": accuracy(preds, gold)} if self.name == "generic" else glue_metrics(self.name, preds, gold)
            )
        return {f"eval_{k}": v for k, v in found.items()}

    def _multi_label_metrics(self, probs: np.ndarray, gold: np.ndarray) -> dict[str, float]:
        """The metrics at the thresholds before tuning; with --tune_thresholds, each label's threshold is
        then tuned for its F1 on these dev outputs (`best_f1_threshold`) and kept for the predictions, and
        the micro and macro F1 at the tuned thresholds are added (`tuned_*`: optimistic, as they are scored
        on the dev set they were tuned on)."""
        base = self.base_thresholds()
        found = multi_label_metrics(probs >= base, gold)
        if self.args.tune_thresholds:
            self.tuned_thresholds = np.array(
                [best_f1_threshold(probs[:, j], gold[:, j], base[j]) for j in range(probs.shape[1])]
            )
            tuned = multi_label_metrics(probs >= self.tuned_thresholds, gold)
            found.update(tuned_micro_f1=tuned["micro_f1"], tuned_macro_f1=tuned["macro_f1"])
            logger.info("thresholds tuned on the dev set: %s", self._threshold_map(self.tuned_thresholds))
        return found

    def write_eval_files(self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list) -> None:
        """Multi-label: `eval_label_scores.tsv`, a header line then per label its threshold in force,
        precision, recall, F1 and support (gold positives) on the dev set."""
        if not self.is_multi_label:
            return
        probs = sigmoid(self.example_logits(examples, features, outputs))
        thresholds = self.thresholds()
        scores = per_label_scores(probs >= thresholds, np.array(_example_label_ids(features, len(examples))))
        with atomic_write(output_dir / LABEL_SCORES_NAME) as f:
            f.write("label\tthreshold\tprecision\trecall\tf1\tsupport\n")
            for j, label in enumerate(self.labels()):
                row = [thresholds[j], scores["precision"][j], scores["recall"][j], scores["f1"][j]]
                f.write("\t".join([label, *(f"{x:.6g}" for x in row), str(scores["support"][j])]) + "\n")

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:
        logits = self.example_logits(examples, features, outputs)  # [N, L]
        if self.is_regression:
            values = logits[:, 0]
        elif self.is_multi_label:
            values = sigmoid(logits)
        else:
            values = softmax(logits)
        path = output_dir / "test_results.tsv"
        write_test_results(path, values, num_examples=len(examples))
        written: dict[str, Any] = {"test_results": str(path), "num_examples": len(examples)}
        if self.is_multi_label:
            labels, chosen = self.labels(), values >= self.thresholds()
            with atomic_write(output_dir / PREDICTED_LABELS_NAME) as f:
                for row in chosen:
                    f.write(self.label_separator.join(label for label, on in zip(labels, row) if on) + "\n")
            written["predicted_labels"] = str(output_dir / PREDICTED_LABELS_NAME)
        return written


def _example_label_ids(features: Sequence[InputFeatures], num_examples: int) -> list:
    """Each example's label id, in example order, from its feature (or its first window)."""
    ids: list[Any] = [None] * num_examples
    for i, f in enumerate(features):
        k = i if f.example_index is None else f.example_index
        if ids[k] is None:
            ids[k] = f.label_id
    return ids
