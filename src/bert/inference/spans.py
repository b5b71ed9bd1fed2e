"""The `Predictor`'s span tasks: a tag per word and entities (`tag_words`, `ner`; `bert.tasks.ner`), answers in
a context (`answer`; `bert.tasks.squad`) and the best ending of a context (`choose`; `bert.tasks.swag`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from bert.errors import InputError
from bert.inference.common import AnswerSettings, TaggingHead, quiet_task_logs, require_texts
from bert.inference.core import PredictorCore, Prepared
from bert.input_lines import InputItemError
from bert.metrics import iob_chunks
from bert.tasks.common import MULTIPLE_CHOICE, NER, QUESTION_ANSWERING
from bert.tasks.ner import NerExample, convert_ner_examples_to_features, word_predictions
from bert.tasks.squad import (
    FIRST_UNIQUE_ID,
    RawResult,
    SquadExample,
    compute_predictions,
    squad_examples_from_json,
)
from bert.tasks.squad import InputFeatures as SquadFeatures
from bert.tasks.squad import convert_examples_to_features as squad_features
from bert.tasks.swag import SwagExample, convert_swag_examples_to_features


class SpanTasksMixin(PredictorCore):
    # -------------------------------------------------------------------------------------------- NER
    def tag_words(self, texts: Sequence[str], batch_size: int | None = None) -> list[list[dict[str, Any]]]:
        """A tag per word: for each text, [{"word", "start", "end", "label", "score"}, ...].

        Words are the original BasicTokenizer's tokens (whitespace-separated, each punctuation
        character apart), each with its span in the text. A word's tag is its first WordPiece's
        prediction and its score that prediction's softmax probability, as `bert ner` reads them; texts
        longer than `max_seq_length` are tagged in consecutive windows at word boundaries.
        """
        return self.run_tag_words(self.prepare_tagging(texts), batch_size)

    def prepare_tagging(self, texts: Sequence[str]) -> Prepared:
        """`texts` tokenized once for `run_tag_words` or `run_ner`: each text's windows, with its words."""
        self._require(NER)
        assert isinstance(self.head, TaggingHead)  # a tagger's Predictor is built with its labels
        labels = self.head.labels
        require_texts(texts)
        basic = self.tokenizer.basic_tokenizer
        spans = [[(s, e) for _, s, e in basic.tokenize_with_offsets(t)] for t in texts]
        examples = [
            NerExample(str(i), [t[s:e] for s, e in sp], [labels[0]] * len(sp))
            for i, (t, sp) in enumerate(zip(texts, spans))
        ]
        with self._lock, quiet_task_logs():
            features = convert_ner_examples_to_features(
                examples, labels, self.max_seq_length, self.tokenizer, pad=False
            )
        sequences = [(f.input_ids, f.segment_ids) for f in features]
        return Prepared(sequences, len(texts), windows=features, examples=list(zip(texts, spans, examples)))

    def run_tag_words(self, prepared: Prepared, batch_size: int | None = None) -> list[list[dict[str, Any]]]:
        """`tag_words`'s results of texts `prepare_tagging` prepared."""
        assert isinstance(self.head, TaggingHead) and prepared.windows is not None  # prepared by prepare_tagging
        features, labels = prepared.windows, self.head.labels
        examples = [example for _, _, example in prepared.examples]

        def run(ids, mask, types, idx):
            logits = self.model(ids, mask, types).logits.float()  # [B, T, L]
            return [row[: len(features[i].input_ids)] for row, i in zip(logits.cpu().numpy(), idx)]

        with self._lock:
            logits = self._run(prepared.sequences, run, batch_size)
        tags = word_predictions(examples, features, _pad_3d(logits), labels) if features else [[] for _ in examples]
        scores = [[0.0] * len(ex.words) for ex in examples]
        for f, row in zip(features, logits):
            probs = torch.softmax(torch.from_numpy(row), dim=-1).max(-1).values.tolist()  # [T]
            for position, w in enumerate(f.word_index):
                if w >= 0:
                    scores[f.example_index][w] = probs[position]
        return [
            [
                {"word": w, "start": s, "end": e, "label": label, "score": score}
                for w, (s, e), label, score in zip(ex.words, sp, word_tags, sc)
            ]
            for (_, sp, ex), word_tags, sc in zip(prepared.examples, tags, scores)
        ]

    def ner(self, texts: Sequence[str], batch_size: int | None = None) -> list[list[dict[str, Any]]]:
        """Entity spans: for each text, [{"entity", "start", "end", "text", "score"}, ...] in text order.

        The words' tags (`tag_words`) are grouped into entities as conlleval reads them (a B- tag or a
        change of type starts one, so IOB1 and IOB2 tags both work); an entity covers its words'
        characters, `text[start:end]`, with what lies between them, and its score is the mean of its
        words' scores.
        """
        return self.run_ner(self.prepare_tagging(texts), batch_size)

    def run_ner(self, prepared: Prepared, batch_size: int | None = None) -> list[list[dict[str, Any]]]:
        """`ner`'s results of texts `prepare_tagging` prepared."""
        out = []
        for (text, _, _), words in zip(prepared.examples, self.run_tag_words(prepared, batch_size)):
            entities = []
            for kind, first, last in iob_chunks([w["label"] for w in words]):
                start, end = words[first]["start"], words[last - 1]["end"]
                score = float(np.mean([w["score"] for w in words[first:last]]))
                entities.append({"entity": kind, "start": start, "end": end, "text": text[start:end], "score": score})
            out.append(entities)
        return out

    # ---------------------------------------------------------------------------- question answering
    def answer(
        self, questions: Sequence[str], contexts: Sequence[str], batch_size: int | None = None
    ) -> list[dict[str, Any]]:
        """The answer span of each question in its context: {"answer", "start", "end", "score"}.

        As `bert squad --do_predict`: the context is cut into windows of `max_seq_length` tokens,
        `doc_stride` apart, after the question (cut to `max_query_length` tokens); the answer is the
        best span over all windows by run_squad.py's n-best rules, its text projected back onto the
        context's words, and its score its n-best softmax probability. `start` and `end` locate it in the
        context; `context[start:end]` is the answer, except that whitespace between its words is the
        context's own (the answer text joins words by one space, as predictions.json does). For a SQuAD
        2.0 model (`version_2_with_negative`) a question the model deems unanswerable gets
        {"answer": None, "start": None, "end": None, "score": <the no-answer probability>}.
        """
        return self.run_answer(self.prepare_answer(questions, contexts), batch_size)

    def prepare_answer(self, questions: Sequence[str], contexts: Sequence[str]) -> Prepared:
        """The questions and contexts tokenized once for `run_answer`: each context's windows after its question."""
        self._require(QUESTION_ANSWERING)
        assert isinstance(self.head, AnswerSettings)  # a reader's Predictor is built with its settings
        if len(questions) != len(contexts):
            raise InputError(f"{len(questions)} questions for {len(contexts)} contexts; give one context per question")
        require_texts(questions, "question")
        require_texts(contexts, "context")
        data = {
            "data": [
                {"paragraphs": [{"context": c, "qas": [{"id": str(i), "question": q}]}]}
                for i, (q, c) in enumerate(zip(questions, contexts))
            ]
        }
        examples = squad_examples_from_json(data, is_training=False, source="input")
        with self._lock, quiet_task_logs():
            features = squad_features(
                examples,
                self.tokenizer,
                self.max_seq_length,
                self.doc_stride,
                self.head.max_query_length,
                is_training=False,
                pad_to_max_length=False,
            )
        assert features is not None  # returned, as no output_fn takes them
        sequences = [(f.input_ids, f.segment_ids) for f in features]
        return Prepared(sequences, len(questions), windows=features, examples=list(zip(examples, contexts)))

    def run_answer(self, prepared: Prepared, batch_size: int | None = None) -> list[dict[str, Any]]:
        """`answer`'s results of the questions and contexts `prepare_answer` prepared."""
        assert isinstance(self.head, AnswerSettings) and prepared.windows is not None  # prepared by prepare_answer
        # Prepared parts joined repeat their question ids and window ids: numbered here, as one call numbers them.
        examples = [replace(example, qas_id=str(i)) for i, (example, _) in enumerate(prepared.examples)]
        features = [replace(f, unique_id=FIRST_UNIQUE_ID + k) for k, f in enumerate(prepared.windows)]

        def run(ids, mask, types, idx):
            logits = self.model(ids, mask, types).logits.float().cpu().numpy()  # [B, T, 2]
            return [row[: len(features[i].input_ids)] for row, i in zip(logits, idx)]

        with self._lock:
            logits = self._run(prepared.sequences, run, batch_size)
        # bert squad ranks the real positions of each window only.
        results = [RawResult(f.unique_id, row[:, 0].tolist(), row[:, 1].tolist()) for f, row in zip(features, logits)]
        contexts = [context for _, context in prepared.examples]
        return self._answers(examples, contexts, features, results, self.head)

    def _answers(
        self,
        examples: list[SquadExample],
        contexts: Sequence[str],
        features: list[SquadFeatures],
        results: list[RawResult],
        settings: AnswerSettings,
    ) -> list[dict[str, Any]]:
        """run_squad.py's n-best rules over each example's windows, the answer located in its context."""
        predictions = compute_predictions(
            examples,
            features,
            results,
            settings.n_best_size,
            settings.max_answer_length,
            self.tokenizer.basic_tokenizer.do_lower_case,
            settings.version_2_with_negative,
            settings.null_score_diff_threshold,
        )
        by_example: dict[int, list[SquadFeatures]] = {}
        for f in features:
            by_example.setdefault(f.example_index, []).append(f)
        by_id = {r.unique_id: r for r in results}
        out = []
        for i, (example, context) in enumerate(zip(examples, contexts)):
            text = predictions.predictions[example.qas_id]
            entry = next(e for e in predictions.nbest[example.qas_id] if e["text"] == text)
            span = None
            if text:
                span = _answer_span(example, context, by_example.get(i, []), by_id, entry, settings.max_answer_length)
            if span is None:  # no answer (SQuAD 2.0), or no valid span at all (run_squad.py's "empty")
                out.append({"answer": None, "start": None, "end": None, "score": entry["probability"]})
            else:
                out.append({"answer": text, "start": span[0], "end": span[1], "score": entry["probability"]})
        return out

    # ------------------------------------------------------------------------------- multiple choice
    def choose(
        self, contexts: Sequence[str], endings: Sequence[Sequence[str]], batch_size: int | None = None
    ) -> list[dict[str, Any]]:
        """The best ending of each context: {"choice": index, "ending", "score", "scores": [per ending]}.

        Each (context, ending) pair is `[CLS] context [SEP] ending [SEP]`, truncated to `max_seq_length`
        as `bert swag` does; the scores are the softmax over the context's endings.
        """
        self._require(MULTIPLE_CHOICE)
        if len(contexts) != len(endings):
            raise InputError(f"{len(contexts)} contexts for {len(endings)} lists of endings; give one list per context")
        require_texts(contexts, "context")
        for i, ends in enumerate(endings):
            if isinstance(ends, str) or len(ends) < 2:
                raise InputItemError(i, "give at least two endings to choose from, as a list")
            try:
                require_texts(ends, "ending")
            except InputItemError as e:
                raise InputItemError(i, f"ending {e.reason}") from None
        examples = [SwagExample(str(i), c, "", list(e)) for i, (c, e) in enumerate(zip(contexts, endings))]
        with self._lock, quiet_task_logs():
            features = convert_swag_examples_to_features(examples, self.max_seq_length, self.tokenizer, pad=False)
            # Every choice is its own sequence (one choice per row), so choices sort by length like the rest.
            sequences = [(ids, seg) for f in features for ids, seg in zip(f.input_ids, f.segment_ids)]

            def head(ids, mask, types, idx):
                logits = self.model(ids[:, None], mask[:, None], types[:, None]).logits  # [B, 1]
                return logits[:, 0].float().cpu().tolist()

            flat = iter(self._run(sequences, head, batch_size))
        out = []
        for ends in endings:
            logits = torch.tensor([next(flat) for _ in ends])
            scores = torch.softmax(logits, dim=-1).tolist()
            best = int(np.argmax(scores))
            out.append({"choice": best, "ending": ends[best], "score": scores[best], "scores": scores})
        return out


