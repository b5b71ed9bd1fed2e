"""TFRecord files of `tf.train.Example` records, read and written without TensorFlow or protobuf.

This is the format `create_pretraining_data.py` writes and `run_pretraining.py` reads (spec §4.5).

Framing, per record (all little-endian):

    uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)

The data is a serialized `tf.train.Example`, whose messages are (tensorflow/core/example/*.proto):

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }     each map entry: { string key = 1; Feature value = 2; }
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Writing emits packed lists and the features in the order of the dict; reading accepts packed and unpacked
lists and any field order, and skips unknown fields, as a protobuf parser does.

Speed: varints of small non-negative ints come from a precomputed table, floats and CRCs are done with
NumPy, and the writer computes the CRCs of many records at once (`bert.formats.crc32c.crc32c_many`).
"""

from __future__ import annotations

import operator
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import numpy as np

from bert.errors import InputError
from bert.formats.crc32c import crc32c_many, mask, masked_crc32c
from bert.utils import atomic_write

__all__ = [
    "TFRecordWriter",
    "decode_example",
    "encode_example",
    "read_examples",
    "read_records",
    "write_examples",
]

FEATURE_TYPES = ("int64", "float", "bytes")

# ----------------------------------------------------------------------------------------------------
# Varints.

_TABLE_BITS = 17  # varints of 0 <= v < 2**17 (1 to 3 bytes; covers every BERT vocabulary id) are tabled
_VARINT_TABLE: list[bytes] = []


def _varint(v: int) -> bytes:
    """Protobuf base-128 varint of an int64 (negative values take 10 bytes, as two's complement)."""
    if not -(1 << 63) <= v < (1 << 63):
        raise ValueError(f"{v} does not fit in an int64")
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _varint_table() -> list[bytes]:
    if not _VARINT_TABLE:
        raw = _encode_varints_numpy(np.arange(1 << _TABLE_BITS, dtype=np.int64))
        sizes = 1 + (np.arange(1 << _TABLE_BITS) >= 1 << 7) + (np.arange(1 << _TABLE_BITS) >= 1 << 14)
        ends = np.cumsum(sizes).tolist()
        starts = [0, *ends[:-1]]
        _VARINT_TABLE.extend(raw[a:b] for a, b in zip(starts, ends))
    return _VARINT_TABLE


def _encode_varints_numpy(values: np.ndarray) -> bytes:
    """Packed varints of any int64 values, vectorised."""
    u = values.astype(np.int64, copy=False).view(np.uint64)
    if u.size == 0:
        return b""
    shifts = np.arange(0, 70, 7, dtype=np.uint64)  # 10 groups of 7 bits cover 64 bits
    groups = ((u[:, None] >> shifts[None, :]) & np.uint64(0x7F)).astype(np.uint8)  # [n, 10]
    nbytes = np.ones(u.size, dtype=np.int64)
    for k in range(1, 10):
        nbytes += u >= np.uint64(1 << (7 * k))
    keep = np.arange(10)[None, :] < nbytes[:, None]
    cont = np.arange(10)[None, :] < (nbytes - 1)[:, None]
    groups[cont] |= 0x80
    return groups[keep].tobytes()


def _encode_varints(values) -> bytes:
    """Packed varints of a list or array of ints (the payload of a packed int64 field)."""
    if isinstance(values, np.ndarray):
        if values.dtype.kind not in "iub":
            raise TypeError(f"an int64 feature needs integer values, got an array of {values.dtype}")
        if values.size == 0:
            return b""
        flat = values.ravel()
        if flat.min() >= 0 and flat.max() < (1 << _TABLE_BITS):
            table = _varint_table()
            return b"".join([table[v] for v in flat.tolist()])
        return _encode_varints_numpy(flat.astype(np.int64))
    if not values:
        return b""
    try:
        if min(values) >= 0 and max(values) < (1 << _TABLE_BITS):
            table = _varint_table()
            return b"".join([table[v] for v in values])
    except TypeError:
        raise TypeError(
            "an int64 feature needs integer values (for floats, make the first value a float or pass feature_types)"
        ) from None
    return b"".join(_varint(operator.index(v)) for v in values)  # operator.index refuses floats


