"""A standing stream of a topic's delivered messages (an hourglass addition to the contract).

``GET /v1/topics/{topic}/messages:stream?offset=&group=&max=&durationMs=`` answers 200 at once
and then writes, on the same response, one frame each time messages land: a frame is exactly
what a pull from the frame's offset would answer (``PullResult``: ``messages`` and
``nextOffset``), the next frame goes on from that ``nextOffset``. In JSON a frame is one line
(``application/x-ndjson``); with ``Accept: application/x-msgpack`` it is one msgpack map
(msgpack values delimit themselves). ``Prefer: body=once`` works as on a pull.

Why. A consumer that pulls with ``waitMs`` sends a request per batch; at a steady trickle
(2 k msg/s, a delivery commit every few ms) that is a request, a parse and a long-poll
registration per commit, with the server woken twice for each. A stream costs one write per
commit. Like RocketMQ's push consumer, which persists its offsets every few seconds, the
client commits its offset itself (``PUT …/groups/{group}/offset``), as often as it likes.

Bounds. A stream holds one of the server's long-poll slots (503 when they are all taken)
and one of its token's (``max_long_polls_per_token``, shared with the token's waiting pulls
and receives: 429 ``TOO_MANY_REQUESTS`` past them; api/longpoll.py); it ends after
``durationMs`` (default 5 min, at most 1 h) and at server shutdown, with the last frame
complete, and the client goes on from the last ``nextOffset``. When nothing lands for
``HEARTBEAT_S`` the server writes a frame without messages, so a client (or a proxy) can
tell a quiet stream from a dead one; the first frame is written at once, with or without
messages (it is what a pull would answer now). A slow reader is not buffered for: the next
read waits until the socket has taken the previous frame (uvicorn's flow control).

A stalled reader. uvicorn's wait for the socket to take a frame has no deadline, and
``durationMs`` is looked at only between frames, so a client that stops reading would hold
its slot (and the frame's memory) for ever. :class:`StallWatch` looks at the connection
every quarter of ``stream_stall_ms``: the bytes waiting for the client (the transport's
buffer plus what the kernel holds unacknowledged, ``TIOCOUTQ``); when some wait and none
has been taken (their number never fell) for ``stream_stall_ms``, the connection is aborted
(logged at INFO, counted in ``hourglass_streams_stalled``), which ends the stream and frees
its slot. A reader that takes bytes, however slowly, is not stalled; nor is a quiet stream
whose client has everything.

Who writes. A stream that has caught up is lent, while it waits, to the thread that commits
the next delivery, which writes that frame itself (api/push.py): no event-loop wake-up per
delivery. The loop writes the rest: the first frame, heartbeats, and whatever follows a
hand-back (a slow reader, a closing connection, a refused read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from api.auth import Permission
from api.bodies import MSGPACK, is_msgpack, prefers_body_once
from api.context import ApiContext, query_int
from api.longpoll import DeliveryNotifier
from api.native import native
from api.openapi import REF, operation, query_parameter
from api.push import ParkedStream, Pieces, StreamPusher
from api.routes.consume import (
    MAX_OFFSET,
    PREFER_BODY,
    body_once_applied,
    check_group,
    pull_json,
    pull_msgpack,
)
from api.schemas import TOPIC_PARAMETER
from api.transport import Connection, connection_of, unsent_bytes
from scheduler.broker import Broker
from storage.constants import GROUP_REGEX, MAX_PULL_MESSAGES
from storage.errors import HourglassError, OffsetExpired
from storage.records import log_record_offsets

log = logging.getLogger("hourglass.api")

NDJSON = "application/x-ndjson"
HEARTBEAT_S = 15.0  # a frame without messages after this long without one
DEFAULT_DURATION_MS = 300_000
MAX_DURATION_MS = 3_600_000
#: bodies of at least this many bytes go to the socket as views of their payloads, not
#: copied into the frame (msgpack with ``body=once``, frames the pusher writes: api/push.py)
PIECE_MIN_BYTES = 4096

STREAM_PARAMETERS = [
    TOPIC_PARAMETER, PREFER_BODY,
    query_parameter("offset", "First offset to stream; default: the group's committed offset "
                    "(0 if none).", {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET}),
    query_parameter("group", "Consumer group: where to start when no offset is given (the "
                    "stream does not commit; PUT the group's offset for that).",
                    {"type": "string", "pattern": GROUP_REGEX}),
    query_parameter("max", "At most this many messages per frame.",
                    {"type": "integer", "minimum": 1, "maximum": MAX_PULL_MESSAGES,
                     "default": MAX_PULL_MESSAGES}),
    query_parameter("durationMs", "End the stream after this long (the client goes on from "
                    "the last nextOffset).",
                    {"type": "integer", "minimum": 1, "maximum": MAX_DURATION_MS,
                     "default": DEFAULT_DURATION_MS}),
]
_FRAMES = {"description": "A frame per delivery: each a PullResult, the next one from its "
                          "nextOffset; a frame without messages every "
                          f"{HEARTBEAT_S:.0f} s of quiet.",
           "content": {media: {"schema": {"$ref": REF.format(name="PullResult")}}
                       for media in (NDJSON, MSGPACK)}}


class StallWatch:
    """Calls ``on_stall`` once when the client of ``transport`` (socket ``fd``) has taken
    none of the bytes waiting for it for ``stall_s`` (module doc); until ``cancel``."""

    __slots__ = ("_fd", "_handle", "_interval", "_last", "_loop", "_on_stall", "_since",
                 "_stall_s", "_transport")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Any, fd: int | None,
                 stall_s: float, on_stall: Callable[[int], None]) -> None:
        self._loop, self._transport, self._fd = loop, transport, fd
        self._stall_s, self._on_stall = stall_s, on_stall
        self._interval = max(stall_s / 4, 0.005)
        self._since: float | None = None  # the first look since the client last took bytes
        self._last = 0  # the bytes waiting at the last look
        self._handle = loop.call_later(self._interval, self._look)

    def _look(self) -> None:
        transport = self._transport
        if transport.is_closing():
            return
        waiting = transport.get_write_buffer_size() + unsent_bytes(self._fd)
        now = self._loop.time()
        if waiting == 0 or waiting < self._last:  # all taken, or some: not stalled
            self._since = None
        elif self._since is None:  # bytes wait and none taken: counted from now, not earlier
            self._since = now
        self._last = waiting
        if self._since is not None and now - self._since >= self._stall_s:
            self._on_stall(waiting)
            return
        self._handle = self._loop.call_later(self._interval, self._look)

    def cancel(self) -> None:
        self._handle.cancel()


class StreamResponse(Response):
    """Frames of ``topic`` from ``offset`` until ``duration_s`` pass, the client leaves or
    stalls (``stall_s``) or the server closes; holds one long-poll slot (taken by the
    caller) and gives it back. ``encoding``: equal for streams whose ``encode`` makes the
    same bytes (their frames are made once per commit: api/push.py)."""

    def __init__(self, broker: Broker, notifier: DeliveryNotifier, pusher: StreamPusher,
                 topic: str, offset: int, max_messages: int, duration_s: float,
                 encode: Callable[[list[bytes], int], bytes], media_type: str,
                 release: Callable[[], None], *, stall_s: float = 30.0,
                 encoding: Any = None, pieces: Pieces | None = None) -> None:
        super().__init__(status_code=200, media_type=media_type,
                         headers={"cache-control": "no-store"})
        del self.headers["content-length"]  # (chunked: the length is not known)
        self._broker, self._notifier, self._pusher = broker, notifier, pusher
        self._topic, self._offset, self._max = topic, offset, max_messages
        self._duration_s, self._encode, self._release = duration_s, encode, release
        self._stall_s, self._encoding, self._pieces = stall_s, encoding, pieces
        self._connection: Any = None  # the connection's transport, when the server tells it
        self._gone = False  # the client left
        self._waiting: asyncio.Future[str | None] | None = None  # the wait in progress
        self._parked: ParkedStream | None = None  # when the pusher may write it (api/push.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        watcher = asyncio.ensure_future(self._watch(receive))
        held = connection_of(scope)  # (None on uvicorn's own protocol: the loop writes)
        stall = None if held is None else StallWatch(
            loop, held.transport, held.fd, self._stall_s, self._stalled(held))
        if held is not None:
            self._connection = held.transport
            if held.fd is None:
                held = None  # (TLS: no plain socket to write on; the loop writes every frame)
        try:
            if held is not None and self._pusher.enabled:  # lend the stream while it waits
                self._parked = self._lendable(held, loop)
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            await self._frames(loop, send, held)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # the connection broke under a write: nobody to answer
            pass
        finally:
            watcher.cancel()
            if stall is not None:
                stall.cancel()
            if self._parked is not None:
                self._parked.close()
            self._release()

    def _stalled(self, held: Connection) -> Callable[[int], None]:
        def end(waiting: int) -> None:
            log.info("stream of %s ended at offset %d: its client took none of the %d bytes "
                     "waiting for it in %.1f s", self._topic, self._offset, waiting,
                     self._stall_s)
            self._pusher.count(stalled=1)
            held.transport.abort()  # the stream sees the client gone and gives its slot back
        return end

    def _lendable(self, held: Connection,
                  loop: asyncio.AbstractEventLoop) -> ParkedStream | None:
        """The stream's state for the pusher; None (the loop writes every frame) when its
        socket cannot be duplicated (e.g. no descriptor left: EMFILE)."""
        assert held.fd is not None
        try:
            return ParkedStream(
                self._pusher, topic=self._topic, offset=self._offset, max_messages=self._max,
                encode=self._encode, read=self._broker.read_prevalidated, transport=held.transport,
                fd=held.fd, loop=loop, encoding=self._encoding, pieces=self._pieces)
        except OSError as exc:
            log.warning("stream of %s written by the event loop only: %s", self._topic, exc)
            return None

    async def _watch(self, receive: Receive) -> None:
        """Wait for the client to leave; then end the wait in progress."""
        message: Message = {}
        while message.get("type") != "http.disconnect":
            message = await receive()
        self._gone = True
        waiting = self._waiting
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def _frames(self, loop: asyncio.AbstractEventLoop, send: Send,
                      held: Connection | None) -> None:
        notifier, topic, parked = self._notifier, self._topic, self._parked
        deadline = loop.time() + self._duration_s
        beat = loop.time()  # the first frame goes at once, with messages or not
        connection = self._connection
        # (closing: the client left, or stalled and was aborted; a send then returns at once,
        # without yielding to the loop that would tell this one so)
        while not (self._gone or notifier.closed
                   or (connection is not None and connection.is_closing())):
            # before reading: no lost wake-up (a parked stream is woken by no delivery)
            future: asyncio.Future[str | None] = (
                notifier.register(topic) if parked is None else loop.create_future())
            try:
                try:
                    payloads = self._broker.read(topic, self._offset, self._max)
                except HourglassError as exc:  # e.g. the engine stopping: end the stream
                    log.info("stream of %s ends at offset %d: %s", topic, self._offset, exc)
                    return
                now = loop.time()
                if payloads or now >= beat:
                    frame = self._encode(payloads, self._offset)
                    if payloads:
                        self._offset = log_record_offsets(payloads[-1:])[0] + 1
                    await send({"type": "http.response.body", "body": frame,
                                "more_body": True})
                    beat = now + HEARTBEAT_S
                if now >= deadline:  # (also while messages keep coming)
                    return
                if payloads:
                    continue  # more may be there already
                # woken by a delivery (not parked), the pusher handing the stream back, the
                # client leaving, a heartbeat due or the end
                self._waiting = future
                if parked is None:
                    await notifier.wait(future, min(deadline, beat) - now)
                    continue
                parked.park(self._offset, future)
                try:
                    await notifier.wait(future, min(deadline, beat) - now)
                finally:
                    self._offset, pending = parked.unpark()
                if parked.wrote_at:  # frames the pusher wrote count as the heartbeat
                    beat = max(beat, parked.wrote_at - time.monotonic() + loop.time()
                               + HEARTBEAT_S)
                if pending:  # (already a chunk: straight to the socket, then drain)
                    assert held is not None
                    held.write(pending)
                    await send({"type": "http.response.body", "body": b"",
                                "more_body": True})  # (writes nothing; waits while paused)
            finally:
                self._waiting = None
                if parked is None:
                    notifier.unregister(topic, future)


def add_routes(router: APIRouter, ctx: ApiContext) -> None:
    broker = ctx.broker
    notifier = ctx.notifier

    @router.get("/v1/topics/{topic}/messages:stream", **operation(
        "streamMessages", tag="consuming",
        summary="Stream delivered messages as they land (a frame per delivery)",
        errors=(400, 410, 429, 503), parameters=STREAM_PARAMETERS, extra_responses={200: _FRAMES},
    ))
    async def stream_messages(request: Request) -> Response:
        principal = ctx.caller(request)
        topic = request.path_params["topic"]
        ctx.allow(principal, Permission.PULL, topic)
        offset = query_int(request, "offset", None, 0, MAX_OFFSET)
        max_messages = query_int(request, "max", MAX_PULL_MESSAGES, 1, MAX_PULL_MESSAGES)
        duration_ms = query_int(request, "durationMs", DEFAULT_DURATION_MS, 1,
                                MAX_DURATION_MS)
        assert max_messages is not None and duration_ms is not None
        group = request.query_params.get("group")
        if offset is None:
            offset = 0 if group is None else broker.groups.read_offset(topic, check_group(group))
        broker.end_offset(topic)  # a bad topic, a stopped engine: refused before the 200
        first = broker.first_offset(topic)
        if offset < first:  # deleted by retention: refused before the 200 too
            raise OffsetExpired(f"offset {offset} of {topic!r} was deleted by retention; the "
                                f"log starts at {first}", first_offset=first)
        once = prefers_body_once(request)
        encoding = (is_msgpack(request.headers.get("accept")), once)
        encode: Callable[[list[bytes], int], bytes]
        pieces: Pieces | None = None
        if is_msgpack(request.headers.get("accept")):
            media = MSGPACK

            def encode(payloads: list[bytes], at: int) -> bytes:
                return pull_msgpack(payloads, at, once)
            if once and native is not None:
                def pieces(payloads: list[bytes], at: int) -> list[bytes | memoryview] | None:
                    frame: list[bytes | memoryview] | None = native.pull_pieces(
                        payloads, True, PIECE_MIN_BYTES)
                    return frame
        else:
            media = NDJSON

            def encode(payloads: list[bytes], at: int) -> bytes:
                return pull_json(payloads, at, once) + b"\n"
        slot = contextlib.ExitStack()
        slot.enter_context(notifier.slot())  # 503 or 429 here; back when it ends
        return body_once_applied(StreamResponse(
            broker, notifier, ctx.pusher, topic, offset, max_messages, duration_ms / 1000.0,
            encode, media, slot.close, stall_s=ctx.limits.stream_stall_ms / 1000.0,
            encoding=encoding, pieces=pieces), once)
