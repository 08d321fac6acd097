"""Consuming: pull delivered messages (by offset or group, with long polling) and group
offsets."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Annotated

import msgspec
from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from api import schemas
from api.answers import PIECEWISE_FROM, PiecewiseAnswer
from api.auth import Permission
from api.bodies import JSON, MSGPACK, decode, is_msgpack, prefers_body_once, read_body
from api.context import ApiContext, Authenticated, query_bool, query_int, respond
from api.native import native
from api.openapi import operation, query_parameter
from api.schemas import TOPIC_PARAMETER, Topic
from api.wire_keys import NEXT_OFFSET, NEXT_OFFSET_JSON, PULL_HEAD, PULL_HEAD_JSON
from storage.constants import GROUP_PATTERN, GROUP_REGEX, MAX_PULL_MESSAGES
from storage.errors import InvalidArgument
from storage.records import LogRecord, decode_log_records, log_record_offsets

Group = Annotated[str, Path(pattern=GROUP_REGEX, description="Consumer group.")]


def delivered(message: LogRecord, once: bool = False) -> schemas.Delivered:
    """``once``: the body once (``Prefer: body=once``, schemas.body_fields)."""
    body_base64, body = schemas.body_fields(message.body, once)
    return schemas.Delivered(
        offset=message.queue_offset, msg_id=message.msg_id, topic=message.topic,
        tags=message.tags, keys=message.keys, properties=message.properties,
        body_base64=body_base64, body=body, born_at=message.born_at,
        deliver_at=message.deliver_at, stored_at=message.stored_at,
    )


def pull_result(payloads: list[bytes], offset: int, once: bool = False) -> schemas.PullResult:
    """The answer to a pull that read ``payloads`` (LogRecords) from ``offset``."""
    messages = decode_log_records(payloads)
    return schemas.PullResult(messages=[delivered(m, once) for m in messages],
                              next_offset=messages[-1].queue_offset + 1 if messages else offset)


def pull_msgpack_py(payloads: list[bytes], offset: int, once: bool = False) -> bytes:
    """``pull_result`` in msgpack."""
    return _msgpack.encode(pull_result(payloads, offset, once))


def _pull_msgpack_native(payloads: list[bytes], offset: int, once: bool = False) -> bytes:
    """The same bytes, each message transcoded from its payload in C (api/_native.pyx)
    without building it in Python; the messages it leaves (None) are done as in
    ``pull_result`` (which raises CorruptionError for a payload that cannot be decoded)."""
    assert native is not None
    frame: bytes | None = native.pull_frame(payloads, once)
    if frame is not None:  # every message done in C, in one buffer
        return frame
    parts, offsets = _parts(payloads, once)
    next_offset = offsets[-1] + 1 if parts else offset
    return b"".join((PULL_HEAD, msgpack_array_header(len(parts)), *parts, NEXT_OFFSET,
                     _msgpack.encode(next_offset)))


def _parts(payloads: Sequence[bytes], once: bool, *,
           json: bool = False) -> tuple[list[bytes], list[int]]:
    """Each payload's message in msgpack or JSON (in C when it can), and its offset."""
    assert native is not None
    transcode, encoder = ((native.delivered_json, _json) if json
                          else (native.delivered_msgpack, _msgpack))
    parts, offsets = transcode(list(payloads), once=once)
    for i, part in enumerate(parts):
        if part is None:
            message = decode_log_records([payloads[i]])[0]
            parts[i] = encoder.encode(delivered(message, once))
            offsets[i] = message.queue_offset
    return parts, offsets


def pull_json_py(payloads: list[bytes], offset: int, once: bool = False) -> bytes:
    """``pull_result`` in JSON."""
    return _json.encode(pull_result(payloads, offset, once))


def _pull_json_native(payloads: list[bytes], offset: int, once: bool = False) -> bytes:
    """The same bytes, each message transcoded from its payload in C (api/_native.pyx), as
    ``_pull_msgpack_native`` does in msgpack."""
    assert native is not None
    frame: bytes | None = native.pull_frame_json(payloads, once)
    if frame is not None:  # every message done in C, in one buffer
        return frame
    parts, offsets = _parts(payloads, once, json=True)
    next_offset = offsets[-1] + 1 if parts else offset
    return b"".join((PULL_HEAD_JSON, b",".join(parts), NEXT_OFFSET_JSON,
                     _json.encode(next_offset), b"}"))


