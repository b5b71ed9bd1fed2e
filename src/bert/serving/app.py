"""The Starlette app: `create_app(predictor, settings)` routes every `schemas.ENDPOINTS` entry (and POST / and
/invocations, dispatched by the model's head) to its `routes.Api` handler through one path of checks: the
API key, the body (size, JSON, the route's fields), the route serving this model (else 424), the options
from their schemas; then the handler, cancelled if the client goes away. Every answer is counted in the
metrics and logged in one line."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from bert.inference import Predictor
from bert.request_rules import check_pooling
from bert.serving.checks import check_fields, options, read_json
from bert.serving.errors import BACKEND, VALIDATION, ApiError
from bert.serving.routes import Api
from bert.serving.schemas import DISPATCH_PATHS, ENDPOINT, ENDPOINTS, Endpoint
from bert.serving.settings import ServeSettings

# The server's one log, which `bert serve` sends to stderr (`commands.serve.log_requests`).
logger = logging.getLogger("bert.serving")


def create_app(predictor: Predictor, settings: ServeSettings) -> Starlette:
    """The Starlette app serving `predictor` (see `bert.serving`). Its model thread starts with the app (ASGI
    lifespan startup) and, at shutdown, finishes every accepted request before it stops."""
    if settings.pooling is not None:
        check_pooling(settings.pooling)
    api = Api(predictor, settings)
    routes = [Route(e.path, _endpoint(api, e), methods=[e.method]) for e in ENDPOINTS]
    for path in DISPATCH_PATHS:
        dispatch = Endpoint("POST", path, "dispatch", "", errors=(400, 401, 413, 422, 424, 429))
        routes.append(Route(path, _endpoint(api, dispatch), methods=["POST"]))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        api.batcher.start()
        try:
            yield
        finally:
            # uvicorn has finished the requests in flight by now; the thread runs out the queue and stops.
            await asyncio.get_running_loop().run_in_executor(None, api.batcher.close)

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _not_found(api, request, exc)

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: not_found})
    app.state.api = api
    return app


def _endpoint(api: Api, e: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    async def call(request: Request) -> Response:
        start = time.perf_counter()
        request.state.inputs = 0
        error_type = None
        try:
            if not e.public:
                _authorize(api.settings, request)
            if e.method == "POST":
                body = await read_json(request, api.settings.max_request_bytes)
                response = await _unless_disconnected(request, _answer(api, e, request, body))
            else:
                response = await getattr(api, e.handler)(request, None)
        except ApiError as error:
            response, error_type = error.response(e.openai), error.error_type
        except ClientDisconnect:
            response, error_type = Response(status_code=499), "Disconnected"
        except Exception as error:
            logger.exception("%s failed", e.path)
            response = ApiError(500, f"internal error: {type(error).__name__}: {error}", BACKEND).response(e.openai)
            error_type = BACKEND
        _record(api, request, e.path, response.status_code, start, error_type)
        return response

    return call


async def _answer(api: Api, e: Endpoint, request: Request, body: dict) -> Response:
    """A POST route's answer: the body's fields checked against the route's (POST / against the route it
    answers as), the route serving this model (else 424), the options parsed, then the handler."""
    where = f"{e.method} {e.path}"
    if e.handler == "dispatch":
        e = ENDPOINT[api.dispatched(body)]
        where = f"POST {request.url.path} (as {e.path})"
    check_fields(body, e.fields, where)
    p = api.predictor
    if not e.serves(p):
        raise ApiError(424, f"{e.path} needs {e.needs}; this server runs a {p.architecture} ({p.task})", BACKEND)
    handler: Callable[[Request, dict[str, Any]], Awaitable[Response]] = getattr(api, e.handler)
    return await handler(request, {**body, **options(body, e.fields)})


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


def _authorize(settings: ServeSettings, request: Request) -> None:
    key = settings.api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
        what = "no Authorization header" if not given else "a wrong API key"
        raise ApiError(
            401, f'{what}; send "Authorization: Bearer <the --api_key>"', VALIDATION, {"WWW-Authenticate": "Bearer"}
        )


def _record(api: Api, request: Request, route: str, status: int, start: float, error_type: str | None) -> None:
    seconds = time.perf_counter() - start
    api.metrics.request(route, status, seconds, error_type)
    logger.info("%s %s %d inputs=%d %.1f ms", request.method, route, status, request.state.inputs, seconds * 1000)


def _not_found(api: Api, request: Request, exc: HTTPException) -> Response:
    request.state.inputs = 0
    what = "no such route" if exc.status_code == 404 else f"{request.method} is not allowed here"
    response = ApiError(
        exc.status_code,
        f"{request.url.path}: {what}; see GET /docs",
        headers=dict(exc.headers) if exc.headers else None,
    ).response()
    _record(api, request, "other", exc.status_code, time.perf_counter(), VALIDATION)
    return response
