"""`bert.engines.EmbedBatches`, the class Ray Data's `map_batches` and Spark's `mapInPandas` call: on a pyarrow
table, a pandas DataFrame and Ray's dict of arrays it returns the rows with the vectors `bert embed` writes
for the same texts, loading the model once; and on a local Ray instance with 2 workers when Ray is installed."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import bert.engines
import bert.inference
from bert.commands.embed import EmbedArgs, run_embed
from bert.engines import EmbedBatches
from bert.errors import InputError
from conftest import save_tiny_model, shared_path

pa = pytest.importorskip("pyarrow", reason="pyarrow batches (the parquet extra)")
pd = pytest.importorskip("pandas")

TEXTS = [f"passage {i} on {'rivers' if i % 3 else 'mountains'} and their names" for i in range(9)]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """(model dir, the .npy vectors `bert embed` writes for TEXTS, normalized)."""
    d = tmp_path_factory.mktemp("engines")
    _, _, model = save_tiny_model(d, shared_path("data", "vocab", "uncased.txt"), True)
    (d / "t.txt").write_text("".join(t + "\n" for t in TEXTS))
    out = d / "v.npy"
    run_embed(EmbedArgs(model=str(model), input_file=str(d / "t.txt"), output_file=str(out), normalize=True))
    return model, np.load(out)


def test_batches_get_the_vectors_of_bert_embed(embedded, monkeypatch):
    model, expected = embedded
    loads = []
    real = bert.inference.Predictor.from_pretrained
    monkeypatch.setattr(bert.inference.Predictor, "from_pretrained", lambda *a, **k: loads.append(1) or real(*a, **k))
    monkeypatch.setattr(bert.engines, "_LOADED", {})
    fn = EmbedBatches(str(model), normalize=True, device="cpu")
    table = fn(pa.table({"id": list(range(9)), "text": TEXTS}))
    assert table.column_names == ["id", "text", "embedding"] and table.column("id").to_pylist() == list(range(9))
    got = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(9, -1)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    frame = fn(pd.DataFrame({"text": TEXTS[4:], "n": range(5)}))
    assert list(frame.columns) == ["text", "n", "embedding"]
    np.testing.assert_allclose(np.stack(frame["embedding"]), expected[4:], rtol=0, atol=1e-6)
    arrays = fn({"text": np.array(TEXTS[:3], dtype=object)})
    np.testing.assert_allclose(arrays["embedding"], expected[:3], rtol=0, atol=1e-6)
    assert loads == [1]  # once per worker, not per batch
    copy = pickle.loads(pickle.dumps(fn))  # what a Spark task gets: the settings, not the weights
    assert copy._predictor is None
    np.testing.assert_allclose(copy({"text": np.array(TEXTS[:1])})["embedding"], expected[:1], rtol=0, atol=1e-6)
    assert loads == [1]  # the process's model, not a second load
    with pytest.raises(InputError, match="row 1 of the batch: column 'text' holds None"):
        fn(pa.table({"text": ["a", None]}))


@pytest.mark.slow  # 15-25 s here: Ray's start (ray.init) and its two actors' model loads
def test_on_a_local_ray_instance_with_two_workers(embedded):
    ray = pytest.importorskip("ray", reason="Ray is not installed")
    model, expected = embedded
    # The two actors hold a CPU each for the whole run; blocks made here (three tables, three blocks) need no
    # task beside them. `.repartition` would: its split tasks wait for a CPU the actors never free.
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    try:
        tables = [pa.table({"id": list(range(i, i + 3)), "text": TEXTS[i : i + 3]}) for i in (0, 3, 6)]
        ds = ray.data.from_arrow(tables)
        ds = ds.map_batches(
            EmbedBatches,
            fn_constructor_kwargs={"model": str(model), "normalize": True, "device": "cpu"},
            concurrency=2,
            batch_size=4,
            batch_format="pyarrow",
        )
        rows = sorted(ds.take_all(), key=lambda r: r["id"])
    finally:
        ray.shutdown()
    assert [r["id"] for r in rows] == list(range(9))
    np.testing.assert_allclose(np.stack([r["embedding"] for r in rows]), expected, rtol=0, atol=1e-6)