def _decode_varints(buf, path: str, index: int) -> np.ndarray:
    """Decode packed varints to int64 (vectorised)."""
    b = np.frombuffer(buf, dtype=np.uint8)
    if b.size == 0:
        return np.zeros(0, dtype=np.int64)
    last = b < 0x80
    if last.all():
        return b.astype(np.int64)
    if not last[-1]:
        raise _bad_example(path, index, "a packed int64 list ends inside a varint")
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    pos = np.arange(b.size) - np.repeat(starts, ends - starts + 1)
    if pos.max() > 9:
        raise _bad_example(path, index, "a varint is longer than 10 bytes")
    parts = (b & 0x7F).astype(np.uint64) << (7 * pos).astype(np.uint64)
    return np.bitwise_or.reduceat(parts, starts).view(np.int64)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    """One varint at buf[i:]; returns (value, next index). Raises IndexError past the end."""
    b = buf[i]
    if b < 0x80:
        return b, i + 1
    result = b & 0x7F
    shift = 7
    while True:
        i += 1
        b = buf[i]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i + 1
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _len_prefixed(tag: bytes, payload: bytes) -> bytes:
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else _varint(n)) + payload


# ----------------------------------------------------------------------------------------------------
# Example encoding.


def _infer_type(values) -> str:
    if isinstance(values, np.ndarray):
        kind = values.dtype.kind
        if kind in "iub":
            return "int64"
        if kind == "f":
            return "float"
        if kind in "SO":
            return "bytes"
        raise TypeError(f"cannot store an array of {values.dtype} in a tf.train.Example")
    if isinstance(values, (bytes, str)):
        return "bytes"
    # Lists are taken to be homogeneous: the first value decides (pass feature_types to override).
    first = values[0] if len(values) else 0
    if isinstance(first, (bytes, str)):
        return "bytes"
    if isinstance(first, (float, np.floating)):
        return "float"
    return "int64"  # ints, bools, numpy ints, and the empty list


def _encode_feature(values, kind: str) -> bytes:
    if kind == "int64":
        packed = _encode_varints(values)
        inner = _len_prefixed(b"\x0a", packed) if packed else b""
        return _len_prefixed(b"\x1a", inner)  # Feature.int64_list = 3
    if kind == "float":
        data = np.asarray(values, dtype="<f4").tobytes()
        inner = _len_prefixed(b"\x0a", data) if data else b""
        return _len_prefixed(b"\x12", inner)  # Feature.float_list = 2
    if kind == "bytes":
        if isinstance(values, (bytes, str)):
            values = [values]
        items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]
        return _len_prefixed(b"\x0a", b"".join(_len_prefixed(b"\x0a", v) for v in items))
    raise ValueError(f"unknown feature type {kind!r}; use one of {FEATURE_TYPES}")


def encode_example(features: Mapping[str, object], feature_types: Mapping[str, str] | None = None) -> bytes:
    """Serialize one `tf.train.Example`.

    Args:
        features: feature name -> values: a list or 1-D array of ints (int64_list), of floats (float_list),
            or of bytes/str (bytes_list). Multi-dimensional arrays are flattened.
        feature_types: optional name -> "int64" | "float" | "bytes", overriding the inferred type (useful
            for an empty list, or to store integral values as floats).

    Returns:
        The serialized Example; features appear in the order of `features`.
    """
    parts = []
    for name, values in features.items():
        if not isinstance(values, (np.ndarray, list, tuple, bytes, str)):
            values = list(values)  # a generator: read it once
        kind = feature_types.get(name) if feature_types else None
        try:
            feature = _encode_feature(values, kind or _infer_type(values))
        except (TypeError, ValueError) as e:
            raise type(e)(f"feature {name!r}: {e}") from None
        entry = _len_prefixed(b"\x0a", name.encode("utf-8")) + _len_prefixed(b"\x12", feature)
        parts.append(_len_prefixed(b"\x0a", entry))
    return _len_prefixed(b"\x0a", b"".join(parts))


