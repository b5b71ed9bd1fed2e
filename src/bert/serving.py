"""An HTTP server around a `bert.inference.Predictor`: `create_app(predictor, settings)` is a Starlette
app whose answers are the Predictor's own (the same features and post-processing as `bert predict`,
`bert embed` and `bert fill-mask`), with requests from many clients batched together.

Why Starlette on uvicorn: Starlette is a small, well-kept ASGI toolkit (routing, requests, responses,
lifespan) with no validation layer to fight, since the request bodies are checked here by hand with
the error messages below; uvicorn runs it with `--workers` processes and shuts down gracefully on
SIGTERM (no new connections, in-flight requests finished, then the app's shutdown).

The routes are text-embeddings-inference's (TEI, whose clients work unchanged at the base URL) and the
project's own (`/ner`, `/qa`, `/fill-mask`). `ENDPOINTS` is the one table of them: each route's fields
with their JSON schemas, defaults and meaning, its answer's schema and its error statuses. The request
checks refuse a field the table does not list (422 naming it), and `GET /openapi.json` and `GET /docs`
are written from the same table, so what the server publishes is what it accepts.

Errors are TEI's shape, {"error": message, "error_type": kind} (on the OpenAI routes, OpenAI's
{"error": {"message", "type", "code"}} with TEI's `message`, `code` and `type` beside it): 400 an empty
input; 401 a missing or wrong API key (`--api_key`); 404/405 (with `Allow`) an unknown route or method;
413 more inputs than `max_client_batch_size` or a body over `max_request_bytes`; 422 malformed JSON, a
wrong type or value, a field the server does not implement, or (with "truncate": false, TEI's default
unless `--auto_truncate`) an input longer than the model's `max_seq_length` (except for a classifier
that reads long inputs in windows, as `bert classify --long_document=windows` saved it); 424 a route the model's head
cannot answer; 429 with `Retry-After: 1` when the queue is full; 503 while the model worker is down.

Batching: a handler checks its request, then hands it to the `Batcher` and awaits a future; the
Batcher's one model thread takes queued requests in arrival order while their tokens fit
`max_batch_tokens`, waiting up to `max_wait_ms` after the oldest one's arrival for more (when the
previous batch held several requests: a lone client is never kept waiting), and runs each
kind of request (embed, classify, ...) with equal options as one Predictor call, which sorts the inputs
by length and pads each forward pass to its longest. The event loop never waits for the model: results
come back through `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import html
import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

import bert
from bert.errors import InputError
from bert.flags import POOLINGS
from bert.inference import TRUNCATION_DIRECTIONS, InputItemError, Predictor
from bert.tasks.common import CLASSIFICATION, FILL_MASK, NER, QUESTION_ANSWERING

logger = logging.getLogger(__name__)

# Error kinds, TEI's names.
VALIDATION = "Validation"
OVERLOADED = "Overloaded"
UNHEALTHY = "Unhealthy"
BACKEND = "Backend"
EMPTY = "Empty"


@dataclass
class ServeSettings:
    """The server's limits and defaults (the `bert serve` flags of the same names)."""

    model_id: str
    max_batch_tokens: int = 16384
    max_wait_ms: float = 5.0
    max_queue_size: int = 1024
    max_client_batch_size: int = 32
    max_request_bytes: int = 2_000_000
    quantize: str = "none"
    auto_truncate: bool = False  # the default of "truncate" (TEI's --auto-truncate)
    pooling: str | None = None  # the embedding routes' pooling; None: the model's (`Predictor.default_pooling`)
    api_key: str | None = None  # required as `Authorization: Bearer <key>` on every route but the health checks
    served_model_name: str | None = None  # the name /info and /v1/embeddings give; default: model_id


class ApiError(Exception):
    """An HTTP error with TEI's body (OpenAI's, on the OpenAI routes)."""

    def __init__(self, status: int, message: str, error_type: str = VALIDATION, headers: dict | None = None):
        # A message may quote the client's field names, whose JSON "\\ud800" escapes are lone surrogates that the
        # UTF-8 body cannot hold: they are spelled out as escapes instead.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.headers = headers

    def response(self, openai: bool = False) -> JSONResponse:
        if openai:
            # OpenAI's clients read error.message; TEI's OpenAICompatErrorResponse is the flat fields.
            fields = {"message": self.message, "type": self.error_type, "code": self.status}
            body: dict[str, Any] = {"error": fields, **fields, "error_type": self.error_type}
        else:
            body = {"error": self.message, "error_type": self.error_type}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


