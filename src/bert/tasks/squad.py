"""SQuAD v1.1 / v2.0: examples, doc-stride features and n-best post-processing (`run_squad.py`).

The data side and the post-processing of google-research/bert `run_squad.py`. Each long function of the
original is one public function here whose steps are helpers, in the original's order; a helper that
mirrors a block of the original line for line says which in its docstring.

- `read_squad_examples`: the JSON file -> `SquadExample`s (whitespace-split context words, answer word
  positions for training, v2.0 `is_impossible`). Steps: `squad_examples_from_json` (articles),
  `_paragraph_examples` (questions), `_split_context`, `_training_answer`.
- `convert_examples_to_features`: question + sliding document windows -> `InputFeatures`. Steps:
  `iter_features` (examples and windows), `_tokenize_document`, `_answer_piece_span` (with
  `_improve_answer_span`), `doc_spans_for`, `_window_tokens` (with `_check_is_max_context`),
  `_window_labels`, `_log_feature`.
- `write_predictions`: per-feature start/end logits (`RawResult`) -> `predictions.json`,
  `nbest_predictions.json` and, for v2.0, `null_odds.json`. Steps: `compute_predictions` (examples and the
  null-score rule), `_prelim_predictions` (with `_span_candidates`, `_get_best_indexes`),
  `_nbest_predictions` (with `_span_text`, `get_final_text`), `_nbest_json` (with `_compute_softmax`).

The original's quirks are kept, so that files and numbers match: training windows that do not contain the
answer are labelled (0, 0), the `[CLS]` position, even for v1.1; only the *start* of a span is checked for
maximum context; an example with no valid span gets the nonce answer "empty". One divergence, a fix: in
v2.0 mode the original crashes (issues #211, #417, #476) when no non-null answer reaches the n-best list;
here that question is answered "" (no answer) -- see `compute_predictions`.

Bad input files raise `bert.errors.InputError` with a one-line message naming the file, the article or
question and the field. Nothing here imports torch or model code: logits come in as lists or arrays.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import random
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from bert.errors import InputError
from bert.formats.results import write_results
from bert.tasks.common import FinetuneTask, pad_2d
from bert.tasks.squad_evaluate import evaluate_v1, evaluate_v2, iter_questions
from bert.tokenization import BasicTokenizer, whitespace_tokenize
from bert.utils import atomic_write, load_json_file

if TYPE_CHECKING:
    from bert.commands.squad import SquadArgs

logger = logging.getLogger(__name__)

# The first feature's id; the original counts up from here, one per feature (window).
FIRST_UNIQUE_ID = 1000000000

# `null_odds.json` value written for a v2.0 question whose n-best list holds no non-null answer (the case
# the original crashes on): "certainly no answer". Finite so the file stays strict JSON; the same
# "large and positive" number the original starts its running minimum of null scores with.
NO_NON_NULL_SCORE_DIFF = 1000000.0

# The characters `read_squad_examples` splits the context on: ASCII space, tab, CR, LF and U+202F (narrow
# no-break space). Other Unicode spaces stay inside words, as in the original.
_SQUAD_WHITESPACE = frozenset(" \t\r\n\u202f")


def _is_whitespace(c: str) -> bool:
    return c in _SQUAD_WHITESPACE


# --------------------------------------------------------------------------------------------------
# Examples


@dataclass
class SquadExample:
    """One question with its context, as read from the SQuAD JSON.

    Args:
        qas_id: the question's `id`.
        question_text: the question.
        doc_tokens: the context split on whitespace (see `read_squad_examples`).
        orig_answer_text: training only: the answer text ("" for an impossible question).
        start_position: training only: index in `doc_tokens` of the answer's first word (-1 if impossible).
        end_position: training only: index in `doc_tokens` of the answer's last word (-1 if impossible).
        is_impossible: training with v2.0 only: the question has no answer in the context.
    """

    qas_id: str
    question_text: str
    doc_tokens: list[str]
    orig_answer_text: str | None = None
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool = False

    def __str__(self) -> str:
        s = f"qas_id: {self.qas_id}, question_text: {self.question_text}, doc_tokens: [{' '.join(self.doc_tokens)}]"
        if self.start_position is not None:
            s += f", start_position: {self.start_position}"
        if self.end_position is not None:
            s += f", end_position: {self.end_position}"
        if self.is_impossible:
            s += f", is_impossible: {self.is_impossible}"
        return s


def read_squad_examples(
    input_file: str | os.PathLike, is_training: bool, version_2_with_negative: bool = False
) -> list[SquadExample]:
    """Read a SQuAD JSON file (`.json`, or `.json.gz`) into `SquadExample`s, one per question, in file order.

    The context is split into words on whitespace (space, tab, CR, LF, U+202F only); each character maps
    to the word containing it (whitespace to the word before it, leading whitespace to -1). For training,
    the answer's `answer_start` and last character give the start and end words; a question whose answer
    text (whitespace-normalised) is not found in the space-joined words of that span is skipped with the
    original's warning "Could not find answer: ..." (the number skipped is logged at the end). With
    `version_2_with_negative`, training reads `is_impossible`; impossible questions get start = end = -1
    and answer text "". Prediction mode reads no answers and leaves `is_impossible` False.

    Args:
        input_file: path of the SQuAD JSON file.
        is_training: read answers (exactly one per answerable question, as the original requires).
        version_2_with_negative: the file is SQuAD v2.0 (questions may be impossible).

    Returns:
        The examples.

    Raises:
        InputError: the file is missing, is not JSON, or lacks a field that is read.
    """
    return squad_examples_from_json(
        load_json_file(input_file, "SQuAD file"), is_training, version_2_with_negative, source=os.fspath(input_file)
    )


def squad_examples_from_json(
    dataset_json: Any, is_training: bool, version_2_with_negative: bool = False, source: str = "SQuAD data"
) -> list[SquadExample]:
    """`read_squad_examples` on an already loaded SQuAD JSON object (`{"data": [...]}`).

    Walks articles, then paragraphs (`_paragraph_examples`), in file order; the type checks that turn a
    malformed file into an `InputError` come before each field is read.

    Args:
        dataset_json: the parsed file.
        is_training: see `read_squad_examples`.
        version_2_with_negative: see `read_squad_examples`.
        source: the name used in error messages (the file path).
    """
    if not isinstance(dataset_json, dict) or not isinstance(dataset_json.get("data"), list):
        raise InputError(f'{source}: no "data" list at the top level; give a SQuAD file ({{"data": [...]}})')
    examples: list[SquadExample] = []
    num_skipped = 0
    seen: dict[str, str] = {}  # question id -> where it is: predictions are keyed by id
    for a, entry in enumerate(dataset_json["data"]):
        where = f"{source}: article {a}"
        if isinstance(entry, dict) and isinstance(entry.get("title"), str):
            where += f" ({entry['title']!r})"
        if not isinstance(entry, dict) or not isinstance(entry.get("paragraphs"), list):
            raise InputError(f'{where} has no "paragraphs" list; every article needs one')
        for p, paragraph in enumerate(entry["paragraphs"]):
            paragraph_examples, paragraph_skipped = _paragraph_examples(
                paragraph, f"{where}, paragraph {p}", source, is_training, version_2_with_negative, seen
            )
            examples.extend(paragraph_examples)
            num_skipped += paragraph_skipped
    if num_skipped:
        logger.warning(
            "%s: skipped %d of %d questions whose answer text could not be found in the context",
            source,
            num_skipped,
            num_skipped + len(examples),
        )
    return examples


def _paragraph_examples(
    paragraph: Any, where: str, source: str, is_training: bool, version_2_with_negative: bool, seen: dict[str, str]
) -> tuple[list[SquadExample], int]:
    """The examples of one paragraph's questions, and how many of them were skipped (training only).

    Every example of the paragraph shares one `doc_tokens` list, as in the original.

    Args:
        paragraph: one element of an article's "paragraphs".
        where: "<source>: article <a> ('<title>'), paragraph <p>", for error messages.
        source: the file name, for error messages about a question (named by its id).
        is_training: read the answers (`_training_answer`).
        version_2_with_negative: read `is_impossible` too.
        seen: the ids of the questions read so far (and where they are), updated; a repeated id is an error.
    """
    if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str):
        raise InputError(f'{where} has no "context" string; every paragraph needs one')
    if not isinstance(paragraph.get("qas"), list):
        raise InputError(f'{where} has no "qas" list; every paragraph needs one')
    paragraph_text = paragraph["context"]
    doc_tokens, char_to_word_offset = _split_context(paragraph_text)

    examples: list[SquadExample] = []
    num_skipped = 0
    for q, qa in enumerate(paragraph["qas"]):
        if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
            raise InputError(f'{where}, question {q} has no string "id"; add one')
        qas_id = qa["id"]
        if qas_id in seen:
            raise InputError(
                f"{where}, question {q} has the id {qas_id!r} of {seen[qas_id]}; question ids must be unique "
                "(predictions are keyed by them): fix or remove the duplicate"
            )
        seen[qas_id] = f"{where.split(': ', 1)[-1]}, question {q}"
        if not isinstance(qa.get("question"), str):
            raise InputError(f'{source}: question {qas_id} has no "question" string; add the question text')
        answer = _NO_ANSWER
        if is_training:
            labelled = _training_answer(
                qa,
                f"{source}: question {qas_id}",
                paragraph_text,
                doc_tokens,
                char_to_word_offset,
                version_2_with_negative,
            )
            if labelled is None:
                num_skipped += 1
                continue
            answer = labelled
        examples.append(
            SquadExample(
                qas_id=qas_id,
                question_text=qa["question"],
                doc_tokens=doc_tokens,
                orig_answer_text=answer.text,
                start_position=answer.start_position,
                end_position=answer.end_position,
                is_impossible=answer.is_impossible,
            )
        )
    return examples, num_skipped


def _split_context(paragraph_text: str) -> tuple[list[str], list[int]]:
    """The context's words (split on `_SQUAD_WHITESPACE`) and, per character, the index of its word.

    A whitespace character maps to the word before it; leading whitespace maps to -1. Mirrors, line for
    line, the loop of run_squad.py, `read_squad_examples`, that builds `doc_tokens` and `char_to_word_offset`.
    """
    doc_tokens: list[str] = []
    char_to_word_offset: list[int] = []
    prev_is_whitespace = True
    for c in paragraph_text:
        if _is_whitespace(c):
            prev_is_whitespace = True
        else:
            if prev_is_whitespace:
                doc_tokens.append(c)
            else:
                doc_tokens[-1] += c
            prev_is_whitespace = False
        char_to_word_offset.append(len(doc_tokens) - 1)
    return doc_tokens, char_to_word_offset


class _Answer(NamedTuple):
    """A question's label, as `SquadExample` holds it (None, None, None, False in prediction mode)."""

    text: str | None
    start_position: int | None
    end_position: int | None
    is_impossible: bool


