"""Using embeddings: quantizing them, reading corpora and queries, and exact top-k search in bounded memory.

- `quantize_embeddings` lowers float vectors to int8, uint8 or packed bits with the rules
  sentence-transformers' `quantize_embeddings` uses, so `bert embed --precision` gives what its
  `encode(precision=...)` gives: int8/uint8 cut each dimension's range (its minimum and maximum over the
  embeddings, `Calibration`) into 255 equal steps; binary/ubinary keep the sign bit of each
  component, eight to a byte.
- `read_texts` reads a corpus or a query file with ids: plain text lines, JSON lines {"text"}, or BEIR's
  `corpus.jsonl` / `queries.jsonl` ({"_id", "title", "text"}), each line as `bert embed` reads it.
- `TopK` keeps the best `k` corpus rows for each query while the corpus goes past in chunks, so a search
  holds one chunk of vectors and a [queries, chunk] block of scores at a time, never the whole matrix.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bert.errors import InputError
from bert.flags import EMBEDDING_PRECISIONS
from bert.inference import EMBEDDINGS
from bert.input_lines import read_input_record
from bert.request_rules import check_top_k
from bert.utils import iter_lines

logger = logging.getLogger(__name__)

# Fewer embeddings than this give unstable int8/uint8 ranges (sentence-transformers warns at the same count).
FEW_FOR_RANGES = 100


def quantized_shape(num_rows: int, dim: int, precision: str) -> tuple[tuple[int, int], np.dtype]:
    """(shape, dtype) of `num_rows` vectors of `dim` components at `precision`."""
    if precision not in EMBEDDING_PRECISIONS:
        raise InputError(f"precision={precision!r} must be one of {', '.join(EMBEDDING_PRECISIONS)}")
    if precision == "float32":
        return (num_rows, dim), np.dtype("<f4")
    width = (dim + 7) // 8 if precision.endswith("binary") else dim
    return (num_rows, width), np.dtype(np.uint8 if precision.startswith("u") else np.int8)


class Calibration:
    """Each dimension's minimum and maximum over embeddings seen in chunks: the int8/uint8 ranges."""

    def __init__(self) -> None:
        self.count = 0
        self.lows: np.ndarray | None = None
        self.highs: np.ndarray | None = None

    def add(self, embeddings: np.ndarray) -> Calibration:
        """Take in `embeddings` [N, D] (in any number of chunks: minimum and maximum are exact either way)."""
        x = np.asarray(embeddings, dtype=np.float32)
        if len(x):
            lows, highs = x.min(axis=0), x.max(axis=0)
            self.lows = lows if self.lows is None else np.minimum(self.lows, lows)
            self.highs = highs if self.highs is None else np.maximum(self.highs, highs)
        self.count += len(x)
        return self

    def ranges(self) -> np.ndarray:
        """[2, D]: the minima (row 0) and maxima (row 1)."""
        if self.count < 2 or self.lows is None or self.highs is None:
            raise InputError(
                f"int8/uint8 ranges need at least two embeddings to calibrate on, got {self.count}; "
                "embed more texts at once"
            )
        if self.count < FEW_FOR_RANGES:
            logger.warning("int8/uint8 ranges from only %d embeddings; they are steadier from more", self.count)
        return np.stack([self.lows, self.highs])


