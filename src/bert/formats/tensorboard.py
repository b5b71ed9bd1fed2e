"""TensorBoard scalar event files, written by hand: no tensorboard or protobuf dependency.

An event file is a TFRecord file (see `bert.formats.tfrecord`): each record is framed as

    uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

and each record's data is a serialized `Event` (tensorflow/core/util/event.proto, summary.proto):

    Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }

The first record of a file is the version event (`file_version = "brain.Event:2"`), as TensorFlow's
writer emits. File names follow TensorFlow's `events.out.tfevents.<unix time>.<host>.<pid>.<n>`, so
`tensorboard --logdir output_dir` finds them (the Estimator wrote training scalars to `output_dir` and
evaluation scalars to `output_dir/eval`).
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from pathlib import Path

from bert.formats.crc32c import masked_crc32c
from bert.formats.tfrecord import read_records

FILE_VERSION = "brain.Event:2"
_counter = itertools.count()


def _varint(v: int) -> bytes:
    if v < 0:
        v += 1 << 64  # int64 two's complement, as protobuf encodes negative int64 values
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def encode_scalar_value(tag: str, value: float) -> bytes:
    """`Summary.Value{tag, simple_value}`."""
    return _length_delimited(1, tag.encode("utf-8")) + _key(2, 5) + struct.pack("<f", float(value))


def encode_event(
    wall_time: float, step: int, scalars: dict[str, float] | None = None, file_version: str | None = None
) -> bytes:
    """A serialized `Event` holding either a file version or a summary of scalar values."""
    out = _key(1, 1) + struct.pack("<d", wall_time) + _key(2, 0) + _varint(int(step))
    if file_version is not None:
        out += _length_delimited(3, file_version.encode("utf-8"))
    if scalars:
        summary = b"".join(_length_delimited(1, encode_scalar_value(k, v)) for k, v in scalars.items())
        out += _length_delimited(5, summary)
    return out


def frame_record(data: bytes) -> bytes:
    """TFRecord framing of one record."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


class EventWriter:
    """Appends scalar summaries to a new event file in `logdir`.

    Args:
        logdir: directory of the event file (created if missing).
    """

    def __init__(self, logdir: str | os.PathLike):
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_counter)}"
        self.path = self.logdir / name
        self._file = open(self.path, "ab")
        self._write(encode_event(time.time(), 0, file_version=FILE_VERSION))

    def _write(self, data: bytes) -> None:
        self._file.write(frame_record(data))
        self._file.flush()

    def add_scalars(self, step: int, scalars: dict[str, float], wall_time: float | None = None) -> None:
        """Write one event with a value per tag at `step` (values are stored as float32)."""
        self._write(encode_event(time.time() if wall_time is None else wall_time, step, scalars))

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a message: ints for varint/fixed, bytes for length-delimited."""
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        elif wire == 2:
            n, i = _read_varint(buf, i)
            value, i = buf[i : i + n], i + n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, wire, value


def decode_event(data: bytes) -> dict:
    """The fields this module writes: {"wall_time", "step", "file_version"?, "scalars": {tag: value}}."""
    event: dict = {"wall_time": 0.0, "step": 0, "scalars": {}}
    for field, _, value in _fields(data):
        if field == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif field == 2:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif field == 3:
            event["file_version"] = value.decode("utf-8")
        elif field == 5:
            for f2, _, v2 in _fields(value):
                if f2 != 1:
                    continue
                tag, simple = None, None
                for f3, w3, v3 in _fields(v2):
                    if f3 == 1:
                        tag = v3.decode("utf-8")
                    elif f3 == 2 and w3 == 5:
                        simple = struct.unpack("<f", v3)[0]
                if tag is not None and simple is not None:
                    event["scalars"][tag] = simple
    return event


def read_events(path: str | os.PathLike) -> list[dict]:
    """Decode every event of an event file (checking the framing CRCs)."""
    return [decode_event(r) for r in read_records(path)]


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """All scalars of the event files directly in `logdir`: tag -> [(step, value), ...] in file order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        for event in read_events(path):
            for tag, value in event["scalars"].items():
                out.setdefault(tag, []).append((event["step"], value))
    return out
