"""A vocab from `bert build-vocab` drives the rest of the pipeline: `bert tokenize`,
`bert create-pretraining-data` and `bert pretrain`, each run through the command line."""

from __future__ import annotations

import json
import math

from bert.cli import main as cli_main
from bert.formats.tfrecord import read_examples
from bert.tokenization import BasicTokenizer, FullTokenizer, load_vocab
from conftest import shared_path, write_tiny_config


def test_own_vocab_through_tokenize_create_pretraining_data_and_pretrain(tmp_path):
    sample = shared_path("data", "sample_text.txt")
    books = shared_path("data", "corpus", "nltk_gutenberg")
    corpus = f"{sample},{books}/carroll-alice.txt.gz,{books}/chesterton-brown.txt.gz"
    vocab_file = tmp_path / "vocab" / "vocab.txt"
    assert cli_main(["build-vocab", f"--input_file={corpus}", f"--output_file={vocab_file}", "--vocab_size=3000"]) == 0
    vocab = load_vocab(vocab_file)
    assert len(vocab) == 3000 and [vocab[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [
        0,
        100,
        101,
        102,
        103,
    ]

    # bert tokenize: every word of the training text is covered; ids are the vocab's line numbers.
    tokens_file = tmp_path / "tokens.jsonl"
    argv = [f"--vocab_file={vocab_file}", f"--input_file={sample}", f"--output_file={tokens_file}"]
    assert cli_main(["tokenize", *argv]) == 0
    rows = [json.loads(line) for line in tokens_file.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(sample.read_text(encoding="utf-8").splitlines())
    pieces = [t for row in rows for t in row["tokens"]]
    assert len(pieces) > 500 and "[UNK]" not in pieces
    assert [i for row in rows for i in row["ids"]] == [vocab[t] for t in pieces]
    words = BasicTokenizer(do_lower_case=True).tokenize(rows[0]["text"])
    assert "".join(t.removeprefix("##") for t in rows[0]["tokens"]) == "".join(words)
    assert rows[0]["tokens"][0] == "this" and "力" in rows[0]["tokens"]
    assert FullTokenizer(vocab_file).tokenize(rows[0]["text"]) == rows[0]["tokens"]

    # bert create-pretraining-data: records over the new ids.
    records = tmp_path / "examples.tfrecord"
    argv = [
        f"--input_file={sample}",
        f"--output_file={records}",
        f"--vocab_file={vocab_file}",
        "--max_seq_length=64",
        "--max_predictions_per_seq=10",
        "--dupe_factor=2",
    ]
    assert cli_main(["create-pretraining-data", *argv]) == 0
    examples = list(read_examples(records))
    assert len(examples) > 10
    for ex in examples:
        ids = ex["input_ids"][ex["input_mask"] == 1]
        assert ids[0] == vocab["[CLS]"] and ids[-1] == vocab["[SEP]"] and ids.max() < 3000
        assert vocab["[UNK]"] not in ids

    # bert pretrain: a tiny model over the 3000 ids trains a few steps from the expected initial loss.
    config = write_tiny_config(tmp_path / "bert_config.json", vocab_size=len(vocab))
    out = tmp_path / "pretrain"
    argv = [
        f"--bert_config_file={config}",
        f"--input_file={records}",
        f"--output_dir={out}",
        f"--vocab_file={vocab_file}",
        "--do_train",
        "--train_batch_size=4",
        "--max_seq_length=64",
        "--max_predictions_per_seq=10",
        "--num_train_steps=4",
        "--num_warmup_steps=0",
        "--learning_rate=1e-3",
        "--log_every=1",
    ]
    assert cli_main(["pretrain", *argv]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    # A random model predicts uniformly over the vocab (masked LM) and the two classes (next sentence).
    assert abs(metrics[0]["masked_lm_loss"] - math.log(3000)) < 0.5
    assert abs(metrics[0]["next_sentence_loss"] - math.log(2)) < 0.2
    assert load_vocab(out / "model" / "vocab.txt") == vocab
