"""TensorFlow "V2" checkpoints (tensor bundles), read and written without TensorFlow or protobuf.

A checkpoint `<prefix>` is (tensorflow/core/util/tensor_bundle/tensor_bundle.cc):

- `<prefix>.index`: an SSTable (the LevelDB table format) mapping each variable name to a
  `BundleEntryProto` (dtype, shape, shard, offset, size, masked CRC-32C of its bytes). The entry with the
  empty key is the `BundleHeaderProto` (number of shards, endianness, format version).
- `<prefix>.data-0000K-of-0000N`: the raw tensor bytes, little-endian, row-major, at the entry's offset.
- `checkpoint`, beside them: a text file naming the newest prefix (`model_checkpoint_path: "..."`).

The SSTable layout, all integers little-endian (LevelDB's `table_format.md`):

    data block* | metaindex block | index block | footer (48 bytes)
    block:   entries | uint32 restart offsets[R] | uint32 R | trailer: uint8 compression, uint32 masked crc
    entry:   varint shared | varint unshared | varint value length | key[shared:] | value
    footer:  BlockHandle metaindex | BlockHandle index | zero padding to 40 bytes | uint64 magic
    BlockHandle: varint offset | varint size;  magic = 0xdb4775248b80fb57

Keys are prefix-compressed against the previous key; every 16th key (a restart point) is stored whole.
The index block holds one entry per data block: a key >= the block's last key, then its BlockHandle.
TensorFlow writes blocks uncompressed; a Snappy-compressed table is refused with a clear error.

`write_checkpoint` produces the files TensorFlow's `BundleWriter` does, byte for byte for the same tensors
in the same order (same block size, restart interval and index key shortening), so TensorFlow reads them.
"""

from __future__ import annotations

import codecs
import os
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert.errors import InputError
from bert.formats.crc32c import crc32c, mask, masked_crc32c
from bert.formats.protobuf import (
    I32,
    LEN,
    VARINT,
    DecodeError,
    decode_packed_varints,
    encode_packed_varints,
    encode_varint,
    field_key,
    iter_fields,
    length_delimited,
    read_varint,
    to_int64,
    varint_field,
)
from bert.utils import atomic_write

__all__ = ["list_variables", "load_variables", "resolve_checkpoint_prefix", "write_checkpoint"]

_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48
_BLOCK_SIZE = 262144  # table::Options defaults (tensorflow/core/lib/io/table_options.h)
_RESTART_INTERVAL = 16
_BUNDLE_VERSION = 1  # kTensorBundleVersion: what this reader understands and this writer declares

# TensorFlow DataType enum (types.proto) -> (our name, little-endian numpy dtype or None).
_DTYPES: dict[int, tuple[str, str | None]] = {
    1: ("float32", "<f4"),
    2: ("float64", "<f8"),
    3: ("int32", "<i4"),
    4: ("uint8", "u1"),
    5: ("int16", "<i2"),
    6: ("int8", "i1"),
    7: ("string", None),
    8: ("complex64", "<c8"),
    9: ("int64", "<i8"),
    10: ("bool", "?"),
    14: ("bfloat16", "<u2"),  # loaded as float32: see load_variables
    17: ("uint16", "<u2"),
    18: ("complex128", "<c16"),
    19: ("float16", "<f2"),
    22: ("uint32", "<u4"),
    23: ("uint64", "<u8"),
}
_DT_STRING = 7
_DT_BFLOAT16 = 14
_NUMPY_TO_DT = {
    np.dtype(v).newbyteorder("=") if v not in ("?", "u1", "i1") else np.dtype(v): k
    for k, (_, v) in _DTYPES.items()
    if v is not None and k != _DT_BFLOAT16
}

# ----------------------------------------------------------------------------------------------------
# BundleHeaderProto and BundleEntryProto (tensorflow/core/protobuf/tensor_bundle.proto).


class _Corrupt(Exception):
    """A structural problem in the index file; turned into an InputError naming the file."""


class _Compressed(Exception):
    """A Snappy-compressed block."""


@dataclass
class _Entry:
    """A BundleEntryProto."""

    dtype: int = 0
    shape: tuple[int, ...] = ()
    shard_id: int = 0
    offset: int = 0
    size: int = 0
    crc32c: int = 0
    has_slices: bool = False

    @property
    def dtype_name(self) -> str:
        return _DTYPES.get(self.dtype, (f"dtype{self.dtype}", None))[0]


