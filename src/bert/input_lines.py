"""The input records of the inference commands (`bert predict`, `embed`, `fill-mask`, `search`, the server's
batches): one record per line of plain text or JSON, read in chunks that the model runs on together, with the
line (or Parquet row) of a bad record named in its error. Torch-free, so a command checks its input before
the model loads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from bert.errors import InputError
from bert.tasks.common import CLASSIFICATION, EMBEDDINGS, MULTIPLE_CHOICE, QUESTION_ANSWERING
from bert.utils import iter_lines, parse_json_line, progress


class InputItemError(InputError):
    """Bad input in item `index` (0-based) of a call; `reason` says what is wrong and how to fix it."""

    def __init__(self, index: int, reason: str):
        super().__init__(f"input {index}: {reason}")
        self.index = index
        self.reason = reason


def read_input_record(line: str, task: str) -> Any:
    """What `task` takes from one input line, as the commands (and any caller with JSON lines) give it.

    A line is plain text, or a JSON object: {"text"} or {"text", "text_pair"} for classification (a tuple
    (text, text_pair) is returned), {"text"} for NER, embeddings and fill-mask (the text is returned;
    for embeddings a "title", as in a BEIR corpus, goes before it),
    {"question", "context"} for question answering (a tuple), {"context", "endings": [...]} for multiple
    choice (a tuple). Raises `InputError` saying what is wrong, without the line's location.
    """
    obj = None
    if line.lstrip().startswith("{"):
        with contextlib.suppress(ValueError):  # plain text that starts with "{"
            obj = parse_json_line(line)
    if not isinstance(obj, dict):
        if not line.strip():
            raise InputError("empty line; remove it or give it some text")
        if task in (QUESTION_ANSWERING, MULTIPLE_CHOICE):
            example = (
                '{"question": ..., "context": ...}'
                if task == QUESTION_ANSWERING
                else '{"context": ..., "endings": [...]}'
            )
            raise InputError(f"{task} needs a JSON object per line, e.g. {example}")
        return (line, None) if task == CLASSIFICATION else line

    def field(name: str, required: bool = True) -> Any:
        value = obj.get(name)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value.strip():
            what = "is missing" if value is None else "must be a non-empty string"
            raise InputError(f'field "{name}" {what}; keys given: {", ".join(sorted(obj)) or "none"}')
        return value

    if task == QUESTION_ANSWERING:
        return field("question"), field("context")
    if task == MULTIPLE_CHOICE:
        endings = obj.get("endings")
        if (
            not isinstance(endings, list)
            or len(endings) < 2
            or not all(isinstance(e, str) and e.strip() for e in endings)
        ):
            raise InputError('field "endings" must be a list of at least two non-empty strings')
        return field("context"), endings
    if task == CLASSIFICATION:
        return field("text"), field("text_pair", required=False)
    title = obj.get("title") if task == EMBEDDINGS else None
    if isinstance(title, str) and title.strip():
        # A BEIR corpus record: the title goes before the text, as BEIR's evaluation reads it.
        return f"{title} {field('text')}"
    return field("text")


# Input lines per call of the model: the batches of a chunk are sorted by length together.
CHUNK_LINES = 2048


def _read_input_chunks(
    path: str, task: str, name: str, only: range | None = None
) -> Iterator[tuple[list[int], list[Any]]]:
    """(line numbers, records) of consecutive runs of up to CHUNK_LINES lines of a UTF-8 input file (only
    the 0-based lines `only` when given), each line read by `read_input_record`; a bad line raises
    `InputError` naming `name` and its number."""
    lines, records = [], []
    hint = "the text through `iconv -c -f utf-8 -t utf-8`"
    for number, line in enumerate(iter_lines(path, "utf-8", "strict", hint=hint, name=name), start=1):
        if only is not None and number - 1 not in only:
            if number > only.stop:
                break
            continue
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]
        line = line[:-1] if line.endswith("\r") else line
        try:
            records.append(read_input_record(line, task))
        except InputError as e:
            raise InputError(f"{name} line {number}: {e}") from None
        lines.append(number)
        if len(records) == CHUNK_LINES:
            yield lines, records
            lines, records = [], []
    if records:
        yield lines, records


def map_input_chunks(
    chunks: Iterable[tuple[Sequence[int], list[Any]]],
    name: str,
    unit: str,
    run: Callable[[list[Any]], Any],
    total: int,
    desc: str | None,
) -> Iterator[Any]:
    """`run(records)` over `chunks` of (numbers, records) of an input, in order: the results of each chunk (a
    list, or an array of rows such as `Predictor.embed`'s).

    An `InputItemError` that `run` raises for one record is an `InputError` naming `name`, the `unit` ("line",
    "row") and its number. A progress bar `desc` counts the `total` records (none when `desc` is None)."""
    with progress(total=total, unit=unit, desc=desc, disable=desc is None) as bar:
        for numbers, records in chunks:
            try:
                results = run(records)
            except InputItemError as e:
                raise InputError(f"{name} {unit} {numbers[e.index]}: {e.reason}") from None
            yield results
            bar.update(len(numbers))


def map_input_lines(
    path: str,
    name: str,
    task: str,
    run: Callable[[list[Any]], Any],
    total: int,
    desc: str | None,
    only: range | None = None,
) -> Iterator[Any]:
    """`map_input_chunks` over an input file of one record per line for `task` (`read_input_record`), `name`
    in errors; a bad line is an `InputError` naming it. `only`: the 0-based lines to run on (a shard's share);
    all when None."""
    return map_input_chunks(_read_input_chunks(path, task, name, only), name, "line", run, total, desc)
