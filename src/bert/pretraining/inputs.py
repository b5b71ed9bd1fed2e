"""What pre-training reads: the original's records (TFRecord files, read whole into compact arrays, or
memory-mapped native dataset directories) as one sequence, dynamic masking, and the per-rank
micro-batches of each step.

Dynamic masking (`--dynamic_masking`). The records hold masked inputs; the original tokens are put back
from `masked_lm_ids` at `masked_lm_positions`, and new positions are drawn each epoch, as many as the
record had, among the tokens that are not [CLS] or [SEP], each replaced 80% by [MASK], 10% kept, 10% by
a random vocabulary entry (the original's rule). Pieces are drawn one by one, or, with whole-word
masking, whole words at a time (a word: a piece and the "##" pieces after it), skipping a word that
would overshoot the record's count, as create_pretraining_data does. The draw depends only on
`(seed, epoch, record index)`, never on the number of processes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bert.batching import RecordStream
from bert.errors import InputError
from bert.formats.native import MANIFEST_NAME, NativeDataset, check_manifest, open_native_dataset
from bert.formats.tfrecord import read_examples
from bert.tasks.common import model_inputs
from bert.utils import expand_input_files

FEATURE_LENGTHS = {  # feature -> which flag fixes its length
    "input_ids": "max_seq_length",
    "input_mask": "max_seq_length",
    "segment_ids": "max_seq_length",
    "masked_lm_positions": "max_predictions_per_seq",
    "masked_lm_ids": "max_predictions_per_seq",
    "masked_lm_weights": "max_predictions_per_seq",
    "next_sentence_labels": None,
}
# The manifest fields that shape the instances of `create-pretraining-data --num_shards=N`: the shards of
# one set agree on all of them (num_workers, created and the shard's own index may differ).
SHARD_SET_FIELDS = (
    "max_seq_length",
    "max_predictions_per_seq",
    "masked_lm_prob",
    "short_seq_prob",
    "dupe_factor",
    "do_whole_word_mask",
    "do_lower_case",
    "random_seed",
    "vocab_sha256",
    "mode",
    "streaming_buffer_mb",
    "input_files",
    "num_shards",
)


class TFRecordSource:
    """All records of some TFRecord files, in memory as compact arrays.

    Args:
        paths: the files, read in this order.
        max_seq_length, max_predictions_per_seq: the lengths every record must have (the flags).
    """

    def __init__(self, paths: Sequence[str], max_seq_length: int, max_predictions_per_seq: int):
        self.paths = list(paths)
        expected = {"max_seq_length": max_seq_length, "max_predictions_per_seq": max_predictions_per_seq}
        columns: dict[str, list[np.ndarray]] = {name: [] for name in FEATURE_LENGTHS}
        self.file_ends: list[int] = []
        n = 0
        for path in self.paths:
            for index, example in enumerate(read_examples(path)):
                missing = [k for k in FEATURE_LENGTHS if k not in example]
                if missing:
                    raise InputError(
                        f"{path} record {index} lacks the features {', '.join(missing)}; --input_file must be "
                        "pre-training data written by create_pretraining_data"
                    )
                for name, flag in FEATURE_LENGTHS.items():
                    got = len(example[name])
                    want = expected[flag] if flag else 1
                    if got != want:
                        if flag is None:
                            raise InputError(f"{path} record {index}: next_sentence_labels has {got} values, not 1")
                        raise InputError(
                            f"--{flag}={want} does not match the data: {path} record {index} has {got} {name}; "
                            f"pass --{flag}={got} (it must equal the value the data was created with)"
                        )
                    columns[name].append(example[name])
                n += 1
            self.file_ends.append(n)
        if n == 0:
            raise InputError(f"--input_file: {', '.join(self.paths)} hold no records")
        # Compact storage: ids fit int32, masks and labels int8.
        self.arrays: dict[str, np.ndarray] = {
            "input_ids": np.stack(columns["input_ids"]).astype(np.int32),
            "input_mask": np.stack(columns["input_mask"]).astype(np.int8),
            "segment_ids": np.stack(columns["segment_ids"]).astype(np.int8),
            "masked_lm_positions": np.stack(columns["masked_lm_positions"]).astype(np.int32),
            "masked_lm_ids": np.stack(columns["masked_lm_ids"]).astype(np.int32),
            "masked_lm_weights": np.stack(columns["masked_lm_weights"]).astype(np.float32),
            "next_sentence_labels": np.stack(columns["next_sentence_labels"]).astype(np.int8),
        }

    def __len__(self) -> int:
        return len(self.arrays["input_ids"])

    def get_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return {
            k: v[indices].astype(np.float32 if k == "masked_lm_weights" else np.int64) for k, v in self.arrays.items()
        }

    def check_ids(self, vocab_size: int, type_vocab_size: int) -> None:
        """Refuse ids the model's embedding tables do not have, naming the file and record."""
        for name, limit, what in (
            ("input_ids", vocab_size, "vocab_size"),
            ("masked_lm_ids", vocab_size, "vocab_size"),
            ("segment_ids", type_vocab_size, "type_vocab_size"),
        ):
            bad = np.flatnonzero((self.arrays[name] >= limit).any(axis=1) | (self.arrays[name] < 0).any(axis=1))
            if len(bad):
                i = int(bad[0])
                f = int(np.searchsorted(self.file_ends, i, side="right"))
                start = self.file_ends[f - 1] if f else 0
                raise InputError(
                    f"{self.paths[f]} record {i - start}: {name} contains {int(self.arrays[name][i].max())}, but the "
                    f"config's {what} is {limit}; use the bert_config.json and vocab the data was made for"
                )


