"""`bert rerank` and `bert search` end to end on tiny models and real SQuAD retrieval rows: a cross-encoder's
scores equal sentence-transformers' `CrossEncoder.predict`, an embedding model's the cosine of `bert embed`'s
vectors, documents sorted best first with their text; search over a BEIR corpus in chunks, from `bert
embed`'s .npy or embedding on the fly, equal to sentence-transformers' `semantic_search`; its rerank output
feeds `bert rerank`; bad input stops with one line, exit 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bert.cli import main
from bert.commands.embed import EmbedArgs, run_embed
from bert.commands.rerank import RerankArgs, run_rerank
from bert.commands.search import SearchArgs, run_search
from bert.errors import InputError
from bert.inference import LONGER_ADVICE
from bert.modeling import BertForSequenceClassification, BertModel
from conftest import cli_error, save_model_dir, shared_path, uncased_vocab, vocab_config

st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is the oracle (test extra)")

SQUAD_DEV = shared_path("data", "retrieval", "squad-dev")


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """(a one-output cross-encoder, an embedding model), tiny and random, over the uncased vocabulary."""
    d = tmp_path_factory.mktemp("models")
    vocab = uncased_vocab(d)
    torch.manual_seed(3)
    one_label = dict(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})  # transformers' default is two
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=1)
    reranker = save_model_dir(model, d / "ce", vocab, **one_label)
    encoder = save_model_dir(BertModel(vocab_config(vocab)), d / "bi", vocab)
    return reranker, encoder


@pytest.fixture(scope="module")
def retrieval(tmp_path_factory) -> tuple[Path, Path]:
    """The first 30 paragraphs of retrieval/squad-dev's corpus.jsonl and its first 6 questions."""
    d = tmp_path_factory.mktemp("squad-dev")
    for name, n in (("corpus.jsonl", 30), ("queries.jsonl", 6)):
        lines = (SQUAD_DEV / name).read_text(encoding="utf-8").splitlines(keepends=True)[:n]
        (d / name).write_text("".join(lines), encoding="utf-8")
    return d / "corpus.jsonl", d / "queries.jsonl"


