"""Consumer groups with competing members: receive (lease), ack, nack, the group's state,
its dead letters and their redrive (scheduler/groups.py does the work).

Receive, ack and nack are hot routes (api/hot.py): they take only the ``Request`` and parse
and authenticate themselves, like send and pull. Every route needs the consumer role on the
topic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from itertools import repeat
from typing import Any, TypeVar

import msgspec
from fastapi import APIRouter, Request
from starlette.responses import Response

from api import schemas
from api.answers import PIECEWISE_FROM, body_size, respond_answer
from api.auth import Permission
from api.bodies import JSON, MSGPACK, decode, is_msgpack, prefers_body_once, read_body
from api.context import ApiContext, Authenticated, query_int, respond
from api.longpoll import woken_by
from api.native import native
from api.openapi import operation, query_parameter
from api.routes.consume import (
    MAX_OFFSET,
    PREFER_BODY,
    Group,
    body_once_applied,
    check_group,
    msgpack_array_header,
)
from api.schemas import TOPIC_PARAMETER, Topic
from api.wire_keys import RECEIVE_JSON
from scheduler.groups import AckCounts, LeasedBatch, LeasedMessage
from storage.constants import GROUP_REGEX, MAX_PULL_MESSAGES
from storage.records import LogRecord, decode_log_records

T = TypeVar("T", bound=msgspec.Struct)

GROUP_PARAMETER = {"name": "group", "in": "path", "required": True,
                   "description": "Consumer group.",
                   "schema": {"type": "string", "pattern": GROUP_REGEX}}
GROUP_PARAMETERS = [TOPIC_PARAMETER, GROUP_PARAMETER]
#: operationIds served ahead of FastAPI's router (api/app.py)
HOT = frozenset({"receiveMessages", "ackMessages", "nackMessages"})


def _fields(record: LogRecord, once: bool = False) -> dict[str, Any]:
    """The fields of ``Delivered`` (``once``: the body once, schemas.body_fields)."""
    body_base64, body = schemas.body_fields(record.body, once)
    return {"offset": record.queue_offset, "msg_id": record.msg_id, "topic": record.topic,
            "tags": record.tags, "keys": record.keys, "properties": record.properties,
            "body_base64": body_base64, "body": body, "born_at": record.born_at,
            "deliver_at": record.deliver_at, "stored_at": record.stored_at}


def received(m: LeasedMessage, once: bool = False,
             record: LogRecord | None = None) -> schemas.Received:
    """A leased message's document (``record``: its record, when decoded already); the
    fields of ``_fields`` spelled out, no dict made and unpacked per message (half the cost
    of a JSON receive's documents)."""
    r = m.record if record is None else record
    body_base64, body = schemas.body_fields(r.body, once)
    return schemas.Received(offset=r.queue_offset, msg_id=r.msg_id, topic=r.topic,
                            tags=r.tags, keys=r.keys, properties=r.properties,
                            body_base64=body_base64, body=body, born_at=r.born_at,
                            deliver_at=r.deliver_at, stored_at=r.stored_at,
                            receipt=m.receipt, delivery_count=m.delivery_count,
                            reconsume_times=m.reconsume_times)


def _received_size(m: LeasedMessage) -> int:
    """``body_size`` of a leased message, its stored bytes read directly when it has them."""
    payload = m.payload
    return len(payload) if payload is not None else body_size(m)


def receive_answer(result: LeasedBatch, acked: AckCounts | None,
                   once: bool = False) -> schemas.ReceiveResult:
    """The answer to a receive (and to the ``ack`` it carried, if any). The records kept as
    stored are decoded in one C loop (``decode_log_records``), not one call per message."""
    messages = result.messages
    payloads = [m.payload for m in messages if m.shown is None and m.payload is not None]
    if len(payloads) == len(messages):
        shown = list(map(received, messages, repeat(once), decode_log_records(payloads)))
    else:
        shown = [received(m, once) for m in messages]
    answer = schemas.ReceiveResult(messages=shown, lease_until=result.lease_until)
    if acked is not None:
        answer.acked, answer.stale = acked.acked, acked.stale
    return answer


def receive_msgpack_py(result: LeasedBatch, acked: AckCounts | None,
                       once: bool = False) -> bytes:
    """``receive_answer`` in msgpack."""
    return _msgpack.encode(receive_answer(result, acked, once))


def _receive_msgpack_native(result: LeasedBatch, acked: AckCounts | None,
                            once: bool = False) -> bytes:
    """The same bytes; each message shown as stored is transcoded from its LogRecord bytes
    in C with its receipt and counts (api/_native.pyx, see api/routes/consume.py); the
    others (retries shown as their original, and what C leaves) are encoded from their
    document."""
    assert native is not None
    head = b"\x84\xa8messages" if acked is not None else b"\x82\xa8messages"
    tail = [b"\xaaleaseUntil", _msgpack.encode(result.lease_until)]
    if acked is not None:
        tail += [b"\xa5acked", _msgpack.encode(acked.acked), b"\xa5stale",
                 _msgpack.encode(acked.stale)]
    columns = result.columns
    if columns is not None:  # the usual receive: nothing retried, all in one buffer
        answer = native.received_msgpack(*columns, once, head, b"".join(tail))
        if answer is not None:
            return answer
    messages = result.messages
    parts = _received_parts(messages, _shown_as_stored(messages), once)
    return b"".join((head, msgpack_array_header(len(parts)), *parts, *tail))


def receive_json_py(result: LeasedBatch, acked: AckCounts | None,
                    once: bool = False) -> bytes:
    """``receive_answer`` in JSON."""
    return _json.encode(receive_answer(result, acked, once))


def _receive_json_native(result: LeasedBatch, acked: AckCounts | None,
                         once: bool = False) -> bytes:
    """The same bytes, each message shown as stored transcoded in C, as
    ``_receive_msgpack_native`` does in msgpack."""
    assert native is not None
    head, lease, acked_key, stale_key = RECEIVE_JSON
    tail = [lease, _json.encode(result.lease_until)]
    if acked is not None:
        tail += [acked_key, _json.encode(acked.acked), stale_key, _json.encode(acked.stale)]
    columns = result.columns
    if columns is not None:  # the usual receive: nothing retried, all in one buffer
        answer = native.received_json(*columns, once, head, b"".join((*tail, b"}")))
        if answer is not None:
            return answer
    messages = result.messages
    at = _shown_as_stored(messages)
    if len(at) == len(messages):  # all shown as stored (given as messages)
        joined = native.received_json([m.payload for m in messages],
                                      [m.receipt for m in messages],
                                      [m.delivery_count for m in messages], once)
        if joined is not None:
            return b"".join((head, joined, *tail, b"}"))
    parts = _received_parts(messages, at, once, json=True)
    return b"".join((head, b",".join(parts), *tail, b"}"))


def _shown_as_stored(messages: Sequence[LeasedMessage]) -> list[int]:
    """Where the messages shown as stored are (C writes reconsumeTimes 0: theirs)."""
    return [i for i, m in enumerate(messages) if m.payload is not None and not m.reconsume_times]


def _received_parts(messages: Sequence[LeasedMessage], at: list[int], once: bool, *,
                    json: bool = False) -> list[bytes]:
    """Each leased message in msgpack or JSON: those ``at`` transcoded from their LogRecord
    bytes in C, the others (retries shown as their original, and what C leaves) encoded from
    their document."""
    assert native is not None
    transcode, encoder = ((native.delivered_json, _json) if json
                          else (native.delivered_msgpack, _msgpack))
    shown = messages if len(at) == len(messages) else [messages[i] for i in at]
    done, _ = transcode([m.payload for m in shown], [m.receipt for m in shown],
                        [m.delivery_count for m in shown], once)
    if shown is messages:  # the usual receive: nothing retried
        parts = done
    else:
        parts = [None] * len(messages)
        for i, part in zip(at, done, strict=True):
            parts[i] = part
    for i, part in enumerate(parts):
        if part is None:
            parts[i] = encoder.encode(received(messages[i], once))
    return parts


_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()
receive_msgpack = receive_msgpack_py if native is None else _receive_msgpack_native
receive_json = receive_json_py if native is None else _receive_json_native


def add_routes(router: APIRouter, ctx: ApiContext) -> None:
    broker = ctx.broker
    notifier = ctx.notifier
    limit = ctx.limits.max_request_bytes

    async def parse(request: Request, kind: type[T], *, optional: bool = False) -> tuple[
            str, str, T]:
        """Authenticate, authorise (consumer role on the topic), check the group, decode
        the body (``optional``: an empty body means every default)."""
        principal = ctx.caller(request)
        topic = request.path_params["topic"]
        ctx.allow(principal, Permission.PULL, topic)
        group = check_group(request.path_params["group"])
        raw = await read_body(request, limit)
        if optional and not raw.strip():
            raw = b"{}"
        return topic, group, decode(raw, request.headers.get("content-type"), kind)

    @router.post("/v1/topics/{topic}/groups/{group}:receive", **operation(
        "receiveMessages", tag="consuming", summary="Lease messages to this member (long poll)",
        result="ReceiveResult", body="ReceiveIn", msgpack=True, errors=(404, 409, 503),
        parameters=[*GROUP_PARAMETERS, PREFER_BODY],
        result_description="Leased messages (possibly none) and when their lease ends.",
    ))
    async def receive_messages(request: Request) -> Response:
        topic, group, body = await parse(request, schemas.ReceiveIn, optional=True)
        groups = broker.groups
        acked = (None if body.ack is msgspec.UNSET
                 else await ctx.write(groups.ack, topic, group, body.ack))
        if body.wait_ms > 0:
            result = await _long_poll(topic, group, body, body.wait_ms / 1000.0)
        else:
            result = groups.receive(topic, group, body.max, body.lease_ms)
        if len(result) == body.max:  # it may have left some: the next member's turn
            for t in groups.topics(topic, group):
                notifier.hand_on(t, group)
        once = prefers_body_once(request)
        if is_msgpack(request.headers.get("accept")):
            response = Response(receive_msgpack(result, acked, once), media_type=MSGPACK)
        elif (sum(map(len, result.payloads)) if result.payloads is not None
              else sum(map(_received_size, result.messages))) < PIECEWISE_FROM:
            response = Response(receive_json(result, acked, once), media_type=JSON)
        else:
            response = respond_answer(lambda ms: receive_answer(LeasedBatch(
                messages=ms, lease_until=result.lease_until), acked, once), result.messages,
                request, size=_received_size)
        return body_once_applied(response, once)

    async def _long_poll(topic: str, group: str, body: schemas.ReceiveIn,
                         timeout_s: float) -> LeasedBatch:
        """Wait for a delivery to the topic or the group's retry topic, or for a lease to
        end, then receive again; until ``timeout_s``."""
        groups = broker.groups
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        logs = groups.topics(topic, group)
        while True:
            # before reading: no lost wake-up (one future, woken by a delivery to any of them)
            future = None
            for t in logs:
                future = notifier.register(t, group, future)
            assert future is not None
            try:
                result = groups.receive(topic, group, body.max, body.lease_ms)
                remaining = deadline - loop.time()
                if len(result) or remaining <= 0 or notifier.closed:
                    return result
                expiry = groups.next_expiry(topic, group)
                if expiry is not None:
                    remaining = min(remaining, max(expiry - broker.clock.now_ms(), 1) / 1000.0)
                with notifier.slot():
                    await notifier.wait(future, remaining)
            except asyncio.CancelledError:  # woken, but gone before receiving: wake another
                woke = woken_by(future)
                if woke is not None:
                    notifier.hand_on(woke, group)
                raise
            finally:
                for t in logs:
                    notifier.unregister(t, future, group)

    @router.post("/v1/topics/{topic}/groups/{group}:ack", **operation(
        "ackMessages", tag="consuming", summary="Acknowledge leased messages (durable)",
        result="AckResult", body="AckIn", msgpack=True, errors=(404, 503),
        parameters=GROUP_PARAMETERS,
        result_description="How many were acknowledged; receipts that changed nothing.",
    ))
    async def ack_messages(request: Request) -> Response:
        topic, group, body = await parse(request, schemas.AckIn)
        result = await ctx.write(broker.groups.ack, topic, group, body.receipts)
        return respond(schemas.AckResult(acked=result.acked, stale=result.stale), 200, request)

    @router.post("/v1/topics/{topic}/groups/{group}:nack", **operation(
        "nackMessages", tag="consuming",
        summary="Hand leased messages back: a retry through the scheduler, or a dead letter",
        result="NackResult", body="NackIn", msgpack=True, errors=(404, 429, 503),
        parameters=GROUP_PARAMETERS,
    ))
    async def nack_messages(request: Request) -> Response:
        topic, group, body = await parse(request, schemas.NackIn)
        level = None if body.delay_level is msgspec.UNSET else body.delay_level
        delay = None if body.delay_ms is msgspec.UNSET else body.delay_ms
        result = await ctx.write(lambda: broker.groups.nack(
            topic, group, body.receipts, delay_level=level, delay_ms=delay))
        return respond(schemas.NackResult(retrying=result.retrying,
                                          dead_lettered=result.dead_lettered,
                                          stale=result.stale), 200, request)

    @router.get("/v1/topics/{topic}/groups/{group}", **operation(
        "getGroup", tag="consuming", summary="A group's state", result="GroupState",
        errors=(503,),
    ))
    async def get_group(topic: Topic, group: Group, principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.PULL, topic)
        state = broker.groups.state(topic, group)
        return respond(schemas.GroupState(
            committed_offset=state.committed_offset, end_offset=state.end_offset,
            leased=state.leased, retrying=state.retrying, dead_lettered=state.dead_lettered,
            expired=state.expired))

    @router.get("/v1/topics/{topic}/groups/{group}/dead-letters", **operation(
        "listDeadLetters", tag="consuming", summary="Read the group's dead letters",
        result="DeadLetterPage", errors=(503,), parameters=[
            query_parameter("offset", "First offset of the dead-letter log to read; default: "
                            "the first one not redriven.",
                            {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}),
            query_parameter("max", "At most this many.",
                            {"type": "integer", "minimum": 1, "maximum": MAX_PULL_MESSAGES,
                             "default": schemas.DEFAULT_PULL}), PREFER_BODY],
    ))
    async def list_dead_letters(topic: Topic, group: Group, request: Request,
                                principal: Authenticated) -> Response:
        ctx.allow(principal, Permission.PULL, topic)
        offset = query_int(request, "offset", None, 0, MAX_OFFSET)
        max_messages = query_int(request, "max", schemas.DEFAULT_PULL, 1, MAX_PULL_MESSAGES)
        assert max_messages is not None
        page = broker.groups.dead_letters(topic, group, offset, max_messages)
        once = prefers_body_once(request)
        response = respond(schemas.DeadLetterPage(
            messages=[schemas.DeadLetter(**_fields(r, once), reconsume_times=n)
                      for r, n in page.messages],
            next_offset=page.next_offset), 200, request)
        return body_once_applied(response, once)

    @router.post("/v1/topics/{topic}/groups/{group}/dead-letters:redrive", **operation(
        "redriveDeadLetters", tag="consuming",
        summary="Hand dead letters back to the group (due now, reconsumeTimes 0)",
        result="RedriveResult", body="RedriveIn", errors=(429, 503), parameters=GROUP_PARAMETERS,
    ))
    async def redrive_dead_letters(request: Request) -> Response:
        topic, group, body = await parse(request, schemas.RedriveIn, optional=True)
        return respond(schemas.RedriveResult(
            redriven=await ctx.write(broker.groups.redrive, topic, group, body.max)))
