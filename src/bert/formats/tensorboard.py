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

from bert.errors import InputError
from bert.formats.protobuf import (
    I32,
    I64,
    LEN,
    VARINT,
    DecodeError,
    field_key,
    iter_fields,
    length_delimited,
    to_int64,
    varint_field,
)
from bert.formats.tfrecord import frame_records, read_records

FILE_VERSION = "brain.Event:2"
_counter = itertools.count()


def encode_scalar_value(tag: str, value: float) -> bytes:
    """`Summary.Value{tag, simple_value}`."""
    return length_delimited(1, tag.encode("utf-8")) + field_key(2, I32) + struct.pack("<f", float(value))


def encode_event(
    wall_time: float, step: int, scalars: dict[str, float] | None = None, file_version: str | None = None
) -> bytes:
    """A serialized `Event` holding either a file version or a summary of scalar values."""
    out = field_key(1, I64) + struct.pack("<d", wall_time) + varint_field(2, int(step))
    if file_version is not None:
        out += length_delimited(3, file_version.encode("utf-8"))
    if scalars:
        summary = b"".join(length_delimited(1, encode_scalar_value(k, v)) for k, v in scalars.items())
        out += length_delimited(5, summary)
    return out


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
        self._file.write(frame_records([data]))
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


def decode_event(data: bytes) -> dict:
    """The fields this module writes: {"wall_time", "step", "file_version"?, "scalars": {tag: value}}.

    Raises:
        DecodeError: the bytes are not a valid Event.
    """
    event: dict = {"wall_time": 0.0, "step": 0, "scalars": {}}
    for field, wire, value in iter_fields(data):
        if field == 1 and wire == I64:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif field == 2 and wire == VARINT:
            event["step"] = to_int64(value)
        elif field == 3 and wire == LEN:
            event["file_version"] = value.decode("utf-8")
        elif field == 5 and wire == LEN:  # Summary
            for f2, w2, v2 in iter_fields(value):
                if f2 != 1 or w2 != LEN:
                    continue
                tag, simple = None, None
                for f3, w3, v3 in iter_fields(v2):  # Summary.Value
                    if f3 == 1 and w3 == LEN:
                        tag = v3.decode("utf-8")
                    elif f3 == 2 and w3 == I32:
                        simple = struct.unpack("<f", v3)[0]
                if tag is not None and simple is not None:
                    event["scalars"][tag] = simple
    return event


def read_events(path: str | os.PathLike) -> list[dict]:
    """Decode every event of an event file (checking the framing CRCs).

    Raises:
        InputError: the file is missing, truncated or corrupt, or a record is not an Event.
    """
    events = []
    for index, record in enumerate(read_records(path)):
        try:
            events.append(decode_event(record))
        except (DecodeError, UnicodeDecodeError) as e:
            raise InputError(
                f"{path}: record {index} is not a valid TensorBoard Event ({e}); the event file is corrupt"
            ) from None
    return events


def read_scalars(logdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """All scalars of the event files directly in `logdir`: tag -> [(step, value), ...] in file order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        for event in read_events(path):
            for tag, value in event["scalars"].items():
                out.setdefault(tag, []).append((event["step"], value))
    return out
