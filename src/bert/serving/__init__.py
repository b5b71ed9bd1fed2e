"""An HTTP server around a `bert.inference.Predictor`: `create_app(predictor, settings)` is a Starlette
app whose answers are the Predictor's own (the same features and post-processing as `bert predict`,
`bert embed` and `bert fill-mask`), with requests from many clients batched together.

The package, one module per job: `settings` (`ServeSettings`), `errors` (`ApiError`, TEI's error kinds),
`metrics` (Prometheus), `batcher` (the request queue and the model thread), `schemas` (the JSON schemas and
`ENDPOINTS`, the route table), `openapi` (`/openapi.json`, `/docs`), `checks` (the request checks),
`responses` (`JSONResponse`, written by orjson), `routes` (one handler per route) and `app` (`create_app`: the
checks every request goes through).

Why Starlette on uvicorn: Starlette is a small, well-kept ASGI toolkit (routing, requests, responses,
lifespan) with no validation layer to fight, since the request bodies are checked here (`checks`) with
the error messages below; uvicorn runs it with `--workers` processes and shuts down gracefully on
SIGTERM (no new connections, in-flight requests finished, then the app's shutdown).

The routes are text-embeddings-inference's (TEI, whose clients work unchanged at the base URL) and the
project's own (`/ner`, `/qa`, `/fill-mask`). `ENDPOINTS` is the one table of them: each route's fields
with their JSON schemas, defaults and meaning, its answer's schema, its error statuses, the models it
serves and its example body. The request checks refuse a field the table does not list (422 naming it)
and check each option's type, enum and minimum from its schema; `GET /openapi.json` and `GET /docs` are
written from the same table, so what the server publishes is what it accepts.

Errors are TEI's shape, {"error": message, "error_type": kind} (on the OpenAI routes, OpenAI's
{"error": {"message", "type", "code"}} with TEI's `message`, `code` and `type` beside it): 400 an empty
input; 401 a missing or wrong API key (`--api_key`); 404/405 (with `Allow`) an unknown route or method;
413 more inputs than `max_client_batch_size` or a body over `max_request_bytes`; 422 malformed JSON, a
wrong type or value, a field the server does not implement, or (with "truncate": false, TEI's default
unless `--auto_truncate`) an input longer than the model's `max_seq_length` (except for a classifier
that reads long inputs in windows, as `bert classify --long_document=windows` saved it); 424 a route the
table says this model does not serve; 429 with `Retry-After: 1` when the queue is full; 503 while the
model worker is down.

Batching (`batcher`): a handler checks its request, then hands it to the `Batcher` and awaits a future; the
Batcher's one model thread takes queued requests in arrival order while their tokens fit
`max_batch_tokens`, waiting up to `max_wait_ms` after the oldest one's arrival for more (when the
previous batch held several requests: a lone client is never kept waiting; after such a batch it also takes
the requests still arriving, until none has come for 2 ms), and runs each
kind of request (embed, classify, ...) with equal options as one Predictor call, which sorts the inputs
by length and pads each forward pass to its longest. The event loop never waits for the model: results
come back through `loop.call_soon_threadsafe`.
"""

from bert.serving.app import create_app
from bert.serving.batcher import Batcher
from bert.serving.errors import ApiError
from bert.serving.metrics import Metrics
from bert.serving.openapi import docs_page, openapi_document
from bert.serving.schemas import DISPATCH_PATHS, ENDPOINTS, Endpoint, Field, dispatch_targets
from bert.serving.settings import ServeSettings

__all__ = [
    "ApiError",
    "Batcher",
    "DISPATCH_PATHS",
    "ENDPOINTS",
    "Endpoint",
    "Field",
    "Metrics",
    "ServeSettings",
    "create_app",
    "dispatch_targets",
    "docs_page",
    "openapi_document",
]
