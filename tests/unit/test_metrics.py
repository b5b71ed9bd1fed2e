"""bert.metrics on cases worked out by hand: classification/regression, SQuAD answers, conlleval NER."""

import math
import random

import numpy as np
import pytest

from bert import metrics
from bert.errors import InputError

# --------------------------------------------------------------------------------------------------
# Classification and regression


def test_accuracy():
    assert metrics.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert metrics.accuracy(np.array([2, 0, 1]), np.array([2, 0, 1])) == 1.0


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError):
        metrics.accuracy([1, 0], [1])


def test_f1_binary():
    # TP=2 (positions 0, 4), FP=1 (position 1), FN=1 (position 3): F1 = 2*2 / (2*2 + 1 + 1) = 2/3.
    assert metrics.f1_binary([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(2 / 3, abs=1e-15)
    # precision 1/3, recall 1/1 -> 2*(1/3)/(4/3) = 0.5
    assert metrics.f1_binary([1, 1, 1, 0], [1, 0, 0, 0]) == pytest.approx(0.5, abs=1e-15)
    # No positive predicted or gold: 0.0 (sklearn's zero-division value), not NaN.
    assert metrics.f1_binary([0, 0], [0, 0]) == 0.0


def test_matthews_corrcoef_binary():
    # TP=2, TN=1, FP=1, FN=1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6.
    preds = [1, 1, 1, 0, 0]
    labels = [1, 1, 0, 1, 0]
    assert metrics.matthews_corrcoef(preds, labels) == pytest.approx(1 / 6, abs=1e-15)
    assert metrics.matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]) == pytest.approx(1.0)
    assert metrics.matthews_corrcoef([1, 0, 0, 1], [0, 1, 1, 0]) == pytest.approx(-1.0)


