"""`bert pretrain`: masked-LM and next-sentence pre-training (the original's run_pretraining.py).

Same flags and defaults as the original, the same losses (the model's, `bert.modeling.pretraining_losses`),
the same optimizer and schedule (`bert.optimization`), the same evaluation metrics and
`eval_results.txt`. Added: resumable checkpoints with exact data position, gradient accumulation,
bf16/fp16, gradient checkpointing, LAMB, dynamic masking, separate evaluation files, and data
parallelism under `torchrun` (DDP, or FSDP with `--fsdp`).

Data. `--input_file` is a comma-separated list of globs, each matching TFRecord files written by
`create_pretraining_data` (original or ours; read whole into compact arrays) or native dataset
directories (`bert create-pretraining-data --output_format=native`; memory-mapped, better for large
corpora). The records are one stream: every epoch is a permutation of all records drawn from
`(--seed, epoch)`, and a step takes the next `--train_batch_size` records of the stream, crossing
epoch boundaries (the original repeats, shuffles and batches with `drop_remainder`). The position in
the stream (epoch, index) is saved with each checkpoint, so a resumed run sees the same batches as an
uninterrupted one.

Batch sizes. `--train_batch_size` is the *global* batch of one optimizer step, as in the original: it is
split over the `torchrun` processes and then into `--gradient_accumulation_steps` micro-batches, so it
must be divisible by their product. Every micro-batch's loss is normalised by the totals of the global
batch (the sum of masked-LM weights, the number of sequences), so a step's gradient is the gradient of
the original loss over the whole global batch, whatever the number of processes and micro-batches: one
process and N processes give the same loss curve.

Dynamic masking (`--dynamic_masking`). The records hold masked inputs; the original tokens are put back
from `masked_lm_ids` at `masked_lm_positions`, and new positions are drawn each epoch, as many as the
record had, among the tokens that are not [CLS] or [SEP], each replaced 80% by [MASK], 10% kept, 10% by
a random vocabulary entry (the original's rule). Pieces are drawn one by one, or, with
`--do_whole_word_mask`, whole words at a time (a word: a piece and the "##" pieces after it), skipping a
word that would overshoot the record's count, as create_pretraining_data does. The draw depends only on
`(--seed, epoch, record index)`, never on the number of processes.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bert.errors import InputError
from bert.training import PerformanceArgs, TpuCompatArgs

logger = logging.getLogger(__name__)

FEATURE_LENGTHS = {  # feature -> which flag fixes its length
    "input_ids": "max_seq_length",
    "input_mask": "max_seq_length",
    "segment_ids": "max_seq_length",
    "masked_lm_positions": "max_predictions_per_seq",
    "masked_lm_ids": "max_predictions_per_seq",
    "masked_lm_weights": "max_predictions_per_seq",
    "next_sentence_labels": None,
}
EVAL_KEYS = (
    "global_step",
    "loss",
    "masked_lm_accuracy",
    "masked_lm_loss",
    "next_sentence_accuracy",
    "next_sentence_loss",
)


@dataclass
class PretrainArgs(TpuCompatArgs, PerformanceArgs):
    """Pre-train BERT with the masked-LM and next-sentence objectives (run_pretraining.py).

    Resumes from the newest checkpoint in --output_dir when there is one. Under
    `torchrun --nproc_per_node=N bert pretrain ...` the processes share the global batch.
    """

    bert_config_file: str = field(
        metadata={
            "help": "The config json file corresponding to the pre-trained BERT model. This specifies the model "
            "architecture. Or a released shape: tiny, mini, small, medium, base, large, L-4_H-256, ..."
        }
    )
    input_file: str = field(
        metadata={"help": "Input TF example files (can be a glob or comma separated), or native dataset directories."}
    )
    output_dir: str = field(metadata={"help": "The output directory where the model checkpoints will be written."})
    init_checkpoint: str | None = field(
        default=None, metadata={"help": "Initial checkpoint (usually from a pre-trained BERT model)."}
    )
    vocab_file: str | None = field(
        default=None,
        metadata={"help": "The vocabulary of the data: gives vocab_size for a shape name, checked against the config."},
    )
    max_seq_length: int = field(
        default=128,
        metadata={
            "help": "The maximum total input sequence length after WordPiece tokenization. Sequences longer than "
            "this will be truncated, and sequences shorter than this will be padded. Must match data generation."
        },
    )
    max_predictions_per_seq: int = field(
        default=20,
        metadata={"help": "Maximum number of masked LM predictions per sequence. Must match data generation."},
    )
    do_train: bool = field(default=False, metadata={"help": "Whether to run training."})
    do_eval: bool = field(default=False, metadata={"help": "Whether to run eval on the dev set."})
    train_batch_size: int = field(default=32, metadata={"help": "Total batch size for training."})
    eval_batch_size: int = field(default=8, metadata={"help": "Total batch size for eval."})
    learning_rate: float = field(default=5e-5, metadata={"help": "The initial learning rate for Adam."})
    num_train_steps: int = field(default=100000, metadata={"help": "Number of training steps."})
    num_warmup_steps: int = field(default=10000, metadata={"help": "Number of warmup steps."})
    save_checkpoints_steps: int = field(default=1000, metadata={"help": "How often to save the model checkpoint."})
    max_eval_steps: int = field(default=100, metadata={"help": "Maximum number of eval steps."})
    seed: int = field(default=12345, metadata={"help": "Seed of the initialisation, data order, dropout and masking."})
    optimizer: str = field(
        default="adamw_bert",
        metadata={
            "help": "adamw_bert (the original AdamWeightDecayOptimizer) or lamb (for large batches).",
            "choices": ["adamw_bert", "lamb"],
        },
    )
    dynamic_masking: bool = field(
        default=False, metadata={"help": "Draw new masked positions for every epoch (needs --vocab_file)."}
    )
    do_whole_word_mask: bool = field(
        default=False,
        metadata={"help": "With --dynamic_masking: mask all the WordPiece pieces of a word together."},
    )
    eval_files: str | None = field(
        default=None, metadata={"help": "Evaluate on these files instead of --input_file (globs, comma separated)."}
    )
    keep_checkpoint_max: int = field(default=5, metadata={"help": "Keep this many newest checkpoints (0: all)."})
    log_every: int = field(default=100, metadata={"help": "Write metrics every this many steps."})
    device: str | None = field(default=None, metadata={"help": "torch device; default cuda if available, else cpu."})
    fsdp: bool = field(
        default=False, metadata={"help": "Under torchrun, shard the model with FSDP instead of replicating it (DDP)."}
    )


# ---------------------------------------------------------------------------------------- reading data
class TFRecordSource:
    """All records of some TFRecord files, in memory as compact arrays.

    Args:
        paths: the files, read in this order.
        max_seq_length, max_predictions_per_seq: the lengths every record must have (the flags).
    """

    def __init__(self, paths: Sequence[str], max_seq_length: int, max_predictions_per_seq: int):
        from bert.tfrecord import read_examples

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
        self.arrays = {
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

    def __init__(self, path: str, max_seq_length: int, max_predictions_per_seq: int, vocab_file: str | None):
        from bert.datasets import MANIFEST_NAME, check_manifest, open_native_dataset

        self.path = path
        self.manifest, self.dataset = open_native_dataset(path)
        check_manifest(
            self.manifest,
            max_seq_length=max_seq_length,
            max_predictions_per_seq=max_predictions_per_seq,
            vocab_file=vocab_file,
            source=str(Path(path) / MANIFEST_NAME),
        )
        if len(self.dataset) == 0:
            raise InputError(f"--input_file: the native dataset {path} holds no records")

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


def expand_input_files(spec: str, flag: str = "--input_file") -> list[str]:
    """Comma-separated globs -> matching paths, each pattern's matches sorted, in pattern order."""
    paths: list[str] = []
    for pattern in (p.strip() for p in spec.split(",")):
        if not pattern:
            continue
        matches = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matches:
            raise InputError(f"{flag}={spec}: nothing matches {pattern}; check the path")
        paths.extend(matches)
    if not paths:
        raise InputError(f"{flag} is empty; pass TFRecord files or native dataset directories")
    return paths


