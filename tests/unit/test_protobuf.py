"""The protobuf wire-format codec: varints, keys, LEN fields, packed lists, and clear errors on bad bytes."""

import random
import struct

import numpy as np
import pytest

from bert.errors import InputError
from bert.formats import protobuf as pb
from bert.formats.tensorboard import encode_event, read_events
from bert.formats.tfrecord import TFRecordWriter, decode_example, encode_example

# Values and their varints, written out by hand from the encoding rule (7 bits a byte, low group first).
KNOWN_VARINTS = [
    (0, b"\x00"),
    (1, b"\x01"),
    (127, b"\x7f"),
    (128, b"\x80\x01"),
    (300, b"\xac\x02"),
    (16383, b"\xff\x7f"),
    (16384, b"\x80\x80\x01"),
    (2**17 - 1, b"\xff\xff\x07"),  # the last tabled value
    (2**17, b"\x80\x80\x08"),
    (2**63 - 1, b"\xff" * 8 + b"\x7f"),
    (-1, b"\xff" * 9 + b"\x01"),  # int64 < 0: the 64-bit two's complement, 10 bytes
    (-(2**63), b"\x80" * 9 + b"\x01"),
]
EDGE_VALUES = [v for v, _ in KNOWN_VARINTS]


@pytest.mark.parametrize("value, encoded", KNOWN_VARINTS)
def test_varint_known_bytes_and_round_trip(value, encoded):
    assert pb.encode_varint(value) == encoded
    raw, end = pb.read_varint(encoded + b"\x05", 0)
    assert end == len(encoded)
    assert pb.to_int64(raw) == value
    assert raw == value % 2**64  # read_varint gives the unsigned value


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64])
def test_varint_outside_int64_is_refused(value):
    with pytest.raises(ValueError, match="does not fit in an int64"):
        pb.encode_varint(value)


def test_keys_and_fields():
    assert pb.field_key(1, pb.LEN) == b"\x0a"
    assert pb.field_key(2, pb.I32) == b"\x15"
    assert pb.field_key(15, pb.VARINT) == b"\x78"
    assert pb.field_key(16, pb.VARINT) == b"\x80\x01"  # field numbers from 16 take a two-byte key
    assert pb.varint_field(2, -1) == b"\x10" + b"\xff" * 9 + b"\x01"
    for n in (0, 1, 127, 128, 300):
        payload = bytes(range(256))[:n] if n <= 256 else bytes(n)
        assert pb.length_delimited(3, payload) == b"\x1a" + pb.encode_varint(n) + payload
        assert pb.length_delimited(20, payload) == b"\xa2\x01" + pb.encode_varint(n) + payload
        assert pb.len_header(3, n) + payload == pb.length_delimited(3, payload)


def _message():
    """A message with every wire type, an unknown field number >= 16 and a nested message."""
    inner = pb.varint_field(1, 7) + pb.length_delimited(2, b"name")
    return (
        pb.varint_field(1, 150)
        + pb.field_key(2, pb.I64)
        + struct.pack("<d", 2.5)
        + pb.length_delimited(3, "h\u00e9".encode())
        + pb.field_key(4, pb.I32)
        + struct.pack("<f", -1.5)
        + pb.length_delimited(5, inner)
        + pb.varint_field(99, -2)
        + pb.length_delimited(6, b"")
    )


def test_iter_fields_reads_every_wire_type():
    fields = list(pb.iter_fields(_message()))
    assert [(f, w) for f, w, _ in fields] == [(1, 0), (2, 1), (3, 2), (4, 5), (5, 2), (99, 0), (6, 2)]
    values = {f: v for f, _, v in fields}
    assert values[1] == 150
    assert struct.unpack("<d", values[2]) == (2.5,)
    assert values[3].decode() == "h\u00e9"
    assert struct.unpack("<f", values[4]) == (-1.5,)
    assert list(pb.iter_fields(values[5])) == [(1, 0, 7), (2, 2, b"name")]
    assert pb.to_int64(values[99]) == -2
    assert values[6] == b""


def test_iter_fields_of_a_slice_and_of_a_memoryview():
    inner = pb.varint_field(1, 300) + pb.length_delimited(2, b"xyz")
    data = b"\xff\xff" + inner + b"\xff"  # garbage around the message
    assert list(pb.iter_fields(data, 2, 2 + len(inner))) == [(1, 0, 300), (2, 2, b"xyz")]
    view = list(pb.iter_fields(memoryview(inner)))[1][2]
    assert isinstance(view, memoryview) and bytes(view) == b"xyz"


