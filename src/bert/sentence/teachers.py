"""The teachers of sentence distillation (`--teacher` of `bert train-embeddings` and `bert train-reranker`):
what a teacher model says about the training data, computed once (by rank 0 of a distributed run) and cached
on disk (`bert.distillation.cached_teacher_outputs`, keyed by the teacher's weights, the data and the settings
that change its outputs), so epochs, resumed runs and later runs on the same data read it back.

- `embeddings`: an embedding model's vector of each text, as `bert embed` gives it (the teacher's own
  tokenizer, length, pooling and normalisation: a sentence-transformers directory's, so a teacher whose
  modules normalise gives unit vectors, and any other its raw mean-pooled vectors, as sentence-transformers'
  MSELoss recipe encodes its labels with the teacher);
- `group_scores`: a score for each (query, document) of each (query, positive, negatives...) group, the
  scores MarginMSE and KL distillation learn: a cross-encoder's logit, as `Predictor.rank(raw_scores=True)`
  gives it (`Predictor.classification_logits`, the pairs of many queries in one call), unbounded as the
  student's dot products and logits are; or, for `bert train-embeddings`, an embedding model's cosine
  similarity, as `Predictor.rank` gives it (each distinct text embedded once, `bert.inference.UnitVectorCache`):
  a larger bi-encoder teaching a smaller one how it ranks a query's candidates, where MSE on vectors weighs
  every direction alike.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert.distillation import cached_by_rank0, data_digest, load_teacher_predictor, precision_key, weights_digest
from bert.distributed import DistContext
from bert.errors import InputError
from bert.inference import Predictor, UnitVectorCache

if TYPE_CHECKING:
    from bert.commands.train_embeddings import SentenceTrainingArgs

logger = logging.getLogger(__name__)


def load_teacher(args: SentenceTrainingArgs, gives: str, student_size: int | None = None) -> Predictor:
    """The `--teacher` model (in `--teacher_dtype` / `--teacher_quantize`), checked for what it must give:
    "embeddings" (of `student_size` dimensions, the student's), "scores" (a cross-encoder's) or "similarities"
    (a cross-encoder's scores or an embedding model's cosines)."""
    teacher = args.teacher
    assert teacher is not None  # `loss_table.check_loss` refuses a teacher's loss without --teacher
    if not Path(teacher).exists():
        raise InputError(f"--teacher={teacher}: no such model directory or checkpoint")
    precision = (args.teacher_dtype, args.teacher_quantize)
    model = load_teacher_predictor(teacher, args.device, args.eval_batch_size, *precision)
    if gives == "scores" and not model.is_cross_encoder:
        raise InputError(
            f"--teacher={teacher} is not a cross-encoder (a sequence classifier with one output, as `bert "
            "train-reranker` saves); a reranker's --loss=margin_mse and distill_kl learn a cross-encoder's scores"
        )
    if gives == "embeddings":
        if model.is_cross_encoder:
            raise InputError(
                f"--teacher={teacher} is a cross-encoder; --loss=mse learns an embedding model's vectors (a "
                "cross-encoder teaches --loss=margin_mse or distill_kl)"
            )
        size = model.config.hidden_size
        if size != student_size:
            raise InputError(
                f"--teacher={teacher} gives {size}-dimensional embeddings, the student {student_size}-dimensional "
                f"ones; --loss=mse needs the same size: start the student from a model of hidden size {size}"
            )
    return model


def _key(kind: str, args: SentenceTrainingArgs, model: Predictor, data: object) -> dict[str, Any]:
    """What the outputs depend on: the weights, the data, how the teacher reads text and runs."""
    assert args.teacher is not None  # the outputs of the teacher `load_teacher` loaded
    return {
        "kind": kind,
        "teacher": weights_digest(args.teacher),
        "data": data_digest(data),
        "max_seq_length": model.max_seq_length,
        "tokenizer": model.tokenizer.tokenizer_config(),
        **precision_key(args.teacher_dtype, args.teacher_quantize),
    }


def embeddings(
    model: Predictor, args: SentenceTrainingArgs, texts: Sequence[str], cache: Path, dist: DistContext
) -> np.ndarray:
    """[len(texts), H] float32 (read-only, memory-mapped): the vector of each text by `model`, `load_teacher(args,
    ...)` (computed by rank 0, read by the others)."""
    key = _key("sentence embeddings", args, model, list(texts))
    key.update(pooling=model.default_pooling, normalize=model.default_normalize)
    logger.info("teacher %s: %s pooling, normalize %s", args.teacher, key["pooling"], key["normalize"])

    def compute(start: int, stop: int) -> np.ndarray:
        return model.embed(list(texts[start:stop]))

    size = model.config.hidden_size
    return cached_by_rank0(dist, cache, key, len(texts), (size,), compute, "teacher embeddings")


def group_scores(
    model: Predictor, args: SentenceTrainingArgs, groups: Sequence[Sequence[str]], cache: Path, dist: DistContext
) -> np.ndarray:
    """[len(groups), group size - 1] float32 (read-only, memory-mapped): for each (query, document, ...) group,
    the score of each (query, document) by `model`, `load_teacher(args, ...)` (computed by rank 0, read by the
    others): a cross-encoder's logit, an embedding model's cosine."""
    width = len(groups[0]) - 1

    def logits(start: int, stop: int) -> np.ndarray:
        pairs = [(g[0], document) for g in groups[start:stop] for document in g[1:]]
        return model.classification_logits(pairs)[:, 0].reshape(stop - start, width)

    def cosines(start: int, stop: int) -> np.ndarray:
        (rows,) = vectors([model.prepare_embeddings([t for g in groups[start:stop] for t in g])])
        v = np.stack(rows).reshape(stop - start, width + 1, -1)  # [groups, query + documents, H]
        return np.einsum("gh,gdh->gd", v[:, 0], v[:, 1:]).astype(np.float32)

    if model.is_cross_encoder:
        kind, compute = "cross-encoder logits", logits
    else:
        kind, compute = "embedding cosines", cosines
        vectors = UnitVectorCache(model)  # the documents recur across groups: each distinct text runs once
    key = _key(kind, args, model, [list(g) for g in groups])
    with model.counting_truncations():
        return cached_by_rank0(dist, cache, key, len(groups), (width,), compute, "teacher scores")