_NO_ANSWER = _Answer(None, None, None, False)
_IMPOSSIBLE = _Answer("", -1, -1, True)


def _training_answer(
    qa: Mapping,
    where: str,
    paragraph_text: str,
    doc_tokens: Sequence[str],
    char_to_word_offset: Sequence[int],
    version_2_with_negative: bool,
) -> _Answer | None:
    """The label of one training question, or None when its answer text is not found in the context.

    The `if is_training:` block of run_squad.py, `read_squad_examples`, step for step, with a type check (an
    `InputError` naming the question) before each field is read and a range check on `answer_start`, where
    the original raises KeyError or IndexError, or reads a wrong word.

    Args:
        qa: one element of a paragraph's "qas".
        where: "<source>: question <id>", for error messages.
        paragraph_text: the context.
        doc_tokens, char_to_word_offset: from `_split_context(paragraph_text)`.
        version_2_with_negative: read `is_impossible`.
    """
    is_impossible = False
    if version_2_with_negative:
        if not isinstance(qa.get("is_impossible"), bool):
            raise InputError(
                f'{where} has no boolean "is_impossible", which v2.0 training reads; add it, or train without '
                "--version_2_with_negative"
            )
        is_impossible = qa["is_impossible"]
    answers = qa.get("answers")
    if not isinstance(answers, list):
        raise InputError(f'{where} has no "answers" list, which training reads; add it')
    if len(answers) != 1 and not is_impossible:
        raise InputError(
            f"{where} has {len(answers)} answers; for training, each question should have exactly 1 answer "
            "(dev files have several: predict on them)"
        )
    if is_impossible:
        return _IMPOSSIBLE

    answer = answers[0]
    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
        raise InputError(f'{where}: the answer has no "text" string; add it')
    answer_offset = answer.get("answer_start")
    if isinstance(answer_offset, bool) or not isinstance(answer_offset, int):
        raise InputError(
            f'{where}: the answer has no integer "answer_start"; add the answer\'s character offset in the context'
        )
    orig_answer_text = answer["text"]
    answer_end = answer_offset + len(orig_answer_text) - 1
    if not (0 <= answer_offset < len(paragraph_text) and answer_end < len(paragraph_text)):
        raise InputError(
            f"{where}: answer_start {answer_offset} with a {len(orig_answer_text)}-character answer lies outside "
            f"the {len(paragraph_text)}-character context; fix the offset"
        )
    start_position = char_to_word_offset[answer_offset]
    end_position = char_to_word_offset[answer_end]
    # Only keep answers whose text can be recovered from the document; when it cannot (odd Unicode, mostly)
    # the original skips the question, so training mode does not keep every example.
    actual_text = " ".join(doc_tokens[start_position : end_position + 1])
    cleaned_answer_text = " ".join(whitespace_tokenize(orig_answer_text))
    if actual_text.find(cleaned_answer_text) == -1:
        logger.warning("Could not find answer: '%s' vs. '%s'", actual_text, cleaned_answer_text)
        return None
    return _Answer(orig_answer_text, start_position, end_position, False)


# --------------------------------------------------------------------------------------------------
# Features


@dataclass
class InputFeatures:
    """One window of one example, ready for the model (the original's `InputFeatures`).

    Args:
        unique_id: the feature's id (from `FIRST_UNIQUE_ID`, one per feature); `RawResult`s refer to it.
        example_index: index of the example in the list given to `convert_examples_to_features`.
        doc_span_index: index of this window among the example's windows.
        tokens: `[CLS] query [SEP] window [SEP]` word pieces (no padding).
        token_to_orig_map: position in `tokens` -> index of the context word (window positions only).
        token_is_max_context: position in `tokens` -> whether this window is the one where that piece has
            the most context (window positions only).
        input_ids: piece ids, zero-padded to `max_seq_length` unless features are unpadded.
        input_mask: 1 for real tokens, 0 for padding.
        segment_ids: 0 for `[CLS]`, the query and the first `[SEP]`; 1 for the window and the last `[SEP]`;
            0 for padding.
        start_position: training only: position of the answer's first piece in `tokens`, or 0 (`[CLS]`) when
            the window does not contain the whole answer or the question is impossible.
        end_position: training only: the same for the answer's last piece.
        is_impossible: the example's `is_impossible`.
    """

    unique_id: int
    example_index: int
    doc_span_index: int
    tokens: list[str]
    token_to_orig_map: dict[int, int]
    token_is_max_context: dict[int, bool]
    input_ids: list[int]
    input_mask: list[int]
    segment_ids: list[int]
    start_position: int | None = None
    end_position: int | None = None
    is_impossible: bool | None = None


