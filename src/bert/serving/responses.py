"""`JSONResponse`: every JSON answer of the server, written by orjson."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from starlette.responses import JSONResponse as StarletteJSONResponse


def _array(value: Any) -> Any:
    # orjson hands over the arrays it does not write itself (not C-contiguous, or an unsupported dtype).
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError  # orjson names the type


class JSONResponse(StarletteJSONResponse):
    """Starlette's JSON response, rendered by orjson rather than the standard library's encoder, which spends
    ~155 us on one 384-float vector (a Python float's repr per number) where orjson takes ~7 us: the event loop
    holds the GIL while it encodes, and under load the model thread waits for it between ops. NumPy arrays
    are written as they are, a float32 as the shortest decimal that reads back to the same float32 (as TEI's
    answers write them), half the bytes of its float64 expansion. Like TEI's, a NaN or infinity is written as
    null."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=_array, option=orjson.OPT_SERIALIZE_NUMPY)
