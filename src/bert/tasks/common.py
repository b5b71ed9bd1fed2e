"""What every fine-tuning task shares: padding, pair truncation, the original's step arithmetic, the
flags that name columns and labels. Torch-free."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bert.errors import InputError


def truncate_seq_pair(tokens_a: list[str], tokens_b: list[str], max_length: int) -> None:
    """Truncates a sequence pair in place to `max_length` tokens in all, one token at a time from the end
    of the longer sequence (of B when they are equal), as the original's `_truncate_seq_pair`."""
    # Truncating the longer side makes more sense than an equal share: when one sequence is very short,
    # each of its tokens likely carries more information (the original's comment).
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_length:
            break
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def pad_2d(rows: Sequence[Sequence[int]], length: int | None = None, value: int = 0, dtype=np.int64) -> np.ndarray:
    """Rows of varying length as one [len(rows), length] array, each right-padded with `value`.

    `length` defaults to the longest row; longer rows are an error.
    """
    longest = max((len(r) for r in rows), default=0)
    length = longest if length is None else length
    if longest > length:
        raise ValueError(f"a row has {longest} entries, more than the padded length {length}")
    out = np.full((len(rows), length), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def num_train_steps(num_examples: int, train_batch_size: int, num_train_epochs: float) -> int:
    """`int(num_examples / train_batch_size * num_train_epochs)`, truncated as the original (MRPC: 3668
    examples, batch 32, 3 epochs -> 343)."""
    return int(num_examples / train_batch_size * num_train_epochs)


def num_warmup_steps(num_train_steps: int, warmup_proportion: float) -> int:
    """`int(num_train_steps * warmup_proportion)` (MRPC: 343 steps, 0.1 -> 34)."""
    return int(num_train_steps * warmup_proportion)


def column_spec(value: str | None) -> int | str | None:
    """A column flag: a 0-based number (negative counts from the end) or a header name."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value


def label_list_flag(value: str | None) -> list[str] | None:
    """`--labels=a,b,c` -> ["a", "b", "c"]."""
    if value is None:
        return None
    labels = [x.strip() for x in value.split(",")]
    if not all(labels) or len(set(labels)) != len(labels):
        raise InputError(f"--labels={value!r}: give distinct, non-empty labels separated by commas")
    return labels
