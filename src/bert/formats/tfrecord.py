"""TFRecord files of `tf.train.Example` records, read and written without TensorFlow or protobuf.

This is the format the original's pre-training data is in: create_pretraining_data.py writes it
(`write_instance_to_example_files`) and run_pretraining.py reads it (`input_fn_builder`, `_decode_record`).

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

The wire format itself (varints, keys, packed lists) is `bert.formats.protobuf`. Speed: packed lists and
floats are encoded and decoded with NumPy (`encode_pretraining_examples` does a whole batch of records at
once), and the writer computes the CRCs of many records together (`bert.formats.crc32c.crc32c_many`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from bert.errors import InputError
from bert.formats.crc32c import crc32c_many, mask, masked_crc32c
from bert.formats.protobuf import (
    I32,
    LEN,
    VARINT,
    DecodeError,
    decode_packed_varints,
    encode_packed_varint_rows,
    encode_packed_varints,
    iter_fields,
    len_header,
    length_delimited,
    to_int64,
)
from bert.utils import atomic_write

__all__ = [
    "TFRecordWriter",
    "decode_example",
    "encode_example",
    "encode_pretraining_examples",
    "frame_records",
    "read_examples",
    "read_records",
    "write_examples",
]

FEATURE_TYPES = ("int64", "float", "bytes")
_BYTES_LIST, _FLOAT_LIST, _INT64_LIST = 1, 2, 3  # the field numbers of Feature's oneof kind

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
    """A Feature: its one list field, whose values are field 1 (packed for numbers)."""
    if kind == "int64":
        try:
            packed = encode_packed_varints(values)
        except TypeError as e:
            raise TypeError(
                f"an int64 feature needs integer values ({e}); for floats, make the first value a float or pass "
                "feature_types"
            ) from None
        return length_delimited(_INT64_LIST, length_delimited(1, packed) if packed else b"")
    if kind == "float":
        data = np.asarray(values, dtype="<f4").tobytes()
        return length_delimited(_FLOAT_LIST, length_delimited(1, data) if data else b"")
    if kind == "bytes":
        if isinstance(values, (bytes, str)):
            values = [values]
        items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values]
        return length_delimited(_BYTES_LIST, b"".join([length_delimited(1, v) for v in items]))
    raise ValueError(f"unknown feature type {kind!r}; use one of {FEATURE_TYPES}")


def encode_example(features: Mapping[str, Any], feature_types: Mapping[str, str] | None = None) -> bytes:
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
        entry = length_delimited(1, name.encode("utf-8")) + length_delimited(2, feature)  # map entry: key, value
        parts.append(length_delimited(1, entry))  # Features.feature = 1
    return length_delimited(1, b"".join(parts))  # Example.features = 1


# ----------------------------------------------------------------------------------------------------
# Example decoding: each message is walked field by field; the fields we know are read, any other is skipped.


def _bad_example(path: str, index: int, why: str) -> InputError:
    return InputError(
        f"{path}: record {index} is not a valid tf.train.Example ({why}); "
        "the file is corrupt or is not a TFRecord file of tf.train.Example records"
    )


def _decode_list(payload: bytes, kind: int) -> np.ndarray:
    """Values of an Int64List (kind 3), FloatList (2) or BytesList (1): its field 1, packed or not."""
    pieces = []
    for field, wire, value in iter_fields(payload):
        if field != 1:
            continue
        if wire == LEN:  # packed numbers, or one bytes value
            if kind == _INT64_LIST:
                pieces.append(decode_packed_varints(value))
            elif kind == _FLOAT_LIST:
                if len(value) % 4:
                    raise DecodeError("a packed float list is not a multiple of 4 bytes")
                pieces.append(np.frombuffer(value, dtype="<f4"))
            else:
                pieces.append(value)
        elif wire == VARINT and kind == _INT64_LIST:  # one unpacked int64
            pieces.append(np.array([to_int64(value)], dtype=np.int64))
        elif wire == I32 and kind == _FLOAT_LIST:  # one unpacked float
            pieces.append(np.frombuffer(value, dtype="<f4"))
    if kind == _BYTES_LIST:
        out = np.empty(len(pieces), dtype=object)
        out[:] = pieces
        return out
    if kind == _INT64_LIST:
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces or [np.zeros(0, np.int64)])
    return np.concatenate(pieces, dtype=np.float32) if pieces else np.zeros(0, dtype=np.float32)


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
    out: dict[str, np.ndarray] = {}
    try:
        for field, wire, features in iter_fields(bytes(data)):
            if field != 1 or wire != LEN:  # Example.features = 1
                continue
            for field, wire, entry in iter_fields(features):
                if field != 1 or wire != LEN:  # Features.feature = 1: map entries
                    continue
                name = ""
                value = None
                for field, wire, v in iter_fields(entry):
                    if field == 1 and wire == LEN:  # key
                        name = v.decode("utf-8")
                    elif field == 2 and wire == LEN:  # value: a Feature
                        for kind, wire, values in iter_fields(v):
                            if wire == LEN and _BYTES_LIST <= kind <= _INT64_LIST:
                                value = _decode_list(values, kind)  # the last one set wins (a oneof)
                # A Feature with no kind set reads as an empty list, as in TF.
                out[name] = np.zeros(0, dtype=np.float32) if value is None else value
    except (DecodeError, UnicodeDecodeError) as e:
        raise _bad_example(path, index, str(e)) from None
    return out


# ----------------------------------------------------------------------------------------------------
# Pre-training records.

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
            data, sizes = encode_packed_varint_rows(values)
        name_field = length_delimited(1, name.encode())
        list_field = _FLOAT_LIST if kind == "float" else _INT64_LIST
        cache: dict[int, bytes] = {}
        for size in np.unique(sizes).tolist():
            # All but the payload of: map entry {key = name, value = Feature {kind {value = payload (packed)}}}
            inner = len_header(1, size) if size else b""
            feature = len_header(list_field, len(inner) + size) + inner
            entry = name_field + len_header(2, len(feature) + size) + feature
            cache[size] = len_header(1, len(entry) + size) + entry
        size_list = sizes.tolist()
        headers = [cache[x] for x in size_list]
        ends = np.cumsum(sizes).tolist()
        starts = [0, *ends[:-1]]
        columns.append(headers)
        columns.append([data[a:b] for a, b in zip(starts, ends)])
        total += sizes + np.array([len(h) for h in cache.values()])[np.searchsorted(list(cache), sizes)]
    prefix_cache = {t: len_header(1, t) for t in np.unique(total).tolist()}  # Example.features = 1
    prefixes = [prefix_cache[t] for t in total.tolist()]
    return list(map(b"".join, zip(prefixes, *columns)))


# ----------------------------------------------------------------------------------------------------
# Framing.

_HEADER = struct.Struct("<QI")
_BATCH_RECORDS = 512
_BATCH_BYTES = 1 << 22


def frame_records(payloads: list[bytes], header_cache: dict[int, bytes] | None = None) -> bytes:
    """The TFRecord framing of records, back to back (their CRCs are computed together).

    Args:
        payloads: the records' data.
        header_cache: record length -> its framing header, kept between calls by a writer.
    """
    if header_cache is None:
        header_cache = {}
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
            self._file.write(frame_records(self._pending, self._headers))
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
