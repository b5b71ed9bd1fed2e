"""`bert embed` on Parquet files, and resumed shards: Parquet in and out keeps the ids and gives the vectors
of the same texts as lines (.npy); shards of a Parquet file are contiguous row ranges whose union is the
unsharded output; a shard re-run skips a complete output made the same way (the model never loaded),
redoes a partial one and refuses one made with other flags."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import bert.inference
import bert.input_lines
from bert.commands.embed import EmbedArgs, run_embed
from bert.errors import InputError
from bert.utils import shard_file
from conftest import cli_error, save_tiny_model, shared_path

pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the parquet extra)")
pq = pytest.importorskip("pyarrow.parquet")

TEXTS = [f"sentence number {i} about {'cats' if i % 2 else 'dogs'} and more" for i in range(11)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(model dir, texts.txt, corpus.parquet with ids and row groups of 4, the .npy vectors of texts.txt)."""
    d = tmp_path_factory.mktemp("parquet")
    _, _, model = save_tiny_model(d, shared_path("data", "vocab", "uncased.txt"), True)
    lines = d / "texts.txt"
    lines.write_text("".join(t + "\n" for t in TEXTS))
    table = pa.table({"doc": [f"doc-{i}" for i in range(len(TEXTS))], "body": TEXTS, "n": list(range(len(TEXTS)))})
    parquet = d / "corpus.parquet"
    pq.write_table(table, parquet, row_group_size=4)
    run_embed(EmbedArgs(model=str(model), input_file=str(lines), output_file=str(d / "lines.npy")))
    return model, lines, parquet, np.load(d / "lines.npy")


def read_parquet(path) -> tuple[list, np.ndarray]:
    table = pq.read_table(path)
    column = table.column("embedding").combine_chunks()
    vectors = column.flatten().to_numpy().reshape(len(table), column.type.list_size)
    return (table.column("doc").to_pylist() if "doc" in table.column_names else None), vectors


def embed_parquet(corpus, out, **flags) -> dict:
    model, _, parquet, _ = corpus
    args = EmbedArgs(model=str(model), input_file=str(parquet), output_file=str(out), text_column="body", **flags)
    return run_embed(args)


def test_parquet_in_and_out_keeps_ids_and_equals_npy(corpus, tmp_path, monkeypatch):
    model, lines, _, expected = corpus
    monkeypatch.setattr(bert.input_lines, "CHUNK_LINES", 3)  # chunks that cross the row groups of 4
    embed_parquet(corpus, tmp_path / "v.parquet", id_column="doc")
    ids, vectors = read_parquet(tmp_path / "v.parquet")
    assert pq.read_schema(tmp_path / "v.parquet").names == ["doc", "embedding"]
    assert ids == [f"doc-{i}" for i in range(len(TEXTS))]
    np.testing.assert_allclose(vectors, expected, rtol=0, atol=1e-6)
    embed_parquet(corpus, tmp_path / "v.npy")
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), expected, rtol=0, atol=1e-6)
    # Lines in, Parquet out: the vectors alone.
    run_embed(EmbedArgs(model=str(model), input_file=str(lines), output_file=str(tmp_path / "l.parquet")))
    assert read_parquet(tmp_path / "l.parquet")[0] is None
    np.testing.assert_allclose(read_parquet(tmp_path / "l.parquet")[1], expected, rtol=0, atol=1e-6)


def test_parquet_ids_in_json_lines_and_quantized(corpus, tmp_path, monkeypatch):
    import json

    from bert.retrieval import quantize_embeddings

    monkeypatch.setattr(bert.input_lines, "CHUNK_LINES", 3)
    embed_parquet(corpus, tmp_path / "v.jsonl", id_column="doc")
    rows = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"doc-{i}" for i in range(len(TEXTS))]
    # int8 quantizes after the last row: the ids are read again from the input, in step with the vectors.
    embed_parquet(corpus, tmp_path / "q.parquet", id_column="doc", precision="int8")
    ids, vectors = read_parquet(tmp_path / "q.parquet")
    assert ids == [f"doc-{i}" for i in range(len(TEXTS))]
    np.testing.assert_array_equal(vectors, quantize_embeddings(corpus[3], "int8"))


def test_parquet_shards_are_row_ranges_whose_union_is_the_whole(corpus, tmp_path):
    out = tmp_path / "s.parquet"
    counts = [embed_parquet(corpus, out, id_column="doc", num_shards=3, shard_index=i)["lines"] for i in range(3)]
    assert counts == [3, 4, 4]
    parts = [read_parquet(shard_file(out, i, 3)) for i in range(3)]
    assert sum((p[0] for p in parts), []) == [f"doc-{i}" for i in range(len(TEXTS))]
    np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), corpus[3], rtol=0, atol=1e-6)


def test_parquet_errors_exit_2_in_one_line(corpus, tmp_path, capsys, monkeypatch):
    model, lines, parquet, _ = corpus
    base = [f"--model={model}", f"--input_file={parquet}"]
    err = cli_error(capsys, "embed", *base, "--text_column=text", f"--output_file={tmp_path / 'a.parquet'}")
    assert str(parquet) in err and "no column 'text'" in err and "doc, body, n" in err
    holes = tmp_path / "holes.parquet"
    pq.write_table(pa.table({"text": ["a", "b", None, "d"]}), holes)
    err = cli_error(capsys, "embed", f"--model={model}", f"--input_file={holes}", f"--output_file={tmp_path / 'b.npy'}")
    assert "row 2 (0-based)" in err and "null" in err
    err = cli_error(
        capsys, "embed", *base, "--text_column=body", "--id_column=doc", f"--output_file={tmp_path / 'c.npy'}"
    )
    assert "--id_column" in err and ".parquet" in err
    err = cli_error(capsys, "embed", f"--model={model}", f"--input_file={lines}", "--text_column=body")
    assert "--text_column" in err and "Parquet" in err
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # not installed
    err = cli_error(capsys, "embed", *base, "--text_column=body", f"--output_file={tmp_path / 'd.npy'}")
    assert "pip install 'bert[parquet]'" in err


