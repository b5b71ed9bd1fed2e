"""`bert create-pretraining-data`: documents -> masked-LM + next-sentence instances -> shard files.

Reference: google-research/bert `create_pretraining_data.py` @ eedf571 (spec §4). Two generators:

- **compat** (the default with one worker): the original algorithm, line for line, drawing from one
  `random.Random(random_seed)` in the original's order, so a given seed writes the same records as the
  original (tested against its output). Like the original it holds the whole corpus and every instance
  in memory, and it uses the original's quirks (spec §11 rows 15-16): `target_seq_length` drawn per
  document, a random "next" segment that may come from the same document, random replacements that may
  be special tokens, `num_to_predict` counting `[CLS]`/`[SEP]` with Python's `round`, whole-word groups
  that join a `##` piece across `[SEP]`, label 1 = random next.
- **streaming** (`--streaming` or `--num_workers > 1`): the same algorithm in bounded memory. The main
  process reads documents and deals them at random into a few buffers of `--streaming_buffer_mb` of text
  (a shuffle window); each full buffer is a task for a worker process, which tokenizes it, walks its
  documents exactly as the original does (random "next" segments come from the other documents of the
  buffer) and does truncation, assembly and masking for thousands of instances at once with NumPy. The
  instances of a buffer (all `dupe_factor` passes) are shuffled together and written as one shard.
  Every buffer has its own random generators, seeded from `random_seed` and the buffer's index, so the
  output depends on the seed and the input only: it is the same for any `--num_workers`. The RNG order
  is not the original's, but every distribution is (tests compare the statistics). Two differences by
  design: a file boundary ends a document, and a document longer than a buffer is cut into pieces.

Output: TFRecord files of `tf.train.Example` with the original's 7 features (instances dealt round-robin
over the comma-separated `--output_file`s), or a native dataset directory (`bert.datasets`). Corpus
statistics are logged and written to `<output>.stats.json` (native: `stats.json` inside the directory).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import logging
import math
import os
import random
import struct
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bert.errors import InputError
from bert.prepare_corpus import DECODE_ERRORS, expand_input_files, iter_lines

logger = logging.getLogger(__name__)

__all__ = [
    "CreatePretrainingDataArgs",
    "TrainingInstance",
    "create_instances_from_document",
    "create_masked_lm_predictions",
    "create_training_instances",
    "encode_pretraining_examples",
    "instance_to_features",
    "iter_buffers",
    "read_documents",
    "run_create_pretraining_data",
    "truncate_seq_pair",
    "truncated_lengths",
]

FEATURE_TYPES = {
    "input_ids": "int64",
    "input_mask": "int64",
    "segment_ids": "int64",
    "masked_lm_positions": "int64",
    "masked_lm_ids": "int64",
    "masked_lm_weights": "float",
    "next_sentence_labels": "int64",
}
SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[MASK]")
_TOKENIZE_BATCH = 4096  # lines per tokenizer call
_ASSEMBLY_BATCH = 4096  # instances assembled and masked at once in streaming mode
_WINDOW_BUFFERS = 4  # buffers the reader deals documents into (the shuffle window)
_LOGGED_EXAMPLES = 20  # the original logs its first 20 instances


# ---------------------------------------------------------------------------------------------------------
# The original algorithm (compat mode)
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TrainingInstance:
    """A single training instance (sentence pair): tokens with `[CLS]`/`[SEP]` and masks applied."""

    tokens: list[str]
    segment_ids: list[int]
    masked_lm_positions: list[int]
    masked_lm_labels: list[str]
    is_random_next: bool


def read_documents(input_files: Sequence[str], tokenizer: Any, decode_errors: str = "strict") -> list[list[list[str]]]:
    """Read and tokenize documents as the original's `create_training_instances` does.

    One sentence per line, a blank line between documents; each line is `strip()`ped and tokenized; lines
    without tokens are dropped and so are empty documents. As in the original, a file boundary does not
    end a document.

    Args:
        input_files: text files (".gz" files are decompressed).
        tokenizer: a `FullTokenizer`.
        decode_errors: "strict" (an error naming file and line), "ignore" (the original: invalid UTF-8
            bytes silently dropped) or "replace".

    Returns:
        documents -> sentences -> word-piece tokens.
    """
    all_documents: list[list[list[str]]] = [[]]
    for path in input_files:
        lines = iter_lines(path, "utf-8", decode_errors)
        blank = seen = 0
        while True:
            batch = [line.strip() for line in itertools.islice(lines, _TOKENIZE_BATCH)]
            if not batch:
                break
            for line, tokens in zip(batch, tokenizer.tokenize_batch(batch)):
                # Empty lines are used as document delimiters.
                if not line:
                    all_documents.append([])
                    blank += seen > 0
                else:
                    seen += 1
                if tokens:
                    all_documents[-1].append(tokens)
        _warn_no_break(path, seen, blank)
    return [d for d in all_documents if d]


def _warn_no_break(path: str, lines: int, breaks: int) -> None:
    if lines > 1 and breaks == 0:
        logger.warning(
            "%s has no blank line: its %d lines are one document. Put a blank line between documents "
            "(bert prepare-corpus writes that layout)",
            path,
            lines,
        )


def create_training_instances(
    documents: list[list[list[str]]],
    vocab_words: list[str],
    max_seq_length: int,
    dupe_factor: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    rng: random.Random,
    do_whole_word_mask: bool = False,
) -> list[TrainingInstance]:
    """Shuffle the documents, make `dupe_factor` passes of instances over them, shuffle the instances.

    `documents` is shuffled in place (the original's `rng.shuffle(all_documents)`). `vocab_words` is
    `list(tokenizer.vocab.keys())`.
    """
    rng.shuffle(documents)
    instances: list[TrainingInstance] = []
    for _ in range(dupe_factor):
        for document_index in range(len(documents)):
            instances.extend(
                create_instances_from_document(
                    documents,
                    document_index,
                    max_seq_length,
                    short_seq_prob,
                    masked_lm_prob,
                    max_predictions_per_seq,
                    vocab_words,
                    rng,
                    do_whole_word_mask,
                )
            )
    rng.shuffle(instances)
    return instances


def create_instances_from_document(
    all_documents: list[list[list[str]]],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab_words: list[str],
    rng: random.Random,
    do_whole_word_mask: bool = False,
) -> list[TrainingInstance]:
    """Creates `TrainingInstance`s for a single document (the original's function, same RNG calls)."""
    document = all_documents[document_index]

    # Account for [CLS], [SEP], [SEP]
    max_num_tokens = max_seq_length - 3

    # Usually sequences fill max_seq_length, but with probability short_seq_prob a shorter target is drawn
    # (once per document), to reduce the pre-training/fine-tuning length mismatch.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    current_chunk: list[list[str]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                # `a_end` is how many segments from `current_chunk` go into the `A` (first) sentence.
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)

                tokens_a: list[str] = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])

                tokens_b: list[str] = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)

                    # Up to 10 tries for another document; a one-document corpus uses its own.
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break

                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    # The segments not used for A are "put back" for the next chunk.
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)

                assert len(tokens_a) >= 1
                assert len(tokens_b) >= 1

                tokens = ["[CLS]", *tokens_a, "[SEP]", *tokens_b, "[SEP]"]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)

                tokens, masked_lm_positions, masked_lm_labels = create_masked_lm_predictions(
                    tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng, do_whole_word_mask
                )
                instances.append(
                    TrainingInstance(tokens, segment_ids, masked_lm_positions, masked_lm_labels, is_random_next)
                )
            current_chunk = []
            current_length = 0
        i += 1

    return instances


