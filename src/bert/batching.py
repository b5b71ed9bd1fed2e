"""Which training records each step reads: the one epoch-permutation rule of every runner (torch-free).

Every runner draws its training data from a `RecordStream`: epoch e is the permutation of the N records
seeded by `(seed, e)`, and the epochs follow one another, so a position in the stream is a function of the
seed alone and a resumed run reads what an uninterrupted one would. Pre-training takes consecutive records
of it (`bert.pretraining.inputs`); fine-tuning and the sentence commands take a `BatchPlan`'s batches, cut
from it in one of two ways, by what they know of their records:

- records given by their lengths (fine-tuning, `bert.finetune`): steps take consecutive batches of the
  stream, crossing epoch boundaries (the original repeats, shuffles and batches with `drop_remainder`; its
  100-example shuffle buffer is replaced by a full shuffle). With `group_by_length` the stream is cut into
  mega-batches of `group_batches` batches, each sorted by length, split into batches and the batches
  shuffled, so a batch holds sequences of similar length.
- records given by their texts (`TextRecords`, the sentence commands, `bert.sentence.runner`): each
  epoch's permutation is cut into batches of `batch_size`, the last, incomplete one dropped, as
  sentence-transformers' loader does with `drop_last`. With `no_duplicates` (the in-batch-negative losses)
  an example joins a batch only when none of its texts is in the batch already, so no text is both a
  positive and an in-batch negative; an example put off waits for the next batch (sentence-transformers'
  NO_DUPLICATES sampler).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from bert.errors import InputError

# Batches per mega-batch sorted by length (fine-tuning's --group_by_length).
GROUP_BATCHES = 50


class RecordStream:
    """The endless stream of record indices: epoch e is a permutation of all N records seeded by (seed, e).

    Position `a` (an absolute count of records taken) is (epoch a // N, index a % N).

    Args:
        num_records: N.
        seed: the data-order seed.
        shuffle: False gives 0..N-1 every epoch (evaluation reads sequentially, as the original does).
    """

    def __init__(self, num_records: int, seed: int, shuffle: bool = True):
        self.n = num_records
        self.seed = seed
        self.shuffle = shuffle
        self._cache: dict[int, np.ndarray] = {}

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        if epoch not in self._cache:
            if len(self._cache) > 2:
                self._cache.pop(min(self._cache))
            self._cache[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._cache[epoch]

    def take(self, position: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Record indices and their epochs at stream positions `position .. position + count - 1`."""
        absolute = np.arange(position, position + count, dtype=np.int64)
        epochs, within = np.divmod(absolute, self.n)
        indices = np.empty(count, dtype=np.int64)
        for e in np.unique(epochs):
            m = epochs == e
            indices[m] = self.order(int(e))[within[m]]
        return indices, epochs

    def position(self, epoch: int, index: int) -> int:
        return epoch * self.n + index

    def state(self, position: int) -> dict[str, int]:
        epoch, index = divmod(position, self.n)
        return {"epoch": int(epoch), "index": int(index), "num_records": self.n, "seed": self.seed}


@runtime_checkable
class TextRecords(Protocol):
    """Training examples known by their texts (`bert.sentence.data.TrainingData`)."""

    source: str  # the file they come from, named in errors

    def __len__(self) -> int: ...

    def example(self, i: int) -> Sequence[str]: ...


class BatchPlan:
    """Which records make up the batch of each 0-based step (see the module docstring).

    Args:
        records: the records' lengths (a sequence of ints: the stream cut across epochs, grouped by length),
            or their texts (`TextRecords`: each epoch cut on its own).
        batch_size: records per step (the global batch).
        seed: seeds every epoch's permutation and every mega-batch's batch order.
        no_duplicates: keep the texts of a batch distinct (text records only).
        group_by_length: sort within mega-batches of `group_batches` batches (records given by length only).
    """

    def __init__(
        self,
        records: Sequence[int] | np.ndarray | TextRecords,
        batch_size: int,
        seed: int,
        no_duplicates: bool = False,
        *,
        group_by_length: bool = True,
        group_batches: int = GROUP_BATCHES,
    ):
        self.records = records
        self.by_epoch = isinstance(records, TextRecords)
        if no_duplicates and not self.by_epoch:
            raise ValueError("no_duplicates compares texts: give the records' texts, not their lengths")
        self.lengths = None if isinstance(records, TextRecords) else np.asarray(records)
        self.n = len(records)
        self.batch_size = batch_size
        self.seed = seed
        self.no_duplicates = no_duplicates
        self.group_by_length = group_by_length and not self.by_epoch
        self.group_batches = group_batches if self.group_by_length else 1
        self.stream = RecordStream(self.n, seed)
        self._group: tuple[int, list[np.ndarray]] | None = None
        self._epochs: list[list[np.ndarray]] = []

    def batch(self, step: int) -> np.ndarray:
        """The record indices of step `step`'s batch (sorted by length when grouping)."""
        if self.by_epoch:
            epoch = 0
            while step >= len(self._epoch(epoch)):
                step -= len(self._epoch(epoch))
                epoch += 1
            return self._epoch(epoch)[step]
        g, k = divmod(step, self.group_batches)
        if self._group is None or self._group[0] != g:
            self._group = (g, self._mega_batch(g))
        return self._group[1][k]

    def batches_per_epoch(self) -> int:
        """Full batches in an epoch: the first epoch's (text records; `no_duplicates` can leave fewer)."""
        return len(self._epoch(0)) if self.by_epoch else self.n // self.batch_size

    def state(self, step: int) -> dict[str, Any]:
        if self.by_epoch:
            return {"step": step, "num_examples": self.n, "seed": self.seed, "batch_size": self.batch_size}
        return {
            "step": step,
            "num_features": self.n,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "group_by_length": self.group_by_length,
        }

    # The stream cut across epochs.
    def _mega_batch(self, g: int) -> list[np.ndarray]:
        size = self.group_batches * self.batch_size
        indices, _ = self.stream.take(g * size, size)
        if not self.group_by_length or self.lengths is None:
            return [indices]
        indices = indices[np.argsort(-self.lengths[indices], kind="stable")]
        batches = [indices[i : i + self.batch_size] for i in range(0, size, self.batch_size)]
        perm = np.random.default_rng([self.seed, 1 << 20, g]).permutation(len(batches))
        return [batches[i] for i in perm]

    # Each epoch cut on its own.
    def _epoch(self, epoch: int) -> list[np.ndarray]:
        while len(self._epochs) <= epoch:
            order = self.stream.order(len(self._epochs))
            batches = self._dedup(order) if self.no_duplicates else self._cut(order)
            if not batches:
                source = self.records.source if isinstance(self.records, TextRecords) else "the training data"
                raise InputError(
                    f"{source}: {self.n} examples make no full batch of {self.batch_size}"
                    + (" without repeated texts" if self.no_duplicates else "")
                    + "; lower --train_batch_size"
                )
            self._epochs.append(batches)
        return self._epochs[epoch]

    def _cut(self, order: np.ndarray) -> list[np.ndarray]:
        n = len(order) // self.batch_size * self.batch_size
        return [order[i : i + self.batch_size] for i in range(0, n, self.batch_size)]

    def _dedup(self, order: np.ndarray) -> list[np.ndarray]:
        assert isinstance(self.records, TextRecords)  # checked in __init__
        batches: list[np.ndarray] = []
        waiting = [int(i) for i in order]
        while len(waiting) >= self.batch_size:
            batch: list[int] = []
            seen: set[str] = set()
            rest: list[int] = []
            for j, i in enumerate(waiting):
                if len(batch) == self.batch_size:
                    rest.extend(waiting[j:])
                    break
                texts = set(self.records.example(i))
                if texts & seen:
                    rest.append(i)
                else:
                    batch.append(i)
                    seen |= texts
            if len(batch) < self.batch_size:
                break
            batches.append(np.array(batch))
            waiting = rest
        return batches
