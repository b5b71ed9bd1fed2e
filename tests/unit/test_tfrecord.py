"""CRC-32C and TFRecord files of tf.train.Example: the original's pre-training records, read and written."""

import json
import os
import random
import struct

import numpy as np
import pytest

from bert.errors import InputError
from bert.formats import crc32c as crc
from bert.formats.tfrecord import (
    PRETRAINING_FEATURES,
    TFRecordWriter,
    decode_example,
    encode_example,
    encode_pretraining_examples,
    read_examples,
    read_records,
    write_examples,
)
from conftest import FIXTURES

DATA = FIXTURES / "pretraining_tfrecord"
FEATURES = {
    "input_ids": 128,
    "input_mask": 128,
    "segment_ids": 128,
    "masked_lm_positions": 20,
    "masked_lm_ids": 20,
    "masked_lm_weights": 20,
    "next_sentence_labels": 1,
}


# ---------------------------------------------------------------------------------------------- crc32c


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", 0x00000000),
        (b"123456789", 0xE3069283),  # the standard check value of CRC-32C
        (bytes(32), 0x8A9136AA),  # RFC 3720 (iSCSI) B.4 test vectors
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
    ],
)
def test_crc32c_known_vectors(data, expected):
    assert crc.crc32c_pure(data) == expected
    assert crc.crc32c(data) == expected
    assert crc.crc32c_many([data] * 9) == [expected] * 9


def test_mask_matches_tensorflow_formula_and_inverts():
    for value in [0, 1, 0xE3069283, 0xFFFFFFFF, 0x12345678]:
        masked = crc.mask(value)
        assert masked == ((((value >> 15) | (value << 17)) & 0xFFFFFFFF) + 0xA282EAD8) % 2**32
        assert crc.unmask(masked) == value
    assert crc.masked_crc32c(b"123456789") == crc.mask(0xE3069283)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 31, 32, 33, 100, 8191, 8192, 8193, 65536 + 5, 300_001, (1 << 20) + 3])
def test_fast_paths_agree_with_pure_python(n):
    rng = random.Random(n)
    data = rng.randbytes(n)
    expected = crc.crc32c_pure(data)
    assert crc.crc32c(data) == expected
    assert crc._crc32c_fallback(data) == expected  # the NumPy path for long inputs, even if a package is present
    cut = n // 3
    assert crc.crc32c(data[cut:], crc.crc32c(data[:cut])) == expected  # extending a crc
    assert crc.crc32c(np.frombuffer(data, dtype=np.uint8)) == expected  # any bytes-like object


def test_crc32c_many_matches_one_by_one():
    rng = random.Random(0)
    messages = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(200)] + [b"", b"x", rng.randbytes(70_000)]
    assert crc.crc32c_many(messages) == [crc.crc32c_pure(m) for m in messages]
    assert crc.masked_crc32c_many(messages[:10]) == [crc.masked_crc32c(m) for m in messages[:10]]


# ------------------------------------------------------------------------------------- the original's files