class NativeSource:
    """Records of one native dataset directory (memory-mapped)."""

    def __init__(self, path: str, manifest: dict, dataset: NativeDataset):
        self.path, self.manifest, self.dataset = path, manifest, dataset

    @classmethod
    def open(cls, path: str, max_seq_length: int, max_predictions_per_seq: int, vocab_file: str | None) -> NativeSource:
        source = cls(path, *open_native_dataset(path))
        check_manifest(
            source.manifest,
            max_seq_length=max_seq_length,
            max_predictions_per_seq=max_predictions_per_seq,
            vocab_file=vocab_file,
            source=str(Path(path) / MANIFEST_NAME),
        )
        # One shard of a set may be empty; the set is checked when the shards are joined.
        if len(source.dataset) == 0 and int(source.manifest.get("num_shards", 1)) == 1:
            raise InputError(f"--input_file: the native dataset {path} holds no records")
        return source

    def __len__(self) -> int:
        return len(self.dataset)

    def get_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        return self.dataset.get_batch(indices)

    def check_ids(self, vocab_size: int, type_vocab_size: int) -> None:
        data_vocab = self.manifest.get("vocab_size")
        if data_vocab is not None and int(data_vocab) > vocab_size:
            raise InputError(
                f"{self.path}: the data was made with a {data_vocab}-token vocab, but the config's vocab_size is "
                f"{vocab_size}; use a bert_config.json with vocab_size >= {data_vocab}"
            )


class ConcatSource:
    """Several sources as one sequence of records."""

    def __init__(self, sources: Sequence[TFRecordSource | NativeSource]):
        self.sources = list(sources)
        self.ends = np.cumsum([len(s) for s in self.sources])

    def __len__(self) -> int:
        return int(self.ends[-1])

    def get_batch(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        if len(self.sources) == 1:
            return self.sources[0].get_batch(indices)
        which = np.searchsorted(self.ends, indices, side="right")
        starts = np.concatenate([[0], self.ends[:-1]])
        out: dict[str, np.ndarray] = {}
        for s in np.unique(which):
            m = which == s
            part = self.sources[s].get_batch(indices[m] - starts[s])
            for k, v in part.items():
                if k not in out:
                    out[k] = np.empty((len(indices), *v.shape[1:]), v.dtype)
                out[k][m] = v
        return out

    def check_ids(self, vocab_size: int, type_vocab_size: int) -> None:
        for s in self.sources:
            s.check_ids(vocab_size, type_vocab_size)

    @property
    def manifests(self) -> list[dict]:
        return [s.manifest for s in self.sources if isinstance(s, NativeSource)]


def open_pretraining_data(
    spec: str, max_seq_length: int, max_predictions_per_seq: int, vocab_file: str | None, flag: str = "--input_file"
) -> ConcatSource:
    """Open TFRecord files and native dataset directories named by `spec`, checking the record lengths."""
    sources: list[TFRecordSource | NativeSource] = []
    tfrecords: list[str] = []
    for path in expand_input_files(spec, flag, directories=True):
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, MANIFEST_NAME)):
                raise InputError(
                    f"{flag}: {path} is a directory without {MANIFEST_NAME}; pass TFRecord files or a native "
                    "dataset directory written by `bert create-pretraining-data --output_format=native`"
                )
            sources.append(NativeSource.open(path, max_seq_length, max_predictions_per_seq, vocab_file))
        else:
            tfrecords.append(path)
    if tfrecords:
        sources.insert(0, TFRecordSource(tfrecords, max_seq_length, max_predictions_per_seq))
    return ConcatSource(join_shards(sources, flag))