# ----------------------------------------------------------------------------------------------------
# Example decoding: a small hand-written protobuf parser. Each message is walked tag by tag; the tags we
# know are handled, any other field is skipped by its wire type.


class _ParseError(Exception):
    pass


def _bad_example(path: str, index: int, why: str) -> InputError:
    return InputError(
        f"{path}: record {index} is not a valid tf.train.Example ({why}); "
        "the file is corrupt or is not a TFRecord file of tf.train.Example records"
    )


def _skip(buf: bytes, i: int, tag: int) -> int:
    """Index after the value of a field with this tag, whose value starts at buf[i]."""
    wire = tag & 7
    if wire == 0:
        return _read_varint(buf, i)[1]
    if wire == 2:
        n, i = _read_varint(buf, i)
        return i + n
    if wire == 5:
        return i + 4
    if wire == 1:
        return i + 8
    raise _ParseError(f"unsupported protobuf wire type {wire}")


def _span(buf: bytes, i: int, end: int) -> tuple[int, int]:
    """(start, end) of a length-delimited value whose length varint starts at buf[i]."""
    n = buf[i]
    if n < 0x80:
        i += 1
    else:
        n, i = _read_varint(buf, i)
    if i + n > end:
        raise _ParseError("a field runs past the end of its message")
    return i, i + n