# ------------------------------------------------------------------------------------------ resumed shards
def test_a_rerun_skips_complete_shards_and_redoes_a_partial_one(corpus, tmp_path, monkeypatch):
    model, lines, _, expected = corpus
    out = tmp_path / "e.npy"

    def shard(i: int, **flags) -> dict:
        return run_embed(EmbedArgs(model=str(model), input_file=str(lines), output_file=str(out), num_shards=3,
                                   shard_index=i, **flags))  # fmt: skip

    for i in range(3):
        assert not shard(i).get("skipped")
    assert (tmp_path / "e-00001-of-00003.npy.manifest.json").is_file()
    # A machine lost while writing shard 1: its output cut short (what survives a copy off a dead node).
    partial = tmp_path / "e-00001-of-00003.npy"
    partial.write_bytes(partial.read_bytes()[:-10])
    loaded = []
    real = bert.inference.Predictor.from_pretrained
    monkeypatch.setattr(bert.inference.Predictor, "from_pretrained", lambda *a, **k: loaded.append(1) or real(*a, **k))
    assert [bool(shard(i).get("skipped")) for i in range(3)] == [True, False, True]
    assert loaded == [1]  # only the partial shard loaded the model
    joined = np.concatenate([np.load(shard_file(out, i, 3)) for i in range(3)])
    np.testing.assert_allclose(joined, expected, rtol=0, atol=1e-6)
    # Shard 2 without its manifest (killed between its output and its record): made again.
    (tmp_path / "e-00002-of-00003.npy.manifest.json").unlink()
    assert not shard(2).get("skipped") and loaded == [1, 1]


def test_a_shard_made_with_other_flags_is_refused(corpus, tmp_path, capsys):
    model, lines, _, _ = corpus
    flags = [f"--model={model}", f"--input_file={lines}", f"--output_file={tmp_path / 'e.npy'}", "--num_shards=2"]
    from bert.cli import main

    assert main(["embed", *flags, "--shard_index=0"]) == 0
    err = cli_error(capsys, "embed", *flags, "--shard_index=0", "--pooling=cls")
    assert "made with no --pooling, this run has --pooling=cls" in err and "e-00000-of-00002.npy" in err
    err = cli_error(capsys, "embed", *flags, "--shard_index=0", "--dimensions=8")
    assert "--dimensions" in err
    (lines.parent / "other.txt").write_text("".join(t + "\n" for t in TEXTS[:5]))
    other = [f"--model={model}", f"--input_file={lines.parent / 'other.txt'}", *flags[2:]]
    err = cli_error(capsys, "embed", *other, "--shard_index=0")
    assert "--input_file" in err
    (tmp_path / "m2").mkdir()
    _, _, init = save_tiny_model(tmp_path / "m2", shared_path("data", "vocab", "uncased.txt"), True, hidden_size=16)
    with pytest.raises(InputError, match="made with --model=weights"):
        run_embed(EmbedArgs(model=str(init), input_file=str(lines), output_file=str(tmp_path / "e.npy"), num_shards=2))


def test_a_shard_made_before_a_flag_existed_is_kept(corpus, tmp_path, capsys):
    """A manifest without a flag (written by a bert older than the flag) holds that flag's default."""
    model, lines, _, _ = corpus
    flags = [f"--model={model}", f"--input_file={lines}", f"--output_file={tmp_path / 'e.npy'}", "--num_shards=2"]
    from bert.cli import main

    assert main(["embed", *flags, "--shard_index=0"]) == 0
    manifest = tmp_path / "e-00000-of-00002.npy.manifest.json"
    record = json.loads(manifest.read_text())
    for flag in ("--chunk_by", "--chunk_overlap", "--dimensions"):
        del record["flags"][flag]
    manifest.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["embed", *flags, "--shard_index=0"]) == 0
    assert "complete in" in capsys.readouterr().err  # skipped, not refused
    err = cli_error(capsys, "embed", *flags, "--shard_index=0", "--dimensions=8")
    assert "made with no --dimensions, this run has --dimensions=8" in err
    # bert index reads a set of old and new shards as made alike
    pytest.importorskip("faiss", reason="indexes need faiss-cpu (the index extra)")
    assert main(["embed", *flags, "--shard_index=1"]) == 0
    out = tmp_path / "index"
    assert main(["index", f"--corpus_embeddings={tmp_path / 'e.npy'}", "--index_type=flat", f"--output_dir={out}"]) == 0
    assert json.loads((out / "manifest.json").read_text())["flags"]["--chunk_by"] == "tokens"


def test_a_shard_reads_only_the_row_groups_of_its_rows(corpus, tmp_path, monkeypatch):
    read = []
    real = pq.ParquetFile.iter_batches

    def spy(self, *a, row_groups=None, **k):
        read.append(list(row_groups))
        return real(self, *a, row_groups=row_groups, **k)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    embed_parquet(corpus, tmp_path / "s.npy", num_shards=3, shard_index=1)  # rows 3..6 of groups of 4
    assert read == [[0, 1]]
    np.testing.assert_allclose(np.load(shard_file(tmp_path / "s.npy", 1, 3)), corpus[3][3:7], rtol=0, atol=1e-6)
