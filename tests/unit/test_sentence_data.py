"""The training-data readers and batches of `bert train-embeddings` / `bert train-reranker` (bert.sentence.data)
and the retrieval metrics' edge cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert.errors import InputError
from bert.sentence.data import PAIRS, SCORED, TUPLES, BatchPlan, TrainingData, read_beir, read_training_data
from bert.sentence.evaluation import ranking_metrics, search
from conftest import shared_path


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_jsonl_shapes(tmp_path):
    pairs = read_training_data(write(tmp_path / "p.jsonl", ['["a", "b"]', '{"anchor": "c", "positive": "d"}']))
    assert pairs.kind == PAIRS and pairs.columns == [["a", "c"], ["b", "d"]]
    tuples = read_training_data(
        write(
            tmp_path / "t.jsonl", ['{"query": "q", "positive": "p", "negatives": ["n1", "n2"]}', '["r", "s", "t", "u"]']
        )
    )
    assert tuples.kind == TUPLES and tuples.example(0) == ["q", "p", "n1", "n2"]
    scored = read_training_data(
        write(tmp_path / "s.jsonl", ['["a", "b", 0.5]', '{"sentence1": "c", "sentence2": "d", "score": 1}'])
    )
    assert scored.kind == SCORED and scored.scores == [0.5, 1.0]


def test_a_line_of_another_shape_is_named(tmp_path):
    path = write(tmp_path / "x.jsonl", ['["a", "b"]', '["c", "d", "e"]'])
    with pytest.raises(InputError, match=r"x.jsonl:2: 3 texts"):
        read_training_data(path)
    with pytest.raises(InputError, match=r"y.jsonl:1: not valid JSON"):
        read_training_data(write(tmp_path / "y.jsonl", ["{oops"]))


def test_tsv_positional_and_with_a_header(tmp_path):
    assert read_training_data(write(tmp_path / "a.tsv", ["x\ty\t0.3", "z\tw\t1"])).kind == SCORED
    assert read_training_data(write(tmp_path / "b.tsv", ["x\ty\tv", "z\tw\tu"])).kind == TUPLES
    sts = read_training_data(str(shared_path("data", "glue", "STS-B", "dev.tsv")))
    assert sts.kind == SCORED and len(sts) == 1500
    assert sts.columns[0][0] == "A man with a hard hat is dancing." and sts.scores[0] == 5.0


def test_beir_directory(tmp_path):
    base = shared_path("data", "retrieval", "squad-dev")
    train = read_training_data(str(base))
    assert train.kind == PAIRS and len(train) == 2740
    test = read_beir(str(base), "test")
    assert len(test.queries) == 2296 and all(d in test.documents for r in test.qrels.values() for d in r)
    assert not set(test.documents) & set(read_beir(str(base), "train").documents)  # split by article
    (tmp_path / "qrels").mkdir()
    with pytest.raises(InputError, match="qrels/dev.tsv is missing"):
        read_beir(str(tmp_path), "dev")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_duplicate_batches(seed):
    rng = np.random.default_rng(seed)
    words = [f"t{i}" for i in range(30)]  # few texts: duplicates across examples are frequent
    columns = [[str(w) for w in rng.choice(words, 60)] for _ in range(3)]
    data = TrainingData("x", columns)
    plan = BatchPlan(data, 4, seed, no_duplicates=True)
    n = plan.batches_per_epoch()
    assert n >= 1
    for step in range(2 * n):
        assert len(plan.batch(step)) == 4
        rows = [set(data.example(int(i))) for i in plan.batch(step)]
        assert all(not (rows[a] & rows[b]) for a in range(4) for b in range(a + 1, 4))
    plain = BatchPlan(data, 4, seed, no_duplicates=False)
    assert any(
        set(data.example(int(a))) & set(data.example(int(b)))
        for s in range(plain.batches_per_epoch())
        for a in plain.batch(s)
        for b in plain.batch(s)
        if a != b
    )


def test_batches_are_a_function_of_seed_and_step():
    data = TrainingData("x", [[f"a{i}" for i in range(40)], [f"b{i}" for i in range(40)]])
    one, two = BatchPlan(data, 8, 3, True), BatchPlan(data, 8, 3, True)
    assert [list(one.batch(s)) for s in range(12)] == [list(two.batch(s)) for s in range(12)]
    assert sorted(np.concatenate([one.batch(s) for s in range(5)])) == list(range(40))  # an epoch: each once


def test_ranking_metrics_follow_their_definitions():
    ranked = [["d1", "d2", "d3"], ["d3", "d1", "d2"], ["d2", "d3", "d9"]]
    relevant = [{"d1": 1}, {"d1": 1, "d2": 1}, {"d1": 1}]
    m = ranking_metrics(ranked, relevant)
    assert m["mrr@10"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert m["recall@1"] == pytest.approx((1 + 0 + 0) / 3)
    assert m["recall@10"] == pytest.approx((1 + 1 + 0) / 3)
    idcg2 = 1 + 1 / np.log2(3)
    assert m["ndcg@10"] == pytest.approx((1 + (1 / np.log2(3) + 1 / np.log2(4)) / idcg2 + 0) / 3)
    assert m["map@100"] == pytest.approx((1 + (1 / 2 + 2 / 3) / 2 + 0) / 3)


def test_search_is_exact_cosine():
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(7, 5)), rng.normal(size=(30, 5))
    top, sims = search(q, d, 10)
    cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (d / np.linalg.norm(d, axis=1, keepdims=True)).T
    np.testing.assert_array_equal(top, np.argsort(-cos, axis=1)[:, :10])
    np.testing.assert_allclose(sims, np.sort(cos, axis=1)[:, ::-1][:, :10], rtol=1e-5)


def test_json_object_negatives_may_be_one_text(tmp_path):
    data = read_training_data(
        write(tmp_path / "n.jsonl", [json.dumps({"anchor": "a", "positive": "b", "negative": "c"})])
    )
    assert data.columns == [["a"], ["b"], ["c"]]