class DocSpan(NamedTuple):
    """A window of the tokenized document: `length` pieces from piece index `start`."""

    start: int
    length: int


def _improve_answer_span(
    doc_tokens: Sequence[str], input_start: int, input_end: int, tokenizer: Any, orig_answer_text: str
) -> tuple[int, int]:
    """The tightest piece span inside [input_start, input_end] whose pieces spell the tokenized answer.

    The annotated answer is word-aligned, but word pieces can be finer. For the question "What year was
    John Smith born?" on the context "The leader was John Smith (1895-1943).", the answer "1895" lies in the
    word "(1895-1943).", whose pieces are `( 1895 - 1943 ) .`; the original span covers all six, and this
    narrows it to `1895`. Sub-spans are tried start ascending, end descending; the first whose
    space-joined pieces equal the space-joined pieces of the answer text wins. Without a match the input
    span is returned (e.g. answer "Japan" in the word "Japanese": no piece boundary there). Mirrors
    run_squad.py, `_improve_answer_span`, line for line.
    """
    tok_answer_text = " ".join(tokenizer.tokenize(orig_answer_text))
    for new_start in range(input_start, input_end + 1):
        for new_end in range(input_end, new_start - 1, -1):
            text_span = " ".join(doc_tokens[new_start : new_end + 1])
            if text_span == tok_answer_text:
                return new_start, new_end
    return input_start, input_end


def _check_is_max_context(doc_spans: Sequence[DocSpan], cur_span_index: int, position: int) -> bool:
    """Whether `doc_spans[cur_span_index]` is the window where piece `position` has the most context.

    A piece can fall in several overlapping windows. Its score in a window is
    min(pieces to its left, pieces to its right) + 0.01 * window length: mostly the smaller side, with a
    small bonus for longer windows. The highest score wins; the first window wins ties. Mirrors
    run_squad.py, `_check_is_max_context`, line for line.
    """
    best_score = None
    best_span_index = None
    for span_index, doc_span in enumerate(doc_spans):
        end = doc_span.start + doc_span.length - 1
        if position < doc_span.start or position > end:
            continue
        num_left_context = position - doc_span.start
        num_right_context = end - position
        score = min(num_left_context, num_right_context) + 0.01 * doc_span.length
        if best_score is None or score > best_score:
            best_score = score
            best_span_index = span_index
    return cur_span_index == best_span_index


