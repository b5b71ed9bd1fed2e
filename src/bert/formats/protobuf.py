"""The protobuf wire format: the one codec behind tf.train.Example, TF checkpoints and TensorBoard events.

No protobuf package is needed: the messages these formats use are small and fixed, so they are written
and read field by field with the primitives below (`bert.formats.tfrecord`, `bert.formats.tf_checkpoint`
and `bert.formats.tensorboard` hold the message layouts).

A serialized message is a sequence of fields, each a key then a value, with
key = varint(field number << 3 | wire type):

    VARINT (0)  a base-128 varint: 7 bits a byte, least significant first, high bit set on all but the
                last byte; an int64 < 0 is its 64-bit two's complement, so it takes 10 bytes
    I64 (1)     8 bytes, little-endian (double, fixed64)
    LEN (2)     a varint length, then that many bytes (string, bytes, a sub-message, a packed list)
    I32 (5)     4 bytes, little-endian (float, fixed32)

A repeated number field is written packed (one LEN field holding the values back to back) and read either
way (packed, or one field per value); unknown fields are skipped by their wire type; the last value of a
non-repeated field wins.

Decoding raises `DecodeError` saying what is wrong ("a field runs past the end of its message"); the
format modules turn it into a `bert.errors.InputError` naming the file and the record.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

__all__ = [
    "I32",
    "I64",
    "LEN",
    "VARINT",
    "DecodeError",
    "decode_packed_varints",
    "encode_packed_varint_rows",
    "encode_packed_varints",
    "encode_varint",
    "field_key",
    "iter_fields",
    "len_header",
    "length_delimited",
    "read_span",
    "read_varint",
    "to_int64",
    "varint_field",
]

VARINT, I64, LEN, I32 = 0, 1, 2, 5


class DecodeError(ValueError):
    """A truncated or malformed message; the text says what is wrong, the caller adds where."""


# ----------------------------------------------------------------------------------------------------
# Encoding.


def encode_varint(value: int) -> bytes:
    """The varint of an int64 (a negative value takes 10 bytes, as its two's complement)."""
    if not -(1 << 63) <= value < (1 << 63):  # constant expressions, folded when compiled
        raise ValueError(f"{value} does not fit in an int64")
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_key(field: int, wire: int) -> bytes:
    """The key that starts a field: varint(field number << 3 | wire type)."""
    return encode_varint((field << 3) | wire)


def varint_field(field: int, value: int) -> bytes:
    """A VARINT field (an int64, enum or bool)."""
    return field_key(field, VARINT) + encode_varint(value)


_LEN_KEYS = [bytes(((field << 3) | LEN,)) for field in range(16)]  # one-byte keys of fields 1..15


def length_delimited(field: int, payload: bytes) -> bytes:
    """A LEN field: key, length, payload (bytes, a string's UTF-8, a sub-message, a packed list)."""
    n = len(payload)
    return (
        (_LEN_KEYS[field] if field < 16 else field_key(field, LEN))
        + (bytes((n,)) if n < 0x80 else encode_varint(n))
        + payload
    )


def len_header(field: int, size: int) -> bytes:
    """The key and length that start a LEN field whose payload is `size` bytes."""
    return (_LEN_KEYS[field] if field < 16 else field_key(field, LEN)) + encode_varint(size)


# Varints of 0 <= v < 2**17 (1 to 3 bytes; every BERT vocabulary id) come from a table, built on first use.
_TABLE_BITS = 17
_VARINT_TABLE: list[bytes] = []


def _varint_table() -> list[bytes]:
    if not _VARINT_TABLE:
        raw, sizes = encode_packed_varint_rows(np.arange(1 << _TABLE_BITS)[:, None])  # one value a row
        ends = np.cumsum(sizes).tolist()
        starts = [0, *ends[:-1]]
        _VARINT_TABLE.extend(raw[a:b] for a, b in zip(starts, ends))
    return _VARINT_TABLE


def encode_packed_varints(values: Sequence[int] | np.ndarray) -> bytes:
    """The payload of a packed repeated int64 field: the varints of `values` back to back.

    Args:
        values: a list (or tuple) of ints, or an integer or bool array of any shape (flattened).

    Raises:
        TypeError: a value is not an integer.
    """
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iub":
            raise TypeError(f"varints need integers, got an array of {values.dtype}")
        if values.size == 0:
            return b""
        flat = values.ravel()
        if flat.min() >= 0 and flat.max() < (1 << _TABLE_BITS):
            table = _varint_table()
            return b"".join([table[v] for v in flat.tolist()])
        return encode_packed_varint_rows(flat[None, :])[0]
    if not values:
        return b""
    try:
        if min(values) >= 0 and max(values) < (1 << _TABLE_BITS):
            table = _varint_table()
            return b"".join([table[v] for v in values])
        return b"".join([encode_varint(operator.index(v)) for v in values])  # operator.index refuses floats
    except TypeError:
        raise TypeError("varints need integers") from None


def encode_packed_varint_rows(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Packed varints of every row of an integer matrix [N, L] at once (vectorised).

    Returns:
        (the rows' payloads back to back, in row order; the byte size of each row's payload [N]).
    """
    v = np.asarray(values)
    if v.dtype.kind not in "iub":
        raise TypeError(f"varints need integers, got an array of {v.dtype}")
    if v.size == 0:
        return b"", np.zeros(len(v), np.int64)
    low, high = int(v.min()), int(v.max())
    if low >= 0 and high < 0x80:  # one byte per value: the values themselves
        return v.astype(np.uint8).tobytes(), np.full(len(v), v.shape[1], np.int64)
    u = v.astype(np.int64).view(np.uint64).reshape(-1)  # negative int64 -> two's complement
    width = 10 if low < 0 else (high.bit_length() + 6) // 7  # bytes of the longest varint
    nbytes = np.ones(u.shape, np.int64)
    for k in range(1, width):
        nbytes += u >= np.uint64(1 << (7 * k))
    ends = np.cumsum(nbytes)
    out = np.empty(int(ends[-1]), np.uint8)
    start = ends - nbytes  # where each value's varint begins; rows stay contiguous, in order
    for k in range(width):
        byte = ((u >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= (nbytes > k + 1).astype(np.uint8) << 7  # continuation bit
        if k == 0:
            out[start] = byte
        else:
            m = nbytes > k
            out[start[m] + k] = byte[m]
    return out.tobytes(), nbytes.reshape(v.shape).sum(axis=1)


# ----------------------------------------------------------------------------------------------------
# Decoding.


def to_int64(value: int) -> int:
    """A varint's value read as an int64: its low 64 bits, two's complement (values >= 2**63 are negative)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def read_varint(buf: bytes, i: int, end: int | None = None) -> tuple[int, int]:
    """The varint starting at buf[i] (and ending before buf[end]): (its unsigned value, the index after it)."""
    if end is None:
        end = len(buf)
    result = shift = 0
    while i < end:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise DecodeError("a varint is longer than 10 bytes")
    raise DecodeError("a varint runs past the end of its field")


def read_span(buf: bytes, i: int, end: int) -> tuple[int, int]:
    """(start, stop) of the payload of a LEN field whose length varint starts at buf[i]."""
    if i < end and buf[i] < 0x80:  # most lengths are one byte
        n = buf[i]
        i += 1
    else:
        n, i = read_varint(buf, i, end)
    if i + n > end:
        raise DecodeError("a field runs past the end of its message")
    return i, i + n


def iter_fields(buf: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of the message buf[start:end], in order.

    The value is an int for a VARINT field (unsigned: see `to_int64`), and the slice of `buf` holding it
    for the others: the payload of a LEN field, the 4 or 8 little-endian bytes of an I32 or I64 field.
    Slicing a memoryview copies nothing. (Typed `Any`: the wire type, which callers test, decides between
    int and bytes, and a type checker cannot follow that.)

    Raises:
        DecodeError: the message is truncated or malformed.
    """
    if end is None:
        end = len(buf)
    i = start
    while i < end:
        tag = buf[i]
        if tag < 0x80:  # field numbers up to 15 make one-byte keys
            i += 1
        else:
            tag, i = read_varint(buf, i, end)
        wire = tag & 7
        if wire == LEN:
            if i < end and buf[i] < 0x80:  # read_span, inlined: most lengths are one byte
                a = i + 1
                i = a + buf[i]
                if i > end:
                    raise DecodeError("a field runs past the end of its message")
            else:
                a, i = read_span(buf, i, end)
            yield tag >> 3, LEN, buf[a:i]
        elif wire == VARINT:
            value, i = read_varint(buf, i, end)
            yield tag >> 3, VARINT, value
        elif wire == I32 or wire == I64:
            a, i = i, i + (4 if wire == I32 else 8)
            if i > end:
                raise DecodeError("a field runs past the end of its message")
            yield tag >> 3, wire, buf[a:i]
        else:
            raise DecodeError(f"unsupported protobuf wire type {wire}")


_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)  # of the 7-bit groups of a varint, least significant first


def decode_packed_varints(buf: bytes) -> np.ndarray:
    """The values of a packed repeated int64 field's payload, as int64 (vectorised)."""
    data = bytes(buf)  # no copy of a bytes object
    if data.isascii():  # every byte < 0x80: one byte per value (checked in C, cheaper than a NumPy call)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    if data[-1] >= 0x80:
        raise DecodeError("a packed int64 list ends inside a varint")
    b = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(b < 0x80)  # the last byte of each varint
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise DecodeError("a varint is longer than 10 bytes")
    group = np.arange(b.size) - np.repeat(starts, lengths)  # each byte's place in its varint
    parts = (b & 0x7F).astype(np.uint64) << _SHIFTS[group]
    return np.bitwise_or.reduceat(parts, starts).view(np.int64)
