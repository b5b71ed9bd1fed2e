"""The native pre-training format: records <-> the original's seven features, shards written and read back
through memory maps, the manifest and its checks, and the directory that appears only when complete."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert.errors import InputError
from bert.formats.native import (
    FEATURE_NAMES,
    MANIFEST_NAME,
    NativeShardWriter,
    check_manifest,
    features_to_records,
    file_sha256,
    open_native_dataset,
    record_dtype,
    records_to_features,
    write_npy,
)

SEQ, PREDS, VOCAB = 12, 3, 500


def _features(n: int, seed: int = 0, seq: int = SEQ, preds: int = PREDS, vocab: int = VOCAB) -> dict[str, np.ndarray]:
    """n random records in the original's layout: [CLS] A [SEP] B [SEP] then padding, weights 1.0 then 0.0."""
    rng = np.random.default_rng(seed)
    out = {k: [] for k in FEATURE_NAMES}
    for _ in range(n):
        length = int(rng.integers(5, seq + 1))
        b_start = int(rng.integers(2, length - 1))
        k = int(rng.integers(0, preds + 1))
        t = np.arange(seq)
        out["input_ids"].append(np.where(t < length, rng.integers(1, vocab, seq), 0))
        out["input_mask"].append((t < length).astype(np.int64))
        out["segment_ids"].append(((t >= b_start) & (t < length)).astype(np.int64))
        positions = np.sort(rng.choice(np.arange(1, length), k, replace=False))
        out["masked_lm_positions"].append(np.r_[positions, np.zeros(preds - k, np.int64)])
        out["masked_lm_ids"].append(np.r_[rng.integers(1, vocab, k), np.zeros(preds - k, np.int64)])
        out["masked_lm_weights"].append(np.r_[np.ones(k), np.zeros(preds - k)].astype(np.float32))
        out["next_sentence_labels"].append(np.array([rng.integers(0, 2)]))
    return {k: np.stack(v) for k, v in out.items()}


def _write(path, features, shard_size=4, vocab=VOCAB, **manifest):
    dtype = record_dtype(SEQ, PREDS, vocab)
    with NativeShardWriter(path, SEQ, PREDS, vocab, shard_size=shard_size) as w:
        w.write(features_to_records(features, dtype))
        return w.close({"max_seq_length": SEQ, "max_predictions_per_seq": PREDS, **manifest})


def test_records_and_features_round_trip():
    features = _features(40)
    recs = features_to_records(features, record_dtype(SEQ, PREDS, VOCAB))
    assert recs.dtype["input_ids"].base == np.uint16 and recs.dtype.itemsize < 4 * sum(
        v[0].size for v in features.values()
    )  # compact: far less than the 4-byte features
    back = records_to_features(recs)
    assert list(back) == list(FEATURE_NAMES)
    for name in FEATURE_NAMES:
        np.testing.assert_array_equal(back[name], features[name], err_msg=name)
        assert back[name].dtype == (np.float32 if name == "masked_lm_weights" else np.int64), name
    assert back["next_sentence_labels"].shape == (40, 1)
    # A [PAD] id (0) inside the sequence, as a random replacement can give: the mask still says it is real.
    features["input_ids"][0, 1] = 0
    assert records_to_features(features_to_records(features, recs.dtype))["input_mask"][0, 1] == 1


def test_records_refuse_features_they_cannot_hold():
    dtype = record_dtype(SEQ, PREDS, VOCAB)
    features = _features(3)
    features["segment_ids"][1, 1] = 1  # 0 1 0 ... 1 1: not one A part then one B part
    with pytest.raises(ValueError, match="segment_ids does not fit"):
        features_to_records(features, dtype)
    features = _features(3)
    features["masked_lm_weights"][2] = [0.0, 1.0, 0.0]  # weights are 1.0 then 0.0
    with pytest.raises(ValueError, match="masked_lm_weights does not fit"):
        features_to_records(features, dtype)


def test_record_dtype_widens_ids_for_large_vocabularies():
    assert record_dtype(128, 20, 30522)["input_ids"].base == np.uint16
    assert record_dtype(128, 20, 1 << 16)["input_ids"].base == np.uint16
    assert record_dtype(128, 20, (1 << 16) + 1)["masked_lm_ids"].base == np.int32
    features = _features(5, vocab=120_000)
    features["input_ids"][:, 0] = 119_999
    recs = features_to_records(features, record_dtype(SEQ, PREDS, 120_000))
    assert records_to_features(recs)["input_ids"][:, 0].tolist() == [119_999] * 5


