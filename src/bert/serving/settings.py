"""`ServeSettings`: the server's limits and defaults, as `bert serve`'s flags give them."""

from __future__ import annotations

from dataclasses import dataclass

from bert.flags import SERVE_LIMITS


@dataclass
class ServeSettings:
    """The server's limits and defaults (the `bert serve` flags of the same names)."""

    model_id: str
    model_sha: str | None = None  # the commit of a model loaded by its Hub id
    max_batch_tokens: int = SERVE_LIMITS.max_batch_tokens
    max_wait_ms: float = SERVE_LIMITS.max_wait_ms
    max_queue_size: int = SERVE_LIMITS.max_queue_size
    max_client_batch_size: int = SERVE_LIMITS.max_client_batch_size
    max_request_bytes: int = SERVE_LIMITS.max_request_bytes
    quantize: str = "none"
    auto_truncate: bool = False  # the default of "truncate" (TEI's --auto-truncate)
    pooling: str | None = None  # the embedding routes' pooling; None: the model's (`Predictor.default_pooling`)
    api_key: str | None = None  # required as `Authorization: Bearer <key>` on every route but the health checks
    served_model_name: str | None = None  # the name /info and /v1/embeddings give; default: model_id