def _decode_list(buf: bytes, a: int, b: int, kind: int, path: str, index: int) -> np.ndarray:
    """Values of an Int64List (kind 3), FloatList (2) or BytesList (1) stored in buf[a:b]."""
    pieces = []
    i = a
    while i < b:
        tag = buf[i]
        i += 1
        if tag == 0x0A:  # value = 1, length-delimited: packed numbers or one bytes value
            s, i = _span(buf, i, b)
            if kind == 3:
                pieces.append(_decode_varints(buf[s:i], path, index))
            elif kind == 2:
                if (i - s) % 4:
                    raise _ParseError("a packed float list is not a multiple of 4 bytes")
                pieces.append(np.frombuffer(buf, dtype="<f4", count=(i - s) // 4, offset=s))
            else:
                pieces.append(buf[s:i])
        elif tag == 0x08 and kind == 3:  # one unpacked int64
            v, i = _read_varint(buf, i)
            pieces.append(np.array([v & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64).view(np.int64))
        elif tag == 0x0D and kind == 2:  # one unpacked float
            pieces.append(np.frombuffer(buf, dtype="<f4", count=1, offset=i))
            i += 4
        else:
            if tag >= 0x80:
                tag, i = _read_varint(buf, i - 1)
            i = _skip(buf, i, tag)
    if i != b:
        raise _ParseError("a field runs past the end of its message")
    if kind == 1:
        out = np.empty(len(pieces), dtype=object)
        out[:] = pieces
        return out
    if kind == 3:
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces or [np.zeros(0, np.int64)])
    return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, dtype=np.float32)


def _decode_feature(buf: bytes, a: int, b: int, path: str, index: int) -> np.ndarray:
    result = None
    i = a
    while i < b:
        tag = buf[i]
        i += 1
        if tag in (0x0A, 0x12, 0x1A):  # bytes_list = 1, float_list = 2, int64_list = 3
            s, i = _span(buf, i, b)
            result = _decode_list(buf, s, i, tag >> 3, path, index)  # the last one set wins (a oneof)
        else:
            if tag >= 0x80:
                tag, i = _read_varint(buf, i - 1)
            i = _skip(buf, i, tag)
    if result is None:  # a Feature with no kind set reads as an empty list, as in TF
        return np.zeros(0, dtype=np.float32)
    return result


def decode_example(data: bytes, path: str = "<bytes>", index: int = 0) -> dict[str, np.ndarray]:
    """Parse a serialized `tf.train.Example`.

    Args:
        data: the serialized Example.
        path: where the record came from, for error messages.
        index: the record's index in that file, for error messages.

    Returns:
        Feature name -> 1-D array: int64_list as np.int64, float_list as np.float32, bytes_list as an
        object array of bytes.

    Raises:
        InputError: the bytes are not a valid Example.
    """
    buf = bytes(data)
    end = len(buf)
    out: dict[str, np.ndarray] = {}
    try:
        i = 0
        while i < end:
            tag = buf[i]
            i += 1
            if tag != 0x0A:  # Example.features = 1
                if tag >= 0x80:
                    tag, i = _read_varint(buf, i - 1)
                i = _skip(buf, i, tag)
                continue
            fs, fe = _span(buf, i, end)
            i = fs
            while i < fe:  # Features
                tag = buf[i]
                i += 1
                if tag != 0x0A:  # Features.feature = 1 (map entries)
                    if tag >= 0x80:
                        tag, i = _read_varint(buf, i - 1)
                    i = _skip(buf, i, tag)
                    continue
                es, ee = _span(buf, i, fe)
                i = es
                name = ""
                value = np.zeros(0, dtype=np.float32)
                while i < ee:  # one map entry
                    tag = buf[i]
                    i += 1
                    if tag == 0x0A:  # key
                        s, i = _span(buf, i, ee)
                        name = buf[s:i].decode("utf-8")
                    elif tag == 0x12:  # value
                        s, i = _span(buf, i, ee)
                        value = _decode_feature(buf, s, i, path, index)
                    else:
                        if tag >= 0x80:
                            tag, i = _read_varint(buf, i - 1)
                        i = _skip(buf, i, tag)
                if i != ee:
                    raise _ParseError("a field runs past the end of its message")
                out[name] = value
            if i != fe:
                raise _ParseError("a field runs past the end of its message")
        if i != end:
            raise _ParseError("the last field runs past the end of the record")
    except (_ParseError, IndexError, ValueError) as e:
        raise _bad_example(path, index, str(e) or "it ends inside a field") from None
    return out


# ----------------------------------------------------------------------------------------------------
# Framing.


# ------------------------------------------------------------------------------- pre-training records
# The seven features of the original's pre-training records and their kinds
# (create_pretraining_data.py, `write_instance_to_example_files`).
PRETRAINING_FEATURES = {
    "input_ids": "int64",
    "input_mask": "int64",
    "segment_ids": "int64",
    "masked_lm_positions": "int64",
    "masked_lm_ids": "int64",
    "masked_lm_weights": "float",
    "next_sentence_labels": "int64",
}


def _packed_varints(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Protobuf packed varints of each row of a non-negative int matrix [N, L]: (bytes, row sizes [N])."""
    v = np.asarray(values)
    if v.size and v.min() < 0:
        raise ValueError("pre-training features are non-negative")
    top = int(v.max(initial=0))
    if top < 0x80:  # one byte per value: the values themselves
        return v.astype(np.uint8).tobytes(), np.full(len(v), v.shape[1], np.int64)
    u = v.astype(np.uint64).reshape(-1)
    width = (top.bit_length() + 6) // 7
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


def encode_pretraining_examples(features: dict[str, np.ndarray]) -> list[bytes]:
    """Serialized `tf.train.Example`s of stacked pre-training features [N, ...], many at a time.

    A fast path for the fixed 7-feature schema, byte-identical to `encode_example(...,
    PRETRAINING_FEATURES)` on each row (tested): the varints of all rows are computed at once with NumPy, the
    per-feature headers depend only on the payload size and are cached, and rows are joined in C.
    """
    n = len(features["input_ids"])
    columns: list[list[bytes]] = []
    total = np.zeros(n, np.int64)
    for name, kind in PRETRAINING_FEATURES.items():
        values = np.asarray(features[name]).reshape(n, -1)
        if kind == "float":
            data = values.astype("<f4").tobytes()
            sizes = np.full(n, values.shape[1] * 4, np.int64)
        else:
            data, sizes = _packed_varints(values)
        key = name.encode()
        tag = b"\x12" if kind == "float" else b"\x1a"  # Feature.float_list = 2, Feature.int64_list = 3
        cache: dict[int, bytes] = {}
        for size in np.unique(sizes).tolist():
            # map entry {key = name, value = Feature {kind {value = payload (packed)}}}
            inner = (b"\x0a" + _varint(size)) if size else b""
            feature = tag + _varint(len(inner) + size) + inner
            entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(feature) + size) + feature
            cache[size] = b"\x0a" + _varint(len(entry) + size) + entry
        size_list = sizes.tolist()
        headers = [cache[x] for x in size_list]
        ends = np.cumsum(sizes).tolist()
        starts = [0, *ends[:-1]]
        columns.append(headers)
        columns.append([data[a:b] for a, b in zip(starts, ends)])
        total += sizes + np.array([len(h) for h in cache.values()])[np.searchsorted(list(cache), sizes)]
    prefix_cache = {t: b"\x0a" + _varint(t) for t in np.unique(total).tolist()}
    prefixes = [prefix_cache[t] for t in total.tolist()]
    return list(map(b"".join, zip(prefixes, *columns)))


_HEADER = struct.Struct("<QI")
_BATCH_RECORDS = 512
_BATCH_BYTES = 1 << 22


def _frame(payloads: list[bytes], header_cache: dict[int, bytes]) -> bytes:
    crcs = crc32c_many(payloads)
    parts = []
    for p, c in zip(payloads, crcs):
        n = len(p)
        header = header_cache.get(n)
        if header is None:
            length = struct.pack("<Q", n)
            header = length + struct.pack("<I", masked_crc32c(length))
            if len(header_cache) < 65536:
                header_cache[n] = header
        parts.append(header)
        parts.append(p)
        parts.append(struct.pack("<I", mask(c)))
    return b"".join(parts)


class TFRecordWriter:
    """Stream records into a TFRecord file, written under a temporary name and renamed on `close`.

    Use it as a context manager (or call `close`); if the block raises, the partial file is removed and
    `path` is left as it was. Records are buffered and framed in batches (so their CRCs are computed
    together), so nothing is visible under `path` before `close`.

    Args:
        path: the output file.
        feature_types: optional feature name -> "int64" | "float" | "bytes" for `write_example`.
    """

    def __init__(self, path: str | os.PathLike, feature_types: Mapping[str, str] | None = None):
        self.path = Path(path)
        self.feature_types = dict(feature_types) if feature_types else None
        self.num_records = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._headers: dict[int, bytes] = {}
        self._ctx = atomic_write(self.path, "wb")
        self._file = self._ctx.__enter__()
        self._closed = False

    def write(self, record: bytes) -> None:
        """Append one raw record (for example a serialized Example)."""
        if self._closed:
            raise ValueError(f"write to a closed TFRecordWriter ({self.path})")
        self._pending.append(bytes(record))
        self._pending_bytes += len(record)
        self.num_records += 1
        if len(self._pending) >= _BATCH_RECORDS or self._pending_bytes >= _BATCH_BYTES:
            self._flush()

    def write_example(self, features: Mapping[str, object]) -> None:
        """Append one `tf.train.Example` built from `features` (see `encode_example`)."""
        self.write(encode_example(features, self.feature_types))

    def _flush(self) -> None:
        if self._pending:
            self._file.write(_frame(self._pending, self._headers))
            self._pending = []
            self._pending_bytes = 0

    def close(self) -> None:
        """Write what is buffered and move the file to its final name."""
        if self._closed:
            return
        try:
            self._flush()
        except BaseException as e:
            self._abort(e)
            raise
        self._closed = True
        self._ctx.__exit__(None, None, None)

    def _abort(self, exc: BaseException) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._ctx.__exit__(type(exc), exc, exc.__traceback__)
            except BaseException:
                pass

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is None:
            self.close()
        else:
            self._abort(exc)


def write_examples(
    path: str | os.PathLike,
    examples: Iterable[Mapping[str, object]],
    feature_types: Mapping[str, str] | None = None,
) -> int:
    """Write `tf.train.Example` records to a TFRecord file atomically.

    Args:
        path: the output file (replaced only once every record is written).
        examples: dicts of feature name -> list or array of values (see `encode_example`).
        feature_types: optional name -> "int64" | "float" | "bytes", overriding the inferred types.

    Returns:
        The number of records written.
    """
    with TFRecordWriter(path, feature_types) as writer:
        for example in examples:
            writer.write_example(example)
    return writer.num_records


def _truncated(path: str, index: int, offset: int, got: int, need: int) -> InputError:
    return InputError(
        f"{path} is truncated: record {index} (byte offset {offset}) needs {need} bytes but the file "
        f"ends after {got}; the file was not completely written, regenerate it"
    )


def _crc_error(path: str, index: int, offset: int, what: str) -> InputError:
    return InputError(
        f"{path} is corrupt: crc mismatch in the {what} of record {index} (byte offset {offset}); "
        "regenerate the file, or read it with verify_crc=False to skip the check"
    )


def read_records(path: str | os.PathLike, verify_crc: bool = True) -> Iterator[bytes]:
    """Yield the raw records of a TFRecord file.

    Args:
        path: the file.
        verify_crc: check the CRC of every record's length and data (data CRCs are checked in batches, and
            the records before a bad one are still yielded).

    Raises:
        InputError: the file is missing, truncated or corrupt (names the record index and byte offset).
    """
    path_str = str(path)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise InputError(f"{path_str}: no such TFRecord file; check the path") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        index = 0
        offset = 0
        batch: list[tuple[int, int, bytes, int]] = []  # (index, offset, data, stored masked crc)
        batch_bytes = 0
        while True:
            header = f.read(12)
            if not header:
                break
            if len(header) < 12:
                raise _truncated(path_str, index, offset, len(header), 12)
            length, length_crc = _HEADER.unpack(header)
            if verify_crc and masked_crc32c(header[:8]) != length_crc:
                yield from _verified(path_str, batch)
                raise _crc_error(path_str, index, offset, "length")
            if offset + 12 + length + 4 > size:
                yield from _verified(path_str, batch)
                raise _truncated(path_str, index, offset, size - offset, 12 + length + 4)
            body = f.read(length + 4)
            if len(body) < length + 4:  # the file shrank while we read it
                raise _truncated(path_str, index, offset, 12 + len(body), 12 + length + 4)
            data = body[:length]
            (stored,) = struct.unpack_from("<I", body, length)
            if not verify_crc:
                yield data
            else:
                batch.append((index, offset, data, stored))
                batch_bytes += length
                if len(batch) >= _BATCH_RECORDS or batch_bytes >= _BATCH_BYTES:
                    yield from _verified(path_str, batch)
                    batch = []
                    batch_bytes = 0
            index += 1
            offset += 12 + length + 4
        yield from _verified(path_str, batch)


def _verified(path: str, batch: list[tuple[int, int, bytes, int]]) -> Iterator[bytes]:
    if not batch:
        return
    crcs = crc32c_many([r[2] for r in batch])
    for (index, offset, data, stored), crc in zip(batch, crcs):
        if mask(crc) != stored:
            raise _crc_error(path, index, offset, "data")
        yield data
    batch.clear()


def read_examples(path: str | os.PathLike, verify_crc: bool = True) -> Iterator[dict[str, np.ndarray]]:
    """Yield the `tf.train.Example` records of a TFRecord file as dicts of arrays.

    Args:
        path: the file.
        verify_crc: check the CRCs of the framing (see `read_records`).

    Yields:
        Feature name -> 1-D array (int64_list -> np.int64, float_list -> np.float32, bytes_list -> object
        array of bytes), one dict per record, in file order.

    Raises:
        InputError: the file is missing, truncated, corrupt, or a record is not an Example.
    """
    path_str = str(path)
    for index, record in enumerate(read_records(path, verify_crc)):
        yield decode_example(record, path_str, index)