def join_shards(sources: list[TFRecordSource | NativeSource], flag: str) -> list[TFRecordSource | NativeSource]:
    """The native shards of one `create-pretraining-data --num_shards=N` run become one source (at the place
    of the first), their part files in the order one unsharded run writes them (by buffer index), so that
    training on the shards equals training on one run's output. Refuses a missing or repeated shard and
    shards made with different flags."""
    shards = [s for s in sources if isinstance(s, NativeSource) and int(s.manifest.get("num_shards", 1)) > 1]
    if not shards:
        return sources
    first = shards[0]
    first_manifest = first.manifest
    for s in shards[1:]:
        for key in SHARD_SET_FIELDS:
            if s.manifest.get(key) != first_manifest.get(key):
                raise InputError(
                    f"{flag}: the shards {first.path} and {s.path} were made with different flags ({key}: "
                    f"{json.dumps(first_manifest.get(key))} vs {json.dumps(s.manifest.get(key))}); re-create the "
                    "shards with the same flags"
                )
    count = int(first_manifest["num_shards"])
    seen: dict[int, str] = {}
    for s in shards:
        index = int(s.manifest["shard_index"])
        if index in seen:
            raise InputError(f"{flag}: {seen[index]} and {s.path} are both shard {index} of {count}; pass each once")
        seen[index] = s.path
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise InputError(
            f"{flag}: shard(s) {', '.join(map(str, missing))} of {count} are missing ({first.path} is shard "
            f"{first_manifest['shard_index']}); pass every shard directory of the set (a list or a glob)"
        )
    parts = sorted(
        ({**part, "file": str(Path(s.path) / part["file"])} for s in shards for part in s.manifest["shards"]),
        key=lambda part: Path(part["file"]).name,
    )
    manifest = {**first_manifest, "shards": parts, "total_instances": sum(p["num_instances"] for p in parts)}
    joined = NativeSource(first.path, manifest, NativeDataset(Path(first.path), manifest))
    if len(joined) == 0:
        raise InputError(f"{flag}: the {count} shards of {first.path} hold no records")
    members = {id(s) for s in shards}
    return [joined if s is first else s for s in sources if id(s) not in members or s is first]


@dataclass
class MaskingVocab:
    """What dynamic masking needs from the vocabulary."""

    vocab_size: int  # random replacements are drawn from ids [0, vocab_size)
    cls_id: int
    sep_id: int
    mask_id: int
    continuation: np.ndarray | None = None  # [vocab_size] bool, True for "##" pieces: whole-word masking


