"""TensorBoard event files written without TensorFlow (`bert.formats.tensorboard`)."""

import struct

import numpy as np

from bert.formats.tensorboard import EventWriter, encode_scalar_value, read_events, read_scalars


def test_tensorboard_event_file(tmp_path):
    # The hand-encoded Summary.Value: tag (field 1, length-delimited) and simple_value (field 2, fixed32).
    assert encode_scalar_value("loss", 1.0) == b"\x0a\x04loss\x15" + struct.pack("<f", 1.0)
    with EventWriter(tmp_path) as w:
        w.add_scalars(1, {"loss": 2.5, "learning_rate": 1e-4}, wall_time=100.0)
        w.add_scalars(2, {"loss": 1.25})
    events = read_events(w.path)  # bert.formats.tfrecord checks every length and data CRC
    assert w.path.name.startswith("events.out.tfevents.")
    assert events[0]["file_version"] == "brain.Event:2"
    assert events[1] == {"wall_time": 100.0, "step": 1, "scalars": {"loss": 2.5, "learning_rate": np.float32(1e-4)}}
    assert read_scalars(tmp_path) == {"loss": [(1, 2.5), (2, 1.25)], "learning_rate": [(1, np.float32(1e-4))]}
