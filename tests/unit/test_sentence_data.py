"""The training-data readers and batches of `bert train-embeddings` / `bert train-reranker` (bert.sentence.data)
and the retrieval metrics' edge cases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert.batching import BatchPlan
from bert.errors import InputError
from bert.sentence.data import PAIRS, SCORED, TUPLES, TrainingData, read_beir, read_training_data
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


def test_a_byte_order_mark_does_not_hide_the_header(tmp_path):
    """An STS-B-style TSV saved with a UTF-8 BOM: the header is still a header (was read as a text column)."""
    path = tmp_path / "sts.tsv"
    path.write_bytes("\ufeffsentence1\tsentence2\tscore\na b\tc d\t0.5\n".encode())
    data = read_training_data(str(path))
    assert data.kind == SCORED and data.columns == [["a b"], ["c d"]] and data.scores == [0.5]
    path = tmp_path / "p.jsonl"
    path.write_bytes('\ufeff["a", "b"]\n'.encode())
    assert read_training_data(str(path)).columns == [["a"], ["b"]]


@pytest.mark.parametrize(
    "name, lines, where, value",
    [
        # One "nan" in a headerless scored TSV: refused on its line, not the whole file read as triples.
        ("h.tsv", ["a\tb\t0.5", "c\td\t0.1", "e\tf\tnan"], 3, "'nan'"),
        ("i.tsv", ["a\tb\tinf", "c\td\t0.1"], 1, "'inf'"),
        ("s.tsv", ["sentence1\tsentence2\tscore", "a\tb\t1", "c\td\t-Infinity"], 3, "'-Infinity'"),
        ("n.jsonl", ['["a", "b", 0.5]', '["c", "d", NaN]'], 2, "'NaN'"),
        ("o.jsonl", ['["a", "b", 1e999]'], 1, "'Infinity'"),
        ("p.jsonl", ['["a", "b", 1' + "0" * 400 + "]"], 1, "'1000"),
        ("q.jsonl", ['{"sentence1": "a", "sentence2": "b", "score": NaN}'], 1, "'NaN'"),
    ],
)
def test_scores_must_be_finite_numbers(tmp_path, name, lines, where, value):
    with pytest.raises(InputError, match=rf"{name}:{where}: score {value}.* is not a finite number"):
        read_training_data(write(tmp_path / name, lines))


def test_a_scored_tsv_holds_scored_pairs_on_every_line(tmp_path):
    """The first line makes a headerless TSV scored pairs; a later line without a score is refused, not the
    whole file read as triples."""
    for lines in (["a\tb\t0.5", "c\td\tfoo"], ["a\tb\t0.5", "c\td\t0.1\te"]):
        with pytest.raises(InputError, match=r"j.tsv:2: not a scored pair \(text, text, score\) as line 1 is"):
            read_training_data(write(tmp_path / "j.tsv", lines))


def _beir(root, queries, corpus):
    (root / "qrels").mkdir(parents=True)
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    write(root / "queries.jsonl", [json.dumps(q) for q in queries])
    write(root / "corpus.jsonl", [json.dumps(d) for d in corpus])
    return str(root)


@pytest.mark.parametrize("value, kind", [(7, "a number"), (None, "null"), (["x"], "a list")])
def test_beir_texts_and_titles_must_be_strings(tmp_path, value, kind):
    doc = {"_id": "d1", "title": "t", "text": "x"}
    path = _beir(tmp_path / "q", [{"_id": "q0", "text": "a"}, {"_id": "q1", "text": value}], [doc])
    with pytest.raises(InputError, match=rf'queries.jsonl:2: "text" must be a string, not {kind}'):
        read_training_data(path)
    path = _beir(tmp_path / "d", [{"_id": "q1", "text": "a"}], [{**doc, "title": value or 3}])
    with pytest.raises(InputError, match=r'corpus.jsonl:1: "title" must be a string'):
        read_training_data(path)
    assert read_training_data(_beir(tmp_path / "ok", [{"_id": "q1", "text": "a"}], [doc])).columns == [["a"], ["t x"]]


def test_a_deeply_nested_line_is_one_error_as_predict_says_it(tmp_path):
    """The training reader and predict's share one parser for JSON lines, and so one message."""
    from bert.inference import EMBEDDINGS
    from bert.input_lines import read_input_record

    deep = '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(InputError) as predict:
        read_input_record(deep, EMBEDDINGS)
    with pytest.raises(InputError, match=r"^.*x.jsonl:2: JSON nested too deeply") as ours:
        read_training_data(write(tmp_path / "x.jsonl", ['["a", "b"]', deep]))
    assert str(ours.value).endswith(str(predict.value))
    path = _beir(tmp_path / "b", [{"_id": "q1", "text": "a"}], [{"_id": "d1", "text": "x"}])
    (tmp_path / "b" / "corpus.jsonl").write_text("[" * 100_000 + "\n")
    with pytest.raises(InputError, match=r"corpus.jsonl:1: JSON nested too deeply"):
        read_training_data(path)


def test_every_document_the_qrels_name_must_exist_a_score_0_one_too(tmp_path):
    """A score-0 qrels line names a document of the split as much as a relevant one does: a missing one is one
    line naming it (it was a KeyError traceback)."""
    path = _beir(tmp_path / "b", [{"_id": "q1", "text": "a"}], [{"_id": "d1", "text": "x"}])
    with open(tmp_path / "b" / "qrels" / "train.tsv", "a") as f:
        f.write("q1\tghost\t0\n")
    with pytest.raises(InputError, match=r"qrels/train.tsv: document ghost is not in .*corpus.jsonl"):
        read_training_data(path)


@pytest.mark.parametrize("first, again", [("d1", "d1"), (7, "7")])
def test_an_id_twice_in_a_beir_file_is_named(tmp_path, first, again):
    """Two records of one id (the last silently won) are refused on the second's line, 7 and "7" alike."""
    docs = [{"_id": "d1", "text": "x"}, {"_id": first, "text": "y"}, {"_id": again, "text": "z"}]
    path = _beir(tmp_path / "b", [{"_id": "q1", "text": "a"}], docs if first != "d1" else docs[1:])
    line = 3 if first != "d1" else 2
    with pytest.raises(InputError, match=rf"corpus.jsonl:{line}: _id '{again}' again \(first on line {line - 1}\)"):
        read_training_data(path)


def test_head_keeps_the_first_examples_and_every_document(tmp_path):
    """`--max_train_examples` / `--max_eval_examples`: the first N pairs (scores too), the first N transfer
    examples, and the first N queries of a BEIR split with all of its documents."""
    from bert.sentence.loss_table import with_transfer

    scored = TrainingData("s.tsv", [["a", "b", "c"], ["x", "y", "z"]], [0.1, 0.2, 0.3])
    assert scored.head(2) == TrainingData("s.tsv", [["a", "b"], ["x", "y"]], [0.1, 0.2]) and scored.head(0) == scored
    transfer = tmp_path / "transfer.jsonl"
    transfer.write_text("".join(json.dumps([f"q{i}", f"p{i}"]) + "\n" for i in range(5)))
    pairs = TrainingData("train.jsonl", [["a"], ["b"]])
    assert with_transfer(pairs, str(transfer), texts=False, limit=2).columns == [["a", "q0", "q1"], ["b", "p0", "p1"]]
    split = read_beir(str(shared_path("data", "retrieval", "squad-dev")), "dev")
    short = split.head(5)
    assert list(short.queries) == list(split.queries)[:5] and short.documents == split.documents
    assert short.qrels == {q: split.qrels[q] for q in short.queries}
