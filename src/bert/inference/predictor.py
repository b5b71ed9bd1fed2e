"""`Predictor`: the core (`bert.inference.core`: loading, batching, the tokenizer) with every task's methods,
and `rank`, which is a cross-encoder's classification or an encoder's embeddings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from bert.errors import InputError
from bert.inference.classification import ClassificationMixin
from bert.inference.common import ClassificationHead, TaggingHead, checked_pairs, quiet_task_logs, require_texts
from bert.inference.core import Prepared
from bert.inference.embeddings import EmbeddingMixin
from bert.inference.fill_mask import FillMaskMixin
from bert.inference.spans import SpanTasksMixin
from bert.request_rules import best_first, check_top_k


class Predictor(ClassificationMixin, SpanTasksMixin, EmbeddingMixin, FillMaskMixin):
    """A model with its tokenizer and settings, ready for raw text. Build it with `from_pretrained`; see
    `bert.inference` for what each head offers and `bert.inference.core.PredictorCore` for its attributes."""

    @property
    def labels(self) -> list[str] | None:
        """The label list of a classification or NER head (else None)."""
        return self.head.labels if isinstance(self.head, ClassificationHead | TaggingHead) else None

    @property
    def problem_type(self) -> str | None:
        """A classifier's problem type (see the module docstring of `bert.inference`), else None."""
        return self.head.problem_type if isinstance(self.head, ClassificationHead) else None

    @property
    def label_thresholds(self) -> dict[str, float]:
        """A multi-label classifier's threshold per label ({} for other heads)."""
        return self.head.label_thresholds if isinstance(self.head, ClassificationHead) else {}

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        *,
        raw_scores: bool = False,
        truncate: bool = True,
        truncation_direction: str = "right",
        batch_size: int | None = None,
        pooling: str | None = None,
    ) -> list[dict[str, Any]]:
        """The documents by relevance to `query`: [{"index", "score"}, ...], best first, `top_k` of them
        (None: all).

        A cross-encoder (`is_cross_encoder`) reads each `[CLS] query [SEP] document [SEP]` (the pair cut to
        `max_seq_length` as `classify` cuts it) and its score is the sigmoid of the logit (the logit
        itself with `raw_scores`), as TEI's /rerank and sentence-transformers' CrossEncoder; any other
        model except a classifier scores the cosine similarity of the embeddings (`embed`'s, with
        `pooling`; `raw_scores` changes nothing then).
        """
        check_top_k(top_k)
        prepared = self.prepare_rank(query, documents, truncate=truncate, truncation_direction=truncation_direction)
        scores = self.run_rank(prepared, raw_scores=raw_scores, pooling=pooling, batch_size=batch_size)
        order = best_first(scores, top_k)
        return [{"index": i, "score": scores[i]} for i in order]

    def prepare_rank(
        self, query: str, documents: Sequence[str], *, truncate: bool = True, truncation_direction: str = "right"
    ) -> Prepared:
        """`query` and `documents` tokenized once for `run_rank`, as `rank` reads them: a cross-encoder's pairs
        (`pair_sequences`; an error names document i as input i), else `prepare_similarity`'s sequences (the
        query input 0)."""
        if isinstance(documents, str):
            raise TypeError("expected a list of documents, got one string")
        if self.is_cross_encoder:
            pairs = checked_pairs([(query, d) for d in documents])
            with self._lock, quiet_task_logs():
                return Prepared(self.pair_sequences(pairs, truncate, truncation_direction), len(pairs))
        if isinstance(self.head, ClassificationHead):
            raise InputError(
                f"{self.source} is a classifier with {len(self.head.labels)} labels, not a cross-encoder (one "
                "output); rank with a cross-encoder or an embedding model"
            )
        require_texts([query], "query")
        return self.prepare_similarity(query, documents, truncate=truncate, truncation_direction=truncation_direction)

    def run_rank(
        self, prepared: Prepared, *, raw_scores: bool = False, pooling: str | None = None, batch_size: int | None = None
    ) -> list[float]:
        """The score of each document `prepare_rank` prepared, in their order (`rank` sorts them)."""
        if not self.is_cross_encoder:
            return self.run_similarity(prepared, pooling, batch_size)

        def run(ids, mask, types, idx):
            return self.model(ids, mask, types).logits[:, 0].float().cpu().tolist()

        with self._lock:
            logits = torch.tensor(self._run(prepared.sequences, run, batch_size), dtype=torch.float32)
        return (logits if raw_scores else torch.sigmoid(logits)).tolist()
