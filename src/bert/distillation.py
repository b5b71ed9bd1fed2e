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
- the teachers of the fine-tuning commands: `ClassificationTeacher` reads raw text as `bert predict` does
  (its own tokenizer, so the student may have another vocabulary), `FeatureTeacher` the student's own word
  pieces (the same vocabulary): `TokenTeacher` (NER) and `SpanTeacher` (SQuAD's windows), and
  `distillation_loss`, the loss of a batch that carries their outputs;
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

from bert.checkpoint import (
    CONFIG_NAME,
    DIGEST_KEY,
    TOKENIZER_CONFIG_NAME,
    VOCAB_NAME,
    WEIGHTS_NAME,
    read_checkpoint,
    tensors_digest,
)
from bert.config import BertConfig
from bert.distributed import DistContext
from bert.errors import InputError
from bert.flags import LAYERS_FLAG, check_dtype
from bert.inference import Predictor
from bert.modeling import IGNORE_INDEX
from bert.outputs import remove_temporaries, waiting_lock
from bert.tokenization import load_vocab
from bert.training import LossFn
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
    Runs that share `cache_dir` compute an entry once: the others wait on its lock file, then read it.
    """
    if num_rows < 0 or batch_rows < 1:
        raise ValueError(f"num_rows={num_rows} and batch_rows={batch_rows}: need num_rows >= 0 and batch_rows >= 1")
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    array_path, manifest_path, canonical = _cache_names(cache, key)
    expected = {"key": canonical, "rows": int(num_rows), "shape": [int(d) for d in row_shape], "dtype": "float32"}
    cached = _load_cached(array_path, manifest_path, expected)
    if cached is None:
        # Runs sharing the cache (a grid's cells, commands side by side) compute an entry one at a time.
        with waiting_lock(cache / f".{array_path.stem}.lock", f"computing the teacher's outputs into {array_path}"):
            cached = _load_cached(array_path, manifest_path, expected)  # the run we waited for made it
            if cached is None:
                _compute_entry(array_path, manifest_path, expected, compute, batch_rows, desc)
                logger.info("%s: %d outputs computed and cached in %s", desc, num_rows, array_path)
                return np.load(array_path, mmap_mode="r")
    logger.info("%s: %d cached outputs from %s", desc, num_rows, array_path)
    return cached


def _compute_entry(
    array_path: Path,
    manifest_path: Path,
    expected: dict[str, Any],
    compute: Callable[[int, int], np.ndarray],
    batch_rows: int,
    desc: str,
) -> None:
    """Compute a cache entry into a temporary file, rename it into place, then write its manifest; called
    holding the entry's lock."""
    cache = array_path.parent
    # A killed run's temporary files of this name are of no use: its rows are not known to be whole.
    remove_temporaries(cache, [array_path.name])
    manifest_path.unlink(missing_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{array_path.name}.", suffix=".tmp", dir=cache)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _compute_into(tmp, (expected["rows"], *expected["shape"]), compute, batch_rows, desc)
        os.replace(tmp, array_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with atomic_write(manifest_path) as f:
        f.write(json.dumps(expected, indent=2, sort_keys=True) + "\n")


def _compute_into(
    path: Path, shape: tuple[int, ...], compute: Callable[[int, int], np.ndarray], batch_rows: int, desc: str
) -> None:
    """`compute`'s rows, `batch_rows` at a time under a progress bar, written into a new float32 .npy file at
    `path` (memory-mapped: memory holds one chunk); a row that is not finite is an `InputError`."""
    num_rows = shape[0]
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
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
    """[B]: KL(softmax(teacher / T) || softmax(student / T)) * T^2 per example, from [B, L] logits (soft targets;
    the T^2 keeps the gradient's scale as T changes). One term per example."""
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


def kd_span_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[B]: the mean of the start and the end `kd_classification_loss` of [B, T, 2] logits, each distribution over
    the positions where `mask` ([B, T]) is true (a window's real tokens; [CLS] is SQuAD 2.0's null answer), as
    DistilBERT's SQuAD distillation. One term per window, as `BertForQuestionAnswering` counts its loss."""
    t = float(temperature)
    # The least finite value, not -inf, for the padding: its probability is 0 and KL's 0 * (0 - 0) stays 0, not NaN.
    padding = (mask == 0)[..., None]
    least = torch.finfo(torch.float32).min
    log_p_teacher = (teacher_logits.float() / t).masked_fill(padding, least).log_softmax(1)  # over positions
    log_p_student = (student_logits.float() / t).masked_fill(padding, least).log_softmax(1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(1)  # [B, 2]: start, end
    return kl.mean(-1) * (t * t)


# ------------------------------------------------------------------------------- fine-tuning students
TEACHER_KEY = "teacher_logits"  # a batch's teacher outputs, beside the head's inputs
LABELLED_KEY = "labelled"  # 1 for an example with a label, 0 for a transfer example (the teacher's label only)
# The loss of each kind of head's outputs; a kind is the head's problem type, "token" (NER) or "span" (SQuAD).
KINDS = ("single_label_classification", "regression", "multi_label_classification", "token", "span")


def _teacher_base(teacher: str) -> Path:
    p = Path(teacher)
    return p if p.is_dir() else p.parent


def teacher_config(teacher: str) -> BertConfig:
    """The config beside a teacher's weights (no weights are read), for the checks before a run starts."""
    p = Path(teacher)
    if not (p.exists() or p.with_name(p.name + ".index").exists()):  # a TF checkpoint is a prefix
        raise InputError(f"--teacher={teacher}: no such model directory or checkpoint")
    base = _teacher_base(teacher)
    for name in (CONFIG_NAME, "bert_config.json"):
        if (base / name).is_file():
            return BertConfig.from_json_file(base / name)
    raise InputError(
        f"--teacher={teacher}: no config.json beside the weights; the teacher must be a model this project loads"
    )


def teacher_files_digest(teacher: str) -> str:
    """The digest of what besides the weights decides a teacher's outputs: its config (labels, fine-tuning
    length, long-document settings), vocabulary and tokenizer settings."""
    base = _teacher_base(teacher)
    names = (CONFIG_NAME, "bert_config.json", VOCAB_NAME, TOKENIZER_CONFIG_NAME)
    return data_digest(*[x for n in names if (base / n).is_file() for x in (n, base / n)])


def label_order(teacher: str, teacher_labels: Sequence[str] | None, student_labels: Sequence[str] | None) -> list[int]:
    """The teacher's output column of each student label: the teacher must know the student's labels, in any
    order (`InputError` naming both lists otherwise)."""
    if teacher_labels is None or student_labels is None or sorted(teacher_labels) != sorted(map(str, student_labels)):
        raise InputError(
            f"--teacher={teacher} has the labels {list(teacher_labels) if teacher_labels else 'none saved'}, the "
            f"student's data {list(student_labels) if student_labels else 'none'}; distil from a teacher fine-tuned "
            "on the same label set"
        )
    return [list(teacher_labels).index(str(label)) for label in student_labels]


def load_teacher_predictor(teacher: str, device: Any, batch_size: int, dtype: str, quantize: str) -> Predictor:
    """A cached teacher, `--teacher`, loaded to compute its outputs: in `--teacher_dtype` or quantized by
    `--teacher_quantize` (checked as those flags)."""
    check_dtype(dtype, quantize=quantize, device=device, dashes="--teacher_")
    return Predictor.from_pretrained(teacher, device=device, batch_size=batch_size, dtype=dtype, quantize=quantize)


def precision_key(dtype: str, quantize: str) -> dict[str, str]:
    """The part of a teacher cache's key that says how the teacher ran: its outputs differ by these."""
    return {"teacher_dtype": dtype, "teacher_quantize": quantize}


class ClassificationTeacher:
    """A fine-tuned classifier (`bert classify`'s OUTPUT/model) run on raw text as `bert predict` runs it: its
    own tokenizer, casing, length and long-document settings, so the student may have another vocabulary.

    Args:
        teacher: the --teacher path.
        problem_type: the student's (`single_label_classification`, `regression`, `multi_label_classification`).
        labels: the student's label list (None for regression).
        teacher_labels: the label list saved in the teacher's config (`finetune.saved_label_list`).
        dtype, quantize: `--teacher_dtype`, `--teacher_quantize`.
    """

    def __init__(
        self,
        teacher: str,
        problem_type: str,
        labels: Sequence[str] | None,
        teacher_labels: list[str] | None,
        dtype: str = "float32",
        quantize: str = "none",
    ):
        self.teacher, self.dtype, self.quantize = teacher, dtype, quantize
        config = teacher_config(teacher)
        own = config.extra.get("problem_type") or (
            "regression" if not teacher_labels else "single_label_classification"
        )
        if own != problem_type:
            raise InputError(
                f"--teacher={teacher} is a {own} model, the student's task is {problem_type}; distil from a teacher of "
                "the same kind"
            )
        self.problem_type = problem_type
        self.columns = [0] if problem_type == "regression" else label_order(teacher, teacher_labels, labels)

    @property
    def kind(self) -> str:
        """The distillation loss's kind (`KINDS`)."""
        return self.problem_type

    def outputs(
        self,
        examples: Sequence[Any],
        features: Sequence[Any],
        example_rows: np.ndarray,
        collate: Callable[[Sequence[Any]], dict[str, np.ndarray]],
        cache_dir: str | os.PathLike,
        dist: DistContext,
        batch_size: int,
        desc: str = "teacher",
    ) -> tuple[np.ndarray, np.ndarray]:
        """The teacher's logits of `examples` (`text_a`, `text_b`), [N, L] in the teacher's label order, through
        the cache (computed by rank 0 once; every rank reads the file), and each feature's row: its example's
        (`example_rows`; the windows of a long document share their example's)."""
        pairs = [(e.text_a, e.text_b) for e in examples]
        key = {
            "outputs": "classification_logits",
            "teacher": weights_digest(self.teacher),
            "teacher_files": teacher_files_digest(self.teacher),
            "texts": data_digest(pairs),
            **precision_key(self.dtype, self.quantize),
        }
        predictor: list[Predictor] = []

        def compute(start: int, stop: int) -> np.ndarray:
            if not predictor:  # loaded only when the cache misses
                predictor.append(
                    load_teacher_predictor(self.teacher, dist.device, batch_size, self.dtype, self.quantize)
                )
            return predictor[0].classification_logits(pairs[start:stop])

        width = len(self.columns)
        cached = cached_by_rank0(dist, cache_dir, key, len(pairs), (width,), compute, desc)
        return cached, example_rows


class FeatureTeacher:
    """A fine-tuned model run on the student's own features (the same word pieces, windows and length), so it must
    read the text as the student does: the same vocabulary and casing. The teacher's outputs at every position of
    each feature are cached; a subclass says which head (`kind`, `columns`).

    Args:
        teacher: the --teacher path.
        vocab_file, do_lower_case, max_seq_length: the student's.
        dtype, quantize: `--teacher_dtype`, `--teacher_quantize`.
    """

    kind = ""  # the distillation loss's kind (`KINDS`)
    outputs_name = ""  # what the cache holds, in its key
    columns: list[int]  # the teacher's output columns, in the student's order (set by the subclass)
    architecture = ""  # the head the teacher must be (config.json's architectures), when the subclass names one
    made_by = ""  # where such a teacher comes from, for the error

    def __init__(
        self,
        teacher: str,
        vocab_file: str,
        do_lower_case: bool,
        max_seq_length: int,
        dtype: str = "float32",
        quantize: str = "none",
    ):
        self.teacher, self.dtype, self.quantize = teacher, dtype, quantize
        config = teacher_config(teacher)
        if self.architecture:
            named = (config.extra.get("architectures") or ["none named"])[0]
            if named != self.architecture:
                raise InputError(
                    f"--teacher={teacher} is a {named} (config.json architectures), not a {self.architecture}; "
                    f"distil from {self.made_by}"
                )
        base = _teacher_base(teacher)
        if not (base / VOCAB_NAME).is_file() or load_vocab(base / VOCAB_NAME) != load_vocab(vocab_file):
            raise InputError(
                f"--teacher={teacher}: its vocab.txt is not the student's --vocab_file={vocab_file}; the teacher "
                "reads the student's own word pieces, so both must use one vocabulary"
            )
        casing = _read_tokenizer_casing(base)
        if casing is not None and casing != do_lower_case:
            raise InputError(
                f"--teacher={teacher} lower-cases {'its' if casing else 'no'} input (tokenizer_config.json), the "
                f"student --do_lower_case={do_lower_case}; the teacher reads the student's word pieces, so they "
                "must be the same"
            )
        if max_seq_length > config.max_position_embeddings:
            raise InputError(
                f"--max_seq_length={max_seq_length} exceeds --teacher={teacher}'s max_position_embeddings="
                f"{config.max_position_embeddings}"
            )
        self.max_seq_length = max_seq_length

    def outputs(
        self,
        examples: Sequence[Any],
        features: Sequence[Any],
        example_rows: np.ndarray,
        collate: Callable[[Sequence[Any]], dict[str, np.ndarray]],
        cache_dir: str | os.PathLike,
        dist: DistContext,
        batch_size: int,
        desc: str = "teacher",
    ) -> tuple[np.ndarray, np.ndarray]:
        """[F, max_seq_length, C] the teacher's outputs at each feature's positions (zero past its end), through
        the cache; each feature's row is its own."""
        key = {
            "outputs": self.outputs_name,
            "teacher": weights_digest(self.teacher),
            "teacher_files": teacher_files_digest(self.teacher),
            "inputs": data_digest([[list(f.input_ids), list(f.segment_ids)] for f in features]),
            **precision_key(self.dtype, self.quantize),
        }
        predictor: list[Predictor] = []
        width = len(self.columns)

        def compute(start: int, stop: int) -> np.ndarray:
            if not predictor:  # loaded only when the cache misses
                predictor.append(
                    load_teacher_predictor(self.teacher, dist.device, batch_size, self.dtype, self.quantize)
                )
            model, device = predictor[0].model, predictor[0].device
            out = np.zeros((stop - start, self.max_seq_length, width), dtype=np.float32)
            for i in range(start, stop, batch_size):
                arrays = collate(features[i : min(i + batch_size, stop)])
                ids, mask, types = (
                    torch.from_numpy(arrays[k]).to(device) for k in ("input_ids", "attention_mask", "token_type_ids")
                )
                logits = model(ids, mask, types).logits.float()  # [B, T, C]
                # Zero at the batch's padding too, so a row does not depend on the batch it was computed in.
                logits = (logits * mask[..., None]).cpu().numpy()
                out[i - start : i - start + len(logits), : logits.shape[1]] = logits
            return out

        cached = cached_by_rank0(dist, cache_dir, key, len(features), (self.max_seq_length, width), compute, desc)
        return cached, np.arange(len(features))


class TokenTeacher(FeatureTeacher):
    """A fine-tuned token classifier (`bert ner`'s OUTPUT/model) run on the student's own features: its logits
    at every word piece.

    Args:
        teacher: the --teacher path.
        labels: the student's label list.
        teacher_labels: the label list saved in the teacher's config.
        vocab_file, do_lower_case, max_seq_length, dtype, quantize: see `FeatureTeacher`.
    """

    kind = "token"
    outputs_name = "token_logits"

    def __init__(
        self,
        teacher: str,
        labels: Sequence[str],
        teacher_labels: list[str] | None,
        vocab_file: str,
        do_lower_case: bool,
        max_seq_length: int,
        dtype: str = "float32",
        quantize: str = "none",
    ):
        super().__init__(teacher, vocab_file, do_lower_case, max_seq_length, dtype, quantize)
        self.columns = label_order(teacher, teacher_labels, labels)


class SpanTeacher(FeatureTeacher):
    """A fine-tuned SQuAD model (`bert squad`'s OUTPUT/model, any `BertForQuestionAnswering`) run on the student's
    own doc-stride windows, as the student's --max_seq_length, --doc_stride and --max_query_length cut them: its
    start and end logits at every position (SQuAD 2.0's null answer is position 0, [CLS], of each window).

    Args: see `FeatureTeacher`.
    """

    kind = "span"
    outputs_name = "span_logits"
    columns = [0, 1]  # start, end
    architecture = "BertForQuestionAnswering"
    made_by = "a SQuAD model, such as OUTPUT/model of `bert squad`"


def _read_tokenizer_casing(base: Path) -> bool | None:
    """do_lower_case of the tokenizer_config.json in `base` (None when it says nothing)."""
    settings = load_json_file(base / TOKENIZER_CONFIG_NAME, "tokenizer_config.json", missing_ok=True)
    value = settings.get("do_lower_case") if isinstance(settings, dict) else None
    return None if value is None else bool(value)


Teacher = ClassificationTeacher | FeatureTeacher


def cached_by_rank0(
    dist: DistContext,
    cache_dir: str | os.PathLike,
    key: Mapping[str, object],
    num_rows: int,
    row_shape: tuple[int, ...],
    compute: Callable[[int, int], np.ndarray],
    desc: str,
) -> np.ndarray:
    """`cached_teacher_outputs` computed by rank 0, then read by the other ranks; an error on rank 0 stops all."""
    error: BaseException | None = None
    result = None
    if dist.is_main:
        try:
            result = cached_teacher_outputs(cache_dir, key, num_rows, row_shape, compute, desc=desc)
        except (InputError, OSError) as e:
            error = e
    message = dist.gather_object(None if error is None else str(error))[0]
    if error is not None:
        raise error
    if message is not None:
        raise InputError(message)
    if result is None:
        result = cached_teacher_outputs(cache_dir, key, num_rows, row_shape, compute, desc=desc)
    return result


def distillation_loss(kind: str, alpha: float, temperature: float) -> LossFn:
    """A `training.LossFn` for a fine-tuning head with the teacher's outputs in its batch (`TEACHER_KEY`,
    `LABELLED_KEY`): per example `alpha * KD + (1 - alpha) * label loss`, or KD alone for a transfer example,
    divided by the head's `loss_normalizers` count of the global batch, so micro-batches and processes add up."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} must be one of {', '.join(KINDS)}")

    def loss_fn(model: torch.nn.Module, batch: dict, totals: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs = {k: v for k, v in batch.items() if k not in (TEACHER_KEY, LABELLED_KEY)}
        out = model(**inputs)
        teacher = batch[TEACHER_KEY]
        if kind in ("token", "span"):  # cached at --max_seq_length; the batch is padded to its longest feature
            teacher = teacher[:, : out.logits.shape[1]]
        if kind == "regression":
            kd = kd_regression_loss(out.logits, teacher)
        elif kind == "multi_label_classification":
            kd = kd_multi_label_loss(out.logits, teacher, temperature)
        elif kind == "token":
            kd = kd_token_loss(out.logits, teacher, inputs["labels"] != IGNORE_INDEX, temperature)
        elif kind == "span":
            kd = kd_span_loss(out.logits, teacher, inputs["attention_mask"], temperature)
        else:
            kd = kd_classification_loss(out.logits, teacher, temperature)
        labelled = batch[LABELLED_KEY].float()
        example = labelled * (alpha * kd + (1.0 - alpha) * out.example_loss) + (1.0 - labelled) * kd
        count = totals["count"].clamp(min=1.0)
        loss = example.sum() / count
        return loss, {"loss": loss.detach(), "kd_loss": (kd.sum() / count).detach()}

    return loss_fn


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