def rerank_input(retrieval, path: Path) -> list[dict]:
    corpus, queries = (read_jsonl(p) for p in retrieval)
    records = [
        {"query": q["text"], "documents": [c["text"][:200] for c in corpus[i * 5 : i * 5 + 5]]}
        for i, q in enumerate(queries[:3])
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


def test_rerank_with_a_cross_encoder_equals_sentence_transformers(models, retrieval, tmp_path):
    reranker, _ = models
    records = rerank_input(retrieval, tmp_path / "in.jsonl")
    out = tmp_path / "ranked.jsonl"
    result = run_rerank(RerankArgs(model=str(reranker), input_file=str(tmp_path / "in.jsonl"), output_file=str(out)))
    assert result == {"lines": 3, "documents": 15, "output_file": str(out)}
    cross_encoder = st.CrossEncoder(str(reranker), device="cpu")
    for record, ranked in zip(records, read_jsonl(out)):
        expected = cross_encoder.predict([(record["query"], d) for d in record["documents"]])
        assert sorted(r["index"] for r in ranked) == list(range(5))
        assert [r["score"] for r in ranked] == sorted((r["score"] for r in ranked), reverse=True)
        assert [r["index"] for r in ranked] == list(np.argsort(-expected, kind="stable"))
        for r in ranked:
            assert r["text"] == record["documents"][r["index"]]
            assert r["score"] == pytest.approx(float(expected[r["index"]]), abs=1e-5)
    # --top_k keeps the best; --raw_scores gives the logits, whose sigmoid are the scores.
    run_rerank(
        RerankArgs(
            model=str(reranker),
            input_file=str(tmp_path / "in.jsonl"),
            output_file=str(tmp_path / "raw.jsonl"),
            top_k=2,
            raw_scores=True,
        )
    )
    for full, raw in zip(read_jsonl(out), read_jsonl(tmp_path / "raw.jsonl")):
        scores = {r["index"]: r["score"] for r in full}
        sigmoids = [1 / (1 + np.exp(-r["score"])) for r in raw]
        assert len(raw) == 2 and [r["score"] for r in raw] == sorted((r["score"] for r in raw), reverse=True)
        assert sigmoids == pytest.approx([scores[r["index"]] for r in raw], abs=1e-6)
        # The two best (as values: logits a few ulps apart can round to one float32 probability, which `full`
        # then lists in input order, and the logits not).
        assert sigmoids == pytest.approx([r["score"] for r in full[:2]], abs=1e-6)


def test_rerank_with_an_embedding_model_scores_cosine(models, retrieval, tmp_path):
    _, encoder = models
    records = rerank_input(retrieval, tmp_path / "in.jsonl")
    out = tmp_path / "ranked.jsonl"
    run_rerank(RerankArgs(model=str(encoder), input_file=str(tmp_path / "in.jsonl"), output_file=str(out)))
    for i, (record, ranked) in enumerate(zip(records, read_jsonl(out))):
        texts = tmp_path / f"texts{i}.txt"
        texts.write_text("".join(t + "\n" for t in [record["query"], *record["documents"]]), encoding="utf-8")
        run_embed(EmbedArgs(model=str(encoder), input_file=str(texts), output_file=str(tmp_path / f"v{i}.npy")))
        v = np.load(tmp_path / f"v{i}.npy")
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        cosine = v[1:] @ v[0]
        assert [r["index"] for r in ranked] == list(np.argsort(-cosine, kind="stable"))
        np.testing.assert_allclose([r["score"] for r in ranked], np.sort(cosine)[::-1], atol=1e-5)


def test_rerank_embeds_each_distinct_text_once_and_ranks_as_the_predictor(models, retrieval, tmp_path, monkeypatch):
    """An embedding model's documents recur across queries (`bert search`'s candidates): each distinct text is
    embedded once over the run, and every line is ranked as `Predictor.rank` ranks it alone."""
    from bert.inference import Predictor

    _, encoder = models
    corpus, queries = (read_jsonl(p) for p in retrieval)
    docs = [c["text"][:200] for c in corpus[:8]]
    records = [{"query": q["text"], "documents": docs[i : i + 5]} for i, q in enumerate(queries[:4])]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    embedded = []
    real = Predictor.run_embed
    monkeypatch.setattr(
        Predictor, "run_embed", lambda self, p, *a, **k: embedded.append(len(p.sequences)) or real(self, p, *a, **k)
    )
    out = tmp_path / "ranked.jsonl"
    run_rerank(RerankArgs(model=str(encoder), input_file=str(tmp_path / "in.jsonl"), output_file=str(out), top_k=3))
    assert sum(embedded) == 4 + 8  # the 4 queries and the 8 distinct documents, not 4 x (1 + 5)
    monkeypatch.setattr(Predictor, "run_embed", real)
    predictor = Predictor.from_pretrained(encoder, device="cpu")
    for record, ranked in zip(records, read_jsonl(out)):
        alone = predictor.rank(record["query"], record["documents"], 3)
        assert [r["index"] for r in ranked] == [r["index"] for r in alone]
        np.testing.assert_allclose([r["score"] for r in ranked], [r["score"] for r in alone], atol=1e-6)


def test_a_vector_cache_runs_each_text_once_and_drops_the_least_recently_used(models, retrieval):
    """`UnitVectorCache` (rerank's and a distillation teacher's): the unit vectors `embed` gives, a text seen
    before not run again, and no more vectors kept than its bytes allow, the least recently used dropped."""
    from bert.inference import Predictor, UnitVectorCache

    _, encoder = models
    predictor = Predictor.from_pretrained(encoder, device="cpu")
    a, b, c, d = (p["text"][:120] for p in read_jsonl(retrieval[0])[:4])
    cache = UnitVectorCache(predictor, max_bytes=3 * 4 * predictor.config.hidden_size)  # room for 3 vectors
    expected = predictor.embed([a, b, a], normalize=True)
    ran: list[int] = []
    real = predictor.run_embed
    predictor.run_embed = lambda p, *x, **k: ran.append(len(p.sequences)) or real(p, *x, **k)  # type: ignore[method-assign]

    (first,) = cache([predictor.prepare_embeddings([a, b, a])])
    assert ran == [2]
    np.testing.assert_allclose(np.stack(first), expected, atol=1e-6)
    cache([predictor.prepare_embeddings([c]), predictor.prepare_embeddings([d, c])])  # b is the least recent
    assert ran == [2, 2] and len(cache.vectors) == 3
    cache([predictor.prepare_embeddings([a, c, d])])
    assert ran == [2, 2]
    (again,) = cache([predictor.prepare_embeddings([b])])
    assert ran == [2, 2, 1]
    np.testing.assert_allclose(again[0], first[1], atol=1e-6)
    with pytest.raises(ValueError, match="windows"):
        cache([predictor.prepare_embeddings([a], doc_stride=16)])


def test_rerank_keeps_ids_and_warns_of_truncation_once(models, retrieval, tmp_path, caplog):
    """The ids of the input come out with the documents they belong to; the inputs cut to max_seq_length are
    counted over the whole run, in one warning, not one per line."""
    reranker, _ = models
    records = rerank_input(retrieval, tmp_path / "in.jsonl")
    with_ids = [
        {"query_id": f"q{i}", "corpus_ids": [f"d{i}.{j}" for j in range(5)], **r} for i, r in enumerate(records)
    ]
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in with_ids), encoding="utf-8")
    out, plain = tmp_path / "ranked.jsonl", tmp_path / "plain.jsonl"
    with caplog.at_level("WARNING"):
        run_rerank(
            RerankArgs(
                model=str(reranker), input_file=str(tmp_path / "ids.jsonl"), output_file=str(out), max_seq_length=16
            )
        )
    cut = [r.getMessage() for r in caplog.records if "may have been cut" in r.getMessage()]
    # rerank has no windows to offer, only a longer --max_seq_length.
    assert cut == [f"15 of 15 inputs fill max_seq_length=16 and may have been cut; {LONGER_ADVICE}"]
    run_rerank(
        RerankArgs(
            model=str(reranker), input_file=str(tmp_path / "in.jsonl"), output_file=str(plain), max_seq_length=16
        )
    )
    for record, line, ranked in zip(with_ids, read_jsonl(out), read_jsonl(plain)):
        assert line["query_id"] == record["query_id"]
        assert [r["corpus_id"] for r in line["results"]] == [record["corpus_ids"][r["index"]] for r in ranked]
        assert [{k: v for k, v in r.items() if k != "corpus_id"} for r in line["results"]] == ranked
    # Ids without a query id: the plain list, each result with its document's id.
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "query_id"}) + "\n" for r in with_ids), encoding="utf-8"
    )
    run_rerank(
        RerankArgs(model=str(reranker), input_file=str(tmp_path / "docs.jsonl"), output_file=str(tmp_path / "d"))
    )
    for i, ranked in enumerate(read_jsonl(tmp_path / "d")):
        assert [r["corpus_id"] for r in ranked] == [f"d{i}.{r['index']}" for r in ranked]


