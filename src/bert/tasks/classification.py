"""`bert classify`'s task: the registry of classification data (run_classifier.py's `processors` dict,
extended) and `ClassificationTask`, which reads a processor's examples, converts them (or their windows) to
features, and turns the model's logits into GLUE, regression or multi-label metrics and result files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bert.errors import InputError
from bert.formats.results import write_test_results
from bert.metrics import (
    accuracy,
    best_f1_threshold,
    glue_metrics,
    multi_label_metrics,
    pearson,
    per_label_scores,
    spearman,
)
from bert.tasks.common import FinetuneTask, column_spec, label_list_flag, model_inputs, sigmoid, softmax
from bert.tasks.generic import GenericProcessor
from bert.tasks.glue import (
    ColaProcessor,
    DataProcessor,
    InputFeatures,
    MnliMismatchedProcessor,
    MnliProcessor,
    MrpcProcessor,
    QnliProcessor,
    QqpProcessor,
    RteProcessor,
    Sst2Processor,
    StsbProcessor,
    WnliProcessor,
    XnliProcessor,
    convert_examples_to_features,
    features_to_arrays,
)
from bert.tasks.windows import WINDOW_POOLINGS, convert_examples_to_windows, pool_windows
from bert.utils import atomic_write

if TYPE_CHECKING:
    from bert.commands.classify import ClassifyArgs

logger = logging.getLogger(__name__)


TASKS: dict[str, type[DataProcessor]] = {
    "cola": ColaProcessor,
    "mnli": MnliProcessor,
    "mrpc": MrpcProcessor,
    "xnli": XnliProcessor,
    "mnli-mm": MnliMismatchedProcessor,
    "sst-2": Sst2Processor,
    "sts-b": StsbProcessor,
    "qqp": QqpProcessor,
    "qnli": QnliProcessor,
    "rte": RteProcessor,
    "wnli": WnliProcessor,
    "generic": GenericProcessor,
}

# Other spellings in use (the GLUE folder names lower-cased, HF's names).
ALIASES = {
    "sst2": "sst-2",
    "stsb": "sts-b",
    "mnli-m": "mnli",
    "mnli_mismatched": "mnli-mm",
    "mnli-mismatched": "mnli-mm",
}


def get_processor(task_name: str, **kwargs: Any) -> DataProcessor:
    """The processor of `task_name` (case-insensitive, aliases allowed), built with `kwargs`
    (e.g. `language="de"` for XNLI, the column arguments for `generic`)."""
    name = task_name.lower()
    name = ALIASES.get(name, name)
    if name not in TASKS:
        raise InputError(f"Task not found: {task_name!r}; --task_name must be one of {', '.join(TASKS)}")
    return TASKS[name](**kwargs)


# Which GLUE metrics a task reports besides accuracy (the others: accuracy only).
_EXTRA_METRIC = {"cola": "mcc", "mrpc": "f1", "qqp": "f1"}
_REGRESSION_METRICS = ["eval_pearson", "eval_spearman", "eval_corr"]
_MULTI_LABEL_METRICS = [
    f"eval_{k}" for k in ("micro_f1", "micro_precision", "micro_recall", "macro_f1", "macro_precision", "macro_recall")
] + ["eval_subset_accuracy"]
_TUNED_METRICS = ["eval_tuned_micro_f1", "eval_tuned_macro_f1"]
# Flags of --task_name=generic (None unless given), its switches, and those of --multi_label among them.
_GENERIC_FLAGS = (
    "text_a_column",
    "text_b_column",
    "label_column",
    "labels",
    "train_file",
    "dev_file",
    "test_file",
    "label_separator",
    "threshold",
)
_GENERIC_SWITCHES = ("is_regression", "multi_label", "allow_empty_labels", "tune_thresholds")
_MULTI_LABEL_FLAGS = ("label_separator", "threshold", "allow_empty_labels", "tune_thresholds")
MULTI_LABEL = "multi_label_classification"
LONG_DOCUMENT = ("truncate", "windows")
DEFAULT_THRESHOLD = 0.5
DEFAULT_LABEL_SEPARATOR = ","
PREDICTED_LABELS_NAME = "test_predicted_labels.tsv"
LABEL_SCORES_NAME = "eval_label_scores.tsv"


class ClassificationTask(FinetuneTask):
    """Sequence (pair) classification, multi-label classification and regression with a processor of
    `TASKS` (`bert classify`).

    Long documents (`long_document="windows"`) are read in windows (`convert_examples_to_windows`), each a
    training feature with its example's label; at evaluation and prediction the windows' logits of an
    example are pooled (`pool_windows`, `window_pooling`) into one prediction per example.

    Multi-label (`--task_name=generic --multi_label`): sigmoid outputs, one yes/no decision per label at
    its threshold. The thresholds in force: tuned on the dev set in this run (`tune_thresholds`, by the
    last `metrics` call), else `threshold` for every label, else the `label_thresholds` saved with the
    model evaluated (`use_saved_config`), else 0.5.

    Args:
        args: the flags of `bert classify` (`task_name`, `data_dir`, `xnli_language`, `long_document`,
            `doc_stride`, `window_pooling`, and the `generic` task's `text_a_column`, `text_b_column`,
            `label_column`, `labels`, `has_header`, `is_regression`, `train_file`, `dev_file`,
            `test_file`, `multi_label`, `label_separator`, `allow_empty_labels`, `threshold`,
            `tune_thresholds`).
    """

    command = "classify"
    head = "BertForSequenceClassification"
    classifier_dropout = 0.1  # run_classifier.create_model: keep_prob=0.9, not read from the config

    def __init__(self, args: ClassifyArgs):
        self.args = args
        name = args.task_name.lower()
        self.name = ALIASES.get(name, name)
        self._processor: DataProcessor | None = None
        self.saved_thresholds: dict[str, float] = {}
        self.tuned_thresholds: np.ndarray | None = None

    @property
    def is_regression(self) -> bool:
        return self.name == "sts-b" or (self.name == "generic" and self.args.is_regression)

    @property
    def is_multi_label(self) -> bool:
        return self.name == "generic" and self.args.multi_label

    @property
    def default_metric(self) -> str:  # type: ignore[override]
        if self.is_regression:
            return "eval_corr"
        if self.is_multi_label:
            return "eval_micro_f1"
        return "eval_mcc" if self.name == "cola" else "eval_accuracy"

    def metric_names(self) -> list[str]:
        if self.is_regression:
            return list(_REGRESSION_METRICS)
        if self.is_multi_label:
            return _MULTI_LABEL_METRICS + (_TUNED_METRICS if self.args.tune_thresholds else [])
        extra = _EXTRA_METRIC.get(self.name)
        return ["eval_accuracy"] + ([f"eval_{extra}"] if extra else [])

    def check_flags(self) -> None:
        a = self.args
        if self.name not in TASKS:
            raise InputError(f"Task not found: {a.task_name!r}; --task_name must be one of {', '.join(TASKS)}")
        given = [f for f in _GENERIC_FLAGS if getattr(a, f) is not None]
        given += [f for f in _GENERIC_SWITCHES if getattr(a, f)]
        if self.name != "generic" and given:
            raise InputError(
                f"{', '.join('--' + f for f in given)} only apply to --task_name=generic; drop them for "
                f"--task_name={a.task_name}"
            )
        multi_label_only = [f"--{f}" for f in _MULTI_LABEL_FLAGS if f in given]
        if multi_label_only and not a.multi_label:
            raise InputError(f"{', '.join(multi_label_only)} only apply with --multi_label; add it or drop them")
        if a.multi_label and a.is_regression:
            raise InputError("a task is either multi-label or regression: drop --multi_label or --is_regression")
        if a.threshold is not None and not 0.0 < a.threshold < 1.0:
            raise InputError(f"--threshold={a.threshold} must be a probability between 0 and 1 (exclusive)")
        if a.tune_thresholds and not a.do_eval:
            raise InputError("--tune_thresholds tunes the thresholds on the dev set: add --do_eval")
        # Not "choices" metadata: bert classify names the choices in its own one-line error.
        if a.long_document not in LONG_DOCUMENT:
            raise InputError(f"--long_document={a.long_document} must be one of {', '.join(LONG_DOCUMENT)}")
        if a.window_pooling not in WINDOW_POOLINGS:
            raise InputError(f"--window_pooling={a.window_pooling} must be one of {', '.join(WINDOW_POOLINGS)}")
        label_list_flag(a.labels)

    def setup(self, saved_labels: list[str] | None, do_train: bool) -> None:
        a = self.args
        kwargs: dict[str, Any] = {}
        if self.name == "xnli":
            kwargs["language"] = a.xnli_language
        elif self.name == "generic":
            label_list = label_list_flag(a.labels)
            if label_list is None and not do_train and not a.is_regression:
                label_list = saved_labels  # the labels the model was trained with
            kwargs = dict(
                text_a_column=0 if a.text_a_column is None else column_spec(a.text_a_column),
                label_column=-1 if a.label_column is None else column_spec(a.label_column),
                text_b_column=column_spec(a.text_b_column),
                has_header=a.has_header,
                label_list=label_list,
                is_regression=a.is_regression,
                train_file=a.train_file or "train.tsv",
                dev_file=a.dev_file or "dev.tsv",
                test_file=a.test_file or "test.tsv",
                multi_label=a.multi_label,
                label_separator=self.label_separator,
                allow_empty_labels=a.allow_empty_labels,
            )
        self._processor = get_processor(self.name, **kwargs)

    @property
    def processor(self) -> DataProcessor:
        """The task's reader, built by `setup` (which the runner calls before reading any data)."""
        if self._processor is None:
            raise RuntimeError("ClassificationTask.setup builds the processor: call it before reading data")
        return self._processor

    def use_saved_config(self, config: dict[str, Any]) -> None:
        thresholds = config.get("label_thresholds")
        if isinstance(thresholds, dict):
            self.saved_thresholds = {str(k): float(v) for k, v in thresholds.items()}

    @property
    def label_separator(self) -> str:
        return DEFAULT_LABEL_SEPARATOR if self.args.label_separator is None else self.args.label_separator

    def read_examples(self, split: str) -> list:
        data_dir = self.args.data_dir
        if not os.path.isdir(data_dir):
            raise InputError(f"--data_dir={data_dir}: no such directory")
        get = {
            "train": self.processor.get_train_examples,
            "dev": self.processor.get_dev_examples,
            "test": self.processor.get_test_examples,
        }[split]
        try:
            return get(data_dir)
        except NotImplementedError:
            raise InputError(f"--task_name={self.args.task_name} has no {split} set") from None

    def read_unlabelled(self, path: str) -> list:
        return self.processor.get_unlabelled_examples(path)

    def labels(self) -> list | None:
        if self.is_regression:
            return None
        labels = self.processor.get_labels()
        if not labels:
            raise InputError(
                "no labels: every label cell of the training file is empty; label the examples, or give the "
                "label list with --labels"
            )
        return labels

    def class_labels(self) -> list[str]:
        """The labels of a classification task (a regression task has none)."""
        labels = self.labels()
        if labels is None:
            raise RuntimeError(f"--task_name={self.name} is a regression task: it has no labels")
        return labels

    def model_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"num_labels": 1 if self.is_regression else len(self.class_labels())}
        if self.is_multi_label:
            kwargs["problem_type"] = MULTI_LABEL
        return kwargs

    def base_thresholds(self) -> np.ndarray:
        """[L] each label's threshold before any tuning: --threshold, else the saved one, else 0.5."""
        if self.args.threshold is not None:
            return np.full(len(self.class_labels()), self.args.threshold)
        return np.array([self.saved_thresholds.get(label, DEFAULT_THRESHOLD) for label in self.class_labels()])

    def thresholds(self) -> np.ndarray:
        """[L] the thresholds in force (see the class docstring)."""
        return self.tuned_thresholds if self.tuned_thresholds is not None else self.base_thresholds()

    def convert(self, examples: Sequence, tokenizer, max_seq_length: int, pad: bool) -> list:
        a = self.args
        label_list = [None] if self.is_regression else self.labels()
        if a.long_document == "truncate":
            return convert_examples_to_features(examples, label_list, max_seq_length, tokenizer, pad=pad)
        features = convert_examples_to_windows(examples, label_list, max_seq_length, tokenizer, a.doc_stride, pad)
        logger.info(
            "%d examples -> %d windows of at most %d tokens, %d apart (%.2f per example)",
            len(examples),
            len(features),
            max_seq_length,
            a.doc_stride,
            len(features) / max(len(examples), 1),
        )
        return features

    def feature_length(self, feature) -> int:
        return int(sum(feature.input_mask))

    def collate(self, features: Sequence, pad_to: int | None) -> dict[str, np.ndarray]:
        a = model_inputs(features_to_arrays(features, pad_to))
        del a["is_real_example"]  # the original's TPU padding examples; there are none here
        floats = self.is_regression or self.is_multi_label
        a["labels"] = a.pop("label_ids").astype(np.float32 if floats else np.int64)
        return a

    def inference_config(self) -> dict[str, Any]:
        a = self.args
        problem_type = "regression" if self.is_regression else "single_label_classification"
        config: dict[str, Any] = {
            "problem_type": MULTI_LABEL if self.is_multi_label else problem_type,
            "long_document": a.long_document,
            "doc_stride": a.doc_stride,
            "window_pooling": a.window_pooling,
        }
        if self.is_multi_label:
            config["label_thresholds"] = self._threshold_map(self.thresholds())
        return config

    def tuned_config(self) -> dict[str, Any]:
        if self.tuned_thresholds is None:
            return {}
        return {"label_thresholds": self._threshold_map(self.tuned_thresholds)}

    def _threshold_map(self, thresholds: np.ndarray) -> dict[str, float]:
        return {label: float(t) for label, t in zip(self.class_labels(), thresholds)}

    def example_logits(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> np.ndarray:
        """[N, L] one row of logits per example: a long document's windows pooled (`window_pooling`)."""
        return pool_windows(outputs, features, len(examples), self.args.window_pooling)

    def metrics(self, examples: Sequence, features: Sequence, outputs: list[np.ndarray]) -> dict[str, Any]:
        logits = self.example_logits(examples, features, outputs)  # [N, L]
        gold = np.array(_example_label_ids(features, len(examples)))
        if self.is_regression:
            preds = logits[:, 0]
            if self.name == "generic":
                r, rho = pearson(preds, gold), spearman(preds, gold)
                found = {"pearson": r, "spearman": rho, "corr": (r + rho) / 2}
            else:
                found = glue_metrics(self.name, preds, gold)
        elif self.is_multi_label:
            found = self._multi_label_metrics(sigmoid(logits), gold)
        else:
            preds = logits.argmax(-1)
            found = (
                {"accuracy": accuracy(preds, gold)} if self.name == "generic" else glue_metrics(self.name, preds, gold)
            )
        return {f"eval_{k}": v for k, v in found.items()}

    def _multi_label_metrics(self, probs: np.ndarray, gold: np.ndarray) -> dict[str, float]:
        """The metrics at the thresholds before tuning; with --tune_thresholds, each label's threshold is
        then tuned for its F1 on these dev outputs (`best_f1_threshold`) and kept for the predictions, and
        the micro and macro F1 at the tuned thresholds are added (`tuned_*`: optimistic, as they are scored
        on the dev set they were tuned on)."""
        base = self.base_thresholds()
        found = multi_label_metrics(probs >= base, gold)
        if self.args.tune_thresholds:
            self.tuned_thresholds = np.array(
                [best_f1_threshold(probs[:, j], gold[:, j], base[j]) for j in range(probs.shape[1])]
            )
            tuned = multi_label_metrics(probs >= self.tuned_thresholds, gold)
            found.update(tuned_micro_f1=tuned["micro_f1"], tuned_macro_f1=tuned["macro_f1"])
            logger.info("thresholds tuned on the dev set: %s", self._threshold_map(self.tuned_thresholds))
        return found

    def write_eval_files(self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list) -> None:
        """Multi-label: `eval_label_scores.tsv`, a header line then per label its threshold in force,
        precision, recall, F1 and support (gold positives) on the dev set."""
        if not self.is_multi_label:
            return
        probs = sigmoid(self.example_logits(examples, features, outputs))
        thresholds = self.thresholds()
        scores = per_label_scores(probs >= thresholds, np.array(_example_label_ids(features, len(examples))))
        with atomic_write(output_dir / LABEL_SCORES_NAME) as f:
            f.write("label\tthreshold\tprecision\trecall\tf1\tsupport\n")
            for j, label in enumerate(self.class_labels()):
                row = [thresholds[j], scores["precision"][j], scores["recall"][j], scores["f1"][j]]
                f.write("\t".join([label, *(f"{x:.6g}" for x in row), str(scores["support"][j])]) + "\n")

    def write_predictions(
        self, output_dir: Path, examples: Sequence, features: Sequence, outputs: list
    ) -> dict[str, Any]:
        logits = self.example_logits(examples, features, outputs)  # [N, L]
        if self.is_regression:
            values = logits[:, 0]
        elif self.is_multi_label:
            values = sigmoid(logits)
        else:
            values = softmax(logits)
        path = output_dir / "test_results.tsv"
        write_test_results(path, values, num_examples=len(examples))
        written: dict[str, Any] = {"test_results": str(path), "num_examples": len(examples)}
        if self.is_multi_label:
            labels, chosen = self.class_labels(), values >= self.thresholds()
            with atomic_write(output_dir / PREDICTED_LABELS_NAME) as f:
                for row in chosen:
                    f.write(self.label_separator.join(label for label, on in zip(labels, row) if on) + "\n")
            written["predicted_labels"] = str(output_dir / PREDICTED_LABELS_NAME)
        return written


def _example_label_ids(features: Sequence[InputFeatures], num_examples: int) -> list:
    """Each example's label id, in example order, from its feature (or its first window)."""
    ids: list[Any] = [None] * num_examples
    for i, f in enumerate(features):
        k = i if f.example_index is None else f.example_index
        if ids[k] is None:
            ids[k] = f.label_id
    return ids
