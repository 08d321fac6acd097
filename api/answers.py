"""Big answers, encoded piece by piece between turns of the event loop.

A pull or a receive may answer up to ``max_answer_bytes`` (8 MiB) of bodies: in JSON, with
each body twice (``bodyBase64`` and ``body``), ~18 MiB. Made at once, its messages' decoding,
their documents and the encoding took ~35 ms of the event loop in one go, and four such
answers at once stalled every other request of the server behind them (``python -m
bench.loop_lag``: a ``/healthz`` probe's p99 at 217–556 ms).

So an answer whose bodies pass ``PIECEWISE_FROM`` is a :class:`PiecewiseAnswer`: its
messages are made and encoded ``PIECE_BYTES`` of bodies at a time, each piece written as it
is made (HTTP/1.1 chunked, no ``Content-Length``), with a turn of the loop between two
pieces, so a request waits behind a piece of each big answer in progress (~0.3 ms), not
behind whole answers. The bytes are exactly those of the answer made at once: the answer's
document is encoded with an empty ``messages`` list (its first field), which gives the bytes
before and after the messages, and each piece is an encoded list of messages without its
brackets (JSON) or array header (msgpack). The messages' own bytes are made by the caller's
``encode`` (msgspec on documents, or the native transcoder of a pull: api/routes/consume.py).

Writing waits while the socket is full (uvicorn's flow control), so a slow reader holds one
piece, not the whole answer, beyond what the transport buffers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.bodies import MSGPACK, is_msgpack
from api.context import respond
from api.transport import connection_of

PIECEWISE_FROM = 1 << 20  # bodies in an answer from which it is made piece by piece
PIECE_BYTES = 64 << 10  # bodies per piece (~0.3 ms of the loop in JSON; 64 KiB measured best)
JSON = "application/json"

_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()
_MESSAGES_JSON = b'{"messages":[]'
_MESSAGES_MSGPACK = b"\xa8messages\x90"

#: a piece's messages -> their encoded list, with its brackets or array header
EncodeList = Callable[[Sequence[Any]], bytes]


def pieces(sizes: Sequence[int], piece_bytes: int = PIECE_BYTES) -> list[tuple[int, int]]:
    """``[start, end)`` index ranges of consecutive items of about ``piece_bytes`` (at least
    one item each) by ``sizes``."""
    out: list[tuple[int, int]] = []
    start, filled = 0, 0
    for i, size in enumerate(sizes):
        filled += size
        if filled >= piece_bytes:
            out.append((start, i + 1))
            start, filled = i + 1, 0
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def _array_header(n: int) -> bytes:
    """msgpack's header of an array of ``n``: fixarray, array16 or array32."""
    if n < 16:
        return bytes((0x90 | n,))
    return b"\xdc" + n.to_bytes(2, "big") if n < 0x10000 else b"\xdd" + n.to_bytes(4, "big")


def _array_header_size(n: int) -> int:
    return 1 if n < 16 else 3 if n < 0x10000 else 5


class PiecewiseAnswer(Response):
    """``frame`` (a document whose first field is an empty ``messages`` list) with ``items``
    as its messages, each piece's encoded by ``encode`` (module doc)."""

    def __init__(self, frame: msgspec.Struct, items: Sequence[Any], sizes: Sequence[int],
                 encode: EncodeList, *, msgpack: bool, status_code: int = 200) -> None:
        super().__init__(status_code=status_code, media_type=MSGPACK if msgpack else JSON)
        del self.headers["content-length"]  # (chunked: the length is known at the end)
        self._items, self._encode, self._msgpack = items, encode, msgpack
        self._ranges = pieces(sizes)
        if msgpack:
            whole = _msgpack.encode(frame)
            at = whole.index(_MESSAGES_MSGPACK) + len(_MESSAGES_MSGPACK) - 1
            self._head, self._tail = whole[:at] + _array_header(len(items)), whole[at + 1:]
        else:
            whole = _json.encode(frame)
            assert whole.startswith(_MESSAGES_JSON), whole[:40]
            self._head, self._tail = whole[:len(_MESSAGES_JSON) - 1], whole[len(
                _MESSAGES_JSON) - 1:]

    def _piece(self, start: int, end: int) -> bytes:
        encoded = self._encode(self._items[start:end])
        if self._msgpack:
            return encoded[_array_header_size(end - start):]
        return encoded[1:-1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        held = connection_of(scope)  # (None on uvicorn's own protocol: ASGI only)
        body = self._head
        for i, (start, end) in enumerate(self._ranges):
            if i:
                await asyncio.sleep(0)  # a turn of the loop: other requests go on
                if held is not None and held.is_closing():
                    return  # the client left: the rest is made for nobody
                body = b"" if self._msgpack else b","
            await send({"type": "http.response.body", "body": body + self._piece(start, end),
                        "more_body": True})
        await send({"type": "http.response.body", "body": self._tail, "more_body": False})


def body_size(item: Any) -> int:
    """About the bytes ``item`` (a LogRecord payload, or a message holding one as
    ``payload``, or a record as ``shown``/``record`` with a ``body``) adds to an answer."""
    if isinstance(item, bytes):
        return len(item)
    payload = getattr(item, "payload", None)
    if isinstance(payload, bytes):
        return len(payload)
    record = getattr(item, "shown", None) or getattr(item, "record", None)
    body = getattr(record, "body", None)
    return len(body) if isinstance(body, bytes) else 0


def respond_answer(make: Callable[[list[Any]], msgspec.Struct], items: Sequence[Any],
                   request: Request, *, size: Callable[[Any], int] = body_size,
                   status: int = 200) -> Response:
    """``respond(make(items), status, request)`` for an answer carrying messages (a pull's, a
    receive's: ``make`` gives the answer of a list of ``items``, a Struct whose first field
    is ``messages``, one document per item): made piece by piece when the items' ``size``
    passes ``PIECEWISE_FROM`` (``make`` then called per piece: the documents are built
    piece by piece too)."""
    sizes = [size(item) for item in items]
    if sum(sizes) < PIECEWISE_FROM:
        return respond(make(list(items)), status, request)
    as_msgpack = is_msgpack(request.headers.get("accept"))
    encoder = _msgpack.encode if as_msgpack else _json.encode

    def encode(piece: Sequence[Any]) -> bytes:
        return encoder(make(list(piece)).messages)  # type: ignore[attr-defined]

    return PiecewiseAnswer(make([]), items, sizes, encode, msgpack=as_msgpack,
                           status_code=status)
