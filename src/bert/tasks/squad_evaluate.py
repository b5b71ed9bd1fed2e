"""The official SQuAD evaluation (`evaluate-v1.1.py`, `evaluate-v2.0.py`).

The numbers, the keys and their order, the no-answer threshold rule, the best-threshold search and
the printed output are those of the official scripts, so a run here can be compared with any
published score. Sums are taken left to right in dataset order, as the scripts did under the
Python they were written for, so the printed floats agree to the last digit.

Differences, all on inputs the official scripts reject with a traceback: a malformed dataset or
prediction file, a v2.0 prediction file that misses questions, and a no-answer probability file that
misses predicted questions are reported as one-line errors instead.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterator, Mapping

from bert.errors import InputError
from bert.metrics import squad_question_scores_v1, squad_question_scores_v2

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Reading and checking the inputs


def iter_questions(dataset: list, source: str = "dataset") -> Iterator[dict]:
    """Yield every question (`qa` dict) of a SQuAD `data` list in file order, checking the fields the
    evaluation reads (`paragraphs`, `qas`, `id`, `answers`, answer `text`) and naming the one missing, and
    that no id appears twice (predictions are keyed by id: a repeated question would be scored twice)."""
    if not isinstance(dataset, list):
        raise InputError(f'{source}: "data" must be a list of articles; give a SQuAD dataset file')
    seen: dict[str, str] = {}
    for a, article in enumerate(dataset):
        where = f"{source}: article {a}" + (
            f" ({article.get('title')!r})" if isinstance(article, dict) and "title" in article else ""
        )
        if not isinstance(article, dict) or not isinstance(article.get("paragraphs"), list):
            raise InputError(f'{where} has no "paragraphs" list; every article needs one')
        for p, paragraph in enumerate(article["paragraphs"]):
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("qas"), list):
                raise InputError(f'{where}, paragraph {p} has no "qas" list; every paragraph needs one')
            for q, qa in enumerate(paragraph["qas"]):
                if not isinstance(qa, dict) or not isinstance(qa.get("id"), str):
                    raise InputError(f'{where}, paragraph {p}, question {q} has no string "id"; add one')
                here = f"{where}, paragraph {p}, question {q}"
                if qa["id"] in seen:
                    raise InputError(
                        f"{here} has the id {qa['id']!r} of {seen[qa['id']].split(': ', 1)[-1]}; question ids must be "
                        "unique (predictions are keyed by them): fix or remove the duplicate"
                    )
                seen[qa["id"]] = here
                answers = qa.get("answers")
                if not isinstance(answers, list):
                    raise InputError(
                        f'{source}: question {qa["id"]} has no "answers" list; give [] for a no-answer question'
                    )
                for answer in answers:
                    if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
                        raise InputError(f'{source}: question {qa["id"]} has an answer without a string "text"; fix it')
                yield qa


def check_predictions(preds, source: str = "predictions") -> dict[str, str]:
    if not isinstance(preds, dict):
        raise InputError(f"{source}: must be a JSON object {{question id: answer text}}")
    for qid, text in preds.items():
        if not isinstance(text, str):
            raise InputError(f"{source}: the answer of question {qid} is not a string; give its text")
    return preds


def check_na_probs(na_probs, source: str = "na_probs") -> dict[str, float]:
    if not isinstance(na_probs, dict):
        raise InputError(f"{source}: must be a JSON object {{question id: no-answer probability}}")
    for qid, p in na_probs.items():
        if isinstance(p, bool) or not isinstance(p, (int, float)):
            raise InputError(f"{source}: the value of question {qid} is not a number; give a probability")
    return na_probs


def _left_sum(values) -> float:
    """Left-to-right sum (what `sum` does up to Python 3.11; 3.12 compensates, changing the last digit)."""
    total = 0
    for v in values:
        total += v
    return total


# --------------------------------------------------------------------------------------------------
# SQuAD v1.1


def get_raw_scores_v1(dataset: list, predictions: Mapping[str, str]) -> tuple[dict, dict]:
    """Per-question (exact, f1) of answered v1.1 questions, keyed by id in dataset order (exact is a bool)."""
    exact, f1 = {}, {}
    for qa in iter_questions(dataset):
        if qa["id"] not in predictions:
            continue
        if not qa["answers"]:
            raise InputError(
                f"dataset: question {qa['id']} has no gold answer, which v1.1 cannot score; evaluate with --version 2.0"
            )
        golds = [a["text"] for a in qa["answers"]]
        exact[qa["id"]], f1[qa["id"]] = squad_question_scores_v1(predictions[qa["id"]], golds)
    return exact, f1


def evaluate_v1(
    dataset: list, predictions: Mapping[str, str], warn: Callable[[str], None] | None = None
) -> dict[str, float]:
    """`evaluate-v1.1.py`'s `evaluate`: {"exact_match", "f1"} in percent over all questions of `dataset`
    (the file's "data" list). An unanswered question scores 0 and is reported through `warn` (default:
    a logging warning) as "Unanswered question {qid} will receive score 0."
    """
    check_predictions(predictions)
    warn = warn or logger.warning
    exact, f1 = get_raw_scores_v1(dataset, predictions)
    total = 0
    for qa in iter_questions(dataset):
        total += 1
        if qa["id"] not in exact:
            warn(f"Unanswered question {qa['id']} will receive score 0.")
    if total == 0:
        raise InputError("dataset: has no questions; give a SQuAD dataset with questions")
    return {
        "exact_match": 100.0 * _left_sum(exact.values()) / total,
        "f1": 100.0 * _left_sum(f1.values()) / total,
    }


# --------------------------------------------------------------------------------------------------
# SQuAD v2.0


def make_qid_to_has_ans(dataset: list) -> dict[str, bool]:
    """Question id -> whether it has a gold answer, in dataset order."""
    return {qa["id"]: bool(qa["answers"]) for qa in iter_questions(dataset)}


def get_raw_scores_v2(dataset: list, preds: Mapping[str, str]) -> tuple[dict, dict]:
    """`get_raw_scores`: per-question exact (int) and f1 of every predicted v2.0 question, in dataset order.

    Gold answers that normalise to nothing are dropped, and a question left with none accepts only the
    empty answer.
    """
    exact, f1 = {}, {}
    for qa in iter_questions(dataset):
        qid = qa["id"]
        if qid not in preds:
            continue
        exact[qid], f1[qid] = squad_question_scores_v2(preds[qid], [a["text"] for a in qa["answers"]])
    return exact, f1


def apply_no_ans_threshold(
    scores: Mapping[str, float], na_probs: Mapping[str, float], qid_to_has_ans: Mapping[str, bool], thresh: float
) -> dict[str, float]:
    """A question whose na_prob is above `thresh` is predicted unanswerable: it scores 1.0 if it is, else 0.0."""
    out = {}
    for qid, s in scores.items():
        out[qid] = float(not qid_to_has_ans[qid]) if na_probs[qid] > thresh else s
    return out


def _eval_dict(exact: Mapping, f1: Mapping, qids: list[str]) -> collections.OrderedDict:
    total = len(qids)
    return collections.OrderedDict(
        [
            ("exact", 100.0 * _left_sum(exact[k] for k in qids) / total),
            ("f1", 100.0 * _left_sum(f1[k] for k in qids) / total),
            ("total", total),
        ]
    )


def find_best_thresh(
    preds: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    qid_to_has_ans: Mapping[str, bool],
) -> tuple[float, float]:
    """(best score in percent, its na_prob threshold) over all thresholds, as the official script finds it.

    Start with every question predicted unanswerable, then admit questions in order of increasing
    na_prob (a stable sort: ties keep the order of `na_probs`, i.e. of its JSON file) and keep the first
    threshold that reaches the best score.
    """
    cur: float = sum(1 for has in qid_to_has_ans.values() if not has)
    best = cur
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            cur += scores[qid]
        elif preds[qid]:
            cur -= 1
        if cur > best:
            best, best_thresh = cur, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def evaluate_v2(
    dataset: list,
    preds: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> collections.OrderedDict:
    """`evaluate-v2.0.py`: exact, f1, total, then HasAns_* and NoAns_* (when such questions exist), and with
    `na_probs` also best_exact, best_exact_thresh, best_f1, best_f1_thresh. Scores are percentages.

    `dataset` is the file's "data" list; `preds` maps every question id to its answer ("" = no answer);
    `na_probs` maps question ids to no-answer probabilities (without it every probability is 0.0, so no
    threshold applies).
    """
    check_predictions(preds)
    qid_to_has_ans = make_qid_to_has_ans(dataset)
    if not qid_to_has_ans:
        raise InputError("dataset: has no questions; give a SQuAD dataset with questions")
    missing = [q for q in qid_to_has_ans if q not in preds]
    if missing:
        raise InputError(
            f"predictions: no answer for {len(missing)} of {len(qid_to_has_ans)} questions (first: {missing[0]}); "
            'SQuAD 2.0 scores every question, so give each one ("" for no answer)'
        )
    use_na = na_probs is not None
    if na_probs is not None:
        check_na_probs(na_probs)
        absent = [q for q in preds if q in qid_to_has_ans and q not in na_probs]
        if absent:
            raise InputError(
                f"na_probs: no probability for {len(absent)} predicted questions (first: {absent[0]}); "
                "give one for every question"
            )
    else:
        na_probs = {k: 0.0 for k in preds}
    exact_raw, f1_raw = get_raw_scores_v2(dataset, preds)
    exact = apply_no_ans_threshold(exact_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    f1 = apply_no_ans_threshold(f1_raw, na_probs, qid_to_has_ans, na_prob_thresh)
    out = _eval_dict(exact, f1, list(exact))
    for prefix, want in (("HasAns", True), ("NoAns", False)):
        qids = [k for k, has in qid_to_has_ans.items() if has is want]
        if qids:
            for k, v in _eval_dict(exact, f1, qids).items():
                out[f"{prefix}_{k}"] = v
    if use_na:
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(preds, exact_raw, na_probs, qid_to_has_ans)
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(preds, f1_raw, na_probs, qid_to_has_ans)
    return out


# --------------------------------------------------------------------------------------------------