def open_pretraining_data(
    spec: str, max_seq_length: int, max_predictions_per_seq: int, vocab_file: str | None, flag: str = "--input_file"
) -> ConcatSource:
    """Open TFRecord files and native dataset directories named by `spec`, checking the record lengths."""
    from bert.datasets import MANIFEST_NAME

    sources: list[TFRecordSource | NativeSource] = []
    tfrecords: list[str] = []
    for path in expand_input_files(spec, flag):
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, MANIFEST_NAME)):
                raise InputError(
                    f"{flag}: {path} is a directory without {MANIFEST_NAME}; pass TFRecord files or a native "
                    "dataset directory written by `bert create-pretraining-data --output_format=native`"
                )
            sources.append(NativeSource(path, max_seq_length, max_predictions_per_seq, vocab_file))
        else:
            tfrecords.append(path)
    if tfrecords:
        sources.insert(0, TFRecordSource(tfrecords, max_seq_length, max_predictions_per_seq))
    return ConcatSource(sources)


# ------------------------------------------------------------------------------------------ batching
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


@dataclass
class MaskingVocab:
    """What dynamic masking needs from the vocabulary."""

    vocab_size: int  # random replacements are drawn from ids [0, vocab_size)
    cls_id: int
    sep_id: int
    mask_id: int
    continuation: np.ndarray | None = None  # [vocab_size] bool, True for "##" pieces: whole-word masking


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
    """The one conversion from the original's feature names to `BertForPreTraining.forward` arguments."""
    return {
        "input_ids": torch.from_numpy(np.ascontiguousarray(features["input_ids"], dtype=np.int64)),
        "attention_mask": torch.from_numpy(np.ascontiguousarray(features["input_mask"], dtype=np.int64)),
        "token_type_ids": torch.from_numpy(np.ascontiguousarray(features["segment_ids"], dtype=np.int64)),
        "masked_lm_positions": torch.from_numpy(np.ascontiguousarray(features["masked_lm_positions"], dtype=np.int64)),
        "masked_lm_ids": torch.from_numpy(np.ascontiguousarray(features["masked_lm_ids"], dtype=np.int64)),
        "masked_lm_weights": torch.from_numpy(np.ascontiguousarray(features["masked_lm_weights"], dtype=np.float32)),
        "next_sentence_labels": torch.from_numpy(
            np.ascontiguousarray(features["next_sentence_labels"], dtype=np.int64).reshape(-1)
        ),
    }


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