def doc_spans_for(num_doc_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[DocSpan]:
    """The sliding windows over a document, as the original builds them.

    Windows of at most `max_tokens_for_doc` pieces start at 0 and advance by min(window length,
    `doc_stride`) until one reaches the end, e.g. 20 pieces, 10 per window, stride 4 -> starts 0, 4, 8, 12
    (the last window 8 long). Mirrors, line for line, the `doc_spans` loop of run_squad.py,
    `convert_examples_to_features`.

    Args:
        num_doc_tokens: pieces in the document (no window when 0).
        max_tokens_for_doc: `max_seq_length - len(query) - 3`.
        doc_stride: pieces between window starts.
    """
    if doc_stride < 1:
        # The one check of a stride that reaches the windows: a flag's is its metadata (bert.flags), but a
        # stride can also come from a model's config.json (bert predict).
        raise InputError(f"doc_stride={doc_stride} must be at least 1")
    if max_tokens_for_doc < 1:
        raise ValueError(f"need max_tokens_for_doc >= 1, got {max_tokens_for_doc}")
    doc_spans = []
    start_offset = 0
    while start_offset < num_doc_tokens:
        length = min(num_doc_tokens - start_offset, max_tokens_for_doc)
        doc_spans.append(DocSpan(start=start_offset, length=length))
        if start_offset + length == num_doc_tokens:
            break
        start_offset += min(length, doc_stride)
    return doc_spans


def iter_features(
    examples: Sequence[SquadExample],
    tokenizer: Any,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    is_training: bool,
    pad_to_max_length: bool = True,
) -> Iterator[InputFeatures]:
    """The features of `convert_examples_to_features`, one at a time (same arguments).

    The loop over examples and windows of run_squad.py, `convert_examples_to_features`, with its steps in
    helpers: `_tokenize_document`, `_answer_piece_span`, `doc_spans_for`, `_window_tokens`, `_window_labels`.
    """
    if max_seq_length <= max_query_length + 3:
        raise InputError(
            f"max_seq_length ({max_seq_length}) must be greater than max_query_length ({max_query_length}) + 3 "
            "to leave room for the document; raise --max_seq_length or lower --max_query_length"
        )
    unique_id = FIRST_UNIQUE_ID
    for example_index, example in enumerate(examples):
        query_tokens = tokenizer.tokenize(example.question_text)
        if len(query_tokens) > max_query_length:
            query_tokens = query_tokens[0:max_query_length]
        doc = _tokenize_document(example.doc_tokens, tokenizer)
        answer_span = _answer_piece_span(example, doc, tokenizer) if is_training else None

        # The -3 accounts for [CLS], [SEP] and [SEP]. Documents longer than that are cut into
        # overlapping windows `doc_stride` pieces apart.
        max_tokens_for_doc = max_seq_length - len(query_tokens) - 3
        doc_spans = doc_spans_for(len(doc.tokens), max_tokens_for_doc, doc_stride)

        for doc_span_index, doc_span in enumerate(doc_spans):
            tokens, segment_ids, token_to_orig_map, token_is_max_context = _window_tokens(
                query_tokens, doc, doc_spans, doc_span_index
            )
            input_ids = tokenizer.convert_tokens_to_ids(tokens)
            # 1 for real tokens, 0 for padding: only real tokens are attended to.
            input_mask = [1] * len(input_ids)
            if pad_to_max_length:
                num_pad = max_seq_length - len(input_ids)
                input_ids = input_ids + [0] * num_pad
                input_mask = input_mask + [0] * num_pad
                segment_ids = segment_ids + [0] * num_pad
                assert len(input_ids) == len(input_mask) == len(segment_ids) == max_seq_length

            start_position = end_position = None
            if answer_span is not None:  # training
                start_position, end_position = _window_labels(example, answer_span, doc_span, len(query_tokens))

            feature = InputFeatures(
                unique_id=unique_id,
                example_index=example_index,
                doc_span_index=doc_span_index,
                tokens=tokens,
                token_to_orig_map=token_to_orig_map,
                token_is_max_context=token_is_max_context,
                input_ids=input_ids,
                input_mask=input_mask,
                segment_ids=segment_ids,
                start_position=start_position,
                end_position=end_position,
                is_impossible=example.is_impossible,
            )
            if example_index < 20 and logger.isEnabledFor(logging.INFO):
                _log_feature(feature, example, is_training)
            yield feature
            unique_id += 1


class _DocPieces(NamedTuple):
    """A context split into word pieces, word by word, with the maps between words and pieces."""

    tokens: list[str]  # the pieces of every word, in order
    tok_to_orig_index: list[int]  # piece -> its word
    orig_to_tok_index: list[int]  # word -> its first piece (the next word's first piece if it has none)


def _tokenize_document(doc_tokens: Sequence[str], tokenizer: Any) -> _DocPieces:
    """Tokenize each context word on its own, keeping the maps between words and pieces.

    Mirrors, line for line, the loop of run_squad.py, `convert_examples_to_features`, that builds
    `all_doc_tokens`, `tok_to_orig_index` and `orig_to_tok_index`.
    """
    tok_to_orig_index: list[int] = []
    orig_to_tok_index: list[int] = []
    all_doc_tokens: list[str] = []
    for i, token in enumerate(doc_tokens):
        orig_to_tok_index.append(len(all_doc_tokens))
        for sub_token in tokenizer.tokenize(token):
            tok_to_orig_index.append(i)
            all_doc_tokens.append(sub_token)
    return _DocPieces(all_doc_tokens, tok_to_orig_index, orig_to_tok_index)


def _answer_piece_span(example: SquadExample, doc: _DocPieces, tokenizer: Any) -> tuple[int, int]:
    """A training example's answer as (first piece, last piece) in `doc.tokens`; (-1, -1) if impossible.

    The answer words' pieces, narrowed by `_improve_answer_span`: the `tok_start_position` /
    `tok_end_position` block of run_squad.py, `convert_examples_to_features`, step for step.
    """
    if example.is_impossible:
        return -1, -1
    start, end, text = example.start_position, example.end_position, example.orig_answer_text
    if start is None or end is None or text is None:
        raise ValueError(f"question {example.qas_id} has no answer: training features need training examples")
    tok_start_position = doc.orig_to_tok_index[start]
    if end < len(example.doc_tokens) - 1:
        tok_end_position = doc.orig_to_tok_index[end + 1] - 1
    else:
        tok_end_position = len(doc.tokens) - 1
    return _improve_answer_span(doc.tokens, tok_start_position, tok_end_position, tokenizer, text)


def _window_tokens(
    query_tokens: Sequence[str], doc: _DocPieces, doc_spans: Sequence[DocSpan], doc_span_index: int
) -> tuple[list[str], list[int], dict[int, int], dict[int, bool]]:
    """One window's `[CLS] query [SEP] window [SEP]`.

    Returns its tokens, segment ids, `token_to_orig_map` and `token_is_max_context`. Mirrors, line for line,
    the start of the window loop of run_squad.py, `convert_examples_to_features`.
    """
    doc_span = doc_spans[doc_span_index]
    tokens = ["[CLS]"]
    segment_ids = [0]
    token_to_orig_map: dict[int, int] = {}
    token_is_max_context: dict[int, bool] = {}
    tokens.extend(query_tokens)
    segment_ids.extend([0] * len(query_tokens))
    tokens.append("[SEP]")
    segment_ids.append(0)
    for i in range(doc_span.length):
        split_token_index = doc_span.start + i
        token_to_orig_map[len(tokens)] = doc.tok_to_orig_index[split_token_index]
        token_is_max_context[len(tokens)] = _check_is_max_context(doc_spans, doc_span_index, split_token_index)
        tokens.append(doc.tokens[split_token_index])
        segment_ids.append(1)
    tokens.append("[SEP]")
    segment_ids.append(1)
    return tokens, segment_ids, token_to_orig_map, token_is_max_context


def _window_labels(
    example: SquadExample, answer_span: tuple[int, int], doc_span: DocSpan, num_query_tokens: int
) -> tuple[int, int]:
    """A training feature's (start_position, end_position), or (0, 0), the `[CLS]` position.

    The positions of the answer's pieces `answer_span` in the feature's tokens; (0, 0) for an impossible
    question or a window that does not hold the whole answer. The labels block of run_squad.py,
    `convert_examples_to_features`, step for step.

    The original's comment says windows without the answer are thrown out; its code keeps them, labelled
    (0, 0) even for SQuAD v1.1, and so do we, so that training sees the same windows and labels.
    """
    if example.is_impossible:
        return 0, 0
    tok_start_position, tok_end_position = answer_span
    doc_start = doc_span.start
    doc_end = doc_span.start + doc_span.length - 1
    if tok_start_position >= doc_start and tok_end_position <= doc_end:
        doc_offset = num_query_tokens + 2
        return tok_start_position - doc_start + doc_offset, tok_end_position - doc_start + doc_offset
    return 0, 0


def _log_feature(feature: InputFeatures, example: SquadExample, is_training: bool) -> None:
    """Log a feature field by field, as the original does for its first 20 examples."""
    logger.info("*** Example ***")
    logger.info("unique_id: %s", feature.unique_id)
    logger.info("example_index: %s", feature.example_index)
    logger.info("doc_span_index: %s", feature.doc_span_index)
    logger.info("tokens: %s", " ".join(feature.tokens))
    logger.info("token_to_orig_map: %s", " ".join(f"{k}:{v}" for k, v in feature.token_to_orig_map.items()))
    logger.info("token_is_max_context: %s", " ".join(f"{k}:{v}" for k, v in feature.token_is_max_context.items()))
    logger.info("input_ids: %s", " ".join(map(str, feature.input_ids)))
    logger.info("input_mask: %s", " ".join(map(str, feature.input_mask)))
    logger.info("segment_ids: %s", " ".join(map(str, feature.segment_ids)))
    if is_training and example.is_impossible:
        logger.info("impossible example")
    if is_training and not example.is_impossible:
        assert feature.start_position is not None and feature.end_position is not None  # a training feature's
        answer_text = " ".join(feature.tokens[feature.start_position : feature.end_position + 1])
        logger.info("start_position: %d", feature.start_position)
        logger.info("end_position: %d", feature.end_position)
        logger.info("answer: %s", answer_text)


def convert_examples_to_features(
    examples: Sequence[SquadExample],
    tokenizer: Any,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    is_training: bool,
    output_fn: Callable[[InputFeatures], None] | None = None,
    pad_to_max_length: bool = True,
) -> list[InputFeatures] | None:
    """Turn examples into model features: `[CLS] query [SEP] window [SEP]`, one per document window.

    The question is tokenized and cut to `max_query_length` pieces; each context word is tokenized on its
    own (`token_to_orig_map` leads back from pieces to words). The document pieces are covered by windows
    of `max_seq_length - len(query) - 3` pieces, `doc_stride` apart (`doc_spans_for`); a piece in several
    windows is "max context" only in the one where it has the most context on both sides
    (`_check_is_max_context`). For training, the answer span is narrowed to pieces (`_improve_answer_span`)
    and labelled relative to each window, or (0, 0) when the window does not contain it all.

    Args:
        examples: from `read_squad_examples`.
        tokenizer: a `FullTokenizer` (anything with `tokenize` and `convert_tokens_to_ids`).
        max_seq_length: the model's sequence length T; features are zero-padded to it.
        doc_stride: pieces between the starts of consecutive windows.
        max_query_length: the question is cut to this many pieces.
        is_training: compute `start_position` / `end_position` (needs examples read for training).
        output_fn: called with each feature, in order, instead of collecting them (the original's
            callback, for writing a file without holding every feature in memory).
        pad_to_max_length: False leaves `input_ids`, `input_mask` and `segment_ids` unpadded (length
            `len(tokens)`), for dynamic padding; everything else, ids included, is unchanged.

    Returns:
        The features in order (unique ids counting up from `FIRST_UNIQUE_ID`), or None with `output_fn`.
        An example whose context has no pieces gets no feature.

    Raises:
        InputError: `max_seq_length` too small for `max_query_length`, or `doc_stride` < 1.
    """
    features = iter_features(
        examples, tokenizer, max_seq_length, doc_stride, max_query_length, is_training, pad_to_max_length
    )
    if output_fn is None:
        return list(features)
    for feature in features:
        output_fn(feature)
    return None


# --------------------------------------------------------------------------------------------------
# Post-processing


class RawResult(NamedTuple):
    """The model's output for one feature: start and end logits over its T positions (lists or arrays)."""

    unique_id: int
    start_logits: Sequence[float]
    end_logits: Sequence[float]


class SquadPredictions(NamedTuple):
    """What `compute_predictions` returns: the contents of the three output files."""

    predictions: collections.OrderedDict  # qas_id -> answer text
    nbest: collections.OrderedDict  # qas_id -> list of {"text", "probability", "start_logit", "end_logit"}
    null_odds: collections.OrderedDict  # qas_id -> score_null - best non-null score (v2.0 only, else empty)


class _PrelimPrediction(NamedTuple):
    feature_index: int
    start_index: int
    end_index: int
    start_logit: float
    end_logit: float


class _NbestPrediction(NamedTuple):
    text: str
    start_logit: float
    end_logit: float


def _get_best_indexes(logits: Sequence[float], n_best_size: int) -> list[int]:
    """Indices of the `n_best_size` largest logits, largest first (ties: lower index first).

    run_squad.py, `_get_best_indexes` (a slice where the original has a loop over the sorted pairs).
    """
    index_and_score = sorted(enumerate(logits), key=lambda x: x[1], reverse=True)
    return [index for index, _ in index_and_score[:n_best_size]]


def _compute_softmax(scores: Sequence[float]) -> list[float]:
    """Softmax of raw scores, max-subtracted, in plain Python floats.

    run_squad.py, `_compute_softmax`: the same operations in the same order, so the same probabilities.
    """
    if not scores:
        return []
    max_score = max(scores)
    exp_scores = [math.exp(score - max_score) for score in scores]
    total_sum = 0.0
    for x in exp_scores:
        total_sum += x
    return [x / total_sum for x in exp_scores]


def _strip_spaces(text: str) -> tuple[str, dict[int, int]]:
    """`text` without " " characters, and the map from its indices back to indices of `text`."""
    ns_chars: list[str] = []
    ns_to_s_map: dict[int, int] = {}
    for i, c in enumerate(text):
        if c == " ":
            continue
        ns_to_s_map[len(ns_chars)] = i
        ns_chars.append(c)
    return "".join(ns_chars), ns_to_s_map


def get_final_text(
    pred_text: str,
    orig_text: str,
    do_lower_case: bool,
    verbose_logging: bool = False,
    basic_tokenizer: BasicTokenizer | None = None,
) -> str:
    """Project the normalized predicted text back onto the original context text.

    `pred_text` is built from word pieces, so it is lower-cased, accent-stripped and split at punctuation;
    `orig_text` is the span of context words it came from. For the prediction "steve smith" of the words
    "Steve Smith's", the answer should be "Steve Smith", not the whole span. So `orig_text` is run through
    `BasicTokenizer(do_lower_case)`, `pred_text` is found in the space-joined result, and its characters are
    mapped back through a character alignment of the two texts with spaces removed. When that fails --
    `pred_text` not found, different lengths without spaces (accents stripped from decomposed characters,
    control characters removed, ...), a position that does not map -- `orig_text` is returned whole (with
    `verbose_logging`, the reason is logged at INFO, as the original did).

    Mirrors run_squad.py, `get_final_text`, step for step; its inner `_strip_spaces` is the module's.

    Args:
        pred_text: the de-tokenized predicted pieces.
        orig_text: the original context words of the span, joined by single spaces.
        do_lower_case: the tokenizer's casing.
        verbose_logging: log why a projection failed.
        basic_tokenizer: reuse this `BasicTokenizer` (must match `do_lower_case`); default: a new one.
    """
    tokenizer = basic_tokenizer or BasicTokenizer(do_lower_case=do_lower_case)
    tok_text = " ".join(tokenizer.tokenize(orig_text))

    start_position = tok_text.find(pred_text)
    if start_position == -1:
        if verbose_logging:
            logger.info("Unable to find text: '%s' in '%s'", pred_text, orig_text)
        return orig_text
    end_position = start_position + len(pred_text) - 1

    orig_ns_text, orig_ns_to_s_map = _strip_spaces(orig_text)
    tok_ns_text, tok_ns_to_s_map = _strip_spaces(tok_text)
    if len(orig_ns_text) != len(tok_ns_text):
        if verbose_logging:
            logger.info("Length not equal after stripping spaces: '%s' vs '%s'", orig_ns_text, tok_ns_text)
        return orig_text

    # Character-to-character alignment: the two space-free texts have equal length.
    tok_s_to_ns_map = {tok_index: i for i, tok_index in tok_ns_to_s_map.items()}

    orig_start_position = None
    if start_position in tok_s_to_ns_map:
        orig_start_position = orig_ns_to_s_map.get(tok_s_to_ns_map[start_position])
    if orig_start_position is None:
        if verbose_logging:
            logger.info("Couldn't map start position")
        return orig_text

    orig_end_position = None
    if end_position in tok_s_to_ns_map:
        orig_end_position = orig_ns_to_s_map.get(tok_s_to_ns_map[end_position])
    if orig_end_position is None:
        if verbose_logging:
            logger.info("Couldn't map end position")
        return orig_text

    return orig_text[orig_start_position : orig_end_position + 1]


def _as_float_list(logits: Any) -> list[float]:
    if hasattr(logits, "tolist"):  # numpy arrays and torch tensors
        logits = logits.tolist()
    return [float(x) for x in logits]


def compute_predictions(
    all_examples: Sequence[SquadExample],
    all_features: Iterable[InputFeatures],
    all_results: Iterable[RawResult],
    n_best_size: int,
    max_answer_length: int,
    do_lower_case: bool,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
    verbose_logging: bool = False,
) -> SquadPredictions:
    """The answers and n-best lists of `write_predictions`, without writing files (same arguments).

    Per example, over all its features: the `n_best_size` best start and end positions of each feature
    are paired; a pair is kept if both positions are in the document part of the feature
    (`token_to_orig_map`), the start is max-context (the end is not checked, as in the original),
    end >= start and the span has at most `max_answer_length` pieces. For v2.0, the null score is the
    *minimum* over features of start_logit[0] + end_logit[0] and a null candidate carries it
    (`_prelim_predictions`). Candidates are sorted by start_logit + end_logit; the first `n_best_size`
    distinct texts (`get_final_text`) form the n-best list ("" for the null one; v2.0 adds "" if missing;
    "empty" with logits 0 if the list is empty; `_nbest_predictions`), with softmax probabilities over
    their scores (`_nbest_json`). The answer is the first entry (v1.1), or for v2.0 "" if
    score_null - (best non-null start + end logit) > `null_score_diff_threshold`, else the best non-null
    text; that difference goes to `null_odds`. This is the loop of run_squad.py, `write_predictions`.

    Divergence from the original, a fix (google-research/bert issues #211, #417, #476): in v2.0 mode, when
    no non-null entry is in the n-best list (only "" survives, e.g. `n_best_size=1` with the null first, or
    no valid span at all), the original dereferences None and crashes; here the answer is "" and
    `null_odds` records `NO_NON_NULL_SCORE_DIFF`. An example without features (empty context) gets "empty"
    (v1.1) or "" (v2.0) instead of the original's IndexError.

    Args:
        all_examples: the examples, in the order given to `convert_examples_to_features`.
        all_features: their features.
        all_results: one `RawResult` per feature (any order).
        n_best_size: size of the n-best lists (and of the start/end candidates per feature).
        max_answer_length: the longest answer, in word pieces.
        do_lower_case: the tokenizer's casing (for `get_final_text`).
        version_2_with_negative: SQuAD v2.0: questions may have no answer.
        null_score_diff_threshold: v2.0: answer "" when the null score beats the best span by more.
        verbose_logging: log why `get_final_text` could not project an answer.

    Raises:
        ValueError: a feature has no `RawResult`.
    """
    example_index_to_features: dict[int, list[InputFeatures]] = collections.defaultdict(list)
    for feature in all_features:
        example_index_to_features[feature.example_index].append(feature)
    unique_id_to_result = {result.unique_id: result for result in all_results}
    basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)

    all_predictions: collections.OrderedDict[str, str] = collections.OrderedDict()
    all_nbest_json: collections.OrderedDict[str, list] = collections.OrderedDict()
    scores_diff_json: collections.OrderedDict[str, float] = collections.OrderedDict()

    for example_index, example in enumerate(all_examples):
        features = example_index_to_features[example_index]
        prelim_predictions, null = _prelim_predictions(
            example, features, unique_id_to_result, n_best_size, max_answer_length, version_2_with_negative
        )
        nbest = _nbest_predictions(
            example, features, prelim_predictions, null, n_best_size, do_lower_case, verbose_logging, basic_tokenizer
        )
        nbest_json, best_non_null_entry = _nbest_json(nbest)

        if not version_2_with_negative:
            all_predictions[example.qas_id] = nbest_json[0]["text"]
        elif best_non_null_entry is None:
            # The original crashes here; no non-null candidate means "no answer".
            scores_diff_json[example.qas_id] = NO_NON_NULL_SCORE_DIFF
            all_predictions[example.qas_id] = ""
        else:
            assert null is not None  # _prelim_predictions returns one in v2.0
            # Predict "" iff the null score beats the best non-null score by more than the threshold.
            score_diff = null.score - best_non_null_entry.start_logit - best_non_null_entry.end_logit
            scores_diff_json[example.qas_id] = float(score_diff)
            if score_diff > null_score_diff_threshold:
                all_predictions[example.qas_id] = ""
            else:
                all_predictions[example.qas_id] = best_non_null_entry.text
        all_nbest_json[example.qas_id] = nbest_json

    return SquadPredictions(all_predictions, all_nbest_json, scores_diff_json)


