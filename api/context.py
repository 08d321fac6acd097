"""What every route needs, built once per app (the engine, the HTTP limits, auth, the
long-poll notifier), and the helpers every route uses: authenticate, authorise, parse, respond."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec
from fastapi import Depends
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from api.auth import Authenticator, Permission, Principal
from api.bodies import JSON, MSGPACK, is_msgpack
from api.errors import Forbidden
from api.longpoll import CALLER, DeliveryNotifier
from api.push import StreamPusher
from scheduler.broker import Broker
from scheduler.intake import check_topic
from storage.errors import InvalidArgument

T = TypeVar("T")
_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()


@dataclass(frozen=True, kw_only=True)
class ApiLimits:
    """The limits the routes enforce (app/settings.py documents each)."""

    max_request_bytes: int  # bytes of one request body -> 413
    max_batch_messages: int  # messages in one batch send -> 400
    max_long_polls: int  # pulls waiting at once -> 503
    metrics_require_token: bool = False  # /metrics needs an admin token (401 / 403)
    max_long_polls_per_token: int = 64  # long polls and streams of one token at once -> 429
    stream_stall_ms: int = 30_000  # a stream whose client takes no bytes this long ends


@dataclass(frozen=True, kw_only=True)
class ApiContext:
    limits: ApiLimits
    broker: Broker
    auth: Authenticator
    notifier: DeliveryNotifier
    pusher: StreamPusher

    async def write(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)``, an engine call that writes. Single-node mode: here, on the event
        loop (a RocksDB write, microseconds). Cluster mode: on a worker thread, as a cluster
        write waits for the write-ahead stream's quorum ack (milliseconds, a send batch's
        150 KB record ~2-5 ms on loopback): on the loop it would hold up every other request
        meanwhile, and the next send batch's reading and decoding could not overlap it."""
        if self.broker.cluster is None:
            return call(*args)
        return await run_in_threadpool(call, *args)

    def release_waiters(self) -> None:
        """Server shutdown: end every long poll and stream now (uvicorn waits for requests
        in flight before the lifespan's end, and they may wait minutes)."""
        self.pusher.close()  # parked streams first: handed back, they see the notifier closed
        self.notifier.close()

    def caller(self, request: Request) -> Principal:
        """The caller's principal, or 401: the hot routes (send, batch, pull) call this first
        thing instead of the ``Authenticated`` dependency (FastAPI's dependency solving costs
        ~15 µs a request); they take no parameters FastAPI would validate before it."""
        principal = self.auth.authenticate(request.headers.get("authorization"))
        CALLER.set(principal)  # the owner of the long-poll slots the request takes
        return principal

    @staticmethod
    def allow(principal: Principal, permission: Permission, topic: str | None = None, *,
              sending: bool = False) -> None:
        """Check the role (403), the topic's name (400 TOPIC_INVALID; system topics too
        when ``sending``) and the token's topic patterns (403)."""
        if not principal.may(permission):
            raise Forbidden(f"a {principal.role} token may not {permission}")
        if topic is not None:
            check_topic(topic, allow_system=not sending)
            if not principal.may_use_topic(topic):
                raise Forbidden(f"this token may not use topic {topic!r}")


async def authenticate(request: Request) -> Principal:
    """FastAPI dependency: the caller's principal, or 401. Dependencies run before parameters
    are validated, so an unauthenticated call is a 401 whatever else is wrong with it."""
    ctx: ApiContext = request.app.state.ctx
    return ctx.caller(request)


#: Route parameter type of an authenticated caller.
Authenticated = Annotated[Principal, Depends(authenticate)]


_MAX_INT_DIGITS = 20  # more digits than any bound of a query integer: out of range unparsed


def query_int(request: Request, name: str, default: int | None, low: int,
              high: int) -> int | None:
    """Integer query parameter ``name`` within [low, high], or InvalidArgument. Only ASCII
    digits, with a leading '-' (then refused by the bounds as out of range): not the
    ``+1_0``, `` 7 `` or non-ASCII digits (``٣``) that ``int()`` would take."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    digits = raw[1:] if raw.startswith("-") else raw
    if not (digits.isascii() and digits.isdigit()):
        raise InvalidArgument(f"query parameter {name} must be an integer (ASCII digits), "
                              f"got {raw!r}")
    if len(digits) > _MAX_INT_DIGITS:
        raise InvalidArgument(f"query parameter {name} must be between {low} and {high}, "
                              f"got {raw[:_MAX_INT_DIGITS]}...")
    value = int(raw)
    if not low <= value <= high:
        raise InvalidArgument(f"query parameter {name} must be between {low} and {high}, "
                              f"got {value}")
    return value


def query_bool(request: Request, name: str) -> bool:
    """Boolean query parameter ``name`` ("true" / "false"; absent: false), or InvalidArgument."""
    raw = request.query_params.get(name)
    if raw is None or raw == "false":
        return False
    if raw == "true":
        return True
    raise InvalidArgument(f"query parameter {name} must be true or false, got {raw!r}")


def respond(doc: Any, status: int = 200, request: Request | None = None) -> Response:
    """``doc`` (a Struct, dict or list) as JSON, or as msgpack when ``request`` accepts it."""
    if request is not None and is_msgpack(request.headers.get("accept")):
        return Response(_msgpack.encode(doc), status_code=status, media_type=MSGPACK)
    return Response(_json.encode(doc), status_code=status, media_type=JSON)