# ------------------------------------------------------------------------------------------------ metrics
class _Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        tail = f"{{{labels}}}" if labels else ""
        return [*out, f"{name}_sum{tail} {self.sum:.6g}", f"{name}_count{tail} {self.count}"]


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Counters and histograms, written in Prometheus' text format by hand (no client library needed)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        self.inputs = 0
        self.tokens = 0
        self.batch_size = _Histogram((1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
        self.batch_tokens = _Histogram((64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536))
        self.latency: dict[str, _Histogram] = {}

    def request(self, route: str, status: int, seconds: float, error_type: str | None) -> None:
        with self._lock:
            self.requests[route, status] += 1
            if error_type is not None:
                self.errors[route, error_type] += 1
            self.latency.setdefault(route, _Histogram(_LATENCY_BUCKETS)).observe(seconds)

    def batch(self, inputs: int, tokens: int) -> None:
        with self._lock:
            self.inputs += inputs
            self.tokens += tokens
            self.batch_size.observe(inputs)
            self.batch_tokens.observe(tokens)

    def render(self, queue_depth: int) -> str:
        with self._lock:
            out = [
                "# HELP bert_requests_total HTTP requests by route and status.",
                "# TYPE bert_requests_total counter",
            ]
            out += [
                f'bert_requests_total{{route="{r}",status="{s}"}} {n}' for (r, s), n in sorted(self.requests.items())
            ]
            out += [
                "# HELP bert_errors_total Failed requests by route and error type.",
                "# TYPE bert_errors_total counter",
            ]
            out += [
                f'bert_errors_total{{route="{r}",error_type="{t}"}} {n}' for (r, t), n in sorted(self.errors.items())
            ]
            out += ["# HELP bert_inputs_total Inputs run by the model.", "# TYPE bert_inputs_total counter"]
            out += [f"bert_inputs_total {self.inputs}"]
            out += ["# HELP bert_tokens_total WordPiece tokens run by the model.", "# TYPE bert_tokens_total counter"]
            out += [f"bert_tokens_total {self.tokens}"]
            out += ["# HELP bert_queue_depth Inputs waiting for the model.", "# TYPE bert_queue_depth gauge"]
            out += [f"bert_queue_depth {queue_depth}"]
            out += ["# HELP bert_batch_size Inputs per model batch.", "# TYPE bert_batch_size histogram"]
            out += self.batch_size.lines("bert_batch_size")
            out += ["# HELP bert_batch_tokens Tokens per model batch.", "# TYPE bert_batch_tokens histogram"]
            out += self.batch_tokens.lines("bert_batch_tokens")
            out += [
                "# HELP bert_request_duration_seconds Request latency by route.",
                "# TYPE bert_request_duration_seconds histogram",
            ]
            for route, h in sorted(self.latency.items()):
                out += h.lines("bert_request_duration_seconds", f'route="{route}"')
        return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ batcher
# What a job asks of the Predictor.
EMBED, EMBED_ALL, CLASSIFY, RANK, SIMILAR = "embed", "embed_all", "classify", "rank", "similarity"
TAG, ANSWER, FILL = "ner", "answer", "fill-mask"


@dataclass(eq=False)
class _Job:
    kind: str
    options: tuple  # the Predictor call's keyword arguments, sorted: only jobs with equal ones share a call
    inputs: list
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    enqueued: float
    tokens: int | None = None  # counted by the model thread
    error: ApiError | None = None


def _resolve(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if future.done():  # the client went away and the handler was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class Batcher:
    """A bounded queue of requests and the one thread that runs them on the model, batch after batch.

    `submit` (from the event loop) returns a future of (results, tokens); it raises `ApiError` 429 when
    the inputs waiting would exceed `max_queue_size` (a request to an empty queue is always taken).
    Inputs count as waiting until their batch starts. `close` lets the thread finish every accepted
    request, then stops it.
    """

    def __init__(self, predictor: Predictor, settings: ServeSettings, metrics: Metrics):
        self.predictor = predictor
        self.settings = settings
        self.metrics = metrics
        self._queue: deque[_Job] = deque()
        self._depth = 0
        self._cond = threading.Condition()
        self._closing = False
        # Whether the next batch waits for company: only after a batch of several requests. A lone client
        # then never waits (nobody else is coming), while concurrent clients, whose next requests arrive a
        # few milliseconds apart once a batch is answered, fill the next batch instead of splitting it.
        self._gather = True
        self._thread = threading.Thread(target=self._work, name="bert-model", daemon=True)

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closing

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def submit(self, kind: str, inputs: list, **options: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        job = _Job(kind, tuple(sorted(options.items())), inputs, loop, loop.create_future(), time.monotonic())
        with self._cond:
            if self._closing:
                raise ApiError(503, "the server is shutting down", UNHEALTHY)
            if self._depth and self._depth + len(inputs) > self.settings.max_queue_size:
                raise ApiError(
                    429,
                    f"the queue is full ({self._depth} inputs waiting, max_queue_size={self.settings.max_queue_size}); "
                    "retry in a second",
                    OVERLOADED,
                    {"Retry-After": "1"},
                )
            self._queue.append(job)
            self._depth += len(inputs)
            self._cond.notify()
        return job.future

    # ------------------------------------------------------------------------------ the model thread
    def _work(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run_batch(batch)
            except Exception as e:  # a bug, not bad input: the batch fails, the server goes on
                logger.exception("batch failed")
                for job in batch:
                    self._finish(job, error=ApiError(500, f"internal error: {type(e).__name__}: {e}", BACKEND))

    def _drop_gone(self) -> None:
        """Drop the queued jobs whose client has gone (its handler was cancelled, and with it the job's
        future), before the model sees them or their tokens are counted. Called holding the lock."""
        gone = [job for job in self._queue if job.future.cancelled()]
        if gone:
            self._queue = deque(job for job in self._queue if not job.future.cancelled())
            self._depth -= sum(len(job.inputs) for job in gone)

    def _next_batch(self) -> list[_Job] | None:
        with self._cond:
            self._drop_gone()
            while not self._queue:
                if self._closing:
                    return None
                self._cond.wait()
                self._drop_gone()
            wait = self.settings.max_wait_ms / 1000 if self._gather else 0.0
            deadline = self._queue[0].enqueued + wait
        while True:
            # Only this thread removes jobs, so the snapshot's head stays the queue's head; tokens are counted
            # outside the lock, which `submit` takes on the event loop.
            with self._cond:
                self._drop_gone()
                queued = list(self._queue)
                closing = self._closing
            if not queued:
                return self._next_batch()
            count, full = self._fit(queued)
            remaining = deadline - time.monotonic()
            if full or closing or remaining <= 0:
                break
            with self._cond:
                if len(self._queue) == len(queued):
                    self._cond.wait(remaining)
        with self._cond:
            batch = [self._queue.popleft() for _ in range(count)]
            self._depth -= sum(len(job.inputs) for job in batch)
        self._gather = len(batch) > 1
        return batch

    def _fit(self, queued: list[_Job]) -> tuple[int, bool]:
        """How many jobs from the head fit `max_batch_tokens` (at least one), and whether the next does not."""
        total = 0
        for n, job in enumerate(queued):
            if job.tokens is None:
                self._measure(job)
            if n and total + job.tokens > self.settings.max_batch_tokens:
                return n, True
            total += job.tokens
        return len(queued), total >= self.settings.max_batch_tokens

    def _measure(self, job: _Job) -> None:
        """Count the job's tokens ([CLS] and [SEP] included) and refuse an input too long to run whole."""
        p = self.predictor
        encode = p.tokenizer.encode_batch
        limit = p.max_seq_length
        options = dict(job.options)
        truncate = options.get("truncate", True)
        lengths: list[int] = []
        try:
            if job.kind in (EMBED, EMBED_ALL, SIMILAR):
                texts = [options["source"], *job.inputs] if job.kind == SIMILAR else job.inputs
                sequences, _ = p.embedding_sequences(
                    texts,
                    truncate=truncate,
                    truncation_direction=options["truncation_direction"],
                    prompt=p.resolve_prompt(options.get("prompt_name")),
                )
                lengths = [len(ids) for ids, _ in sequences]
            elif job.kind in (CLASSIFY, RANK):
                pairs = [(options["query"], d) for d in job.inputs] if job.kind == RANK else job.inputs
                firsts = encode([a for a, _ in pairs])
                seconds = encode([b or "" for _, b in pairs])
                lengths = [len(a) + 2 + (len(b) + 1 if b else 0) for a, b in zip(firsts, seconds)]
                # A classifier fine-tuned on windows (config.json `long_document`) reads long inputs whole.
                if job.kind == RANK or p.long_document == "truncate":
                    if not truncate:
                        for i, n in enumerate(lengths):
                            if n > limit:
                                raise InputItemError(
                                    i, f"{n} tokens with [CLS] and [SEP], more than max_seq_length={limit}"
                                )
                    # Longer pairs are cut to max_seq_length.
                    lengths = [min(n, limit) for n in lengths]
            elif job.kind == ANSWER:
                questions, contexts = encode([q for q, _ in job.inputs]), encode([c for _, c in job.inputs])
                lengths = [len(q) + len(c) + 3 for q, c in zip(questions, contexts)]
            else:
                lengths = [len(ids) + 2 for ids in encode(job.inputs)]
        except InputItemError as e:
            where = (
                ('"source_sentence"' if e.index == 0 else f"sentence {e.index - 1}") if job.kind == SIMILAR else None
            )
            hint = '; shorten it or send "truncate": true' if "more than max_seq_length" in e.reason else ""
            job.error = ApiError(422, f"{where or f'input {e.index}'}: {e.reason.split('; ')[0]}{hint}")
        except InputError as e:
            job.error = ApiError(422, str(e))
        job.tokens = 0 if job.error is not None else sum(lengths)

    def _run_batch(self, batch: list[_Job]) -> None:
        groups: dict[tuple, list[_Job]] = {}
        for job in batch:
            if job.error is not None:
                self._finish(job, error=job.error)
            else:
                groups.setdefault((job.kind, job.options), []).append(job)
        ready = [job for jobs in groups.values() for job in jobs]
        self.metrics.batch(sum(len(j.inputs) for j in ready), sum(j.tokens or 0 for j in ready))
        for (kind, options), jobs in groups.items():
            self._run_group(kind, dict(options), jobs)

    def _run_group(self, kind: str, options: dict, jobs: list[_Job]) -> None:
        while jobs:
            items = [x for job in jobs for x in job.inputs]
            try:
                results = self._call(kind, options, items)
            except InputItemError as e:
                # That input's request fails alone; the others run again without it.
                start = 0
                for job in jobs:
                    if start <= e.index < start + len(job.inputs):
                        self._finish(job, error=ApiError(422, f"input {e.index - start}: {e.reason}"))
                        break
                    start += len(job.inputs)
                jobs = [j for j in jobs if j is not job]
                continue
            except InputError as e:
                for job in jobs:
                    self._finish(job, error=ApiError(422, str(e)))
                return
            start = 0
            for job in jobs:
                self._finish(job, (results[start : start + len(job.inputs)], job.tokens))
                start += len(job.inputs)
            return

    def _call(self, kind: str, options: dict, items: list) -> list:
        p = self.predictor
        options = dict(options)  # a group that loses a request calls again with the same options
        if kind == EMBED:
            return list(p.embed(items, **options))
        if kind == EMBED_ALL:
            return p.token_embeddings(items, **options)
        if kind == CLASSIFY:
            return p.classify(items, top_k=0, **options)
        if kind == RANK:
            scores = [0.0] * len(items)
            for r in p.rank(options.pop("query"), items, **options):
                scores[r["index"]] = r["score"]
            return scores
        if kind == SIMILAR:
            return p.similarity(options.pop("source"), items, **options)
        if kind == TAG:
            return p.ner(items)
        if kind == ANSWER:
            return p.answer([q for q, _ in items], [c for _, c in items])
        return p.fill_mask(items, **options)

    def _finish(self, job: _Job, value: Any = None, error: BaseException | None = None) -> None:
        job.loop.call_soon_threadsafe(_resolve, job.future, value, error)


# ---------------------------------------------------------------------------------- what the server accepts
# JSON schemas (OpenAPI 3.0), TEI's where the route is TEI's.
_STRING = {"type": "string"}
_BOOL = {"type": "boolean"}
_NUMBER = {"type": "number", "format": "float"}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "format": "int32", "minimum": 0}}
_INPUT_TYPE = {"anyOf": [_STRING, _TOKEN_IDS]}
_INPUT = {"anyOf": [_INPUT_TYPE, {"type": "array", "items": _INPUT_TYPE}]}
_TEXTS = {"anyOf": [_STRING, {"type": "array", "items": _STRING}]}
_NULLABLE_STRING = {"type": "string", "nullable": True}
_DIRECTION = {"type": "string", "enum": ["Left", "Right", "left", "right"]}
_PREDICTION = {
    "type": "object",
    "required": ["label", "score"],
    "properties": {"label": _STRING, "score": _NUMBER},
}
_VECTORS = {"type": "array", "items": {"type": "array", "items": _NUMBER}}
_TOKEN = {
    "type": "object",
    "required": ["id", "text", "special"],
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "text": _STRING,
        "special": _BOOL,
        "start": {"type": "integer", "minimum": 0, "nullable": True},
        "stop": {"type": "integer", "minimum": 0, "nullable": True},
    },
}
_ENTITY = {
    "type": "object",
    "required": ["entity", "start", "end", "text", "score"],
    "properties": {
        "entity": _STRING,
        "start": {"type": "integer"},
        "end": {"type": "integer"},
        "text": _STRING,
        "score": _NUMBER,
    },
}
_ANSWER = {
    "type": "object",
    "required": ["answer", "start", "end", "score"],
    "properties": {
        "answer": _NULLABLE_STRING,
        "start": {"type": "integer", "nullable": True},
        "end": {"type": "integer", "nullable": True},
        "score": _NUMBER,
    },
}
_FILLED = {
    "type": "object",
    "required": ["sequence", "masks"],
    "properties": {
        "sequence": _STRING,
        "masks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["start", "end", "predictions"],
                "properties": {
                    "start": {"type": "integer"},
                    "end": {"type": "integer"},
                    "predictions": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["token", "token_id", "score", "word"],
                            "properties": {
                                "token": _STRING,
                                "token_id": {"type": "integer"},
                                "score": _NUMBER,
                                "word": _STRING,
                            },
                        },
                    },
                },
            },
        },
    },
}
_INFO = {
    "type": "object",
    "required": [
        "model_id",
        "model_dtype",
        "served_model_name",
        "model_type",
        "max_concurrent_requests",
        "max_input_length",
        "max_batch_tokens",
        "max_client_batch_size",
        "auto_truncate",
        "tokenization_workers",
        "version",
    ],
    "properties": {
        "model_id": _STRING,
        "model_dtype": _STRING,
        "served_model_name": _STRING,
        "model_type": {"type": "object"},
        "max_concurrent_requests": {"type": "integer", "minimum": 0},
        "max_input_length": {"type": "integer", "minimum": 0},
        "max_batch_tokens": {"type": "integer", "minimum": 0},
        "max_client_batch_size": {"type": "integer", "minimum": 0},
        "auto_truncate": _BOOL,
        "tokenization_workers": {"type": "integer", "minimum": 0},
        "version": _STRING,
    },
}
_ERROR = {
    "type": "object",
    "required": ["error", "error_type"],
    "properties": {
        "error": _STRING,
        "error_type": {"type": "string", "enum": [UNHEALTHY, BACKEND, OVERLOADED, VALIDATION, "Tokenizer", EMPTY]},
    },
}
_OPENAI_ERROR = {
    "type": "object",
    "required": ["error", "message", "code", "type", "error_type"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {"message": _STRING, "type": _STRING, "code": {"type": "integer"}},
        },
        "message": _STRING,
        "code": {"type": "integer"},
        "type": _STRING,
        "error_type": _STRING,
    },
}


