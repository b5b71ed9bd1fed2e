"""Knowledge distillation: a larger teacher's outputs as soft labels for a smaller student.

The small-BERT release (google-research/bert README, "BERT-Tiny ... BERT-Base") notes that its compact
models work best with distillation, where fine-tuning labels come from a larger fine-tuned teacher. This
module is the one place for it:

- the teacher's outputs, computed once per training row and cached on disk (`cached_teacher_outputs`): a
  memory-mapped float32 array beside a JSON manifest of what it holds, keyed by the teacher's weights
  (`weights_digest`) and the data (`data_digest`), so every epoch and a resumed run read the same numbers
  without running the teacher again;
- the soft-label losses (`kd_*`), per example, so the heads' `loss_normalizers` design still adds
  micro-batches and processes up to the loss of the global batch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from bert.checkpoint import DIGEST_KEY, WEIGHTS_NAME, read_checkpoint, tensors_digest
from bert.errors import InputError
from bert.outputs import remove_temporaries
from bert.utils import atomic_write, load_json_file, progress

logger = logging.getLogger(__name__)

CACHE_VERSION = 1  # bump when the layout of a cache file changes; older files are then recomputed


# ------------------------------------------------------------------------------------------- digests
def weights_digest(model_dir_or_checkpoint: str | os.PathLike) -> str:
    """A stable hex digest of a model's weights: the SHA-256 `bert.checkpoint.save_pretrained` saved in a
    safetensors file's metadata when there is one (reading it costs no tensor), else
    `checkpoint.tensors_digest` of the weights as read."""
    p = Path(model_dir_or_checkpoint)
    weights = p / WEIGHTS_NAME if p.is_dir() else p
    if weights.suffix == ".safetensors" and weights.is_file():
        try:
            with safe_open(str(weights), framework="pt") as f:
                saved = (f.metadata() or {}).get(DIGEST_KEY)
        except (SafetensorError, OSError):
            saved = None  # read_checkpoint below names the damage
        if saved:
            return str(saved)
    return tensors_digest(read_checkpoint(p).state_dict)


def data_digest(*parts: object) -> str:
    """SHA-256 over `parts` in order: a `Path`'s file bytes, anything else as canonical JSON (strings, numbers,
    lists, dicts). Each part is framed by its kind and length, so different sequences of parts never collide by
    concatenation."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            size = part.stat().st_size
            h.update(f"file:{size}\0".encode())
            with open(part, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
        else:
            data = json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
            h.update(f"json:{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------- cache
def _cache_names(cache_dir: Path, key: Mapping[str, object]) -> tuple[Path, Path, dict[str, Any]]:
    canonical = json.loads(json.dumps(dict(key), sort_keys=True))  # what the manifest will read back as
    name = data_digest(CACHE_VERSION, canonical)[:32]
    return cache_dir / f"{name}.npy", cache_dir / f"{name}.json", canonical


def _load_cached(array_path: Path, manifest_path: Path, expected: dict[str, Any]) -> np.ndarray | None:
    """The cached array when its manifest says exactly `expected` and the file is whole, else None."""
    if not array_path.is_file() or not manifest_path.is_file():
        return None
    try:
        manifest = load_json_file(manifest_path, "teacher cache manifest")
    except InputError as e:
        logger.warning("%s; recomputing the teacher's outputs", e)
        return None
    if manifest != expected:
        logger.info("teacher cache %s holds other outputs; recomputing", manifest_path)
        return None
    try:
        array = np.load(array_path, mmap_mode="r")
    except (ValueError, OSError) as e:  # a file cut short: numpy refuses to map it
        logger.warning("teacher cache %s cannot be read (%s); recomputing", array_path, e)
        return None
    if array.dtype != np.float32 or list(array.shape) != [expected["rows"], *expected["shape"]]:
        logger.warning("teacher cache %s has shape %s, not the manifest's; recomputing", array_path, array.shape)
        return None
    return array


def cached_teacher_outputs(
    cache_dir: str | os.PathLike,
    key: Mapping[str, object],
    num_rows: int,
    row_shape: tuple[int, ...],
    compute: Callable[[int, int], np.ndarray],
    batch_rows: int = 256,
    desc: str = "teacher",
) -> np.ndarray:
    """The teacher's outputs for `num_rows` rows, computed once and read back from `cache_dir` afterwards.

    Args:
        cache_dir: the folder of cache files (created if missing).
        key: JSON-serialisable description of the outputs (teacher digest, data digest, settings); the file's
            name is its digest and the manifest beside the file holds it, so another key never reads this file.
        num_rows, row_shape: the array is `(num_rows, *row_shape)` float32.
        compute: rows `[start, stop)` -> a float array `(stop - start, *row_shape)`; called under
            `torch.inference_mode` in chunks of `batch_rows`, each written straight into a memory-mapped
            temporary file (memory holds one chunk), renamed into place once every row is there.
        desc: the progress bar's label, and the teacher's name in errors.

    Returns:
        A read-only float32 `np.memmap` of shape `(num_rows, *row_shape)`.

    A manifest whose key, row count, shape or dtype differ, a missing manifest (a run killed between the
    rename and the manifest) or a file cut short is recomputed. Non-finite teacher outputs are an `InputError`.
    """
    if num_rows < 0 or batch_rows < 1:
        raise ValueError(f"num_rows={num_rows} and batch_rows={batch_rows}: need num_rows >= 0 and batch_rows >= 1")
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    array_path, manifest_path, canonical = _cache_names(cache, key)
    expected = {"key": canonical, "rows": int(num_rows), "shape": [int(d) for d in row_shape], "dtype": "float32"}
    cached = _load_cached(array_path, manifest_path, expected)
    if cached is not None:
        logger.info("%s: %d cached outputs from %s", desc, num_rows, array_path)
        return cached

    # A killed run's temporary files of this name are of no use: its rows are not known to be whole.
    remove_temporaries(cache, [array_path.name])
    manifest_path.unlink(missing_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{array_path.name}.", suffix=".tmp", dir=cache)
    os.close(fd)
    tmp = Path(tmp_name)
    shape = (int(num_rows), *(int(d) for d in row_shape))
    try:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
        starts = range(0, num_rows, batch_rows)
        for start in progress(starts, desc=desc, unit="chunk", total=len(starts)):
            stop = min(start + batch_rows, num_rows)
            with torch.inference_mode():  # the teacher is never trained: no graph, no gradients
                rows = np.asarray(compute(start, stop), dtype=np.float32)
            if rows.shape != (stop - start, *shape[1:]):
                raise ValueError(f"{desc}: compute({start}, {stop}) returned shape {rows.shape}, not {shape[1:]}")
            if not np.isfinite(rows).all():
                bad = start + int(np.argwhere(~np.isfinite(rows.reshape(len(rows), -1)).all(axis=1))[0, 0])
                raise InputError(
                    f"{desc}: the teacher's output for row {bad} is not a finite number (NaN or inf); check the "
                    "teacher model (run it with `bert predict`) or the data"
                )
            out[start:stop] = rows
        out.flush()
        del out
        os.replace(tmp, array_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with atomic_write(manifest_path) as f:
        f.write(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    logger.info("%s: %d outputs computed and cached in %s", desc, num_rows, array_path)
    return np.load(array_path, mmap_mode="r")
