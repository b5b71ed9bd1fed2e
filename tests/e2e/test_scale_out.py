"""Past one machine: pre-training data made in shards, multi-node and elastic `torchrun`, FSDP, sharded
embedding. Every subprocess has a timeout; models are tiny and runs a few steps long."""

from __future__ import annotations

import collections
import random
from pathlib import Path

import numpy as np
import pytest

from bert.commands.create_pretraining_data import CreatePretrainingDataArgs, run_create_pretraining_data
from bert.commands.pretrain import PretrainArgs, run_pretrain
from bert.errors import InputError
from bert.formats.native import open_native_dataset
from bert.pretraining.inputs import open_pretraining_data
from conftest import assert_same_weights, read_metrics, read_weights, write_tiny_config

NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _corpus(path: Path, n_docs: int = 40) -> str:
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "mat", "dog", "ran", "far", "unable", "walking", "cats"]
    docs = ["\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 15))) + " ." for _ in range(8))
            for _ in range(n_docs)]  # fmt: skip
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


def _create(corpus: str, out: Path, vocab: str, **flags) -> dict:
    args = CreatePretrainingDataArgs(
        input_file=corpus, output_file=str(out), vocab_file=vocab, dupe_factor=2, max_seq_length=24,
        max_predictions_per_seq=4, streaming_buffer_mb=0.002, output_format="native", **flags,
    )  # fmt: skip
    return run_create_pretraining_data(args)


def _records(path: Path) -> collections.Counter:
    _, dataset = open_native_dataset(path)
    return collections.Counter(r.tobytes() for r in dataset.records(np.arange(len(dataset))))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """One unsharded native dataset, and the same corpus in 3 shards (`--num_shards=3`)."""
    tmp = tmp_path_factory.mktemp("shards")
    vocab = tmp / "vocab.txt"
    from conftest import PIECES_VOCAB

    vocab.write_text("\n".join(PIECES_VOCAB) + "\n")
    corpus = _corpus(tmp / "corpus.txt")
    _create(corpus, tmp / "one", str(vocab), streaming=True)
    for i in range(3):
        _create(corpus, tmp / f"shard-{i}", str(vocab), num_shards=3, shard_index=i)
    return tmp, corpus, str(vocab)


def test_three_shards_hold_the_instances_of_one_run(shards):
    tmp, _, _ = shards
    one = _records(tmp / "one")
    parts = [_records(tmp / f"shard-{i}") for i in range(3)]
    assert len(one) > 30 and all(sum(p.values()) > 0 for p in parts)
    assert sum(parts, collections.Counter()) == one  # the same multiset of records
    manifests = [open_native_dataset(tmp / f"shard-{i}")[0] for i in range(3)]
    assert [(m["shard_index"], m["num_shards"]) for m in manifests] == [(0, 3), (1, 3), (2, 3)]
    # Joined by `bert pretrain` (a glob that matches the directories, not the logs beside them), the parts
    # come back in the unsharded run's order.
    joined = open_pretraining_data(str(tmp / "shard-?"), 24, 4, None)
    single = open_pretraining_data(str(tmp / "one"), 24, 4, None)
    assert len(joined) == len(single)
    for key, value in single.get_batch(np.arange(len(single))).items():
        np.testing.assert_array_equal(joined.get_batch(np.arange(len(joined)))[key], value, err_msg=key)


def test_pretrain_on_shards_equals_pretrain_on_one_output(shards):
    tmp, _, vocab = shards
    config = write_tiny_config(tmp / "bert_config.json", 19, max_position_embeddings=24, **NO_DROPOUT)
    listed = ",".join(str(tmp / f"shard-{i}") for i in range(3))
    for name, data in (("run-one", str(tmp / "one")), ("run-shards", listed)):
        run_pretrain(PretrainArgs(
            bert_config_file=str(config), input_file=data, output_dir=str(tmp / name), do_train=True,
            train_batch_size=8, max_seq_length=24, max_predictions_per_seq=4, num_train_steps=3,
            num_warmup_steps=1, learning_rate=1e-3, log_every=1,
        ))  # fmt: skip
    losses = {name: [m["loss"] for m in read_metrics(tmp / name)] for name in ("run-one", "run-shards")}
    assert losses["run-shards"] == losses["run-one"]
    assert_same_weights(read_weights(tmp / "run-one" / "model"), read_weights(tmp / "run-shards" / "model"))


def test_pretrain_refuses_a_missing_shard_or_shards_of_other_flags(shards, tmp_path):
    tmp, corpus, vocab = shards
    with pytest.raises(InputError, match=r"shard\(s\) 1 of 3 are missing"):
        open_pretraining_data(f"{tmp / 'shard-0'},{tmp / 'shard-2'}", 24, 4, None)
    with pytest.raises(InputError, match="are both shard 0 of 3"):
        open_pretraining_data(f"{tmp / 'shard-0'},{tmp / 'shard-0'},{tmp / 'shard-1'},{tmp / 'shard-2'}", 24, 4, None)
    _create(corpus, tmp_path / "other-seed", vocab, num_shards=3, shard_index=1, random_seed=7)
    with pytest.raises(InputError, match=r"were made with different flags \(random_seed: 12345 vs 7\)"):
        open_pretraining_data(f"{tmp / 'shard-0'},{tmp_path / 'other-seed'},{tmp / 'shard-2'}", 24, 4, None)


@pytest.mark.parametrize(("flags", "message"), [
    (dict(num_shards=0), "--num_shards=0 must be at least 1"),
    (dict(num_shards=3, shard_index=3), "--shard_index=3 must be between 0 and --num_shards-1 = 2"),
])  # fmt: skip
def test_bad_shard_flags(tmp_path, flags, message):
    from conftest import PIECES_VOCAB

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(PIECES_VOCAB) + "\n")
    with pytest.raises(InputError, match=message):
        _create(_corpus(tmp_path / "c.txt", 2), tmp_path / "out", str(vocab), **flags)
