"""The request queue: `Batcher`, a bounded queue of requests and the one model thread that runs them, batch
after batch, each kind of request with equal options as one `Predictor` call.

A handler checks its request, then hands it to the `Batcher` and awaits a future; the model thread prepares
each request once as it first counts its tokens (the Predictor's `prepare_*`: tokenized, cut or refused by
the Predictor's own length rule), and runs the prepared sequences (`run_*`). It takes queued requests in
arrival order while their tokens fit `max_batch_tokens`, waiting up to `max_wait_ms`
after the oldest one's arrival for more (when the previous batch held several requests: a lone client is
never kept waiting); after a batch of several it also takes the requests still arriving as that batch's
answers go out (`GATHER_GAP`). The Predictor sorts a call's inputs by length and pads each forward pass to its
longest. The event loop never waits for the model: results come back through `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from bert.errors import InputError
from bert.inference import Predictor, Prepared
from bert.input_lines import InputItemError
from bert.serving.errors import BACKEND, OVERLOADED, UNHEALTHY, ApiError
from bert.serving.metrics import Metrics
from bert.serving.settings import ServeSettings

# The server's one log, which `bert serve` sends to stderr (`commands.serve.log_requests`).
logger = logging.getLogger("bert.serving")

# What a job asks of the Predictor.
EMBED, EMBED_ALL, CLASSIFY, RANK, SIMILAR = "embed", "embed_all", "classify", "rank", "similarity"
TAG, ANSWER, FILL = "ner", "answer", "fill-mask"

# How long a thread may keep the GIL once another asks for it while the model thread runs (Python's default: 5 ms).
# The model thread takes the GIL back after each op, a few hundred a forward pass; while the event loop writes a
# batch's answers and reads the next requests in Python, each op could wait that long for it (all-MiniLM-L6-v2, 64
# clients: 1.02x-1.03x the requests at 1 ms, bench/RESULTS.md 2026-11-30).
SWITCH_INTERVAL = 0.001

# After a batch of several requests, the next one also takes the requests still arriving as its answers go out
# (concurrent clients send their next request as their answer comes): it starts once none has come for
# GATHER_GAP, or GATHER_LIMIT after that batch ended. Taking only what was queued cut 16 clients' requests into a
# batch of 15 and a batch of 1, which ran while the event loop wrote the 15 answers (all-MiniLM-L6-v2, 16
# clients: 1.09x-1.16x the requests; bench/RESULTS.md 2026-11-30).
GATHER_GAP = 0.002
GATHER_LIMIT = 0.020


@dataclass(eq=False)
class _Job:
    kind: str
    options: tuple  # the Predictor call's keyword arguments, sorted: only jobs with equal ones share a call
    inputs: list
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    enqueued: float
    tokens: int | None = None  # counted by the model thread
    prepared: Prepared | None = None  # made as its tokens are counted
    error: ApiError | None = None


def _prepared(job: _Job) -> Prepared:
    assert job.prepared is not None  # a batch's jobs were all counted, so prepared, before it started
    return job.prepared


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
        self._ended = 0.0  # when the last batch ended (time.monotonic)
        self._thread = threading.Thread(target=self._work, name="bert-model", daemon=True)
        self._switch_interval: float | None = None  # the process's, restored as the model thread stops

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closing

    def start(self) -> None:
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, SWITCH_INTERVAL))
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None

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
            self._ended = time.monotonic()

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
            gather_until = self._ended + GATHER_LIMIT if self._gather else 0.0
        newest, quiet_since = None, time.monotonic()
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
            now = time.monotonic()
            if queued[-1] is not newest:
                newest, quiet_since = queued[-1], now
            gathering = min(quiet_since + GATHER_GAP, gather_until) - now
            remaining = deadline - now
            if full or closing or max(remaining, gathering) <= 0:
                break
            with self._cond:
                if len(self._queue) == len(queued):
                    self._cond.wait(max(remaining, gathering))
        with self._cond:
            batch = [self._queue.popleft() for _ in range(count)]
            self._depth -= sum(len(job.inputs) for job in batch)
        self._gather = len(batch) > 1
        return batch

    def _fit(self, queued: list[_Job]) -> tuple[int, bool]:
        """How many jobs from the head fit `max_batch_tokens` (at least one), and whether the next does not."""
        total = 0
        for n, job in enumerate(queued):
            tokens = self._measure(job) if job.tokens is None else job.tokens
            if n and total + tokens > self.settings.max_batch_tokens:
                return n, True
            total += tokens
        return len(queued), total >= self.settings.max_batch_tokens

    def _measure(self, job: _Job) -> int:
        """Prepare the job's inputs once (its `prepared`) and count their tokens ([CLS] and [SEP] included) as the
        Predictor will run them, refusing an input too long to run whole by the Predictor's own length rule,
        before the job waits for a batch (fill-mask refuses a text as the batch runs: `Batcher._run_group`)."""
        options = dict(job.options)
        tokens = 0
        try:
            job.prepared = self._prepare(job.kind, job.inputs, options)
            tokens = job.prepared.tokens
        except InputItemError as e:
            # The embedding routes' first text is the source sentence (/similarity) or the query (/rerank).
            first = {SIMILAR: ('"source_sentence"', "sentence"), RANK: ('"query"', "input")}.get(job.kind)
            where = f"input {e.index}"
            if first is not None and self._embeds(job.kind):
                where = first[0] if e.index == 0 else f"{first[1]} {e.index - 1}"
            hint = '; shorten it or send "truncate": true' if "more than max_seq_length" in e.reason else ""
            job.error = ApiError(422, f"{where}: {e.reason.split('; ')[0]}{hint}")
        except InputError as e:
            job.error = ApiError(422, str(e))
        job.tokens = 0 if job.error is not None else tokens
        return job.tokens

    def _embeds(self, kind: str) -> bool:
        """Whether a job of `kind` runs as embeddings (an encoder's /rerank too), not as pairs."""
        return kind in (EMBED, EMBED_ALL, SIMILAR) or (kind == RANK and not self.predictor.is_cross_encoder)

    def _prepare(self, kind: str, inputs: list, options: dict) -> Prepared:
        """The Predictor's sequences of a job, with its options that shape them (truncation, prompt, the source or
        query sent beside the inputs, which is the first sequence)."""
        p = self.predictor
        if kind == TAG:
            return p.prepare_tagging(inputs)
        if kind == ANSWER:
            return p.prepare_answer([q for q, _ in inputs], [c for _, c in inputs])
        if kind == FILL:
            return p.prepare_fill_mask(inputs)
        truncation = dict(
            truncate=options.get("truncate", True), truncation_direction=options.get("truncation_direction", "right")
        )
        if kind in (EMBED, EMBED_ALL):
            return p.prepare_embeddings(inputs, prompt_name=options.get("prompt_name"), **truncation)
        if kind == SIMILAR:
            return p.prepare_similarity(options["source"], inputs, prompt_name=options.get("prompt_name"), **truncation)
        if kind == RANK:
            return p.prepare_rank(options["query"], inputs, **truncation)
        return p.prepare_classification(inputs, **truncation)

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
            try:
                results = self._call(kind, options, jobs)
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

    def _call(self, kind: str, options: dict, jobs: list[_Job]) -> list:
        """The results of a group's jobs (one kind, equal options), in order: their prepared inputs joined and
        run as one call."""
        p = self.predictor
        prepared = Prepared.join([_prepared(job) for job in jobs])
        pooling = options.get("pooling")
        if kind == EMBED:
            normalize, dimensions = options.get("normalize"), options.get("dimensions")
            return list(p.run_embed(prepared, pooling, normalize, dimensions=dimensions))
        if kind == EMBED_ALL:
            return p.run_token_embeddings(prepared)
        if kind == SIMILAR:
            return p.run_similarity(prepared, pooling)
        if kind == RANK:
            return p.run_rank(prepared, raw_scores=options.get("raw_scores", False), pooling=pooling)
        if kind == TAG:
            return p.run_ner(prepared)
        if kind == ANSWER:
            return p.run_answer(prepared)
        if kind == FILL:
            return p.run_fill_mask(prepared, **options)
        return p.run_classify(prepared, top_k=0, raw_scores=options.get("raw_scores", False))

    def _finish(self, job: _Job, value: Any = None, error: BaseException | None = None) -> None:
        job.loop.call_soon_threadsafe(_resolve, job.future, value, error)
