"""Late chunking (`bert embed --late_chunking`): a document is encoded once and its chunks' vectors are the
means of the last layer over each chunk's tokens, so that every chunk's vector was computed with its context in
view (rather than each chunk encoded alone).

The chunks are runs of `chunk_size` word pieces of the text, each starting `chunk_size - chunk_overlap` pieces after
the one before; the first also takes [CLS] (and the prompt's tokens), the last [SEP], so that without overlap the
chunks partition the sequence, and a document of one chunk gets its mean embedding, the vector `bert embed` gives
it without late chunking. Or the chunks are whole sentences (a sentence splitter's), as many as fit in
`chunk_size` pieces, a sentence longer than that cut by pieces. Each chunk also names the characters of the text
it holds (its first piece's start to its last piece's end, `FullTokenizer.tokenize_with_offsets`), so that a
search hit can show its text.

A document longer than `max_seq_length` is read whole in windows `doc_stride` pieces apart (run_squad.py's
`doc_spans`, each window with the head and the tail: [CLS], the prompt, [SEP]); each piece's vector is the one of
the window where it has the most context (run_squad.py's `_check_is_max_context`), so no chunk is cut and each
sees up to a window of context.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bert.errors import InputError
from bert.tasks.squad import DocSpan, doc_spans_for

if TYPE_CHECKING:
    from bert.inference import Predictor


def check_chunk_overlap(chunk_size: int, chunk_overlap: int, dashes: str = "") -> None:
    """Each chunk starts after the one before: 0 <= chunk_overlap < chunk_size (`dashes`: "--" for flags).

    Raises:
        InputError: it does not.
    """
    if not 0 <= chunk_overlap < chunk_size:
        raise InputError(
            f"{dashes}chunk_overlap={chunk_overlap} must be at least 0 and less than {dashes}chunk_size={chunk_size} "
            "(a chunk must start after the one before); lower it"
        )


def chunk_spans(length: int, content_start: int, chunk_size: int, chunk_overlap: int = 0) -> list[range]:
    """The token positions of each chunk of a sequence of `length` tokens whose text starts at `content_start`
    (after [CLS] and the prompt) and ends before its last token ([SEP]): `chunk_size` text tokens a chunk,
    each starting `chunk_size - chunk_overlap` tokens after the one before, until one reaches the text's end;
    the first chunk from position 0, the last to the end."""
    check_chunk_overlap(chunk_size, chunk_overlap)
    content_stop = length - 1
    starts = [content_start]
    while starts[-1] + chunk_size < content_stop:
        starts.append(starts[-1] + chunk_size - chunk_overlap)
    spans = [range(start, min(start + chunk_size, content_stop)) for start in starts]
    spans[0] = range(0, spans[0].stop)
    spans[-1] = range(spans[-1].start, length)
    return spans


def sentence_chunk_spans(
    length: int, content_start: int, chunk_size: int, sentence_starts: Sequence[int]
) -> list[range]:
    """As `chunk_spans`, but each chunk is whole sentences, as many as fit in `chunk_size` text tokens (a
    sentence longer than that is cut every `chunk_size` tokens); `sentence_starts`: the text token (0 the
    first) where each sentence starts, ascending."""
    content_stop = length - 1
    bounds = sorted({content_start + t for t in sentence_starts if 0 < t < content_stop - content_start})
    bounds.append(content_stop)
    spans, start = [], content_start
    while start < content_stop:
        reach = bisect.bisect_right(bounds, start + chunk_size)  # the bounds up to start + chunk_size
        stop = bounds[reach - 1] if reach and bounds[reach - 1] > start else start + chunk_size
        spans.append(range(start, stop))
        start = stop
    if not spans:  # a text without pieces
        return [range(0, length)]
    spans[0] = range(0, spans[0].stop)
    spans[-1] = range(spans[-1].start, length)
    return spans


def _sentence_starts(text: str, sentences: list[str], offsets: Sequence[tuple[int, int]]) -> list[int]:
    """The text token where each of `sentences` (a splitter's, in order) starts. A splitter may change the
    white space between words, so a sentence is found by counting the other characters."""
    visible = [i for i, c in enumerate(text) if not c.isspace()]
    starts, seen = [], 0
    for sentence in sentences:
        if seen < len(visible):
            starts.append(visible[seen])
        seen += sum(not c.isspace() for c in sentence)
    token_starts = [a for a, _ in offsets]
    return sorted({bisect.bisect_left(token_starts, c) for c in starts})


def _max_context_windows(spans: Sequence[DocSpan], length: int) -> np.ndarray:
    """For each of `length` pieces, the window where it has the most context: run_squad.py's
    `_check_is_max_context` score, min(pieces left, pieces right) + 0.01 x window length, the first window on
    ties; one pass over the windows instead of one per piece."""
    best = np.full(length, -np.inf)
    owner = np.zeros(length, dtype=np.int64)
    for k, span in enumerate(spans):
        positions = np.arange(span.start, span.start + span.length)
        score = np.minimum(positions - span.start, span.start + span.length - 1 - positions) + 0.01 * span.length
        better = score > best[positions]
        best[positions[better]] = score[better]
        owner[positions[better]] = k
    return owner


def whole_token_vectors(
    predictor: Predictor, parts: Sequence[tuple[list[int], list[int], list[int]]], doc_stride: int
) -> list[np.ndarray]:
    """Per input (head, body, tail ids: `Predictor.embedding_parts`), the last layer's vector of every token of
    the uncut sequence [len(head + body + tail), hidden]: one pass where it fits the model, else the windows of
    the module docstring, the head's vectors from the first window and the tail's from the last."""
    sequences: list[list[int]] = []
    plans = []
    for head, body, tail in parts:
        room = predictor.max_seq_length - len(head) - len(tail)
        spans = doc_spans_for(len(body), room, doc_stride) if len(body) > room else [DocSpan(0, len(body))]
        plans.append((len(sequences), spans))
        sequences += [[*head, *body[span.start : span.start + span.length], *tail] for span in spans]
    hidden = predictor.token_embeddings(sequences)  # token-id inputs: each runs as given, nothing added or cut
    out = []
    for (head, body, tail), (first, spans) in zip(parts, plans):
        windows = hidden[first : first + len(spans)]
        owner = _max_context_windows(spans, len(body))
        rows = np.empty((len(body), windows[0].shape[1]), dtype=windows[0].dtype)
        for k, span in enumerate(spans):
            mine = np.flatnonzero(owner == k)
            rows[mine] = windows[k][len(head) + mine - span.start]
        last = windows[-1]
        out.append(np.concatenate([windows[0][: len(head)], rows, last[len(last) - len(tail) :]]))
    return out


@dataclass(frozen=True)
class LateChunks:
    """One text's chunks: their vectors [chunks, dimensions] and the characters of the text each holds,
    (start, stop) with stop exclusive (the whole text for a text without word pieces)."""

    vectors: np.ndarray
    spans: list[tuple[int, int]]


def late_chunk_embeddings(
    predictor: Predictor,
    texts: Sequence[str],
    chunk_size: int,
    *,
    normalize: bool,
    chunk_overlap: int = 0,
    sentences: Callable[[str], list[str]] | None = None,
    dimensions: int | None = None,
    prompt_name: str | None = None,
    prompt: str | None = None,
    doc_stride: int | None = None,
) -> list[LateChunks]:
    """Per text, its chunks (`chunk_spans`, or with a `sentences` splitter `sentence_chunk_spans`, over the
    whole text: `whole_token_vectors`, windows `doc_stride` pieces apart, default the model's): float32
    [chunks, dimensions or hidden_size], the mean of the last layer over each chunk's tokens, cut to
    `dimensions`, then scaled to unit length when `normalize` (a zero vector stays zero); and each chunk's
    characters of the text."""
    resolved = predictor.resolve_prompt(prompt_name, prompt)
    parts, prompt_lengths = predictor.embedding_parts(texts, prompt=resolved)
    # The prompt's pieces join the head, so that every window carries the prompt.
    moved = [max(0, n - len(head)) for (head, _, _), n in zip(parts, prompt_lengths)]
    parts = [([*head, *body[:m]], body[m:], tail) for (head, body, tail), m in zip(parts, moved)]
    tokens = whole_token_vectors(predictor, parts, doc_stride or predictor.doc_stride)
    out = []
    for text, hidden, prompt_length in zip(texts, tokens, prompt_lengths):
        content_start = max(1, prompt_length)
        offsets = _text_offsets(predictor, resolved or "", text, content_start, len(hidden) - 1)
        if sentences is None:
            spans = chunk_spans(len(hidden), content_start, chunk_size, chunk_overlap)
        else:
            starts = _sentence_starts(text, sentences(text), offsets)
            spans = sentence_chunk_spans(len(hidden), content_start, chunk_size, starts)
        vectors = np.stack([hidden[span.start : span.stop].mean(axis=0) for span in spans])[:, :dimensions]
        if normalize:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        characters = _character_spans(offsets, len(text), spans, content_start)
        out.append(LateChunks(vectors.astype(np.float32, copy=False), characters))
    return out


def _text_offsets(
    predictor: Predictor, prompt: str, text: str, content_start: int, content_stop: int
) -> list[tuple[int, int]]:
    """Each text piece's (start, stop) in `text`. The pieces are those of prompt + text, as `embedding_parts`
    encodes them; the prompt's are left out."""
    pieces = predictor.tokenizer.tokenize_with_offsets(prompt + text)
    # A prompt not ending a word joins the text's first word: that piece's start is clipped to the text's.
    offsets = [(max(0, a - len(prompt)), max(0, b - len(prompt))) for _, _, a, b in pieces[content_start - 1 :]]
    assert len(offsets) == content_stop - content_start, "the offsets' pieces must be the encoded pieces"
    return offsets


def _character_spans(
    offsets: list[tuple[int, int]], text_length: int, spans: list[range], content_start: int
) -> list[tuple[int, int]]:
    """Each chunk's (start, stop) in the text: from its first text piece's start to its last one's end."""
    out = []
    for span in spans:
        first, last = max(span.start, content_start), min(span.stop, content_start + len(offsets)) - 1
        found = first <= last
        out.append((offsets[first - content_start][0], offsets[last - content_start][1]) if found else (0, text_length))
    return out
