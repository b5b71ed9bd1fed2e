"""Classification data from one's own files (`--task_name=generic`): TSV, CSV or JSON lines, columns by index
or header name, labels from a list or the data, regression scores and multi-label sets. Read as strictly as
the GLUE layouts (`bert.tasks.glue`'s line reader and its errors naming file, line and fix).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from bert.errors import InputError
from bert.tasks.glue import (
    DataProcessor,
    InputExample,
    columns_error,
    float_label,
    label_error,
    read_rows,
    require_rows,
)
from bert.utils import iter_lines, parse_json_line

logger = logging.getLogger(__name__)


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
        cells = cell if isinstance(cell, list) else cell.split(self.label_separator)
        names = (x if isinstance(x, str) else json.dumps(x) for x in cells if x is not None)
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
        require_rows(path, rows, f"the {set_type} examples")
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
                raise columns_error(path, line, row, needed, sep)
            if len(row) != first[1] and any(i is not None and i < 0 for i in index):
                # A column counted from the end moves when a row has fewer columns: a text would become a label.
                raise InputError(
                    f"{path}:{line}: {len(row)} {sep}-separated columns, but line {first[0]} has {first[1]}; "
                    "every line needs the same columns (a column counted from the end, such as the default label "
                    "column -1, would take another field here): fix or remove this line"
                )
            a, b, lab = (row[i] if i is not None else None for i in index)
            assert a is not None  # the text_a column is always given (a number or a name)
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
            values: list[Any] = []
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
            if self.multi_label and labels is not None:  # always: a multi-label task is no regression
                label = [] if set_type == "test" else self._label_set(path, line, label, labels, where, set_type)
            elif set_type == "test":
                label = 0.0 if labels is None else labels[0]
            elif labels is None:
                label = float_label(path, line, label, where)
            elif label not in labels:
                raise label_error(path, line, label, labels, where)
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
                raise label_error(path, line, name, labels, where)
        return sorted(names, key=order.__getitem__)
