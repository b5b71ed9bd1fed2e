"""Evaluation metrics: pure functions of predictions and gold labels (NumPy only, no torch).

- Classification and regression (GLUE convention): `accuracy`, `f1_binary`, `matthews_corrcoef`,
  `pearson`, `spearman`, and `glue_metrics(task_name, preds, labels)` that picks them per task.
- Multi-label classification: `multi_label_metrics` (micro and macro precision, recall and F1, subset
  accuracy), `per_label_scores`, and `best_f1_threshold` (a label's decision threshold tuned for F1).
- SQuAD: answer normalisation and per-question exact match / F1, written to give exactly the numbers
  of the official `evaluate-v1.1.py` and `evaluate-v2.0.py` (including their integer/float result types,
  so sums come out bit for bit the same). The dataset-level scores live in `bert.tasks.squad_evaluate`.
- NER: entity-level precision / recall / F1, per-type scores and token accuracy, computed the way the
  CoNLL shared task's `conlleval` script computes them (IOB1, IOB2/BIO and IOBE tags), but returned
  as fractions in [0, 1] where conlleval prints percentages.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import numpy as np

from bert.errors import InputError


def greater_is_better(metric: str) -> bool:
    """How an eval_results key ranks runs and checkpoints (`--metric_for_best_model`): a loss is minimised,
    every other metric maximised."""
    return "loss" not in metric


# --------------------------------------------------------------------------------------------------
# Classification and regression


def _pair(preds, labels) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(preds)
    y = np.asarray(labels)
    if p.shape != y.shape or p.ndim != 1:
        raise ValueError(f"preds and labels must be 1-D and of equal length, got {p.shape} and {y.shape}")
    if p.size == 0:
        raise ValueError("preds and labels are empty")
    return p, y


def accuracy(preds, labels) -> float:
    """Fraction of positions where `preds` equals `labels`."""
    p, y = _pair(preds, labels)
    return float(np.mean(p == y))


def f1_binary(preds, labels) -> float:
    """F1 of the positive class (label 1): 2·TP / (2·TP + FP + FN); 0.0 when there is no positive at all.

    This equals the harmonic mean of precision and recall (sklearn's `f1_score` with its zero-division
    default), which is what GLUE reports for MRPC and QQP.
    """
    p, y = _pair(preds, labels)
    tp = int(np.sum((p == 1) & (y == 1)))
    fp = int(np.sum((p == 1) & (y != 1)))
    fn = int(np.sum((p != 1) & (y == 1)))
    denom = 2 * tp + fp + fn
    return 2.0 * tp / denom if denom else 0.0


def matthews_corrcoef(preds, labels) -> float:
    """Matthews correlation coefficient (the multi-class R_K form; for two classes the usual
    (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))). Returns 0.0 when it is undefined, e.g. when
    all predictions (or all labels) are one class, as sklearn does. GLUE reports it for CoLA.
    """
    p, y = _pair(preds, labels)
    classes, inverse = np.unique(np.concatenate([y, p]), return_inverse=True)
    yi, pi = inverse[: len(y)], inverse[len(y) :]
    k = len(classes)
    confusion = np.zeros((k, k), dtype=np.float64)  # [true, pred]
    np.add.at(confusion, (yi, pi), 1.0)
    t_sum = confusion.sum(axis=1)  # occurrences of each class in the labels
    p_sum = confusion.sum(axis=0)  # occurrences of each class in the predictions
    n_correct = np.trace(confusion)
    n = confusion.sum()
    cov_yp = n_correct * n - np.dot(t_sum, p_sum)
    cov_pp = n * n - np.dot(p_sum, p_sum)
    cov_yy = n * n - np.dot(t_sum, t_sum)
    if cov_pp * cov_yy == 0:
        return 0.0
    return float(cov_yp / np.sqrt(cov_yy * cov_pp))


def pearson(preds, labels) -> float:
    """Pearson correlation coefficient, in float64. NaN when either side is constant (undefined)."""
    p, y = _pair(preds, labels)
    p = p.astype(np.float64) - np.mean(p, dtype=np.float64)
    y = y.astype(np.float64) - np.mean(y, dtype=np.float64)
    denom = np.sqrt(np.dot(p, p) * np.dot(y, y))
    if denom == 0:
        return float("nan")
    return float(np.clip(np.dot(p, y) / denom, -1.0, 1.0))


def rankdata(values) -> np.ndarray:
    """Ranks 1..n of `values` (float64), tied values sharing the average of their ranks."""
    a = np.asarray(values)
    order = np.argsort(a, kind="stable")
    sorted_a = a[order]
    # Start index of each run of equal values in the sorted array.
    starts = np.flatnonzero(np.concatenate([[True], sorted_a[1:] != sorted_a[:-1]]))
    ends = np.concatenate([starts[1:], [len(a)]])
    avg = (starts + 1 + ends) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    ranks = np.empty(len(a), dtype=np.float64)
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks


def spearman(preds, labels) -> float:
    """Spearman rank correlation: Pearson of the ranks, ties given their average rank (as scipy)."""
    p, y = _pair(preds, labels)
    return pearson(rankdata(p), rankdata(y))


# GLUE task name (lower case, as run_classifier's processors dict) -> which metrics it reports.
_GLUE_KIND = {
    "cola": "mcc",
    "sst-2": "acc",
    "mrpc": "f1",
    "sts-b": "corr",
    "qqp": "f1",
    "mnli": "acc",
    "mnli-mm": "acc",
    "qnli": "acc",
    "rte": "acc",
    "wnli": "acc",
    "xnli": "acc",
    "ax": "mcc",
}
_GLUE_ALIASES = {"sst2": "sst-2", "stsb": "sts-b", "mnli-m": "mnli", "mnli_mismatched": "mnli-mm"}


def glue_metrics(task_name: str, preds, labels) -> dict[str, float]:
    """The metrics GLUE reports for `task_name` (case-insensitive).

    Every classification task gets `accuracy`; MRPC and QQP add `f1` (positive class 1); CoLA adds `mcc`;
    STS-B (regression) gets `pearson`, `spearman` and their mean `corr`.
    """
    name = task_name.lower()
    name = _GLUE_ALIASES.get(name, name)
    kind = _GLUE_KIND.get(name)
    if kind is None:
        raise InputError(f"--task_name={task_name!r} has no GLUE metric; use one of {', '.join(sorted(_GLUE_KIND))}")
    if kind == "corr":
        r, rho = pearson(preds, labels), spearman(preds, labels)
        return {"pearson": r, "spearman": rho, "corr": (r + rho) / 2.0}
    out = {"accuracy": accuracy(preds, labels)}
    if kind == "f1":
        out["f1"] = f1_binary(preds, labels)
    elif kind == "mcc":
        out["mcc"] = matthews_corrcoef(preds, labels)
    return out


# --------------------------------------------------------------------------------------------------
# Multi-label classification: [N, L] 0/1 matrices, one row per example, one column per label


def _label_matrices(preds, labels) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(preds).astype(bool)
    y = np.asarray(labels).astype(bool)
    if p.shape != y.shape or p.ndim != 2:
        raise ValueError(f"preds and labels must be [N, L] and of equal shape, got {p.shape} and {y.shape}")
    if p.shape[0] == 0:
        raise ValueError("preds and labels are empty")
    return p, y


def _ratio(num, den):
    """num / den elementwise, 0.0 where den is 0 (sklearn's zero_division=0)."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def per_label_scores(preds, labels) -> dict[str, np.ndarray]:
    """Per label (column): `precision`, `recall`, `f1` (float64 [L]) and `support` (gold positives, int [L]).

    A score whose denominator is 0 (no prediction, no gold positive) is 0.0, as sklearn's
    `precision_recall_fscore_support` with `zero_division=0`.
    """
    p, y = _label_matrices(preds, labels)
    tp = (p & y).sum(0)
    predicted, gold = p.sum(0), y.sum(0)
    return {
        "precision": _ratio(tp, predicted),
        "recall": _ratio(tp, gold),
        "f1": _ratio(2 * tp, predicted + gold),
        "support": gold.astype(np.int64),
    }


def multi_label_metrics(preds, labels) -> dict[str, float]:
    """Scores of multi-label predictions ([N, L] 0/1) against gold labels ([N, L] 0/1).

    `micro_*` pool the (example, label) decisions of every label: precision = TP / predicted positives,
    recall = TP / gold positives, F1 = 2·TP / (predicted + gold positives). `macro_*` are the unweighted
    means over the labels of each label's own precision, recall and F1 (`per_label_scores`; a label with
    no gold positive and no prediction counts 0.0, as sklearn's `average="macro"`). `subset_accuracy`:
    the share of examples whose predicted label set equals the gold one exactly.
    """
    p, y = _label_matrices(preds, labels)
    tp, predicted, gold = int((p & y).sum()), int(p.sum()), int(y.sum())
    per = per_label_scores(p, y)
    return {
        "micro_precision": float(_ratio(tp, predicted)),
        "micro_recall": float(_ratio(tp, gold)),
        "micro_f1": float(_ratio(2 * tp, predicted + gold)),
        "macro_precision": float(per["precision"].mean()),
        "macro_recall": float(per["recall"].mean()),
        "macro_f1": float(per["f1"].mean()),
        "subset_accuracy": float((p == y).all(1).mean()),
    }


def best_f1_threshold(scores, labels, default: float = 0.5) -> float:
    """The decision threshold of one label that maximises its F1 on (`scores`, `labels`).

    A score at or above the threshold predicts the label. Every distinct score is tried as the lowest
    score still predicted positive; the one with the highest F1 wins (ties: the higher score, i.e. fewer
    positives). The threshold returned lies halfway between it and the next lower score (0.0 below the
    lowest), so scores close to the chosen cut on new data fall on the side the dev set put them.
    Without any gold positive F1 is 0 whatever the threshold: `default` is returned.

    Args:
        scores: [N] the label's scores (e.g. sigmoid probabilities) on the dev set.
        labels: [N] 0/1 gold labels.
        default: the threshold kept when the label has no gold positive.
    """
    s, y = _pair(np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool))
    positives = int(y.sum())
    if positives == 0:
        return float(default)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    # The last position of each run of equal scores: cutting there predicts the whole run.
    last = np.flatnonzero(np.concatenate([s[1:] != s[:-1], [True]]))
    tp = np.cumsum(y)[last]
    predicted = last + 1
    f1 = 2.0 * tp / (predicted + positives)
    best = int(np.argmax(f1))  # the first maximum: the highest score
    below = s[last[best] + 1] if last[best] + 1 < len(s) else 0.0
    return float((s[last[best]] + below) / 2.0)