def test_search_in_chunks_equals_semantic_search(models, retrieval, tmp_path):
    _, encoder = models
    corpus, queries = retrieval
    vectors = tmp_path / "corpus.npy"
    run_embed(EmbedArgs(model=str(encoder), input_file=str(corpus), output_file=str(vectors)))
    run_embed(EmbedArgs(model=str(encoder), input_file=str(queries), output_file=str(tmp_path / "q.npy")))
    common = dict(model=str(encoder), corpus=str(corpus), queries=str(queries), top_k=5)
    stored = tmp_path / "stored.jsonl"
    result = run_search(SearchArgs(**common, corpus_embeddings=str(vectors), chunk_size=7, output_file=str(stored)))
    assert result == {"queries": 6, "documents": 30, "output_file": str(stored)}
    fly = tmp_path / "fly.jsonl"
    run_search(SearchArgs(**common, chunk_size=4, output_file=str(fly)))
    corpus_ids = [c["_id"] for c in read_jsonl(corpus)]
    query_ids = [q["_id"] for q in read_jsonl(queries)]
    expected = st.util.semantic_search(
        torch.from_numpy(np.load(tmp_path / "q.npy")), torch.from_numpy(np.load(vectors)), top_k=5
    )
    for hits in (read_jsonl(stored), read_jsonl(fly)):
        assert [h["query_id"] for h in hits] == query_ids
        for hit, reference in zip(hits, expected):
            assert [r["index"] for r in hit["results"]] == [e["corpus_id"] for e in reference]
            assert [r["corpus_id"] for r in hit["results"]] == [corpus_ids[e["corpus_id"]] for e in reference]
            np.testing.assert_allclose([r["score"] for r in hit["results"]], [e["score"] for e in reference], atol=1e-5)

    # Matryoshka: a corpus embedded with --dimensions, searched with the same, equals embedding on the fly.
    small = tmp_path / "small.npy"
    run_embed(EmbedArgs(model=str(encoder), input_file=str(corpus), output_file=str(small), dimensions=16))
    run_search(SearchArgs(**common, corpus_embeddings=str(small), dimensions=16, output_file=str(tmp_path / "a")))
    run_search(SearchArgs(**common, dimensions=16, chunk_size=9, output_file=str(tmp_path / "b")))
    a, b = read_jsonl(tmp_path / "a"), read_jsonl(tmp_path / "b")
    assert [[r["index"] for r in h["results"]] for h in a] == [[r["index"] for r in h["results"]] for h in b]
    with pytest.raises(InputError, match="holds 32-dimensional vectors, the queries 16"):
        run_search(SearchArgs(**common, corpus_embeddings=str(vectors), dimensions=16))

    # The rerank output: each query with its documents' texts (title first), best first, for bert rerank.
    candidates = tmp_path / "candidates.jsonl"
    run_search(
        SearchArgs(**common, corpus_embeddings=str(vectors), output_format="rerank", output_file=str(candidates))
    )
    texts = {c["_id"]: f"{c['title']} {c['text']}" for c in read_jsonl(corpus)}
    queries_text = [q["text"] for q in read_jsonl(queries)]
    for record, hit, query in zip(read_jsonl(candidates), read_jsonl(stored), queries_text):
        assert record["query"] == query
        assert record["corpus_ids"] == [r["corpus_id"] for r in hit["results"]]
        assert record["documents"] == [texts[i] for i in record["corpus_ids"]]
    ranked = tmp_path / "ranked.jsonl"
    assert main(["rerank", f"--model={encoder}", f"--input_file={candidates}", f"--output_file={ranked}"]) == 0
    for record, hit in zip(read_jsonl(ranked), read_jsonl(stored)):
        # The search's ids come through; reranking by the same model's cosine keeps the search's order.
        assert record["query_id"] == hit["query_id"]
        results = record["results"]
        assert [r["index"] for r in results] == list(range(5))
        assert [r["corpus_id"] for r in results] == [r["corpus_id"] for r in hit["results"]]
        np.testing.assert_allclose([r["score"] for r in results], [r["score"] for r in hit["results"]], atol=1e-5)


