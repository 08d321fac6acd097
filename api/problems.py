"""RFC 9457 problem documents: the one place where errors become HTTP responses.

Routes raise the hierarchy of storage/errors.py and api/errors.py (each class carries a
``code``; ``CODES`` below gives each code its status and title); the handlers installed here
turn those, FastAPI's request validation errors (400, never 422),
Starlette's HTTP errors (unknown path, wrong method) and storage faults (503) into
``application/problem+json`` bodies with ``type, title, status, detail, code``;
``UnexpectedErrors`` answers anything else (a bug) with 500 ``INTERNAL``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from msgspec import UNSET
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.schemas import Problem
from storage.errors import HourglassError

log = logging.getLogger("hourglass.api")

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:hourglass:problem:"
# the charset is explicit: clients (requests) otherwise guess it for +json media types
PROBLEM_CONTENT_TYPE = f"{PROBLEM_MEDIA_TYPE}; charset=utf-8"

#: code -> (HTTP status, title). The codes of the contract, plus INTERNAL for bugs.
CODES: dict[str, tuple[int, str]] = {
    "INVALID_ARGUMENT": (400, "Invalid argument"),
    "TOPIC_INVALID": (400, "Invalid topic"),
    "DELAY_TOO_LONG": (400, "Delay too long"),
    "PAYLOAD_TOO_LARGE": (413, "Payload too large"),
    "NOT_FOUND": (404, "Not found"),
    "ALREADY_DELIVERED": (409, "Already delivered"),
    "CONFLICT": (409, "Conflict"),
    "OFFSET_EXPIRED": (410, "Offset expired"),
    "UNAUTHORIZED": (401, "Unauthorized"),
    "FORBIDDEN": (403, "Forbidden"),
    "TOO_MANY_REQUESTS": (429, "Too many requests"),
    "UNAVAILABLE": (503, "Service unavailable"),
    "CORRUPTION": (500, "Data corruption"),
    "INTERNAL": (500, "Internal server error"),
}
_CODE_BY_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHORIZED", 403: "FORBIDDEN", 404: "NOT_FOUND",
    409: "CONFLICT", 413: "PAYLOAD_TOO_LARGE", 429: "TOO_MANY_REQUESTS", 503: "UNAVAILABLE",
}
_encode = msgspec.json.Encoder().encode
#: an absolute file path inside a message (RocksDB's and the OS's errors name their files)
_FILE_PATH = re.compile(r"(?<![\w.:/])/[^\s'\",:;)\]]+")


def without_paths(detail: str) -> str:
    """``detail`` with every absolute file path replaced by ``<path>``: a fault's answer
    does not tell the network where the data lives (the log line keeps it)."""
    return _FILE_PATH.sub("<path>", detail)


def problem_body(code: str, detail: str, status: int | None = None, *,
                 first_offset: int | None = None) -> tuple[int, bytes]:
    """(status, encoded problem document); ``first_offset``: OFFSET_EXPIRED's extension."""
    default_status, title = CODES.get(code, CODES["INTERNAL"])
    status = status or default_status
    return status, _encode(Problem(type=TYPE_PREFIX + code.lower().replace("_", "-"),
                                   title=title, status=status, detail=detail, code=code,
                                   firstOffset=UNSET if first_offset is None else first_offset))


def problem_response(code: str, detail: str, *, status: int | None = None,
                     retry_after_s: int | None = None,
                     first_offset: int | None = None) -> Response:
    status, body = problem_body(code, detail, status, first_offset=first_offset)
    headers = {"WWW-Authenticate": 'Bearer realm="hourglass"'} if status == 401 else {}
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    return Response(body, status_code=status, media_type=PROBLEM_CONTENT_TYPE, headers=headers)


def describe_validation_errors(errors: Sequence[Any]) -> str:
    """FastAPI/pydantic errors -> one readable sentence per error: "query max: ..."."""
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        where = f"{loc[0]} parameter {'.'.join(loc[1:])}" if len(loc) > 1 else ".".join(loc)
        parts.append(f"{where}: {err.get('msg', 'invalid')}".strip(": "))
    return "; ".join(parts) or "invalid request"


def known_problem(exc: Exception) -> Response | None:
    """The problem document of an error the API expects (the storage.errors hierarchy, an
    OSError below the engine), or None. Used by the handlers below and by api/hot.py."""
    if isinstance(exc, HourglassError):
        status, title = CODES.get(exc.code, CODES["INTERNAL"])
        detail = exc.detail or title
        if status >= 500:
            log.warning("%s: %s", exc.code, exc.detail or type(exc).__name__)
            detail = without_paths(detail)
        return problem_response(exc.code, detail, retry_after_s=getattr(exc, "retry_after_s", None),
                                first_offset=getattr(exc, "first_offset", None))
    if isinstance(exc, OSError):  # disk full, I/O error: nothing acknowledged, try again later
        log.error("storage fault: %s", exc)
        return problem_response("UNAVAILABLE",
                                without_paths(f"storage fault: {exc.strerror or exc}"),
                                retry_after_s=1)
    return None


async def _known_error(_: Request, exc: Exception) -> Response:
    response = known_problem(exc)
    assert response is not None
    return response


async def _validation_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return problem_response("INVALID_ARGUMENT", describe_validation_errors(exc.errors()))


async def _http_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code = _CODE_BY_STATUS.get(exc.status_code, "INVALID_ARGUMENT")
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return problem_response(code, detail, status=exc.status_code)


class UnexpectedErrors:
    """Outermost ASGI middleware: an exception nothing else handled (a bug) is logged and
    answered with a 500 INTERNAL problem, and the connection stays usable. (Starlette's own
    error middleware re-raises after answering, and uvicorn then closes the connection,
    which clients often see as a reset instead of the 500.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except ClientDisconnect:
            return  # nobody to answer
        except Exception as exc:
            log.exception("unexpected error in %s %s", scope["method"], scope["path"],
                          exc_info=exc)
            if not started:  # else uvicorn closes the half-answered connection
                response = problem_response("INTERNAL",
                                            "unexpected server error; see the server log")
                await response(scope, receive, send)


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(HourglassError, _known_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OSError, _known_error)