@dataclass(frozen=True)
class Field:
    """A request field: its JSON schema and what the server does with it (the default is in `schema`)."""

    schema: dict
    description: str
    required: bool = False


def _truncate_field() -> Field:
    return Field(
        {"type": "boolean", "nullable": True},
        "cut inputs longer than the model's max_input_length instead of refusing them (422); default: false, "
        "or true with --auto_truncate",
    )


_DIRECTION_FIELD = Field(
    {**_DIRECTION, "default": "right"}, 'which end of a long input is cut: "right" keeps its start, "left" its end'
)
_PROMPT_FIELD = Field(
    _NULLABLE_STRING,
    "a prompt of the model's config_sentence_transformers.json, prepended to each text (default: "
    "--default_prompt_name, else the model's default_prompt_name, else none)",
)
_DIMENSIONS_FIELD = Field(
    {"type": "integer", "minimum": 1, "nullable": True},
    "keep the vectors' first `dimensions` components (Matryoshka), then normalize when normalizing",
)
_NORMALIZE_FIELD = Field({"type": "boolean", "default": True}, "scale each vector to unit length")
_OPENAI_FIELDS = {
    "input": Field(_INPUT, "a text, token ids, or a list of either", required=True),
    "model": Field(_NULLABLE_STRING, "echoed in the answer; the served model answers whatever it names"),
    "encoding_format": Field(
        {"type": "string", "enum": ["float", "base64"], "default": "float"},
        "base64: each vector as little-endian float32 bytes",
    ),
    "dimensions": _DIMENSIONS_FIELD,
    "user": Field(_NULLABLE_STRING, "OpenAI's end-user id: accepted, changes nothing"),
    "truncate": _truncate_field(),
}
_OPENAI_ANSWER = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": _STRING,
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["object", "embedding", "index"],
                "properties": {
                    "object": _STRING,
                    "embedding": {"anyOf": [{"type": "array", "items": _NUMBER}, _STRING]},
                    "index": {"type": "integer", "minimum": 0},
                },
            },
        },
        "model": _STRING,
        "usage": {
            "type": "object",
            "required": ["prompt_tokens", "total_tokens"],
            "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
        },
    },
}