def test_predict_warns_of_truncation_once_over_its_chunks(models, retrieval, tmp_path, caplog, monkeypatch):
    """bert predict reads its input in chunks; the inputs cut in all of them make one warning."""
    import bert.input_lines
    from bert.commands.predict import PredictArgs, run_predict

    reranker, _ = models
    monkeypatch.setattr(bert.input_lines, "CHUNK_LINES", 2)
    corpus, _ = retrieval
    texts = [c["text"] for c in read_jsonl(corpus)[:5]]
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    with caplog.at_level("WARNING"):
        out = str(tmp_path / "out.jsonl")
        run_predict(
            PredictArgs(model=str(reranker), input_file=str(tmp_path / "in.txt"), output_file=out, max_seq_length=16)
        )
    cut = [r.getMessage() for r in caplog.records if "may have been cut" in r.getMessage()]
    assert cut == ["5 of 5 inputs fill max_seq_length=16 and may have been cut; windows read long texts whole"]


def test_search_shows_bars_for_queries_and_corpus(models, retrieval, tmp_path, progress_bars):
    _, encoder = models
    corpus, queries = retrieval
    run_search(
        SearchArgs(
            model=str(encoder), corpus=str(corpus), queries=str(queries), chunk_size=4, output_file=str(tmp_path / "o")
        )
    )
    bars = progress_bars()
    assert bars["search: queries"] == (6, 6) and bars["search: corpus"] == (30, None)


