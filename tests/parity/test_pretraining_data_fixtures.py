"""create-pretraining-data in compat mode reproduces the original's records, record for record.

Fixtures: tests/fixtures/pretraining_tfrecord (the original create_pretraining_data.py on sample_text.txt,
seed 12345, dupe_factor 2, with and without whole word masking; see its README).
"""

import json
import random

import numpy as np
import pytest

from bert.cli import main
from bert.formats.native import open_native_dataset
from bert.formats.tfrecord import PRETRAINING_FEATURES, read_examples
from bert.pretraining.instances import create_training_instances, instance_to_features, read_documents
from conftest import FIXTURES, shared_path

CASES = [("nowwm", False), ("wwm", True)]


def _expected(name: str) -> list[dict]:
    path = FIXTURES / "pretraining_tfrecord" / f"sample_text_{name}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def tokenizer():
    from bert.tokenization import FullTokenizer

    return FullTokenizer(str(shared_path("data", "vocab", "uncased.txt")), do_lower_case=True)


def _flags(name: str, wwm: bool, output: str) -> list[str]:
    return [
        "create-pretraining-data",
        f"--input_file={shared_path('data', 'sample_text.txt')}",
        f"--output_file={output}",
        f"--vocab_file={shared_path('data', 'vocab', 'uncased.txt')}",
        "--do_lower_case=True",
        f"--do_whole_word_mask={wwm}",
        "--max_seq_length=128",
        "--max_predictions_per_seq=20",
        "--masked_lm_prob=0.15",
        "--random_seed=12345",
        "--dupe_factor=2",
    ]


@pytest.mark.parametrize("name,wwm", CASES)
def test_in_memory_api_reproduces_the_original(tokenizer, name, wwm):
    expected = _expected(name)
    documents = read_documents([str(shared_path("data", "sample_text.txt"))], tokenizer)
    instances = create_training_instances(
        documents, list(tokenizer.vocab.keys()), 128, 2, 0.1, 0.15, 20, random.Random(12345), wwm
    )
    assert len(instances) == len(expected)
    for i, (instance, record) in enumerate(zip(instances, expected)):
        features = instance_to_features(instance, tokenizer.vocab, 128, 20)
        for key in PRETRAINING_FEATURES:
            assert features[key] == record[key], f"record {i}, feature {key}"
        assert instance.tokens == record["tokens"], f"record {i}"
        assert instance.masked_lm_labels == record["masked_lm_tokens"], f"record {i}"


@pytest.mark.parametrize("name,wwm", CASES)
def test_cli_tfrecord_reads_back_to_the_original_records(tmp_path, name, wwm):
    expected = _expected(name)
    out = tmp_path / f"{name}.tfrecord"
    assert main(_flags(name, wwm, str(out))) == 0
    records = list(read_examples(out))
    assert len(records) == len(expected)
    for i, (got, want) in enumerate(zip(records, expected)):
        assert set(got) == set(PRETRAINING_FEATURES)
        assert got["masked_lm_weights"].dtype == np.float32
        for key in PRETRAINING_FEATURES:
            np.testing.assert_array_equal(got[key], np.asarray(want[key]), err_msg=f"record {i}, {key}")
    # The statistics written beside the output agree with the fixture's own.
    stats = json.loads((tmp_path / f"{name}.tfrecord.stats.json").read_text())
    fixture_stats = json.loads((FIXTURES / "pretraining_tfrecord" / f"sample_text_{name}.stats.json").read_text())
    assert stats["instances"] == fixture_stats["num_records"]
    assert stats["random_next"] == fixture_stats["num_is_random_next"]
    assert stats["predictions"] == fixture_stats["num_predictions_total"]
    assert [stats[f"predictions_{k}"] for k in ("replaced_by_mask", "kept_original", "replaced_by_random")] == [
        fixture_stats[f"predictions_{k}"] for k in ("replaced_by_mask", "kept_original", "replaced_by_random")
    ]


def test_cli_round_robin_over_output_files(tmp_path):
    expected = _expected("nowwm")
    outs = [tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"]
    assert main(_flags("nowwm", False, ",".join(map(str, outs)))) == 0
    a, b = (list(read_examples(o)) for o in outs)
    assert (len(a), len(b)) == (12, 11)  # instance i goes to file i mod 2
    for i, want in enumerate(expected):
        got = (a if i % 2 == 0 else b)[i // 2]
        np.testing.assert_array_equal(got["input_ids"], want["input_ids"])


def test_compat_native_format_holds_the_original_records(tmp_path):
    expected = _expected("wwm")
    out = tmp_path / "native"
    assert main(_flags("wwm", True, str(out))) == 0  # no "tfrecord" in the name: native
    manifest, records = open_native_dataset(out)
    assert manifest["mode"] == "compat" and manifest["total_instances"] == len(records) == len(expected)
    batch = records.get_batch(np.arange(len(records)))
    for key in PRETRAINING_FEATURES:
        np.testing.assert_array_equal(batch[key].reshape(len(expected), -1), [r[key] for r in expected], err_msg=key)