def test_matthews_corrcoef_degenerate_is_zero():
    # All predictions one class: the denominator vanishes; the convention (sklearn, GLUE) is 0.
    assert metrics.matthews_corrcoef([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0
    assert metrics.matthews_corrcoef([0, 1, 0, 1], [1, 1, 1, 1]) == 0.0


def test_matthews_corrcoef_multiclass():
    # Confusion (true x pred): (0,0)=2, (1,2)=1, (2,2)=1. t=[2,1,1], p=[2,0,2], c=3, s=4.
    # cov_yp = 3*4 - (4+0+2) = 6, cov_pp = 16 - 8 = 8, cov_yy = 16 - 6 = 10 -> 6 / sqrt(80).
    assert metrics.matthews_corrcoef([0, 2, 2, 0], [0, 1, 2, 0]) == pytest.approx(6 / math.sqrt(80), abs=1e-15)


def test_pearson():
    # dx = [-1.5, -0.5, 0.5, 1.5], dy = [-3, -1, 0, 4]: sxy = 11, sxx = 5, syy = 26 -> 11 / sqrt(130).
    assert metrics.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(130), abs=1e-15)
    assert math.isnan(metrics.pearson([1, 1, 1], [1, 2, 3]))


def test_rankdata_averages_ties():
    assert metrics.rankdata([10, 20, 10, 30, 20, 20]).tolist() == [1.5, 4.0, 1.5, 6.0, 4.0, 4.0]


def test_spearman_with_ties():
    # ranks x = [1, 2.5, 2.5, 4], ranks y = [1, 3, 2, 4]; Pearson of ranks = 4.5 / sqrt(4.5 * 5) = 3 / sqrt(10).
    assert metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(3 / math.sqrt(10), abs=1e-15)
    # Monotone but non-linear: Spearman is exactly 1 where Pearson is not.
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    y = [v**3 for v in x]
    assert metrics.spearman(x, y) == pytest.approx(1.0, abs=1e-15)
    assert metrics.pearson(x, y) < 0.99


def test_glue_metrics_per_task():
    preds, labels = [1, 1, 1, 0, 0], [1, 1, 0, 1, 0]
    assert metrics.glue_metrics("MRPC", preds, labels) == pytest.approx({"accuracy": 0.6, "f1": 2 / 3})
    assert metrics.glue_metrics("qqp", preds, labels).keys() == {"accuracy", "f1"}
    assert metrics.glue_metrics("CoLA", preds, labels) == pytest.approx({"accuracy": 0.6, "mcc": 1 / 6})
    assert metrics.glue_metrics("sst-2", preds, labels) == {"accuracy": 0.6}
    for name in ("mnli", "MNLI-MM", "qnli", "rte", "wnli", "xnli"):
        assert metrics.glue_metrics(name, preds, labels).keys() == {"accuracy"}
    sts = metrics.glue_metrics("STS-B", [1, 2, 2, 3], [1, 3, 2, 4])
    assert sts.keys() == {"pearson", "spearman", "corr"}
    assert sts["spearman"] == pytest.approx(3 / math.sqrt(10))
    assert sts["corr"] == pytest.approx((sts["pearson"] + sts["spearman"]) / 2)


def test_glue_metrics_unknown_task():
    with pytest.raises(InputError, match="task_name"):
        metrics.glue_metrics("imdb", [0], [0])


# --------------------------------------------------------------------------------------------------
# Multi-label

# 4 examples x 3 labels. Per label: 0 predicted {0, 2}, gold {0, 2} -> P 1, R 1, F1 1; 1 predicted {1, 2},
# gold {1} -> P 1/2, R 1, F1 2/3; 2 predicted {0, 3}, gold {1, 3} -> P 1/2, R 1/2, F1 1/2.
ML_PREDS = [[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]]
ML_GOLD = [[1, 0, 0], [0, 1, 1], [1, 0, 0], [0, 0, 1]]


def test_per_label_scores_by_hand():
    per = metrics.per_label_scores(ML_PREDS, ML_GOLD)
    np.testing.assert_allclose(per["precision"], [1, 1 / 2, 1 / 2])
    np.testing.assert_allclose(per["recall"], [1, 1, 1 / 2])
    np.testing.assert_allclose(per["f1"], [1, 2 / 3, 1 / 2])
    assert per["support"].tolist() == [2, 1, 2]


def test_multi_label_metrics_by_hand():
    found = metrics.multi_label_metrics(np.array(ML_PREDS), np.array(ML_GOLD))
    # Micro: TP = 2 + 1 + 1 = 4 of 6 predicted and 5 gold positives.
    assert found["micro_precision"] == pytest.approx(4 / 6)
    assert found["micro_recall"] == pytest.approx(4 / 5)
    assert found["micro_f1"] == pytest.approx(2 * 4 / (6 + 5))  # 8/11
    # Macro: the means of the per-label scores.
    assert found["macro_precision"] == pytest.approx((1 + 1 / 2 + 1 / 2) / 3)
    assert found["macro_recall"] == pytest.approx((1 + 1 + 1 / 2) / 3)
    assert found["macro_f1"] == pytest.approx((1 + 2 / 3 + 1 / 2) / 3)  # 13/18
    assert found["subset_accuracy"] == 1 / 4  # only the last example's set is exact


def test_multi_label_metrics_edge_cases():
    # A label never predicted nor gold scores 0 in the macro means (sklearn's zero_division=0).
    found = metrics.multi_label_metrics([[1, 0], [0, 0]], [[1, 0], [1, 0]])
    assert found["macro_f1"] == pytest.approx((2 / 3 + 0) / 2)
    assert found["micro_f1"] == pytest.approx(2 / 3) and found["micro_precision"] == 1.0
    # All-negative predictions: micro F1 0, not NaN.
    assert metrics.multi_label_metrics([[0, 0]], [[1, 0]])["micro_f1"] == 0.0
    with pytest.raises(ValueError, match=r"\[N, L\]"):
        metrics.multi_label_metrics([1, 0], [1, 0])


def test_best_f1_threshold_by_hand():
    scores, gold = [0.9, 0.8, 0.6, 0.4, 0.2], [1, 0, 1, 1, 0]
    # Cutting after each score predicts 1..5 examples: TP 1, 1, 2, 3, 3 of 3 positives, so F1 = 2TP / (k + 3)
    # = 2/4, 2/5, 4/6, 6/7, 6/8: the best keeps 0.4 and above; the threshold lies halfway to 0.2.
    assert metrics.best_f1_threshold(scores, gold) == pytest.approx(0.3)
    # Tied scores are predicted together: both 0.7s (F1 1), halfway to 0.3.
    assert metrics.best_f1_threshold([0.7, 0.3, 0.7], [1, 0, 1]) == pytest.approx(0.5)
    # Equal F1 (2/3 cutting at 0.9 and at 0.2) keeps the higher cut, halfway to 0.6.
    assert metrics.best_f1_threshold([0.9, 0.6, 0.5, 0.2], [1, 0, 0, 1]) == pytest.approx(0.75)
    # The best cut predicts every example: halfway to 0.
    assert metrics.best_f1_threshold([0.2, 0.1], [1, 1]) == pytest.approx(0.05)
    # No gold positive: F1 is 0 whatever the threshold; the default stays.
    assert metrics.best_f1_threshold([0.9, 0.1], [0, 0], default=0.42) == 0.42


# --------------------------------------------------------------------------------------------------
# SQuAD answer scores


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The  Quick, brown fox!", "quick brown fox"),
        ("an apple a day", "apple day"),
        ("theater anthem", "theater anthem"),  # articles only as whole words
        ("A.", ""),
        ("  (1,000)  ", "1000"),
        ("café—bar", "café—bar"),  # only ASCII punctuation is removed
        ("the-end", "theend"),  # punctuation goes first, so "the" is no longer a word
    ],
)
def test_normalize_answer(text, expected):
    assert metrics.normalize_answer(text) == expected


