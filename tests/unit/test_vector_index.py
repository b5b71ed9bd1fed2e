"""`bert.vector_index`: the approximate indexes reach their recall against the exact search on a seeded set of
clustered vectors (ivf_pq >= 0.75 and hnsw >= 0.95 recall@10); the training sample is bounded and one seed
gives one sample; without faiss, `bert index` says which extra installs it, in one line."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from bert.vector_index import IndexSpec, VectorIndex, build_index, sample_rows, unit_rows
from conftest import cli_error


class Matrix:
    """A matrix in memory behind the interface of `bert.formats.embeddings.open_embeddings`, counting reads."""

    def __init__(self, x: np.ndarray):
        self.x, self.read = x, 0

    def __len__(self) -> int:
        return len(self.x)

    @property
    def dims(self) -> int:
        return self.x.shape[1]

    def rows(self, start: int, stop: int) -> np.ndarray:
        self.read = max(self.read, stop - start)
        return self.x[start:stop]


def clustered(rng: np.random.Generator, n: int, centers: np.ndarray) -> np.ndarray:
    """`n` vectors around the `centers` (as text embeddings gather by topic)."""
    return (centers[rng.integers(0, len(centers), n)] + 0.5 * rng.normal(size=(n, centers.shape[1]))).astype(np.float32)


@pytest.mark.parametrize(
    "spec, nprobe, threshold",
    [(IndexSpec("ivf_pq", nlist=16, m=16, nbits=8), 4, 0.75), (IndexSpec("hnsw", hnsw_m=16), None, 0.95)],
)
def test_recall_at_10_against_the_exact_search(spec, nprobe, threshold):
    pytest.importorskip("faiss", reason="indexes need faiss-cpu (the index extra)")
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(40, 32))
    corpus, queries = Matrix(clustered(rng, 2000, centers)), clustered(rng, 100, centers)
    exact = np.argsort(-(unit_rows(queries) @ unit_rows(corpus.x).T), axis=1, kind="stable")[:, :10]
    index, resolved, trained_on = build_index(corpus, spec, train_sample=1000, seed=0, chunk_size=500)
    assert corpus.read == 500  # a chunk at a time
    assert trained_on == (1000 if spec.index_type == "ivf_pq" else 0)
    found = VectorIndex(None, {"index_type": spec.index_type}, index, "test").search(queries, 10, nprobe, None)  # type: ignore[arg-type]
    recall = np.mean([len({row for row, _ in hits} & set(best)) / 10 for hits, best in zip(found, exact)])
    assert recall >= threshold
    # The scores are cosines (approximate for product-quantized codes).
    row, score = found[0][0]
    cosine = float((unit_rows(queries[:1]) @ unit_rows(corpus.x[row : row + 1]).T)[0, 0])
    assert score == pytest.approx(cosine, abs=0.05 if spec.index_type == "ivf_pq" else 1e-5)


def test_the_training_sample_is_bounded_and_seeded():
    a, b, c = sample_rows(1000, 50, 1), sample_rows(1000, 50, 1), sample_rows(1000, 50, 2)
    assert len(a) == 50 and len(set(a.tolist())) == 50 and list(a) == sorted(a)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(sample_rows(30, 50, 1), np.arange(30))


def test_without_faiss_one_line_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss raises ImportError
    np.save(tmp_path / "v.npy", np.ones((4, 8), dtype=np.float32))
    err = cli_error(capsys, "index", f"--corpus_embeddings={tmp_path / 'v.npy'}", f"--output_dir={tmp_path / 'i'}")
    assert err == "bert index: error: FAISS indexes need faiss: pip install 'bert[index]' (faiss-cpu)"
    assert not (tmp_path / "i").exists()
