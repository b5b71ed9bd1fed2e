"""What the server accepts and answers: the JSON schemas (OpenAPI 3.0, TEI's where the route is TEI's),
`Field` (a request field: its schema, which is also its check, and its meaning) and `ENDPOINTS`, the one
table of routes. Each route says what it accepts and answers (read by the request checks, `GET /openapi.json`
and `GET /docs`), which models it serves (the 424 rule and `bert serve --check`), which models `POST /`
answers as it (`dispatch_targets`), and the example body `--check` sends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bert.request_rules import DIMENSIONS_MINIMUM, TOP_K_MINIMUM, TRUNCATION_DIRECTION_SPELLINGS
from bert.serving.errors import BACKEND, EMPTY, OVERLOADED, UNHEALTHY, VALIDATION
from bert.tasks.common import CLASSIFICATION, FILL_MASK, NER, QUESTION_ANSWERING

if TYPE_CHECKING:
    from bert.inference import Predictor

# JSON schemas (OpenAPI 3.0), TEI's where the route is TEI's.
_STRING = {"type": "string"}
_BOOL = {"type": "boolean"}
_NUMBER = {"type": "number", "format": "float"}
_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "format": "int32", "minimum": 0}}
_INPUT_TYPE = {"anyOf": [_STRING, _TOKEN_IDS]}
_INPUT = {"anyOf": [_INPUT_TYPE, {"type": "array", "items": _INPUT_TYPE}]}
_TEXTS = {"anyOf": [_STRING, {"type": "array", "items": _STRING}]}
_NULLABLE_STRING = {"type": "string", "nullable": True}
# The spellings of a truncation direction the Predictor takes (ours and TEI's): the one list the server checks
# a request's value against and publishes.
DIRECTION: dict[str, Any] = {"type": "string", "enum": list(TRUNCATION_DIRECTION_SPELLINGS), "default": "right"}
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
        "model_sha": _NULLABLE_STRING,  # the commit of a model loaded by its Hub id
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
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "error_type"],
    "properties": {
        "error": _STRING,
        "error_type": {"type": "string", "enum": [UNHEALTHY, BACKEND, OVERLOADED, VALIDATION, "Tokenizer", EMPTY]},
    },
}
OPENAI_ERROR_SCHEMA = {
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


# The JSON types of an option field and the Python type a JSON parser gives each.
OPTION_TYPES: dict[str, type] = {"boolean": bool, "integer": int, "string": str, "object": dict}


@dataclass(frozen=True)
class Field:
    """A request field: its JSON schema and what the server does with it (the default is in `schema`).

    An option (a boolean, integer, string or object field that is not the inputs) is parsed and checked
    from its schema alone (`checks.option_value`: type, enum, minimum, an object's own fields); the inputs
    (`required`, or `payload`: the texts, pairs or ids a request sends) have shapes the handlers parse."""

    schema: dict
    description: str
    required: bool = False
    payload: bool = False

    @property
    def option(self) -> bool:
        return not (self.required or self.payload) and self.schema.get("type") in OPTION_TYPES


def _truncate_field() -> Field:
    return Field(
        {"type": "boolean", "nullable": True},
        "cut inputs longer than the model's max_input_length instead of refusing them (422); default: false, "
        "or true with --auto_truncate",
    )


_DIRECTION_FIELD = Field(DIRECTION, 'which end of a long input is cut: "right" keeps its start, "left" its end')
_PROMPT_FIELD = Field(
    _NULLABLE_STRING,
    "a prompt of the model's config_sentence_transformers.json, prepended to each text (default: "
    "--default_prompt_name, else the model's default_prompt_name, else none)",
)
_DIMENSIONS_FIELD = Field(
    {"type": "integer", "minimum": DIMENSIONS_MINIMUM, "nullable": True},
    "keep the vectors' first `dimensions` components (Matryoshka), then normalize when normalizing",
)
# Which models a route serves (asked of another model, it answers 424), and which models POST / answers
# as it: a head's own route for its head, else /embed (or /similarity, by the body).
Serves = Callable[["Predictor"], bool]


def any_model(p: Predictor) -> bool:
    return True


def no_model(p: Predictor) -> bool:
    return False


def embeds(p: Predictor) -> bool:
    return p.can_embed  # a head's ONNX graph has no encoder outputs to embed with


def classifies(p: Predictor) -> bool:
    return p.has_head(CLASSIFICATION)


def classifies_not_ranks(p: Predictor) -> bool:
    return p.has_head(CLASSIFICATION) and not p.is_cross_encoder


def is_cross_encoder(p: Predictor) -> bool:
    return p.is_cross_encoder


def ranks(p: Predictor) -> bool:
    return p.is_cross_encoder or (not p.has_head(CLASSIFICATION) and p.can_embed)


def tags(p: Predictor) -> bool:
    return p.has_head(NER)


def answers_questions(p: Predictor) -> bool:
    return p.has_head(QUESTION_ANSWERING)


def fills_masks(p: Predictor) -> bool:
    return p.has_head(FILL_MASK)


def has_no_head_route(p: Predictor) -> bool:
    return not any(p.has_head(task) for task in (CLASSIFICATION, NER, QUESTION_ANSWERING, FILL_MASK))


_EMBEDDING_MODEL = "an embedding model (a torch model, or the ONNX graph of a BertModel)"
EXAMPLE_TEXT = "This is a fine test."
_EXAMPLE_CONTEXT = "John Smith lives in New York."
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


# The rerank APIs of Cohere (v1, v2) and Jina, which the cohere SDK, LangChain's CohereRerank and MTEB's remote
# rerankers call: the documents' relevance to the query, best first, scored as /rerank scores them.
_RERANK_DOCUMENT = {"type": "object", "required": ["text"], "properties": {"text": _STRING}}
_RERANK_FIELDS = {
    "model": Field(_NULLABLE_STRING, "echoed in the answer; the served model answers whatever it names"),
    "query": Field(_STRING, "the query", True),
    "top_n": Field({"type": "integer", "minimum": 1, "nullable": True}, "the best n documents only (default: all)"),
    "truncate": Field(
        {"type": "boolean", "default": True},
        "cut each query-document pair to the model's max_input_length, as Cohere cuts long documents; false: "
        "refuse it (422)",
    ),
}


def _rerank_answer(document: bool) -> dict:
    result: dict[str, Any] = {
        "type": "object",
        "required": ["index", "relevance_score"],
        "properties": {"index": {"type": "integer", "minimum": 0}, "relevance_score": _NUMBER},
    }
    if document:
        result["properties"]["document"] = _RERANK_DOCUMENT
    return {
        "type": "object",
        "required": ["id", "results", "meta"],
        "properties": {
            "id": _STRING,
            "model": _STRING,
            "results": {"type": "array", "items": result},
            "meta": {"type": "object"},
            "usage": {"type": "object", "properties": {"total_tokens": {"type": "integer"}}},
        },
    }


_MODELS_ANSWER = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": _STRING,
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "object", "created", "owned_by"],
                "properties": {
                    "id": _STRING,
                    "object": _STRING,
                    "created": {"type": "integer"},
                    "owned_by": _STRING,
                    "capabilities": {"type": "array", "items": _STRING},
                },
            },
        },
    },
}
_RERANK_NEEDS = "a cross-encoder (one label) or an embedding model"
_RERANK_EXAMPLE = {"query": "What is this?", "documents": [EXAMPLE_TEXT, _EXAMPLE_CONTEXT], "top_n": 1}


@dataclass(frozen=True)
class Endpoint:
    """One route: what it accepts and answers (the request checks, /openapi.json and /docs), which models it
    serves (else 424, naming `needs`; `bert serve --check` asks the routes a model serves, with `example`)
    and which models POST / answers as it (`dispatched`)."""

    method: str
    path: str
    handler: str  # the `routes.Api` method (and the operationId)
    summary: str
    fields: dict[str, Field] = field(default_factory=dict)  # a POST body's fields
    answer: dict = field(default_factory=dict)  # the 200 body's schema
    errors: tuple[int, ...] = (400, 401, 413, 422, 424, 429)
    tei: bool = True  # one of TEI's routes (else the project's own)
    openai: bool = False  # errors in OpenAI's shape
    public: bool = False  # answered without the API key (health checks)
    media_type: str = "application/json"
    serves: Serves = any_model
    needs: str = ""  # the models `serves` accepts, for the 424 message
    dispatched: Serves = no_model
    example: dict | Callable[[Predictor], dict] | None = None  # a POST body `--check` sends

    def example_body(self, predictor: Predictor) -> dict | None:
        return self.example(predictor) if callable(self.example) else self.example


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
        serves=embeds,
        needs=_EMBEDDING_MODEL,
        dispatched=has_no_head_route,
        example={"inputs": EXAMPLE_TEXT, "truncate": True},
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
        serves=embeds,
        needs=_EMBEDDING_MODEL,
        example={"inputs": EXAMPLE_TEXT, "truncate": True},
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
        serves=no_model,
        needs="a SPLADE model, which this project does not serve (use /embed)",
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
                        "top_k": {"type": "integer", "minimum": TOP_K_MINIMUM, "nullable": True},
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
        serves=classifies,
        needs="a classification model",
        dispatched=classifies_not_ranks,
        example={"inputs": EXAMPLE_TEXT, "truncate": True},
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
        serves=ranks,
        needs="a cross-encoder (one label) or an embedding model",
        dispatched=is_cross_encoder,
        example={"query": "What is this?", "texts": [EXAMPLE_TEXT, _EXAMPLE_CONTEXT], "truncate": True},
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
                        "truncation_direction": DIRECTION,
                        "prompt_name": _NULLABLE_STRING,
                    },
                },
                "truncate, truncation_direction and prompt_name, as /embed takes them",
            ),
        },
        {"type": "array", "items": _NUMBER},
        serves=embeds,
        needs=_EMBEDDING_MODEL,
        dispatched=has_no_head_route,
        example={"inputs": {"source_sentence": EXAMPLE_TEXT, "sentences": [_EXAMPLE_CONTEXT]}},
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
        example={"inputs": EXAMPLE_TEXT},
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
        example=lambda p: {"ids": p.tokenizer.encode(EXAMPLE_TEXT)},
    ),
    *(
        Endpoint(
            "POST",
            path,
            "openai_embeddings",
            summary,
            _OPENAI_FIELDS,
            _OPENAI_ANSWER,
            openai=True,
            serves=embeds,
            needs=_EMBEDDING_MODEL,
            example={"input": EXAMPLE_TEXT, "truncate": True},
        )
        for path, summary in [
            ("/v1/embeddings", "OpenAI's embeddings API; normalized vectors."),
            ("/embeddings", "The same as /v1/embeddings."),
        ]
    ),
    Endpoint(
        "POST",
        "/v1/rerank",
        "rerank_v1",
        "Cohere's v1 and Jina's rerank API: the documents by relevance to the query, best first, scored as "
        "/rerank scores them.",
        {
            **_RERANK_FIELDS,
            "documents": Field(
                {"type": "array", "items": {"anyOf": [_STRING, _RERANK_DOCUMENT]}},
                'the documents: strings or {"text"} objects',
                True,
            ),
            "return_documents": Field({"type": "boolean", "default": False}, 'give each document as {"text"}'),
        },
        _rerank_answer(document=True),
        tei=False,
        openai=True,
        serves=ranks,
        needs=_RERANK_NEEDS,
        example={**_RERANK_EXAMPLE, "return_documents": True},
    ),
    Endpoint(
        "POST",
        "/v2/rerank",
        "rerank_v2",
        "Cohere's v2 rerank API: the documents by relevance to the query, best first, scored as /rerank scores them.",
        {
            **_RERANK_FIELDS,
            "documents": Field({"type": "array", "items": _STRING}, "the documents", True),
            "max_tokens_per_doc": Field(
                {"type": "integer", "minimum": 1, "nullable": True},
                "cut each document after its first n tokens before it is paired with the query (Cohere's default "
                "4096; null: only the pair's cut to max_input_length)",
            ),
        },
        _rerank_answer(document=False),
        tei=False,
        openai=True,
        serves=ranks,
        needs=_RERANK_NEEDS,
        example=_RERANK_EXAMPLE,
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
        serves=tags,
        needs="a ner model",
        dispatched=tags,
        example={"inputs": _EXAMPLE_CONTEXT},
    ),
    Endpoint(
        "POST",
        "/qa",
        "qa",
        "The answer span of a question in its context; a question-answering model.",
        {
            "question": Field(_STRING, "one question (with context)", payload=True),
            "context": Field(_STRING, "its context", payload=True),
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
        serves=answers_questions,
        needs="a question-answering model",
        dispatched=answers_questions,
        example={"question": "Where does he live?", "context": _EXAMPLE_CONTEXT},
    ),
    Endpoint(
        "POST",
        "/fill-mask",
        "fill_mask",
        "The likeliest tokens at each [MASK]; a masked-LM model.",
        {
            "inputs": Field(_TEXTS, "a text or a list of texts, each with [MASK] where a word is to be guessed", True),
            "top_k": Field({"type": "integer", "minimum": TOP_K_MINIMUM, "default": 5}, "predictions per mask"),
        },
        {"anyOf": [_FILLED, {"type": "array", "items": _FILLED}]},
        tei=False,
        serves=fills_masks,
        needs="a fill-mask model",
        dispatched=fills_masks,
        example={"inputs": "Paris is the [MASK] of France.", "top_k": 3},
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
    Endpoint(
        "GET",
        "/v1/models",
        "models",
        "OpenAI's model list: the served model, with the POST routes it answers as its capabilities.",
        answer=_MODELS_ANSWER,
        errors=(401,),
        tei=False,
        openai=True,
    ),
    Endpoint("GET", "/metrics", "metrics_text", "Prometheus metrics.", errors=(), public=True, media_type="text/plain"),
    Endpoint("GET", "/openapi.json", "openapi", "This document.", answer={"type": "object"}, errors=(401,), tei=False),
    Endpoint("GET", "/docs", "docs", "This document as a page.", errors=(401,), tei=False, media_type="text/html"),
)
# POST / (and /invocations, SageMaker's) answers as the route of the model's head, as TEI dispatches it.
DISPATCH_PATHS = ("/", "/invocations")
# The POST routes by path.
ENDPOINT = {e.path: e for e in ENDPOINTS if e.method == "POST"}


def dispatch_targets(predictor: Predictor) -> list[str]:
    """The routes POST / answers as, for this model's head (the first unless the body says otherwise: an
    embedding model answers a {source_sentence, sentences} body, which huggingface_hub's sentence_similarity
    posts to the base URL, as /similarity)."""
    return [e.path for e in ENDPOINTS if e.method == "POST" and e.dispatched(predictor)]