def _read_int64s(message: bytes) -> list[int]:
    """Repeated int64 field 1, packed or one field a value, as a protobuf parser must accept both."""
    out = []
    for field, wire, value in pb.iter_fields(message):
        if field == 1 and wire == pb.LEN:
            out.extend(pb.decode_packed_varints(value).tolist())
        elif field == 1 and wire == pb.VARINT:
            out.append(pb.to_int64(value))
    return out


def test_packed_and_unpacked_lists_read_the_same():
    values = EDGE_VALUES + [5, 0, 1 << 40]
    packed = pb.length_delimited(1, pb.encode_packed_varints(values))
    unpacked = b"".join(pb.varint_field(1, v) for v in values)
    assert packed != unpacked
    assert _read_int64s(packed) == _read_int64s(unpacked) == values
    # Both forms mixed in one message, in order.
    mixed = pb.varint_field(1, 9) + pb.length_delimited(1, pb.encode_packed_varints([1, 2])) + pb.varint_field(1, -3)
    assert _read_int64s(mixed) == [9, 1, 2, -3]


@pytest.mark.parametrize(
    "values",
    [
        [],
        [0],
        [0, 127],  # one byte each
        EDGE_VALUES,
        list(range(0, 2**17, 997)),  # tabled
        [2**17, 2**20, 2**35, 2**63 - 1],  # past the table
        [-5, 3, -(2**40)],
    ],
)
def test_packed_varints_list_array_and_rows_agree(values):
    expected = b"".join(pb.encode_varint(v) for v in values)
    assert pb.encode_packed_varints(values) == expected
    assert pb.encode_packed_varints(np.array(values, dtype=np.int64)) == expected
    assert pb.encode_packed_varints(tuple(values)) == expected
    data, sizes = pb.encode_packed_varint_rows(np.array([values], dtype=np.int64).reshape(1, -1))
    assert data == expected and sizes.tolist() == [len(expected)]
    decoded = pb.decode_packed_varints(expected)
    assert decoded.dtype == np.int64 and decoded.tolist() == values


def test_packed_varint_rows_of_a_matrix():
    rng = np.random.default_rng(0)
    matrix = rng.integers(-(2**62), 2**62, (40, 9)) >> rng.integers(0, 63, (40, 9))  # 1 to 10 bytes each
    matrix[3] = 0
    matrix[4, 0] = -1
    data, sizes = pb.encode_packed_varint_rows(matrix)
    rows = [pb.encode_packed_varints(row.tolist()) for row in matrix]
    assert data == b"".join(rows)
    assert sizes.tolist() == [len(r) for r in rows]
    small = rng.integers(0, 128, (5, 3))  # the one-byte fast path
    data, sizes = pb.encode_packed_varint_rows(small)
    assert data == bytes(small.astype(np.uint8).ravel()) and sizes.tolist() == [3] * 5
    for empty in (np.zeros((0, 4), np.int64), np.zeros((3, 0), np.int64)):
        data, sizes = pb.encode_packed_varint_rows(empty)
        assert data == b"" and sizes.tolist() == [0] * len(empty)


def test_packed_varints_of_bools_and_small_ints():
    assert pb.encode_packed_varints(np.array([True, False, True])) == b"\x01\x00\x01"
    assert pb.encode_packed_varints(np.array([[1, 2], [300, 4]], dtype=np.int32)) == b"\x01\x02\xac\x02\x04"
    assert pb.encode_packed_varints(np.array([2**64 - 1], dtype=np.uint64)) == pb.encode_varint(-1)


@pytest.mark.parametrize("values", [[1.5, 2.0], [2**20, 1.0], [1, 2.0], np.array([0.5]), ["a"]])
def test_packed_varints_refuse_non_integers(values):
    with pytest.raises(TypeError, match="varints need integers"):
        pb.encode_packed_varints(values)


