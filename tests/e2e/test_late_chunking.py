"""`bert embed --late_chunking`: each chunk's vector is the mean of transformers' last layer over the chunk's
tokens, the document encoded once ([CLS] pooled with the first chunk, [SEP] with the last; a document past
max_seq_length read whole in windows, each piece from the window where run_squad.py's rule gives it the most
context); chunks of --chunk_overlap share that many tokens with the one before; a document of one chunk gets its
plain embedding; rows carry DOCID#k ids (the Parquet id column's values too) and the characters of the document
each chunk holds (transformers' fast tokenizer's offsets); the flags that do not go with it are one line each."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable

import numpy as np
import pytest
import torch

from bert.cli import main
from bert.formats.embeddings import ParquetEmbeddings
from bert.modeling import BertModel
from conftest import cli_error, save_model_dir, uncased_vocab, vocab_config

transformers = pytest.importorskip("transformers", reason="transformers is the oracle (test extra)")

TEXTS = [
    "the cat sat on the mat and looked at the dog across the room, which did not move at all for hours",
    "short text here",
    " ".join(f"word{i} and the river bank" for i in range(30)),  # past the 64 positions of the tiny model
]
CHUNK = 7
STRIDE = 20


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("late")
    vocab = uncased_vocab(d)
    torch.manual_seed(11)
    return save_model_dir(BertModel(vocab_config(vocab)), d / "bi", vocab)


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def token_chunks(_text: str, _offsets: list[tuple[int, int]], length: int, overlap: int = 0) -> list[tuple[int, int]]:
    """Each chunk's first and last-but-one text positions in a sequence of `length`: CHUNK tokens every
    CHUNK - overlap."""
    starts = [1]  # a chunk's first text position; the last text position is length - 2
    while starts[-1] + CHUNK < length - 1:
        starts.append(starts[-1] + CHUNK - overlap)
    return [(start, min(start + CHUNK, length - 1)) for start in starts]


def expected_chunks(
    model, texts: list[str], cut: Callable[[str, list[tuple[int, int]], int], list[tuple[int, int]]] = token_chunks
) -> dict[int, list[tuple[np.ndarray, tuple[int, int]]]]:
    """Each text's chunks' (mean, characters), from transformers' own tokenizers and model: a text past the
    model's 64 positions in windows of 62 pieces STRIDE apart, each piece's vector from the window the original's
    `_check_is_max_context` picks for it; the chunks' text positions `cut` gives (from the text, its pieces'
    offsets and the sequence's length); a chunk's characters from its first piece's start to its last one's end
    (the fast tokenizer's offsets)."""
    from bert.tasks.squad import _check_is_max_context, doc_spans_for

    tokenizer = transformers.BertTokenizer(str(model / "vocab.txt"), do_lower_case=True)
    fast = transformers.BertTokenizerFast(str(model / "vocab.txt"), do_lower_case=True)
    hf = transformers.BertModel.from_pretrained(str(model), add_pooling_layer=False).eval()
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    out = {}
    for i, text in enumerate(texts):
        body = tokenizer(text, add_special_tokens=False)["input_ids"]
        encoded = fast(text, add_special_tokens=False, return_offsets_mapping=True)
        assert encoded["input_ids"] == body
        spans = doc_spans_for(len(body), 62, STRIDE)
        with torch.no_grad():
            windows = [
                hf(torch.tensor([[cls, *body[s.start : s.start + s.length], sep]])).last_hidden_state[0].numpy()
                for s in spans
            ]
        pieces = [
            next(
                w[1 + j - s.start] for k, (s, w) in enumerate(zip(spans, windows)) if _check_is_max_context(spans, k, j)
            )
            for j in range(len(body))
        ]
        hidden = np.stack([windows[0][0], *pieces, windows[-1][-1]])  # [T, H]
        cuts = cut(text, encoded["offset_mapping"], len(hidden))
        chunks = []
        for k, (start, stop) in enumerate(cuts):
            a, b = 0 if k == 0 else start, len(hidden) if k == len(cuts) - 1 else stop
            characters = (encoded["offset_mapping"][start - 1][0], encoded["offset_mapping"][stop - 2][1])
            chunks.append((hidden[a:b].mean(axis=0), characters))
        out[i] = chunks
    return out


def test_chunks_are_means_of_the_models_token_outputs(model, tmp_path):
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    out = tmp_path / "chunks.jsonl"
    flags = [f"--model={model}", f"--input_file={tmp_path / 'in.txt'}"]
    late = ["--late_chunking", f"--chunk_size={CHUNK}", f"--doc_stride={STRIDE}"]
    assert main(["embed", *flags, f"--output_file={out}", *late]) == 0
    rows = read_jsonl(out)
    expected = expected_chunks(model, TEXTS)
    assert [r["id"] for r in rows] == [f"{i}#{k}" for i in expected for k in range(len(expected[i]))]
    # The long text is read whole: more chunks than the 9 of the 62 pieces one window holds.
    assert len(expected[1]) == 1 and len(expected[2]) > 9
    vectors = np.array([r["embedding"] for r in rows], dtype=np.float32)
    np.testing.assert_allclose(vectors, np.stack([v for c in expected.values() for v, _ in c]), atol=2e-5)
    assert [(r["start"], r["stop"]) for r in rows] == [span for c in expected.values() for _, span in c]
    # Without overlap the chunks' characters cover each text: between two chunks, at most white space.
    for i, text in enumerate(TEXTS):
        spans = [(r["start"], r["stop"]) for r in rows if r["id"].startswith(f"{i}#")]
        gaps = zip([0, *(b for _, b in spans)], [*(a for a, _ in spans), len(text)])
        assert all(a <= b and not text[a:b].strip() for a, b in gaps)
    # A document of one chunk: the vector bert embed gives it without late chunking.
    assert main(["embed", *flags, f"--output_file={tmp_path / 'plain.jsonl'}"]) == 0
    plain = read_jsonl(tmp_path / "plain.jsonl")[1]["embedding"]
    np.testing.assert_allclose(rows[len(expected[0])]["embedding"], plain, atol=1e-6)


def test_overlapping_chunks_share_their_tokens(model, tmp_path):
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    out = tmp_path / "chunks.jsonl"
    late = ["--late_chunking", f"--chunk_size={CHUNK}", "--chunk_overlap=3", f"--doc_stride={STRIDE}"]
    assert (
        main(["embed", f"--model={model}", f"--input_file={tmp_path / 'in.txt'}", f"--output_file={out}", *late]) == 0
    )
    rows = read_jsonl(out)
    expected = expected_chunks(model, TEXTS, functools.partial(token_chunks, overlap=3))
    assert len(rows) == sum(len(c) for c in expected.values()) > len(expected_chunks(model, TEXTS)) + 5
    np.testing.assert_allclose(
        np.array([r["embedding"] for r in rows]), np.stack([v for c in expected.values() for v, _ in c]), atol=2e-5
    )
    spans = [(r["start"], r["stop"]) for r in rows]
    assert spans == [span for c in expected.values() for _, span in c]
    assert spans[1][0] < spans[0][1]  # the second chunk starts inside the first


def test_sentence_chunks_hold_whole_sentences(model, tmp_path):
    pysbd = pytest.importorskip("pysbd", reason="--chunk_by=pysbd needs pysbd (the corpus extra)")
    texts = [
        "The cat sat. It looked at the dog across the room! The dog did not move. "
        + " ".join(f"word{i} and the river bank" for i in range(3))
        + ". Then it slept.",
        "A single short sentence.",
    ]

    def sentence_chunks(text: str, offsets: list[tuple[int, int]], length: int) -> list[tuple[int, int]]:
        """Whole sentences (pysbd's) packed into CHUNK tokens, a longer one cut by tokens."""
        starts, at = [], 0
        for sentence in pysbd.Segmenter(language="en", clean=False).segment(text):
            at = text.index(sentence.strip(), at)
            starts.append(1 + next(t for t, (a, _) in enumerate(offsets) if a >= at))
        bounds, out, start = [*starts[1:], length - 1], [], 1
        while start < length - 1:
            stop = max((b for b in bounds if start < b <= start + CHUNK), default=start + CHUNK)
            out.append((start, stop))
            start = stop
        return out

    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    out = tmp_path / "chunks.jsonl"
    late = ["--late_chunking", f"--chunk_size={CHUNK}", "--chunk_by=pysbd"]
    assert (
        main(["embed", f"--model={model}", f"--input_file={tmp_path / 'in.txt'}", f"--output_file={out}", *late]) == 0
    )
    rows = read_jsonl(out)
    expected = expected_chunks(model, texts, sentence_chunks)
    assert [(r["start"], r["stop"]) for r in rows] == [span for c in expected.values() for _, span in c]
    np.testing.assert_allclose(
        np.array([r["embedding"] for r in rows]), np.stack([v for c in expected.values() for v, _ in c]), atol=2e-5
    )
    chunk_texts = [texts[0][r["start"] : r["stop"]] for r in rows if r["id"].startswith("0#")]
    # whole sentences where they fit (a sentence of 4 tokens, then one of 9 cut at 7), the last alone
    assert chunk_texts[:2] == ["The cat sat.", "It looked at the dog across the"]
    assert "The dog did not move." in chunk_texts and chunk_texts[-1] == "Then it slept."
    assert len(expected[1]) == 1  # a text of one chunk


def test_parquet_ids_become_docid_k(model, tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the parquet extra)")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"doc": [10, 20, 30], "text": TEXTS}), tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    argv = [f"--model={model}", f"--input_file={tmp_path / 'in.parquet'}", "--id_column=doc", f"--output_file={out}"]
    assert main(["embed", *argv, "--late_chunking", f"--chunk_size={CHUNK}", "--normalize"]) == 0
    table = pq.read_table(out)
    ids = table.column("doc").to_pylist()
    assert ids[0] == "10#0" and ids[-1].startswith("30#") and sum(i.startswith("20#") for i in ids) == 1
    vectors = np.array(table.column("embedding").to_pylist())
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)
    assert table.column_names == ["doc", "start", "stop", "embedding"]
    assert table.column("start").to_pylist()[0] == 0 and table.column("stop").to_pylist()[-1] == len(TEXTS[2])
    # bert index and bert search read the file: the ids are the doc column, the spans not taken for ids
    assert ParquetEmbeddings(out, "--corpus_embeddings").id_column == "doc"