class _NullScore(NamedTuple):
    """v2.0: the smallest null score (start + end logit at position 0) over an example's features."""

    score: float
    feature_index: int  # the feature it comes from
    start_logit: float  # its start logit at position 0
    end_logit: float  # its end logit at position 0


def _prelim_predictions(
    example: SquadExample,
    features: Sequence[InputFeatures],
    unique_id_to_result: Mapping[int, RawResult],
    n_best_size: int,
    max_answer_length: int,
    version_2_with_negative: bool,
) -> tuple[list[_PrelimPrediction], _NullScore | None]:
    """An example's candidate spans over all its features, best first, and (v2.0) its null score.

    v2.0 adds a null candidate (start = end = 0) from the feature with the smallest null score. The part of
    run_squad.py, `write_predictions`, that builds and sorts `prelim_predictions`, step for step (the pairing
    of positions is `_span_candidates`); a missing `RawResult` is a ValueError naming the feature.
    """
    prelim_predictions = []
    # The minimum null score over the example's windows; it starts "large and positive", as the original.
    null = _NullScore(score=1000000.0, feature_index=0, start_logit=0.0, end_logit=0.0)
    for feature_index, feature in enumerate(features):
        result = unique_id_to_result.get(feature.unique_id)
        if result is None:
            raise ValueError(
                f"no RawResult for feature {feature.unique_id} (question {example.qas_id}); predict on every feature"
            )
        start_logits = _as_float_list(result.start_logits)
        end_logits = _as_float_list(result.end_logits)
        if version_2_with_negative:
            feature_null_score = start_logits[0] + end_logits[0]
            if feature_null_score < null.score:
                null = _NullScore(feature_null_score, feature_index, start_logits[0], end_logits[0])
        prelim_predictions.extend(
            _span_candidates(feature, feature_index, start_logits, end_logits, n_best_size, max_answer_length)
        )

    if version_2_with_negative:
        prelim_predictions.append(
            _PrelimPrediction(
                feature_index=null.feature_index,
                start_index=0,
                end_index=0,
                start_logit=null.start_logit,
                end_logit=null.end_logit,
            )
        )
    prelim_predictions.sort(key=lambda x: x.start_logit + x.end_logit, reverse=True)
    return prelim_predictions, (null if version_2_with_negative else None)


