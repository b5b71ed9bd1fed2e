"""The OpenAPI 3.0 document of what the server accepts and answers (`GET /openapi.json`) and the same as an
HTML page (`GET /docs`), both written from `schemas.ENDPOINTS`, so that what the server publishes is what
it accepts."""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING, Any

import bert
from bert.serving.schemas import (
    DISPATCH_PATHS,
    ENDPOINT,
    ENDPOINTS,
    ERROR_SCHEMA,
    OPENAI_ERROR_SCHEMA,
    Endpoint,
    Field,
    dispatch_targets,
)
from bert.serving.settings import ServeSettings

if TYPE_CHECKING:
    from bert.inference import Predictor


def openapi_document(predictor: Predictor, settings: ServeSettings) -> dict:
    """The OpenAPI 3.0 document of what this server accepts and answers, written from `ENDPOINTS`; POST /
    is described as the route it dispatches to for this model."""
    schemas = {"ErrorResponse": ERROR_SCHEMA, "OpenAICompatErrorResponse": OPENAI_ERROR_SCHEMA}
    paths: dict[str, dict] = {}

    def operation(e: Endpoint, fields: dict[str, Field] | dict | None = None) -> dict:
        op: dict[str, Any] = {"summary": e.summary, "operationId": e.handler + e.path.replace("/", "_")}
        if e.method == "POST":
            body = fields if isinstance(fields, dict) and "anyOf" in fields else _request_schema(e.fields)
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
        content = {e.media_type: {"schema": e.answer}} if e.media_type == "application/json" else {e.media_type: {}}
        responses: dict[str, Any] = {"200": {"description": "the answer", "content": content}}
        error = "OpenAICompatErrorResponse" if e.openai else "ErrorResponse"
        for status in e.errors:
            responses[str(status)] = {
                "description": _STATUS_MEANING[status],
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{error}"}}},
            }
        op["responses"] = responses
        return op

    for e in ENDPOINTS:
        paths.setdefault(e.path, {})[e.method.lower()] = operation(e)
    targets = [ENDPOINT[path] for path in dispatch_targets(predictor)]
    body = {"anyOf": [_request_schema(t.fields) for t in targets]} if len(targets) > 1 else None
    for path in DISPATCH_PATHS:
        target = targets[0]
        dispatched = Endpoint(
            "POST",
            path,
            "dispatch",
            f"This model's route: {' or '.join(t.path for t in targets)} (by the body), as TEI dispatches by the head.",
            target.fields,
            {"anyOf": [t.answer for t in targets]} if body else target.answer,
            target.errors,
        )
        paths.setdefault(path, {})["post"] = operation(dispatched, body)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "bert serve",
            "description": f"{settings.served_model_name or settings.model_id} ({predictor.architecture}); "
            "text-embeddings-inference's routes and the project's own",
            "version": bert.__version__,
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


_STATUS_MEANING = {
    400: "an empty input",
    401: "a missing or wrong API key",
    413: "too many inputs or too large a body",
    422: "a malformed request, an unknown field, or an input too long without truncate",
    424: "the model's head cannot answer this route",
    429: "the queue is full; retry after Retry-After seconds",
    503: "the model worker is not running",
}


def _request_schema(fields: dict[str, Field]) -> dict:
    return {
        "type": "object",
        "required": [name for name, f in fields.items() if f.required],
        "properties": {name: {**f.schema, "description": f.description} for name, f in fields.items()},
        "additionalProperties": False,
    }


def docs_page(document: dict) -> str:
    """`openapi_document` as an HTML page: each route, what it does, its fields and its statuses."""
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>bert serve</title></head><body>",
        f"<h1>bert serve</h1><p>{html.escape(document['info']['description'])}; the same as "
        "<a href='/openapi.json'>/openapi.json</a>. A field not listed is refused (422).</p>",
    ]
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            out.append(f"<h2>{method.upper()} {html.escape(path)}</h2><p>{html.escape(op['summary'])}</p>")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            for variant in body.get("anyOf", [body]):
                rows = [
                    f"<tr><td><code>{html.escape(name)}</code>{' (required)' if name in variant['required'] else ''}"
                    f"</td><td><code>{html.escape(json.dumps({k: v for k, v in prop.items() if k != 'description'}))}"
                    f"</code></td><td>{html.escape(prop['description'])}</td></tr>"
                    for name, prop in variant.get("properties", {}).items()
                ]
                if rows:
                    out.append("<table border='1'><tr><th>field</th><th>schema</th><th>meaning</th></tr>")
                    out += rows + ["</table>"]
            statuses = ", ".join(f"{s} {r['description']}" for s, r in op["responses"].items() if s != "200")
            out.append(f"<p>Errors: {html.escape(statuses) or 'none'}.</p>")
    return "\n".join(out) + "\n</body></html>\n"