def test_bad_input_exit_2_one_line(models, retrieval, tmp_path, capsys):
    reranker, encoder = models
    corpus, queries = retrieval
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "documents": ["a"]}\n{"query": "q"}\n')
    out = tmp_path / "out.jsonl"
    err = cli_error(capsys, "rerank", f"--model={reranker}", f"--input_file={bad}", f"--output_file={out}")
    assert 'bad.jsonl line 2: field "documents" must be a non-empty list of strings' in err
    bad.write_text('{"query": "q", "documents": ["a", " "]}\n')
    err = cli_error(capsys, "rerank", f"--model={reranker}", f"--input_file={bad}")
    assert "bad.jsonl line 1: document 1 is empty" in err
    bad.write_text('{"query": "q", "documents": ["a", "b"], "corpus_ids": ["x"]}\n')
    err = cli_error(capsys, "rerank", f"--model={reranker}", f"--input_file={bad}")
    assert 'bad.jsonl line 1: field "corpus_ids" must be a list of one id per document (2)' in err
    err = cli_error(capsys, "rerank", f"--model={encoder}", f"--input_file={bad}", "--raw_scores")
    assert "--raw_scores applies to cross-encoders" in err
    assert not out.exists()
    short = tmp_path / "short.npy"
    np.save(short, np.zeros((3, 32), dtype=np.float32))
    common = [f"--model={encoder}", f"--corpus={corpus}", f"--queries={queries}", f"--output_file={out}"]
    err = cli_error(capsys, "search", *common, f"--corpus_embeddings={short}")
    assert "has 3 rows for 30 records of --corpus" in err
    err = cli_error(capsys, "search", *common, "--top_k=0")
    assert "--top_k=0 must be at least 1" in err
    assert not out.exists()


def test_bad_embeddings_files_exit_2_one_line(models, retrieval, tmp_path, capsys):
    """Each bad --corpus_embeddings is one line naming the file (bert.formats.embeddings), the FIFO without
    blocking in open()."""
    _, encoder = models
    corpus, queries = retrieval
    out = tmp_path / "out.jsonl"
    common = [f"--model={encoder}", f"--corpus={corpus}", f"--queries={queries}", f"--output_file={out}"]
    good = np.ones((30, 32), dtype=np.float32)
    np.save(tmp_path / "good.npy", good)
    cases = {
        "text.npy": "is not a NumPy .npy file",
        "objects.npy": "holds Python objects (pickled), which are never loaded",
        "archive.npz": "is a zip archive (an .npz?)",
        "truncated.npy": "is cut short",
        "nan.npy": "row 12 (counting from 0) holds NaN or infinity",
        "fifo.npy": "is a FIFO, not a regular file",
    }
    (tmp_path / "text.npy").write_text("not vectors\n")
    np.save(tmp_path / "objects.npy", np.array([None, {}], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "archive.npz", good)
    (tmp_path / "truncated.npy").write_bytes((tmp_path / "good.npy").read_bytes()[:-100])
    good[12, 3] = np.nan
    np.save(tmp_path / "nan.npy", good)
    os.mkfifo(tmp_path / "fifo.npy")
    for name, message in cases.items():
        err = cli_error(capsys, "search", *common, f"--corpus_embeddings={tmp_path / name}", "--chunk_size=7")
        assert f"--corpus_embeddings={tmp_path / name}" in err and message in err, err
    assert not out.exists()


def test_search_reads_the_shards_of_bert_embed(models, retrieval, tmp_path):
    """`bert embed --num_shards=3` then `bert search --corpus_embeddings=emb.npy` (no such file, its shards there)
    finds what the unsharded vectors find."""
    _, encoder = models
    corpus, queries = retrieval
    whole, sharded = tmp_path / "whole.npy", tmp_path / "emb.npy"
    run_embed(EmbedArgs(model=str(encoder), input_file=str(corpus), output_file=str(whole)))
    for i in range(3):
        run_embed(EmbedArgs(model=str(encoder), input_file=str(corpus), output_file=str(sharded), num_shards=3,
                            shard_index=i))  # fmt: skip
    assert not sharded.exists()
    common = dict(model=str(encoder), corpus=str(corpus), queries=str(queries), top_k=5, chunk_size=7)
    run_search(SearchArgs(**common, corpus_embeddings=str(whole), output_file=str(tmp_path / "a.jsonl")))
    run_search(SearchArgs(**common, corpus_embeddings=str(sharded), output_file=str(tmp_path / "b.jsonl")))
    assert read_jsonl(tmp_path / "a.jsonl") == read_jsonl(tmp_path / "b.jsonl")


def test_an_input_that_is_no_regular_file_is_named_by_its_own_flag(models, retrieval, tmp_path, capsys):
    """`bert search`'s --queries and --corpus are read more than once, so a FIFO (or /dev/stdin) cannot be: the
    error names the flag the user gave and what the path is, not `--input_file` and "no such file"."""
    _, encoder = models
    corpus, queries = retrieval
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for flag in ("--queries", "--corpus"):
        given = {"--queries": queries, "--corpus": corpus, flag: fifo}
        err = cli_error(capsys, "search", f"--model={encoder}", *(f"{k}={v}" for k, v in given.items()))
        assert f"{flag}={fifo}: not a regular file" in err