def _span_candidates(
    feature: InputFeatures,
    feature_index: int,
    start_logits: Sequence[float],
    end_logits: Sequence[float],
    n_best_size: int,
    max_answer_length: int,
) -> list[_PrelimPrediction]:
    """The valid spans among the pairs of the feature's `n_best_size` best starts and ends, start-major.

    The double loop over `start_indexes` and `end_indexes` of run_squad.py, `write_predictions`: the same
    checks in the same order.
    """
    start_indexes = _get_best_indexes(start_logits, n_best_size)
    end_indexes = _get_best_indexes(end_logits, n_best_size)
    candidates = []
    num_tokens = len(feature.tokens)
    for start_index in start_indexes:
        for end_index in end_indexes:
            # Spans in the question, the special tokens or the padding are invalid; so are spans whose
            # start belongs to another window (max context), reversed or too long spans.
            if start_index >= num_tokens or end_index >= num_tokens:
                continue
            if start_index not in feature.token_to_orig_map or end_index not in feature.token_to_orig_map:
                continue
            if not feature.token_is_max_context.get(start_index, False):
                continue
            if end_index < start_index:
                continue
            if end_index - start_index + 1 > max_answer_length:
                continue
            candidates.append(
                _PrelimPrediction(
                    feature_index=feature_index,
                    start_index=start_index,
                    end_index=end_index,
                    start_logit=start_logits[start_index],
                    end_logit=end_logits[end_index],
                )
            )
    return candidates