@dataclass(frozen=True)
class Endpoint:
    """One route: what it accepts and answers, for the request checks, /openapi.json and /docs."""

    method: str
    path: str
    handler: str  # the `_Api` method
    summary: str
    fields: dict[str, Field] = field(default_factory=dict)  # a POST body's fields
    answer: dict = field(default_factory=dict)  # the 200 body's schema
    errors: tuple[int, ...] = (400, 401, 413, 422, 424, 429)
    tei: bool = True  # one of TEI's routes (else the project's own)
    openai: bool = False  # errors in OpenAI's shape
    public: bool = False  # answered without the API key (health checks)
    media_type: str = "application/json"


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        "/embed",
        "embed",
        "Embeddings of texts or token ids, pooled as the model's sentence-transformers configuration says "
        "(or --pooling); any model.",
        {
            "inputs": Field(_INPUT, "a text, token ids (the whole sequence, as given), or a list of either", True),
            "normalize": _NORMALIZE_FIELD,
            "truncate": _truncate_field(),
            "truncation_direction": _DIRECTION_FIELD,
            "prompt_name": _PROMPT_FIELD,
            "dimensions": _DIMENSIONS_FIELD,
        },
        _VECTORS,
    ),
    Endpoint(
        "POST",
        "/embed_all",
        "embed_all",
        "The last layer at every token of each input, [CLS] and [SEP] included; any model.",
        {
            "inputs": Field(_INPUT, "a text, token ids, or a list of either", True),
            "truncate": _truncate_field(),
            "truncation_direction": _DIRECTION_FIELD,
            "prompt_name": _PROMPT_FIELD,
        },
        {"type": "array", "items": _VECTORS},
    ),
    Endpoint(
        "POST",
        "/embed_sparse",
        "embed_sparse",
        "SPLADE sparse embeddings: not implemented (424, as TEI answers for a model that is not SPLADE).",
        {
            "inputs": Field(_INPUT, "a text, token ids, or a list of either", True),
            "truncate": _truncate_field(),
            "truncation_direction": _DIRECTION_FIELD,
            "prompt_name": _PROMPT_FIELD,
        },
        {"type": "array", "items": {"type": "array", "items": {"type": "object"}}},
    ),
    Endpoint(
        "POST",
        "/predict",
        "predict",
        "Every label's score of a text or a text pair, best first; a sequence-classification model.",
        {
            "inputs": Field(
                {
                    "anyOf": [
                        _STRING,
                        {"type": "array", "items": _STRING, "minItems": 1, "maxItems": 2},
                        {"type": "array", "items": {"type": "array", "items": _STRING, "minItems": 1, "maxItems": 2}},
                    ]
                },
                "a text, a pair [text, text_pair], or a batch [[text] | [text, text_pair], ...]",
                True,
            ),
            "raw_scores": Field({"type": "boolean", "default": False}, "the logits instead of the probabilities"),
            "truncate": _truncate_field(),
            "truncation_direction": _DIRECTION_FIELD,
            "parameters": Field(
                {
                    "type": "object",
                    "nullable": True,
                    "properties": {
                        "top_k": {"type": "integer", "minimum": 1, "nullable": True},
                        "function_to_apply": {
                            "type": "string",
                            "enum": ["softmax", "sigmoid", "none"],
                            "nullable": True,
                        },
                    },
                },
                "huggingface_hub's text_classification parameters: top_k (the best k labels); function_to_apply "
                '"none" (= raw_scores), or the model\'s own ("softmax" single-label, "sigmoid" multi-label)',
            ),
        },
        {
            "anyOf": [
                {"type": "array", "items": _PREDICTION},
                {"type": "array", "items": {"type": "array", "items": _PREDICTION}},
            ]
        },
    ),
    Endpoint(
        "POST",
        "/rerank",
        "rerank",
        "The texts by relevance to the query, best first: a cross-encoder's sigmoid score (a "
        "sequence-classification model with one label), or an embedding model's cosine similarity.",
        {
            "query": Field(_STRING, "the query", True),
            "texts": Field({"type": "array", "items": _STRING}, "the texts to rank", True),
            "raw_scores": Field({"type": "boolean", "default": False}, "a cross-encoder's logits, not their sigmoid"),
            "return_text": Field({"type": "boolean", "default": False}, "give each text with its score"),
            "truncate": _truncate_field(),
            "truncation_direction": _DIRECTION_FIELD,
        },
        {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "score"],
                "properties": {"index": {"type": "integer", "minimum": 0}, "score": _NUMBER, "text": _STRING},
            },
        },
    ),
    Endpoint(
        "POST",
        "/similarity",
        "similarity",
        "The cosine similarity of the source sentence's embedding with each sentence's; any model.",
        {
            "inputs": Field(
                {
                    "type": "object",
                    "required": ["source_sentence", "sentences"],
                    "properties": {"source_sentence": _STRING, "sentences": {"type": "array", "items": _STRING}},
                },
                "{source_sentence, sentences}",
                True,
            ),
            "parameters": Field(
                {
                    "type": "object",
                    "nullable": True,
                    "properties": {
                        "truncate": {"type": "boolean", "nullable": True},
                        "truncation_direction": _DIRECTION,
                        "prompt_name": _NULLABLE_STRING,
                    },
                },
                "truncate, truncation_direction and prompt_name, as /embed takes them",
            ),
        },
        {"type": "array", "items": _NUMBER},
    ),
    Endpoint(
        "POST",
        "/tokenize",
        "tokenize",
        "The model's tokens of each text with their character offsets (Python string indices, stop exclusive).",
        {
            "inputs": Field(_TEXTS, "a text or a list of texts", True),
            "add_special_tokens": Field({"type": "boolean", "default": True}, "[CLS] first and [SEP] last"),
            "prompt_name": _PROMPT_FIELD,
        },
        {"type": "array", "items": {"type": "array", "items": _TOKEN}},
        (400, 401, 413, 422),
    ),
    Endpoint(
        "POST",
        "/decode",
        "decode",
        "The text of token ids: word pieces joined (lower-casing, accents and spacing are not recovered).",
        {
            "ids": Field(
                {"anyOf": [_TOKEN_IDS, {"type": "array", "items": _TOKEN_IDS}]}, "ids or a list of them", True
            ),
            "skip_special_tokens": Field(
                {"type": "boolean", "default": True}, "leave out [PAD], [UNK], [CLS], [SEP] and [MASK]"
            ),
        },
        {"type": "array", "items": _STRING},
        (400, 401, 413, 422),
    ),
    Endpoint(
        "POST",
        "/v1/embeddings",
        "openai_embeddings",
        "OpenAI's embeddings API; normalized vectors.",
        _OPENAI_FIELDS,
        _OPENAI_ANSWER,
        openai=True,
    ),
    Endpoint(
        "POST",
        "/embeddings",
        "openai_embeddings",
        "The same as /v1/embeddings.",
        _OPENAI_FIELDS,
        _OPENAI_ANSWER,
        openai=True,
    ),
    Endpoint(
        "POST",
        "/ner",
        "ner",
        "Entity spans (character offsets) of each text; a token-classification model.",
        {"inputs": Field(_TEXTS, "a text or a list of texts", True)},
        {
            "anyOf": [
                {"type": "array", "items": _ENTITY},
                {"type": "array", "items": {"type": "array", "items": _ENTITY}},
            ]
        },
        tei=False,
    ),
    Endpoint(
        "POST",
        "/qa",
        "qa",
        "The answer span of a question in its context; a question-answering model.",
        {
            "question": Field(_STRING, "one question (with context)"),
            "context": Field(_STRING, "its context"),
            "inputs": Field(
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["question", "context"],
                        "properties": {"question": _STRING, "context": _STRING},
                    },
                },
                "a batch of {question, context} (instead of question and context)",
            ),
        },
        {"anyOf": [_ANSWER, {"type": "array", "items": _ANSWER}]},
        tei=False,
    ),
    Endpoint(
        "POST",
        "/fill-mask",
        "fill_mask",
        "The likeliest tokens at each [MASK]; a masked-LM model.",
        {
            "inputs": Field(_TEXTS, "a text or a list of texts, each with [MASK] where a word is to be guessed", True),
            "top_k": Field({"type": "integer", "minimum": 1, "default": 5}, "predictions per mask"),
        },
        {"anyOf": [_FILLED, {"type": "array", "items": _FILLED}]},
        tei=False,
    ),
    Endpoint(
        "GET",
        "/health",
        "health",
        "200 while the model worker runs, else 503.",
        answer={"type": "object"},
        errors=(503,),
        public=True,
    ),
    Endpoint("GET", "/", "health", "The same as /health.", answer={"type": "object"}, errors=(503,), public=True),
    Endpoint("GET", "/ping", "health", "The same as /health.", answer={"type": "object"}, errors=(503,), public=True),
    Endpoint(
        "GET",
        "/info",
        "info",
        "The model and the server's settings (TEI's fields and ours).",
        answer=_INFO,
        errors=(401,),
    ),
    Endpoint("GET", "/metrics", "metrics_text", "Prometheus metrics.", errors=(), public=True, media_type="text/plain"),
    Endpoint("GET", "/openapi.json", "openapi", "This document.", answer={"type": "object"}, errors=(401,), tei=False),
    Endpoint("GET", "/docs", "docs", "This document as a page.", errors=(401,), tei=False, media_type="text/html"),
)
# POST / (and /invocations, SageMaker's) answers as the route of the model's head, as TEI dispatches it.
DISPATCH_PATHS = ("/", "/invocations")


