"""The server's JSON answers (`bert.serving.responses.JSONResponse`): float32 arrays written as float32's shortest
decimals, which read back to the same float32; arrays orjson does not write itself still written; no NaN."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")
from bert.serving.responses import JSONResponse  # noqa: E402


def test_float32_vectors_are_written_as_their_shortest_decimals():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3, 384)).astype(np.float32)
    body = JSONResponse(list(vectors)).body
    read = np.asarray(json.loads(body))
    assert np.array_equal(read.astype(np.float32), vectors)  # every number reads back to its float32
    # Not the float64 expansion of each float32 (what `tolist()` and the standard library write): those would
    # read back as exact float32 values, and take ~1.7x the bytes.
    assert np.mean(read.astype(np.float32).astype(np.float64) != read) > 0.9
    assert len(body) < 0.7 * len(json.dumps(vectors.tolist(), separators=(",", ":")))


def test_arrays_orjson_cannot_write_itself_are_written_as_lists():
    columns = np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1]  # not C-contiguous
    assert json.loads(JSONResponse({"x": columns, "n": np.int64(3)}).body) == {"x": [1.0, 5.0, 9.0], "n": 3}
    with pytest.raises(TypeError, match="not JSON serializable: set"):
        JSONResponse({1, 2})


def test_nan_and_infinity_are_written_as_null():
    assert json.loads(JSONResponse(np.array([1.0, np.nan, np.inf], dtype=np.float32)).body) == [1.0, None, None]