# --------------------------------------------------------------------------------------------------
# SQuAD (official evaluate-v1.1.py / evaluate-v2.0.py)

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
    """The official SQuAD normalisation (identical in v1.1 and v2.0): lower case, drop ASCII punctuation,
    replace the words a/an/the by a space, then collapse whitespace runs to single spaces and strip.
    """
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCTUATION)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float | int:
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_tokens)
    recall = 1.0 * num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def squad_exact_v1(prediction: str, gold: str) -> bool:
    """v1.1 exact match of one prediction against one gold answer (a bool, as the official script)."""
    return normalize_answer(prediction) == normalize_answer(gold)


def squad_f1_v1(prediction: str, gold: str) -> float | int:
    """v1.1 token F1 of one prediction against one gold answer; the int 0 when no token is shared
    (so also whenever either side normalises to nothing)."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def squad_exact_v2(prediction: str, gold: str) -> int:
    """v2.0 exact match (`compute_exact`): 1 or 0 as an int; an empty gold matches only an empty prediction."""
    return int(normalize_answer(gold) == normalize_answer(prediction))


def squad_f1_v2(prediction: str, gold: str) -> float | int:
    """v2.0 token F1 (`compute_f1`): when either side has no tokens, 1 if both have none, else 0."""
    gold_tokens = normalize_answer(gold).split() if gold else []
    pred_tokens = normalize_answer(prediction).split() if prediction else []
    if not gold_tokens or not pred_tokens:
        return int(gold_tokens == pred_tokens)
    return _token_f1(pred_tokens, gold_tokens)


_Score = TypeVar("_Score", bool, int, float)  # exact match is a bool, F1 a number


def metric_max_over_ground_truths(
    metric_fn: Callable[[str, str], _Score], prediction: str, ground_truths: Sequence[str]
) -> _Score:
    """The best score of `prediction` over all gold answers (the official scripts' max)."""
    return max(metric_fn(prediction, gt) for gt in ground_truths)


def squad_v2_gold_answers(answer_texts: Sequence[str]) -> list[str]:
    """v2.0 gold answers: those that normalise to something; `['']` when none do (no-answer questions)."""
    golds = [a for a in answer_texts if normalize_answer(a)]
    return golds or [""]


def squad_question_scores_v1(prediction: str, answer_texts: Sequence[str]) -> tuple[bool, float | int]:
    """(exact, f1) of one v1.1 question: maxima over its gold answers, as `evaluate-v1.1.py`."""
    return (
        metric_max_over_ground_truths(squad_exact_v1, prediction, answer_texts),
        metric_max_over_ground_truths(squad_f1_v1, prediction, answer_texts),
    )


def squad_question_scores_v2(prediction: str, answer_texts: Sequence[str]) -> tuple[int, float | int]:
    """(exact, f1) of one v2.0 question, as `get_raw_scores` in `evaluate-v2.0.py`."""
    golds = squad_v2_gold_answers(answer_texts)
    return (
        max(squad_exact_v2(prediction, g) for g in golds),
        max(squad_f1_v2(prediction, g) for g in golds),
    )


# --------------------------------------------------------------------------------------------------
# NER: conlleval


def _split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''). Like conlleval, the type is all after the first hyphen."""
    prefix, sep, kind = tag.partition("-")
    return (prefix, kind) if sep else (tag, "")


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's endOfChunk: does a chunk end just before the current token?"""
    if prev_tag in ("B", "I") and tag in ("B", "O"):
        return True
    if prev_tag == "E" and tag in ("E", "I", "O"):
        return True
    if prev_tag not in ("O", ".") and prev_type != type_:
        return True
    return prev_tag in ("[", "]")


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's startOfChunk: does a chunk start at the current token?"""
    if tag == "B" and prev_tag in ("B", "I", "O"):
        return True
    if prev_tag == "O" and tag in ("I", "E"):
        return True
    if prev_tag == "E" and tag in ("E", "I"):
        return True
    if tag not in ("O", ".") and prev_type != type_:
        return True
    return tag in ("[", "]")