def test_squad_f1_by_hand():
    # pred tokens [cat, sat, on, mat], gold [cat, on, mat]: P = 3/4, R = 1 -> F1 = 1.5 / 1.75 = 6/7.
    for f1 in (metrics.squad_f1_v1, metrics.squad_f1_v2):
        assert f1("the cat sat on a mat", "Cat on the mat.") == pytest.approx(6 / 7, abs=1e-15)
    # Repeated tokens count by multiplicity: common("a b b", "b b b") = {b: 2} -> P = 2/3, R = 2/3.
    assert metrics.squad_f1_v1("x b b", "b b b") == pytest.approx(2 / 3, abs=1e-15)


def test_squad_empty_answers_v1_vs_v2():
    assert metrics.squad_f1_v1("", "") == 0 and metrics.squad_exact_v1("", "") is True
    assert metrics.squad_f1_v2("", "") == 1 and metrics.squad_exact_v2("", "") == 1
    assert metrics.squad_f1_v2("the", "") == 1  # normalises to nothing, like the empty gold
    assert metrics.squad_f1_v2("cat", "") == 0 and metrics.squad_exact_v2("cat", "") == 0
    assert metrics.squad_f1_v2("", "cat") == 0


def test_squad_v2_gold_answers():
    assert metrics.squad_v2_gold_answers(["the", "A", "!"]) == [""]
    assert metrics.squad_v2_gold_answers(["the", "cat"]) == ["cat"]
    assert metrics.squad_v2_gold_answers([]) == [""]


def test_squad_question_scores_take_max_over_golds():
    exact, f1 = metrics.squad_question_scores_v1("big cat", ["a dog", "cat", "the big cat"])
    assert exact is True and f1 == 1.0
    exact, f1 = metrics.squad_question_scores_v1("big cat", ["a dog", "cat"])
    assert exact is False and f1 == pytest.approx(2 / 3)
    assert metrics.squad_question_scores_v2("", ["the"]) == (1, 1)
    assert metrics.squad_question_scores_v2("cat", ["the"]) == (0, 0)


# --------------------------------------------------------------------------------------------------
# NER: conlleval


def test_conlleval_iob2_several_sentences():
    gold = [
        ["B-PER", "I-PER", "O", "B-LOC"],
        ["B-ORG", "I-ORG", "I-ORG", "O"],
        ["O", "B-MISC", "O"],
        ["B-PER", "O"],
    ]
    pred = [
        ["B-PER", "I-PER", "O", "B-ORG"],  # PER right; LOC mistyped as ORG
        ["B-ORG", "I-ORG", "O", "O"],  # ORG cut short: wrong boundary
        ["O", "B-MISC", "O"],  # right
        ["O", "B-PER"],  # gold PER missed, a spurious PER found
    ]
    # gold chunks 5, predicted 5, correct 2 (PER in sentence 1, MISC) -> P = R = F1 = 0.4.
    m = metrics.ner_metrics(gold, pred)
    assert (m["num_gold"], m["num_pred"], m["num_correct"]) == (5, 5, 2)
    assert m["precision"] == pytest.approx(0.4) and m["recall"] == pytest.approx(0.4)
    assert m["f1"] == pytest.approx(0.4)
    # 13 tokens; wrong tags: LOC/ORG in s1, I-ORG/O in s2, both tokens of s4 -> 9/13.
    assert m["accuracy"] == pytest.approx(9 / 13)
    per = m["per_type"]
    assert list(per) == ["LOC", "MISC", "ORG", "PER"]
    assert (per["PER"]["precision"], per["PER"]["recall"], per["PER"]["f1"]) == (0.5, 0.5, 0.5)
    assert (per["LOC"]["num_gold"], per["LOC"]["num_pred"], per["LOC"]["f1"]) == (1, 0, 0.0)
    assert (per["ORG"]["num_gold"], per["ORG"]["num_pred"], per["ORG"]["precision"]) == (1, 2, 0.0)
    assert per["MISC"]["f1"] == 1.0