def pull_answer(payloads: list[bytes], offset: int, once: bool, msgpack: bool,
                request: Request) -> Response:
    """The answer to a pull that read ``payloads`` from ``offset``: made at once, or piece
    by piece when its bodies pass ``PIECEWISE_FROM`` (api/answers.py)."""
    sizes = [len(p) for p in payloads]
    if sum(sizes) < PIECEWISE_FROM:
        if msgpack:
            return Response(pull_msgpack(payloads, offset, once), media_type=MSGPACK)
        return Response(pull_json(payloads, offset, once), media_type=JSON)
    frame = schemas.PullResult(messages=[],
                               next_offset=log_record_offsets(payloads[-1:])[0] + 1)
    encode: Callable[[Sequence[bytes]], bytes]
    if not msgpack and native is None:
        def encode(piece: Sequence[bytes]) -> bytes:
            return _json.encode([delivered(m, once) for m in decode_log_records(list(piece))])
    elif not msgpack:
        def encode(piece: Sequence[bytes]) -> bytes:
            return b"[" + b",".join(_parts(piece, once, json=True)[0]) + b"]"
    elif native is None:
        def encode(piece: Sequence[bytes]) -> bytes:
            return _msgpack.encode([delivered(m, once) for m in decode_log_records(list(piece))])
    else:
        def encode(piece: Sequence[bytes]) -> bytes:
            parts = _parts(piece, once)[0]
            return b"".join((msgpack_array_header(len(parts)), *parts))
    return PiecewiseAnswer(frame, payloads, sizes, encode, msgpack=msgpack)


def msgpack_array_header(n: int) -> bytes:
    """msgspec's header of an array of ``n``: fixarray, array16 or array32."""
    if n < 16:
        return bytes((0x90 | n,))
    return b"\xdc" + n.to_bytes(2, "big") if n < 0x10000 else b"\xdd" + n.to_bytes(4, "big")


_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()
pull_msgpack = pull_msgpack_py if native is None else _pull_msgpack_native
pull_json = pull_json_py if native is None else _pull_json_native

#: RFC 7240's ``Prefer`` request header, as the answers carrying delivered messages read it
#: (pulls, receives, dead-letter reads, streams; api.bodies.prefers_body_once)
PREFER_BODY = {"name": "Prefer", "in": "header", "required": False,
               "description": "`body=once`: each message carries its body once, as `body` when "
                              "it is UTF-8 text, else as `bodyBase64` (the default carries "
                              "`bodyBase64` always and `body` beside it for text); answered "
                              "with `Preference-Applied: body=once`. Other preferences in the "
                              "header are ignored.",
               "schema": {"type": "string", "enum": ["body=once"]}}


def body_once_applied(response: Response, once: bool) -> Response:
    """``response``, with ``Preference-Applied: body=once`` when ``once`` was applied."""
    if once:
        response.headers["Preference-Applied"] = "body=once"
    return response


MAX_OFFSET = (1 << 63) - 1
GROUP_PARAMETER = {"name": "group", "in": "path", "required": True,
                   "description": "Consumer group.",
                   "schema": {"type": "string", "pattern": GROUP_REGEX}}
PULL_PARAMETERS = [
    TOPIC_PARAMETER, PREFER_BODY,
    query_parameter("offset", "First offset to read; default: the group's committed offset "
                    "(0 if none).", {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}),
    query_parameter("group", "Consumer group: where to start when no offset is given.",
                    {"type": "string", "pattern": GROUP_REGEX}),
    query_parameter("max", "At most this many messages.",
                    {"type": "integer", "minimum": 1, "maximum": MAX_PULL_MESSAGES,
                     "default": schemas.DEFAULT_PULL}),
    query_parameter("waitMs", "Wait up to this long for a first message (long poll).",
                    {"type": "integer", "minimum": 0, "maximum": schemas.MAX_WAIT_MS,
                     "default": 0}),
    query_parameter("commit", "With `group` and `offset`: first commit `offset` as the "
                    "group's offset (everything before it is processed), then read from it: "
                    "a consumer's pull and offset commit in one request (needs the right to "
                    "commit offsets).", {"type": "boolean", "default": False}),
]


def check_group(group: str) -> str:
    if not GROUP_PATTERN.match(group):
        raise InvalidArgument(f"group {group!r} does not match {GROUP_PATTERN.pattern}")
    return group