def _pad_3d(rows: list[np.ndarray]) -> np.ndarray:
    """[n_i, L] arrays as one zero-padded [len(rows), max n_i, L] array."""
    out = np.zeros((len(rows), max(len(r) for r in rows), rows[0].shape[-1]), dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def _answer_span(
    example: SquadExample,
    context: str,
    features: list[SquadFeatures],
    results: dict[int, RawResult],
    entry: dict[str, Any],
    max_answer_length: int,
) -> tuple[int, int] | None:
    """Where in `context` the n-best `entry` lies: (start, end) character offsets, or None.

    `compute_predictions` reports the answer's text and its start and end logits, not its position; the
    window positions with those logits that form a valid span give its words, and the text's place in
    them (found as `get_final_text` finds it) gives its characters.
    """
    answer = entry["text"]
    word_starts, pos = [], 0
    for word in example.doc_tokens:
        pos = context.index(word, pos)
        word_starts.append(pos)
        pos += len(word)
    for f in features:
        r = results[f.unique_id]
        for s, first in f.token_to_orig_map.items():
            if r.start_logits[s] != entry["start_logit"] or not f.token_is_max_context.get(s, False):
                continue
            for e, last in f.token_to_orig_map.items():
                if not s <= e < s + max_answer_length or r.end_logits[e] != entry["end_logit"]:
                    continue
                words = example.doc_tokens[first : last + 1]
                k = " ".join(words).find(answer)
                if k < 0:
                    continue
                start = _joined_to_context(words, word_starts[first:], k)
                end = _joined_to_context(words, word_starts[first:], k + len(answer) - 1) + 1
                return start, end
    return None


def _joined_to_context(words: list[str], starts: list[int], k: int) -> int:
    """The context offset of character `k` of `" ".join(words)` (a joining space maps after its word)."""
    for word, start in zip(words, starts):
        if k <= len(word):
            return start + k
        k -= len(word) + 1
    raise ValueError("offset past the words")