def create_masked_lm_predictions(
    tokens: list[str],
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    vocab_words: list[str],
    rng: random.Random,
    do_whole_word_mask: bool = False,
) -> tuple[list[str], list[int], list[str]]:
    """Creates the predictions for the masked LM objective (the original's function, same RNG calls).

    Returns:
        (output tokens, sorted masked positions, the original tokens at those positions).
    """
    cand_indexes: list[list[int]] = []
    for i, token in enumerate(tokens):
        if token == "[CLS]" or token == "[SEP]":
            continue
        # Whole Word Masking: a "##" piece joins the previous candidate group (which, after front
        # truncation of B, can be the last word of A, across the [SEP]).
        if do_whole_word_mask and len(cand_indexes) >= 1 and token.startswith("##"):
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])

    rng.shuffle(cand_indexes)

    output_tokens = list(tokens)

    # Python's round (half to even); len(tokens) counts [CLS] and both [SEP]s: 128 tokens -> 19.
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))

    masked_lms: list[tuple[int, str]] = []
    covered_indexes: set[int] = set()
    for index_set in cand_indexes:
        if len(masked_lms) >= num_to_predict:
            break
        # If adding a whole-word mask would exceed the maximum number of predictions, skip this candidate.
        if len(masked_lms) + len(index_set) > num_to_predict:
            continue
        if any(index in covered_indexes for index in index_set):
            continue
        for index in index_set:
            covered_indexes.add(index)
            # 80% of the time, replace with [MASK]; 10% keep the original; 10% a random vocab entry.
            if rng.random() < 0.8:
                masked_token = "[MASK]"
            elif rng.random() < 0.5:
                masked_token = tokens[index]
            else:
                masked_token = vocab_words[rng.randint(0, len(vocab_words) - 1)]
            output_tokens[index] = masked_token
            masked_lms.append((index, tokens[index]))
    assert len(masked_lms) <= num_to_predict
    masked_lms.sort(key=lambda x: x[0])
    return output_tokens, [p for p, _ in masked_lms], [label for _, label in masked_lms]


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_num_tokens: int, rng: random.Random) -> None:
    """Truncates a pair of sequences to a maximum sequence length, in place (the original's function).

    The longer list loses a token (B when equal), from the front or the back with probability 1/2 each,
    to add more randomness and avoid biases.
    """
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def instance_to_features(
    instance: TrainingInstance, vocab: dict[str, int], max_seq_length: int, max_predictions_per_seq: int
) -> dict[str, list]:
    """The 7 TFRecord features of an instance, padded, in the original's order."""
    input_ids = [vocab[t] for t in instance.tokens]
    n = len(input_ids)
    assert n <= max_seq_length
    pad = max_seq_length - n
    k = len(instance.masked_lm_positions)
    ppad = max_predictions_per_seq - k
    return {
        "input_ids": input_ids + [0] * pad,
        "input_mask": [1] * n + [0] * pad,
        "segment_ids": list(instance.segment_ids) + [0] * pad,
        "masked_lm_positions": list(instance.masked_lm_positions) + [0] * ppad,
        "masked_lm_ids": [vocab[t] for t in instance.masked_lm_labels] + [0] * ppad,
        "masked_lm_weights": [1.0] * k + [0.0] * ppad,
        "next_sentence_labels": [1 if instance.is_random_next else 0],
    }


def _log_example(tokens: Sequence[str], features: dict[str, Any]) -> None:
    logger.info("*** Example ***")
    logger.info("tokens: %s", " ".join(tokens))
    for name, values in features.items():
        logger.info("%s: %s", name, " ".join(str(v) for v in np.asarray(values).tolist()))


# ---------------------------------------------------------------------------------------------------------
# Streaming mode: buffers of documents, vectorized assembly and masking
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Settings:
    """What a worker needs; picklable."""

    vocab_file: str
    do_lower_case: bool
    max_seq_length: int
    max_predictions_per_seq: int
    masked_lm_prob: float
    short_seq_prob: float
    dupe_factor: int
    do_whole_word_mask: bool
    random_seed: int
    output_format: str
    part_dir: str


