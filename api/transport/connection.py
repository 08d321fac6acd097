"""What a response writer may know of its connection, and the HTTP/1.1 chunk framing.

A route that writes a long response itself (a stream, api/routes/stream.py; a big answer,
api/answers.py; the stream pusher, api/push.py) sees its connection only through
:class:`Connection`, found in the request's ASGI scope by :func:`connection_of`: None when
the server runs on uvicorn's own protocol (the internals this package relies on are missing,
api/transport/limits.py), and then the route writes through ASGI ``send`` alone, as it does
under TLS (``fd`` None). Framing a body chunk for a writer that bypasses ASGI is
:func:`chunk`; nothing else in api spells out the HTTP/1.1 chunk format.
"""

from __future__ import annotations

import asyncio
import fcntl
import sys
import termios
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

#: the ASGI scope's ``extensions`` key of a request's :class:`Connection` (set by the
#: guarded protocol, api/transport/uvicorn_httptools.py)
SOCKET_EXTENSION = "hourglass.socket"


class Connection(Protocol):
    """A request's connection, as the guarded protocol hands it to the response."""

    @property
    def fd(self) -> int | None:
        """The socket's descriptor; None when bytes must go through the transport (TLS)."""

    @property
    def transport(self) -> asyncio.Transport:
        """The connection's asyncio transport (its write buffer, ``abort``)."""

    def write(self, data: bytes) -> None:
        """Write ``data`` as is, in order with what the response wrote before (the bytes of
        a whole chunk: :func:`chunk`)."""

    def is_closing(self) -> bool:
        """The connection is closed or closing (the client left, or was aborted)."""


def connection_of(scope: Mapping[str, Any]) -> Connection | None:
    """The request's :class:`Connection`; None on uvicorn's own protocol (the fallback)."""
    extensions = scope.get("extensions")
    if not extensions:
        return None
    connection: Connection | None = extensions.get(SOCKET_EXTENSION)
    return connection


def chunk(data: bytes) -> tuple[bytes, bytes, bytes]:
    """``data`` as one HTTP/1.1 chunk of a ``Transfer-Encoding: chunked`` body (RFC 9112
    7.1), in three pieces for one ``writev``: size line, data, CRLF. ``data`` not empty (an
    empty chunk ends the body)."""
    return b"%x\r\n" % len(data), data, b"\r\n"


def chunk_pieces(pieces: Sequence[bytes | memoryview]) -> tuple[bytes | memoryview, ...]:
    """``chunk(b"".join(pieces))`` without the join: the size line, ``pieces``, CRLF (for one
    ``writev``; api/push.py). ``pieces`` not all empty."""
    return (b"%x\r\n" % sum(map(len, pieces)), *pieces, b"\r\n")


def unsent_bytes(fd: int | None) -> int:
    """Bytes the kernel holds for socket ``fd`` that its peer has not acknowledged (Linux's
    ``TIOCOUTQ``); 0 when unknown."""
    if fd is None:
        return 0
    try:
        raw = fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, AttributeError):  # (no TIOCOUTQ: not Linux)
        return 0
    return max(int.from_bytes(raw, sys.byteorder, signed=True), 0)
