"""Late chunking (`bert embed --late_chunking`): a document is encoded once and its chunks' vectors are the
means of the last layer over each chunk's tokens, so that every chunk's vector was computed with its context in
view (rather than each chunk encoded alone).

The chunks are consecutive runs of `chunk_size` word pieces of the text; the first also takes [CLS] (and the
prompt's tokens), the last [SEP], so the chunks partition the sequence and a document of one chunk gets its mean
embedding, the vector `bert embed` gives it without late chunking. A document longer than `max_seq_length` is
read whole in windows `doc_stride` pieces apart (run_squad.py's `doc_spans`, each window with the head and the
tail: [CLS], the prompt, [SEP]); each piece's vector is the one of the window where it has the most context
(run_squad.py's `_check_is_max_context`), so no chunk is cut and each sees up to a window of context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from bert.tasks.squad import DocSpan, doc_spans_for

if TYPE_CHECKING:
    from bert.inference import Predictor


def chunk_spans(length: int, content_start: int, chunk_size: int) -> list[range]:
    """The token positions of each chunk of a sequence of `length` tokens whose text starts at `content_start`
    (after [CLS] and the prompt) and ends before its last token ([SEP]): `chunk_size` text tokens a chunk, the
    first chunk from position 0, the last to the end."""
    content_stop = length - 1
    starts = list(range(content_start, content_stop, chunk_size)) or [content_start]
    bounds = [0, *starts[1:], length]
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


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


def late_chunk_embeddings(
    predictor: Predictor,
    texts: Sequence[str],
    chunk_size: int,
    *,
    normalize: bool,
    dimensions: int | None = None,
    prompt_name: str | None = None,
    prompt: str | None = None,
    doc_stride: int | None = None,
) -> list[np.ndarray]:
    """Per text, float32 [chunks, dimensions or hidden_size]: the mean of the last layer over each chunk's tokens
    (`chunk_spans`, over the whole text: `whole_token_vectors`, windows `doc_stride` pieces apart, default the
    model's), cut to `dimensions`, then scaled to unit length when `normalize` (a zero vector stays zero)."""
    resolved = predictor.resolve_prompt(prompt_name, prompt)
    parts, prompt_lengths = predictor.embedding_parts(texts, prompt=resolved)
    # The prompt's pieces join the head, so that every window carries the prompt.
    moved = [max(0, n - len(head)) for (head, _, _), n in zip(parts, prompt_lengths)]
    parts = [([*head, *body[:m]], body[m:], tail) for (head, body, tail), m in zip(parts, moved)]
    tokens = whole_token_vectors(predictor, parts, doc_stride or predictor.doc_stride)
    out = []
    for hidden, prompt_length in zip(tokens, prompt_lengths):
        spans = chunk_spans(len(hidden), max(1, prompt_length), chunk_size)
        vectors = np.stack([hidden[span.start : span.stop].mean(axis=0) for span in spans])[:, :dimensions]
        if normalize:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        out.append(vectors.astype(np.float32, copy=False))
    return out