def _parse_shape(buf: bytes) -> tuple[int, ...]:
    """A TensorShapeProto: { repeated Dim dim = 2; bool unknown_rank = 3; }, Dim { int64 size = 1; ... }."""
    dims = []
    for field, wire, value in iter_fields(buf):
        if field == 2 and wire == LEN:
            size = 0
            for f2, w2, v2 in iter_fields(value):
                if f2 == 1 and w2 == VARINT:
                    size = to_int64(v2)
            dims.append(size)
        elif field == 3 and wire == VARINT and value:
            raise _Corrupt("a variable has a shape of unknown rank")
    if any(d < 0 for d in dims):
        raise _Corrupt(f"a variable has an invalid shape {tuple(dims)}")
    return tuple(dims)


def _parse_entry(buf: bytes) -> _Entry:
    e = _Entry()
    for field, wire, value in iter_fields(buf):
        if wire == VARINT:
            if field == 1:
                e.dtype = value
            elif field == 3:
                e.shard_id = value
            elif field == 4:
                e.offset = to_int64(value)
            elif field == 5:
                e.size = to_int64(value)
        elif wire == LEN:
            if field == 2:
                e.shape = _parse_shape(value)
            elif field == 7:  # repeated TensorSliceProto slices
                e.has_slices = True
        elif wire == I32 and field == 6:
            e.crc32c = int.from_bytes(value, "little")
    return e


def _encode_entry(dtype: int, shape: tuple[int, ...], offset: int, size: int, crc: int) -> bytes:
    """A BundleEntryProto as protobuf serializes it: fields in number order, zero scalars omitted."""
    dims = b"".join(length_delimited(2, varint_field(1, s) if s else b"") for s in shape)  # Dim { size = 1 }
    out = varint_field(1, dtype) + length_delimited(2, dims)
    if offset:
        out += varint_field(4, offset)
    if size:
        out += varint_field(5, size)
    return out + field_key(6, I32) + struct.pack("<I", crc)


# BundleHeaderProto{num_shards: 1, endianness: LITTLE (0, omitted), version: VersionDef{producer: 1}}
_HEADER_ENTRY = varint_field(1, 1) + length_delimited(3, varint_field(1, _BUNDLE_VERSION))

# ----------------------------------------------------------------------------------------------------
# SSTable reading.


def _read_block(data: bytes, offset: int, size: int) -> bytes:
    if offset + size + 5 > len(data):
        raise _Corrupt(f"a block (offset {offset}, size {size}) runs past the end of the file")
    block = data[offset : offset + size]
    kind = data[offset + size]
    (stored,) = struct.unpack_from("<I", data, offset + size + 1)
    if masked_crc32c(data[offset : offset + size + 1]) != stored:
        raise _Corrupt(f"crc mismatch in the block at offset {offset}")
    if kind == 1:
        raise _Compressed()
    if kind != 0:
        raise _Corrupt(f"unknown block compression type {kind}")
    return block


