"""The one module that reaches into uvicorn's private ``httptools_impl``: its protocol with
the connection guards, and a request's transport that writes a response in one ``writev``.

Only api/transport/limits.py imports it, after ``check_internals`` found what it relies on
(the names in ``limits.REQUIRED_INTERNALS``, tested against the uvicorn range pinned in
pyproject.toml); else the server runs on uvicorn's own protocol (limits.py).

The guards (``ConnectionLimits``: api/transport/limits.py):

- At most ``max_connections`` open connections: one more is answered 503 ``UNAVAILABLE``
  with ``Retry-After`` and closed at once (before it can send anything).
- A request's line and headers hold at most ``max_header_bytes``: more is 431 and the
  connection is closed (httptools itself takes headers of any size).
- A request's headers must arrive within ``header_timeout_ms`` of the connection, or of the
  request's first byte on a kept-alive connection; else the connection is closed (uvicorn
  times out idle kept-alive connections, not a request whose headers never end). One sweep
  per quarter of the timeout looks at the open connections, so a request pays a time stamp,
  not a timer.

The guards cost about 5–8 µs of CPU a request and nothing per byte of body
(``python -m bench.http_guards``; docs/api.md).

One write per response. uvicorn writes a response's status line and headers, then its body,
with two ``write`` calls: two system calls, and on loopback two wake-ups of the client, which
reads the headers alone, finds the response incomplete and sleeps again. Each write runs
with the GIL held, so when the kernel switches to the woken client in the middle of it the
engine's threads wait too. The protocol here hands every request's cycle a
:class:`HeadHeldTransport`, which keeps the header bytes and sends them with the first body
chunk in one ``writev``, made without the GIL; a response without a body write (HEAD) sends
them when it completes. An interim ``100 Continue`` goes out at once. It is the request's
:class:`api.transport.Connection` (under ``SOCKET_EXTENSION`` in the ASGI scope).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.transport.connection import SOCKET_EXTENSION, Connection

if TYPE_CHECKING:
    from api.transport.limits import ConnectionLimits


class HeadHeldTransport:
    """A request's view of the connection's transport: the response's header bytes wait for
    its first body chunk and leave with it in one ``writev``.

    The ``writev`` is made with ``os.writev`` on the socket, which releases the GIL, when the
    transport has nothing queued (so the bytes keep their order): uvloop's own write holds
    the GIL through the system call, and on loopback that call does the client's share of
    the TCP work and wakes it, often switching this thread out in the middle, while the
    engine's threads wait for the GIL. What the socket does not take, or an error, goes to
    the transport as before (it queues the rest, or reports and closes)."""

    __slots__ = ("_armed", "_cycle", "_fd", "_held", "_on_response", "_transport")

    def __init__(self, transport: asyncio.Transport, fd: int | None, cycle: Any) -> None:
        self._transport = transport
        self._fd = fd  # the socket's descriptor; None: always through the transport
        self._cycle = cycle  # uvicorn's RequestResponseCycle: says whether the response began
        self._held: bytes | None = None
        self._armed = True  # the response's first write (its headers) is still to come
        self._on_response = cycle.on_response
        cycle.transport = self
        cycle.on_response = self._completed

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._send((held, data))
        elif self._armed and self._cycle.response_started:
            self._armed = False
            self._cycle = None  # no reference cycle left to the garbage collector
            self._held = data  # status line and headers; an interim 100 comes before the start
        else:
            self._send((data,))

    def _send(self, chunks: tuple[bytes, ...]) -> None:
        transport = self._transport
        if transport.is_closing():
            return  # (closed under a response still writing, e.g. a stalled stream aborted:
            #          uvloop raises on a write to a closed transport; nobody reads them)
        if self._fd is None or transport.get_write_buffer_size():
            transport.writelines(chunks)
            return
        try:
            sent = os.writev(self._fd, chunks)
        except BlockingIOError:
            sent = 0
        except OSError:  # the transport meets the same error and deals with it
            transport.writelines(chunks)
            return
        if sent == sum(map(len, chunks)):
            return
        transport.write(b"".join(chunks)[sent:])  # queued; flow control as usual

    @property
    def fd(self) -> int | None:
        return self._fd

    @property
    def transport(self) -> asyncio.Transport:
        return self._transport

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._send((held,))

    def _completed(self) -> None:
        self.flush()  # a response without a body write (HEAD)
        self._on_response()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, limits: ConnectionLimits, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._limits = limits
        self._fd: int | None = None  # the socket's descriptor, once connected
        # bytes of the chunks read while in a request's headers (they may never end)
        self._raw_header_bytes = 0
        self._in_headers = True  # the next bytes are (still) a request's line and headers
        self._refused = False  # answered 503 or 431 and closing: nothing more is parsed
        self._completed = False  # a request's headers ended in the chunk being parsed
        self.header_since: float | None = None  # loop time the awaited headers began

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        limits = self._limits
        if len(self.connections) >= limits.max_connections:
            self.transport = transport
            self._refuse(limits.busy)
            return
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("ssl_object") is None:
            self._fd = sock.fileno()  # (under TLS the bytes must go through the transport)
        self.header_since = self.loop.time()
        limits.watch(self.loop, self.connections)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        began_in_headers, self._completed = self._in_headers, False
        super().data_received(data)
        if began_in_headers and not self._completed and not self._refused:
            # no headers ended within the chunk, which began inside them: all of it was headers
            self._raw_header_bytes += len(data)
            if self._raw_header_bytes > self._limits.max_header_bytes:
                self._refuse(self._limits.too_large)

    # --- parser callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._raw_header_bytes = 0
        if self.header_since is None:
            self.header_since = self.loop.time()

    def on_headers_complete(self) -> None:
        self._in_headers, self._completed = False, True
        self.header_since = None
        # counted once here, not per header: the parser hands over complete headers only
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self._limits.max_header_bytes:
            self._refuse(self._limits.too_large)
            return
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            # the cycle writes here; the response sees it as its Connection
            held: Connection = HeadHeldTransport(self.transport, self._fd, cycle)
            # (a new dict: beside, not into, any the server set)
            extensions: dict[str, Any] = {**(self.scope.get("extensions") or {}),
                                          SOCKET_EXTENSION: held}
            self.scope["extensions"] = cast("dict[str, dict[object, object]]", extensions)

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_headers = True  # what follows is the next request
        if not self._refused:
            super().on_message_complete()

    # --- guards -----------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        """What the parser cannot read is answered with a problem document, as every other
        refusal (uvicorn's own answer is text/plain)."""
        self._refuse(self._limits.not_http)

    def _refuse(self, response: bytes) -> None:
        """Answer ``response`` and close; nothing more of this connection is parsed."""
        self._refused = True
        self.transport.write(response)
        self.transport.close()
