"""Malformed training data and flags of `bert train-embeddings` and `bert train-reranker`, each refused in one
line with exit 2 before any training (nothing exported): a NaN score in a headerless TSV or JSON lines, a BEIR
query whose text is a number, a JSON line nested 100,000 deep, and a --max_seq_length no exported model could
be read back with."""

from __future__ import annotations

import json

import pytest

from conftest import cli_error, model_flags


def _beir(root):
    (root / "qrels").mkdir(parents=True)
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    (root / "queries.jsonl").write_text('{"_id": "q1", "text": "what"}\n{"_id": "q2", "text": 42}\n')
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b"}\n')
    return root


CASES = {
    "nan.tsv": ("a b\tc d\t0.5\ne f\tg h\tnan\n", "nan.tsv:2: score 'nan' is not a finite number"),
    "nan.jsonl": ('["a", "b", 0.5]\n["c", "d", NaN]\n', "nan.jsonl:2: score 'NaN' is not a finite number"),
    "big.jsonl": ('["a", "b", 1e999]\n', "big.jsonl:1: score 'Infinity' is not a finite number"),
    "deep.jsonl": ('["a", "b"]\n' + "[" * 100_000 + "\n", "deep.jsonl:2: JSON nested too deeply to read"),
    "beir": (None, 'queries.jsonl:2: "text" must be a string, not a number'),
}


@pytest.mark.parametrize("command", ["train-embeddings", "train-reranker"])
@pytest.mark.parametrize("name", list(CASES))
def test_malformed_training_data_is_one_line(model_files, tmp_path, capsys, command, name):
    text, message = CASES[name]
    path = tmp_path / name
    if text is None:
        _beir(path)
    else:
        path.write_text(text)
    out = tmp_path / "out"
    flags = [*model_flags(model_files, out), f"--train_file={path}", "--do_train", "--train_batch_size=2"]
    if command == "train-reranker":
        flags.append(f"--mine_negatives={model_files[2]}")
    assert message in cli_error(capsys, command, *flags)
    assert not (out / "model").exists()


@pytest.mark.parametrize("command", ["train-embeddings", "train-reranker"])
def test_a_max_seq_length_no_model_could_be_read_with_is_refused(model_files, tmp_path, capsys, command):
    """The rule `bert embed` and `bert predict` read a model's length with, held before training."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps([f"a {i}", f"b {i}", f"c {i}"]) + "\n" for i in range(8)))
    flags = [*model_flags(model_files, tmp_path / "out"), f"--train_file={pairs}", "--do_train"]
    err = cli_error(capsys, command, *flags, "--max_seq_length=2")
    assert "--max_seq_length=2 must be between 3 and max_position_embeddings=128" in err
    assert not (tmp_path / "out" / "model").exists()