def _expected(name):
    with open(DATA / f"sample_text_{name}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("name, count", [("nowwm", 23), ("wwm", 29)])
def test_reads_the_original_records_exactly(name, count):
    records = list(read_examples(DATA / f"sample_text_{name}.tfrecord"))
    expected = _expected(name)
    assert len(records) == len(expected) == count
    for record, want in zip(records, expected):
        assert set(record) == set(FEATURES)
        for feature, length in FEATURES.items():
            assert len(record[feature]) == length
            assert record[feature].tolist() == want[feature], feature
        assert record["masked_lm_weights"].dtype == np.float32
        assert record["input_ids"].dtype == np.int64


@pytest.mark.parametrize("name", ["nowwm", "wwm"])
def test_rewriting_the_original_records_gives_the_same_bytes(name, tmp_path):
    path = DATA / f"sample_text_{name}.tfrecord"
    raw = list(read_records(path))
    for record in raw:  # the encoder is canonical: same feature order -> same bytes
        assert encode_example(decode_example(record)) == record
    out = tmp_path / "copy.tfrecord"
    assert write_examples(out, read_examples(path)) == len(raw)
    assert out.read_bytes() == path.read_bytes()


def test_writes_pretraining_records_from_plain_lists(tmp_path):
    expected = _expected("wwm")
    examples = [{k: v for k, v in line.items() if k in FEATURES} for line in expected]
    out = tmp_path / "out.tfrecord"
    assert write_examples(out, examples) == len(examples)
    back = list(read_examples(out))  # verify_crc=True by default
    assert [{k: v.tolist() for k, v in r.items()} for r in back] == examples
    assert [r["masked_lm_weights"].dtype for r in back] == [np.float32] * len(back)


# ------------------------------------------------------------------------------------------- round trips


def test_round_trip_of_values_and_types(tmp_path):
    example = {
        "ints": [0, 1, 127, 128, 16383, 16384, 2**21, 2**40, 2**63 - 1, -1, -(2**63)],
        "np_int32": np.array([[3, -4], [5, 6]], dtype=np.int32),  # flattened
        "bools": np.array([True, False]),
        "floats": [0.5, -1.25, 2.0**100, float("inf")],  # exact in float32
        "np_float64": np.array([0.1, 0.2]),  # stored as float32
        "strings": [b"abc", "h\u00e9", b""],
        "empty_ints": [],
        "empty_floats": np.zeros(0, dtype=np.float32),
        "ints_as_floats": [1, 2],
    }
    out = tmp_path / "x.tfrecord"
    write_examples(out, [example, example], feature_types={"ints_as_floats": "float"})
    for back in read_examples(out):
        assert back["ints"].tolist() == example["ints"]
        assert back["np_int32"].tolist() == [3, -4, 5, 6]
        assert back["bools"].tolist() == [1, 0]
        assert back["floats"].tolist() == example["floats"]
        assert back["floats"].dtype == np.float32
        assert back["np_float64"].tolist() == np.float32([0.1, 0.2]).tolist()
        assert back["strings"].tolist() == [b"abc", "h\u00e9".encode(), b""]
        assert back["empty_ints"].dtype == np.int64 and back["empty_ints"].size == 0
        assert back["empty_floats"].dtype == np.float32 and back["empty_floats"].size == 0
        assert back["ints_as_floats"].tolist() == [1.0, 2.0] and back["ints_as_floats"].dtype == np.float32


def test_decodes_unpacked_lists_and_skips_unknown_fields():
    def ld(tag, payload):  # length-delimited field
        return bytes([tag, len(payload)]) + payload

    ints = ld(0x1A, b"\x08\x05\x08\x96\x01")  # Int64List with two unpacked values 5 and 150
    floats = ld(0x12, b"\x0d" + struct.pack("<f", 1.5) + b"\x0d" + struct.pack("<f", -2.0))
    entry_i = ld(0x0A, ld(0x0A, b"i") + ld(0x12, ints))
    entry_f = ld(0x0A, ld(0x0A, b"f") + b"\x18\x07" + ld(0x12, floats))  # unknown varint field 3 inside
    data = ld(0x0A, entry_i + entry_f) + b"\x10\x01"  # unknown field 2 in Example
    back = decode_example(data)
    assert back["i"].tolist() == [5, 150]
    assert back["f"].tolist() == [1.5, -2.0]


def test_writer_streams_many_records_in_batches(tmp_path):
    out = tmp_path / "many.tfrecord"
    with TFRecordWriter(out, feature_types={"x": "int64"}) as writer:
        for i in range(1300):  # more than one internal batch
            writer.write_example({"x": list(range(i % 50)), "id": [i]})
    assert writer.num_records == 1300
    back = list(read_examples(out))
    assert [r["id"][0] for r in back] == list(range(1300))
    assert all(r["x"].tolist() == list(range(i % 50)) for i, r in enumerate(back))


def test_writer_leaves_nothing_behind_when_the_block_fails(tmp_path):
    out = tmp_path / "failed.tfrecord"
    with pytest.raises(RuntimeError):
        with TFRecordWriter(out) as writer:
            writer.write_example({"a": [1]})
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------- damaged files


def _record_offsets(path):
    offsets, pos, data = [], 0, path.read_bytes()
    while pos < len(data):
        offsets.append(pos)
        (length,) = struct.unpack_from("<Q", data, pos)
        pos += 12 + length + 4
    return offsets


def _damaged_copy(tmp_path, edit):
    src = DATA / "sample_text_nowwm.tfrecord"
    data = bytearray(src.read_bytes())
    data = edit(data, _record_offsets(src))
    out = tmp_path / "damaged.tfrecord"
    out.write_bytes(bytes(data))
    return out


def test_flipped_data_byte_is_a_crc_error_naming_the_record(tmp_path):
    def flip(data, offsets):
        data[offsets[5] + 12 + 40] ^= 0x01
        return data

    path = _damaged_copy(tmp_path, flip)
    seen = []
    with pytest.raises(InputError) as err:
        for record in read_examples(path):
            seen.append(record)
    message = str(err.value)
    assert "crc" in message and "corrupt" in message and "record 5" in message and str(path) in message
    assert f"byte offset {_record_offsets(path)[5]}" in message
    assert "\n" not in message
    assert len(seen) == 5  # the good records before it still came through


def test_flipped_length_byte_is_a_crc_error(tmp_path):
    def flip(data, offsets):
        data[offsets[3]] ^= 0x04
        return data

    with pytest.raises(InputError, match=r"crc mismatch in the length of record 3"):
        list(read_records(_damaged_copy(tmp_path, flip)))


def test_verify_crc_false_reads_past_a_flipped_float_byte(tmp_path):
    def flip(data, offsets):
        one = data.index(struct.pack("<f", 1.0), offsets[0], offsets[1])  # a masked_lm_weights value
        data[one] ^= 0x01  # now 1.0000001
        return data

    path = _damaged_copy(tmp_path, flip)
    records = list(read_examples(path, verify_crc=False))
    assert np.nextafter(np.float32(1), np.float32(2)) in records[0]["masked_lm_weights"]
    with pytest.raises(InputError, match="crc mismatch in the data of record 0"):
        list(read_examples(path))


@pytest.mark.parametrize("keep", [5, 12 + 100])
def test_truncated_file_names_the_record(tmp_path, keep):
    def cut(data, offsets):
        return data[: offsets[22] + keep]

    path = _damaged_copy(tmp_path, cut)
    with pytest.raises(InputError) as err:
        list(read_examples(path))
    message = str(err.value)
    assert "truncated" in message and "record 22" in message and str(path) in message


def test_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such TFRecord file"):
        list(read_examples(tmp_path / "nope.tfrecord"))


def test_garbage_record_is_not_an_example(tmp_path):
    out = tmp_path / "garbage.tfrecord"
    with TFRecordWriter(out) as writer:
        writer.write(b"\x0a\x7f\x01")  # a field longer than the record
    with pytest.raises(InputError, match=r"record 0 is not a valid tf.train.Example"):
        list(read_examples(out))
    assert os.path.getsize(out) == 12 + 3 + 4


def test_encode_pretraining_examples_is_byte_identical_to_encode_example():
    rng = np.random.default_rng(0)
    n = 50
    feats = {
        "input_ids": rng.integers(0, 30522, (n, 16)),
        "input_mask": rng.integers(0, 2, (n, 16)),
        "segment_ids": rng.integers(0, 2, (n, 16)),
        "masked_lm_positions": rng.integers(0, 16, (n, 4)),
        "masked_lm_ids": rng.integers(0, 2**40, (n, 4)),  # multi-byte varints, up to 6 bytes
        "masked_lm_weights": rng.random((n, 4)).astype(np.float32),
        "next_sentence_labels": rng.integers(0, 2, (n, 1)),
    }
    feats["input_ids"][0] = 0
    fast = encode_pretraining_examples(feats)
    assert fast == [
        encode_example({k: feats[k][i] for k in PRETRAINING_FEATURES}, PRETRAINING_FEATURES) for i in range(n)
    ]