def _nbest_predictions(
    example: SquadExample,
    features: Sequence[InputFeatures],
    prelim_predictions: Iterable[_PrelimPrediction],
    null: _NullScore | None,
    n_best_size: int,
    do_lower_case: bool,
    verbose_logging: bool,
    basic_tokenizer: BasicTokenizer,
) -> list[_NbestPrediction]:
    """The n-best list: the first `n_best_size` candidates with distinct texts (`_span_text`; "" for null).

    v2.0 (`null` given) appends "" if it did not make the list; an empty list gets the nonce answer "empty".
    Mirrors, line for line, the `nbest` loop of run_squad.py, `write_predictions`, and the two appends after
    it.
    """
    seen_predictions: set[str] = set()
    nbest: list[_NbestPrediction] = []
    for pred in prelim_predictions:
        if len(nbest) >= n_best_size:
            break
        if pred.start_index > 0:  # a non-null prediction
            feature = features[pred.feature_index]
            final_text = _span_text(example, feature, pred, do_lower_case, verbose_logging, basic_tokenizer)
            if final_text in seen_predictions:
                continue
        else:
            final_text = ""
        seen_predictions.add(final_text)
        nbest.append(_NbestPrediction(text=final_text, start_logit=pred.start_logit, end_logit=pred.end_logit))

    # If the null answer did not make the n-best list, add it.
    if null is not None and "" not in seen_predictions:
        nbest.append(_NbestPrediction(text="", start_logit=null.start_logit, end_logit=null.end_logit))
    # In rare cases no span is valid: a nonce prediction, as the original.
    if not nbest:
        nbest.append(_NbestPrediction(text="empty", start_logit=0.0, end_logit=0.0))
    return nbest


def _span_text(
    example: SquadExample,
    feature: InputFeatures,
    pred: _PrelimPrediction,
    do_lower_case: bool,
    verbose_logging: bool,
    basic_tokenizer: BasicTokenizer,
) -> str:
    """The answer text of a non-null span: its pieces de-tokenized, projected onto the context words.

    Mirrors, line for line, the non-null branch of the `nbest` loop of run_squad.py, `write_predictions`
    (the projection is `get_final_text`).
    """
    tok_tokens = feature.tokens[pred.start_index : pred.end_index + 1]
    orig_doc_start = feature.token_to_orig_map[pred.start_index]
    orig_doc_end = feature.token_to_orig_map[pred.end_index]
    orig_tokens = example.doc_tokens[orig_doc_start : orig_doc_end + 1]
    # De-tokenize the word pieces, then clean the whitespace.
    tok_text = " ".join(tok_tokens)
    tok_text = tok_text.replace(" ##", "")
    tok_text = tok_text.replace("##", "")
    tok_text = " ".join(tok_text.strip().split())
    orig_text = " ".join(orig_tokens)
    return get_final_text(tok_text, orig_text, do_lower_case, verbose_logging, basic_tokenizer)


def _nbest_json(nbest: Sequence[_NbestPrediction]) -> tuple[list[collections.OrderedDict], _NbestPrediction | None]:
    """The n-best list as `nbest_predictions.json` holds it, and its best non-null entry (None if none).

    Each entry gets the softmax over the entries' start + end logits as its probability. Mirrors, line for
    line, the `total_scores` and `nbest_json` loops of run_squad.py, `write_predictions`.
    """
    total_scores = []
    best_non_null_entry = None
    for entry in nbest:
        total_scores.append(entry.start_logit + entry.end_logit)
        if best_non_null_entry is None and entry.text:
            best_non_null_entry = entry
    probs = _compute_softmax(total_scores)

    nbest_json = []
    for i, entry in enumerate(nbest):
        output: collections.OrderedDict[str, Any] = collections.OrderedDict()
        output["text"] = entry.text
        output["probability"] = probs[i]
        output["start_logit"] = float(entry.start_logit)
        output["end_logit"] = float(entry.end_logit)
        nbest_json.append(output)
    return nbest_json, best_non_null_entry


def _write_json(path: str | os.PathLike, obj: Mapping) -> None:
    # The original's layout: json.dumps(indent=4) (ASCII escapes) plus a newline.
    with atomic_write(path) as f:
        f.write(json.dumps(obj, indent=4) + "\n")


def write_predictions(
    all_examples: Sequence[SquadExample],
    all_features: Iterable[InputFeatures],
    all_results: Iterable[RawResult],
    n_best_size: int,
    max_answer_length: int,
    do_lower_case: bool,
    output_prediction_file: str | os.PathLike | None,
    output_nbest_file: str | os.PathLike | None,
    output_null_log_odds_file: str | os.PathLike | None,
    version_2_with_negative: bool = False,
    null_score_diff_threshold: float = 0.0,
    verbose_logging: bool = False,
) -> collections.OrderedDict:
    """Write `predictions.json`, `nbest_predictions.json` and (v2.0) `null_odds.json`; return the answers.

    The rules are `compute_predictions`'s (including its one divergence from the original: no crash in
    v2.0 when the n-best list has no non-null answer). Each file is `json.dumps(..., indent=4)` plus a
    newline, written atomically; a path of None skips that file.

    Args:
        all_examples: the examples, in the order given to `convert_examples_to_features`.
        all_features: their features.
        all_results: one `RawResult` per feature (any order).
        n_best_size: size of the n-best lists (and of the start/end candidates per feature).
        max_answer_length: the longest answer, in word pieces.
        do_lower_case: the tokenizer's casing (for `get_final_text`).
        output_prediction_file: path of `predictions.json` (qas_id -> answer text).
        output_nbest_file: path of `nbest_predictions.json` (qas_id -> list of
            {"text", "probability", "start_logit", "end_logit"}).
        output_null_log_odds_file: path of `null_odds.json` (qas_id -> score_null - best non-null score);
            written for v2.0 only.
        version_2_with_negative: SQuAD v2.0: questions may have no answer.
        null_score_diff_threshold: v2.0: answer "" when the null score beats the best span by more.
        verbose_logging: log why `get_final_text` could not project an answer.

    Returns:
        The answers: qas_id -> text, in example order.
    """
    result = compute_predictions(
        all_examples,
        all_features,
        all_results,
        n_best_size,
        max_answer_length,
        do_lower_case,
        version_2_with_negative,
        null_score_diff_threshold,
        verbose_logging,
    )
    if output_prediction_file is not None:
        logger.info("Writing predictions to: %s", output_prediction_file)
        _write_json(output_prediction_file, result.predictions)
    if output_nbest_file is not None:
        logger.info("Writing nbest to: %s", output_nbest_file)
        _write_json(output_nbest_file, result.nbest)
    if version_2_with_negative and output_null_log_odds_file is not None:
        _write_json(output_null_log_odds_file, result.null_odds)
    return result.predictions


# --------------------------------------------------------------------------------------------------
# The fine-tuning task (`bert squad`)

# The seed run_squad.py shuffles the training examples with, before making features.
TRAIN_SHUFFLE_SEED = 12345
PREDICTIONS_NAME = "predictions.json"
NBEST_NAME = "nbest_predictions.json"
NULL_ODDS_NAME = "null_odds.json"
NO_EVAL = "run_squad.py has no eval mode: --do_predict on a file with answers evaluates. Not a flag of bert squad."


