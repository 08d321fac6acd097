"""The OpenAPI document: operation metadata for the routes and the final document.

Routes read their bodies themselves (api/bodies.py) and answer with prebuilt bytes, so FastAPI
cannot infer their schemas; ``operation()`` declares them (request body, success response,
problem responses, security), with the components generated from the msgspec Structs of
api/schemas.py. ``build_openapi()`` then removes FastAPI's default 422 (this API answers 400).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.responses import Response

from api.bodies import JSON, MSGPACK
from api.dashboard_schemas import DASHBOARD_COMPONENTS
from api.problems import PROBLEM_MEDIA_TYPE
from api.schemas import COMPONENTS

REF = "#/components/schemas/{name}"
SECURITY_SCHEME = "bearerAuth"

TAGS = [
    {"name": "messages", "description": "Send, cancel and inspect scheduled messages."},
    {"name": "consuming", "description": "Read delivered messages; commit group offsets."},
    {"name": "transactions", "description": "Half messages: prepare, commit, roll back, "
                                            "and check-back polling."},
    {"name": "operations", "description": "Health, readiness, metrics, stats, snapshots."},
]

_ERROR_TEXT = {
    400: "Invalid request (INVALID_ARGUMENT, TOPIC_INVALID, DELAY_TOO_LONG).",
    401: "Missing or unknown bearer token (UNAUTHORIZED).",
    403: "The token's role or topic patterns do not allow this (FORBIDDEN).",
    404: "Unknown message, handle or transaction (NOT_FOUND).",
    409: "The state forbids it (ALREADY_DELIVERED, CONFLICT).",
    410: "OFFSET_EXPIRED: the offset lies below the topic's firstOffset (deleted by the log's "
         "retention); the problem document carries `firstOffset`.",
    413: "Body or request too large (PAYLOAD_TOO_LARGE).",
    429: "Past a rate bound or a limit of the caller's (TOO_MANY_REQUESTS): e.g. a group's quick "
         "retries, or its token's long polls and streams at once (max_long_polls_per_token); "
         "Retry-After says when to try again.",
    503: "Storage cannot take the request now; nothing was stored (UNAVAILABLE).",
}


def _ecma_patterns(schema: Any) -> Any:
    """``schema`` with the Python ``...\\Z`` patterns msgspec validates with written as JSON
    Schema (ECMA-262) says the same: ``...$``."""
    if isinstance(schema, dict):
        return {key: (value.removesuffix(r"\Z") + "$" if key == "pattern"
                      and isinstance(value, str) and value.endswith(r"\Z")
                      else _ecma_patterns(value)) for key, value in schema.items()}
    if isinstance(schema, list):
        return [_ecma_patterns(item) for item in schema]
    return schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(name=name)}


def operation(
    operation_id: str,
    *,
    tag: str,
    summary: str,
    ok: int = 200,
    result: str | tuple[str, ...] | None = None,
    result_description: str = "Success.",
    body: str | None = None,
    msgpack: bool = False,
    errors: Iterable[int] = (),
    auth: bool = True,
    extra_responses: dict[int | str, dict[str, Any]] | None = None,
    parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``router.add_api_route`` / ``@router.get`` declaring one
    operation of the contract: ``result``/``body`` name Structs of api/schemas.py (a tuple
    of names: the answer is one of them)."""
    if isinstance(result, tuple):
        schema: dict[str, Any] = {"oneOf": [_ref(name) for name in result]}
    elif result:
        schema = _ref(result)
    content: dict[str, Any] = {JSON: {"schema": schema}} if result else {}
    if result and msgpack:
        content[MSGPACK] = {"schema": schema}
    responses: dict[int | str, dict[str, Any]] = {
        ok: {"description": result_description, **({"content": content} if content else {})},
    }
    codes = set(errors) | ({401, 403} if auth else set())
    if body:
        codes |= {400, 413}
    for code in sorted(codes):
        responses[code] = {"description": _ERROR_TEXT[code],
                           "content": {PROBLEM_MEDIA_TYPE: {"schema": _ref("Problem")}}}
    responses.update(extra_responses or {})
    extra: dict[str, Any] = {}
    if parameters:
        extra["parameters"] = parameters
    if body:
        media = {JSON: {"schema": _ref(body)}}
        if msgpack:
            media[MSGPACK] = {"schema": _ref(body)}
        extra["requestBody"] = {"required": True, "content": media}
    if auth:
        extra["security"] = [{SECURITY_SCHEME: []}]
    return {
        "operation_id": operation_id,
        "summary": summary,
        "tags": [tag],
        "status_code": ok,
        "response_class": Response,
        "responses": responses,
        "openapi_extra": extra,
    }


def query_parameter(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": schema}


def build_openapi(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, description=app.description,
                      routes=app.routes, tags=TAGS)
    _, schemas = msgspec.json.schema_components(COMPONENTS + DASHBOARD_COMPONENTS,
                                                ref_template=REF)
    components = doc.setdefault("components", {})
    merged = components.setdefault("schemas", {})
    merged.pop("HTTPValidationError", None)
    merged.pop("ValidationError", None)
    merged.update(_ecma_patterns(schemas))
    merged["Stats"] = {
        "title": "Stats", "type": "object", "additionalProperties": True,
        "description": "Engine statistics: pending count, delivered/cancelled totals, scan "
                       "watermarks, delivery lag, log sizes (fields may be added).",
    }
    components["securitySchemes"] = {
        SECURITY_SCHEME: {"type": "http", "scheme": "bearer",
                          "description": "A token from the settings file, "
                                         "HOURGLASS_ADMIN_TOKEN, or the generated admin.token."},
    }
    for path_item in doc.get("paths", {}).values():
        for op in path_item.values():
            responses = op.get("responses", {})
            responses.pop("422", None)
            for spec in responses.values():
                # FastAPI adds an empty JSON schema for the declared status: drop it
                if spec.get("content") == {"application/json": {"schema": {}}}:
                    del spec["content"]
            for param in op.get("parameters", ()):
                _tidy_parameter(param)
            if op.get("parameters") and "400" not in responses:
                responses["400"] = {"description": _ERROR_TEXT[400], "content": {
                    PROBLEM_MEDIA_TYPE: {"schema": _ref("Problem")}}}
    return doc


def _tidy_parameter(param: dict[str, Any]) -> None:
    """``int | None = None`` parameters: absent means None, so document them as plain
    optional integers (generated clients read ``offset: int | Unset``, not ``None | int``)."""
    schema = param.get("schema", {})
    schema.pop("title", None)
    variants = schema.get("anyOf")
    if variants and {"type": "null"} in variants and len(variants) == 2:
        (kept,) = (v for v in variants if v != {"type": "null"})
        del schema["anyOf"]
        schema.update(kept)


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
