"""The routes: `Api`, one handler per `schemas.ENDPOINTS` entry, over one `Predictor` and its `Batcher`.

A handler is called with the body's fields known to its route, the route serving this model (else 424) and
its options parsed and checked from their schemas (`checks.options`, already in `body`); it parses the
inputs, applies the rules between fields, and hands the work to the batcher (or, for the cheap routes, to
the Predictor directly).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

import bert
from bert.errors import InputError
from bert.inference import Predictor
from bert.input_lines import InputItemError
from bert.request_rules import best_first, check_dimensions, truncation_direction
from bert.serving.batcher import ANSWER, CLASSIFY, EMBED, EMBED_ALL, FILL, RANK, SIMILAR, TAG, Batcher
from bert.serving.checks import (
    check_count,
    check_encodable,
    check_fields,
    is_ids,
    kind_name,
    one_text,
    pair_inputs,
    text_inputs,
    text_list,
)
from bert.serving.errors import UNHEALTHY, ApiError
from bert.serving.metrics import Metrics
from bert.serving.openapi import docs_page, openapi_document
from bert.serving.responses import JSONResponse
from bert.serving.schemas import DIRECTION, ENDPOINTS, dispatch_targets
from bert.serving.settings import ServeSettings
from bert.tasks.common import CLASSIFICATION


class Api:
    def __init__(self, predictor: Predictor, settings: ServeSettings):
        self.predictor = predictor
        self.settings = settings
        self.metrics = Metrics()
        self.batcher = Batcher(predictor, settings, self.metrics)
        self.document = openapi_document(predictor, settings)
        self.started = int(time.time())  # /v1/models' "created"

    async def _run(self, kind: str, inputs: list, **options: Any) -> tuple[list, int]:
        return await self.batcher.submit(kind, inputs, **options)

    def _truncate(self, options: dict) -> bool:
        return self.settings.auto_truncate if options["truncate"] is None else options["truncate"]

    def _prompt_name(self, options: dict) -> str | None:
        name = options.get("prompt_name")
        try:
            self.predictor.resolve_prompt(name)
        except InputError as e:
            raise ApiError(422, f'"prompt_name": {e}') from None
        return name

    def _dimensions(self, body: dict) -> int | None:
        try:
            check_dimensions(body["dimensions"], self.predictor.config.hidden_size, '"dimensions"')
        except InputError as e:
            raise ApiError(422, str(e)) from None
        return body["dimensions"]

    def _truncation(self, options: dict) -> dict[str, Any]:
        """The Predictor's truncate and truncation_direction of a request's options (OpenAI's route has no
        direction: the default)."""
        direction = options.get("truncation_direction") or DIRECTION["default"]
        return dict(truncate=self._truncate(options), truncation_direction=truncation_direction(direction))

    async def _embed(self, request: Request, body: dict, name: str, normalize: bool) -> tuple[list, bool, int]:
        items, single = text_inputs(body.get(name), name, self.settings.max_client_batch_size)
        request.state.inputs = len(items)
        options = dict(
            pooling=self.settings.pooling,
            normalize=normalize,
            **self._truncation(body),
            prompt_name=self._prompt_name(body),
            dimensions=self._dimensions(body),
        )
        vectors, tokens = await self._run(EMBED, items, **options)
        return vectors, single, tokens

    # ---------------------------------------------------------------------------------------- routes
    async def embed(self, request: Request, body: dict) -> Response:
        vectors, _, _ = await self._embed(request, body, "inputs", body["normalize"])
        return JSONResponse(vectors)

    async def embed_all(self, request: Request, body: dict) -> Response:
        items, _ = text_inputs(body.get("inputs"), "inputs", self.settings.max_client_batch_size)
        request.state.inputs = len(items)
        options = dict(**self._truncation(body), prompt_name=self._prompt_name(body))
        rows, _ = await self._run(EMBED_ALL, items, **options)
        return JSONResponse(rows)

    async def openai_embeddings(self, request: Request, body: dict) -> Response:
        encoding = body["encoding_format"]
        model = body["model"] or self.settings.served_model_name or self.settings.model_id
        vectors, _, tokens = await self._embed(request, body, "input", True)
        data = []
        for i, v in enumerate(vectors):
            # base64: little-endian float32 bytes, what OpenAI's clients ask for by default and decode.
            embedding = base64.b64encode(v.astype("<f4").tobytes()).decode() if encoding == "base64" else v
            data.append({"object": "embedding", "embedding": embedding, "index": i})
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": model, "usage": usage})

    async def predict(self, request: Request, body: dict) -> Response:
        pairs, single = pair_inputs(body.get("inputs"), self.settings.max_client_batch_size)
        request.state.inputs = len(pairs)
        raw_scores = body["raw_scores"]
        top_k, function = body["parameters"]["top_k"], body["parameters"]["function_to_apply"]
        own = {"single_label_classification": "softmax", "multi_label_classification": "sigmoid"}
        if function == "none":
            raw_scores = True
        elif function is not None and function != own.get(self.predictor.problem_type or ""):
            raise ApiError(
                422,
                f'"parameters.function_to_apply"={function!r}: this {self.predictor.problem_type} model gives '
                f'{own.get(self.predictor.problem_type or "", "raw")} scores, or "none" for the logits',
            )
        results, _ = await self._run(CLASSIFY, pairs, raw_scores=raw_scores, **self._truncation(body))
        labels = self.predictor.labels or []
        out = [r["scores"] if "scores" in r else [{"label": labels[0], "score": r["score"]}] for r in results]
        out = [scores[:top_k] for scores in out]
        return JSONResponse(out[0] if single else out)

    async def rerank(self, request: Request, body: dict) -> Response:
        query = one_text(body.get("query"), "query")
        texts = text_list(body.get("texts"), "texts", self.settings.max_client_batch_size)
        request.state.inputs = len(texts)
        options = dict(
            query=query, pooling=self.settings.pooling, raw_scores=body["raw_scores"], **self._truncation(body)
        )
        scores, _ = await self._run(RANK, texts, **options)
        order = best_first(scores)
        text = body["return_text"]
        return JSONResponse([{"index": i, "score": scores[i], **({"text": texts[i]} if text else {})} for i in order])

    async def _cohere_rerank(self, request: Request, body: dict, documents: list[str], version: str) -> dict:
        """Cohere's answer to a rerank request (Jina's too: it adds "model" and "usage"), without documents."""
        query = one_text(body.get("query"), "query")
        request.state.inputs = len(documents)
        options = dict(query=query, pooling=self.settings.pooling, raw_scores=False, **self._truncation(body))
        scores, tokens = await self._run(RANK, documents, **options)
        order = best_first(scores, body["top_n"])
        return {
            "id": str(uuid.uuid4()),
            "model": body["model"] or self.settings.served_model_name or self.settings.model_id,
            "results": [{"index": i, "relevance_score": scores[i]} for i in order],
            "meta": {"api_version": {"version": version}, "billed_units": {"search_units": 1}},
            "usage": {"total_tokens": tokens},
        }

    async def rerank_v1(self, request: Request, body: dict) -> Response:
        value = body.get("documents")
        if not isinstance(value, list):
            raise ApiError(422, f'"documents" must be a list of strings or {{"text"}} objects, got {kind_name(value)}')
        texts = []
        for i, document in enumerate(value):
            if isinstance(document, dict):
                check_fields(document, ("text",), f'"documents"[{i}]')
                document = document.get("text")
                if not isinstance(document, str):
                    raise ApiError(422, f'"documents"[{i}]["text"] must be a string, got {kind_name(document)}')
            texts.append(document)
        texts = text_list(texts, "documents", self.settings.max_client_batch_size)
        answer = await self._cohere_rerank(request, body, texts, "1")
        if body["return_documents"]:
            for result in answer["results"]:
                result["document"] = {"text": texts[result["index"]]}
        return JSONResponse(answer)

    async def rerank_v2(self, request: Request, body: dict) -> Response:
        texts = text_list(body.get("documents"), "documents", self.settings.max_client_batch_size)
        if body["max_tokens_per_doc"] is not None:
            texts = self._first_tokens(texts, body["max_tokens_per_doc"])
        return JSONResponse(await self._cohere_rerank(request, body, texts, "2"))

    def _first_tokens(self, texts: list[str], n: int) -> list[str]:
        """Each text up to the end of its n-th token, in its own characters: a cut at a token boundary reads as
        those n tokens again when the pair is made (greedy WordPiece keeps a piece whose end stays)."""
        rows = self.predictor.tokenize(texts, add_special_tokens=False)
        return [text[: row[n - 1]["stop"]] if len(row) > n else text for text, row in zip(texts, rows)]

    async def models(self, request: Request, body: None) -> Response:
        """OpenAI's list of models: the one served, what it answers (the POST routes serving it) and when."""
        served = [e.path for e in ENDPOINTS if e.method == "POST" and e.serves(self.predictor)]
        model = {
            "id": self.settings.served_model_name or self.settings.model_id,
            "object": "model",
            "created": self.started,
            "owned_by": "bert",
            "capabilities": served,
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def similarity(self, request: Request, body: dict) -> Response:
        inputs = body.get("inputs")
        if not isinstance(inputs, dict):
            raise ApiError(422, f'"inputs" must be an object {{source_sentence, sentences}}, got {kind_name(inputs)}')
        check_fields(inputs, ("source_sentence", "sentences"), '"inputs"')
        source = one_text(inputs.get("source_sentence"), "inputs.source_sentence")
        sentences = text_list(inputs.get("sentences"), "inputs.sentences", self.settings.max_client_batch_size)
        parameters = body["parameters"]
        request.state.inputs = len(sentences) + 1
        options = dict(
            source=source,
            pooling=self.settings.pooling,
            **self._truncation(parameters),
            prompt_name=self._prompt_name(parameters),
        )
        scores, _ = await self._run(SIMILAR, sentences, **options)
        return JSONResponse(scores)

    async def tokenize(self, request: Request, body: dict) -> Response:
        texts, _ = text_inputs(body.get("inputs"), "inputs", self.settings.max_client_batch_size, ids=False)
        request.state.inputs = len(texts)
        tokens = self.predictor.tokenize(
            texts, add_special_tokens=body["add_special_tokens"], prompt_name=self._prompt_name(body)
        )
        return JSONResponse(tokens)

    async def decode(self, request: Request, body: dict) -> Response:
        ids = body.get("ids")
        rows = [ids] if is_ids(ids) and ids else ids
        if not isinstance(rows, list) or not all(is_ids(r) for r in rows):
            raise ApiError(
                422, f'"ids" must be a list of token ids or a list of such lists, got {json.dumps(ids)[:80]}'
            )
        check_count(len(rows), "ids", self.settings.max_client_batch_size)
        request.state.inputs = len(rows)
        try:
            return JSONResponse(self.predictor.decode(rows, skip_special_tokens=body["skip_special_tokens"]))
        except InputItemError as e:
            raise ApiError(422, f'"ids"[{e.index}]: {e.reason}') from None

    async def ner(self, request: Request, body: dict) -> Response:
        texts, single = text_inputs(body.get("inputs"), "inputs", self.settings.max_client_batch_size, ids=False)
        request.state.inputs = len(texts)
        results, _ = await self._run(TAG, texts)
        return JSONResponse(results[0] if single else results)

    async def fill_mask(self, request: Request, body: dict) -> Response:
        texts, single = text_inputs(body.get("inputs"), "inputs", self.settings.max_client_batch_size, ids=False)
        request.state.inputs = len(texts)
        results, _ = await self._run(FILL, texts, top_k=body["top_k"])
        return JSONResponse(results[0] if single else results)

    async def qa(self, request: Request, body: dict) -> Response:
        single = "inputs" not in body
        items = [body] if single else body["inputs"]
        if not isinstance(items, list):
            raise ApiError(422, f'"inputs" must be a list of {{"question", "context"}} objects, got {kind_name(items)}')
        check_count(len(items), "inputs", self.settings.max_client_batch_size)
        pairs = []
        for i, item in enumerate(items):
            where = "" if single else f'"inputs"[{i}]: '
            if not isinstance(item, dict):
                raise ApiError(422, f'{where}expected a {{"question", "context"}} object, got {kind_name(item)}')
            if not single:
                check_fields(item, ("question", "context"), f'"inputs"[{i}]')
            for name in ("question", "context"):
                value = item.get(name)
                if not isinstance(value, str) or not value.strip():
                    what = "is missing" if value is None else "must be a non-empty string"
                    raise ApiError(422, f'{where}"{name}" {what}')
                check_encodable(value, f'{where}"{name}"')
            pairs.append((item["question"], item["context"]))
        request.state.inputs = len(pairs)
        results, _ = await self._run(ANSWER, pairs)
        return JSONResponse(results[0] if single else results)

    def dispatched(self, body: dict) -> str:
        """The route POST / answers `body` as, for this model."""
        targets = dispatch_targets(self.predictor)
        return targets[-1] if len(targets) > 1 and isinstance(body.get("inputs"), dict) else targets[0]

    async def health(self, request: Request, body: None) -> Response:
        if not self.batcher.alive:
            raise ApiError(503, "the model worker is not running", UNHEALTHY)
        return JSONResponse({"status": "ok"})

    async def info(self, request: Request, body: None) -> Response:
        p, s = self.predictor, self.settings
        st = p.sentence_transformers
        return JSONResponse(
            {
                "model_id": s.model_id,
                "model_sha": s.model_sha,
                "model_dtype": p.dtype,
                "served_model_name": s.served_model_name or s.model_id,
                "model_type": self._model_type(),
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

    def _model_type(self) -> dict[str, Any]:
        """TEI's /info model_type: a classifier's or reranker's labels, else an embedding model's pooling."""
        p = self.predictor
        if p.task == CLASSIFICATION and p.labels is not None:
            labels = {
                "id2label": {str(i): x for i, x in enumerate(p.labels)},
                "label2id": {x: i for i, x in enumerate(p.labels)},
            }
            return {"reranker" if p.is_cross_encoder else "classifier": labels}
        try:
            pooling = self.settings.pooling or p.default_pooling
        except InputError:  # a sentence-transformers pooling this project lacks: every call names one
            pooling = "none"
        return {"embedding": {"pooling": pooling}}

    async def metrics_text(self, request: Request, body: None) -> Response:
        return Response(self.metrics.render(self.batcher.depth), media_type="text/plain; version=0.0.4")

    async def openapi(self, request: Request, body: None) -> Response:
        return JSONResponse(self.document)

    async def docs(self, request: Request, body: None) -> Response:
        return HTMLResponse(docs_page(self.document))
