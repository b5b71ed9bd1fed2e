"""Long documents in windows (`--long_document=windows`; not in the original, which cuts every example at
`max_seq_length`): text_a read whole in windows of `max_seq_length` that overlap by `doc_stride`, as
run_squad.py's `_DocSpan`s read a SQuAD context, each window a feature converted as `bert.tasks.glue` converts
an example, and the windows' logits pooled per example.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bert.errors import InputError
from bert.tasks.glue import InputExample, InputFeatures, assemble_feature, example_label_id, log_feature
from bert.tasks.squad import DocSpan, doc_spans_for

if TYPE_CHECKING:
    from bert.tokenization import FullTokenizer

logger = logging.getLogger(__name__)


def window_spans(num_tokens_a: int, num_tokens_b: int, max_seq_length: int, doc_stride: int) -> tuple[int, list]:
    """How `long_document="windows"` cuts an example: (the number of text_b pieces kept, the windows over
    text_a as `DocSpan(start, length)`s).

    Text_b (when there is one) goes into every window after text_a. It is kept whole unless that would
    leave text_a less than half of the room, `(max_seq_length - 3) // 2` pieces, while text_a needs more:
    it is then cut at its end to leave text_a that half (or whatever less text_a needs). Text_a is read in
    windows of the remaining room, starting `doc_stride` pieces apart, as run_squad.py's `doc_spans`
    loop (`bert.tasks.squad.doc_spans_for`). An example that fits `max_seq_length` is one window, the
    `truncate` feature itself; an empty text_a is one empty window.
    """
    specials = 3 if num_tokens_b else 2  # [CLS] A [SEP] (B [SEP])
    room = max_seq_length - specials
    if num_tokens_b:
        num_tokens_b = min(num_tokens_b, max(room // 2, room - num_tokens_a))
    room -= num_tokens_b
    if room < 1:
        raise InputError(
            f"--max_seq_length={max_seq_length} leaves no room for windows of text: [CLS] and [SEP] need "
            f"{specials} positions; use a larger --max_seq_length"
        )
    return num_tokens_b, doc_spans_for(num_tokens_a, room, doc_stride) or [DocSpan(start=0, length=0)]


def convert_examples_to_windows(
    examples: Sequence[InputExample],
    label_list: Sequence[Any] | None,
    max_seq_length: int,
    tokenizer: FullTokenizer,
    doc_stride: int,
    pad: bool = True,
) -> list[InputFeatures]:
    """Features for long documents read whole: one feature per window of each example (`window_spans`),
    `[CLS] window of A [SEP] (B [SEP])`, each with its example's label and `example_index`, in example
    order. The first five features are logged as `convert_single_example` logs them.

    Args:
        examples: the examples.
        label_list: see `convert_single_example`.
        max_seq_length: the length of every window's feature (padded to it when `pad`).
        tokenizer: a `FullTokenizer`.
        doc_stride: pieces of text_a between the starts of consecutive windows.
        pad: as for `convert_examples_to_features`.
    """
    features: list[InputFeatures] = []
    for ex_index, example in enumerate(examples):
        if ex_index % 10000 == 0:
            logger.info("Writing example %d of %d", ex_index, len(examples))
        tokens_a = tokenizer.tokenize(example.text_a)
        tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else []
        num_b, spans = window_spans(len(tokens_a), len(tokens_b), max_seq_length, doc_stride)
        label_id = example_label_id(example, label_list)
        for span in spans:
            window = tokens_a[span.start : span.start + span.length]
            tokens, input_ids, input_mask, segment_ids = assemble_feature(
                window, tokens_b[:num_b], tokenizer, max_seq_length, pad
            )
            feature = InputFeatures(input_ids, input_mask, segment_ids, label_id, example_index=ex_index)
            if len(features) < 5:
                log_feature(example, tokens, feature)
            features.append(feature)
    return features


WINDOW_POOLINGS = ("mean", "max")


def pool_windows(outputs: Sequence[np.ndarray], features: Sequence[InputFeatures], num_examples: int, pooling: str):
    """One row of logits per example from one row per feature: [num_examples, L] float32.

    Features without `example_index` (`truncate`) are one per example, in order. Windows of one example
    are pooled by `pooling`: "mean" (the average of their logits) or "max" (each logit's largest value).
    """
    logits = np.stack(outputs).astype(np.float32)  # [F, L]
    owners = [f.example_index for f in features]
    if all(i is None for i in owners):
        if len(logits) != num_examples:
            raise ValueError(f"{len(logits)} features for {num_examples} examples")
        return logits
    if pooling not in WINDOW_POOLINGS:
        raise ValueError(f"pooling={pooling!r} must be one of {', '.join(WINDOW_POOLINGS)}")
    index = np.asarray(owners, dtype=np.int64)
    counts = np.bincount(index, minlength=num_examples)
    if len(counts) != num_examples or not counts.all():
        raise ValueError(f"windows of {len(counts)} examples, some missing, for {num_examples} examples")
    if pooling == "max":
        pooled = np.full((num_examples, logits.shape[1]), -np.inf, dtype=np.float32)
        np.maximum.at(pooled, index, logits)
        return pooled
    pooled = np.zeros((num_examples, logits.shape[1]), dtype=np.float64)
    np.add.at(pooled, index, logits)
    return (pooled / counts[:, None]).astype(np.float32)
