"""The streaming form of create_pretraining_data.py's algorithm: bounded memory, many processes.

The main process reads documents and deals them at random into a few buffers of `buffer_chars`
characters of text (a shuffle window); each full buffer is a task for a worker process, which tokenizes
it, walks its documents exactly as the original does (random "next" segments come from the other
documents of the buffer) and does truncation, assembly and masking for thousands of instances at once
with NumPy. The instances of a buffer (all `dupe_factor` passes) are shuffled together and written as
one part file. Every buffer has its own random generators, seeded from `random_seed` and the buffer's
index, so the output depends on the seed and the input only: it is the same for any number of workers.
The RNG order is not the original's, but every distribution is (tests compare the statistics). Two
differences by design: a file boundary ends a document, and a document longer than a buffer is cut
into pieces. No torch here.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import logging
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bert.formats.native import record_dtype, records_to_features, write_npy
from bert.formats.tfrecord import TFRecordWriter, encode_pretraining_examples
from bert.pretraining.instances import SPECIAL_TOKENS, TOKENIZE_BATCH, warn_no_break
from bert.tokenization import FullTokenizer
from bert.utils import exit_with_parent, iter_lines

logger = logging.getLogger(__name__)

ASSEMBLY_BATCH = 4096  # instances assembled and masked at once
_WINDOW_BUFFERS = 4  # buffers the reader deals documents into (the shuffle window)


@dataclass(frozen=True)
class GenerationSettings:
    """The flags of create_pretraining_data.py that shape the instances, and where a worker writes its
    part files; picklable, for the worker processes."""

    vocab_file: str
    do_lower_case: bool
    max_seq_length: int
    max_predictions_per_seq: int
    masked_lm_prob: float
    short_seq_prob: float
    dupe_factor: int
    do_whole_word_mask: bool
    random_seed: int
    output_format: str = "tfrecord"
    part_dir: str = ""


def _seed_of(random_seed: int, buffer_index: int) -> int:
    """A 64-bit seed for one buffer, independent of the process that handles it."""
    digest = hashlib.sha256(f"bert-pretraining-data:{random_seed}:{buffer_index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class BufferProcessor:
    """Turns one buffer of documents (raw lines) into a shard of instances; one per process."""

    def __init__(self, settings: GenerationSettings, tokenizer: Any = None) -> None:
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
        for start in range(0, len(lines), TOKENIZE_BATCH):
            ids = self.tokenizer.encode_batch(lines[start : start + TOKENIZE_BATCH])
            sizes = list(map(len, ids))
            lengths.extend(sizes)
            chunks.append(np.fromiter(chain(ids), dtype=np.int32, count=sum(sizes)))
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
        """Records for a batch of instance specs (see `bert.formats.native.record_dtype`)."""
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
            for start in range(0, n, ASSEMBLY_BATCH):
                rec = self.assemble(flat, specs[start : start + ASSEMBLY_BATCH], rng)
                stats.update(record_stats(rec, self.mask_id))
                yield rec

        path = os.path.join(self.s.part_dir, part_name(index, self.s.output_format))
        if self.s.output_format == "native":
            write_npy(path, self.dtype, n, batches())
        else:
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


def encode_records(rec: np.ndarray) -> list[bytes]:
    """Serialized `tf.train.Example`s of a batch of native records."""
    return encode_pretraining_examples(records_to_features(rec))


def part_name(index: int, output_format: str) -> str:
    return f"shard_{index:06d}.npy" if output_format == "native" else f"part_{index:06d}.tfrecord"


_WORKER: BufferProcessor | None = None


def init_worker(settings: GenerationSettings, parent_pid: int | None = None) -> None:
    """A worker process's set-up: its `BufferProcessor`, and an exit when `parent_pid` dies (a killed
    parent cannot stop its workers otherwise)."""
    global _WORKER
    if parent_pid is not None:
        exit_with_parent(parent_pid)
    _WORKER = BufferProcessor(settings)


def process_buffer(task: tuple[int, list[str], list[int]]) -> tuple[int, int, dict[str, Any]]:
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
    for doc, chars in _documents(input_files, buffer_chars, decode_errors):
        k = rng.randrange(_WINDOW_BUFFERS)
        buf = open_buffers[k]
        buf.add(doc, chars)
        if buf.chars >= buffer_chars:
            yield buf
            open_buffers[k] = _Buffer()
    yield from _last_buffers(open_buffers, buffer_chars)


def _documents(input_files: Sequence[str], buffer_chars: int, decode_errors: str) -> Iterator[tuple[list[str], int]]:
    """The documents of the files in order with their characters (newlines counted), each at most about
    `buffer_chars` long (a longer one is cut, with a warning the first time)."""
    warned_long = False
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
        warn_no_break(path, lines, breaks)


def _last_buffers(open_buffers: Sequence[_Buffer], buffer_chars: int) -> Iterator[_Buffer]:
    """The documents left in the open buffers: as few buffers as possible, of equal size (they are processed
    in parallel)."""
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