def masking_vocab(vocab: dict[str, int], vocab_file: str, whole_word: bool) -> MaskingVocab:
    """What dynamic masking needs from `vocab` (read from `vocab_file`, named in errors)."""
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in vocab]
    if missing:
        raise InputError(f"--vocab_file={vocab_file} lacks {', '.join(missing)}, which --dynamic_masking needs")
    size = max(vocab.values()) + 1
    continuation = None
    if whole_word:
        continuation = np.zeros(size, dtype=bool)
        continuation[[i for t, i in vocab.items() if t.startswith("##")]] = True
    return MaskingVocab(size, vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"], continuation)


def whole_word_positions(
    candidates: np.ndarray, continuation: np.ndarray, count: int, rng: np.random.Generator
) -> np.ndarray:
    """Up to `count` positions, whole words at a time, in random word order (sorted on return).

    Args:
        candidates: the maskable positions, ascending.
        continuation: for each candidate, whether its piece starts with "##".
    """
    # A word starts at a non-"##" piece or after a gap (a "##" piece right after [SEP] starts its own).
    starts = np.flatnonzero(~continuation | (np.diff(candidates, prepend=-2) != 1))
    words = np.split(candidates, starts[1:])
    picked: list[int] = []
    for w in rng.permutation(len(words)):
        if len(picked) >= count:
            break
        if len(picked) + len(words[w]) <= count:
            picked.extend(words[w].tolist())
    return np.sort(np.asarray(picked, dtype=candidates.dtype))


def restore_original_tokens(features: dict[str, np.ndarray]) -> np.ndarray:
    """input_ids with the masked positions put back to their labels: [B, T]."""
    ids = features["input_ids"].copy()
    weights = features["masked_lm_weights"] > 0  # [B, P]
    rows = np.broadcast_to(np.arange(len(ids))[:, None], weights.shape)
    ids[rows[weights], features["masked_lm_positions"][weights]] = features["masked_lm_ids"][weights]
    return ids


def dynamic_mask(
    features: dict[str, np.ndarray], indices: np.ndarray, epochs: np.ndarray, seed: int, vocab: MaskingVocab
) -> dict[str, np.ndarray]:
    """New masked-LM inputs and labels for a batch (see the module docstring); other features unchanged.

    Args:
        features: the batch's 7 features [B, ...].
        indices, epochs: each row's record index and epoch: with `seed`, they seed its draw.
        vocab: special ids and the size of the random-replacement range.
    """
    original = restore_original_tokens(features)
    out = dict(features)
    ids = original.copy()
    P = features["masked_lm_positions"].shape[1]
    positions = np.zeros_like(features["masked_lm_positions"])
    labels = np.zeros_like(features["masked_lm_ids"])
    weights = np.zeros_like(features["masked_lm_weights"])
    counts = (features["masked_lm_weights"] > 0).sum(axis=1)
    candidates = (features["input_mask"] > 0) & (original != vocab.cls_id) & (original != vocab.sep_id)
    for b in range(len(ids)):
        rng = np.random.default_rng([seed, int(epochs[b]), int(indices[b]), 1])  # 1: a stream apart from shuffling
        cand = np.flatnonzero(candidates[b])
        n = min(int(counts[b]), len(cand), P)
        if vocab.continuation is None:
            chosen = np.sort(rng.choice(cand, size=n, replace=False))
        else:
            chosen = whole_word_positions(cand, vocab.continuation[original[b, cand]], n, rng)
            n = len(chosen)
        draw = rng.random(n)
        random_ids = rng.integers(0, vocab.vocab_size, size=n)
        kept = original[b, chosen]
        ids[b, chosen] = np.where(draw < 0.8, vocab.mask_id, np.where(draw < 0.9, kept, random_ids))
        positions[b, :n] = chosen
        labels[b, :n] = kept
        weights[b, :n] = 1.0
    out.update(input_ids=ids, masked_lm_positions=positions, masked_lm_ids=labels, masked_lm_weights=weights)
    return out


def features_to_model_inputs(features: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The original's 7 features as `BertForPreTraining.forward` arguments (the names renamed by
    `bert.tasks.common.model_inputs`), as contiguous int64 tensors (the weights float32)."""
    out = {}
    for name, value in model_inputs(features).items():
        dtype = np.float32 if name == "masked_lm_weights" else np.int64
        out[name] = torch.from_numpy(np.ascontiguousarray(value, dtype=dtype))
    out["next_sentence_labels"] = out["next_sentence_labels"].reshape(-1)
    return out


def rank_batches(
    source,
    stream: RecordStream,
    position: int,
    global_batch: int,
    rank: int,
    world_size: int,
    micro_batches: int,
    masking: tuple[int, MaskingVocab] | None = None,
) -> Iterator[list[dict[str, torch.Tensor]]]:
    """Per step, this rank's micro-batches of the next global batch of the stream.

    Rank r takes rows [r * B/W, (r+1) * B/W) of the global batch, cut into `micro_batches` pieces.

    Args:
        masking: (seed, vocab) to re-draw the masks (dynamic masking), or None.
    """
    per_rank = global_batch // world_size
    micro = per_rank // micro_batches
    while True:
        indices, epochs = stream.take(position, global_batch)
        position += global_batch
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        features = source.get_batch(indices[mine])
        if masking is not None:
            features = dynamic_mask(features, indices[mine], epochs[mine], masking[0], masking[1])
        inputs = features_to_model_inputs(features)
        yield [{k: v[j * micro : (j + 1) * micro] for k, v in inputs.items()} for j in range(micro_batches)]


def pretraining_loss(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], totals: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the original's loss over the global batch (the head's losses with the
    global batch's normalisers, `BertForPreTraining.loss_normalizers`), and its share of the metrics."""
    out = model(**batch, loss_normalizers=totals)
    return out.total_loss, pretraining_metrics(out, batch, totals)


def pretraining_metrics(
    out, batch: dict[str, torch.Tensor], totals: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """A micro-batch's share of the training metrics of `out` (a `PreTrainingOutput` with its losses)."""
    w = batch["masked_lm_weights"].reshape(-1).float()
    correct = (out.mlm_logits.detach().argmax(-1).reshape(-1) == batch["masked_lm_ids"].reshape(-1)).float()
    accuracy = (w * correct).sum() / (totals["masked_lm_weight"] + 1e-5)
    return {
        "loss": out.total_loss.detach(),
        "masked_lm_loss": out.masked_lm_loss.detach(),
        "next_sentence_loss": out.next_sentence_loss.detach(),
        "masked_lm_accuracy": accuracy,
    }