def openapi_document(predictor: Predictor, settings: ServeSettings) -> dict:
    """The OpenAPI 3.0 document of what this server accepts and answers, written from `ENDPOINTS`; POST /
    is described as the route it dispatches to for this model."""
    schemas = {"ErrorResponse": _ERROR, "OpenAICompatErrorResponse": _OPENAI_ERROR}
    paths: dict[str, dict] = {}

    def operation(e: Endpoint, fields: dict[str, Field] | dict | None = None) -> dict:
        op: dict[str, Any] = {"summary": e.summary, "operationId": e.handler + e.path.replace("/", "_")}
        if e.method == "POST":
            body = fields if isinstance(fields, dict) and "anyOf" in fields else _request_schema(e.fields)
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
        content = {e.media_type: {"schema": e.answer}} if e.media_type == "application/json" else {e.media_type: {}}
        responses: dict[str, Any] = {"200": {"description": "the answer", "content": content}}
        error = "OpenAICompatErrorResponse" if e.openai else "ErrorResponse"
        for status in e.errors:
            responses[str(status)] = {
                "description": _STATUS_MEANING[status],
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{error}"}}},
            }
        op["responses"] = responses
        return op

    for e in ENDPOINTS:
        paths.setdefault(e.path, {})[e.method.lower()] = operation(e)
    targets = [_ENDPOINT[path] for path in dispatch_targets(predictor)]
    body = {"anyOf": [_request_schema(t.fields) for t in targets]} if len(targets) > 1 else None
    for path in DISPATCH_PATHS:
        target = targets[0]
        dispatched = Endpoint(
            "POST",
            path,
            "dispatch",
            f"This model's route: {' or '.join(t.path for t in targets)} (by the body), as TEI dispatches by the head.",
            target.fields,
            {"anyOf": [t.answer for t in targets]} if body else target.answer,
            target.errors,
        )
        paths.setdefault(path, {})["post"] = operation(dispatched, body)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "bert serve",
            "description": f"{settings.served_model_name or settings.model_id} ({predictor.architecture}); "
            "text-embeddings-inference's routes and the project's own",
            "version": bert.__version__,
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


_STATUS_MEANING = {
    400: "an empty input",
    401: "a missing or wrong API key",
    413: "too many inputs or too large a body",
    422: "a malformed request, an unknown field, or an input too long without truncate",
    424: "the model's head cannot answer this route",
    429: "the queue is full; retry after Retry-After seconds",
    503: "the model worker is not running",
}
_ENDPOINT = {e.path: e for e in ENDPOINTS if e.method == "POST"}


def _request_schema(fields: dict[str, Field]) -> dict:
    return {
        "type": "object",
        "required": [name for name, f in fields.items() if f.required],
        "properties": {name: {**f.schema, "description": f.description} for name, f in fields.items()},
        "additionalProperties": False,
    }


def dispatch_targets(predictor: Predictor) -> list[str]:
    """The routes POST / answers as, for this model's head (the first unless the body says otherwise)."""
    if predictor.is_cross_encoder:
        return ["/rerank"]
    head_route = {CLASSIFICATION: "/predict", NER: "/ner", QUESTION_ANSWERING: "/qa"}.get(predictor.task)
    if predictor.task == FILL_MASK and predictor.has_mlm_head:
        head_route = "/fill-mask"
    # An embedding model: /similarity for a {source_sentence, sentences} body (huggingface_hub's
    # sentence_similarity posts it to the base URL), else /embed.
    return [head_route] if head_route else ["/embed", "/similarity"]


def docs_page(document: dict) -> str:
    """`openapi_document` as an HTML page: each route, what it does, its fields and its statuses."""
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>bert serve</title></head><body>",
        f"<h1>bert serve</h1><p>{html.escape(document['info']['description'])}; the same as "
        "<a href='/openapi.json'>/openapi.json</a>. A field not listed is refused (422).</p>",
    ]
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            out.append(f"<h2>{method.upper()} {html.escape(path)}</h2><p>{html.escape(op['summary'])}</p>")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            for variant in body.get("anyOf", [body]):
                rows = [
                    f"<tr><td><code>{html.escape(name)}</code>{' (required)' if name in variant['required'] else ''}"
                    f"</td><td><code>{html.escape(json.dumps({k: v for k, v in prop.items() if k != 'description'}))}"
                    f"</code></td><td>{html.escape(prop['description'])}</td></tr>"
                    for name, prop in variant.get("properties", {}).items()
                ]
                if rows:
                    out.append("<table border='1'><tr><th>field</th><th>schema</th><th>meaning</th></tr>")
                    out += rows + ["</table>"]
            statuses = ", ".join(f"{s} {r['description']}" for s, r in op["responses"].items() if s != "200")
            out.append(f"<p>Errors: {html.escape(statuses) or 'none'}.</p>")
    return "\n".join(out) + "\n</body></html>\n"


# -------------------------------------------------------------------------------------- request checks
def _kind_name(value: Any) -> str:
    return (
        "null"
        if value is None
        else {dict: "object", list: "array", str: "string"}.get(type(value), type(value).__name__)
    )