def gold_dataset(dataset_json: dict, version_2_with_negative: bool, source: str) -> list | None:
    """The `data` list to evaluate predictions against, or None when the file holds no gold answers.

    A file is a dev file when its questions have `answers` lists (v1.1: not all empty; v2.0: some
    non-empty or an `is_impossible` field). The answers are checked here, before any work, so that the
    evaluation after predicting cannot fail on them.

    Raises:
        InputError: only some questions have answers, an answer has no text, or (v1.1) a question has an
            empty answer list.
    """

    questions = [
        qa for article in dataset_json["data"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]
    ]
    with_answers = [qa for qa in questions if "answers" in qa]
    if not with_answers:
        return None
    if len(with_answers) != len(questions):
        missing = next(qa["id"] for qa in questions if "answers" not in qa)
        raise InputError(
            f'{source}: {len(questions) - len(with_answers)} of {len(questions)} questions have no "answers" list '
            f"(first: {missing}); give every question its answers ([] for none) or none of them"
        )
    answered = any(isinstance(qa["answers"], list) and qa["answers"] for qa in questions)
    if not answered and not (version_2_with_negative and any("is_impossible" in qa for qa in questions)):
        return None  # a test file with empty answer lists
    for qa in iter_questions(dataset_json["data"], source):
        if not qa["answers"] and not version_2_with_negative:
            raise InputError(
                f"{source}: question {qa['id']} has no gold answer, which SQuAD v1.1 cannot score; "
                "pass --version_2_with_negative=true for a v2.0 file"
            )
    version = str(dataset_json.get("version", "")).lstrip("vV")
    if version[:1] in ("1", "2") and (version[:1] == "2") != version_2_with_negative:
        logger.warning("%s says version %s but --version_2_with_negative=%s", source, version, version_2_with_negative)
    return dataset_json["data"]


def evaluate_predictions(
    output_dir: Path, dataset: list, predictions: dict[str, str], version_2_with_negative: bool
) -> dict[str, Any]:
    """Score `predictions` with the official v1.1 or v2.0 evaluation (v2.0: `null_odds.json` of `output_dir`
    as the no-answer probabilities) and write `eval_results.json` and `eval_results.txt`."""

    if version_2_with_negative:
        null_odds = json.loads((output_dir / NULL_ODDS_NAME).read_text(encoding="utf-8"))
        result = dict(evaluate_v2(dataset, predictions, na_probs=null_odds))
    else:
        result = evaluate_v1(dataset, predictions)
    write_results(output_dir, result, as_float32=False)
    return result


def questions_of(dataset: list, qids: Collection[str]) -> list:
    """`dataset` (a SQuAD file's "data") with only the questions `qids` names: what a `--max_eval_examples` run,
    which predicts the file's first questions, is scored on."""
    return [
        {
            **article,
            "paragraphs": [{**p, "qas": [qa for qa in p["qas"] if qa["id"] in qids]} for p in article["paragraphs"]],
        }
        for article in dataset
    ]


class SquadTask(FinetuneTask):
    """Start and end positions of the answer in doc-stride windows (`bert squad`).

    A batch's labels are `start_positions` and `end_positions` (0, 0 when the window does not hold the
    answer, and in prediction); the head masks each window's padding out of the loss.

    Args:
        args: the flags of `bert squad` (`train_file`, `predict_file`, `version_2_with_negative`,
            `doc_stride`, `max_query_length`, `n_best_size`, `max_answer_length`, `do_lower_case`,
            `null_score_diff_threshold`, `verbose_logging`).
    """

    command = "squad"
    head = "BertForQuestionAnswering"
    # run_squad.py has no eval mode: predicting a file with answers scores it (f1: both versions' key).
    default_metric = "f1"
    dev_flag = "do_predict"

    def __init__(self, args: SquadArgs):
        self.args = args
        self.gold: list | None = None  # the predict file's `data` list when it has answers
        self.eval_results: dict[str, Any] | None = None

    def read_examples(self, split: str) -> list:
        a = self.args
        if split == "train":
            assert a.train_file is not None  # `bert squad` refuses --do_train without it
            data = load_json_file(a.train_file, "--train_file")
            examples = squad_examples_from_json(data, True, a.version_2_with_negative, source=a.train_file)
            if not examples:
                raise InputError(f"--train_file={a.train_file} holds no usable questions; give a SQuAD training file")
            # As run_squad.py: shuffle the examples (not the windows) before making features.
            random.Random(TRAIN_SHUFFLE_SEED).shuffle(examples)
            return examples
        if split == "test":
            assert a.predict_file is not None  # `bert squad` refuses --do_predict without it
            data = load_json_file(a.predict_file, "--predict_file")
            examples = squad_examples_from_json(data, False, a.version_2_with_negative, source=a.predict_file)
            self.gold = gold_dataset(data, a.version_2_with_negative, a.predict_file)
            return examples
        raise InputError(NO_EVAL)

    def read_unlabelled(self, path: str) -> list:
        """A SQuAD JSON file's questions read as for prediction: answers, if any, are not read."""
        a = self.args
        data = load_json_file(path, "--transfer_file")
        examples = squad_examples_from_json(data, False, a.version_2_with_negative, source=path)
        if not examples:
            raise InputError(f"--transfer_file={path} holds no questions; give a SQuAD file of questions and contexts")
        return examples

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:
        # Training examples carry answer positions (-1 for impossible ones); prediction examples none.
        is_training = any(ex.start_position is not None for ex in examples)
        a = self.args
        features = list(
            iter_features(examples, tokenizer, max_seq_length, a.doc_stride, a.max_query_length, is_training, pad)
        )
        logger.info(
            "%d %s examples -> %d features", len(examples), "training" if is_training else "predict", len(features)
        )
        return features

    def feature_length(self, feature) -> int:
        return len(feature.tokens)

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:
        return {
            "input_ids": pad_2d([f.input_ids for f in features], pad_to),
            "attention_mask": pad_2d([f.input_mask for f in features], pad_to),
            "token_type_ids": pad_2d([f.segment_ids for f in features], pad_to),
            "start_positions": np.array([f.start_position or 0 for f in features], dtype=np.int64),
            "end_positions": np.array([f.end_position or 0 for f in features], dtype=np.int64),
        }

    def feature_outputs(self, logits: np.ndarray, batch: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The [n, 2] start/end logits of each window's n real positions."""
        lengths = batch["attention_mask"].sum(-1).tolist()
        return [logits[i, :n].copy() for i, n in enumerate(lengths)]

    def inference_config(self) -> dict[str, Any]:
        a = self.args
        keys = ("doc_stride", "max_query_length", "n_best_size", "max_answer_length", "version_2_with_negative")
        return {**{k: getattr(a, k) for k in keys}, "null_score_diff_threshold": a.null_score_diff_threshold}

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:
        raise InputError(NO_EVAL)

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:
        """The three prediction files and, for a file with answers, the official evaluation."""

        a = self.args
        results = [RawResult(f.unique_id, out[:, 0], out[:, 1]) for f, out in zip(features, outputs)]
        files = {"predictions": output_dir / PREDICTIONS_NAME, "nbest_predictions": output_dir / NBEST_NAME}
        if a.version_2_with_negative:
            files["null_odds"] = output_dir / NULL_ODDS_NAME
        predictions = write_predictions(
            examples,
            features,
            results,
            a.n_best_size,
            a.max_answer_length,
            a.do_lower_case,
            files["predictions"],
            files["nbest_predictions"],
            files.get("null_odds"),
            version_2_with_negative=a.version_2_with_negative,
            null_score_diff_threshold=a.null_score_diff_threshold,
            verbose_logging=a.verbose_logging,
        )
        out: dict[str, Any] = {k: str(v) for k, v in files.items()}
        out["num_examples"] = len(examples)
        out["num_features"] = len(features)
        if self.gold is not None:
            gold = questions_of(self.gold, predictions) if a.max_eval_examples else self.gold
            self.eval_results = evaluate_predictions(output_dir, gold, predictions, a.version_2_with_negative)
            out["eval"] = self.eval_results
        else:
            logger.info("%s has no gold answers: not evaluated", a.predict_file)
        return out