def _block_entries(block: bytes) -> list[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise _Corrupt("a block is shorter than its restart count")
    (num_restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    limit = len(block) - 4 - 4 * num_restarts
    if limit < 0:
        raise _Corrupt("a block's restart array is larger than the block")
    entries = []
    key = b""
    i = 0
    while i < limit:
        shared, i = read_varint(block, i, limit)
        unshared, i = read_varint(block, i, limit)
        value_len, i = read_varint(block, i, limit)
        if shared > len(key) or i + unshared + value_len > limit:
            raise _Corrupt("a block entry is malformed")
        key = key[:shared] + block[i : i + unshared]
        i += unshared
        entries.append((key, block[i : i + value_len]))
        i += value_len
    return entries


def _read_table(path: str) -> list[tuple[bytes, bytes]]:
    """All (key, value) pairs of an SSTable file, in key order."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path} does not exist; a TensorFlow checkpoint needs its .index file") from None
    if len(data) < _FOOTER_SIZE or struct.unpack_from("<Q", data, len(data) - 8)[0] != _TABLE_MAGIC:
        raise InputError(
            f"{path} is not a TensorFlow checkpoint index (not an SSTable: bad magic number at its end); "
            "pass the .index file of a TF V2 checkpoint, or re-copy it if it was truncated"
        )
    try:
        footer = data[len(data) - _FOOTER_SIZE :]
        i = 0
        _, i = read_varint(footer, i)  # metaindex offset: TF writes an empty metaindex block
        _, i = read_varint(footer, i)
        index_offset, i = read_varint(footer, i)
        index_size, i = read_varint(footer, i)
        entries = []
        for _, handle in _block_entries(_read_block(data, index_offset, index_size)):
            offset, j = read_varint(handle, 0)
            size, _ = read_varint(handle, j)
            entries.extend(_block_entries(_read_block(data, offset, size)))
    except (_Corrupt, DecodeError) as e:
        raise InputError(f"checkpoint file {path} is corrupt: {e}; re-copy or re-save the checkpoint") from None
    except _Compressed:
        raise InputError(
            f"{path} uses Snappy-compressed blocks, which this reader does not support; re-save the "
            "checkpoint with TensorFlow's default (uncompressed) tf.train.Saver / tf.train.Checkpoint"
        ) from None
    return entries


# ----------------------------------------------------------------------------------------------------
# SSTable writing, mirroring tensorflow/core/lib/io/{block_builder,table_builder}.cc.


def _shortest_separator(start: bytes, limit: bytes) -> bytes:
    """A short key k with start <= k < limit (LevelDB's BytewiseComparator::FindShortestSeparator)."""
    n = min(len(start), len(limit))
    i = 0
    while i < n and start[i] == limit[i]:
        i += 1
    if i < n and start[i] < 0xFF and start[i] + 1 < limit[i]:
        return start[:i] + bytes((start[i] + 1,))
    return start


def _short_successor(key: bytes) -> bytes:
    """A short key k >= key (FindShortSuccessor)."""
    for i, b in enumerate(key):
        if b != 0xFF:
            return key[:i] + bytes((b + 1,))
    return key


class _BlockBuilder:
    def __init__(self, restart_interval: int):
        self.restart_interval = restart_interval
        self.reset()

    def reset(self) -> None:
        self.buf = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.restart_interval:
            n = min(len(self.last_key), len(key))
            while shared < n and self.last_key[shared] == key[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buf))
            self.counter = 0
        self.buf += encode_varint(shared) + encode_varint(len(key) - shared) + encode_varint(len(value))
        self.buf += key[shared:] + value
        self.last_key = key
        self.counter += 1

    def size_estimate(self) -> int:
        return len(self.buf) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        return bytes(self.buf) + struct.pack(f"<{len(self.restarts) + 1}I", *self.restarts, len(self.restarts))

    @property
    def empty(self) -> bool:
        return not self.buf


def _build_table(items: Iterable[tuple[bytes, bytes]]) -> bytes:
    """An uncompressed SSTable holding `items` (which must be in strictly increasing key order)."""
    out = bytearray()

    def write_block(block: _BlockBuilder) -> bytes:
        raw = block.finish()
        handle = encode_varint(len(out)) + encode_varint(len(raw))
        out.extend(raw)
        out.extend(b"\x00" + struct.pack("<I", mask(crc32c(b"\x00", crc32c(raw)))))
        block.reset()
        return handle

    data_block = _BlockBuilder(_RESTART_INTERVAL)
    index_block = _BlockBuilder(1)
    pending_handle = None
    last_key = b""
    for key, value in items:
        if pending_handle is not None:
            index_block.add(_shortest_separator(last_key, key), pending_handle)
            pending_handle = None
        data_block.add(key, value)
        last_key = key
        if data_block.size_estimate() >= _BLOCK_SIZE:
            pending_handle = write_block(data_block)
    if not data_block.empty:
        pending_handle = write_block(data_block)
    metaindex_handle = write_block(_BlockBuilder(_RESTART_INTERVAL))
    if pending_handle is not None:
        index_block.add(_short_successor(last_key), pending_handle)
    index_handle = write_block(index_block)
    footer = (metaindex_handle + index_handle).ljust(40, b"\x00") + struct.pack("<Q", _TABLE_MAGIC)
    out.extend(footer)
    return bytes(out)


# ----------------------------------------------------------------------------------------------------
# Locating a checkpoint.

_DATA_SUFFIX = re.compile(r"\.data-\d{5}-of-\d{5}$")


def _data_path(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def _read_checkpoint_state(path: Path) -> str | None:
    """model_checkpoint_path from a `checkpoint` text file (a CheckpointState proto in text format)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    m = re.search(r'^\s*model_checkpoint_path\s*:\s*"((?:[^"\\]|\\.)*)"', text, re.MULTILINE)
    if not m:
        return None
    return codecs.escape_decode(m.group(1).encode("utf-8"))[0].decode("utf-8")


def _prefix_in_directory(p: Path) -> str:
    """The checkpoint a directory's `checkpoint` file names, else its one `*.index`."""
    state = p / "checkpoint"
    if state.is_file():
        named = _read_checkpoint_state(state)
        if named is None:
            raise InputError(f"{state} has no model_checkpoint_path line; pass the checkpoint prefix instead")
        candidates = [Path(named) if Path(named).is_absolute() else p / named, p / Path(named).name]
        for c in candidates:
            if Path(f"{c}.index").is_file():
                return str(c)
        raise InputError(
            f"{state} names model_checkpoint_path {named!r}, but {candidates[0]}.index does not exist; "
            "pass the prefix of a checkpoint that exists (e.g. .../model.ckpt-1000)"
        )
    indexes = sorted(p.glob("*.index"))
    if len(indexes) == 1:
        return str(indexes[0])[: -len(".index")]
    if not indexes:
        raise InputError(
            f"no TensorFlow checkpoint in {p}: it has no `checkpoint` file and no *.index file; "
            "pass the directory of a TF checkpoint or its prefix"
        )
    names = ", ".join(i.name for i in indexes[:5])
    raise InputError(
        f"{p} holds several checkpoints ({names}{', ...' if len(indexes) > 5 else ''}) and no `checkpoint` "
        "file saying which is current; pass the prefix of one, e.g. "
        f"{str(indexes[-1])[: -len('.index')]}"
    )


def resolve_checkpoint_prefix(path: str | os.PathLike) -> str:
    """The prefix of a TF checkpoint given in any of the usual ways.

    Args:
        path: a directory (its `checkpoint` file names the checkpoint; without one, the directory must hold
            exactly one `*.index`), a prefix such as `.../bert_model.ckpt`, or the path of the `.index`,
            a `.data-*` or the `.meta` file.

    Returns:
        The prefix: `<prefix>.index` exists.

    Raises:
        InputError: nothing usable there; the message says what is missing.
    """
    p = Path(path)
    if p.is_dir():
        return _prefix_in_directory(p)
    s = str(p)
    if s.endswith(".index"):
        prefix = s[: -len(".index")]
    elif _DATA_SUFFIX.search(s):
        prefix = _DATA_SUFFIX.sub("", s)
    elif s.endswith(".meta"):
        prefix = s[: -len(".meta")]
    else:
        prefix = s
    if Path(f"{prefix}.index").is_file():
        return prefix
    data_files = sorted(Path(prefix).parent.glob(Path(prefix).name + ".data-*")) if Path(prefix).name else []
    if data_files:
        raise InputError(
            f"checkpoint {prefix} is incomplete: {prefix}.index is missing (found {data_files[0].name}); "
            "copy the .index file next to the .data files"
        )
    raise InputError(
        f"no TensorFlow checkpoint at {path}: {prefix}.index does not exist; pass a checkpoint directory, "
        "a prefix such as .../bert_model.ckpt, or its .index file"
    )


# ----------------------------------------------------------------------------------------------------
# Reading.


def _read_bundle(prefix: str) -> tuple[int, bool, dict[str, _Entry]]:
    """(num_shards, big_endian, entries by name) of the checkpoint at `prefix`."""
    index_path = f"{prefix}.index"
    pairs = _read_table(index_path)
    if not pairs or pairs[0][0] != b"":
        raise InputError(f"checkpoint file {index_path} is corrupt: it has no header entry; re-save the checkpoint")
    num_shards, big_endian = 0, False
    producer = min_consumer = 0
    bad_consumers = []
    try:
        for field, wire, value in iter_fields(pairs[0][1]):
            if field == 1 and wire == VARINT:
                num_shards = value
            elif field == 2 and wire == VARINT:
                big_endian = value == 1
            elif field == 3 and wire == LEN:  # VersionDef
                for f2, w2, v2 in iter_fields(value):
                    if f2 == 1 and w2 == VARINT:
                        producer = v2
                    elif f2 == 2 and w2 == VARINT:
                        min_consumer = v2
                    elif f2 == 3 and w2 == VARINT:
                        bad_consumers.append(v2)
                    elif f2 == 3 and w2 == LEN:  # repeated int32, packed
                        bad_consumers.extend(decode_packed_varints(v2).tolist())
        entries = {}
        for key, value in pairs[1:]:
            if key.startswith(b"\x00"):  # the stored pieces of a partitioned variable
                continue
            entries[key.decode("utf-8")] = _parse_entry(value)
    except (_Corrupt, DecodeError, UnicodeDecodeError) as e:
        raise InputError(f"checkpoint file {index_path} is corrupt: {e}; re-copy or re-save the checkpoint") from None
    if min_consumer > _BUNDLE_VERSION or _BUNDLE_VERSION in bad_consumers:
        raise InputError(
            f"{index_path} was written by a newer TensorFlow (bundle format producer {producer}, needs a reader "
            f"of version >= {min_consumer}); this reader supports version {_BUNDLE_VERSION}"
        )
    if num_shards < 1:
        raise InputError(f"checkpoint file {index_path} is corrupt: its header says {num_shards} shards")
    return num_shards, big_endian, entries


def list_variables(path: str | os.PathLike) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The variables of a TF checkpoint, without reading their values.

    Args:
        path: the checkpoint (any form `resolve_checkpoint_prefix` accepts).

    Returns:
        Name -> (dtype name such as "float32", "int64", "bfloat16", "string"; shape), in name order.
    """
    _, _, entries = _read_bundle(resolve_checkpoint_prefix(path))
    return {name: (e.dtype_name, e.shape) for name, e in entries.items()}


def _decode_strings(buf: bytes, count: int, big_endian: bool, where: str) -> tuple[np.ndarray, int]:
    """A DT_STRING tensor's bytes -> (object array of bytes, its crc as TF computes it)."""
    order = ">" if big_endian else "<"
    lengths = []
    crc = 0
    i = 0
    try:
        for _ in range(count):
            n, i = read_varint(buf, i)
            lengths.append(n)
            crc = crc32c(struct.pack(f"{order}I", n) if n <= 0xFFFFFFFF else struct.pack(f"{order}Q", n), crc)
    except DecodeError:
        raise InputError(f"{where}: the string lengths run past the stored size") from None
    if i + 4 > len(buf):
        raise InputError(f"{where}: the string lengths run past the stored size")
    raw_length_crc = buf[i : i + 4]
    (length_crc,) = struct.unpack(f"{order}I", raw_length_crc)
    if mask(crc) != length_crc:
        raise InputError(f"{where}: crc mismatch in the string lengths")
    crc = crc32c(raw_length_crc, crc)
    i += 4
    out = np.empty(count, dtype=object)
    for k, n in enumerate(lengths):
        if i + n > len(buf):
            raise InputError(f"{where}: the strings run past the stored size")
        out[k] = buf[i : i + n]
        crc = crc32c(out[k], crc)
        i += n
    return out, crc


def load_variables(
    path: str | os.PathLike, names: Iterable[str] | None = None, verify_crc: bool = True
) -> dict[str, np.ndarray]:
    """Read variables of a TF checkpoint into NumPy arrays.

    Args:
        path: the checkpoint (any form `resolve_checkpoint_prefix` accepts).
        names: the variables to read (default: all). Optimizer slots (`*/adam_m`, `*/adam_v`) and
            `global_step` are ordinary variables here; callers that want only weights filter them.
        verify_crc: check each tensor's bytes against the CRC stored in the index (as TensorFlow does).

    Returns:
        Name -> array with the stored shape, in name order. dtypes are kept (float32, float16, int64,
        bool, ...) except bfloat16, which numpy lacks: it is widened exactly to float32. DT_STRING
        variables come back as object arrays of bytes.

    Raises:
        InputError: a file is missing, truncated or corrupt (the message names the file and the variable),
            a name is not in the checkpoint, or a variable uses a feature this reader lacks (partitioned
            variables, unsupported dtypes).
    """
    prefix = resolve_checkpoint_prefix(path)
    num_shards, big_endian, entries = _read_bundle(prefix)
    if names is None:
        wanted = list(entries)
    else:
        wanted = list(names)
        for name in wanted:
            if name not in entries:
                known = ", ".join(list(entries)[:3])
                raise InputError(
                    f"checkpoint {prefix} has no variable {name!r} (it has {len(entries)} variables, e.g. "
                    f"{known}); check the name with list_variables"
                )
    by_shard = _names_by_shard(prefix, wanted, entries, num_shards)
    result: dict[str, np.ndarray] = {}
    for shard, shard_names in sorted(by_shard.items()):
        data_path = _data_path(prefix, shard, num_shards)
        try:
            f = open(data_path, "rb")
        except FileNotFoundError:
            raise InputError(
                f"checkpoint {prefix} is incomplete: its data file {data_path} is missing (the .index is there); "
                "copy the .data-* files next to the .index file"
            ) from None
        with f:
            file_size = os.fstat(f.fileno()).st_size
            for name in sorted(shard_names, key=lambda n: entries[n].offset):
                result[name] = _read_tensor(f, file_size, data_path, name, entries[name], big_endian, verify_crc)
    return {name: result[name] for name in wanted}


def _names_by_shard(
    prefix: str, wanted: list[str], entries: dict[str, _Entry], num_shards: int
) -> dict[int, list[str]]:
    """The variables to read per data file, each checked readable by this reader."""
    by_shard: dict[int, list[str]] = {}
    for name in wanted:
        e = entries[name]
        if e.has_slices:
            raise InputError(
                f"checkpoint {prefix}: variable {name!r} is partitioned into slices, which this reader does not "
                "support; re-save it unpartitioned"
            )
        if e.dtype not in _DTYPES:
            raise InputError(
                f"checkpoint {prefix}: variable {name!r} has TensorFlow dtype {e.dtype}, which this reader does "
                "not support"
            )
        if e.shard_id >= num_shards:
            raise InputError(f"checkpoint file {prefix}.index is corrupt: variable {name!r} is in shard {e.shard_id}")
        by_shard.setdefault(e.shard_id, []).append(name)
    return by_shard


def _read_tensor(f, file_size: int, data_path: str, name: str, e: _Entry, big_endian: bool, verify: bool):
    if e.offset < 0 or e.size < 0 or e.offset + e.size > file_size:
        raise InputError(
            f"checkpoint file {data_path} is truncated: variable {name} needs bytes {e.offset}..{e.offset + e.size} "
            f"but the file has {file_size} bytes; re-copy the checkpoint"
        )
    count = int(np.prod(e.shape, dtype=np.int64))
    f.seek(e.offset)
    buf = np.empty(e.size, dtype=np.uint8)
    if f.readinto(buf.data) != e.size:
        raise InputError(f"checkpoint file {data_path} is truncated: variable {name} could not be read whole")
    where = f"checkpoint file {data_path} is corrupt: variable {name}"
    if e.dtype == _DT_STRING:
        if e.size == 0:
            values = np.full(count, b"", dtype=object)
            crc = 0
        else:
            values, crc = _decode_strings(buf.tobytes(), count, big_endian, where)
        if verify and mask(crc) != e.crc32c:
            raise InputError(f"checkpoint file {data_path} is corrupt: crc mismatch for variable {name}")
        return values.reshape(e.shape)
    np_dtype = np.dtype(_DTYPES[e.dtype][1])
    if count * np_dtype.itemsize != e.size:
        raise InputError(
            f"{where} has {e.size} bytes, but shape {e.shape} of {e.dtype_name} needs {count * np_dtype.itemsize}"
        )
    if verify and masked_crc32c(buf) != e.crc32c:
        raise InputError(f"checkpoint file {data_path} is corrupt: crc mismatch for variable {name}")
    if big_endian:
        np_dtype = np_dtype.newbyteorder(">")
    arr = buf.view(np_dtype).reshape(e.shape)
    if e.dtype == _DT_BFLOAT16:  # bfloat16 is the top half of a float32
        return (arr.astype(np.uint32) << 16).view(np.float32)
    if arr.dtype.byteorder not in ("=", "|"):
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


# ----------------------------------------------------------------------------------------------------
# Writing.


def _tensor_bytes(name: str, value) -> tuple[int, tuple[int, ...], list, int]:
    """(TF dtype, shape, byte pieces to write, crc) of one tensor, as BundleWriter::Add computes them."""
    bfloat16 = False
    if hasattr(value, "detach"):  # a torch tensor (torch is not imported here)
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            bfloat16 = True
            import torch  # already imported by whoever made the tensor

            value = value.contiguous().view(torch.int16)
        value = value.numpy()
    arr = np.asarray(value)
    shape = tuple(int(d) for d in arr.shape)
    if arr.dtype.kind in "SO":
        items = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in arr.reshape(-1).tolist()]
        lengths = encode_packed_varints([len(v) for v in items])
        crc = 0
        for v in items:
            crc = crc32c(struct.pack("<I", len(v)) if len(v) <= 0xFFFFFFFF else struct.pack("<Q", len(v)), crc)
        length_crc = struct.pack("<I", mask(crc))
        crc = crc32c(length_crc, crc)
        for v in items:
            crc = crc32c(v, crc)
        return _DT_STRING, shape, [lengths, length_crc, *items], crc
    dt: int | None
    if bfloat16 or arr.dtype.name == "bfloat16":  # a torch bfloat16 tensor or ml_dtypes.bfloat16
        dt = _DT_BFLOAT16
        arr = np.ascontiguousarray(arr).view(np.uint16)
    else:
        native = arr.dtype.newbyteorder("=") if arr.dtype.byteorder != "|" else arr.dtype
        dt = _NUMPY_TO_DT.get(native)
        if dt is None:
            raise TypeError(f"variable {name!r}: cannot store dtype {arr.dtype} in a TF checkpoint")
    le = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<") if arr.dtype.byteorder != "|" else arr.dtype)
    data = le.reshape(-1).view(np.uint8)
    return dt, shape, [data], crc32c(data)


def write_checkpoint(prefix: str | os.PathLike, tensors: Mapping[str, object]) -> str:
    """Write a single-shard TF V2 checkpoint that TensorFlow (and `load_variables`) can read.

    Writes `<prefix>.data-00000-of-00001`, then `<prefix>.index`, then the directory's `checkpoint` file
    naming this prefix, each atomically. Variables are stored in name order; the bytes match what TF's
    BundleWriter writes for the same tensors added in that order.

    Args:
        prefix: the checkpoint prefix, e.g. `out/model.ckpt`; its directory is created if needed.
        tensors: name -> NumPy array (or anything `np.asarray` takes; CPU torch tensors too). Any dtype of
            the TF list (float16/32/64, bfloat16 via ml_dtypes, int8..64, uint8..64, bool, complex) and
            bytes/str arrays (DT_STRING).

    Returns:
        The prefix, as a string.
    """
    prefix = str(prefix)
    if not Path(prefix).name:
        raise InputError(f"checkpoint prefix {prefix!r} has no file name part; use e.g. {prefix}model.ckpt")
    for name in tensors:
        if not isinstance(name, str) or not name or name.startswith("\x00"):
            raise ValueError(f"invalid checkpoint variable name {name!r}")
    names = sorted(tensors, key=lambda n: n.encode("utf-8"))
    index_items = [(b"", _HEADER_ENTRY)]
    offset = 0
    with atomic_write(_data_path(prefix, 0, 1), "wb") as f:
        for name in names:
            dt, shape, pieces, crc = _tensor_bytes(name, tensors[name])
            size = sum(len(p) for p in pieces)
            for p in pieces:
                f.write(p)
            index_items.append((name.encode("utf-8"), _encode_entry(dt, shape, offset, size, mask(crc))))
            offset += size
    with atomic_write(f"{prefix}.index", "wb") as f:
        f.write(_build_table(index_items))
    base = Path(prefix).name.replace("\\", "\\\\").replace('"', '\\"')
    with atomic_write(Path(prefix).parent / "checkpoint") as f:
        f.write(f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n')
    return prefix