def _check_encodable(text: str, where: str) -> None:
    """JSON's "\\ud800" escapes decode to lone surrogates, which no tokenizer or UTF-8 writer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(
            422,
            f"{where} holds a lone surrogate ({text[e.start]!r} at character {e.start}), which is not text; "
            "send valid Unicode",
        ) from None


def _check_fields(body: dict, fields: Collection[str], where: str) -> None:
    """Refuse a field the route does not implement, naming it, rather than drop it."""
    for name in body:
        if name not in fields:
            raise ApiError(
                422, f'{where} has no field "{name}"; this server implements {", ".join(fields)} (see GET /docs)'
            )


def _check_count(n: int, name: str, limit: int) -> None:
    if n == 0:
        raise ApiError(400, f'"{name}" is empty; give at least one input', EMPTY)
    if n > limit:
        raise ApiError(413, f'{n} inputs in "{name}", more than max_client_batch_size={limit}; split the request')


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def _inputs(value: Any, name: str, limit: int, ids: bool = True) -> tuple[list, bool]:
    """A text (or, with `ids`, a list of token ids) or a list of them -> (inputs, whether one was given)."""
    what = "a string, token ids, or a list of either" if ids else "a string or a list of strings"
    if isinstance(value, str) or (ids and value and _is_ids(value)):
        items, single = [value], True
    elif isinstance(value, list):
        items, single = value, False
    else:
        raise ApiError(422, f'"{name}" must be {what}, got {_kind_name(value)}')
    _check_count(len(items), name, limit)
    for i, item in enumerate(items):
        if isinstance(item, str) or (ids and _is_ids(item)):
            if not (item.strip() if isinstance(item, str) else item):
                raise ApiError(400, f'"{name}"[{i}] is empty; give some text', EMPTY)
            if isinstance(item, str):
                _check_encodable(item, f'"{name}"[{i}]')
        else:
            raise ApiError(
                422, f'"{name}"[{i}] must be {"a string or token ids" if ids else "a string"}, got {_kind_name(item)}'
            )
    return items, single


def _pair_inputs(value: Any, limit: int) -> tuple[list[tuple[str, str | None]], bool]:
    """TEI's /predict inputs: a text, a pair [text, text_pair], or a batch [[text] | [text, text_pair], ...]."""
    shape = "a string, a pair [text, text_pair], or a batch [[text], [text, text_pair], ...]"
    if isinstance(value, str):
        items, single = [[value]], True
    elif isinstance(value, list) and value and isinstance(value[0], str):
        if len(value) > 2:
            raise ApiError(422, f'"inputs" of {len(value)} strings: give {shape}')
        items, single = [value], True
    elif isinstance(value, list):
        items, single = value, False
        _check_count(len(items), "inputs", limit)
    else:
        raise ApiError(422, f'"inputs" must be {shape}, got {_kind_name(value)}')
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, list) or not 1 <= len(item) <= 2 or not all(isinstance(t, str) for t in item):
            raise ApiError(422, f'"inputs"[{i}] must be [text] or [text, text_pair], got {json.dumps(item)[:80]}')
        if not item[0].strip():
            raise ApiError(400, f'"inputs"[{i}] has an empty text', EMPTY)
        for j, text in enumerate(item):
            _check_encodable(text, f'"inputs"[{i}][{j}]')
        out.append((item[0], item[1] if len(item) == 2 else None))
    return out, single


def _flag(body: dict, name: str, default: Any, kind: type) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if type(value) is not kind:  # bool is an int in Python, but not in JSON
        raise ApiError(422, f'"{name}" must be {kind.__name__}, got {_kind_name(value)}')
    return value


def _direction(body: dict) -> str:
    value = _flag(body, "truncation_direction", "right", str)
    if value.lower() not in TRUNCATION_DIRECTIONS:
        raise ApiError(422, f'"truncation_direction" must be "left" or "right" (TEI: "Left", "Right"), got {value!r}')
    return value.lower()


