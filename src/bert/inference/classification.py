"""The `Predictor`'s sequence classification: `classify` and its logits, long inputs truncated or read in
windows as the model was fine-tuned (`bert.tasks.glue`, `bert.tasks.windows`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bert.inference.common import ClassificationHead, checked_pairs, quiet_task_logs
from bert.inference.core import PredictorCore, Prepared
from bert.input_lines import InputItemError
from bert.request_rules import ALL_LABELS, check_top_k
from bert.request_rules import truncation_direction as direction_of
from bert.tasks.common import CLASSIFICATION, sigmoid, softmax, truncate_seq_pair
from bert.tasks.glue import InputExample, convert_examples_to_features
from bert.tasks.windows import convert_examples_to_windows, pool_windows


class ClassificationMixin(PredictorCore):
    @property
    def is_cross_encoder(self) -> bool:
        """A sequence-classification model with one output, which scores a (query, document) pair."""
        return isinstance(self.head, ClassificationHead) and len(self.head.labels) == 1

    def _classifier(self) -> ClassificationHead:
        self._require(CLASSIFICATION)
        assert isinstance(self.head, ClassificationHead)  # a classifier's Predictor is built with its head
        return self.head

    def classify(
        self,
        inputs: Sequence[str | tuple[str, str | None]],
        top_k: int | None = 1,
        batch_size: int | None = None,
        raw_scores: bool = False,
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
    ) -> list[dict[str, Any]]:
        """Classify texts or text pairs; one result per input, in order, as `bert classify --do_predict`.

        Args:
            inputs: texts, or (text, text_pair) tuples (text_pair may be None).
            top_k: also list the `top_k` best labels with their scores under "scores" (0 or None: all);
                with 1 (the default) only the best.
            raw_scores: "scores" lists the logits instead of the probabilities.
            truncate, truncation_direction: with `long_document` "truncate", see `pair_sequences` ("left"
                cuts a text's start).

        Long inputs are read as the model was fine-tuned to read them (`long_document`, `doc_stride`,
        `window_pooling`; see `set_windows`), by classification's own code: "truncate" cuts a pair to
        `max_seq_length` as run_classifier.py does (`bert.tasks.glue.convert_examples_to_features`);
        "windows" reads the whole first text in windows, the second cut to what the windows leave it
        (`bert.tasks.windows.window_spans`), and pools the windows' logits (`bert.tasks.windows.pool_windows`).

        Returns dicts, by `problem_type`: single-label {"label", "score"} (softmax probability);
        multi-label {"labels": [{"label", "score"}, ...]} for every label whose sigmoid reaches its
        threshold, best first; regression {"score"} (the model's output). With `top_k` != 1, also
        "scores": [{"label", "score"}, ...], best first.
        """
        check_top_k(top_k, zero=ALL_LABELS)
        prepared = self.prepare_classification(inputs, truncate=truncate, truncation_direction=truncation_direction)
        return self.run_classify(prepared, top_k, batch_size, raw_scores)

    def run_classify(
        self, prepared: Prepared, top_k: int | None = 1, batch_size: int | None = None, raw_scores: bool = False
    ) -> list[dict[str, Any]]:
        """`classify`'s results of inputs `prepare_classification` prepared."""
        check_top_k(top_k, zero=ALL_LABELS)
        pooled = self.run_classification_logits(prepared, batch_size)
        return [self._classification_result(row, top_k, raw_scores) for row in pooled]

    def classification_logits(
        self,
        inputs: Sequence[str | tuple[str, str | None]],
        batch_size: int | None = None,
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
    ) -> np.ndarray:
        """The float32 logits [N, L] (label-list order) `classify` turns into its results, long inputs read as
        `classify` reads them (a teacher's soft labels, `bert.distillation`, are these)."""
        prepared = self.prepare_classification(inputs, truncate=truncate, truncation_direction=truncation_direction)
        return self.run_classification_logits(prepared, batch_size)

    def prepare_classification(
        self,
        inputs: Sequence[str | tuple[str, str | None]],
        *,
        truncate: bool = True,
        truncation_direction: str = "right",
    ) -> Prepared:
        """`inputs` tokenized once for `run_classify` or `run_classification_logits`, as `classify` reads them:
        `pair_sequences` with `long_document` "truncate", else each input's windows."""
        head = self._classifier()
        pairs = checked_pairs(inputs)
        with self._lock, quiet_task_logs():
            if self.long_document == "truncate":
                return Prepared(self.pair_sequences(pairs, truncate, truncation_direction), len(pairs))
            examples, labels = self._examples(pairs), _label_list(head)
            features = convert_examples_to_windows(
                examples, labels, self.max_seq_length, self.tokenizer, self.doc_stride, False
            )
        return Prepared([(f.input_ids, f.segment_ids) for f in features], len(pairs), windows=features)

    def run_classification_logits(self, prepared: Prepared, batch_size: int | None = None) -> np.ndarray:
        """`classification_logits` of inputs `prepare_classification` prepared."""
        head = self._classifier()
        if not prepared.inputs:
            return np.zeros((0, len(head.labels)), dtype=np.float32)

        def run(ids, mask, types, idx):
            return list(self.model(ids, mask, types).logits.float().cpu().numpy())

        with self._lock:
            logits = self._run(prepared.sequences, run, batch_size)
        if prepared.windows is None:
            return np.stack(logits).astype(np.float32)  # [N, L]
        return pool_windows(logits, prepared.windows, prepared.inputs, self.window_pooling).astype(np.float32)

    def pair_sequences(
        self, pairs: list[tuple[str, str | None]], truncate: bool, truncation_direction: str
    ) -> list[tuple[list[int], list[int]]]:
        """`[CLS] a [SEP] (b [SEP])` per pair with segment ids. Too long for `max_seq_length`: with `truncate`,
        cut as `bert classify` cuts (run_classifier.py `_truncate_seq_pair`: a token at a time from the
        longer text, at its end for "right", at its start for "left"); else an `InputItemError`."""
        truncation_direction = direction_of(truncation_direction)
        if truncate and truncation_direction == "right":
            return self._truncated_features(pairs)
        cls_id, sep_id = self._special_ids()
        sequences = []
        for i, (a, b) in enumerate(pairs):
            ids_a, ids_b = self.tokenizer.encode(a), self.tokenizer.encode(b) if b else []
            room = self.max_seq_length - (3 if b else 2)
            if len(ids_a) + len(ids_b) > room:
                self._check_pair_length(i, len(ids_a) + len(ids_b) + self.max_seq_length - room, truncate)
                # The end-popping rule on reversed pieces pops from the start.
                ids_a, ids_b = ids_a[::-1], ids_b[::-1]
                truncate_seq_pair(ids_a, ids_b, room)
                ids_a, ids_b = ids_a[::-1], ids_b[::-1]
            ids = [cls_id, *ids_a, sep_id]
            types = [0] * len(ids)
            if b:
                ids += [*ids_b, sep_id]
                types += [1] * (len(ids_b) + 1)
            sequences.append((ids, types))
        return sequences

    def _check_pair_length(self, i: int, tokens: int, truncate: bool) -> None:
        """Pair `i` of `tokens` tokens runs whole, or cut to `max_seq_length` with `truncate`, else is refused."""
        if tokens > self.max_seq_length and not truncate:
            raise InputItemError(
                i,
                f"{tokens} tokens with [CLS] and [SEP], more than max_seq_length={self.max_seq_length}; shorten it "
                "or let it be truncated",
            )

    def _examples(self, pairs: list[tuple[str, str | None]]) -> list[InputExample]:
        """The pairs as classification examples, each with the placeholder label of a test example."""
        head = self._classifier()
        placeholder = 0.0 if head.problem_type == "regression" else head.labels[0]
        return [InputExample(str(i), a, b, placeholder) for i, (a, b) in enumerate(pairs)]

    def _truncated_features(self, pairs: list[tuple[str, str | None]]) -> list[tuple[list[int], list[int]]]:
        features = convert_examples_to_features(
            self._examples(pairs), _label_list(self._classifier()), self.max_seq_length, self.tokenizer, pad=False
        )
        self._count_cut(sum(len(f.input_ids) == self.max_seq_length for f in features), len(features))
        return [(f.input_ids, f.segment_ids) for f in features]

    def _classification_result(self, logits: np.ndarray, top_k: int | None, raw_scores: bool) -> dict[str, Any]:
        head = self._classifier()
        if head.problem_type == "regression":
            return {"score": float(logits[0])}
        # The task's own probabilities, so that scores are test_results.tsv's float32 values.
        if head.problem_type == "multi_label_classification":
            scores = sigmoid(logits)
            ranked = _top(scores, head.labels, None)
            result: dict[str, Any] = {"labels": [r for r in ranked if r["score"] >= head.label_thresholds[r["label"]]]}
        else:
            scores = softmax(logits)
            result = _top(scores, head.labels, 1)[0]
        if top_k != 1:
            result["scores"] = _top(logits if raw_scores else scores, head.labels, top_k)
        return result


def _label_list(head: ClassificationHead) -> list[Any]:
    return [None] if head.problem_type == "regression" else list(head.labels)


def _top(scores: np.ndarray, labels: Sequence[str], k: int | None) -> list[dict[str, Any]]:
    order = np.argsort(-scores, kind="stable")[: k or None]
    return [{"label": labels[i], "score": float(scores[i])} for i in order]
