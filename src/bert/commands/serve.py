"""`bert serve`: a model directory behind HTTP, with text-embeddings-inference's routes and fields, OpenAI's
embeddings and the project's own routes (`bert.serving`). One uvicorn process by default; `--workers=N`
starts N processes, each loading the model and rebuilding the app from this module's
`app_from_environment`, which reads the flags from the environment (uvicorn re-imports the app by name in
every worker process).
"""

from __future__ import annotations

import dataclasses
import errno
import http.client
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bert.commands.embed import EmbedArgs
from bert.errors import InputError
from bert.flags import SERVE_LIMITS, InferenceArgs, check_backend, check_dtype, same_as
from bert.hub import hub_id_of
from bert.utils import LOG_FORMAT, exit_with_parent

# The `serve` extra's package that is missing, if one is: without the extra `bert --help` still lists the
# command and `bert serve` says what to install.
_MISSING: str | None = None
try:
    import uvicorn
    from starlette.applications import Starlette
except ImportError as e:
    _MISSING = e.name or "uvicorn"

if TYPE_CHECKING:
    from bert.inference import Predictor

logger = logging.getLogger(__name__)

# The flags, as JSON, for the worker processes of --workers > 1.
ARGS_ENVIRONMENT = "BERT_SERVE_ARGS"
# The pid of the `bert serve` process, which its --workers processes watch.
PARENT_ENVIRONMENT = "BERT_SERVE_PARENT"


@dataclass
class ServeArgs:
    """Serve a model over HTTP with text-embeddings-inference's API (POST /, /embed, /embed_all, /predict,
    /rerank, /similarity, /tokenize, /decode, /v1/embeddings; GET /health, /info, /metrics), and /ner, /qa,
    /fill-mask; GET /openapi.json and /docs say what it accepts. Requests from all clients are batched
    together on the model."""

    model: str = field(metadata={"model": True, "help": "The model directory (any bert predict / bert embed model)."})
    host: str = field(default="127.0.0.1", metadata={"help": "Address to listen on (0.0.0.0: every interface)."})
    port: int = field(default=8080, metadata={"help": "TCP port."})
    workers: int = field(
        default=1, metadata={"help": "Server processes, each with its own copy of the model (uvicorn workers)."}
    )
    threads: int | None = field(
        default=None, metadata={"help": "torch threads per worker process; default: CPU cores // workers."}
    )
    max_batch_tokens: int = field(
        default=SERVE_LIMITS.max_batch_tokens,
        metadata={"help": "Tokens (after tokenization, with [CLS]/[SEP]) per model batch at most."},
    )
    max_wait_ms: float = field(
        default=SERVE_LIMITS.max_wait_ms,
        metadata={
            "help": "How long a request may wait for others to share its batch, when the previous batch held several "
            "requests (a lone client never waits); 0 (the default): run what is queued, and after a batch of several "
            "the requests still arriving as its answers go out (until none has come for 2 ms)."
        },
    )
    max_queue_size: int = field(
        default=SERVE_LIMITS.max_queue_size,
        metadata={"help": "Inputs waiting for the model at most; beyond: 429 with Retry-After: 1."},
    )
    max_client_batch_size: int = field(
        default=SERVE_LIMITS.max_client_batch_size, metadata={"help": "Inputs per request at most (413 beyond)."}
    )
    auto_truncate: bool = field(
        default=False,
        metadata={
            "help": 'Cut inputs longer than the model\'s max_seq_length unless a request sends "truncate": false; '
            'without it such inputs are refused (422) unless a request sends "truncate": true (TEI\'s default).'
        },
    )
    default_prompt_name: str | None = field(
        default=None,
        metadata={
            "help": "The prompt of config_sentence_transformers.json prepended to every text a request sends "
            "without a prompt_name; default: that file's default_prompt_name, else none."
        },
    )
    pooling: str | None = same_as(EmbedArgs, "pooling")
    api_key: str | None = field(
        default=None,
        metadata={
            "help": "Require 'Authorization: Bearer KEY' on every route but /health, /, /ping and /metrics (401 "
            "without it)."
        },
    )
    served_model_name: str | None = field(
        default=None, metadata={"help": "The model's name in /info and /v1/embeddings answers; default: --model."}
    )
    max_request_bytes: int = field(
        default=SERVE_LIMITS.max_request_bytes, metadata={"help": "Request body size at most (413 beyond)."}
    )
    quantize: str = same_as(InferenceArgs, "quantize")
    dtype: str = same_as(InferenceArgs, "dtype")
    backend: str = same_as(InferenceArgs, "backend")
    max_seq_length: int | None = same_as(InferenceArgs, "max_seq_length")
    batch_size: int | None = same_as(InferenceArgs, "batch_size")
    do_lower_case: bool | None = same_as(InferenceArgs, "do_lower_case")
    device: str | None = same_as(InferenceArgs, "device")
    check: bool = field(
        default=False,
        metadata={
            "help": "Start on a free 127.0.0.1 port, send one request to each route the model answers, print "
            "each answer once and exit (non-zero if one fails): a check of a model directory before deploying it."
        },
    )


