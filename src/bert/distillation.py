"""Knowledge distillation: a larger teacher's outputs as soft labels for a smaller student.

The small-BERT release (google-research/bert README, "BERT-Tiny ... BERT-Base") notes that its compact
models work best with distillation, where fine-tuning labels come from a larger fine-tuned teacher. This
module is the one place for it:

- the teacher's outputs, computed once per training row and cached on disk (`cached_teacher_outputs`): a
  memory-mapped float32 array beside a JSON manifest of what it holds, keyed by the teacher's weights
  (`weights_digest`) and the data (`data_digest`), so every epoch and a resumed run read the same numbers
  without running the teacher again;
- the soft-label losses (`kd_*`), per example, so the heads' `loss_normalizers` design still adds
  micro-batches and processes up to the loss of the global batch;
- a student made of some of the teacher's layers (`student_from_teacher_layers`, DistilBERT's start),
  which `bert.starting_model` builds for `--init_from_teacher_layers`;
- MiniLM's relation losses between the last layers' self-attention (`minilm_losses`), which
  `bert pretrain --distill_attention` adds to the masked-LM KL (`bert.pretraining.teacher`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open

from bert.checkpoint import DIGEST_KEY, WEIGHTS_NAME, read_checkpoint, tensors_digest
from bert.config import BertConfig
from bert.errors import InputError
from bert.flags import LAYERS_FLAG
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


# ------------------------------------------------------------------------------- students from layers
_LAYER_KEY = re.compile(r"^(?P<prefix>(?:.*\.)?encoder\.layer\.)(?P<index>\d+)\.(?P<rest>.+)$")


def check_teacher_layers(layers: Sequence[int], num_teacher_layers: int, flag: str = LAYERS_FLAG) -> None:
    """`layers` must be distinct teacher layer indices in increasing order, each below the teacher's count."""
    given = f"{flag}={','.join(map(str, layers))}"
    if not layers:
        raise InputError(f"{flag} is empty: name the teacher's layers to keep, e.g. {flag}=0,2,4")
    if any(not 0 <= i < num_teacher_layers for i in layers):
        raise InputError(
            f"{given}: the teacher has {num_teacher_layers} layers, so each index must be between 0 and "
            f"{num_teacher_layers - 1}"
        )
    if list(layers) != sorted(set(layers)):
        raise InputError(
            f"{given}: name each of the teacher's {num_teacher_layers} layers at most once, in increasing order "
            "(the student keeps their order)"
        )


def student_from_teacher_layers(
    teacher_state: Mapping[str, torch.Tensor], teacher_config: BertConfig, layers: Sequence[int]
) -> tuple[BertConfig, dict[str, torch.Tensor]]:
    """A student made of some of a teacher's Transformer blocks (DistilBERT's start: every other layer).

    The student's config is the teacher's with `num_hidden_layers=len(layers)`; its encoder block `i` is the
    teacher's block `layers[i]`; every other tensor (embeddings, pooler, heads) is the teacher's. Raises
    `InputError` naming `--init_from_teacher_layers` for indices that are out of range, repeated or unsorted.
    """
    count = teacher_config.num_hidden_layers
    check_teacher_layers(layers, count)
    new_index = {old: new for new, old in enumerate(layers)}
    state: dict[str, torch.Tensor] = {}
    for name, tensor in teacher_state.items():
        m = _LAYER_KEY.match(name)
        if m is None:
            state[name] = tensor
        elif int(m["index"]) in new_index:
            state[f"{m['prefix']}{new_index[int(m['index'])]}.{m['rest']}"] = tensor
    config = dataclasses.replace(
        teacher_config, num_hidden_layers=len(layers), extra=copy.deepcopy(teacher_config.extra)
    )
    return config, state