# ---------------------------------------------------------------------------------------- losses
def pretraining_totals(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Normalisers of the original's losses: the masked-LM weight sum and the number of sequences."""
    return {
        "masked_lm_weight": batch["masked_lm_weights"].float().sum(),
        "examples": torch.tensor(float(len(batch["input_ids"])), device=batch["input_ids"].device),
    }


def pretraining_loss(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], totals: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the original's loss over the global batch.

    masked_lm_loss = sum(w * loss) / (W + 1e-5) and next_sentence_loss = sum(loss) / B, with W and B the
    global batch's weight sum and size: the shares of all micro-batches add up to the original's losses.
    """
    out = model(**batch)
    w = batch["masked_lm_weights"].reshape(-1).float()
    mlm = (w * out.masked_lm_example_loss).sum() / (totals["masked_lm_weight"] + 1e-5)
    nsp = out.next_sentence_example_loss.sum() / totals["examples"]
    loss = mlm + nsp
    correct = (out.mlm_logits.detach().argmax(-1).reshape(-1) == batch["masked_lm_ids"].reshape(-1)).float()
    accuracy = (w * correct).sum() / (totals["masked_lm_weight"] + 1e-5)
    return loss, {
        "loss": loss.detach(),
        "masked_lm_loss": mlm.detach(),
        "next_sentence_loss": nsp.detach(),
        "masked_lm_accuracy": accuracy,
    }


# ---------------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(
    wrapped: torch.nn.Module,
    source,
    eval_batch_size: int,
    max_eval_steps: int,
    dist,
    precision: str = "fp32",
) -> dict[str, float]:
    """The original's evaluation: `max_eval_steps` batches read sequentially (repeating the data), metrics
    as `tf.metrics` computes them over all batches.

    Returns masked_lm_accuracy (weighted by masked_lm_weights), masked_lm_loss (weighted mean of the
    per-prediction losses), next_sentence_accuracy, next_sentence_loss (mean), and loss (the mean over
    batches of each batch's total loss, as the Estimator reports it).
    """
    from bert.training import autocast

    stream = RecordStream(len(source), seed=0, shuffle=False)
    per_rank = eval_batch_size // dist.world_size
    rows = []  # per batch: this rank's sums
    was_training = wrapped.training
    wrapped.eval()
    for step in range(max_eval_steps):
        indices, _ = stream.take(step * eval_batch_size, eval_batch_size)
        batch = features_to_model_inputs(source.get_batch(indices[dist.rank * per_rank : (dist.rank + 1) * per_rank]))
        batch = {k: v.to(dist.device) for k, v in batch.items()}
        with autocast(dist.device, precision):
            out = wrapped(**batch)
        w = batch["masked_lm_weights"].reshape(-1).float()
        correct = (out.mlm_logits.float().argmax(-1).reshape(-1) == batch["masked_lm_ids"].reshape(-1)).float()
        nsp_correct = (out.nsp_logits.float().argmax(-1) == batch["next_sentence_labels"]).float()
        rows.append(
            torch.stack(
                [
                    (w * correct).sum(),
                    w.sum(),
                    (w * out.masked_lm_example_loss).sum(),
                    nsp_correct.sum(),
                    out.next_sentence_example_loss.sum(),
                    torch.tensor(float(len(batch["input_ids"])), device=dist.device),
                ]
            ).double()
        )
    wrapped.train(was_training)
    sums = dist.all_reduce_sum(torch.stack(rows)).cpu().numpy()  # [steps, 6]
    wc, ws, wl, nc, nl, nb = sums.T
    batch_loss = wl / (ws + 1e-5) + nl / nb
    return {
        "loss": float(batch_loss.mean()),
        "masked_lm_accuracy": float(wc.sum() / ws.sum()) if ws.sum() else 0.0,
        "masked_lm_loss": float(wl.sum() / ws.sum()) if ws.sum() else 0.0,
        "next_sentence_accuracy": float(nc.sum() / nb.sum()),
        "next_sentence_loss": float(nl.sum() / nb.sum()),
    }


def write_eval_results(output_dir: str | os.PathLike, results: dict[str, Any]) -> Path:
    """`eval_results.txt` as the original writes it (sorted `key = value`, float32 printed by numpy), and
    `eval_results.json`."""
    from bert.utils import atomic_write

    path = Path(output_dir) / "eval_results.txt"
    lines = []
    logger.info("***** Eval results *****")
    for key in sorted(results):
        value = results[key]
        text = str(int(value)) if key == "global_step" else str(np.float32(value))
        logger.info("  %s = %s", key, text)
        lines.append(f"{key} = {text}\n")
    with atomic_write(path) as f:
        f.writelines(lines)
    with atomic_write(Path(output_dir) / "eval_results.json") as f:
        json.dump(results, f, indent=2, sort_keys=True)
        f.write("\n")
    return path


# ---------------------------------------------------------------------------------------- the command
def compile_model(model: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """`torch.compile` the model in place (`--compile`), with a fallback to eager execution.

    In place, like `nn.Module.compile`: the class, the parameter names and the state dict stay as they
    are, and DDP or FSDP wrap the model afterwards as usual (DDP's forward marks the compiled frame so that
    dynamo splits the graph at gradient buckets). Compilation happens at the first call; when torch.compile
    itself fails there (no C++ compiler or Triton, an unsupported operator, ...), a warning is logged and
    the model runs eagerly from then on. Errors of the inputs are raised as in eager mode.

    Args:
        model: the unwrapped model.
        compile_kwargs: passed to `torch.compile` (e.g. `backend`, `mode`, `dynamic`).

    Returns:
        `model` itself.
    """
    try:
        compiled = torch.compile(model._call_impl, **compile_kwargs)
    except Exception as e:  # torch.compile unsupported on this platform or Python version
        logger.warning("--compile: torch.compile is unavailable (%s: %s); running eagerly", type(e).__name__, e)
        return model

    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return compiled(*args, **kwargs)
        except torch._dynamo.exc.TorchDynamoException as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            logger.warning("--compile: compilation failed (%s: %s); running eagerly", type(e).__name__, reason)
            model._compiled_call_impl = None
            return model._call_impl(*args, **kwargs)

    model._compiled_call_impl = call
    return model


def _check_flags(args: PretrainArgs, world_size: int) -> None:
    """Everything that can be checked from the flags alone, before any file is read."""
    if not args.do_train and not args.do_eval:
        raise InputError("At least one of `do_train` or `do_eval` must be True: pass --do_train and/or --do_eval")
    args.check_no_tpu()
    positive = ["train_batch_size", "eval_batch_size", "save_checkpoints_steps", "max_eval_steps", "log_every"]
    positive += ["gradient_accumulation_steps", "max_seq_length", "max_predictions_per_seq"]
    if args.do_train:
        positive.append("num_train_steps")
    for name in positive:
        if getattr(args, name) < 1:
            raise InputError(f"--{name}={getattr(args, name)} must be at least 1")
    for name in ("num_warmup_steps", "keep_checkpoint_max"):
        if getattr(args, name) < 0:
            raise InputError(f"--{name}={getattr(args, name)} must not be negative")
    if args.do_train and not args.learning_rate > 0:
        raise InputError(f"--learning_rate={args.learning_rate} must be positive")
    if args.precision not in ("fp32", "bf16", "fp16"):
        raise InputError(f"--precision={args.precision} must be fp32, bf16 or fp16")
    if args.optimizer not in ("adamw_bert", "lamb"):
        raise InputError(f"--optimizer={args.optimizer} must be adamw_bert or lamb")
    parts = world_size * args.gradient_accumulation_steps
    if args.do_train and args.train_batch_size % parts:
        raise InputError(
            f"--train_batch_size={args.train_batch_size} must be divisible by processes x "
            f"--gradient_accumulation_steps = {world_size} x {args.gradient_accumulation_steps} = {parts}"
        )
    if args.do_eval and args.eval_batch_size % world_size:
        raise InputError(f"--eval_batch_size={args.eval_batch_size} must be divisible by the {world_size} processes")
    if args.dynamic_masking and not args.vocab_file:
        raise InputError("--dynamic_masking needs --vocab_file (for the [MASK], [CLS] and [SEP] ids)")
    if args.do_whole_word_mask and not args.dynamic_masking:
        raise InputError(
            "--do_whole_word_mask applies to --dynamic_masking only (static records keep the masks "
            "create-pretraining-data drew): add --dynamic_masking=true"
        )
    if args.fsdp and world_size == 1:
        logger.warning("--fsdp has no effect in a single process; start with torchrun --nproc_per_node=N")


def _masking_vocab(vocab: dict[str, int], vocab_file: str, whole_word: bool) -> MaskingVocab:
    missing = [t for t in ("[CLS]", "[SEP]", "[MASK]") if t not in vocab]
    if missing:
        raise InputError(f"--vocab_file={vocab_file} lacks {', '.join(missing)}, which --dynamic_masking needs")
    size = max(vocab.values()) + 1
    continuation = None
    if whole_word:
        continuation = np.zeros(size, dtype=bool)
        continuation[[i for t, i in vocab.items() if t.startswith("##")]] = True
    return MaskingVocab(size, vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"], continuation)


def run_pretrain(args: PretrainArgs) -> dict[str, Any]:
    """Train and/or evaluate; returns {"global_step", "train": last logged metrics, "eval": results}."""
    from bert import training

    dist = training.init_distributed(args.device)
    try:
        with contextlib.ExitStack() as stack:
            return _run(args, dist, stack)
    finally:
        training.shutdown_distributed()


def _run(args: PretrainArgs, dist, stack: contextlib.ExitStack) -> dict[str, Any]:
    from bert import training
    from bert.checkpoint import load_into, read_checkpoint
    from bert.config import resolve_config
    from bert.modeling import BertForPreTraining, num_parameters
    from bert.optimization import create_optimizer, polynomial_warmup_lr
    from bert.tokenization import load_vocab
    from bert.utils import set_seed, write_run_info

    # 1. Flags, vocab, data, config, output directory: all checked before any model is built.
    _check_flags(args, dist.world_size)
    vocab = load_vocab(args.vocab_file) if args.vocab_file else None
    vocab_entries = max(vocab.values()) + 1 if vocab else None
    masking = (
        (args.seed, _masking_vocab(vocab, args.vocab_file, args.do_whole_word_mask)) if args.dynamic_masking else None
    )
    train_source = open_pretraining_data(
        args.input_file, args.max_seq_length, args.max_predictions_per_seq, args.vocab_file
    )
    eval_source = train_source
    if args.do_eval and args.eval_files:
        eval_source = open_pretraining_data(
            args.eval_files, args.max_seq_length, args.max_predictions_per_seq, args.vocab_file, flag="--eval_files"
        )
    manifests = train_source.manifests
    config_is_file = os.path.exists(args.bert_config_file)
    vocab_size = vocab_entries
    if vocab_size is None and not config_is_file:
        sizes = {int(m["vocab_size"]) for m in manifests if "vocab_size" in m}
        if len(sizes) != 1:
            raise InputError(
                f"--bert_config_file={args.bert_config_file} names a shape, so its vocab_size comes from the vocab: "
                "pass --vocab_file=PATH"
            )
        vocab_size = sizes.pop()
    config = resolve_config(args.bert_config_file, vocab_size)
    if vocab_entries is not None:
        config.validate_vocab(vocab_entries, args.vocab_file)
    if args.max_seq_length > config.max_position_embeddings:
        raise InputError(
            f"--max_seq_length={args.max_seq_length} exceeds the model's max_position_embeddings="
            f"{config.max_position_embeddings}; use a shorter max_seq_length (and data made with it)"
        )
    for source in {id(train_source): train_source, id(eval_source): eval_source}.values():
        source.check_ids(config.vocab_size, config.type_vocab_size)
    resume_dir = training.latest_checkpoint(args.output_dir)
    if resume_dir is not None:
        training.check_checkpoint_config(resume_dir, config)
        info_path = resume_dir / training.TRAINER_STATE_NAME
        info = json.loads(info_path.read_text(encoding="utf-8")) if info_path.is_file() else {}
        if args.do_train and info.get("optimizer", args.optimizer) != args.optimizer:
            raise InputError(
                f"{info_path} was trained with --optimizer={info['optimizer']}; pass --optimizer={info['optimizer']} "
                "to resume it, or use a new --output_dir"
            )
    init = None
    if resume_dir is None and args.init_checkpoint:
        init = read_checkpoint(args.init_checkpoint)
    do_lower_case = None
    if manifests and "do_lower_case" in manifests[0]:
        do_lower_case = bool(manifests[0]["do_lower_case"])

    # 2. The model.
    stack.enter_context(training.log_to_file(Path(args.output_dir) / "log.txt", dist.is_main))
    if dist.is_main:
        write_run_info(args.output_dir, "pretrain", args)
    set_seed(args.seed)
    model = BertForPreTraining(config)
    state = None
    if resume_dir is not None:
        if args.init_checkpoint:
            logger.info("resuming from %s: --init_checkpoint=%s is ignored", resume_dir, args.init_checkpoint)
        else:
            logger.info("resuming from %s", resume_dir)
        init = read_checkpoint(resume_dir)
        state = training.load_training_state(resume_dir)
    elif init is None and not args.do_train:
        logger.warning("evaluating a randomly initialised model: no checkpoint in --output_dir, no --init_checkpoint")
    restored: set[str] = set()
    if init is not None:
        load_into(model, init)
        # Names as in the model: an encoder-only checkpoint's keys lack the "bert." prefix.
        prefixed = any(k.startswith("bert.") for k in init.state_dict)
        restored = {k if prefixed or k.startswith("cls.") else f"bert.{k}" for k in init.state_dict}
    logger.info("*** Features ***")
    for name, flag in FEATURE_LENGTHS.items():
        length = getattr(args, flag) if flag else 1
        logger.info("  name = %s, shape = (%d, %d)", name, args.train_batch_size, length)
    logger.info("**** Trainable Variables ****")
    for name, p in model.named_parameters():
        logger.info("  name = %s, shape = %s%s", name, tuple(p.shape), ", *INIT_FROM_CKPT*" if name in restored else "")
    logger.info("%d parameters", num_parameters(model))
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if args.compile:
        compile_model(model)
    wrapped = training.wrap_model(model, dist, fsdp=args.fsdp)
    torch.manual_seed(args.seed + dist.rank)  # dropout differs across ranks, as their examples do
    optimizer, scheduler = create_optimizer(
        model, args.learning_rate, max(args.num_train_steps, 1), args.num_warmup_steps, args.optimizer
    )
    trainer = training.Trainer(
        model,
        wrapped,
        optimizer,
        scheduler,
        dist,
        args.output_dir,
        precision=args.precision,
        max_grad_norm=1.0,
        save_checkpoints_steps=args.save_checkpoints_steps,
        keep_checkpoint_max=args.keep_checkpoint_max,
        log_every=args.log_every,
        vocab_file=args.vocab_file,
        do_lower_case=do_lower_case,
        examples_per_step=args.train_batch_size,
        desc="pretrain",
    )
    stream = RecordStream(len(train_source), args.seed)
    position = 0
    if state is not None:
        trainer.restore(state)
        # The schedule follows this run's flags, as the original rebuilds it from them on every run
        # (the same arithmetic as the LambdaLR, so an unchanged command resumes bit for bit).
        scheduler.base_lrs = [args.learning_rate] * len(optimizer.param_groups)
        factor = polynomial_warmup_lr(trainer.global_step, 1.0, max(args.num_train_steps, 1), args.num_warmup_steps)
        for group in optimizer.param_groups:
            group["initial_lr"] = args.learning_rate
            group["lr"] = args.learning_rate * factor
        data = state.get("data", {})
        if data.get("num_records") != len(train_source) or data.get("seed") != args.seed:
            logger.warning(
                "the data (%s records, seed %s) differs from the checkpoint's (%s records, seed %s): the data "
                "order continues but is not the one of an uninterrupted run",
                len(train_source),
                args.seed,
                data.get("num_records"),
                data.get("seed"),
            )
        position = stream.position(int(data.get("epoch", 0)), int(data.get("index", 0)))

    result: dict[str, Any] = {"output_dir": args.output_dir}
    if args.do_train:
        start_step, start_position = trainer.global_step, position
        if start_step >= args.num_train_steps:
            logger.info("global step %d already reached --num_train_steps=%d", start_step, args.num_train_steps)
        else:
            logger.info(
                "***** Running training ***** batch size %d, steps %d to %d, %d records",
                args.train_batch_size,
                start_step,
                args.num_train_steps,
                len(train_source),
            )
            batches = training.prefetch(
                rank_batches(
                    train_source,
                    stream,
                    position,
                    args.train_batch_size,
                    dist.rank,
                    dist.world_size,
                    args.gradient_accumulation_steps,
                    masking,
                ),
                pin=dist.device.type == "cuda",
            )

            def data_state(step: int) -> dict[str, int]:
                return stream.state(start_position + (step - start_step) * args.train_batch_size)

            result["train"] = trainer.train(
                batches,
                pretraining_loss,
                args.num_train_steps,
                data_state,
                totals_fn=pretraining_totals,
                checkpoint_info={
                    "optimizer": args.optimizer,
                    "train_batch_size": args.train_batch_size,
                    "seed": args.seed,
                },
            )
            batches.close()
        trainer.export_model(Path(args.output_dir) / "model")
    result["global_step"] = trainer.global_step
    if args.do_eval:
        logger.info("***** Running evaluation ***** batch size %d, %d steps", args.eval_batch_size, args.max_eval_steps)
        metrics = evaluate(wrapped, eval_source, args.eval_batch_size, args.max_eval_steps, dist, args.precision)
        metrics["global_step"] = trainer.global_step
        if dist.is_main:
            write_eval_results(args.output_dir, metrics)
            from bert.tensorboard import EventWriter

            with EventWriter(Path(args.output_dir) / "eval") as w:
                w.add_scalars(trainer.global_step, {k: v for k, v in metrics.items() if k != "global_step"})
        result["eval"] = metrics
    return result
