"""Scoring sentence embeddings and rerankers: STS correlations and retrieval metrics (NumPy).

Retrieval metrics are sentence-transformers' InformationRetrievalEvaluator's, over binary relevance (a
document is relevant when the qrels give it a positive score): per query, MRR@10 (1 / the rank of the first
relevant document in the top 10, else 0), NDCG@10 (the discounted gain of the relevant documents in the top
10 over that of an ideal ranking), Recall@k (the share of the relevant documents found in the top k) and
MAP@100 (the mean over relevant documents in the top 100 of the precision at their rank, divided by
min(100, number relevant)); each averaged over queries. Search is exact: cosine similarity of every query to
every document, in chunks of queries so memory stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from bert.metrics import pearson, spearman

RECALL_AT = (1, 10, 100)
MRR_AT = NDCG_AT = 10
MAP_AT = 100
TOP_K = max(*RECALL_AT, MAP_AT)
_CHUNK = 1024


RANKING_KEYS = (f"mrr@{MRR_AT}", f"ndcg@{NDCG_AT}", *(f"recall@{k}" for k in RECALL_AT), f"map@{MAP_AT}")
STS_KEYS = ("pearson", "spearman")


def normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def truncate(x: np.ndarray, dim: int | None) -> np.ndarray:
    """Matryoshka: the first `dim` components, re-normalised (all of them when None)."""
    return normalize(x if dim is None else x[:, :dim])


def sts_metrics(a: np.ndarray, b: np.ndarray, scores: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman correlations of the pairs' cosine similarities with the gold scores (in float64:
    the cosines of a barely trained model differ in their last float32 digits)."""
    cos = np.sum(normalize(a.astype(np.float64)) * normalize(b.astype(np.float64)), axis=1)
    return {"pearson": pearson(cos, np.asarray(scores)), "spearman": spearman(cos, np.asarray(scores))}


def search(queries: np.ndarray, documents: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine search: for each query the indices [Q, k'] of its k best documents, best first, and their
    similarities (k' = min(k, number of documents))."""
    q, d = normalize(queries), normalize(documents)
    k = min(k, len(d))
    top = np.zeros((len(q), k), dtype=np.int64)
    sims = np.zeros((len(q), k), dtype=np.float32)
    for i in range(0, len(q), _CHUNK):
        s = q[i : i + _CHUNK] @ d.T  # [chunk, D]
        part = np.argpartition(-s, k - 1, axis=1)[:, :k]
        part_s = np.take_along_axis(s, part, axis=1)
        order = np.argsort(-part_s, axis=1, kind="stable")
        top[i : i + _CHUNK] = np.take_along_axis(part, order, axis=1)
        sims[i : i + _CHUNK] = np.take_along_axis(part_s, order, axis=1)
    return top, sims


def ranking_metrics(ranked: Sequence[Sequence[str]], relevant: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The retrieval metrics (see the module docstring) of ranked document ids against each query's relevant ones."""
    mrr, ndcg, ap = [], [], []
    recall: dict[int, list[float]] = {k: [] for k in RECALL_AT}
    for docs, rel in zip(ranked, relevant):
        hits = np.array([d in rel for d in docs[:TOP_K]], dtype=bool)
        first = np.flatnonzero(hits[:MRR_AT])
        mrr.append(1.0 / (first[0] + 1) if len(first) else 0.0)
        discounts = 1.0 / np.log2(np.arange(2, NDCG_AT + 2))
        dcg = float(np.sum(discounts[: len(hits[:NDCG_AT])][hits[:NDCG_AT]]))
        ideal = float(np.sum(discounts[: min(len(rel), NDCG_AT)]))
        ndcg.append(dcg / ideal if ideal else 0.0)
        for k in RECALL_AT:
            recall[k].append(float(hits[:k].sum()) / len(rel))
        ranks = np.flatnonzero(hits[:MAP_AT])
        precisions = (np.arange(len(ranks)) + 1) / (ranks + 1)
        ap.append(float(precisions.sum()) / min(len(rel), MAP_AT))
    values = [np.mean(mrr), np.mean(ndcg), *(np.mean(recall[k]) for k in RECALL_AT), np.mean(ap)]
    return {k: float(v) for k, v in zip(RANKING_KEYS, values)}


def retrieval_metrics(
    query_vectors: np.ndarray,
    document_vectors: np.ndarray,
    document_ids: Sequence[str],
    relevant: Sequence[Mapping[str, float]],
) -> dict[str, float]:
    top, _ = search(query_vectors, document_vectors)
    return ranking_metrics([[document_ids[j] for j in row] for row in top], relevant)


def per_dimension(
    metrics: Callable[[int | None], dict[str, float]], dims: Sequence[int], full: int
) -> dict[str, float]:
    """`metrics(dim)` for the full vectors (keys as they are) and for each Matryoshka dimension below `full`
    (keys prefixed `dim<d>_`)."""
    out = dict(metrics(None))
    for d in dims:
        if d < full:
            out.update({f"dim{d}_{k}": v for k, v in metrics(d).items()})
    return out


def rerank(
    top: Sequence[Sequence[str]], scores: Sequence[Sequence[float] | np.ndarray] | np.ndarray
) -> list[list[str]]:
    """Each query's candidates re-ordered by the reranker's scores, best first (ties keep the retriever's order)."""
    return [[docs[j] for j in np.argsort(-np.asarray(s), kind="stable")] for docs, s in zip(top, scores)]
