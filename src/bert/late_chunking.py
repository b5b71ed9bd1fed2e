"""Late chunking (`bert embed --late_chunking`): a document is encoded once, up to `max_seq_length` tokens, and
its chunks' vectors are the means of the last layer over each chunk's tokens, so that every chunk's vector was
computed with the whole document in view (rather than each chunk encoded alone).

The chunks are consecutive runs of `chunk_size` word pieces of the text; the first also takes [CLS] (and the
prompt's tokens), the last [SEP], so the chunks partition the sequence and a document of one chunk gets its mean
embedding, the vector `bert embed` gives it without late chunking. Tokens past `max_seq_length` are cut, as
`bert embed` cuts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

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


def late_chunk_embeddings(
    predictor: Predictor,
    texts: Sequence[str],
    chunk_size: int,
    *,
    normalize: bool,
    dimensions: int | None = None,
    prompt_name: str | None = None,
    prompt: str | None = None,
) -> list[np.ndarray]:
    """Per text, float32 [chunks, dimensions or hidden_size]: the mean of the last layer over each chunk's tokens
    (`chunk_spans`), cut to `dimensions`, then scaled to unit length when `normalize` (a zero vector stays zero)."""
    resolved = predictor.resolve_prompt(prompt_name, prompt)
    _, prompt_lengths = predictor.embedding_sequences(texts, prompt=resolved)
    tokens = predictor.token_embeddings(texts, prompt_name=prompt_name, prompt=prompt)
    out = []
    for hidden, prompt_length in zip(tokens, prompt_lengths):
        spans = chunk_spans(len(hidden), max(1, prompt_length), chunk_size)
        vectors = np.stack([hidden[span.start : span.stop].mean(axis=0) for span in spans])[:, :dimensions]
        if normalize:
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        out.append(vectors.astype(np.float32, copy=False))
    return out