# ---------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "data, why",
    [
        (b"\x08", "a varint runs past the end of its field"),  # key, then nothing
        (b"\x08\x96", "a varint runs past the end of its field"),  # varint cut after its first byte
        (b"\x08" + b"\xff" * 10 + b"\x01", "a varint is longer than 10 bytes"),
        (b"\x0a\x05abc", "a field runs past the end of its message"),  # LEN payload cut
        (b"\x0a", "a varint runs past the end of its field"),  # LEN without its length
        (b"\x0a\x80", "a varint runs past the end of its field"),  # length varint cut
        (b"\x0d\x00\x00", "a field runs past the end of its message"),  # I32 cut
        (b"\x09" + bytes(7), "a field runs past the end of its message"),  # I64 cut
        (b"\x0b", "unsupported protobuf wire type 3"),  # groups (deprecated) are not supported
        (b"\x0e", "unsupported protobuf wire type 6"),
        (b"\x80", "a varint runs past the end of its field"),  # key varint cut
    ],
)
def test_malformed_messages_raise_decode_error(data, why):
    with pytest.raises(pb.DecodeError) as err:
        list(pb.iter_fields(data))
    assert str(err.value) == why
    assert isinstance(err.value, ValueError)


def test_a_field_may_not_cross_the_end_of_its_slice():
    data = pb.length_delimited(1, b"abcd") + pb.varint_field(2, 1)
    with pytest.raises(pb.DecodeError, match="runs past the end of its message"):
        list(pb.iter_fields(data, 0, 4))  # the payload ends at 6
    with pytest.raises(pb.DecodeError, match="runs past the end of its field"):
        pb.read_varint(b"\x96\x01", 0, 1)
    with pytest.raises(pb.DecodeError, match="runs past the end of its message"):
        pb.read_span(b"\x03ab", 0, 3)


def test_every_truncation_of_a_message_is_an_error_or_a_whole_prefix():
    data = _message()
    boundaries, fields = {0}, []
    i = 0
    for f in pb.iter_fields(data):
        fields.append(f)
        i += len(_encode(*f))
        boundaries.add(i)
    assert i == len(data)
    for cut in range(len(data)):
        if cut in boundaries:
            assert list(pb.iter_fields(data[:cut])) == fields[: sorted(boundaries).index(cut)]
        else:
            with pytest.raises(pb.DecodeError):
                list(pb.iter_fields(data[:cut]))


def _encode(field, wire, value):
    if wire == pb.VARINT:
        return pb.varint_field(field, pb.to_int64(value))
    if wire == pb.LEN:
        return pb.length_delimited(field, value)
    return pb.field_key(field, wire) + value


def test_random_messages_round_trip():
    rng = random.Random(0)
    for _ in range(200):
        fields = []
        for _ in range(rng.randrange(0, 8)):
            field = rng.choice([1, 2, 15, 16, 2047, 2**29 - 1])
            wire = rng.choice([pb.VARINT, pb.I64, pb.LEN, pb.I32])
            if wire == pb.VARINT:
                value = rng.choice(EDGE_VALUES + [rng.randrange(-(2**63), 2**63)]) % 2**64
            elif wire == pb.LEN:
                value = rng.randbytes(rng.choice([0, 1, 127, 128, 300]))
            else:
                value = rng.randbytes(8 if wire == pb.I64 else 4)
            fields.append((field, wire, value))
        data = b"".join(_encode(*f) for f in fields)
        assert list(pb.iter_fields(data)) == fields


def test_decode_packed_varints_errors():
    with pytest.raises(pb.DecodeError, match="ends inside a varint"):
        pb.decode_packed_varints(b"\x01\x96")
    with pytest.raises(pb.DecodeError, match="longer than 10 bytes"):
        pb.decode_packed_varints(b"\x01" + b"\xff" * 10 + b"\x01")
    assert pb.decode_packed_varints(b"").tolist() == []


# ------------------------------------------------------------- how the formats report a bad message


def test_a_truncated_example_is_an_input_error_naming_the_record():
    good = encode_example({"input_ids": [101, 2000, 102], "w": [1.0]})
    assert decode_example(good)["input_ids"].tolist() == [101, 2000, 102]
    for cut in (1, 5, len(good) - 1):
        with pytest.raises(InputError) as err:
            decode_example(good[:cut], "shard.tfrecord", 7)
        message = str(err.value)
        assert message.startswith("shard.tfrecord: record 7 is not a valid tf.train.Example (")
        assert "runs past the end" in message


def test_a_corrupt_event_is_an_input_error_naming_the_file_and_record(tmp_path):
    path = tmp_path / "events.out.tfevents.1.host.1.0"
    with TFRecordWriter(path) as writer:  # valid framing and CRCs around a broken Event
        writer.write(encode_event(1.0, 1, {"loss": 0.5}))
        writer.write(encode_event(2.0, 2, {"loss": 0.25})[:-3])
    with pytest.raises(InputError) as err:
        read_events(path)
    assert str(err.value).startswith(f"{path}: record 1 is not a valid TensorBoard Event (")
