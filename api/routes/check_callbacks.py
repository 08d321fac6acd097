"""Check-back by callback (admin): a producer group's check URL, registered, read, removed.

Once a group has a URL, the engine POSTs each due check-back of the group's half messages
to it and applies the answer (docs/transactions.md has the payload). Only hosts on the
``transaction_callback_allowed_hosts`` allow-list can be registered (400 otherwise).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Path, Request
from msgspec import UNSET, Meta, UnsetType
from starlette.responses import Response

from api.auth import Permission
from api.bodies import JSON, decode, read_body
from api.context import ApiContext, Authenticated, respond
from api.openapi import operation
from scheduler.checkback.registry import CallbackRegistration
from storage.constants import GROUP_REGEX

Group = Annotated[str, Path(pattern=GROUP_REGEX, description="Producer group.")]
MAX_BODY = 16 << 10


class CheckCallbackIn(msgspec.Struct, rename="camel", kw_only=True,
                      forbid_unknown_fields=True):
    """Where the engine POSTs the group's check-backs."""

    url: Annotated[str, Meta(min_length=1, max_length=2048, description=(
        "Absolute http(s) URL; its host must be on the server's allow-list."),
        examples=["https://orders.internal.example/tx-check"])]
    secret: Annotated[str, Meta(min_length=16, max_length=256, description=(
        "Optional: each POST then carries X-Hourglass-Timestamp and X-Hourglass-Signature "
        "(sha256= HMAC-SHA256 of '<timestamp>.<body>' with this secret)."))] | UnsetType = UNSET


class CheckCallback(msgspec.Struct, rename="camel", kw_only=True):
    producer_group: str
    url: str
    has_secret: bool
    registered_at: Annotated[int, Meta(ge=0, description="Epoch milliseconds.")]


def _inline(kind: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON schema of a flat Struct, inline (api/schemas.py's components are fixed)."""
    _, components = msgspec.json.schema_components([kind])
    return components[kind.__name__]


def _operation(operation_id: str, summary: str, *, errors: tuple[int, ...],
               body: bool = False) -> dict[str, Any]:
    kwargs = operation(operation_id, tag="transactions", summary=summary, errors=errors,
                       extra_responses={200: {"description": "The group's check callback.",
                                              "content": {JSON: {"schema": _inline(
                                                  CheckCallback)}}}})
    if body:
        kwargs["openapi_extra"]["requestBody"] = {
            "required": True, "content": {JSON: {"schema": _inline(CheckCallbackIn)}}}
    return kwargs


def _out(reg: CallbackRegistration) -> CheckCallback:
    return CheckCallback(producer_group=reg.producer_group, url=reg.url,
                         has_secret=reg.secret is not None, registered_at=reg.registered_at)


def build_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    broker = ctx.broker

    @router.put("/v1/producer-groups/{group}/check-callback", **_operation(
        "setCheckCallback", "Register (or replace) the group's check-back URL (admin)",
        errors=(400, 413, 503), body=True))
    async def set_check_callback(group: Group, request: Request,
                                 principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.ADMIN)
        body = decode(await read_body(request, MAX_BODY), request.headers.get("content-type"),
                      CheckCallbackIn)
        secret = None if body.secret is UNSET else body.secret
        return respond(_out(broker.transactions.register_callback(group, body.url, secret)))

    @router.get("/v1/producer-groups/{group}/check-callback", **_operation(
        "getCheckCallback", "The group's check-back URL (admin)", errors=(404, 503)))
    async def get_check_callback(group: Group, principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.ADMIN)
        return respond(_out(broker.transactions.callbacks.get(group)))

    @router.delete("/v1/producer-groups/{group}/check-callback", **_operation(
        "deleteCheckCallback", "Stop check-back callbacks for the group; it polls again (admin)",
        errors=(404, 503)))
    async def delete_check_callback(group: Group, principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.ADMIN)
        return respond(_out(broker.transactions.callbacks.delete(group)))

    return router
