"""Request bodies: read with a size cap, decode JSON or msgpack with msgspec, and turn
``MessageIn`` into the engine's ``SendRequest``.

Decoding goes straight from bytes to validated Structs (no pydantic model in between); the
OpenAPI document still declares the same schemas (api/openapi.py), so clients see one truth.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import msgspec
from starlette.requests import ClientDisconnect, Request

from api.schemas import MessageIn
from scheduler.model import SendRequest
from storage.errors import InvalidArgument, PayloadTooLarge

T = TypeVar("T")

JSON = "application/json"
MSGPACK = "application/x-msgpack"
_MSGPACK_TYPES = (MSGPACK, "application/msgpack", "application/vnd.msgpack")

_UNSET = msgspec.UNSET
_NO_PROPERTIES: Mapping[str, str] = MappingProxyType({})  # shared, read-only

_json_decoders: dict[type, msgspec.json.Decoder[Any]] = {}
_msgpack_decoders: dict[type, msgspec.msgpack.Decoder[Any]] = {}


def is_msgpack(content_type: str | None) -> bool:
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() in _MSGPACK_TYPES


def preference(request: Request, name: str) -> str | None:
    """The value of the preference ``name`` in the request's ``Prefer`` headers (RFC 7240:
    preferences are comma-separated, in one or several ``Prefer`` headers, names
    case-insensitive, a value may be quoted, parameters after ``;`` are ignored, and only the
    first instance of a preference counts), lower-cased; "" for a name without a value,
    None when it is not asked for."""
    for header in request.headers.getlist("prefer"):
        for item in header.split(","):
            key, _, value = item.split(";", 1)[0].partition("=")
            if key.strip().lower() == name:
                return value.strip().strip('"').lower()
    return None


def prefers_minimal(request: Request) -> bool:
    """True when the request asks for ``Prefer: return=minimal`` (a send batch's answer)."""
    return preference(request, "return") == "minimal"


def prefers_body_once(request: Request) -> bool:
    """True when the request asks for ``Prefer: body=once``: each delivered message in the
    answer carries its body once (api/schemas.py ``body_fields``)."""
    return preference(request, "body") == "once"


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body, or PayloadTooLarge as soon as it exceeds ``limit`` bytes
    (by Content-Length before reading anything, or while streaming a chunked body)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit}")
    chunks = []
    size = 0
    receive = request.receive  # straight from ASGI: Request.stream() costs a generator
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def decode(raw: bytes, content_type: str | None, kind: type[T]) -> T:
    """Validated ``kind`` from a JSON (default) or msgpack body; InvalidArgument otherwise."""
    try:
        if is_msgpack(content_type):
            decoder = _msgpack_decoders.get(kind)
            if decoder is None:
                decoder = _msgpack_decoders[kind] = msgspec.msgpack.Decoder(kind)
            return decoder.decode(raw)
        json_decoder = _json_decoders.get(kind)
        if json_decoder is None:
            json_decoder = _json_decoders[kind] = msgspec.json.Decoder(kind)
        return json_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidArgument(str(exc)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        what = "msgpack" if is_msgpack(content_type) else "JSON"
        raise InvalidArgument(f"malformed {what} body: {exc}") from None


def to_send_request(message: MessageIn, topic: str, index: int | None = None) -> SendRequest:
    """The engine's request for one schema-valid ``MessageIn``. The engine checks the rest
    (topic, sizes, timing, msgId); here only what it cannot see: body vs bodyBase64.
    ``index`` names the batch entry in errors ("messages[3]: ..."). Hot path of batch sends:
    plain local look-ups only."""
    text, raw = message.body, message.body_base64
    if text is not _UNSET:
        if raw is not _UNSET:
            raise InvalidArgument(f"{_where(index)}exactly one of body and bodyBase64 is "
                                  "allowed, not both")
        body = text.encode("utf-8")  # the decoders refuse lone surrogates
    elif raw is not _UNSET:
        body = raw
    else:
        raise InvalidArgument(f"{_where(index)}exactly one of body and bodyBase64 is required")
    tags, keys, properties = message.tags, message.keys, message.properties
    msg_id, deliver_at = message.msg_id, message.deliver_at
    delay_ms, delay_level = message.delay_ms, message.delay_level
    return SendRequest(
        topic=topic, body=body,
        tags=None if tags is _UNSET else tags,
        keys=() if keys is _UNSET else tuple(keys),
        properties=_NO_PROPERTIES if properties is _UNSET else properties,
        msg_id=None if msg_id is _UNSET else msg_id,
        deliver_at=None if deliver_at is _UNSET else deliver_at,
        delay_ms=None if delay_ms is _UNSET else delay_ms,
        delay_level=None if delay_level is _UNSET else delay_level,
    )


def _where(index: int | None) -> str:
    return "" if index is None else f"messages[{index}]: "