def test_flags_that_do_not_go_with_late_chunking(model, tmp_path, capsys, monkeypatch):
    (tmp_path / "in.txt").write_text("a text\n", encoding="utf-8")
    flags = [f"--model={model}", f"--input_file={tmp_path / 'in.txt'}"]
    jsonl = f"--output_file={tmp_path / 'o.jsonl'}"
    assert "--chunk_size sets the chunks of --late_chunking" in cli_error(capsys, "embed", *flags, "--chunk_size=5")
    err = cli_error(capsys, "embed", *flags, "--chunk_overlap=2")
    assert "--chunk_overlap sets the chunks of --late_chunking" in err
    err = cli_error(capsys, "embed", *flags, jsonl, "--late_chunking", "--chunk_size=8", "--chunk_overlap=8")
    assert "--chunk_overlap=8 must be at least 0 and less than --chunk_size=8" in err
    err = cli_error(capsys, "embed", *flags, jsonl, "--late_chunking", "--chunk_by=pysbd", "--chunk_overlap=2")
    assert "--chunk_overlap counts tokens, and --chunk_by=pysbd cuts chunks at sentences" in err
    assert "--chunk_by sets the chunks of --late_chunking" in cli_error(capsys, "embed", *flags, "--chunk_by=pysbd")
    monkeypatch.setitem(sys.modules, "blingfire", None)  # not installed: its package named, before the model loads
    err = cli_error(capsys, "embed", *flags, jsonl, "--late_chunking", "--chunk_by=blingfire")
    assert "--chunk_by=blingfire needs the blingfire package: pip install" in err
    err = cli_error(capsys, "embed", *flags, "--late_chunking", f"--output_file={tmp_path / 'o.npy'}")
    assert "which a .npy matrix cannot hold" in err
    for flag in ("--pooling=cls", "--precision=int8", "--long_document=windows"):
        assert f"--late_chunking and {flag} do not go together" in cli_error(
            capsys, "embed", *flags, jsonl, "--late_chunking", flag
        )
