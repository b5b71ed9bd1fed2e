"""The rules of an inference request's options, one definition each: how many results (`top_k`), Matryoshka
truncation (`dimensions`), which end of a long input is cut (`truncation_direction`), the pooling of
embeddings (`POOLINGS`), and which task a model answers (`TASKS`, `has_head`).

The `Predictor` (`bert.inference`), the inference commands and the server (`bert.serving`: its schemas
publish the bounds and spellings below, its handlers call the checks) all read them here. Torch-free, so a
command checks its flags and the server builds its schemas without loading a model.
"""

from __future__ import annotations

from collections.abc import Sequence

from bert.errors import InputError
from bert.tasks.common import CLASSIFICATION, EMBEDDINGS, FILL_MASK, MULTIPLE_CHOICE, NER, QUESTION_ANSWERING

# The fewest results a `top_k` asks for, and the fewest components `dimensions` keeps.
TOP_K_MINIMUM = 1
DIMENSIONS_MINIMUM = 1
TRUNCATION_DIRECTIONS = ("right", "left")
# The spellings of a direction that a request may send: ours and TEI's ("Left", "Right"); nothing else.
TRUNCATION_DIRECTION_SPELLINGS = (*sorted(TRUNCATION_DIRECTIONS), *(d.title() for d in sorted(TRUNCATION_DIRECTIONS)))
# What a classifier's `top_k` of 0 means.
ALL_LABELS = "all labels"
POOLINGS = ("cls", "mean", "max", "pooler")
# The task of each architecture `bert.loading.ARCHITECTURES` builds (the same names).
TASKS = {
    "BertForSequenceClassification": CLASSIFICATION,
    "BertForTokenClassification": NER,
    "BertForQuestionAnswering": QUESTION_ANSWERING,
    "BertForMultipleChoice": MULTIPLE_CHOICE,
    "BertForPreTraining": FILL_MASK,
    "BertForMaskedLM": FILL_MASK,
    "BertModel": EMBEDDINGS,
}


def check_top_k(top_k: int | None, zero: str | None = None) -> None:
    """`top_k` results: at least `TOP_K_MINIMUM`; None, where a caller takes it, is every result. `zero`
    says what 0 means where a caller also reads it as every result (a classifier's "all labels")."""
    if top_k is None:
        return
    if zero is not None and top_k < 0:
        raise InputError(f"top_k={top_k} must be 0 ({zero}) or more")
    if zero is None and top_k < TOP_K_MINIMUM:
        raise InputError(f"top_k={top_k} must be at least {TOP_K_MINIMUM}")


def best_first(scores: Sequence[float], top_k: int | None = None) -> list[int]:
    """The indices of `scores`, highest first (equal scores: the earlier first), `top_k` of them (None: all):
    the order of every ranking answer (`Predictor.rank`, `bert rerank`, the server's /rerank routes)."""
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:top_k]


def check_dimensions(dimensions: int | None, hidden_size: int, name: str = "dimensions") -> None:
    """Matryoshka truncation keeps the first `dimensions` of a model's `hidden_size` components; `name` is
    the value's name where it was given (`"dimensions"`: a request's field)."""
    if dimensions is not None and not DIMENSIONS_MINIMUM <= dimensions <= hidden_size:
        raise InputError(f"{name}={dimensions} must be between {DIMENSIONS_MINIMUM} and the model's {hidden_size}")


def truncation_direction(value: str) -> str:
    """The direction ("right" keeps the start, "left" the end) of one of `TRUNCATION_DIRECTION_SPELLINGS`."""
    if value not in TRUNCATION_DIRECTION_SPELLINGS:
        raise InputError(f"truncation_direction={value!r} must be one of {', '.join(TRUNCATION_DIRECTIONS)}")
    return value.lower()


def check_pooling(pooling: str) -> None:
    if pooling not in POOLINGS:
        raise InputError(f"pooling={pooling!r} must be one of {', '.join(POOLINGS)}")


def has_head(architecture: str, has_mlm_head: bool, task: str) -> bool:
    """Whether a model of `architecture` answers `task`: its architecture's task, and fill-mask only when its
    weights hold the masked-LM head (`cls.predictions.*`)."""
    return TASKS.get(architecture) == task and (task != FILL_MASK or has_mlm_head)