# --------------------------------------------------------------------------------------------- losses
# Each returns one loss per example ([B]), the sum of its terms, so that a head's `loss_normalizers` (the global
# batch's count of terms) turns the examples' sums into the batch's mean, as the heads' own losses do.
def kd_classification_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[B]: KL(softmax(teacher / T) || softmax(student / T)) * T^2 per example, from [B, L] logits (Hinton et
    al.'s soft targets; the T^2 keeps the gradient's scale as T changes). One term per example."""
    t = float(temperature)
    log_p_teacher = F.log_softmax(teacher_logits.float() / t, dim=-1)
    log_p_student = F.log_softmax(student_logits.float() / t, dim=-1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1)
    return kl * (t * t)


def kd_regression_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """[B]: the squared difference of [B, 1] outputs (regression has no distribution to soften: the teacher's
    score is the target, as the label's is in `modeling.classification_loss`). One term per example."""
    return ((student_logits.float() - teacher_logits.float()) ** 2).sum(-1)


def kd_multi_label_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[B]: the sum over labels of the sigmoid cross-entropy of student / T against the teacher's probabilities
    sigmoid(teacher / T), times T^2, from [B, L] logits: one term per label, as `modeling.multi_label_loss`."""
    t = float(temperature)
    targets = torch.sigmoid(teacher_logits.float() / t)
    bce = F.binary_cross_entropy_with_logits(student_logits.float() / t, targets, reduction="none")
    return bce.sum(-1) * (t * t)


def kd_token_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[B]: the sum over the tokens where `mask` ([B, T]) is true of the per-token `kd_classification_loss` of
    [B, T, L] logits: one term per masked token, as token classification counts its labelled tokens."""
    B, T, L = student_logits.shape
    per_token = kd_classification_loss(student_logits.reshape(B * T, L), teacher_logits.reshape(B * T, L), temperature)
    return (per_token.view(B, T) * mask.float()).sum(-1)


# ------------------------------------------------------------------------------- MiniLM relation losses
# MiniLM distils the last Transformer block's self-attention: the distributions softmax(q k^T / sqrt(d)) per
# head and the value relations softmax(v v^T / sqrt(d)), each student row trained towards the teacher's by KL.
# The projections are split into a chosen number of relation heads (contiguous slices, as the model's own heads
# are), the same for teacher and student, so the two may have different hidden sizes and head counts; with as
# many relation heads as attention heads, the Q-K relation is the attention distribution itself.


def relation_log_probs(
    a: torch.Tensor, b: torch.Tensor, attention_mask: torch.Tensor | None, heads: int
) -> torch.Tensor:
    """log softmax over the keys of a_r b_r^T / sqrt(d) for each relation head r, in fp32: a, b [B, T, H] ->
    [B, R, T, T] (R = heads, d = H / R). Padded keys (`attention_mask` [B, T] 0) get probability 0."""
    B, T, H = a.shape
    d = H // heads
    a_heads = a.float().view(B, T, heads, d).transpose(1, 2)  # [B, T, H] -> [B, R, T, d]
    b_heads = b.float().view(B, T, heads, d).transpose(1, 2)
    scores = torch.matmul(a_heads, b_heads.transpose(-1, -2)) * d**-0.5  # [B, R, T, T]
    if attention_mask is not None:
        # The least finite value, not -inf: its probability is 0 and KL's 0 * (log 0 - log 0) stays 0, not NaN.
        scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, torch.finfo(scores.dtype).min)
    return scores.log_softmax(-1)


def relation_kl(
    teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """Per example [B]: the sum over relation heads and real query tokens of KL(teacher row || student row),
    from [B, R, T, T] log-probabilities (`relation_log_probs`)."""
    kl = (teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)).sum(-1)  # [B, R, T]
    if attention_mask is not None:
        kl = kl * attention_mask[:, None, :].to(kl.dtype)
    return kl.sum((1, 2))


def minilm_losses(
    student_qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    teacher_qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None,
    relation_heads: int,
) -> dict[str, torch.Tensor]:
    """MiniLM's attention-distribution and value-relation transfer between two last layers' queries, keys and
    values ([B, T, H_student] and [B, T, H_teacher], `BertModel.last_layer_qkv`).

    Returns per example [B]: "attention" (the Q-K relations' KL summed over relation heads and real query
    tokens), "value" (the same for the V-V relations) and "count" (relation heads x real tokens, what a
    mean divides by).
    """
    (sq, sk, sv), (tq, tk, tv) = student_qkv, teacher_qkv
    losses = {
        "attention": relation_kl(
            relation_log_probs(tq, tk, attention_mask, relation_heads),
            relation_log_probs(sq, sk, attention_mask, relation_heads),
            attention_mask,
        ),
        "value": relation_kl(
            relation_log_probs(tv, tv, attention_mask, relation_heads),
            relation_log_probs(sv, sv, attention_mask, relation_heads),
            attention_mask,
        ),
    }
    if attention_mask is not None:
        tokens = attention_mask.float().sum(-1)
    else:
        tokens = torch.full_like(losses["value"], sq.shape[1])
    losses["count"] = tokens * relation_heads
    return losses