def test_shards_written_and_read_back(tmp_path):
    features = _features(10)
    manifest = _write(tmp_path / "ds", features, shard_size=4, vocab_size=VOCAB)
    assert [s["num_instances"] for s in manifest["shards"]] == [4, 4, 2]
    assert [s["file"] for s in manifest["shards"]] == ["shard_000000.npy", "shard_000001.npy", "shard_000002.npy"]
    assert manifest["format"] == "bert-pretraining-native" and manifest["total_instances"] == 10
    on_disk, records = open_native_dataset(tmp_path / "ds")
    assert on_disk == json.loads(json.dumps(manifest))  # close() returns what manifest.json holds
    assert on_disk["record_dtype"] == json.loads(
        json.dumps(np.lib.format.dtype_to_descr(record_dtype(SEQ, PREDS, VOCAB)))
    )
    assert len(records) == 10
    # Records across shard boundaries, in any order, negative indices counting from the end.
    order = np.array([9, 0, 4, 3, -1, 7, 5])
    batch = records.get_batch(order)
    for name in FEATURE_NAMES:
        np.testing.assert_array_equal(batch[name], features[name][order], err_msg=name)
    one = records[-3]
    assert all(np.array_equal(one[k], features[k][7]) for k in FEATURE_NAMES) and one["input_ids"].shape == (SEQ,)
    shard = np.load(tmp_path / "ds" / "shard_000001.npy", mmap_mode="r")  # plain .npy, memory-mappable
    assert isinstance(shard, np.memmap) and shard.dtype == record_dtype(SEQ, PREDS, VOCAB)
    with pytest.raises(IndexError):
        records.get_batch([10])
    with pytest.raises(IndexError):
        records[-11]
    with pytest.raises(TypeError, match="get_batch"):
        records[[1, 2]]


def test_write_npy_refuses_a_wrong_count_and_leaves_no_file(tmp_path):
    dtype = record_dtype(SEQ, PREDS, VOCAB)
    recs = np.zeros(3, dtype)
    with pytest.raises(ValueError, match="wrote 3 records, expected 4"):
        write_npy(tmp_path / "a.npy", dtype, 4, [recs])
    with pytest.raises(ValueError, match="is not the shard dtype"):
        write_npy(tmp_path / "a.npy", dtype, 3, [np.zeros(3, record_dtype(SEQ + 1, PREDS, VOCAB))])
    assert list(tmp_path.iterdir()) == []
    write_npy(tmp_path / "b.npy", dtype, 5, [recs[:2], recs])
    assert len(np.load(tmp_path / "b.npy")) == 5


def test_shards_written_by_another_process_are_registered(tmp_path):
    features = _features(6)
    dtype = record_dtype(SEQ, PREDS, VOCAB)
    recs = features_to_records(features, dtype)
    with NativeShardWriter(tmp_path / "ds", SEQ, PREDS, VOCAB) as w:
        write_npy(w.tmp_dir / w.shard_name(0), dtype, 6, [recs])
        w.add_shard(w.shard_name(0), 6)
        with pytest.raises(FileNotFoundError):
            w.add_shard(w.shard_name(1), 1)
        assert w.num_instances == 6
        w.close({"max_seq_length": SEQ, "max_predictions_per_seq": PREDS}, stats={"instances": 6})
    assert json.loads((tmp_path / "ds" / "stats.json").read_text()) == {"instances": 6}
    np.testing.assert_array_equal(open_native_dataset(tmp_path / "ds")[1].get_batch(np.arange(6))["input_ids"],
                                  features["input_ids"])  # fmt: skip


