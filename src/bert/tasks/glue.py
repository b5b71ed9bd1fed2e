"""Sentence and sentence-pair classification data: run_classifier.py's processors and feature conversion.

What run_classifier.py has, with the same files, columns, labels and guids: `ColaProcessor`,
`MnliProcessor`, `MrpcProcessor`, `XnliProcessor` (its language is a constructor argument here instead of
the hard-coded "zh"). What it lacks and users asked for (google-research/bert issues #24, #151, #195, #548),
with the layouts of the GLUE download script: SST-2, STS-B (regression: float labels), QQP, QNLI, RTE, WNLI and
MNLI mismatched. One's own TSV, CSV or JSON-lines files: `bert.tasks.generic`; long documents read in windows:
`bert.tasks.windows`; the registry of tasks and `bert classify`'s task: `bert.tasks.classification`.

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

Not in the original: multi-label examples (`bert.tasks.generic`: a label set per example, a 0/1 row as its label
id).
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bert.errors import InputError
from bert.tasks.common import (
    pad_2d,
    truncate_seq_pair,
)
from bert.tokenization import printable_text
from bert.utils import finite_number, iter_lines

if TYPE_CHECKING:
    from bert.tokenization import FullTokenizer

logger = logging.getLogger(__name__)


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
    # Decoded by `iter_lines`, which names the line of an undecodable byte (a text-mode file decodes 8 KB
    # ahead of the line being parsed, so its errors cannot say where they are).
    lines = (line + "\n" for line in iter_lines(path, "utf-8-sig", hint=None))
    if quotechar is None:
        reader = csv.reader(lines, delimiter=delimiter, quotechar=None, quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(lines, delimiter=delimiter, quotechar=quotechar, quoting=csv.QUOTE_MINIMAL)
    line_num = 0
    try:
        for row in reader:
            # line_num counts physical lines read so far; a quoted CSV record may span several.
            start = line_num + 1
            line_num = reader.line_num
            yield start, row
    except csv.Error as e:
        raise InputError(f"{path}:{line_num + 1}: {e}; fix this line") from e


def require_rows(path: str | os.PathLike, rows: list[tuple[int, list[str]]], what: str) -> None:
    if not any(row for _, row in rows):
        raise InputError(f"{os.fspath(path)} is empty; it should hold {what}")


def columns_error(path: str | os.PathLike, line: int, row: list[str], needed: int, sep: str = "tab") -> InputError:
    return InputError(
        f"{os.fspath(path)}:{line}: expected at least {needed} {sep}-separated columns, found {len(row)}; "
        f"fix or remove this line (quotes are plain text in .tsv files, so a stray tab or line break splits a field)"
    )


def label_error(path: str | os.PathLike, line: int, label: Any, labels: Sequence[Any], where: str) -> InputError:
    return InputError(
        f"{os.fspath(path)}:{line}: label {label!r} ({where}) is not one of {list(labels)}; "
        f"fix the label, or use the --task_name (or label list) that matches this file"
    )


def float_label(path: str | os.PathLike, line: int, text: str, where: str) -> float:
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
        require_rows(path, rows, what)
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
                raise columns_error(path, line, row, needed)
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
                    label = float_label(path, line, label, where)
                elif label not in self.labels:
                    raise label_error(path, line, label, self.labels, where)
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
        require_rows(path, rows, f"the XNLI training examples in {self.language!r}")
        examples = []
        for line, row in rows:
            i = line - 1
            if i == 0 or not row:
                continue
            if len(row) < 3:
                raise columns_error(path, line, row, 3)
            label = "contradiction" if row[2] == "contradictory" else row[2]
            if label not in self.labels:
                raise label_error(path, line, row[2], self.labels, "column 3")
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
        require_rows(path, rows, f"the XNLI {set_type} examples")
        examples = []
        for line, row in rows:
            i = line - 1
            if i == 0 or not row:
                continue
            if len(row) < 8:
                raise columns_error(path, line, row, 8)
            if row[0] != self.language:
                continue
            if row[1] not in self.labels:
                raise label_error(path, line, row[1], self.labels, "column 2")
            examples.append(InputExample(guid=f"{set_type}-{i}", text_a=row[6], text_b=row[7], label=row[1]))
        if not examples:
            raise InputError(
                f"{path} has no rows for language {self.language!r} (column 1); pass one of the languages "
                f"the file has, e.g. XnliProcessor(language='zh')"
            )
        return examples


# --------------------------------------------------------------------------------------------------
# Feature conversion (run_classifier.py, `convert_single_example`, `convert_examples_to_features`)


def is_regression_labels(label_list: Sequence[Any] | None) -> bool:
    """True for a regression task's label list: None or `[None]` (STS-B)."""
    return label_list is None or list(label_list) == [None]


def example_label_id(example: InputExample, label_list: Sequence[Any] | None) -> int | float | list[int]:
    if is_regression_labels(label_list):
        if example.label is None:
            raise InputError(f"example {example.guid}: no label; a regression example needs a numeric label")
        return float(example.label)
    assert label_list is not None  # is_regression_labels says None is regression
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


def assemble_feature(
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


def log_feature(example: InputExample, tokens: list[str], feature: InputFeatures) -> None:
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

    tokens, input_ids, input_mask, segment_ids = assemble_feature(tokens_a, tokens_b, tokenizer, max_seq_length, pad)
    feature = InputFeatures(
        input_ids=input_ids,
        input_mask=input_mask,
        segment_ids=segment_ids,
        label_id=example_label_id(example, label_list),
        is_real_example=True,
    )
    if ex_index < 5:
        log_feature(example, tokens, feature)
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