def iob_chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks conlleval sees in one sentence's tags, as (type, start, end) with `end` exclusive.

    A chunk starts at B-, at I- after O, and at any tag whose type differs from the previous tag's, so
    IOB1 (`I-PER I-PER B-PER`) and IOB2 (`B-PER I-PER B-PER`) are both read correctly.
    """
    chunks: list[tuple[str, int, int]] = []
    prev_tag, prev_type = "O", ""
    start = None
    for i, t in enumerate([*tags, "O"]):  # a trailing O closes the last chunk (a sentence break)
        tag, type_ = _split_tag(t)
        if start is not None and _end_of_chunk(prev_tag, tag, prev_type, type_):
            chunks.append((prev_type, start, i))
            start = None
        if _start_of_chunk(prev_tag, tag, prev_type, type_):
            start = i
        prev_tag, prev_type = tag, type_
    return chunks


def _prf(correct: int, guessed: int, gold: int) -> dict[str, float | int]:
    precision = correct / guessed if guessed else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "num_gold": gold,
        "num_pred": guessed,
        "num_correct": correct,
    }


def _split_tags(
    gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]
) -> Iterator[tuple[bool, str, str, str, str]]:
    """(whether it is a token, gold chunk tag, gold type, predicted chunk tag, predicted type) for each token of
    each sentence, and after each sentence its break (both sides O, not counted as a token)."""
    for n, (gold_sent, pred_sent) in enumerate(zip(gold, pred)):
        if len(gold_sent) != len(pred_sent):
            raise ValueError(f"sentence {n}: {len(gold_sent)} gold tags but {len(pred_sent)} predicted")
        for gold_tag, pred_tag in zip(gold_sent, pred_sent):
            (c, ct), (g, gt) = _split_tag(gold_tag), _split_tag(pred_tag)
            yield True, c, ct, g, gt
        yield False, "O", "", "O", ""


def ner_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict:
    """Entity-level scores of predicted tag sequences against gold ones, exactly as `conlleval` counts.

    `gold` and `pred` are lists of sentences, each a list of tags (`B-PER`, `I-LOC`, `O`, ...); a
    sentence break ends every chunk, as the blank line does in conlleval's input. A chunk counts as
    correct when gold and prediction start it at the same token with the same type and end it at the
    same token. Returns fractions (conlleval prints them times 100):
    `{"precision", "recall", "f1", "accuracy", "num_gold", "num_pred", "num_correct",
    "per_type": {type: {"precision", "recall", "f1", "num_gold", "num_pred", "num_correct"}}}`
    where `accuracy` is the fraction of tokens whose tag is exactly right.
    """
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted ones")
    correct_chunk = found_gold = found_guessed = correct_tags = tokens = 0
    per_correct: collections.Counter[str] = collections.Counter()
    per_gold: collections.Counter[str] = collections.Counter()
    per_guessed: collections.Counter[str] = collections.Counter()
    last_c, last_ct, last_g, last_gt = "O", "", "O", ""
    in_correct = False

    def close(c: str, ct: str, g: str, gt: str) -> None:
        # The part of conlleval's loop that runs before the start-of-chunk tests.
        nonlocal in_correct, correct_chunk
        if not in_correct:
            return
        end_c = _end_of_chunk(last_c, c, last_ct, ct)
        end_g = _end_of_chunk(last_g, g, last_gt, gt)
        if end_c and end_g and last_gt == last_ct:
            in_correct = False
            correct_chunk += 1
            per_correct[last_ct] += 1
        elif end_c != end_g or gt != ct:
            in_correct = False

    for is_token, c, ct, g, gt in _split_tags(gold, pred):
        close(c, ct, g, gt)
        start_c = _start_of_chunk(last_c, c, last_ct, ct)
        start_g = _start_of_chunk(last_g, g, last_gt, gt)
        if start_c and start_g and gt == ct:
            in_correct = True
        if start_c:
            found_gold += 1
            per_gold[ct] += 1
        if start_g:
            found_guessed += 1
            per_guessed[gt] += 1
        if is_token:
            correct_tags += c == g and ct == gt
            tokens += 1
        last_c, last_ct, last_g, last_gt = c, ct, g, gt
    if in_correct:
        correct_chunk += 1
        per_correct[last_ct] += 1

    out: dict = _prf(correct_chunk, found_guessed, found_gold)
    out["accuracy"] = correct_tags / tokens if tokens else 0.0
    types = sorted(set(per_gold) | set(per_guessed))
    out["per_type"] = {t: _prf(per_correct[t], per_guessed[t], per_gold[t]) for t in types}
    return out
