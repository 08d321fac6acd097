"""Consuming: pull delivered messages (by offset or group, with long polling) and group
offsets."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from api import schemas
from api.auth import Permission
from api.bodies import decode, read_body
from api.context import ApiContext, Authenticated, respond
from api.openapi import operation
from api.schemas import Topic
from scheduler import model

Group = Annotated[str, Path(pattern=schemas.GROUP_REGEX, description="Consumer group.")]


def delivered(message: model.Delivered) -> schemas.Delivered:
    return schemas.Delivered(
        offset=message.offset, msg_id=message.msg_id, topic=message.topic, tags=message.tags,
        keys=list(message.keys), properties=dict(message.properties),
        body_base64=message.body, body=schemas.utf8_text(message.body),
        born_at=message.born_at, deliver_at=message.deliver_at, stored_at=message.stored_at,
    )


def build_router(ctx: ApiContext) -> APIRouter:
    router = APIRouter()
    broker = ctx.broker
    notifier = ctx.notifier

    @router.get("/v1/topics/{topic}/messages", **operation(
        "pullMessages", tag="consuming", summary="Read delivered messages (long polling)",
        result="PullResult", msgpack=True, errors=(503,),
        result_description="Messages from the offset on (possibly none), and where to go on.",
    ))
    async def pull_messages(
        topic: Topic, request: Request, principal: Authenticated,
        offset: Annotated[int | None, Query(
            ge=0, description="First offset to read; default: the group's committed offset "
                              "(0 if none).")] = None,
        group: Annotated[str | None, Query(pattern=schemas.GROUP_REGEX,
                                           description="Consumer group.")] = None,
        max_messages: Annotated[int, Query(alias="max", ge=1, le=schemas.MAX_PULL,
                                           description="At most this many.")]
        = schemas.DEFAULT_PULL,
        wait_ms: Annotated[int, Query(
            alias="waitMs", ge=0, le=schemas.MAX_WAIT_MS,
            description="Wait up to this long for a first message (long poll).")] = 0,
    ) -> Response:
        ctx.allow(principal, Permission.PULL, topic)
        if offset is None:
            offset = broker.get_group_offset(topic, group) if group is not None else 0
        result = broker.pull(topic, offset, max_messages)
        if not result.messages and wait_ms > 0:
            result = await _long_poll(topic, offset, max_messages, wait_ms / 1000.0)
        return respond(schemas.PullResult(messages=[delivered(m) for m in result.messages],
                                          next_offset=result.next_offset), 200, request)

    async def _long_poll(topic: str, offset: int, max_messages: int,
                         timeout_s: float) -> model.PullResult:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            future = notifier.register(topic)  # before reading: no lost wake-up
            try:
                result = broker.pull(topic, offset, max_messages)
                if result.messages:
                    return result
                remaining = deadline - loop.time()
                if remaining <= 0 or not await notifier.wait(future, remaining) \
                        or notifier.closed:
                    return result
                # woken by a delivery to this topic: read again (it may be before `offset`)
            finally:
                notifier.unregister(topic, future)

    @router.get("/v1/topics/{topic}/groups/{group}/offset", **operation(
        "getGroupOffset", tag="consuming", summary="A group's committed offset",
        result="GroupOffset", errors=(503,),
    ))
    async def get_group_offset(topic: Topic, group: Group, principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.OFFSETS, topic)
        return respond(schemas.GroupOffset(offset=broker.get_group_offset(topic, group)))

    @router.put("/v1/topics/{topic}/groups/{group}/offset", **operation(
        "commitGroupOffset", tag="consuming", summary="Commit a group's offset",
        result="GroupOffset", body="GroupOffsetIn", errors=(503,),
    ))
    async def commit_group_offset(topic: Topic, group: Group, request: Request,
                                  principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.OFFSETS, topic)
        raw = await read_body(request, ctx.settings.max_request_bytes)
        body = decode(raw, request.headers.get("content-type"), schemas.GroupOffsetIn)
        return respond(schemas.GroupOffset(
            offset=broker.commit_group_offset(topic, group, body.offset)))

    return router