def _check(args: ServeArgs) -> None:
    for name in ("workers", "max_batch_tokens", "max_queue_size", "max_client_batch_size", "max_request_bytes"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name}={getattr(args, name)} must be at least 1")
    if args.threads is not None and args.threads < 1:
        raise InputError(f"--threads={args.threads} must be at least 1")
    if args.max_wait_ms < 0:
        raise InputError(f"--max_wait_ms={args.max_wait_ms} must be 0 or more")
    if args.api_key is not None and not args.api_key.strip():
        raise InputError("--api_key is empty; give the key clients must send, or leave the flag out")
    if not 0 <= args.port < 65536:
        raise InputError(f"--port={args.port} must be between 0 and 65535")
    check_backend(args.backend, args.device, args.quantize, "--")
    check_dtype(args.dtype, args.backend, args.quantize, args.device, "--")


def _check_address(args: ServeArgs) -> None:
    """Bind --host:--port once before the model loads, as uvicorn will (SO_REUSEADDR): a port in use is one
    line naming it, not uvicorn's log and exit code."""
    if args.check or args.port == 0:
        return
    try:
        infos = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InputError(
            f"--host={args.host} is not an address ({e.strerror}); use e.g. 127.0.0.1 or 0.0.0.0"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise InputError(
                    f"--port={args.port}: {args.host}:{args.port} is already in use (another server?); choose "
                    "another --port, or stop what listens there"
                ) from None
            if e.errno == errno.EACCES:
                raise InputError(f"--port={args.port}: permission denied; ports below 1024 need root") from None
            raise InputError(f"--host={args.host} --port={args.port}: cannot listen there ({e.strerror})") from None


def _check_prompt(predictor: Predictor, name: str | None) -> None:
    try:
        predictor.resolve_prompt(name)
    except InputError as e:
        raise InputError(f"--default_prompt_name: {e}") from None


def build_app(args: ServeArgs) -> Starlette:
    """Load the model of `args` and return the app serving it."""
    # Imported here, not at the top, so that bert.cli reports a flag error before torch loads.
    import torch

    from bert.inference import Predictor
    from bert.serving import ServeSettings, create_app

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    torch.set_num_threads(args.threads or max(1, cores // args.workers))
    predictor = Predictor.from_pretrained(
        args.model,
        args.device,
        max_seq_length=args.max_seq_length,
        batch_size=args.batch_size,
        do_lower_case=args.do_lower_case,
        quantize=args.quantize,
        dtype=args.dtype,
        backend=args.backend,
    )
    if args.default_prompt_name is not None:
        _check_prompt(predictor, args.default_prompt_name)
        predictor.default_prompt_name = args.default_prompt_name
    hub_id = hub_id_of(args.model)  # a Hub id's snapshot (`bert.hub`): /info names the id and its commit
    settings = ServeSettings(
        model_id=hub_id[0] if hub_id else args.model,
        model_sha=hub_id[1] if hub_id else None,
        max_batch_tokens=args.max_batch_tokens,
        max_wait_ms=args.max_wait_ms,
        max_queue_size=args.max_queue_size,
        max_client_batch_size=args.max_client_batch_size,
        max_request_bytes=args.max_request_bytes,
        quantize=args.quantize,
        auto_truncate=args.auto_truncate,
        pooling=args.pooling,
        api_key=args.api_key,
        served_model_name=args.served_model_name,
    )
    logger.info(
        "serving %s (%s on %s, max_seq_length %d, %d threads)",
        args.model,
        predictor.architecture,
        predictor.backend,
        predictor.max_seq_length,
        torch.get_num_threads(),
    )
    return create_app(predictor, settings)


def log_requests() -> Callable[[], None]:
    """Send the one line per request (`bert.serving`, INFO) to the current stderr whatever the terminal's log
    level; returns the function that undoes it (a command run in-process must not leave its handler behind,
    bound to a stream that may be closed by then)."""
    request_log = logging.getLogger("bert.serving")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    level, propagate = request_log.level, request_log.propagate
    request_log.addHandler(handler)
    request_log.setLevel(logging.INFO)
    request_log.propagate = False

    def undo() -> None:
        request_log.removeHandler(handler)
        request_log.setLevel(level)
        request_log.propagate = propagate

    return undo


def app_from_environment() -> Starlette:
    """The app of a --workers process: uvicorn calls this factory in each one. The worker exits when the
    `bert serve` process that started it is gone (a SIGKILLed parent would leave it holding the port)."""
    exit_with_parent(int(os.environ[PARENT_ENVIRONMENT]))
    log_requests()
    return build_app(ServeArgs(**json.loads(os.environ[ARGS_ENVIRONMENT])))


def check_requests(predictor: Predictor) -> list[tuple[str, str, dict | None]]:
    """(method, path, body) of one request to each route of `bert.serving.ENDPOINTS` that serves this model,
    with the table's example body, then POST / and GET /metrics last."""
    # Imported here, not at the top: bert.serving loads torch, and a flag error must come before it.
    from bert.serving import DISPATCH_PATHS, ENDPOINTS, dispatch_targets
    from bert.serving.schemas import ENDPOINT

    requests = [
        (e.method, e.path, e.example_body(predictor)) for e in ENDPOINTS if e.serves(predictor) and e.path != "/metrics"
    ]
    dispatched = ENDPOINT[dispatch_targets(predictor)[0]].example_body(predictor)
    requests += [("POST", path, dispatched) for path in DISPATCH_PATHS]
    return [*requests, ("GET", "/metrics", None)]


def check_routes(app: Starlette, api_key: str | None = None) -> dict[str, int]:
    """Serve `app` on a free loopback port in a thread, send `check_requests`, print each answer once (cut to
    one line), stop; returns {"METHOD path": HTTP status}."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise InputError("--check: the server did not start on 127.0.0.1 (see the log above)")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    statuses = {}
    try:
        for method, path, body in check_requests(app.state.api.predictor):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            response = conn.getresponse()
            text = " ".join(response.read().decode().split())
            conn.close()
            statuses[f"{method} {path}"] = response.status
            shown = text if len(text) <= 160 else text[:160] + "..."
            print(f"{method} {path} -> {response.status} {shown}")
    finally:
        server.should_exit = True
        thread.join(60)
    failed = {route: status for route, status in statuses.items() if status != 200}
    if failed:
        raise InputError(
            f"--check: {', '.join(f'{p} answered {s}' for p, s in failed.items())} (see the answers above)"
        )
    return statuses


def run_serve(args: ServeArgs) -> dict[str, Any]:
    """Serve until SIGTERM or Ctrl-C; returns {"host", "port", "workers"} once every request has been answered
    (with --check: {"check": {route: status}})."""
    if _MISSING is not None:
        raise InputError(f"bert serve needs {_MISSING}, which is not installed; pip install 'bert[serve]'")
    _check(args)
    _check_address(args)
    if args.check:
        # Each answer once: the request log would repeat every one of them.
        return {"check": check_routes(build_app(args), args.api_key)}
    undo_logging = log_requests()
    try:
        return _serve(args)
    finally:
        undo_logging()


def _serve(args: ServeArgs) -> dict[str, Any]:
    # uvicorn re-raises the signal that stopped it once it has shut down; a handler of our own turns SIGTERM
    # into a normal return (exit code 0) after the graceful shutdown.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: logger.info("stopped by SIGTERM"))
    options: dict[str, Any] = dict(host=args.host, port=args.port, access_log=False, log_level="info")
    try:
        if args.workers == 1:
            server = uvicorn.Server(uvicorn.Config(build_app(args), **options))
            server.run()
            if not server.started:
                raise InputError(
                    f"could not serve on {args.host}:{args.port} (see the log above); choose another --port or --host"
                )
        else:
            # Fail here, in one line, rather than in every worker: the model must load, with its prompt.
            # (Imported here, not at the top, so that bert.cli reports a flag error before torch loads.)
            from bert.inference import Predictor

            predictor = Predictor.from_pretrained(
                args.model, "cpu", max_seq_length=args.max_seq_length, backend=args.backend
            )
            _check_prompt(predictor, args.default_prompt_name)
            os.environ[ARGS_ENVIRONMENT] = json.dumps(dataclasses.asdict(args))
            os.environ[PARENT_ENVIRONMENT] = str(os.getpid())
            uvicorn.run(f"{__name__}:app_from_environment", factory=True, workers=args.workers, **options)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return {"host": args.host, "port": args.port, "workers": args.workers}
