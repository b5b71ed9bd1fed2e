"""bert.retrieval: quantization equal to sentence-transformers' `quantize_embeddings` for every precision
(ranges from the embeddings, given ranges, a constant dimension, calibration in chunks), exact chunked
top-k equal to a brute-force search and to sentence-transformers' `semantic_search`, and corpus/query
files read as `bert embed` reads them, with BEIR ids and titles."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bert.errors import InputError
from bert.flags import EMBEDDING_PRECISIONS
from bert.retrieval import Calibration, TopK, quantize_embeddings, quantized_shape, read_texts

st_util = pytest.importorskip("sentence_transformers.util", reason="sentence-transformers is the oracle (test extra)")


def vectors(n: int, d: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.1, (n, d)).astype(np.float32)


@pytest.mark.parametrize("precision", EMBEDDING_PRECISIONS)
def test_quantization_equals_sentence_transformers(precision):
    x = vectors(150, 37)
    x[:, 5] = 0.25  # a constant dimension: a zero range
    x[3, 7] = 0.0  # exactly zero: not positive
    expected = st_util.quantize_embeddings(x, precision=precision)
    got = quantize_embeddings(x, precision)
    assert got.dtype == expected.dtype and got.shape == expected.shape == quantized_shape(150, 37, precision)[0]
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == quantized_shape(150, 37, precision)[1]
    # Ranges from other embeddings (calibration), and values outside them, clipped.
    calibration = vectors(200, 37, seed=1)
    ranges = np.stack([calibration.min(0), calibration.max(0)])
    expected = st_util.quantize_embeddings(x, precision=precision, ranges=ranges)
    np.testing.assert_array_equal(quantize_embeddings(x, precision, ranges), expected)


def test_calibration_in_chunks_equals_the_whole(caplog):
    x = vectors(250, 16)
    whole = Calibration().add(x).ranges()
    calibration = Calibration()
    for start in range(0, 250, 33):
        calibration.add(x[start : start + 33])
    np.testing.assert_array_equal(calibration.ranges(), whole)
    np.testing.assert_array_equal(whole, np.stack([x.min(0), x.max(0)]))
    assert "ranges from only" not in caplog.text
    Calibration().add(x[:20]).ranges()
    assert "int8/uint8 ranges from only 20 embeddings" in caplog.text
    with pytest.raises(InputError, match="at least two embeddings"):
        quantize_embeddings(x[:1], "int8")
    with pytest.raises(InputError, match="precision='int4' must be one of"):
        quantize_embeddings(x, "int4")


def brute_force(queries: np.ndarray, corpus: np.ndarray, k: int) -> list[list[int]]:
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    c = corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    scores = q.astype(np.float64) @ c.T.astype(np.float64)
    return [list(np.argsort(-row, kind="stable")[:k]) for row in scores]


@pytest.mark.parametrize("chunk", [1, 7, 50, 1000])
def test_top_k_over_chunks_equals_brute_force(chunk):
    corpus, queries = vectors(120, 24, seed=2), vectors(9, 24, seed=3)
    top = TopK(queries, k=10, query_block=4)
    for start in range(0, len(corpus), chunk):
        top.add(corpus[start : start + chunk])
    found = top.result()
    assert [[row for row, _ in hits] for hits in found] == brute_force(queries, corpus, 10)
    reference = st_util.semantic_search(torch.from_numpy(queries), torch.from_numpy(corpus), top_k=10)
    for hits, expected in zip(found, reference):
        assert [row for row, _ in hits] == [e["corpus_id"] for e in expected]
        np.testing.assert_allclose([s for _, s in hits], [e["score"] for e in expected], atol=1e-6)
    # Fewer documents than k: all of them; equal scores: the earlier row first.
    small = TopK(queries[:2], k=5)
    small.add(np.stack([corpus[0], corpus[1], corpus[0]]))
    assert [row for row, _ in small.result()[0]][:3] in ([0, 2, 1], [1, 0, 2])
    assert len(small.result()[0]) == 3
    with pytest.raises(InputError, match="do not match the queries' 24 dimensions"):
        top.add(vectors(3, 12))


def test_top_k_keeps_the_earlier_of_equal_rows_at_the_kth_place():
    """A chunk longer than k is cut to the rows that reach a query's k-th score before the sort: a tie at the
    k-th place still goes to the earlier row, in whatever chunk it came."""
    corpus, queries = vectors(60, 16, seed=4), vectors(3, 16, seed=5)
    order = brute_force(queries, corpus, len(corpus))[0]
    row = int(order[4])  # the query's 5th best: k = 5 ends on it
    later = [int(r) for r in order[::-1] if r > row]  # the query's worst rows after it
    copies = [next(r for r in later if r < 25), next(r for r in later if r >= 25)] if row < 24 else later[:2]
    corpus[copies] = corpus[row]  # later copies of it, in its chunk of 25 and in another where it can
    for chunk in (60, 25):
        top = TopK(queries, k=5)
        for start in range(0, len(corpus), chunk):
            top.add(corpus[start : start + chunk])
        found = [[r for r, _ in hits] for hits in top.result()]
        assert found[0][4] == row
        assert found == brute_force(queries, corpus, 5)


def test_read_texts_as_bert_embed_reads_them(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    records = [
        {"_id": "d1", "title": "Oil", "text": "The crisis began."},
        {"_id": "d2", "title": "", "text": "No title here."},
        {"id": 7, "text": "An id that is a number."},
        {"text": "No id at all."},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records) + "plain text line\n", encoding="utf-8")
    assert list(read_texts(str(corpus), "corpus.jsonl")) == [
        ("d1", "Oil The crisis began."),
        ("d2", "No title here."),
        ("7", "An id that is a number."),
        ("3", "No id at all."),
        ("4", "plain text line"),
    ]
    corpus.write_text('{"_id": "a", "text": "x"}\n\n{"_id": "b", "text": "y"}\n', encoding="utf-8")
    with pytest.raises(InputError, match="corpus.jsonl line 2: empty line"):
        list(read_texts(str(corpus), "corpus.jsonl"))
