"""The request checks: a body read within `max_request_bytes` as a JSON object, its fields against the
route's (`check_fields`), its options parsed and checked from their own schemas (`options`,
`option_value`), and the inputs' shapes (`text_inputs`, `pair_inputs`). Each failure is an `ApiError`
with TEI's status: 400 an empty input, 413 too many or too large, 422 anything else."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from starlette.requests import Request

from bert.serving.errors import EMPTY, ApiError
from bert.serving.schemas import OPTION_TYPES, Field


def kind_name(value: Any) -> str:
    names: dict[type, str] = {dict: "object", list: "array", str: "string"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def check_encodable(text: str, where: str) -> None:
    """JSON's "\\ud800" escapes decode to lone surrogates, which no tokenizer or UTF-8 writer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ApiError(
            422,
            f"{where} holds a lone surrogate ({text[e.start]!r} at character {e.start}), which is not text; "
            "send valid Unicode",
        ) from None


def check_fields(body: dict, fields: Collection[str], where: str) -> None:
    """Refuse a field the route does not implement, naming it, rather than drop it."""
    for name in body:
        if name not in fields:
            raise ApiError(
                422, f'{where} has no field "{name}"; this server implements {", ".join(fields)} (see GET /docs)'
            )


def check_count(n: int, name: str, limit: int) -> None:
    if n == 0:
        raise ApiError(400, f'"{name}" is empty; give at least one input', EMPTY)
    if n > limit:
        raise ApiError(413, f'{n} inputs in "{name}", more than max_client_batch_size={limit}; split the request')


def is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def text_inputs(value: Any, name: str, limit: int, ids: bool = True) -> tuple[list, bool]:
    """A text (or, with `ids`, a list of token ids) or a list of them -> (inputs, whether one was given)."""
    what = "a string, token ids, or a list of either" if ids else "a string or a list of strings"
    if isinstance(value, str) or (ids and value and is_ids(value)):
        items, single = [value], True
    elif isinstance(value, list):
        items, single = value, False
    else:
        raise ApiError(422, f'"{name}" must be {what}, got {kind_name(value)}')
    check_count(len(items), name, limit)
    for i, item in enumerate(items):
        if isinstance(item, str) or (ids and is_ids(item)):
            if not (item.strip() if isinstance(item, str) else item):
                raise ApiError(400, f'"{name}"[{i}] is empty; give some text', EMPTY)
            if isinstance(item, str):
                check_encodable(item, f'"{name}"[{i}]')
        else:
            raise ApiError(
                422, f'"{name}"[{i}] must be {"a string or token ids" if ids else "a string"}, got {kind_name(item)}'
            )
    return items, single


def one_text(value: Any, name: str) -> str:
    """A field that is one non-empty text."""
    if not isinstance(value, str):
        raise ApiError(422, f'"{name}" must be a string, got {kind_name(value)}')
    if not value.strip():
        raise ApiError(400, f'"{name}" is empty; give some text', EMPTY)
    check_encodable(value, f'"{name}"')
    return value


def text_list(value: Any, name: str, limit: int) -> list[str]:
    """A field that is a list of texts (not one text)."""
    if not isinstance(value, list):
        raise ApiError(422, f'"{name}" must be a list of strings, got {kind_name(value)}')
    return text_inputs(value, name, limit, ids=False)[0]


def pair_inputs(value: Any, limit: int) -> tuple[list[tuple[str, str | None]], bool]:
    """TEI's /predict inputs: a text, a pair [text, text_pair], or a batch [[text] | [text, text_pair], ...]."""
    shape = "a string, a pair [text, text_pair], or a batch [[text], [text, text_pair], ...]"
    if isinstance(value, str):
        items, single = [[value]], True
    elif isinstance(value, list) and value and isinstance(value[0], str):
        if len(value) > 2:
            raise ApiError(422, f'"inputs" of {len(value)} strings: give {shape}')
        items, single = [value], True
    elif isinstance(value, list):
        items, single = value, False
        check_count(len(items), "inputs", limit)
    else:
        raise ApiError(422, f'"inputs" must be {shape}, got {kind_name(value)}')
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, list) or not 1 <= len(item) <= 2 or not all(isinstance(t, str) for t in item):
            raise ApiError(422, f'"inputs"[{i}] must be [text] or [text, text_pair], got {json.dumps(item)[:80]}')
        if not item[0].strip():
            raise ApiError(400, f'"inputs"[{i}] has an empty text', EMPTY)
        for j, text in enumerate(item):
            check_encodable(text, f'"inputs"[{i}][{j}]')
        out.append((item[0], item[1] if len(item) == 2 else None))
    return out, single


async def read_json(request: Request, limit: int) -> dict:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the body has {length} bytes, more than max_request_bytes={limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the body is over max_request_bytes={limit}")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(422, f"the body is not valid JSON: {e}") from None
    except RecursionError:
        # The depth limit: json's parser stops at the interpreter's recursion limit (about 1000 levels).
        raise ApiError(422, "the body is nested too deeply; send a flat JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(422, f"the body must be a JSON object, got {kind_name(body)}")
    return body


def option_value(value: Any, schema: dict, name: str) -> Any:
    """An option's value as its schema declares it: absent or null -> the schema's default; else its type,
    `enum` and `minimum` checked; an object's own fields checked the same way (an unknown one refused)."""
    kind = OPTION_TYPES[schema["type"]]
    if value is None:
        if kind is not dict:
            return schema.get("default")
        value = {}
    if type(value) is not kind:  # bool is an int in Python, but not in JSON
        raise ApiError(422, f'"{name}" must be {kind.__name__}, got {kind_name(value)}')
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        check_fields(value, properties, f'"{name}"')
        return {key: option_value(value.get(key), sub, f"{name}.{key}") for key, sub in properties.items()}
    if "enum" in schema and value not in schema["enum"]:
        raise ApiError(422, f'"{name}" must be {" or ".join(json.dumps(v) for v in schema["enum"])}, got {value!r}')
    if "minimum" in schema and value < schema["minimum"]:
        raise ApiError(422, f'"{name}"={value} must be at least {schema["minimum"]}')
    return value


def options(body: dict, fields: dict[str, Field]) -> dict[str, Any]:
    """The route's options (`Field.option`) of `body`, each checked and defaulted by `option_value`."""
    return {name: option_value(body.get(name), f.schema, name) for name, f in fields.items() if f.option}