def add_routes(router: APIRouter, ctx: ApiContext) -> None:
    broker = ctx.broker
    notifier = ctx.notifier

    @router.get("/v1/topics/{topic}/messages", **operation(
        "pullMessages", tag="consuming", summary="Read delivered messages (long polling)",
        result="PullResult", msgpack=True, errors=(410, 429, 503), parameters=PULL_PARAMETERS,
        result_description="Messages from the offset on (possibly none), and where to go on.",
    ))
    async def pull_messages(request: Request) -> Response:
        principal = ctx.caller(request)
        topic = request.path_params["topic"]
        ctx.allow(principal, Permission.PULL, topic)
        offset = query_int(request, "offset", None, 0, MAX_OFFSET)
        max_messages = query_int(request, "max", schemas.DEFAULT_PULL, 1, MAX_PULL_MESSAGES)
        wait_ms = query_int(request, "waitMs", 0, 0, schemas.MAX_WAIT_MS)
        assert max_messages is not None and wait_ms is not None
        group = request.query_params.get("group")
        if query_bool(request, "commit"):
            if group is None or offset is None:
                raise InvalidArgument("commit=true needs a group and an offset")
            ctx.allow(principal, Permission.OFFSETS, topic)
            broker.groups.set_offset(topic, check_group(group), offset)
        elif offset is None:
            offset = 0 if group is None else broker.groups.read_offset(topic, check_group(group))
        if wait_ms > 0:
            payloads = await _long_poll(topic, offset, max_messages, wait_ms / 1000.0)
        else:
            payloads = broker.read(topic, offset, max_messages)
        once = prefers_body_once(request)
        msgpack = is_msgpack(request.headers.get("accept"))
        return body_once_applied(pull_answer(payloads, offset, once, msgpack, request), once)

    async def _long_poll(topic: str, offset: int, max_messages: int,
                         timeout_s: float) -> list[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            future = notifier.register(topic)  # before reading: no lost wake-up
            try:
                payloads = broker.read(topic, offset, max_messages)
                if payloads:
                    return payloads
                remaining = deadline - loop.time()
                if remaining <= 0 or notifier.closed:
                    return payloads
                with notifier.slot():
                    if not await notifier.wait(future, remaining):
                        return payloads
                # woken by a delivery to this topic: read again (it may be before `offset`)
            finally:
                notifier.unregister(topic, future)

    @router.get("/v1/topics/{topic}", **operation(
        "getTopic", tag="consuming", summary="A topic's log: first and end offsets",
        result="TopicInfo", errors=(503,), parameters=[TOPIC_PARAMETER],
        result_description="Offsets [firstOffset, endOffset) can be read; below firstOffset "
                           "the log's retention deleted them.",
    ))
    async def get_topic(topic: Topic, principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.READ, topic)
        info = broker.topic(topic)
        return respond(schemas.TopicInfo(topic=info.topic, first_offset=info.first_offset,
                                         end_offset=info.end_offset, pending=info.pending))

    @router.get("/v1/topics/{topic}/groups/{group}/offset", **operation(
        "getGroupOffset", tag="consuming", summary="A group's committed offset",
        result="GroupOffset", errors=(503,),
    ))
    async def get_group_offset(topic: Topic, group: Group, principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.OFFSETS, topic)
        return respond(schemas.GroupOffset(offset=broker.groups.offset(topic, group)))

    @router.put("/v1/topics/{topic}/groups/{group}/offset", **operation(
        "commitGroupOffset", tag="consuming", summary="Commit a group's offset",
        result="GroupOffset", body="GroupOffsetIn", errors=(503,),
        parameters=[TOPIC_PARAMETER, GROUP_PARAMETER],
    ))
    async def commit_group_offset(request: Request) -> Response:
        """A hot route (api/hot.py): a consumer commits after every pull."""
        principal = ctx.caller(request)
        params = request.path_params
        topic = params["topic"]
        ctx.allow(principal, Permission.OFFSETS, topic)
        group = check_group(params["group"])
        raw = await read_body(request, ctx.limits.max_request_bytes)
        body = decode(raw, request.headers.get("content-type"), schemas.GroupOffsetIn)
        return respond(schemas.GroupOffset(
            offset=await ctx.write(broker.groups.set_offset, topic, group, body.offset)))
