"""Producing: send one, send a batch, cancel (by handle or id), status, scheduled peek."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from msgspec import UNSET
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from api import schemas
from api.auth import Permission
from api.bodies import (
    JSON,
    MSGPACK,
    decode,
    is_msgpack,
    prefers_minimal,
    read_body,
    to_send_request,
)
from api.context import ApiContext, Authenticated, respond
from api.errors import Forbidden
from api.native import native
from api.openapi import operation
from api.schemas import TOPIC_PARAMETER, Topic
from scheduler import model
from scheduler.intake import ColumnBatch, check_msg_id
from scheduler.listing import MAX_PAGE
from storage.constants import MAX_BATCH_MESSAGES, MSG_ID_REGEX
from storage.errors import InvalidArgument

#: RFC 7240's ``Prefer`` request header, as sendBatch reads it (api.bodies.prefers_minimal)
PREFER = {"name": "Prefer", "in": "header", "required": False,
          "description": "`return=minimal`: answer with a `BatchSummary` (how many were stored, "
                         "which were duplicates) instead of a `SendResult` per message. The "
                         "server reads the header as RFC 7240 says (other preferences in it "
                         "are ignored); these are the values it acts on.",
          "schema": {"type": "string", "enum": ["return=minimal", "return=representation"]}}

#: Path parameters, validated in the handler (after auth) but documented here.
MsgIdPath = Annotated[str, Path(alias="msgId", json_schema_extra={"pattern": MSG_ID_REGEX})]


def scheduled_answer(columns: ColumnBatch, request: Request) -> Response:
    """The 201 answer to a column batch just scheduled (``Broker.send_columns``): what
    ``respond`` would write for its SendResults, encoded in C from the columns."""
    accept_msgpack = is_msgpack(request.headers.get("accept"))
    body = None if native is None else native.scheduled_answer(
        columns.ids(), columns.topic, columns.deliver_ats, columns.timer_keys, accept_msgpack)
    if body is None:  # (a string JSON would have to escape: never, by the API)
        return respond({"results": columns.results()}, 201, request)
    return Response(body, status_code=201, media_type=MSGPACK if accept_msgpack else JSON)


def summary_answer(count: int, duplicates: list[int], request: Request) -> Response:
    """The 201 answer to a batch sent with ``Prefer: return=minimal``: how many were stored
    and which were duplicates, instead of a SendResult each (a batch of 1000 is answered
    with 22 bytes instead of ~137 KB)."""
    response = respond(schemas.BatchSummary(count=count, duplicates=duplicates), 201, request)
    response.headers["Preference-Applied"] = "return=minimal"
    return response


def add_routes(router: APIRouter, ctx: ApiContext) -> None:
    broker = ctx.broker
    request_limit = ctx.limits.max_request_bytes

    @router.post("/v1/topics/{topic}/messages", **operation(
        "sendMessage", tag="messages", summary="Send one message", ok=201,
        result="SendResult", result_description="Stored (scheduled, or delivered now).",
        body="MessageIn", errors=(503,), parameters=[TOPIC_PARAMETER],
        extra_responses={200: {
            "description": "Duplicate: (topic, msgId) was sent before; the first result.",
            "content": {"application/json": {"schema": {"$ref":
                                                        "#/components/schemas/SendResult"}}},
        }},
    ))
    async def send_message(request: Request) -> Response:
        principal = ctx.caller(request)
        topic = request.path_params["topic"]
        ctx.allow(principal, Permission.SEND, topic, sending=True)
        raw = await read_body(request, request_limit)
        message = decode(raw, request.headers.get("content-type"), schemas.MessageIn)
        result = await ctx.write(broker.send, to_send_request(message, topic))
        return respond(result, 200 if result.duplicate else 201)  # == schemas.SendResult

    @router.post("/v1/topics/{topic}/messages:batch", **operation(
        "sendBatch", tag="messages", ok=201,
        summary=f"Send up to {MAX_BATCH_MESSAGES} messages atomically",
        result=("BatchResult", "BatchSummary"),
        result_description="All stored: a `BatchResult` with the results in request order, "
                           "or, when the request prefers `return=minimal`, a `BatchSummary` "
                           "(and the header `Preference-Applied: return=minimal`).",
        body="BatchIn", msgpack=True, errors=(503,), parameters=[TOPIC_PARAMETER, PREFER],
    ))
    async def send_batch(request: Request) -> Response:
        principal = ctx.caller(request)
        topic = request.path_params["topic"]
        ctx.allow(principal, Permission.SEND, topic, sending=True)
        raw = await read_body(request, request_limit)
        content_type = request.headers.get("content-type")
        limit = ctx.limits.max_batch_messages
        minimal = prefers_minimal(request)
        # the common case read straight from the bytes, msgpack or JSON
        columns = await ctx.write(lambda: broker.send_columns(
            topic, raw, max_count=limit, json=not is_msgpack(content_type)))
        if columns is not None:  # (a column batch holds no duplicate)
            return (summary_answer(len(columns.index_keys), [], request) if minimal
                    else scheduled_answer(columns, request))
        batch = decode(raw, content_type, schemas.BatchIn)
        if len(batch.messages) > limit:
            raise InvalidArgument(f"a batch holds at most {limit} messages, got "
                                  f"{len(batch.messages)}")
        columns = await ctx.write(broker.send_columns, topic, batch.messages, UNSET)
        if columns is not None:  # the common case, with no object per message
            return (summary_answer(len(columns.index_keys), [], request) if minimal
                    else scheduled_answer(columns, request))
        requests = [to_send_request(m, topic, i) for i, m in enumerate(batch.messages)]
        results = await ctx.write(broker.send_batch, requests)
        if minimal:
            return summary_answer(len(results), [i for i, r in enumerate(results)
                                                 if r.duplicate], request)
        return respond({"results": results}, 201,  # == schemas.BatchResult
                       request)

    @router.delete("/v1/scheduled/{cancelHandle}", **operation(
        "cancelByHandle", tag="messages", summary="Cancel by the handle from SendResult",
        result="CancelResult", result_description="Cancelled: it will never be delivered.",
        errors=(404, 409, 503),
    ))
    async def cancel_by_handle(cancel_handle: Annotated[str, Path(alias="cancelHandle")],
                               principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.CANCEL)
        topic = broker.handle_topic(cancel_handle)  # NotFound for a handle that is not ours
        if not principal.may_use_topic(topic):
            raise Forbidden(f"this token may not use topic {topic!r}")
        result = await ctx.write(broker.cancel_by_handle, cancel_handle)
        return respond(schemas.CancelResult(msg_id=result.msg_id, topic=result.topic,
                                            status=result.status))

    @router.delete("/v1/topics/{topic}/messages/{msgId}", **operation(
        "cancelMessage", tag="messages", summary="Cancel by topic and msgId",
        result="CancelResult", result_description="Cancelled: it will never be delivered.",
        errors=(404, 409, 503),
    ))
    async def cancel_message(topic: Topic, msg_id: MsgIdPath,
                             principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.CANCEL, topic)
        result = await ctx.write(broker.cancel, topic, check_msg_id(msg_id))
        return respond(schemas.CancelResult(msg_id=result.msg_id, topic=result.topic,
                                            status=result.status))

    @router.get("/v1/topics/{topic}/messages/{msgId}", **operation(
        "getMessage", tag="messages", summary="Status of a message",
        result="MessageInfo", errors=(404, 503),
    ))
    async def get_message(topic: Topic, msg_id: MsgIdPath,
                          principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.READ, topic)
        return respond(message_info(broker.status(topic, check_msg_id(msg_id))))

    @router.get("/v1/topics/{topic}/scheduled", **operation(
        "listScheduled", tag="messages", summary="Peek at pending messages by deliver time",
        result="ScheduledPage", errors=(503,),
    ))
    async def list_scheduled(
        topic: Topic, principal: Authenticated,
        from_ms: Annotated[int | None, Query(alias="from", ge=0,
                                             description="Earliest deliverAt, epoch ms.")] = None,
        to_ms: Annotated[int | None, Query(alias="to", ge=0,
                                           description="End (exclusive), epoch ms.")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        cursor: Annotated[str | None, Query(max_length=1024,
                                            description="nextCursor of the previous page.")]
        = None,
    ) -> Response:
        ctx.allow(principal, Permission.READ, topic)
        if from_ms is not None and to_ms is not None and from_ms > to_ms:
            raise InvalidArgument(f"from ({from_ms}) is after to ({to_ms})")
        # a page reads up to listing_scan_budget keys: off the event loop
        page, next_cursor = await run_in_threadpool(
            broker.list_scheduled, topic, from_ms=from_ms, to_ms=to_ms, limit=limit,
            cursor=cursor)
        return respond(schemas.ScheduledPage(messages=[message_info(m) for m in page],
                                             next_cursor=next_cursor))



def message_info(info: model.MessageLookup) -> schemas.MessageInfo:
    out = schemas.MessageInfo(msg_id=info.msg_id, topic=info.topic, status=info.status,
                              deliver_at=info.deliver_at)
    if info.offset is not None:
        out.offset = info.offset
    return out

