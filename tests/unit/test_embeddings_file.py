"""`bert.formats.embeddings.EmbeddingsFile`, the one reader of stored embedding matrices: a good .npy reads back
equal to what `np.save` wrote; every bad file is one `InputError` line naming it (text or random bytes named
.npy, a pickled object array, an .npz, a truncated file, a NaN row with its number, a FIFO refused without
opening it), and damaged files never raise anything else."""

from __future__ import annotations

import os
import pickle
import threading

import numpy as np
import pytest

from bert.errors import InputError
from bert.formats.embeddings import EmbeddingsFile

hypothesis = pytest.importorskip("hypothesis", reason="the property tests need hypothesis (pip install '.[test]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _open(path):
    return EmbeddingsFile(path, f"--corpus_embeddings={path}")


def test_reads_what_numpy_saved_in_chunks(tmp_path):
    matrix = np.random.default_rng(0).normal(size=(11, 5)).astype(np.float32)
    np.save(tmp_path / "e.npy", matrix)
    stored = _open(tmp_path / "e.npy")
    assert len(stored) == 11 and stored.dims == 5
    np.testing.assert_array_equal(np.concatenate([stored.rows(i, i + 4) for i in range(0, 11, 4)]), matrix)
    np.save(tmp_path / "f.npy", np.asfortranarray(matrix))
    np.testing.assert_array_equal(_open(tmp_path / "f.npy").rows(0, 11), matrix)
    # C order in memory whatever the file's, so the scores are bit for bit those of the C-ordered file's rows
    query = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    assert np.array_equal(_open(tmp_path / "f.npy").rows(2, 9) @ query, stored.rows(2, 9) @ query)
    assert _open(tmp_path / "f.npy").rows(2, 9).flags.c_contiguous
    np.save(tmp_path / "empty.npy", np.zeros((0, 5), dtype=np.float32))
    assert len(_open(tmp_path / "empty.npy")) == 0


def _bad_files(tmp_path):
    good = np.ones((4, 3), dtype=np.float32)
    np.save(tmp_path / "good.npy", good)
    raw = (tmp_path / "good.npy").read_bytes()
    (tmp_path / "text.npy").write_text("these are not vectors\n")
    (tmp_path / "random.npy").write_bytes(bytes(range(256)) * 3)
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "archive.npz", vectors=good)
    (tmp_path / "truncated.npy").write_bytes(raw[:-5])
    (tmp_path / "longer.npy").write_bytes(raw + b"\0" * 4)
    (tmp_path / "header.npy").write_bytes(raw[:20])
    np.save(tmp_path / "float64.npy", good.astype(np.float64))
    np.save(tmp_path / "vector.npy", good[0])
    return {
        "text.npy": "is not a NumPy .npy file",
        "random.npy": "is not a NumPy .npy file",
        "objects.npy": "holds Python objects (pickled), which are never loaded",
        "archive.npz": "is a zip archive (an .npz?)",
        "truncated.npy": "is cut short: 171 bytes where its header promises 176",
        "longer.npy": "has bytes after its matrix",
        "header.npy": "a damaged .npy header",
        "float64.npy": "holds a float64 array of shape (4, 3), not a float32 matrix",
        "vector.npy": "holds a float32 array of shape (3,), not a float32 matrix",
        "missing.npy": "no such file",
        ".": "is a directory, not a regular file",
    }