def test_conlleval_iob1():
    # IOB1: B- only separates two adjacent chunks of the same type; a chunk otherwise starts at I-.
    gold = [["I-PER", "I-PER", "B-PER", "O", "I-LOC"], ["I-ORG", "I-MISC"]]
    pred = [["I-PER", "I-PER", "I-PER", "O", "I-LOC"], ["I-ORG", "I-ORG"]]
    assert metrics.iob_chunks(gold[0]) == [("PER", 0, 2), ("PER", 2, 3), ("LOC", 4, 5)]
    assert metrics.iob_chunks(gold[1]) == [("ORG", 0, 1), ("MISC", 1, 2)]
    assert metrics.iob_chunks(pred[0]) == [("PER", 0, 3), ("LOC", 4, 5)]
    # gold 5 chunks, predicted 3, correct 1 (LOC): P = 1/3, R = 1/5, F1 = 2*(1/15)/(8/15) = 1/4.
    m = metrics.ner_metrics(gold, pred)
    assert (m["num_gold"], m["num_pred"], m["num_correct"]) == (5, 3, 1)
    assert m["precision"] == pytest.approx(1 / 3) and m["recall"] == pytest.approx(1 / 5)
    assert m["f1"] == pytest.approx(0.25)


def test_conlleval_i_after_o_starts_a_chunk_and_sentences_split_chunks():
    # An I- after O (invalid IOB2) starts a chunk, so this prediction is right.
    m = metrics.ner_metrics([["O", "B-PER", "I-PER"]], [["O", "I-PER", "I-PER"]])
    assert (m["num_correct"], m["f1"]) == (1, 1.0)
    assert m["accuracy"] == pytest.approx(2 / 3)  # tags differ even though the chunk is right
    # A sentence break ends a chunk: I-PER opening the second sentence is a new chunk.
    m = metrics.ner_metrics([["O", "B-PER"], ["I-PER", "O"]], [["O", "B-PER"], ["I-PER", "O"]])
    assert (m["num_gold"], m["num_correct"]) == (2, 2)


def test_conlleval_same_span_wrong_type_and_wrong_end():
    m = metrics.ner_metrics([["B-PER", "I-PER"]], [["B-ORG", "I-ORG"]])
    assert (m["num_gold"], m["num_pred"], m["num_correct"], m["f1"]) == (1, 1, 0, 0.0)
    m = metrics.ner_metrics([["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-PER", "B-PER"]])
    assert (m["num_gold"], m["num_pred"], m["num_correct"]) == (1, 2, 0)
    # A chunk whose type changes inside (B-PER I-LOC) is two chunks for the prediction.
    m = metrics.ner_metrics([["B-PER", "I-PER", "O"]], [["B-PER", "I-LOC", "O"]])
    assert (m["num_gold"], m["num_pred"], m["num_correct"]) == (1, 2, 0)


def test_conlleval_no_entities():
    m = metrics.ner_metrics([["O", "O"]], [["O", "O"]])
    assert (m["precision"], m["recall"], m["f1"], m["accuracy"]) == (0.0, 0.0, 0.0, 1.0)
    assert m["per_type"] == {}


def test_conlleval_counts_equal_span_matching_on_random_tags():
    # Second formula: correct chunks = |gold chunks ∩ predicted chunks| as (type, start, end) sets.
    rng = random.Random(0)
    tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    gold, pred = [], []
    for _ in range(300):
        n = rng.randint(1, 8)
        gold.append([rng.choice(tags) for _ in range(n)])
        pred.append([rng.choice(tags) if rng.random() < 0.3 else t for t in gold[-1]])
    m = metrics.ner_metrics(gold, pred)
    correct = sum(len(set(metrics.iob_chunks(g)) & set(metrics.iob_chunks(p))) for g, p in zip(gold, pred))
    assert m["num_correct"] == correct
    assert m["num_gold"] == sum(len(metrics.iob_chunks(g)) for g in gold)
    assert m["num_pred"] == sum(len(metrics.iob_chunks(p)) for p in pred)
    assert 0 < m["num_correct"] < m["num_gold"]
