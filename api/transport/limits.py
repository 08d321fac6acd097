"""Connection limits, and the check that uvicorn still has what the transport relies on.

:class:`ConnectionLimits` holds the HTTP layer's connection guards (at most
``max_connections`` open, request headers of at most ``max_header_bytes`` arriving within
``header_timeout_ms``: api/transport/uvicorn_httptools.py says how) and is the protocol
factory uvicorn's ``Config(http=...)`` takes.

That protocol subclasses uvicorn's private ``httptools_impl.HttpToolsProtocol`` and reaches
into its request cycle: no public API of uvicorn's offers a per-connection guard or the
socket under a response. So pyproject.toml pins uvicorn to the range it was tested with
(``TESTED_UVICORN``), and at start (``uvicorn_options``, from app/wiring.py)
:func:`check_internals` looks for every name of ``REQUIRED_INTERNALS``. When one is missing
(an untested uvicorn installed by hand), the server logs one warning and runs on uvicorn's
own protocol: every request is served, streams and big answers included (written by the
event loop, through ASGI), just slower, and the guards are the nearest uvicorn offers
(``limit_concurrency``, ``h11_max_incomplete_event_size``). The protocol is uvicorn's
httptools one when its module still imports, else its h11 one.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from typing import Any

from api.problems import PROBLEM_CONTENT_TYPE, problem_body

log = logging.getLogger("hourglass.api")

#: the uvicorn versions the transport was tested with (pyproject.toml pins the same)
TESTED_UVICORN = ">=0.54,<0.55"
HTTPTOOLS_IMPL = "uvicorn.protocols.http.httptools_impl"
#: (class of HTTPTOOLS_IMPL, names it must have: methods the guarded protocol overrides or
#: calls, and parameters of ``__init__`` whose attributes it reads)
REQUIRED_INTERNALS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("HttpToolsProtocol", ("connection_made", "data_received", "on_message_begin",
                           "on_headers_complete", "on_body", "on_message_complete",
                           "send_400_response", "__init__(config)",
                           "__init__(server_state)")),
    ("RequestResponseCycle", ("send", "__init__(transport)", "__init__(on_response)")),
)


def _uvicorn_version() -> str:
    try:
        return str(importlib.import_module("uvicorn").__version__)
    except (ImportError, AttributeError):
        return "?"


def check_internals() -> list[str]:
    """What of ``REQUIRED_INTERNALS`` uvicorn lacks (empty: everything is there)."""
    try:
        module = importlib.import_module(HTTPTOOLS_IMPL)
    except ImportError as exc:
        return [f"{HTTPTOOLS_IMPL} cannot be imported: {exc}"]
    missing = []
    for class_name, names in REQUIRED_INTERNALS:
        cls = getattr(module, class_name, None)
        if cls is None:
            missing.append(f"{HTTPTOOLS_IMPL}.{class_name}")
            continue
        try:
            parameters = inspect.signature(cls.__init__).parameters
        except (TypeError, ValueError):
            parameters = {}  # type: ignore[assignment]
        for name in names:
            if name.startswith("__init__("):
                found = name[len("__init__("):-1] in parameters
            else:
                found = callable(getattr(cls, name, None))
            if not found:
                missing.append(f"{class_name}.{name}")
    return missing


def _raw_response(status: int, reason: str, code: str, detail: str,
                  extra: bytes = b"") -> bytes:
    status, body = problem_body(code, detail, status)
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: {PROBLEM_CONTENT_TYPE}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n").encode() + extra \
        + b"\r\n" + body


class ConnectionLimits:
    """The limits, and the protocol factory uvicorn's ``Config(http=...)`` takes."""

    def __init__(self, *, max_connections: int, max_header_bytes: int,
                 header_timeout_ms: int) -> None:
        self.max_connections = max_connections
        self.max_header_bytes = max_header_bytes
        self.header_timeout_s = header_timeout_ms / 1000
        self._sweeping: asyncio.AbstractEventLoop | None = None
        self.busy = _raw_response(
            503, "Service Unavailable", "UNAVAILABLE",
            f"more than {max_connections} connections are open; try again shortly",
            b"retry-after: 1\r\n")
        self.not_http = _raw_response(
            400, "Bad Request", "INVALID_ARGUMENT",
            "the request is not valid HTTP/1.1 (its request line or a header cannot be parsed: "
            "e.g. a control character in a header value)")
        self.too_large = _raw_response(
            431, "Request Header Fields Too Large", "INVALID_ARGUMENT",
            f"the request line and headers exceed {max_header_bytes} bytes")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A connection's protocol: uvicorn calls this (``Config(http=self)``)."""
        from api.transport.uvicorn_httptools import GuardedHttpToolsProtocol
        return GuardedHttpToolsProtocol(self, *args, **kwargs)

    def uvicorn_options(self) -> dict[str, Any]:
        """The ``uvicorn.Config`` options that serve with these limits: this factory as the
        HTTP protocol when uvicorn's internals it relies on are there (module doc); else
        one warning and uvicorn's own protocol with the nearest public options."""
        missing = check_internals()
        if not missing:
            return {"http": self}
        log.warning(
            "uvicorn %s lacks internals the HTTP transport relies on (%s; tested: uvicorn%s): "
            "serving on uvicorn's own protocol instead. Streams and big answers are written "
            "by the event loop (slower), a response's head and body leave in two writes, "
            "past max_connections uvicorn answers 503 per request, and request headers have "
            "no deadline", _uvicorn_version(), "; ".join(missing), TESTED_UVICORN)
        # uvicorn's httptools protocol if its module is there at all, else its h11 one
        # (uvicorn's "auto" imports the module unguarded once httptools is installed)
        http = "h11" if missing[0].startswith(f"{HTTPTOOLS_IMPL} cannot") else "httptools"
        return {"http": http, "limit_concurrency": self.max_connections,
                "h11_max_incomplete_event_size": self.max_header_bytes}

    def watch(self, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        """Sweep ``connections`` on ``loop`` from now on (once per loop)."""
        if self._sweeping is not loop:
            self._sweeping = loop
            loop.call_later(self.header_timeout_s / 4, self._sweep, loop, connections)

    def _sweep(self, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        if loop.is_closed():
            return
        too_old = loop.time() - self.header_timeout_s
        for protocol in list(connections):
            since = getattr(protocol, "header_since", None)
            if since is not None and since < too_old and not protocol.transport.is_closing():
                log.info("closing a connection whose request headers did not arrive in "
                         "%.1f s", self.header_timeout_s)
                protocol.transport.close()
        loop.call_later(self.header_timeout_s / 4, self._sweep, loop, connections)