def _seed_of(random_seed: int, buffer_index: int) -> int:
    """A 64-bit seed for one buffer, independent of the process that handles it."""
    digest = hashlib.sha256(f"bert-pretraining-data:{random_seed}:{buffer_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class _BufferProcessor:
    """Turns one buffer of documents (raw lines) into a shard of instances; one per process."""

    def __init__(self, settings: _Settings, tokenizer: Any = None) -> None:
        from bert.datasets import record_dtype
        from bert.tokenization import FullTokenizer

        self.s = settings
        # A small memo bounds the tokenizer's memory on any corpus (it only caches chunk -> ids).
        self.tokenizer = tokenizer or FullTokenizer(settings.vocab_file, settings.do_lower_case, cache_size=1 << 16)
        vocab = self.tokenizer.vocab
        self.cls_id, self.sep_id, self.mask_id = (vocab[t] for t in SPECIAL_TOKENS)
        # vocab_words[i] -> its id, as the original's `convert_tokens_to_ids(vocab_words[i])`.
        self.vocab_word_ids = np.fromiter(vocab.values(), dtype=np.int64, count=len(vocab))
        self.is_continuation = np.zeros(max(vocab.values()) + 1, dtype=bool)
        for token, i in vocab.items():
            if token.startswith("##"):
                self.is_continuation[i] = True
        self.dtype = record_dtype(settings.max_seq_length, settings.max_predictions_per_seq, len(vocab))

    # --- tokenizing ---------------------------------------------------------------------------------

    def tokenize(self, lines: list[str], doc_lines: list[int]) -> tuple[np.ndarray, list[int], list[int]]:
        """Token ids of a buffer: (flat ids, sentence start offsets [S+1], document first sentences [D+1]).

        Lines without tokens are dropped, then documents without sentences.
        """
        lengths: list[int] = []
        chunks: list[np.ndarray] = []
        chain = itertools.chain.from_iterable
        for start in range(0, len(lines), _TOKENIZE_BATCH):
            ids = self.tokenizer.encode_batch(lines[start : start + _TOKENIZE_BATCH])
            n = list(map(len, ids))
            lengths.extend(n)
            chunks.append(np.fromiter(chain(ids), dtype=np.int32, count=sum(n)))
        flat = np.concatenate(chunks) if chunks else np.zeros(0, np.int32)
        sent_start = [0]
        doc_first = [0]
        line = 0
        total = 0
        for count in doc_lines:
            for n in lengths[line : line + count]:
                if n:
                    total += n
                    sent_start.append(total)
            line += count
            if len(sent_start) - 1 > doc_first[-1]:
                doc_first.append(len(sent_start) - 1)
        return flat, sent_start, doc_first

    # --- the document walk (the original's create_instances_from_document on offsets) ------------------

    def walk(self, sent_start: list[int], doc_first: list[int], rng: random.Random) -> np.ndarray:
        """Instance specs [N, 5]: A range, B range (offsets into the flat ids), is_random_next.

        The same decisions as the original's `create_instances_from_document` (chunking, `a_end`,
        random-next choice, the 10 tries for another document, the put-back of unused segments), on
        token offsets instead of token lists; truncation and masking are done later, vectorized.
        """
        s = self.s
        max_num_tokens = s.max_seq_length - 3
        n_docs = len(doc_first) - 1
        order = list(range(n_docs))
        rng.shuffle(order)
        specs: list[tuple[int, int, int, int, int]] = []
        append = specs.append
        # random() is much cheaper than randint(); int(random() * n) is uniform on 0..n-1 (to 2**-53).
        rand = rng.random
        for _ in range(s.dupe_factor):
            for d in order:
                first, end = doc_first[d], doc_first[d + 1]
                target = max_num_tokens
                if rand() < s.short_seq_prob:
                    target = 2 + int(rand() * (max_num_tokens - 1))  # randint(2, max_num_tokens)
                chunk_start = first
                i = first
                while i < end:
                    if i == end - 1 or sent_start[i + 1] - sent_start[chunk_start] >= target:
                        n_chunk = i + 1 - chunk_start
                        a_end = 1 if n_chunk == 1 else 1 + int(rand() * (n_chunk - 1))  # randint(1, n_chunk - 1)
                        a_lo, a_hi = sent_start[chunk_start], sent_start[chunk_start + a_end]
                        if n_chunk == 1 or rand() < 0.5:
                            target_b = target - (a_hi - a_lo)
                            rd = d
                            if n_docs > 1:  # up to 10 tries for another document
                                for _ in range(10):
                                    rd = int(rand() * n_docs)
                                    if rd != d:
                                        break
                            r_first, r_end = doc_first[rd], doc_first[rd + 1]
                            j = r_first + int(rand() * (r_end - r_first))
                            b_lo = sent_start[j]
                            j += 1
                            while j < r_end and sent_start[j] - b_lo < target_b:
                                j += 1
                            append((a_lo, a_hi, b_lo, sent_start[j], 1))
                            i = chunk_start + a_end - 1  # put back the unused segments
                        else:
                            append((a_lo, a_hi, a_hi, sent_start[i + 1], 0))
                        chunk_start = i + 1
                    i += 1
        return np.array(specs, dtype=np.int64).reshape(-1, 5)

    # --- vectorized truncation, assembly, masking -------------------------------------------------------

    def assemble(self, flat: np.ndarray, specs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Records for a batch of instance specs (see `bert.datasets.record_dtype`)."""
        s = self.s
        T, P = s.max_seq_length, s.max_predictions_per_seq
        n = len(specs)
        rows = np.arange(n)
        a_lo, a_hi, b_lo, b_hi, is_random = (specs[:, k].copy() for k in range(5))
        la, lb = truncated_lengths(a_hi - a_lo, b_hi - b_lo, T - 3)
        # Each popped token comes from the front or the back with probability 1/2 (truncate_seq_pair).
        a_front = rng.binomial(a_hi - a_lo - la, 0.5)
        b_front = rng.binomial(b_hi - b_lo - lb, 0.5)
        a_lo += a_front
        b_lo += b_front

        # [CLS] A [SEP] B [SEP] [PAD]...   (N instances x T positions)
        t = np.arange(T)[None, :]
        la_, lb_ = la[:, None], lb[:, None]
        in_a = (t >= 1) & (t <= la_)
        in_b = (t >= la_ + 2) & (t <= la_ + lb_ + 1)
        src = np.where(in_a, a_lo[:, None] + t - 1, b_lo[:, None] + t - la_ - 2)
        candidate = in_a | in_b
        ids = np.where(candidate, flat[np.where(candidate, src, 0)], 0).astype(np.int64)
        ids[:, 0] = self.cls_id
        ids[rows, la + 1] = self.sep_id
        ids[rows, la + lb + 2] = self.sep_id
        num_tokens = la + lb + 3

        positions, labels, num_pred = self.mask(ids, candidate, num_tokens, rng)

        rec = np.zeros(n, self.dtype)
        rec["input_ids"] = ids
        rec["num_tokens"] = num_tokens
        rec["segment_b_start"] = la + 2
        rec["masked_lm_positions"] = positions[:, :P]
        rec["masked_lm_ids"] = labels[:, :P]
        rec["num_predictions"] = num_pred
        rec["next_sentence_label"] = is_random
        return rec

    def mask(
        self, ids: np.ndarray, candidate: np.ndarray, num_tokens: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Masked-LM predictions for a batch, in place on `ids` (the original's create_masked_lm_predictions).

        Candidate groups (single positions, or whole words with `do_whole_word_mask`) are visited in a
        random order and taken while they fit the budget `num_to_predict`, exactly the original's rule;
        each taken position becomes [MASK] (80%), stays (10%) or becomes a random vocab entry (10%).

        Returns:
            positions [N, max_predictions_per_seq] sorted and 0-padded, their original ids, their count.
        """
        s = self.s
        n, T = ids.shape
        P = s.max_predictions_per_seq
        rows = np.arange(n)
        if s.do_whole_word_mask:
            # A "##" piece joins the previous candidate group (the first candidate always starts one).
            cont = self.is_continuation[ids] & candidate
            cont[:, 1] = False
            starts = candidate & ~cont
        else:
            starts = candidate
        group = np.cumsum(starts, axis=1) - 1  # group index of each candidate position
        n_groups = group[:, -1] + 1
        group_size = np.zeros((n, T), np.int64)
        flat_group = (rows[:, None] * T + group)[candidate]
        group_size.reshape(-1)[:] = np.bincount(flat_group, minlength=n * T)

        # round() half to even like Python's; len(tokens) includes [CLS] and the two [SEP]s.
        budget = np.minimum(P, np.maximum(1, np.rint(num_tokens * s.masked_lm_prob).astype(np.int64)))
        keys = rng.random((n, T))
        keys[np.arange(T)[None, :] >= n_groups[:, None]] = 2.0
        order = np.argsort(keys, axis=1)  # a random permutation of each row's groups
        taken = np.zeros((n, T), bool)
        remaining = budget.copy()
        for step in range(int(n_groups.max(initial=0))):
            g = order[:, step]
            size = group_size[rows, g]
            ok = (size > 0) & (size <= remaining)
            taken[rows[ok], g[ok]] = True
            remaining -= np.where(ok, size, 0)
            if not remaining.any():
                break
        chosen = candidate & taken[rows[:, None], np.maximum(group, 0)]

        r, c = np.nonzero(chosen)  # row-major: positions come out sorted within each row
        num_pred = np.bincount(r, minlength=n)
        slot = np.arange(len(r)) - np.repeat(np.cumsum(num_pred) - num_pred, num_pred)
        positions = np.zeros((n, max(P, 1)), np.int64)
        labels = np.zeros((n, max(P, 1)), np.int64)
        positions[r, slot] = c
        labels[r, slot] = ids[r, c]

        u = rng.random((2, len(r)))
        random_ids = self.vocab_word_ids[rng.integers(0, len(self.vocab_word_ids), len(r))]
        ids[r, c] = np.where(u[0] < 0.8, self.mask_id, np.where(u[1] < 0.5, ids[r, c], random_ids))
        return positions, labels, num_pred

    # --- one buffer ---------------------------------------------------------------------------------

    def process(self, index: int, lines: list[str], doc_lines: list[int]) -> tuple[int, int, dict[str, Any]]:
        """Write the shard (native) or part file (tfrecord) of buffer `index`; returns (index, count, stats)."""
        from bert.datasets import write_npy

        flat, sent_start, doc_first = self.tokenize(lines, doc_lines)
        stats = collections.Counter(documents=len(doc_first) - 1, sentences=len(sent_start) - 1, text_tokens=len(flat))
        seed = _seed_of(self.s.random_seed, index)
        specs = self.walk(sent_start, doc_first, random.Random(seed))
        rng = np.random.default_rng(seed)
        n = len(specs)
        stats["instances"] = n
        if n == 0:
            return index, 0, dict(stats)
        specs = specs[rng.permutation(n)]  # all dupe passes of the buffer, shuffled together

        def batches() -> Iterator[np.ndarray]:
            for start in range(0, n, _ASSEMBLY_BATCH):
                rec = self.assemble(flat, specs[start : start + _ASSEMBLY_BATCH], rng)
                stats.update(record_stats(rec, self.mask_id))
                yield rec

        path = os.path.join(self.s.part_dir, part_name(index, self.s.output_format))
        if self.s.output_format == "native":
            write_npy(path, self.dtype, n, batches())
        else:
            from bert.tfrecord import TFRecordWriter

            with TFRecordWriter(path) as writer:
                for rec in batches():
                    for payload in encode_records(rec):
                        writer.write(payload)
        return index, n, dict(stats)


def truncated_lengths(len_a: np.ndarray, len_b: np.ndarray, max_num_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Lengths of A and B after the original's `truncate_seq_pair` (which pops from the longer, B on ties).

    The lengths it ends with do not depend on the random draws (only which end each pop takes does): the
    longer list is cut down to the shorter one, then they lose tokens alternately, B first.
    """
    len_a = np.asarray(len_a, dtype=np.int64)
    len_b = np.asarray(len_b, dtype=np.int64)
    excess = np.maximum(len_a + len_b - max_num_tokens, 0)
    a_longer = len_a > len_b
    diff = np.abs(len_a - len_b)
    shorter = np.minimum(len_a, len_b)
    rest = np.maximum(excess - diff, 0)  # pops once both are equal: B, A, B, ...
    only_longer = excess <= diff
    new_a = np.where(only_longer, np.where(a_longer, len_a - excess, len_a), shorter - rest // 2)
    new_b = np.where(only_longer, np.where(a_longer, len_b, len_b - excess), shorter - (rest + 1) // 2)
    return new_a, new_b


def record_stats(rec: np.ndarray, mask_id: int) -> collections.Counter:
    """Counts for the corpus statistics from a batch of records."""
    n = len(rec)
    P = rec["masked_lm_positions"].shape[1]
    valid = np.arange(P)[None, :] < rec["num_predictions"][:, None].astype(np.int64)
    at = np.take_along_axis(rec["input_ids"], rec["masked_lm_positions"].astype(np.int64), axis=1)
    masked = (at == mask_id) & valid
    kept = (at == rec["masked_lm_ids"]) & valid & ~masked
    predictions = int(valid.sum())
    return collections.Counter(
        written=n,
        instance_tokens=int(rec["num_tokens"].sum()),
        max_length_instances=int((rec["num_tokens"] == rec["input_ids"].shape[1]).sum()),
        predictions=predictions,
        mask=int(masked.sum()),
        keep=int(kept.sum()),
        random=predictions - int(masked.sum()) - int(kept.sum()),
        random_next=int(rec["next_sentence_label"].sum()),
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _packed_varints(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Protobuf packed varints of each row of a non-negative int matrix [N, L]: (bytes, row sizes [N])."""
    v = np.asarray(values)
    if v.size and v.min() < 0:
        raise ValueError("pre-training features are non-negative")
    top = int(v.max(initial=0))
    if top < 0x80:  # one byte per value: the values themselves
        return v.astype(np.uint8).tobytes(), np.full(len(v), v.shape[1], np.int64)
    u = v.astype(np.uint64).reshape(-1)
    width = (top.bit_length() + 6) // 7
    nbytes = np.ones(u.shape, np.int64)
    for k in range(1, width):
        nbytes += u >= np.uint64(1 << (7 * k))
    ends = np.cumsum(nbytes)
    out = np.empty(int(ends[-1]), np.uint8)
    start = ends - nbytes  # where each value's varint begins; rows stay contiguous, in order
    for k in range(width):
        byte = ((u >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= (nbytes > k + 1).astype(np.uint8) << 7  # continuation bit
        if k == 0:
            out[start] = byte
        else:
            m = nbytes > k
            out[start[m] + k] = byte[m]
    return out.tobytes(), nbytes.reshape(v.shape).sum(axis=1)


def encode_pretraining_examples(features: dict[str, np.ndarray]) -> list[bytes]:
    """Serialized `tf.train.Example`s of stacked pre-training features [N, ...], many at a time.

    A fast path for the fixed 7-feature schema, byte-identical to `bert.tfrecord.encode_example(...,
    FEATURE_TYPES)` on each row (tested): the varints of all rows are computed at once with NumPy, the
    per-feature headers depend only on the payload size and are cached, and rows are joined in C.
    """
    n = len(features["input_ids"])
    columns: list[list[bytes]] = []
    total = np.zeros(n, np.int64)
    for name, kind in FEATURE_TYPES.items():
        values = np.asarray(features[name]).reshape(n, -1)
        if kind == "float":
            data = values.astype("<f4").tobytes()
            sizes = np.full(n, values.shape[1] * 4, np.int64)
        else:
            data, sizes = _packed_varints(values)
        key = name.encode()
        tag = b"\x12" if kind == "float" else b"\x1a"  # Feature.float_list = 2, Feature.int64_list = 3
        cache: dict[int, bytes] = {}
        for size in np.unique(sizes).tolist():
            # map entry {key = name, value = Feature {kind {value = payload (packed)}}}
            inner = (b"\x0a" + _varint(size)) if size else b""
            feature = tag + _varint(len(inner) + size) + inner
            entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(feature) + size) + feature
            cache[size] = b"\x0a" + _varint(len(entry) + size) + entry
        size_list = sizes.tolist()
        headers = [cache[x] for x in size_list]
        ends = np.cumsum(sizes).tolist()
        starts = [0, *ends[:-1]]
        columns.append(headers)
        columns.append([data[a:b] for a, b in zip(starts, ends)])
        total += sizes + np.array([len(h) for h in cache.values()])[np.searchsorted(list(cache), sizes)]
    prefix_cache = {t: b"\x0a" + _varint(t) for t in np.unique(total).tolist()}
    prefixes = [prefix_cache[t] for t in total.tolist()]
    return list(map(b"".join, zip(prefixes, *columns)))


def encode_records(rec: np.ndarray) -> list[bytes]:
    """Serialized `tf.train.Example`s of a batch of native records."""
    from bert.datasets import records_to_features

    return encode_pretraining_examples(records_to_features(rec))


def part_name(index: int, output_format: str) -> str:
    return f"shard_{index:06d}.npy" if output_format == "native" else f"part_{index:06d}.tfrecord"


_WORKER: _BufferProcessor | None = None


def _init_worker(settings: _Settings) -> None:
    global _WORKER
    _WORKER = _BufferProcessor(settings)


def _work(task: tuple[int, list[str], list[int]]) -> tuple[int, int, dict[str, Any]]:
    assert _WORKER is not None
    return _WORKER.process(*task)


@dataclass
class _Buffer:
    lines: list[str] = field(default_factory=list)
    doc_lines: list[int] = field(default_factory=list)
    chars: int = 0

    def add(self, doc: list[str], chars: int) -> None:
        self.lines.extend(doc)
        self.doc_lines.append(len(doc))
        self.chars += chars


def iter_buffers(
    input_files: Sequence[str], buffer_chars: int, random_seed: int, decode_errors: str = "strict"
) -> Iterator[_Buffer]:
    """Documents (lists of stripped non-empty lines) dealt into buffers of about `buffer_chars` characters.

    Each document goes to one of `_WINDOW_BUFFERS` open buffers drawn at random (a shuffle window), and a
    buffer is yielded once it is full, so a buffer mixes documents from a stretch of the corpus a few
    buffers long. A document longer than a buffer is cut into buffer-sized documents. Unlike compat mode,
    a file boundary ends a document. The last, partly filled buffers are merged and cut into equal parts.
    """
    rng = random.Random(_seed_of(random_seed, -1))
    open_buffers = [_Buffer() for _ in range(_WINDOW_BUFFERS)]
    warned_long = False

    def documents() -> Iterator[tuple[list[str], int]]:
        nonlocal warned_long
        for path in input_files:
            doc: list[str] = []
            chars = lines = breaks = 0
            for raw in iter_lines(path, "utf-8", decode_errors):
                line = raw.strip()
                if not line:
                    if doc:
                        yield doc, chars
                        doc, chars = [], 0
                        breaks += 1
                    continue
                lines += 1
                doc.append(line)
                chars += len(line) + 1
                if chars >= buffer_chars:
                    if not warned_long:
                        logger.warning("%s: a document longer than --streaming_buffer_mb is cut into pieces", path)
                        warned_long = True
                    yield doc, chars
                    doc, chars = [], 0
            if doc:
                yield doc, chars
            _warn_no_break(path, lines, breaks)

    for doc, chars in documents():
        k = rng.randrange(_WINDOW_BUFFERS)
        buf = open_buffers[k]
        buf.add(doc, chars)
        if buf.chars >= buffer_chars:
            yield buf
            open_buffers[k] = _Buffer()
    # The rest: as few buffers as possible, of equal size (they are processed in parallel).
    rest = [b for b in open_buffers if b.chars]
    total = sum(b.chars for b in rest)
    if not total:
        return
    n_out = math.ceil(total / buffer_chars)
    target = total / n_out
    out = _Buffer()
    for b in rest:
        start = 0
        for count in b.doc_lines:
            doc = b.lines[start : start + count]
            start += count
            out.add(doc, sum(len(x) + 1 for x in doc))
            if out.chars >= target and n_out > 1:
                yield out
                out = _Buffer()
                n_out -= 1
    if out.chars:
        yield out


def _text_size(path: str) -> int:
    """Uncompressed size of a file (a .gz file's ISIZE trailer, exact below 4 GiB)."""
    size = os.path.getsize(path)
    if path.endswith(".gz") and size >= 18:
        with open(path, "rb") as f:
            f.seek(-4, os.SEEK_END)
            return struct.unpack("<I", f.read(4))[0]
    return size


# ---------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------


@dataclass
class CreatePretrainingDataArgs:
    """Create masked LM / next sentence masked_lm examples for BERT (create_pretraining_data.py): TFRecord
    files as the original writes, or a native dataset of memory-mappable shards."""

    input_file: str = field(
        metadata={"help": "Input raw text file (or comma-separated list of files); glob patterns are expanded."}
    )
    output_file: str = field(
        metadata={
            "help": "Output TF example file (or comma-separated list of files), or a directory for the native format."
        }
    )
    vocab_file: str = field(metadata={"help": "The vocabulary file that the BERT model was trained on."})
    do_lower_case: bool = field(
        default=True,
        metadata={
            "help": "Whether to lower case the input text. Should be True for uncased models and False for "
            "cased models."
        },
    )
    do_whole_word_mask: bool = field(
        default=False, metadata={"help": "Whether to use whole word masking rather than per-WordPiece masking."}
    )
    max_seq_length: int = field(default=128, metadata={"help": "Maximum sequence length."})
    max_predictions_per_seq: int = field(
        default=20, metadata={"help": "Maximum number of masked LM predictions per sequence."}
    )
    random_seed: int = field(default=12345, metadata={"help": "Random seed for data generation."})
    dupe_factor: int = field(
        default=10, metadata={"help": "Number of times to duplicate the input data (with different masks)."}
    )
    masked_lm_prob: float = field(default=0.15, metadata={"help": "Masked LM probability."})
    short_seq_prob: float = field(
        default=0.1,
        metadata={"help": "Probability of creating sequences which are shorter than the maximum length."},
    )
    output_format: str = field(
        default="auto",
        metadata={
            "help": "tfrecord (the original's), native (a directory of memory-mappable .npy shards + "
            "manifest.json), or auto: tfrecord when --output_file names contain 'tfrec'/'tf_record' or "
            "there are several of them, else native.",
            "choices": ("auto", "tfrecord", "native"),
        },
    )
    num_workers: int = field(default=1, metadata={"help": "Worker processes; more than 1 implies --streaming."})
    streaming: bool = field(
        default=False,
        metadata={
            "help": "Bounded-memory generator over buffers of documents (any corpus size; not the "
            "original's random order). Off with one worker: the original algorithm, record for record."
        },
    )
    streaming_buffer_mb: float = field(
        default=4.0,
        metadata={"help": "Streaming: MB of text per buffer; random-next segments are drawn within a buffer."},
    )
    decode_errors: str = field(
        default="strict",
        metadata={
            "help": "Bytes that are not UTF-8: strict (error naming file and line), ignore (drop them, "
            "as the original did silently), replace (U+FFFD).",
            "choices": DECODE_ERRORS,
        },
    )


def resolve_output_format(output_file: str, output_format: str) -> str:
    if output_format != "auto":
        return output_format
    outputs = [o for o in output_file.split(",") if o.strip()]
    if len(outputs) > 1 or all(("tfrec" in o.lower() or "tf_record" in o.lower()) for o in outputs):
        return "tfrecord"
    return "native"


def _validate(args: CreatePretrainingDataArgs) -> tuple[list[str], list[str], str, Any]:
    """Check every flag before any work; returns (input files, output files, format, tokenizer)."""
    from bert.tokenization import FullTokenizer

    if args.max_seq_length < 5:
        raise InputError(
            f"--max_seq_length={args.max_seq_length} is too small: an instance needs [CLS] A [SEP] B [SEP] "
            "with at least 2 text tokens; use 5 or more (the original default is 128)"
        )
    if args.max_predictions_per_seq < 1:
        raise InputError(f"--max_predictions_per_seq={args.max_predictions_per_seq} must be at least 1")
    for name in ("masked_lm_prob", "short_seq_prob"):
        value = getattr(args, name)
        if not 0.0 <= value <= 1.0:
            raise InputError(f"--{name}={value} is a probability; give a value between 0 and 1")
    if args.dupe_factor < 1:
        raise InputError(f"--dupe_factor={args.dupe_factor} must be at least 1")
    if args.num_workers < 1:
        raise InputError(f"--num_workers={args.num_workers} must be at least 1")
    if args.streaming_buffer_mb <= 0:
        raise InputError(f"--streaming_buffer_mb={args.streaming_buffer_mb} must be positive")
    outputs = [o.strip() for o in args.output_file.split(",") if o.strip()]
    if not outputs:
        raise InputError("--output_file is empty; give an output file (or a directory for the native format)")
    fmt = resolve_output_format(args.output_file, args.output_format)
    if fmt == "native":
        if len(outputs) != 1:
            raise InputError(
                f"--output_file has {len(outputs)} entries, but a native dataset is one directory; "
                "give one path or pass --output_format=tfrecord"
            )
        from bert.datasets import check_output_dir

        check_output_dir(Path(outputs[0]))
    else:
        for o in outputs:
            if os.path.isdir(o):
                raise InputError(f"--output_file={o} is a directory; a TFRecord output is a file")
    streaming = args.streaming or args.num_workers > 1
    # Streaming bounds the tokenizer's memo too (compat holds the whole corpus anyway).
    tokenizer = FullTokenizer(args.vocab_file, args.do_lower_case, **({"cache_size": 1 << 16} if streaming else {}))
    missing = [t for t in SPECIAL_TOKENS if t not in tokenizer.vocab]
    if missing:
        raise InputError(
            f"--vocab_file={args.vocab_file} has no {', '.join(missing)}; pre-training needs [CLS], [SEP] "
            "and [MASK] in the vocabulary (use a BERT vocab.txt)"
        )
    inputs = expand_input_files(args.input_file)
    return inputs, outputs, fmt, tokenizer


def _manifest_fields(args: CreatePretrainingDataArgs, tokenizer: Any, mode: str, inputs: list[str]) -> dict:
    from bert import __version__
    from bert.datasets import file_sha256

    return {
        "max_seq_length": args.max_seq_length,
        "max_predictions_per_seq": args.max_predictions_per_seq,
        "masked_lm_prob": args.masked_lm_prob,
        "short_seq_prob": args.short_seq_prob,
        "dupe_factor": args.dupe_factor,
        "do_whole_word_mask": args.do_whole_word_mask,
        "do_lower_case": args.do_lower_case,
        "random_seed": args.random_seed,
        "vocab_sha256": file_sha256(args.vocab_file),
        "vocab_size": len(tokenizer.vocab),
        "mode": mode,
        "streaming": mode == "streaming",
        "num_workers": args.num_workers,
        "streaming_buffer_mb": args.streaming_buffer_mb if mode == "streaming" else None,
        "input_files": inputs,
        "bert_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def finish_stats(counts: collections.Counter, seconds: float, text_bytes: int) -> dict[str, Any]:
    """The corpus statistics (counts plus fractions) logged and written at the end."""
    c = counts
    n = c["written"]
    pred = c["predictions"]
    stats = {
        "documents": c["documents"],
        "sentences": c["sentences"],
        "text_tokens": c["text_tokens"],
        "instances": n,
        "instance_tokens": c["instance_tokens"],
        "mean_tokens_per_instance": c["instance_tokens"] / n if n else 0.0,
        "fraction_max_length": c["max_length_instances"] / n if n else 0.0,
        "predictions": pred,
        "mean_predictions_per_instance": pred / n if n else 0.0,
        "fraction_tokens_predicted": pred / c["instance_tokens"] if n else 0.0,
        "predictions_replaced_by_mask": c["mask"],
        "predictions_kept_original": c["keep"],
        "predictions_replaced_by_random": c["random"],
        "fraction_mask_keep_random": [c[k] / pred if pred else 0.0 for k in ("mask", "keep", "random")],
        "random_next": c["random_next"],
        "fraction_random_next": c["random_next"] / n if n else 0.0,
        "text_bytes": text_bytes,
        "seconds": round(seconds, 3),
        "mb_per_second": round(text_bytes / 1e6 / seconds, 3) if seconds > 0 else None,
    }
    return stats


def _log_stats(stats: dict[str, Any]) -> None:
    logger.info(
        "Corpus: %d documents, %d sentences, %d tokens -> %d instances (%.1f tokens each), "
        "%d predictions (%.1f%% of tokens; mask/keep/random %.3f/%.3f/%.3f), %.1f%% random next",
        stats["documents"],
        stats["sentences"],
        stats["text_tokens"],
        stats["instances"],
        stats["mean_tokens_per_instance"],
        stats["predictions"],
        100 * stats["fraction_tokens_predicted"],
        *stats["fraction_mask_keep_random"],
        100 * stats["fraction_random_next"],
    )


def run_create_pretraining_data(args: CreatePretrainingDataArgs) -> dict[str, Any]:
    """Run the command: compat or streaming generator, TFRecord or native output. Returns the statistics."""
    start = time.time()
    inputs, outputs, fmt, tokenizer = _validate(args)
    mode = "streaming" if args.streaming or args.num_workers > 1 else "compat"
    logger.info("*** Reading from input files ***")
    for path in inputs:
        logger.info("  %s", path)
    with _Sink(args, inputs, outputs, fmt, mode, tokenizer) as sink:
        if mode == "streaming":
            _generate_streaming(args, inputs, tokenizer, sink)
        else:
            _generate_compat(args, inputs, tokenizer, sink)
        stats = sink.finish(start)
    logger.info("*** Writing to output files ***")
    for path in outputs:
        logger.info("  %s", path)
    for tokens, feats in sink.examples:
        _log_example(tokens, feats)
    _log_stats(stats)
    logger.info("Wrote %d total instances", stats["instances"])
    return stats


class _Sink:
    """Where instances go: TFRecord files (round-robin) or a native dataset; counts the statistics.

    Compat mode hands it records in memory (`add_records`); streaming workers write part files into
    `part_dir`, handed over in order with `add_part`. Nothing appears under the output names unless
    `finish` succeeds.
    """

    def __init__(self, args, inputs: list[str], outputs: list[str], fmt: str, mode: str, tokenizer: Any) -> None:
        from bert.datasets import NativeShardWriter, record_dtype

        self.args, self.inputs, self.outputs, self.fmt, self.mode = args, inputs, outputs, fmt, mode
        self.tokenizer = tokenizer
        self.counts: collections.Counter = collections.Counter()
        self.examples: list[tuple[list[str], dict[str, Any]]] = []
        self.mask_id = tokenizer.vocab["[MASK]"]
        self.dtype = record_dtype(args.max_seq_length, args.max_predictions_per_seq, len(tokenizer.vocab))
        self._stack = contextlib.ExitStack()
        self._next = 0  # the output file the next TFRecord goes to
        if fmt == "native":
            self.native = self._stack.enter_context(
                NativeShardWriter(outputs[0], args.max_seq_length, args.max_predictions_per_seq, len(tokenizer.vocab))
            )
            self.part_dir = str(self.native.tmp_dir)
        elif mode == "compat":
            from bert.tfrecord import TFRecordWriter

            self.writers = [self._stack.enter_context(TFRecordWriter(o)) for o in outputs]
        else:  # workers write framed parts; their records are copied to the outputs as they are
            from bert.utils import atomic_write

            parent = Path(outputs[0]).resolve().parent
            parent.mkdir(parents=True, exist_ok=True)
            self.part_dir = self._stack.enter_context(tempfile.TemporaryDirectory(prefix=".pretraining-", dir=parent))
            self.files = [self._stack.enter_context(atomic_write(o, "wb")) for o in outputs]

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.__exit__(*exc)

    def add_records(self, recs: np.ndarray, tokens: list[list[str]] | None = None) -> None:
        """Write records (compat mode), in order."""
        self.counts.update(record_stats(recs, self.mask_id))
        self._keep_examples(recs, tokens)
        if self.fmt == "native":
            self.native.write(recs)
            return
        for payload in encode_records(recs):
            self.writers[self._next].write(payload)
            self._next = (self._next + 1) % len(self.writers)

    def add_part(self, index: int, n: int, stats: dict[str, Any]) -> None:
        """Take over the part file of buffer `index` (streaming mode), in buffer order."""
        self.counts.update(stats)
        if n == 0:
            return
        name = part_name(index, self.fmt)
        path = os.path.join(self.part_dir, name)
        if self.fmt == "native":
            if len(self.examples) < 5:
                self._keep_examples(np.load(path, mmap_mode="r")[:5])
            self.native.add_shard(name, n)
            return
        with open(path, "rb") as f:
            for frame in _iter_frames(f):
                if len(self.examples) < 5:
                    from bert.tfrecord import decode_example

                    feats = decode_example(frame[12:-4])
                    k = int(feats["input_mask"].sum())
                    self.examples.append((self.tokenizer.convert_ids_to_tokens(feats["input_ids"][:k].tolist()), feats))
                self.files[self._next].write(frame)
                self._next = (self._next + 1) % len(self.files)
        os.unlink(path)

    def _keep_examples(self, recs: np.ndarray, tokens: list[list[str]] | None = None) -> None:
        limit = _LOGGED_EXAMPLES if self.mode == "compat" else 5
        from bert.datasets import records_to_features

        take = min(len(recs), limit - len(self.examples))
        if take <= 0:
            return
        feats = records_to_features(np.asarray(recs[:take]))
        for i in range(take):
            one = {k: feats[k][i] for k in FEATURE_TYPES}
            if tokens is not None:
                toks = tokens[i]
            else:
                toks = self.tokenizer.convert_ids_to_tokens(one["input_ids"][: int(one["input_mask"].sum())].tolist())
            self.examples.append((toks, one))

    def finish(self, start: float) -> dict[str, Any]:
        """Check something was written, then publish the outputs, the statistics and (native) the manifest."""
        if self.counts["written"] == 0:
            raise InputError(
                f"--input_file={self.args.input_file}: no tokens in {len(self.inputs)} file(s); the corpus is "
                "empty (expected text with one sentence per line, a blank line between documents)"
            )
        text_bytes = sum(_text_size(p) for p in self.inputs)
        stats = finish_stats(self.counts, time.time() - start, text_bytes)
        stats.update(
            mode=self.mode, output_format=self.fmt, num_workers=self.args.num_workers, output_files=self.outputs
        )
        if self.fmt == "native":
            from bert.utils import write_run_info

            write_run_info(self.native.tmp_dir, "create-pretraining-data", self.args)
            self.native.close(_manifest_fields(self.args, self.tokenizer, self.mode, self.inputs), stats)
        else:
            self._stack.close()  # publishes the TFRecord files
            _publish_stats(f"{self.outputs[0]}.stats.json", stats)
        return stats


def _iter_frames(f) -> Iterator[bytes]:
    """The framed records of a TFRecord file, as they are (length, its CRC, data, its CRC)."""
    while True:
        header = f.read(12)
        if not header:
            return
        (length,) = struct.unpack_from("<Q", header)
        yield header + f.read(length + 4)


def _publish_stats(path: str | os.PathLike, stats: dict[str, Any]) -> None:
    from bert.utils import atomic_write

    with atomic_write(path) as f:
        json.dump(stats, f, indent=2)
        f.write("\n")


def _generate_compat(args: CreatePretrainingDataArgs, inputs: list[str], tokenizer: Any, sink: _Sink) -> None:
    """The original's create_training_instances + write_instance_to_example_files."""
    rng = random.Random(args.random_seed)
    documents = read_documents(inputs, tokenizer, args.decode_errors)
    sink.counts.update(
        documents=len(documents),
        sentences=sum(len(d) for d in documents),
        text_tokens=sum(len(s) for d in documents for s in d),
    )
    if not documents:
        return
    instances = create_training_instances(
        documents,
        list(tokenizer.vocab.keys()),
        args.max_seq_length,
        args.dupe_factor,
        args.short_seq_prob,
        args.masked_lm_prob,
        args.max_predictions_per_seq,
        rng,
        args.do_whole_word_mask,
    )
    del documents
    from bert.datasets import features_to_records

    vocab = tokenizer.vocab
    for s in range(0, len(instances), _ASSEMBLY_BATCH):
        chunk = instances[s : s + _ASSEMBLY_BATCH]
        feats = [instance_to_features(x, vocab, args.max_seq_length, args.max_predictions_per_seq) for x in chunk]
        stacked = {k: np.array([f[k] for f in feats]) for k in FEATURE_TYPES}
        sink.add_records(features_to_records(stacked, sink.dtype), [x.tokens for x in chunk])


def _generate_streaming(args: CreatePretrainingDataArgs, inputs: list[str], tokenizer: Any, sink: _Sink) -> None:
    """Deal documents into buffers, have workers turn each into a part file, hand the parts over in order."""
    from tqdm import tqdm

    settings = _Settings(
        vocab_file=args.vocab_file,
        do_lower_case=args.do_lower_case,
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor,
        do_whole_word_mask=args.do_whole_word_mask,
        random_seed=args.random_seed,
        output_format=sink.fmt,
        part_dir=sink.part_dir,
    )
    total_mb = sum(_text_size(p) for p in inputs) / 1e6
    buffer_chars = max(1, int(args.streaming_buffer_mb * 1e6))
    buffers = iter_buffers(inputs, buffer_chars, args.random_seed, args.decode_errors)
    with tqdm(total=round(total_mb, 2), unit="MB", desc="create-pretraining-data") as bar:

        def collect(result: tuple[int, int, dict[str, Any]], chars: int) -> None:
            sink.add_part(*result)
            bar.update(round(chars / 1e6, 2))
            bar.set_postfix(instances=sink.counts["written"], refresh=False)

        if args.num_workers == 1:
            worker = _BufferProcessor(settings, tokenizer)
            for index, buf in enumerate(buffers):
                collect(worker.process(index, buf.lines, buf.doc_lines), buf.chars)
            return
        import concurrent.futures
        import multiprocessing

        # spawn: workers start clean (no copy of the parent's state or threads) on every platform. Unlike
        # multiprocessing.Pool, the executor reports a worker that fails to start instead of respawning it.
        with concurrent.futures.ProcessPoolExecutor(
            args.num_workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(settings,),
        ) as pool:
            pending: collections.deque = collections.deque()
            try:
                for index, buf in enumerate(buffers):
                    pending.append((pool.submit(_work, (index, buf.lines, buf.doc_lines)), buf.chars))
                    del buf
                    # Bounded memory: at most one buffer waits for a free worker.
                    while len(pending) > args.num_workers:
                        future, chars = pending.popleft()
                        collect(future.result(), chars)
                while pending:
                    future, chars = pending.popleft()
                    collect(future.result(), chars)
            except concurrent.futures.process.BrokenProcessPool as e:
                raise RuntimeError(
                    "a create-pretraining-data worker process died (out of memory? or, when calling from "
                    "Python, is the caller's code under `if __name__ == '__main__':`?)"
                ) from e
            finally:
                for future, _ in pending:
                    future.cancel()
