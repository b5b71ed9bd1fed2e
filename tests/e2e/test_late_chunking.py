"""`bert embed --late_chunking`: each chunk's vector is the mean of transformers' last layer over the chunk's
tokens, the document encoded once ([CLS] pooled with the first chunk, [SEP] with the last, a document past
max_seq_length cut); a document of one chunk gets its plain embedding; rows carry DOCID#k ids (the Parquet id
column's values too); the flags that do not go with it are one line each."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bert.cli import main
from bert.modeling import BertModel
from conftest import cli_error, save_model_dir, uncased_vocab, vocab_config

transformers = pytest.importorskip("transformers", reason="transformers is the oracle (test extra)")

TEXTS = [
    "the cat sat on the mat and looked at the dog across the room, which did not move at all for hours",
    "short text here",
    " ".join(f"word{i} and the river bank" for i in range(30)),  # past the 64 positions of the tiny model
]
CHUNK = 7


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("late")
    vocab = uncased_vocab(d)
    torch.manual_seed(11)
    return save_model_dir(BertModel(vocab_config(vocab)), d / "bi", vocab)


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def expected_chunks(model, texts: list[str]) -> dict[int, list[np.ndarray]]:
    """Each text's chunks' means, computed from transformers' own tokenizer and model."""
    tokenizer = transformers.BertTokenizer(str(model / "vocab.txt"), do_lower_case=True)
    hf = transformers.BertModel.from_pretrained(str(model), add_pooling_layer=False).eval()
    out = {}
    for i, text in enumerate(texts):
        ids = tokenizer(text, truncation=True, max_length=64, return_tensors="pt")
        with torch.no_grad():
            hidden = hf(**ids).last_hidden_state[0].numpy()  # [T, H]
        length = len(hidden)
        cuts = [0, *range(1 + CHUNK, length - 1, CHUNK), length]
        out[i] = [hidden[a:b].mean(axis=0) for a, b in zip(cuts, cuts[1:])]
    return out


def test_chunks_are_means_of_the_models_token_outputs(model, tmp_path):
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in TEXTS), encoding="utf-8")
    out = tmp_path / "chunks.jsonl"
    flags = [f"--model={model}", f"--input_file={tmp_path / 'in.txt'}"]
    assert main(["embed", *flags, f"--output_file={out}", "--late_chunking", f"--chunk_size={CHUNK}"]) == 0
    rows = read_jsonl(out)
    expected = expected_chunks(model, TEXTS)
    assert [r["id"] for r in rows] == [f"{i}#{k}" for i in expected for k in range(len(expected[i]))]
    assert len(expected[1]) == 1 and len(expected[2]) == 9  # 62 pieces of text kept: 9 chunks of 7 at most
    vectors = np.array([r["embedding"] for r in rows], dtype=np.float32)
    np.testing.assert_allclose(vectors, np.concatenate([np.stack(v) for v in expected.values()]), atol=2e-5)
    # A document of one chunk: the vector bert embed gives it without late chunking.
    assert main(["embed", *flags, f"--output_file={tmp_path / 'plain.jsonl'}"]) == 0
    plain = read_jsonl(tmp_path / "plain.jsonl")[1]["embedding"]
    np.testing.assert_allclose(rows[len(expected[0])]["embedding"], plain, atol=1e-6)


def test_parquet_ids_become_docid_k(model, tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow (the parquet extra)")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"doc": [10, 20, 30], "text": TEXTS}), tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    argv = [f"--model={model}", f"--input_file={tmp_path / 'in.parquet'}", "--id_column=doc", f"--output_file={out}"]
    assert main(["embed", *argv, "--late_chunking", f"--chunk_size={CHUNK}", "--normalize"]) == 0
    table = pq.read_table(out)
    ids = table.column("doc").to_pylist()
    assert ids[0] == "10#0" and ids[-1] == "30#8" and sum(i.startswith("20#") for i in ids) == 1
    vectors = np.array(table.column("embedding").to_pylist())
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-6)


def test_flags_that_do_not_go_with_late_chunking(model, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("a text\n", encoding="utf-8")
    flags = [f"--model={model}", f"--input_file={tmp_path / 'in.txt'}"]
    jsonl = f"--output_file={tmp_path / 'o.jsonl'}"
    assert "--chunk_size sets the chunks of --late_chunking" in cli_error(capsys, "embed", *flags, "--chunk_size=5")
    err = cli_error(capsys, "embed", *flags, "--late_chunking", f"--output_file={tmp_path / 'o.npy'}")
    assert "which a .npy matrix cannot hold" in err
    for flag in ("--pooling=cls", "--precision=int8", "--long_document=windows"):
        assert f"--late_chunking and {flag} do not go together" in cli_error(
            capsys, "embed", *flags, jsonl, "--late_chunking", flag
        )
