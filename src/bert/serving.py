"""An HTTP server around a `bert.inference.Predictor`: `create_app(predictor, settings)` is a Starlette
app whose answers are the Predictor's own (the same features and post-processing as `bert predict`,
`bert embed` and `bert fill-mask`), with requests from many clients batched together.

Why Starlette on uvicorn: Starlette is a small, well-kept ASGI toolkit (routing, requests, responses,
lifespan) with no validation layer to fight, since the request bodies are checked here by hand with
the error messages below; uvicorn runs it with `--workers` processes and shuts down gracefully on
SIGTERM (no new connections, in-flight requests finished, then the app's shutdown).

The routes follow text-embeddings-inference (TEI), so its clients work unchanged:
- `POST /embed` {"inputs": str | [str], "normalize": true, "truncate": false} -> [[float], ...]
  (the model's pooling, as `bert embed`; any model);
- `POST /predict` {"inputs": str | [str, str] (a pair) | [[str] | [str, str], ...] (a batch),
  "raw_scores": false, "truncate": false} -> [{"label", "score"}, ...] over every label, best first (a
  batch: one such list per input); a classification model;
- `POST /v1/embeddings` (OpenAI's) {"input": str | [str], "model", "encoding_format": "float" |
  "base64", "truncate": false} -> {"object": "list", "data": [{"object": "embedding", "embedding",
  "index"}], "model", "usage": {"prompt_tokens", "total_tokens"}}; normalized vectors, as OpenAI's;
- `POST /fill-mask` {"inputs": str | [str], "top_k": 5}, `POST /ner` {"inputs": str | [str]},
  `POST /qa` {"question", "context"} or {"inputs": [{"question", "context"}, ...]}: the Predictor's
  `fill_mask`, `ner` and `answer` results (one, or a list for a list);
- `GET /health` (200 while the model worker runs), `GET /info`, `GET /metrics` (Prometheus text).

Errors are TEI's shape, {"error": message, "error_type": kind}: 413 more inputs than
`max_client_batch_size` or a body over `max_request_bytes`; 422 malformed JSON, a wrong type, an empty
input, or (with "truncate": false, TEI's default) an input longer than the model's `max_seq_length`;
424 a route the model's head cannot answer; 503 with `Retry-After: 1` when the queue is full.

Batching: a handler checks its request, then hands it to the `Batcher` and awaits a future; the
Batcher's one model thread takes queued requests in arrival order while their tokens fit
`max_batch_tokens`, waiting up to `max_wait_ms` after the oldest one's arrival for more (when the
previous batch held several requests: a lone client is never kept waiting), and runs each
kind of request (embed, classify, ...) as one Predictor call, which sorts the inputs by length and pads
each forward pass to its longest. The event loop never waits for the model: results come back through
`loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import bert
from bert.errors import InputError
from bert.inference import CLASSIFICATION, FILL_MASK, NER, QUESTION_ANSWERING, InputItemError, Predictor

logger = logging.getLogger(__name__)

# Error kinds, TEI's names.
VALIDATION = "Validation"
OVERLOADED = "Overloaded"
UNHEALTHY = "Unhealthy"
BACKEND = "Backend"


@dataclass
class ServeSettings:
    """The server's limits (the `bert serve` flags of the same names)."""

    model_id: str
    max_batch_tokens: int = 16384
    max_wait_ms: float = 5.0
    max_queue_size: int = 1024
    max_client_batch_size: int = 32
    max_request_bytes: int = 2_000_000
    quantize: str = "none"


