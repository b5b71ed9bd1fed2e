"""Pre-training data on disk in the native format: sharded, memory-mappable NumPy files.

A native dataset is a directory:

    manifest.json          what made the data (flags, vocab checksum, ...) and the shard list
    stats.json             corpus statistics of the run that wrote it
    shard_000000.npy ...   one structured NumPy array per shard, one record per instance

A record holds what the original's seven TFRecord features hold (create_pretraining_data.py,
`write_instance_to_example_files`), stored compactly:

| field | dtype | the TFRecord feature it gives |
| --- | --- | --- |
| `input_ids` | uint16 (int32 for vocabs > 65536) [max_seq_length] | `input_ids` (padded with 0) |
| `num_tokens` | uint16 | `input_mask` = position < num_tokens |
| `segment_b_start` | uint16 | `segment_ids` = num_tokens > position >= segment_b_start |
| `masked_lm_positions` | uint16 [max_predictions_per_seq] | `masked_lm_positions` (padded with 0) |
| `masked_lm_ids` | as `input_ids` [max_predictions_per_seq] | `masked_lm_ids` (padded with 0) |
| `num_predictions` | uint16 | `masked_lm_weights` = 1.0 for slot < num_predictions, else 0.0 |
| `next_sentence_label` | uint8 | `next_sentence_labels` (1 = random next, 0 = actual next) |

`input_mask` cannot be derived from `input_ids != 0`: a masked position may be replaced by any vocab
entry, `[PAD]` included. Shards open with `np.load(mmap_mode="r")`, so a reader touches only the records
it reads and a data loader can draw a uniform random permutation over the whole dataset.

Every file is written under a temporary name, and the directory appears under its final name only once
everything, manifest last, is complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bert.errors import InputError
from bert.utils import atomic_write

FORMAT_NAME = "bert-pretraining-native"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
FEATURE_NAMES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)


def record_dtype(max_seq_length: int, max_predictions_per_seq: int, vocab_size: int) -> np.dtype:
    """The structured dtype of one record (see the module docstring)."""
    ids = np.uint16 if vocab_size <= 1 << 16 else np.int32
    pos = np.uint16 if max_seq_length <= 1 << 16 else np.int32
    return np.dtype(
        [
            ("input_ids", ids, (max_seq_length,)),
            ("num_tokens", pos),
            ("segment_b_start", pos),
            ("masked_lm_positions", pos, (max_predictions_per_seq,)),
            ("masked_lm_ids", ids, (max_predictions_per_seq,)),
            ("num_predictions", pos),
            ("next_sentence_label", np.uint8),
        ]
    )


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_npy(path: str | os.PathLike, dtype: np.dtype, count: int, batches: Iterable[np.ndarray]) -> None:
    """Write a 1-D .npy file of `count` records batch by batch, so the whole array is never in memory.

    Raises:
        ValueError: the batches do not add up to `count` records (the file is then not written).
    """
    written = 0
    with atomic_write(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (count,)}
        )
        for batch in batches:
            if batch.dtype != dtype:
                raise ValueError(f"batch dtype {batch.dtype} is not the shard dtype {dtype}")
            f.write(np.ascontiguousarray(batch).tobytes())
            written += len(batch)
        if written != count:
            raise ValueError(f"{path}: wrote {written} records, expected {count}")


class NativeShardWriter:
    """Builds a native dataset directory; it appears at `output_dir` only when `close()` succeeds.

    Shards are written into a temporary sibling directory (`tmp_dir`): by `write()` from records in
    memory, or by another process that writes `tmp_dir / shard_name(k)` itself and is then registered
    with `add_shard()`. An existing dataset at `output_dir` is replaced; any other existing,
    non-empty directory is refused.

    Args:
        output_dir: the dataset directory to create.
        max_seq_length, max_predictions_per_seq, vocab_size: fix the record dtype.
        shard_size: records per shard for `write()`.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        max_seq_length: int,
        max_predictions_per_seq: int,
        vocab_size: int,
        shard_size: int = 1 << 16,
    ) -> None:
        self.output_dir = Path(output_dir)
        check_output_dir(self.output_dir)
        self.dtype = record_dtype(max_seq_length, max_predictions_per_seq, vocab_size)
        self.shard_size = shard_size
        self.output_dir.resolve().parent.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = Path(
            tempfile.mkdtemp(prefix=f".{self.output_dir.name}.tmp-", dir=self.output_dir.resolve().parent)
        )
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(self.tmp_dir, 0o777 & ~umask)  # mkdtemp makes it private; the dataset is not
        self.shards: list[dict[str, Any]] = []
        self._pending: list[np.ndarray] = []
        self._pending_count = 0
        self._closed = False

    def shard_name(self, index: int) -> str:
        return f"shard_{index:06d}.npy"

    def add_shard(self, name: str, num_instances: int) -> None:
        """Register a shard file written directly into `tmp_dir` (shards are listed in call order)."""
        if not (self.tmp_dir / name).is_file():
            raise FileNotFoundError(self.tmp_dir / name)
        self.shards.append({"file": name, "num_instances": int(num_instances)})

    def write(self, records: np.ndarray) -> None:
        """Append records (an array of `self.dtype`), cutting shards of `shard_size` records."""
        if records.dtype != self.dtype:
            raise ValueError(f"records have dtype {records.dtype}, expected {self.dtype}")
        while len(records):
            take = min(len(records), self.shard_size - self._pending_count)
            self._pending.append(records[:take])
            self._pending_count += take
            records = records[take:]
            if self._pending_count == self.shard_size:
                self._flush()

    def _flush(self) -> None:
        if not self._pending_count:
            return
        name = self.shard_name(len(self.shards))
        write_npy(self.tmp_dir / name, self.dtype, self._pending_count, self._pending)
        self.add_shard(name, self._pending_count)
        self._pending, self._pending_count = [], 0

    @property
    def num_instances(self) -> int:
        return sum(s["num_instances"] for s in self.shards) + self._pending_count

    def close(self, manifest: dict[str, Any], stats: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the manifest (the given fields plus format, dtype and shard list) and publish the directory."""
        self._flush()
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            **manifest,
            "record_dtype": np.lib.format.dtype_to_descr(self.dtype),
            "shards": self.shards,
            "total_instances": sum(s["num_instances"] for s in self.shards),
        }
        if stats is not None:
            with atomic_write(self.tmp_dir / "stats.json") as f:
                json.dump(stats, f, indent=2)
                f.write("\n")
        with atomic_write(self.tmp_dir / MANIFEST_NAME) as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
        old = None
        if self.output_dir.exists():
            check_output_dir(self.output_dir)
            old = self.output_dir.with_name(f".{self.output_dir.name}.old-{os.getpid()}")
            os.replace(self.output_dir, old)
        os.replace(self.tmp_dir, self.output_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self._closed = True
        return manifest

    def abort(self) -> None:
        """Remove everything written so far; `output_dir` is left as it was."""
        if not self._closed:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
            self._closed = True

    def __enter__(self) -> NativeShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._closed:
            self.abort()


def check_output_dir(path: Path) -> None:
    """Refuse to replace anything but a native dataset or an empty directory."""
    if not path.exists():
        return
    if not path.is_dir():
        raise InputError(
            f"--output_file={path}: a native dataset is a directory, and this is a file; choose another path"
        )
    if any(path.iterdir()) and not (path / MANIFEST_NAME).is_file():
        raise InputError(
            f"--output_file={path}: the directory is not empty and holds no {MANIFEST_NAME}; "
            "choose a new or empty directory (an existing native dataset is replaced)"
        )


class NativeDataset(Sequence):
    """The records of a native dataset, read through memory maps; item `i` is a dict of the 7 features.

    Feature arrays are int64 (`masked_lm_weights` float32), with the TFRecord shapes: `[max_seq_length]`,
    `[max_predictions_per_seq]` and `[1]` for `next_sentence_labels`.
    """

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.max_seq_length = int(manifest["max_seq_length"])
        self.max_predictions_per_seq = int(manifest["max_predictions_per_seq"])
        self.shards: list[np.ndarray] = []
        counts = []
        for shard in manifest["shards"]:
            file = path / shard["file"]
            try:
                arr = np.load(file, mmap_mode="r")
            except (OSError, ValueError) as e:
                raise InputError(f"{file}: cannot read shard ({e}); re-create the dataset") from e
            if arr.ndim != 1 or len(arr) != shard["num_instances"]:
                raise InputError(
                    f"{file}: holds {len(arr)} records but {MANIFEST_NAME} says {shard['num_instances']}; "
                    "the dataset is damaged, re-create it"
                )
            self.shards.append(arr)
            counts.append(len(arr))
        self._ends = np.cumsum(counts, dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def records(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The stored records at `indices` (negative indices count from the end), as one array."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        idx = np.where(idx < 0, idx + n, idx)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"index out of range for a dataset of {n} records")
        shard = np.searchsorted(self._ends, idx, side="right")
        starts = np.concatenate([[0], self._ends[:-1]])
        if len(self.shards) == 1:
            return self.shards[0][idx]
        out = np.empty(len(idx), self.shards[0].dtype if self.shards else None)
        for s in np.unique(shard):
            m = shard == s
            out[m] = self.shards[s][idx[m] - starts[s]]
        return out

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:  # type: ignore[override]
        if not isinstance(index, (int, np.integer)):
            raise TypeError("index a NativeDataset with an int; use get_batch for several records")
        if not -len(self) <= index < len(self):
            raise IndexError(f"record {index} out of range for a dataset of {len(self)}")
        return {k: v[0] for k, v in self.get_batch([index]).items()}

    def get_batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """The 7 features of several records, stacked: `input_ids` is [B, max_seq_length], and so on."""
        return records_to_features(self.records(indices))


def records_to_features(recs: np.ndarray) -> dict[str, np.ndarray]:
    """Expand stored records [B] into the 7 TFRecord features (int64, weights float32)."""
    t = np.arange(recs["input_ids"].shape[1])
    p = np.arange(recs["masked_lm_positions"].shape[1])
    num_tokens = recs["num_tokens"].astype(np.int64)[:, None]
    b_start = recs["segment_b_start"].astype(np.int64)[:, None]
    return {
        "input_ids": recs["input_ids"].astype(np.int64),
        "input_mask": (t < num_tokens).astype(np.int64),
        "segment_ids": ((t >= b_start) & (t < num_tokens)).astype(np.int64),
        "masked_lm_positions": recs["masked_lm_positions"].astype(np.int64),
        "masked_lm_ids": recs["masked_lm_ids"].astype(np.int64),
        "masked_lm_weights": (p < recs["num_predictions"].astype(np.int64)[:, None]).astype(np.float32),
        "next_sentence_labels": recs["next_sentence_label"].astype(np.int64)[:, None],
    }


def features_to_records(features: dict[str, np.ndarray], dtype: np.dtype) -> np.ndarray:
    """The inverse of `records_to_features` for stacked features in the original layout.

    Raises:
        ValueError: features that the compact record cannot hold (segment ids not of the form 0..0 1..1
            then padding, or weights not 1.0 then 0.0).
    """
    input_mask = np.asarray(features["input_mask"])
    n = len(input_mask)
    recs = np.zeros(n, dtype)
    num_tokens = input_mask.sum(axis=1)
    seg = np.asarray(features["segment_ids"])
    first_b = np.where(seg.any(axis=1), seg.argmax(axis=1), num_tokens)
    weights = np.asarray(features["masked_lm_weights"])
    num_pred = (weights > 0).sum(axis=1)
    recs["input_ids"] = features["input_ids"]
    recs["num_tokens"] = num_tokens
    recs["segment_b_start"] = first_b
    recs["masked_lm_positions"] = features["masked_lm_positions"]
    recs["masked_lm_ids"] = features["masked_lm_ids"]
    recs["num_predictions"] = num_pred
    recs["next_sentence_label"] = np.asarray(features["next_sentence_labels"]).reshape(n)
    back = records_to_features(recs)
    for name in ("input_mask", "segment_ids", "masked_lm_weights"):
        if not np.array_equal(back[name], np.asarray(features[name], dtype=back[name].dtype)):
            raise ValueError(f"feature {name} does not fit the native record layout")
    return recs


def open_native_dataset(path: str | os.PathLike) -> tuple[dict[str, Any], NativeDataset]:
    """Open a native dataset directory: its manifest and its records.

    Raises:
        InputError: no manifest, a manifest of another format or a newer version, or damaged shards.
    """
    path = Path(path)
    file = path / MANIFEST_NAME
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{path}: no {MANIFEST_NAME}; is this a dataset written by `bert create-pretraining-data` "
            "with --output_format=native?"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{file}: unreadable ({e}); re-create the dataset") from e
    if manifest.get("format") != FORMAT_NAME:
        raise InputError(f"{file}: format {manifest.get('format')!r} is not {FORMAT_NAME!r}")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise InputError(
            f"{file}: format_version {manifest['format_version']} is newer than this bert reads "
            f"({FORMAT_VERSION}); upgrade bert"
        )
    return manifest, NativeDataset(path, manifest)


def check_manifest(
    manifest: dict[str, Any],
    *,
    max_seq_length: int | None = None,
    max_predictions_per_seq: int | None = None,
    vocab_file: str | os.PathLike | None = None,
    do_lower_case: bool | None = None,
    source: str = MANIFEST_NAME,
) -> None:
    """Refuse flags that disagree with the data (the original left this to the user; see its README).

    Args:
        manifest: from `open_native_dataset`.
        max_seq_length, max_predictions_per_seq, vocab_file, do_lower_case: the job's flags; None skips
            a check.
        source: how to name the manifest in messages (e.g. its path).

    Raises:
        InputError: naming the flag, its value and the manifest's value.
    """
    for flag, value in (("max_seq_length", max_seq_length), ("max_predictions_per_seq", max_predictions_per_seq)):
        if value is not None and int(value) != int(manifest[flag]):
            raise InputError(
                f"--{flag}={value} does not match the data: {source} says {flag}={manifest[flag]}; "
                f"pass --{flag}={manifest[flag]} or re-create the data with --{flag}={value}"
            )
    if do_lower_case is not None and "do_lower_case" in manifest and bool(do_lower_case) != manifest["do_lower_case"]:
        raise InputError(
            f"--do_lower_case={do_lower_case} does not match the data: {source} says "
            f"do_lower_case={manifest['do_lower_case']}; pass --do_lower_case={manifest['do_lower_case']}"
        )
    if vocab_file is not None and "vocab_sha256" in manifest:
        digest = file_sha256(vocab_file)
        if digest != manifest["vocab_sha256"]:
            raise InputError(
                f"--vocab_file={vocab_file} (sha256 {digest[:12]}...) is not the vocabulary the data was made "
                f"with: {source} says vocab_sha256={manifest['vocab_sha256'][:12]}... "
                f"({manifest.get('vocab_size')} tokens); pass that vocab file or re-create the data"
            )