def test_the_directory_appears_only_when_complete(tmp_path):
    dtype = record_dtype(8, 2, 100)
    recs = np.zeros(5, dtype)
    recs["num_tokens"] = 5
    target = tmp_path / "ds"
    with NativeShardWriter(target, 8, 2, 100, shard_size=2) as w:
        w.write(recs)
        assert not target.exists()  # only the temporary sibling so far
        assert [p.name.startswith(".ds.tmp-") for p in tmp_path.iterdir()] == [True]
        w.close({"max_seq_length": 8, "max_predictions_per_seq": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    # Leaving the block without close() (or with an exception) removes everything written.
    with NativeShardWriter(tmp_path / "other", 8, 2, 100) as w:
        w.write(recs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


def test_native_writer_replaces_a_dataset_but_not_other_directories(tmp_path):
    dtype = record_dtype(8, 2, 100)
    recs = np.zeros(5, dtype)
    recs["num_tokens"] = 5
    target = tmp_path / "ds"
    for count in (5, 3):
        with NativeShardWriter(target, 8, 2, 100, shard_size=2) as w:
            w.write(recs[:count])
            w.close({"max_seq_length": 8, "max_predictions_per_seq": 2})
    manifest, records = open_native_dataset(target)
    assert len(records) == 3 and [s["num_instances"] for s in manifest["shards"]] == [2, 1]
    assert records_to_features(records.records([0]))["input_mask"].tolist() == [[1] * 5 + [0] * 3]
    # an exception inside the block leaves the old dataset and no temporary directory
    with pytest.raises(RuntimeError), NativeShardWriter(target, 8, 2, 100) as w:
        w.write(recs)
        raise RuntimeError("boom")
    assert len(open_native_dataset(target)[1]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="not empty"):
        NativeShardWriter(tmp_path / "mine", 8, 2, 100)
    with pytest.raises(InputError, match=r"no manifest\.json"):
        open_native_dataset(tmp_path / "mine")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="this is a file"):
        NativeShardWriter(tmp_path / "file", 8, 2, 100)


def test_damaged_or_foreign_datasets_are_input_errors(tmp_path):
    _write(tmp_path / "ds", _features(10))
    manifest_file = tmp_path / "ds" / MANIFEST_NAME
    manifest = json.loads(manifest_file.read_text())

    def with_manifest(**changes):
        manifest_file.write_text(json.dumps({**manifest, **changes}))
        return tmp_path / "ds"

    with pytest.raises(InputError, match=r"format 'tfrecord' is not 'bert-pretraining-native'"):
        open_native_dataset(with_manifest(format="tfrecord"))
    with pytest.raises(InputError, match="format_version 99 is newer than this bert reads"):
        open_native_dataset(with_manifest(format_version=99))
    shards = [dict(s) for s in manifest["shards"]]
    shards[1]["num_instances"] = 5
    with pytest.raises(InputError, match=r"shard_000001\.npy: holds 4 records but manifest\.json says 5"):
        open_native_dataset(with_manifest(shards=shards))
    with_manifest()
    (tmp_path / "ds" / "shard_000002.npy").write_bytes(b"not numpy")
    with pytest.raises(InputError, match=r"shard_000002\.npy: cannot read shard"):
        open_native_dataset(tmp_path / "ds")
    manifest_file.write_text("{")
    with pytest.raises(InputError, match="unreadable"):
        open_native_dataset(tmp_path / "ds")


def test_check_manifest_names_the_mismatching_flag(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    manifest = {
        "max_seq_length": 24,
        "max_predictions_per_seq": 4,
        "do_lower_case": True,
        "vocab_sha256": file_sha256(vocab),
        "vocab_size": 6,
    }
    check_manifest(manifest, max_seq_length=24, max_predictions_per_seq=4, vocab_file=vocab, do_lower_case=True)
    check_manifest(manifest)  # None skips every check
    cases = [
        (dict(max_seq_length=128), r"^--max_seq_length=128 does not match the data: ds/manifest\.json says "
         r"max_seq_length=24; pass --max_seq_length=24 or re-create the data with --max_seq_length=128$"),
        (dict(max_predictions_per_seq=20), r"^--max_predictions_per_seq=20 .* max_predictions_per_seq=4; pass "
         r"--max_predictions_per_seq=4"),
        (dict(do_lower_case=False), r"^--do_lower_case=False .* do_lower_case=True; pass --do_lower_case=True$"),
    ]  # fmt: skip
    for flags, message in cases:
        with pytest.raises(InputError, match=message):
            check_manifest(manifest, source="ds/manifest.json", **flags)
    other = tmp_path / "other_vocab.txt"
    other.write_text(vocab.read_text() + "extra\n")
    with pytest.raises(InputError, match=r"^--vocab_file=\S*other_vocab\.txt \(sha256 \w{12}\.\.\.\) is not the vocab"):
        check_manifest(manifest, vocab_file=other)
    # Datasets from before a field was recorded are not refused for it.
    check_manifest({"max_seq_length": 24, "max_predictions_per_seq": 4}, vocab_file=other, do_lower_case=False)