def test_each_bad_file_is_one_line_naming_it(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a pickled payload was loaded")

    monkeypatch.setattr(pickle, "loads", never)
    monkeypatch.setattr(pickle, "load", never)
    for name, message in _bad_files(tmp_path).items():
        path = tmp_path / name
        with pytest.raises(InputError) as e:
            _open(path)
        assert str(e.value).startswith(f"--corpus_embeddings={path}") and message in str(e.value), (name, e.value)
        assert "\n" not in str(e.value)


def test_a_nan_row_blames_the_file_and_the_row(tmp_path):
    matrix = np.ones((10, 3), dtype=np.float32)
    matrix[7, 1] = np.nan
    np.save(tmp_path / "nan.npy", matrix)
    stored = _open(tmp_path / "nan.npy")
    np.testing.assert_array_equal(stored.rows(0, 5), matrix[:5])
    with pytest.raises(InputError, match=r"nan.npy: row 7 \(counting from 0\) holds NaN or infinity"):
        stored.rows(5, 10)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "vectors.npy"
    os.mkfifo(fifo)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(pytest.raises(InputError, _open, fifo)), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "opening the FIFO blocked"
    assert "is a FIFO, not a regular file" in str(result[0].value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_files_read_or_refuse(tmp_path, data):
    np.save(tmp_path / "g.npy", np.arange(12, dtype=np.float32).reshape(4, 3))
    raw = bytearray((tmp_path / "g.npy").read_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if kind == "flip":
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del raw[i:]
        else:
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=4))
        if not raw:
            break
    (tmp_path / "d.npy").write_bytes(bytes(raw))
    try:
        stored = _open(tmp_path / "d.npy")
        stored.rows(0, len(stored))
    except InputError as e:
        assert "\n" not in str(e) and "d.npy" in str(e)


def test_the_shards_of_one_run_read_as_one_matrix(tmp_path):
    from bert.formats.embeddings import open_embeddings
    from bert.utils import shard_file

    matrix = np.random.default_rng(1).normal(size=(10, 4)).astype(np.float32)
    path = str(tmp_path / "emb.npy")
    for i, block in enumerate((matrix[:3], matrix[3:3], matrix[3:])):
        np.save(shard_file(path, i, 3), block)
    stored = open_embeddings(path, "--corpus_embeddings")
    assert len(stored) == 10 and stored.dims == 4
    np.testing.assert_array_equal(np.concatenate([stored.rows(i, i + 4) for i in range(0, 10, 4)]), matrix)
    np.save(path, matrix[:2])  # the unsharded file, when there, is what is read
    assert len(open_embeddings(path, "--corpus_embeddings")) == 2
    os.unlink(path)
    bad = matrix.copy()
    bad[5, 0] = np.inf
    np.save(shard_file(path, 2, 3), bad[3:])
    with pytest.raises(InputError, match=r"\(shard .*emb-00002-of-00003.npy\): row 2 \(counting from 0\) holds NaN"):
        open_embeddings(path, "--corpus_embeddings").rows(0, 10)
    os.unlink(shard_file(path, 1, 3))
    with pytest.raises(InputError, match=r"shard .*emb-00001-of-00003.npy of 3 is missing"):
        open_embeddings(path, "--corpus_embeddings")
    np.save(shard_file(path, 0, 2), matrix)
    with pytest.raises(InputError, match=r"shards of 2 different runs"):
        open_embeddings(path, "--corpus_embeddings")
    with pytest.raises(InputError, match=r"--corpus_embeddings: no such file, nor shards .*other-\*-of-\*.npy"):
        open_embeddings(str(tmp_path / "other.npy"), "--corpus_embeddings")


def test_vectors_of_no_component_are_refused_in_every_form(tmp_path):
    """A [rows, 0] matrix, as one .npy, Parquet or shards, is no embeddings: `bert index` built an index of it
    that no query can search."""
    from bert.formats.embeddings import open_embeddings

    np.save(tmp_path / "e.npy", np.zeros((4, 0), dtype=np.float32))
    for i in range(2):
        np.save(tmp_path / f"s-0000{i}-of-00002.npy", np.zeros((2, 0), dtype=np.float32))
    paths = [tmp_path / "e.npy", tmp_path / "s.npy"]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"embedding": pa.array([[]] * 3, type=pa.list_(pa.float32(), 0))}), tmp_path / "p.parquet")
    paths.append(tmp_path / "p.parquet")
    for path in paths:
        with pytest.raises(InputError, match=rf"^{path.name} holds vectors of 0 components"):
            open_embeddings(str(path), path.name)