def quantize_embeddings(embeddings: np.ndarray, precision: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """`embeddings` [N, D] (float) at `precision` (see the module docstring); `ranges` [2, D] for int8/uint8
    (default: the `Calibration` of `embeddings` themselves). Shape and dtype as `quantized_shape` says."""
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be [N, D], got shape {x.shape}")
    (n, _), dtype = quantized_shape(x.shape[0], x.shape[1], precision)
    if precision == "float32":
        return x
    if precision.endswith("binary"):
        packed = np.packbits(x > 0, axis=-1)  # [N, ceil(D / 8)] uint8, the first component the high bit
        return packed if precision == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    if n == 0:
        return np.zeros(x.shape, dtype=dtype)
    lows, highs = np.asarray(Calibration().add(x).ranges() if ranges is None else ranges, dtype=np.float32)
    steps = (highs - lows) / 255
    steps[steps == 0] = 1  # a constant dimension: every value in step 0
    buckets = np.clip(np.floor((x - lows) / steps), 0, 255)
    return buckets.astype(np.uint8) if precision == "uint8" else (buckets - 128).astype(np.int8)


def read_texts(path: str, name: str) -> Iterator[tuple[str, str]]:
    """(id, text) per line of `path` (`name` in errors), each line read as `bert embed` reads it
    (`bert.input_lines.read_input_record`), so row i of `bert embed`'s vectors of the file is record i here;
    the id is a JSON line's "_id" (or "id"), else the 0-based record number."""
    hint = "the text through `iconv -c -f utf-8 -t utf-8`"
    for index, line in enumerate(iter_lines(path, "utf-8-sig", "strict", hint=hint, name=name)):
        line = line[:-1] if line.endswith("\r") else line
        try:
            text = read_input_record(line, EMBEDDINGS)
        except InputError as e:
            raise InputError(f"{name} line {index + 1}: {e}") from None
        key: Any = index
        if line.lstrip().startswith("{"):
            record = json.loads(line)
            key = record.get("_id", record.get("id", index))
        yield str(key), text


class TopK:
    """The `k` best-scoring corpus rows for each of a set of queries, by cosine similarity, exact.

    Feed the corpus in order with `add(chunk)`; `result()` gives, per query, [(corpus row, score), ...]
    best first (equal scores: the earlier row first). Memory: the queries, their running top k, and the
    scores of `query_block` queries against one chunk at a time.
    """

    def __init__(self, queries: np.ndarray, k: int, query_block: int = 256):
        check_top_k(k)
        self.k = k
        self.query_block = query_block
        self.queries = F.normalize(torch.from_numpy(np.asarray(queries, dtype=np.float32)), dim=1)  # [Q, D]
        self.scores = torch.full((len(self.queries), 0), -torch.inf)  # [Q, <=k]
        self.rows = torch.zeros((len(self.queries), 0), dtype=torch.int64)  # [Q, <=k]
        self.seen = 0

    def add(self, chunk: np.ndarray) -> None:
        """The next `len(chunk)` corpus vectors [C, D]."""
        corpus = torch.from_numpy(np.array(chunk, dtype=np.float32))  # a copy: `chunk` may be a read-only memmap
        if corpus.ndim != 2 or corpus.shape[1] != self.queries.shape[1]:
            raise InputError(
                f"corpus vectors of shape {tuple(corpus.shape)} do not match the queries' {self.queries.shape[1]} "
                "dimensions; embed the corpus and the queries with the same model and --dimensions"
            )
        corpus = F.normalize(corpus, dim=1)
        rows = torch.arange(self.seen, self.seen + len(corpus))  # [C]
        self.seen += len(corpus)
        kept_scores, kept_rows = [], []
        for start in range(0, len(self.queries), self.query_block):
            block = slice(start, start + self.query_block)
            new = self.queries[block] @ corpus.T  # [B, C]
            if new.shape[1] > self.k:
                # Only the chunk's rows that reach some query's k-th best score (ties included) can enter a top
                # k: sorting those instead of the whole chunk gives the same result several times faster.
                kth = torch.topk(new, self.k, dim=1).values[:, -1:]  # [B, 1]
                reaching = (new >= kth).any(0).nonzero().squeeze(1)  # [C'] ascending: the rows' order kept
                new, chunk_rows = new[:, reaching], rows[reaching]
            else:
                chunk_rows = rows
            scores = torch.cat([self.scores[block], new], dim=1)  # [B, k + C']
            candidates = torch.cat([self.rows[block], chunk_rows.expand(len(scores), -1)], dim=1)  # [B, k + C']
            # A stable sort on the score alone keeps earlier rows first among equals (they come first here).
            order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, : self.k]
            kept_scores.append(scores.gather(1, order))
            kept_rows.append(candidates.gather(1, order))
        if kept_scores:
            self.scores, self.rows = torch.cat(kept_scores), torch.cat(kept_rows)

    def result(self) -> list[list[tuple[int, float]]]:
        return [list(zip(r.tolist(), s.tolist())) for r, s in zip(self.rows, self.scores)]


__all__ = [
    "Calibration",
    "TopK",
    "quantize_embeddings",
    "quantized_shape",
    "read_texts",
]