class ApiError(Exception):
    """An HTTP error with TEI's body."""

    def __init__(self, status: int, message: str, error_type: str = VALIDATION, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.headers = headers

    def response(self) -> JSONResponse:
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
EMBED, CLASSIFY, TAG, ANSWER, FILL = "embed", "classify", "ner", "answer", "fill-mask"


@dataclass(eq=False)
class _Job:
    kind: str
    options: tuple  # the call's other arguments: only jobs with equal ones share a Predictor call
    inputs: list
    truncate: bool
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

    `submit` (from the event loop) returns a future of (results, tokens); it raises `ApiError` 503 when
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

    def submit(self, kind: str, inputs: list, options: tuple = (), truncate: bool = True) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        job = _Job(kind, options, inputs, truncate, loop, loop.create_future(), time.monotonic())
        with self._cond:
            if self._closing:
                raise ApiError(503, "the server is shutting down", UNHEALTHY)
            if self._depth and self._depth + len(inputs) > self.settings.max_queue_size:
                raise ApiError(
                    503,
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
        encode = self.predictor.tokenizer.encode_batch
        limit = self.predictor.max_seq_length
        if job.kind == CLASSIFY:
            firsts = encode([a for a, _ in job.inputs])
            pairs = encode([b or "" for _, b in job.inputs])
            lengths = [len(a) + 2 + (len(b) + 1 if b else 0) for a, b in zip(firsts, pairs)]
        elif job.kind == ANSWER:
            lengths = [
                len(q) + len(c) + 3
                for q, c in zip(encode([q for q, _ in job.inputs]), encode([c for _, c in job.inputs]))
            ]
        else:
            lengths = [len(ids) + 2 for ids in encode(job.inputs)]
        if job.kind in (EMBED, CLASSIFY):
            # Longer inputs are cut to max_seq_length; NER and question answering read them in windows.
            if not job.truncate:
                for i, n in enumerate(lengths):
                    if n > limit:
                        job.error = ApiError(
                            422,
                            f"input {i} has {n} tokens with [CLS] and [SEP], more than the model's "
                            f'max_input_length={limit}; shorten it or send "truncate": true',
                        )
                        break
            lengths = [min(n, limit) for n in lengths]
        job.tokens = 0 if job.error is not None else sum(lengths)

    def _run_batch(self, batch: list[_Job]) -> None:
        groups: dict[tuple, list[_Job]] = {}
        for job in batch:
            if job.error is not None:
                self._finish(job, error=job.error)
            else:
                groups.setdefault((job.kind, job.options), []).append(job)
        ready = [job for jobs in groups.values() for job in jobs]
        self.metrics.batch(sum(len(j.inputs) for j in ready), sum(j.tokens for j in ready))
        for (kind, options), jobs in groups.items():
            self._run_group(kind, options, jobs)

    def _run_group(self, kind: str, options: tuple, jobs: list[_Job]) -> None:
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

    def _call(self, kind: str, options: tuple, items: list) -> list:
        p = self.predictor
        if kind == EMBED:
            (normalize,) = options
            return list(p.embed(items, normalize=normalize))
        if kind == CLASSIFY:
            (raw_scores,) = options
            return p.classify(items, top_k=0, raw_scores=raw_scores)
        if kind == TAG:
            return p.ner(items)
        if kind == ANSWER:
            return p.answer([q for q, _ in items], [c for _, c in items])
        (top_k,) = options
        return p.fill_mask(items, top_k=top_k)

    def _finish(self, job: _Job, value: Any = None, error: BaseException | None = None) -> None:
        job.loop.call_soon_threadsafe(_resolve, job.future, value, error)


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


def _texts(value: Any, name: str, limit: int) -> tuple[list[str], bool]:
    """A string or a list of strings -> (texts, whether one string was given)."""
    if isinstance(value, str):
        texts, single = [value], True
    elif isinstance(value, list):
        texts, single = value, False
    else:
        raise ApiError(422, f'"{name}" must be a string or a list of strings, got {_kind_name(value)}')
    _check_count(len(texts), name, limit)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ApiError(422, f'"{name}"[{i}] must be a string, got {_kind_name(t)}')
        if not t.strip():
            raise ApiError(422, f'"{name}"[{i}] is empty; give some text')
        _check_encodable(t, f'"{name}"[{i}]')
    return texts, single


def _check_count(n: int, name: str, limit: int) -> None:
    if n == 0:
        raise ApiError(422, f'"{name}" is empty; give at least one input')
    if n > limit:
        raise ApiError(413, f'{n} inputs in "{name}", more than max_client_batch_size={limit}; split the request')


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
            raise ApiError(422, f'"inputs"[{i}] has an empty text')
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

    def _require(self, task: str, route: str) -> None:
        p = self.predictor
        if p.task != task or (task == FILL_MASK and not p.has_mlm_head):
            raise ApiError(
                424, f"{route} needs a {task} model; this server runs a {p.architecture} ({p.task})", BACKEND
            )

    async def _run(self, kind: str, inputs: list, options: tuple = (), truncate: bool = True) -> tuple[list, int]:
        return await self.batcher.submit(kind, inputs, options, truncate)

    # ---------------------------------------------------------------------------------------- routes
    async def embed(self, request: Request, body: dict) -> Response:
        texts, _ = _texts(body.get("inputs"), "inputs", self.settings.max_client_batch_size)
        request.state.inputs = len(texts)
        normalize = _flag(body, "normalize", True, bool)
        truncate = _flag(body, "truncate", False, bool)
        vectors, _ = await self._run(EMBED, texts, (normalize,), truncate)
        return JSONResponse([v.tolist() for v in vectors])

    async def openai_embeddings(self, request: Request, body: dict) -> Response:
        texts, _ = _texts(body.get("input"), "input", self.settings.max_client_batch_size)
        request.state.inputs = len(texts)
        encoding = _flag(body, "encoding_format", "float", str)
        if encoding not in ("float", "base64"):
            raise ApiError(422, f'"encoding_format" must be "float" or "base64", got {encoding!r}')
        dims = _flag(body, "dimensions", None, int)
        hidden = self.predictor.config.hidden_size
        if dims is not None and dims != hidden:
            raise ApiError(422, f'"dimensions"={dims}: this model gives {hidden}-dimensional vectors only')
        truncate = _flag(body, "truncate", False, bool)  # not OpenAI's; TEI's meaning
        vectors, tokens = await self._run(EMBED, texts, (True,), truncate)
        data = []
        for i, v in enumerate(vectors):
            # base64: little-endian float32 bytes, what OpenAI's clients ask for by default and decode.
            embedding = base64.b64encode(v.astype("<f4").tobytes()).decode() if encoding == "base64" else v.tolist()
            data.append({"object": "embedding", "embedding": embedding, "index": i})
        model = body.get("model") if isinstance(body.get("model"), str) else self.settings.model_id
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})

    async def predict(self, request: Request, body: dict) -> Response:
        self._require(CLASSIFICATION, "/predict")
        pairs, single = _pair_inputs(body.get("inputs"), self.settings.max_client_batch_size)
        request.state.inputs = len(pairs)
        raw_scores = _flag(body, "raw_scores", False, bool)
        truncate = _flag(body, "truncate", False, bool)
        results, _ = await self._run(CLASSIFY, pairs, (raw_scores,), truncate)
        labels = self.predictor.labels
        out = [r["scores"] if "scores" in r else [{"label": labels[0], "score": r["score"]}] for r in results]
        return JSONResponse(out[0] if single else out)

    async def ner(self, request: Request, body: dict) -> Response:
        self._require(NER, "/ner")
        texts, single = _texts(body.get("inputs"), "inputs", self.settings.max_client_batch_size)
        request.state.inputs = len(texts)
        results, _ = await self._run(TAG, texts)
        return JSONResponse(results[0] if single else results)

    async def fill_mask(self, request: Request, body: dict) -> Response:
        self._require(FILL_MASK, "/fill-mask")
        texts, single = _texts(body.get("inputs"), "inputs", self.settings.max_client_batch_size)
        request.state.inputs = len(texts)
        top_k = _flag(body, "top_k", 5, int)
        if top_k < 1:
            raise ApiError(422, f'"top_k"={top_k} must be at least 1')
        results, _ = await self._run(FILL, texts, (top_k,))
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

    async def health(self, request: Request, body: None) -> Response:
        if not self.batcher.alive:
            raise ApiError(503, "the model worker is not running", UNHEALTHY)
        return JSONResponse({"status": "ok"})

    async def info(self, request: Request, body: None) -> Response:
        p, s = self.predictor, self.settings
        return JSONResponse(
            {
                "model_id": s.model_id,
                "architecture": p.architecture,
                "task": p.task,
                "labels": p.labels,
                "hidden_size": p.config.hidden_size,
                "max_input_length": p.max_seq_length,
                "max_batch_tokens": s.max_batch_tokens,
                "max_client_batch_size": s.max_client_batch_size,
                "max_queue_size": s.max_queue_size,
                "max_wait_ms": s.max_wait_ms,
                "max_request_bytes": s.max_request_bytes,
                "quantize": s.quantize,
                "device": str(p.device),
                "version": bert.__version__,
            }
        )

    async def metrics_text(self, request: Request, body: None) -> Response:
        return Response(self.metrics.render(self.batcher.depth), media_type="text/plain; version=0.0.4")

    # ---------------------------------------------------------------------------------------- plumbing
    def endpoint(self, route: str, handler: Callable[[Request, Any], Awaitable[Response]], post: bool):
        async def call(request: Request) -> Response:
            start = time.perf_counter()
            request.state.inputs = 0
            error_type = None
            try:
                body = await _read_json(request, self.settings.max_request_bytes) if post else None
                work = handler(request, body)
                response = await (_unless_disconnected(request, work) if post else work)
            except ApiError as e:
                response, error_type = e.response(), e.error_type
            except ClientDisconnect:
                response, error_type = Response(status_code=499), "Disconnected"
            except Exception as e:
                logger.exception("%s failed", route)
                response = ApiError(500, f"internal error: {type(e).__name__}: {e}", BACKEND).response()
                error_type = BACKEND
            self._record(request, route, response.status_code, start, error_type)
            return response

        return call

    def _record(self, request: Request, route: str, status: int, start: float, error_type: str | None) -> None:
        seconds = time.perf_counter() - start
        self.metrics.request(route, status, seconds, error_type)
        logger.info("%s %s %d inputs=%d %.1f ms", request.method, route, status, request.state.inputs, seconds * 1000)

    async def not_found(self, request: Request, exc: HTTPException) -> Response:
        request.state.inputs = 0
        what = "no such route" if exc.status_code == 404 else f"{request.method} is not allowed here"
        response = ApiError(exc.status_code, f"{request.url.path}: {what}; see GET /info").response()
        self._record(request, "other", exc.status_code, time.perf_counter(), VALIDATION)
        return response


def create_app(predictor: Predictor, settings: ServeSettings) -> Starlette:
    """The Starlette app serving `predictor` (see the module docstring). Its model thread starts with the
    app (ASGI lifespan startup) and, at shutdown, finishes every accepted request before it stops."""
    api = _Api(predictor, settings)
    posts = {
        "/embed": api.embed,
        "/predict": api.predict,
        "/v1/embeddings": api.openai_embeddings,
        "/fill-mask": api.fill_mask,
        "/ner": api.ner,
        "/qa": api.qa,
    }
    gets = {"/health": api.health, "/info": api.info, "/metrics": api.metrics_text}
    routes = [Route(path, api.endpoint(path, fn, post=True), methods=["POST"]) for path, fn in posts.items()]
    routes += [Route(path, api.endpoint(path, fn, post=False), methods=["GET"]) for path, fn in gets.items()]

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


__all__ = ["ApiError", "Batcher", "Metrics", "ServeSettings", "create_app"]
