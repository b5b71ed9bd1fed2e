"""The original algorithm of create_pretraining_data.py, line for line.

Reference: google-research/bert `create_pretraining_data.py` @ eedf571. These functions draw from one
`random.Random(random_seed)` in the original's order, so a given seed writes the same records as the
original (tested against its output). Like the original they hold the whole corpus and every instance
in memory, and they keep the original's quirks: `target_seq_length` drawn per document, a random
"next" segment that may come from the same document, random replacements that may be special tokens,
`num_to_predict` counting `[CLS]`/`[SEP]` with Python's `round`, whole-word groups that join a `##`
piece across `[SEP]`, label 1 = random next. `bert.pretraining.streaming` is the same algorithm in
bounded memory. No torch here.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bert.utils import iter_lines

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ("[CLS]", "[SEP]", "[MASK]")
TOKENIZE_BATCH = 4096  # lines per tokenizer call


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
            batch = [line.strip() for line in itertools.islice(lines, TOKENIZE_BATCH)]
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
        warn_no_break(path, seen, blank)
    return [d for d in all_documents if d]


def warn_no_break(path: str, lines: int, breaks: int) -> None:
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


def log_example(tokens: Sequence[str], features: dict[str, Any]) -> None:
    logger.info("*** Example ***")
    logger.info("tokens: %s", " ".join(tokens))
    for name, values in features.items():
        logger.info("%s: %s", name, " ".join(str(v) for v in np.asarray(values).tolist()))
