"""What every part of the `Predictor` shares: what to advise a model without a head, the inputs' checks, the
window settings' checks, and the task-only settings a model's `config.json` gives its head (`TaskState`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from bert.config import BertConfig, check_setting
from bert.errors import InputError
from bert.input_lines import InputItemError
from bert.loading import FINE_TUNING_COMMANDS
from bert.request_rules import TASKS
from bert.tasks.classification import LONG_DOCUMENT
from bert.tasks.common import CLASSIFICATION, FILL_MASK, NER, QUESTION_ANSWERING
from bert.tasks.windows import WINDOW_POOLINGS

# What to do with a model that lacks a head a method needs.
HEAD_ADVICE = {
    **{TASKS[name]: f"fine-tune it with `{command}`" for name, command in FINE_TUNING_COMMANDS.items()},
    FILL_MASK: "use a pre-trained BertForPreTraining or BertForMaskedLM model",
}
# What a warning of inputs cut to max_seq_length suggests, unless its caller has no windows to offer.
WINDOWS_ADVICE = "windows read long texts whole"
LONGER_ADVICE = "a longer --max_seq_length (up to the model's max_position_embeddings) reads more of each"
MASK_TOKEN = "[MASK]"
# The task modules log their first examples field by field, which would repeat on every call here.
_TASK_LOGGERS = ("bert.tasks.glue", "bert.tasks.windows", "bert.tasks.ner", "bert.tasks.squad", "bert.tasks.swag")
WINDOW_SETTINGS = ("long_document", "doc_stride", "window_pooling")


@dataclass
class ClassificationHead:
    """A sequence classifier's settings (the module docstring of `bert.inference` lists the keys)."""

    labels: list[str]
    problem_type: str  # "single_label_classification", "regression" or "multi_label_classification"
    label_thresholds: dict[str, float]  # multi-label: a label is given when its sigmoid reaches its threshold

    @classmethod
    def from_config(cls, config: BertConfig, num_labels: int) -> ClassificationHead:
        labels = label_names(config, num_labels)
        default = "regression" if num_labels == 1 else "single_label_classification"
        thresholds = config.extra.get("label_thresholds") or {}
        return cls(
            labels,
            config.extra.get("problem_type") or default,
            {label: float(thresholds.get(label, 0.5)) for label in labels},
        )


@dataclass
class TaggingHead:
    """A token classifier's label list."""

    labels: list[str]


@dataclass
class AnswerSettings:
    """How `answer` reads contexts and ranks spans, as `bert squad` (run_squad.py's flags) was run."""

    max_query_length: int
    n_best_size: int = 20
    max_answer_length: int = 30
    version_2_with_negative: bool = False
    null_score_diff_threshold: float = 0.0

    @classmethod
    def from_config(cls, config: BertConfig, max_seq_length: int) -> AnswerSettings:
        extra = config.extra
        # run_squad.py's default, or half the sequence for models too short for it.
        settings = cls(
            int(extra.get("max_query_length", min(64, max_seq_length // 2))),
            int(extra.get("n_best_size", 20)),
            int(extra.get("max_answer_length", 30)),
            bool(extra.get("version_2_with_negative", False)),
            float(extra.get("null_score_diff_threshold", 0.0)),
        )
        if max_seq_length <= settings.max_query_length + 3:
            raise InputError(
                f"max_seq_length={max_seq_length} leaves no room for the context after a question of "
                f"max_query_length={settings.max_query_length}; raise max_seq_length"
            )
        return settings


# The settings only one head reads; None for the heads that have none.
TaskState = ClassificationHead | TaggingHead | AnswerSettings | None


def task_state(task: str, config: BertConfig, num_labels: int, max_seq_length: int) -> TaskState:
    if task == CLASSIFICATION:
        return ClassificationHead.from_config(config, num_labels)
    if task == NER:
        return TaggingHead(label_names(config, num_labels))
    if task == QUESTION_ANSWERING:
        return AnswerSettings.from_config(config, max_seq_length)
    return None


def label_names(config: BertConfig, num_labels: int) -> list[str]:
    id2label = config.extra.get("id2label")
    if isinstance(id2label, dict) and len(id2label) == num_labels:
        with contextlib.suppress(KeyError):
            return [str(id2label[str(i)]) for i in range(num_labels)]
    return [f"LABEL_{i}" for i in range(num_labels)]


@contextlib.contextmanager
def quiet_task_logs() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _TASK_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def checked_windows(values: dict[str, Any], source: str) -> dict[str, Any]:
    """The window settings among `values` that are not None, each checked (`InputError` naming `source`)."""
    out = {name: value for name, value in values.items() if value is not None}
    check_setting(out, "doc_stride", int, source)  # a positive integer, as in config.json
    for name, value in out.items():
        if name == "long_document" and value not in LONG_DOCUMENT:
            raise InputError(f"{source}: long_document={value!r} must be one of {', '.join(LONG_DOCUMENT)}")
        if name == "window_pooling" and value not in WINDOW_POOLINGS:
            raise InputError(f"{source}: window_pooling={value!r} must be one of {', '.join(WINDOW_POOLINGS)}")
    return out


def require_texts(texts: Sequence[Any], what: str = "text") -> None:
    if isinstance(texts, str):
        raise TypeError(f"expected a list of {what}s, got one string")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InputItemError(i, f"{what} must be a string, got {type(t).__name__}")
        if not t.strip():
            raise InputItemError(i, f"empty {what}; give some text or leave the item out")


def checked_pairs(inputs: Sequence[str | tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    pairs = []
    for i, item in enumerate(inputs):
        a, b = (item, None) if isinstance(item, str) else tuple(item)
        if not isinstance(a, str) or not a.strip():
            raise InputItemError(i, "the text must be a non-empty string")
        if b is not None and not isinstance(b, str):
            raise InputItemError(i, f"text_pair must be a string, got {type(b).__name__}")
        pairs.append((a, b or None))
    return pairs
