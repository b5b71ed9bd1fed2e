"""`bert index` and `bert search --index` end to end on a tiny model and real SQuAD retrieval rows: a flat index
finds what the exact search finds, id for id, and so does ivf_flat visiting every list; an index built from
`bert embed`'s shards (.npy, or Parquet with their ids) is the index of the whole file; the manifest records the
model, and a search with another model is one line naming both; the flags that do not go together are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.commands.embed import EmbedArgs, run_embed
from bert.commands.index import IndexArgs, run_index
from bert.commands.search import SearchArgs, run_search
from bert.modeling import BertModel
from bert.vector_index import IDS_FILE, INDEX_FILE, MANIFEST_FILE, METRIC
from conftest import cli_error, save_model_dir, shared_path, uncased_vocab, vocab_config

faiss = pytest.importorskip("faiss", reason="indexes need faiss-cpu (the index extra)")

SQUAD_DEV = shared_path("data", "retrieval", "squad-dev")


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """Two tiny random embedding models; 60 paragraphs of squad-dev's corpus and 12 questions; the corpus
    embedded by the first model as one .npy and as 3 shards."""
    d = tmp_path_factory.mktemp("index")
    vocab = uncased_vocab(d)
    torch.manual_seed(5)
    encoder = save_model_dir(BertModel(vocab_config(vocab)), d / "bi", vocab)
    other = save_model_dir(BertModel(vocab_config(vocab)), d / "other", vocab)
    for name, n in (("corpus.jsonl", 60), ("queries.jsonl", 12)):
        lines = (SQUAD_DEV / name).read_text(encoding="utf-8").splitlines(keepends=True)[:n]
        (d / name).write_text("".join(lines), encoding="utf-8")
    corpus = d / "corpus.jsonl"
    run_embed(EmbedArgs(model=str(encoder), input_file=str(corpus), output_file=str(d / "whole.npy")))
    for i in range(3):
        run_embed(EmbedArgs(model=str(encoder), input_file=str(corpus), output_file=str(d / "emb.npy"), num_shards=3,
                            shard_index=i))  # fmt: skip
    return {"dir": d, "model": encoder, "other": other, "corpus": corpus, "queries": d / "queries.jsonl"}


def search(setup, out: Path, **flags) -> list:
    common = dict(model=str(setup["model"]), queries=str(setup["queries"]), top_k=10)
    run_search(SearchArgs(**common, **flags, output_file=str(out)))
    return read_jsonl(out)


def exact(setup, tmp_path) -> list:
    corpus_embeddings = str(setup["dir"] / "whole.npy")
    return search(setup, tmp_path / "exact.jsonl", corpus=str(setup["corpus"]), corpus_embeddings=corpus_embeddings)


def assert_same_hits(found: list, expected: list) -> None:
    assert [h["query_id"] for h in found] == [h["query_id"] for h in expected]
    for hit, reference in zip(found, expected):
        assert [(r["corpus_id"], r["index"]) for r in hit["results"]] == [
            (r["corpus_id"], r["index"]) for r in reference["results"]
        ]
        np.testing.assert_allclose(
            [r["score"] for r in hit["results"]], [r["score"] for r in reference["results"]], atol=1e-5
        )


def test_flat_and_ivf_at_every_list_equal_the_exact_search(setup, tmp_path):
    expected = exact(setup, tmp_path)
    whole = str(setup["dir"] / "whole.npy")
    common = dict(corpus_embeddings=whole, corpus=str(setup["corpus"]), model=str(setup["model"]))
    result = run_index(IndexArgs(**common, index_type="flat", output_dir=str(tmp_path / "flat")))
    assert result["rows"] == 60 and result["dims"] == 32 and result["index_type"] == "flat"
    assert_same_hits(search(setup, tmp_path / "flat.jsonl", index=str(tmp_path / "flat")), expected)
    manifest = json.loads((tmp_path / "flat" / MANIFEST_FILE).read_text())
    assert manifest["metric"] == METRIC and manifest["dims"] == 32 and manifest["rows"] == 60
    assert manifest["embeddings"] == [{"name": "whole.npy", "rows": 60, "bytes": Path(whole).stat().st_size}]
    assert manifest["ids_from"] == "--corpus" and manifest["ids_file"] == IDS_FILE
    # The ids are the corpus's "_id"s, row by row.
    assert read_jsonl(tmp_path / "flat" / IDS_FILE) == [c["_id"] for c in read_jsonl(setup["corpus"])]

    run_index(IndexArgs(**common, index_type="ivf_flat", nlist=6, output_dir=str(tmp_path / "ivf")))
    assert json.loads((tmp_path / "ivf" / MANIFEST_FILE).read_text())["params"] == {"nlist": 6}
    assert_same_hits(search(setup, tmp_path / "ivf.jsonl", index=str(tmp_path / "ivf"), nprobe=6), expected)
    # One list of six visited: fewer documents scored, so some query misses some of the exact top 10.
    few = search(setup, tmp_path / "few.jsonl", index=str(tmp_path / "ivf"), nprobe=1)
    assert any([r["index"] for r in f["results"]] != [r["index"] for r in e["results"]] for f, e in zip(few, expected))
    # The rerank output through an index: the documents' texts, as the exact search gives them.
    reranked = search(
        setup, tmp_path / "r.jsonl", index=str(tmp_path / "flat"), corpus=str(setup["corpus"]), output_format="rerank"
    )
    exact_rerank = search(
        setup,
        tmp_path / "er.jsonl",
        corpus=str(setup["corpus"]),
        corpus_embeddings=whole,
        output_format="rerank",
    )
    assert reranked == exact_rerank


def test_index_of_shards_equals_index_of_the_whole_file(setup, tmp_path):
    """The shards' manifests give the model digest (no --model); the index equals the whole file's, byte for
    byte, training sample included."""
    d = setup["dir"]
    common = dict(index_type="ivf_flat", nlist=4, train_sample=40, corpus=str(setup["corpus"]))
    run_index(IndexArgs(corpus_embeddings=str(d / "emb.npy"), output_dir=str(tmp_path / "shards"), **common))
    run_index(
        IndexArgs(
            corpus_embeddings=str(d / "whole.npy"),
            model=str(setup["model"]),
            output_dir=str(tmp_path / "whole"),
            **common,
        )
    )
    a, b = (json.loads((tmp_path / x / MANIFEST_FILE).read_text()) for x in ("shards", "whole"))
    assert a["model_digest"] == b["model_digest"] and a["trained_on"] == b["trained_on"] == 40
    assert a["flags"]["--pooling"] is None and b["flags"] is None  # embed's flags, from the shards' manifests
    assert [e["name"] for e in a["embeddings"]] == [f"emb-0000{i}-of-00003.npy" for i in range(3)]
    assert (tmp_path / "shards" / INDEX_FILE).read_bytes() == (tmp_path / "whole" / INDEX_FILE).read_bytes()
    assert (tmp_path / "shards" / IDS_FILE).read_text() == (tmp_path / "whole" / IDS_FILE).read_text()


def test_parquet_shards_keep_their_ids(setup, tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the parquet extra)")
    pq = pytest.importorskip("pyarrow.parquet")
    corpus = read_jsonl(setup["corpus"])
    table = pa.table({"doc": [c["_id"] for c in corpus], "text": [f"{c['title']} {c['text']}" for c in corpus]})
    pq.write_table(table, tmp_path / "corpus.parquet", row_group_size=25)
    for i in range(2):
        run_embed(
            EmbedArgs(
                model=str(setup["model"]),
                input_file=str(tmp_path / "corpus.parquet"),
                id_column="doc",
                output_file=str(tmp_path / "emb.parquet"),
                num_shards=2,
                shard_index=i,
            )
        )
    run_index(
        IndexArgs(corpus_embeddings=str(tmp_path / "emb.parquet"), index_type="flat", output_dir=str(tmp_path / "x"))
    )
    assert json.loads((tmp_path / "x" / MANIFEST_FILE).read_text())["ids_from"] == "the id column"
    assert_same_hits(search(setup, tmp_path / "p.jsonl", index=str(tmp_path / "x")), exact(setup, tmp_path))


def test_a_search_with_another_model_or_bad_flags_is_one_line(setup, tmp_path, capsys):
    d = setup["dir"]
    index = tmp_path / "hnsw"
    run_index(IndexArgs(corpus_embeddings=str(d / "emb.npy"), output_dir=str(index)))
    digest = json.loads((index / MANIFEST_FILE).read_text())["model_digest"]
    assert read_jsonl(index / IDS_FILE) == [str(row) for row in range(60)]  # no --corpus: the records' numbers
    queries, out = f"--queries={setup['queries']}", f"--output_file={tmp_path / 'o.jsonl'}"
    err = cli_error(capsys, "search", f"--model={setup['other']}", f"--index={index}", queries, out)
    assert f"--index={index} holds vectors of the model with weights {digest[:12]}" in err
    assert f"--model={setup['other']} has weights" in err
    model = f"--model={setup['model']}"
    cases = {
        ("--nprobe=4",): "--nprobe applies to ivf_flat and ivf_pq indexes",
        ("--ef_search=0",): "--ef_search",
        (f"--corpus={setup['corpus']}",): "--corpus is read with --index only for --output_format=rerank",
        ("--output_format=rerank",): "--output_format=rerank writes the documents' texts: give --corpus",
        (f"--corpus_embeddings={d / 'whole.npy'}",): "--index holds the corpus vectors",
    }
    for flags, message in cases.items():
        assert message in cli_error(capsys, "search", model, f"--index={index}", queries, out, *flags)
    err = cli_error(capsys, "search", model, queries, out, f"--corpus={setup['corpus']}", "--nprobe=3")
    assert "--nprobe tunes a search through --index" in err
    assert "give --corpus" in cli_error(capsys, "search", model, queries, out)
    assert not (tmp_path / "o.jsonl").exists()

    whole = f"--corpus_embeddings={d / 'whole.npy'}"
    new = f"--output_dir={tmp_path / 'new'}"
    assert "records no model" in cli_error(capsys, "index", whole, new)
    err = cli_error(capsys, "index", f"--corpus_embeddings={d / 'emb.npy'}", f"--model={setup['other']}", new)
    assert "was embedded by a model with weights" in err and f"--model={setup['other']} has weights" in err
    err = cli_error(capsys, "index", whole, model, new, "--index_type=ivf_pq", "--m=5", "--nbits=2", "--nlist=2")
    assert "--m=5 must divide the vectors' 32 dimensions" in err
    assert "--nlist=80 clusters need" in cli_error(
        capsys, "index", whole, model, new, "--index_type=ivf_flat", "--nlist=80"
    )
    err = cli_error(capsys, "index", whole, model, new, "--nlist=4")  # the default type: hnsw
    assert err.endswith("--nlist applies to --index_type=ivf_flat or ivf_pq; drop it for hnsw")
    short = tmp_path / "short.jsonl"
    short.write_text("".join(setup["corpus"].read_text().splitlines(keepends=True)[:50]))
    assert "has fewer records than the 60 vectors" in cli_error(capsys, "index", whole, model, new, f"--corpus={short}")
    assert not (tmp_path / "new").exists()