async def _read_json(request: Request, limit: int) -> dict:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the body has {length} bytes, more than max_request_bytes={limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the body is over max_request_bytes={limit}")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(422, f"the body is not valid JSON: {e}") from None
    except RecursionError:
        # The depth limit: json's parser stops at the interpreter's recursion limit (about 1000 levels).
        raise ApiError(422, "the body is nested too deeply; send a flat JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(422, f"the body must be a JSON object, got {_kind_name(body)}")
    return body


async def _unless_disconnected(request: Request, work: Awaitable[Response]) -> Response:
    """Await `work` (a handler, its body read) unless the client goes first: then the handler is cancelled,
    which cancels the future of its queued job, so the model thread drops it (`Batcher._drop_gone`)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientDisconnect()
    return task.result()


async def _disconnect(request: Request) -> None:
    """Returns when the client has closed the connection (the body has been read: the next ASGI message of
    the request is its disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ---------------------------------------------------------------------------------------------- the app
class _Api:
    def __init__(self, predictor: Predictor, settings: ServeSettings):
        self.predictor = predictor
        self.settings = settings
        self.metrics = Metrics()
        self.batcher = Batcher(predictor, settings, self.metrics)
        self.document = openapi_document(predictor, settings)

    def _require(self, task: str, route: str) -> None:
        p = self.predictor
        if p.task != task or (task == FILL_MASK and not p.has_mlm_head):
            raise ApiError(
                424, f"{route} needs a {task} model; this server runs a {p.architecture} ({p.task})", BACKEND
            )

    async def _run(self, kind: str, inputs: list, **options: Any) -> tuple[list, int]:
        return await self.batcher.submit(kind, inputs, **options)

    def _truncate(self, body: dict) -> bool:
        return _flag(body, "truncate", self.settings.auto_truncate, bool)

    def _prompt_name(self, body: dict) -> str | None:
        name = _flag(body, "prompt_name", None, str)
        try:
            self.predictor.resolve_prompt(name)
        except InputError as e:
            raise ApiError(422, f'"prompt_name": {e}') from None
        return name

    def _dimensions(self, body: dict) -> int | None:
        dims = _flag(body, "dimensions", None, int)
        hidden = self.predictor.config.hidden_size
        if dims is not None and not 1 <= dims <= hidden:
            raise ApiError(422, f'"dimensions"={dims} must be between 1 and the model\'s {hidden}')
        return dims

    async def _embed(self, request: Request, body: dict, name: str, normalize: bool) -> tuple[list, bool, int]:
        items, single = _inputs(body.get(name), name, self.settings.max_client_batch_size)
        request.state.inputs = len(items)
        options = dict(
            pooling=self.settings.pooling,
            normalize=normalize,
            truncate=self._truncate(body),
            truncation_direction=_direction(body),
            prompt_name=self._prompt_name(body),
            dimensions=self._dimensions(body),
        )
        vectors, tokens = await self._run(EMBED, items, **options)
        return vectors, single, tokens

    # ---------------------------------------------------------------------------------------- routes
    async def embed(self, request: Request, body: dict) -> Response:
        vectors, _, _ = await self._embed(request, body, "inputs", _flag(body, "normalize", True, bool))
        return JSONResponse([v.tolist() for v in vectors])

    async def embed_all(self, request: Request, body: dict) -> Response:
        items, _ = _inputs(body.get("inputs"), "inputs", self.settings.max_client_batch_size)
        request.state.inputs = len(items)
        options = dict(
            truncate=self._truncate(body), truncation_direction=_direction(body), prompt_name=self._prompt_name(body)
        )
        rows, _ = await self._run(EMBED_ALL, items, **options)
        return JSONResponse([r.tolist() for r in rows])

    async def embed_sparse(self, request: Request, body: dict) -> Response:
        raise ApiError(
            424, "/embed_sparse needs a SPLADE model, which this project does not serve; use /embed", BACKEND
        )

    async def openai_embeddings(self, request: Request, body: dict) -> Response:
        encoding = _flag(body, "encoding_format", "float", str)
        if encoding not in ("float", "base64"):
            raise ApiError(422, f'"encoding_format" must be "float" or "base64", got {encoding!r}')
        _flag(body, "user", None, str)
        model = _flag(body, "model", None, str) or self.settings.served_model_name or self.settings.model_id
        vectors, _, tokens = await self._embed(request, body, "input", True)
        data = []
        for i, v in enumerate(vectors):
            # base64: little-endian float32 bytes, what OpenAI's clients ask for by default and decode.
            embedding = base64.b64encode(v.astype("<f4").tobytes()).decode() if encoding == "base64" else v.tolist()
            data.append({"object": "embedding", "embedding": embedding, "index": i})
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})

    async def predict(self, request: Request, body: dict) -> Response:
        self._require(CLASSIFICATION, "/predict")
        pairs, single = _pair_inputs(body.get("inputs"), self.settings.max_client_batch_size)
        request.state.inputs = len(pairs)
        raw_scores = _flag(body, "raw_scores", False, bool)
        parameters = _flag(body, "parameters", {}, dict)
        _check_fields(parameters, _ENDPOINT["/predict"].fields["parameters"].schema["properties"], '"parameters"')
        top_k = _flag(parameters, "top_k", None, int)
        if top_k is not None and top_k < 1:
            raise ApiError(422, f'"parameters.top_k"={top_k} must be at least 1')
        function = _flag(parameters, "function_to_apply", None, str)
        own = {"single_label_classification": "softmax", "multi_label_classification": "sigmoid"}
        if function == "none":
            raw_scores = True
        elif function is not None and function != own.get(self.predictor.problem_type or ""):
            raise ApiError(
                422,
                f'"parameters.function_to_apply"={function!r}: this {self.predictor.problem_type} model gives '
                f'{own.get(self.predictor.problem_type or "", "raw")} scores, or "none" for the logits',
            )
        options = dict(raw_scores=raw_scores, truncate=self._truncate(body), truncation_direction=_direction(body))
        results, _ = await self._run(CLASSIFY, pairs, **options)
        labels = self.predictor.labels or []
        out = [r["scores"] if "scores" in r else [{"label": labels[0], "score": r["score"]}] for r in results]
        out = [scores[:top_k] for scores in out]
        return JSONResponse(out[0] if single else out)

    async def rerank(self, request: Request, body: dict) -> Response:
        p = self.predictor
        if p.task == CLASSIFICATION and not p.is_cross_encoder:
            raise ApiError(
                424,
                f"/rerank needs a cross-encoder (one label) or an embedding model; this is a {len(p.labels or ())}"
                "-label classifier",
                BACKEND,
            )
        query = body.get("query")
        if not isinstance(query, str):
            raise ApiError(422, f'"query" must be a string, got {_kind_name(query)}')
        if not query.strip():
            raise ApiError(400, '"query" is empty; give some text', EMPTY)
        _check_encodable(query, '"query"')
        if not isinstance(body.get("texts"), list):
            raise ApiError(422, f'"texts" must be a list of strings, got {_kind_name(body.get("texts"))}')
        texts, _ = _inputs(body["texts"], "texts", self.settings.max_client_batch_size, ids=False)
        request.state.inputs = len(texts)
        return_text = _flag(body, "return_text", False, bool)
        options = dict(
            query=query,
            pooling=self.settings.pooling,
            raw_scores=_flag(body, "raw_scores", False, bool),
            truncate=self._truncate(body),
            truncation_direction=_direction(body),
        )
        scores, _ = await self._run(RANK, texts, **options)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        ranks = [{"index": i, "score": scores[i], **({"text": texts[i]} if return_text else {})} for i in order]
        return JSONResponse(ranks)

    async def similarity(self, request: Request, body: dict) -> Response:
        inputs = body.get("inputs")
        if not isinstance(inputs, dict):
            raise ApiError(422, f'"inputs" must be an object {{source_sentence, sentences}}, got {_kind_name(inputs)}')
        _check_fields(inputs, ("source_sentence", "sentences"), '"inputs"')
        source = inputs.get("source_sentence")
        if not isinstance(source, str):
            raise ApiError(422, f'"inputs.source_sentence" must be a string, got {_kind_name(source)}')
        if not source.strip():
            raise ApiError(400, '"inputs.source_sentence" is empty; give some text', EMPTY)
        _check_encodable(source, '"inputs.source_sentence"')
        if not isinstance(inputs.get("sentences"), list):
            raise ApiError(
                422, f'"inputs.sentences" must be a list of strings, got {_kind_name(inputs.get("sentences"))}'
            )
        sentences, _ = _inputs(inputs["sentences"], "inputs.sentences", self.settings.max_client_batch_size, ids=False)
        parameters = _flag(body, "parameters", {}, dict)
        _check_fields(parameters, _ENDPOINT["/similarity"].fields["parameters"].schema["properties"], '"parameters"')
        request.state.inputs = len(sentences) + 1
        options = dict(
            source=source,
            pooling=self.settings.pooling,
            truncate=self._truncate(parameters),
            truncation_direction=_direction(parameters),
            prompt_name=self._prompt_name(parameters),
        )
        scores, _ = await self._run(SIMILAR, sentences, **options)
        return JSONResponse(scores)

    async def tokenize(self, request: Request, body: dict) -> Response:
        texts, _ = _inputs(body.get("inputs"), "inputs", self.settings.max_client_batch_size, ids=False)
        request.state.inputs = len(texts)
        add_special = _flag(body, "add_special_tokens", True, bool)
        prompt_name = self._prompt_name(body)
        return JSONResponse(self.predictor.tokenize(texts, add_special_tokens=add_special, prompt_name=prompt_name))

    async def decode(self, request: Request, body: dict) -> Response:
        ids = body.get("ids")
        rows = [ids] if _is_ids(ids) and ids else ids
        if not isinstance(rows, list) or not all(_is_ids(r) for r in rows):
            raise ApiError(
                422, f'"ids" must be a list of token ids or a list of such lists, got {json.dumps(ids)[:80]}'
            )
        _check_count(len(rows), "ids", self.settings.max_client_batch_size)
        request.state.inputs = len(rows)
        skip = _flag(body, "skip_special_tokens", True, bool)
        try:
            return JSONResponse(self.predictor.decode(rows, skip_special_tokens=skip))
        except InputItemError as e:
            raise ApiError(422, f'"ids"[{e.index}]: {e.reason}') from None

    async def ner(self, request: Request, body: dict) -> Response:
        self._require(NER, "/ner")
        texts, single = _inputs(body.get("inputs"), "inputs", self.settings.max_client_batch_size, ids=False)
        request.state.inputs = len(texts)
        results, _ = await self._run(TAG, texts)
        return JSONResponse(results[0] if single else results)

    async def fill_mask(self, request: Request, body: dict) -> Response:
        self._require(FILL_MASK, "/fill-mask")
        texts, single = _inputs(body.get("inputs"), "inputs", self.settings.max_client_batch_size, ids=False)
        request.state.inputs = len(texts)
        top_k = _flag(body, "top_k", 5, int)
        if top_k < 1:
            raise ApiError(422, f'"top_k"={top_k} must be at least 1')
        results, _ = await self._run(FILL, texts, top_k=top_k)
        return JSONResponse(results[0] if single else results)

    async def qa(self, request: Request, body: dict) -> Response:
        self._require(QUESTION_ANSWERING, "/qa")
        single = "inputs" not in body
        items = [body] if single else body["inputs"]
        if not isinstance(items, list):
            raise ApiError(
                422, f'"inputs" must be a list of {{"question", "context"}} objects, got {_kind_name(items)}'
            )
        _check_count(len(items), "inputs", self.settings.max_client_batch_size)
        pairs = []
        for i, item in enumerate(items):
            where = "" if single else f'"inputs"[{i}]: '
            if not isinstance(item, dict):
                raise ApiError(422, f'{where}expected a {{"question", "context"}} object, got {_kind_name(item)}')
            if not single:
                _check_fields(item, ("question", "context"), f'"inputs"[{i}]')
            for name in ("question", "context"):
                value = item.get(name)
                if not isinstance(value, str) or not value.strip():
                    what = "is missing" if value is None else "must be a non-empty string"
                    raise ApiError(422, f'{where}"{name}" {what}')
                _check_encodable(value, f'{where}"{name}"')
            pairs.append((item["question"], item["context"]))
        request.state.inputs = len(pairs)
        results, _ = await self._run(ANSWER, pairs)
        return JSONResponse(results[0] if single else results)

    async def dispatch(self, request: Request, body: dict) -> Response:
        targets = dispatch_targets(self.predictor)
        path = targets[-1] if len(targets) > 1 and isinstance(body.get("inputs"), dict) else targets[0]
        endpoint = _ENDPOINT[path]
        _check_fields(body, endpoint.fields, f"POST {request.url.path} (as {path})")
        return await getattr(self, endpoint.handler)(request, body)

    async def health(self, request: Request, body: None) -> Response:
        if not self.batcher.alive:
            raise ApiError(503, "the model worker is not running", UNHEALTHY)
        return JSONResponse({"status": "ok"})

    async def info(self, request: Request, body: None) -> Response:
        p, s = self.predictor, self.settings
        if p.task == CLASSIFICATION and p.labels is not None:
            labels = {
                "id2label": {str(i): x for i, x in enumerate(p.labels)},
                "label2id": {x: i for i, x in enumerate(p.labels)},
            }
            model_type: dict[str, Any] = {"reranker" if p.is_cross_encoder else "classifier": labels}
        else:
            try:
                pooling = s.pooling or p.default_pooling
            except InputError:  # a sentence-transformers pooling this project lacks: every call names one
                pooling = "none"
            model_type = {"embedding": {"pooling": pooling}}
        st = p.sentence_transformers
        return JSONResponse(
            {
                "model_id": s.model_id,
                "model_sha": None,
                "model_dtype": p.dtype,
                "served_model_name": s.served_model_name or s.model_id,
                "model_type": model_type,
                "max_concurrent_requests": s.max_queue_size,
                "max_input_length": p.max_seq_length,
                "max_batch_tokens": s.max_batch_tokens,
                "max_batch_requests": None,
                "max_client_batch_size": s.max_client_batch_size,
                "auto_truncate": s.auto_truncate,
                "tokenization_workers": 1,
                "version": bert.__version__,
                "sha": None,
                "docker_label": None,
                # Ours.
                "architecture": p.architecture,
                "task": p.task,
                "labels": p.labels,
                "hidden_size": p.config.hidden_size,
                "prompts": st.prompts if st is not None else {},
                "default_prompt_name": p.default_prompt_name,
                "max_queue_size": s.max_queue_size,
                "max_wait_ms": s.max_wait_ms,
                "max_request_bytes": s.max_request_bytes,
                "quantize": s.quantize,
                "backend": p.backend,
                "device": str(p.device),
            }
        )

    async def metrics_text(self, request: Request, body: None) -> Response:
        return Response(self.metrics.render(self.batcher.depth), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request, body: None) -> Response:
        return JSONResponse(self.document)

    async def docs(self, request: Request, body: None) -> Response:
        return HTMLResponse(docs_page(self.document))

    # ---------------------------------------------------------------------------------------- plumbing
    def endpoint(self, e: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        handler: Callable[[Request, Any], Awaitable[Response]] = getattr(self, e.handler)
        post = e.method == "POST"

        async def call(request: Request) -> Response:
            start = time.perf_counter()
            request.state.inputs = 0
            error_type = None
            try:
                if not e.public:
                    self._authorize(request)
                body = await _read_json(request, self.settings.max_request_bytes) if post else None
                if body is not None and e.handler != "dispatch":
                    _check_fields(body, e.fields, f"{e.method} {e.path}")
                work = handler(request, body)
                response = await (_unless_disconnected(request, work) if post else work)
            except ApiError as error:
                response, error_type = error.response(e.openai), error.error_type
            except ClientDisconnect:
                response, error_type = Response(status_code=499), "Disconnected"
            except Exception as error:
                logger.exception("%s failed", e.path)
                response = ApiError(500, f"internal error: {type(error).__name__}: {error}", BACKEND).response(e.openai)
                error_type = BACKEND
            self._record(request, e.path, response.status_code, start, error_type)
            return response

        return call

    def _authorize(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            what = "no Authorization header" if not given else "a wrong API key"
            raise ApiError(
                401, f'{what}; send "Authorization: Bearer <the --api_key>"', VALIDATION, {"WWW-Authenticate": "Bearer"}
            )

    def _record(self, request: Request, route: str, status: int, start: float, error_type: str | None) -> None:
        seconds = time.perf_counter() - start
        self.metrics.request(route, status, seconds, error_type)
        logger.info("%s %s %d inputs=%d %.1f ms", request.method, route, status, request.state.inputs, seconds * 1000)

    async def not_found(self, request: Request, exc: HTTPException) -> Response:
        request.state.inputs = 0
        what = "no such route" if exc.status_code == 404 else f"{request.method} is not allowed here"
        response = ApiError(
            exc.status_code,
            f"{request.url.path}: {what}; see GET /docs",
            headers=dict(exc.headers) if exc.headers else None,
        ).response()
        self._record(request, "other", exc.status_code, time.perf_counter(), VALIDATION)
        return response


def create_app(predictor: Predictor, settings: ServeSettings) -> Starlette:
    """The Starlette app serving `predictor` (see the module docstring). Its model thread starts with the
    app (ASGI lifespan startup) and, at shutdown, finishes every accepted request before it stops."""
    if settings.pooling is not None and settings.pooling not in POOLINGS:
        raise InputError(f"pooling={settings.pooling!r} must be one of {', '.join(POOLINGS)}")
    api = _Api(predictor, settings)
    endpoints = [*ENDPOINTS]
    for path in DISPATCH_PATHS:
        endpoints.append(Endpoint("POST", path, "dispatch", "", errors=(400, 401, 413, 422, 424, 429)))
    routes = [Route(e.path, api.endpoint(e), methods=[e.method]) for e in endpoints]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        api.batcher.start()
        try:
            yield
        finally:
            # uvicorn has finished the requests in flight by now; the thread runs out the queue and stops.
            await asyncio.get_running_loop().run_in_executor(None, api.batcher.close)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: api.not_found})
    app.state.api = api
    return app


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
