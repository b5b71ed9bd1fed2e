"""`bert serve` against careless and hostile clients: the server answers 4xx, never 500, and does no work
for clients that have gone.

- `test_deeply_nested_body_is_422`: a JSON body nested 100,000 deep -> 422, and the server goes on.
- `test_lone_surrogate_is_422_naming_the_input`: "a \\ud800 [MASK] b" on /fill-mask, /ner, /embed -> 422
  naming the input.
- `test_body_properties` (hypothesis): any JSON value as a body, or as the "inputs" of any route -> an
  answer below 500.
- `test_work_of_clients_that_hung_up_is_dropped`: clients that send their inputs and hang up while the
  model is busy -> the model never sees their inputs.
- `test_port_in_use_is_one_line`: `bert serve --port=P` where P is taken -> exit 2, one line, before loading.
- `test_workers_exit_with_their_parent`: `bert serve --workers=2` SIGKILLed -> its workers exit, the port
  is free again.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")
pytest.importorskip("uvicorn", reason="bert serve needs the serve extra (pip install '.[serve]')")

from test_serve import call, free_port, inprocess_server, metric  # noqa: E402

from bert.inference import Predictor  # noqa: E402
from bert.modeling import BertForPreTraining, BertForTokenClassification  # noqa: E402
from conftest import REPO, cli_error, save_model_dir, uncased_vocab, vocab_config  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    vocab = uncased_vocab(d)
    torch.manual_seed(0)
    return {
        "mlm": save_model_dir(BertForPreTraining(vocab_config(vocab)), d / "mlm", vocab),
        "ner": save_model_dir(BertForTokenClassification(vocab_config(vocab), num_labels=3), d / "ner", vocab),
    }


@pytest.fixture(scope="module")
def mlm(models) -> Predictor:
    return Predictor.from_pretrained(models["mlm"], "cpu")


def test_deeply_nested_body_is_422(mlm):
    with inprocess_server(mlm) as port:
        body = b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        status, _, error = call(port, "/embed", body)
        assert status == 422 and "nested too deeply" in error["error"], error
        assert call(port, "/embed", {"inputs": "a good day"})[0] == 200


def test_lone_surrogate_is_422_naming_the_input(models, mlm):
    body = json.dumps({"inputs": ["a good day", "a \ud800 [MASK] b"]}).encode()  # the escape "\ud800"
    assert b"\\ud800" in body
    with inprocess_server(mlm) as port:
        for route in ("/fill-mask", "/embed"):
            status, _, error = call(port, route, body)
            assert status == 422 and '"inputs"[1] holds a lone surrogate' in error["error"], (route, error)
    with inprocess_server(Predictor.from_pretrained(models["ner"], "cpu")) as port:
        status, _, error = call(port, "/ner", json.dumps({"inputs": "a \ud800 b"}).encode())
        assert status == 422 and '"inputs"[0] holds a lone surrogate' in error["error"], error


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
ROUTES = ["/embed", "/fill-mask", "/v1/embeddings", "/predict", "/ner", "/qa"]


@pytest.fixture(scope="module")
def mlm_port(mlm):
    with inprocess_server(mlm) as port:
        yield port


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), body=JSON, as_inputs=st.booleans(), surrogate=st.booleans())
def test_body_properties(mlm_port, route, body, as_inputs, surrogate):
    if as_inputs:
        body = {"inputs": body, "input": body}
    data = json.dumps(body).encode()
    if surrogate:
        data = data.replace(b'"', b'"\\udc80', 1) if b'"' in data else data
    status, _, answer = call(mlm_port, route, data)
    assert status < 500, (route, data[:200], answer)


def _hang_up(port: int, body: dict) -> None:
    """Send a whole request, then close the connection without reading the answer."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )


def test_work_of_clients_that_hung_up_is_dropped(mlm):
    seen: list[str] = []
    release = threading.Event()
    real = mlm.prepare_embeddings  # where a request's texts reach the Predictor (the queue prepares each once)

    def prepare_embeddings(texts, **kwargs):
        seen.extend(texts)
        if "block" in texts:
            release.wait(30)
        return real(texts, **kwargs)

    mlm.prepare_embeddings = prepare_embeddings
    try:
        with inprocess_server(mlm, max_wait_ms=0) as port:
            first: list = []
            thread = threading.Thread(target=lambda: first.append(call(port, "/embed", {"inputs": "block"})))
            thread.start()
            deadline = time.monotonic() + 10
            while "block" not in seen:
                assert time.monotonic() < deadline, "the first request never reached the model"
                time.sleep(0.02)
            for i in range(5):  # while the model is busy
                _hang_up(port, {"inputs": [f"gone {i} {j}" for j in range(8)]})
            deadline = time.monotonic() + 10
            while metric(call(port, "/metrics")[2], 'bert_requests_total{route="/embed",status="499"}') < 5:
                assert time.monotonic() < deadline, "the server did not notice the clients hang up"
                time.sleep(0.05)
            release.set()
            thread.join(30)
            assert first[0][0] == 200
            assert call(port, "/embed", {"inputs": "after"})[0] == 200
            assert seen == ["block", "after"], seen
    finally:
        release.set()
        del mlm.prepare_embeddings


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}


def test_port_in_use_is_one_line(capsys, models):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = cli_error(capsys, "serve", f"--model={models['mlm']}", f"--port={port}")
    assert f"--port={port}: 127.0.0.1:{port} is already in use" in line, line


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the worker processes")
def test_workers_exit_with_their_parent(models, tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "bert", "serve", f"--model={models['mlm']}", f"--port={port}", "--workers=2"]
    with open(tmp_path / "serve.log", "w") as log:
        parent = subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT)
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while True:
            assert parent.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                if call(port, "/health", timeout=5)[0] == 200:
                    break
            except (OSError, http.client.HTTPException):
                time.sleep(0.2)
        workers = {p for p in _children(parent.pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()}
        assert len(workers) == 2, workers
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 15
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers), "workers outlived their killed parent"
        # The port is free again: the last worker's listening socket goes with it, though the kernel may
        # release it a moment after the process is gone, so the bind is retried for a few seconds.
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
            time.sleep(0.2)
    finally:
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
