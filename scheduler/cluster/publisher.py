"""DirectPublisher: the leader's publishes to the write-ahead stream on a blocking socket.

A delivery is visible only once its record is in the stream, so every W3 delivery waits for
one publish and its ack. Through nats-py that wait crossed two threads (the writer hands the
coroutine to the link's event loop, which wakes the writer with the ack), each a GIL
hand-over in a process whose HTTP loop, scanners and link loop all want the GIL, plus the
asyncio client's own parsing. Measured on the leader under W3 (docs/cluster.md, "W3"): the
hand-overs alone p50 0.2, p99 2-4 ms of a publish.

This is the NATS client protocol's small part a publish needs, written for one caller at a
time (the replication lock serialises them): ``HPUB`` with the expected-last-sequence
header, the ack read on the same thread (the socket's wait releases the GIL), ``PING`` from
the server answered. It connects, when it can, to the NATS server that leads the stream's
RAFT group (``prefer``): from another one the publish and its ack cross a route, two more
processes to be scheduled on the way. Fencing is JetStream's, as before: the header is the
same, and a refusal is ``NotLeader``.

Everything else (the lease, consumers, snapshots) stays on nats-py (scheduler/cluster/link.py).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import uuid
from typing import Any
from urllib.parse import unquote, urlsplit

from storage.errors import NotLeader, Unavailable

log = logging.getLogger(__name__)

WRONG_LAST_SEQUENCE = 10071  # JetStream's error code
_CRLF = b"\r\n"


class DirectPublisherUnsupported(Exception):
    """The servers want what this client does not speak (TLS, no headers): use nats-py."""


def _address(url: str) -> tuple[str, int, dict[str, str]]:
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.scheme not in ("nats", ""):
        raise DirectPublisherUnsupported(f"{parts.scheme}:// URLs")
    auth: dict[str, str] = {}
    if parts.username and parts.password is not None:
        auth = {"user": unquote(parts.username), "pass": unquote(parts.password)}
    elif parts.username:
        auth = {"auth_token": unquote(parts.username)}
    return parts.hostname or "127.0.0.1", parts.port or 4222, auth


class DirectPublisher:
    def __init__(self, urls: list[str], subject: str, *, timeout_s: float = 2.0,
                 name: str = "hourglass-publisher") -> None:
        self.urls = list(urls)
        for url in self.urls:
            _address(url)  # (TLS: DirectPublisherUnsupported now, not at the first publish)
        self.subject = subject.encode()
        self.timeout_s = timeout_s
        self.name = name
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._inbox = b""
        self._next_reply = 0
        self.server_name: str | None = None  # of the server connected to
        self.max_payload = 1 << 20

    # --- the connection ---------------------------------------------------------------------
    def connect(self, prefer: str | None = None) -> str | None:
        """(Re)connect, to the server named ``prefer`` if one of the URLs reaches it, else to
        the first that answers; the name of the server, or None (none answered)."""
        with self._lock:
            return self._connect(prefer)

    def _connect(self, prefer: str | None) -> str | None:
        self._close()
        fallback: tuple[socket.socket, dict[str, Any], dict[str, str]] | None = None
        for url in self.urls:
            host, port, auth = _address(url)
            try:
                sock = socket.create_connection((host, port), timeout=self.timeout_s)
                # (a record's last segment must not wait for the ack of the ones before it)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                info = self._read_info(sock)
            except OSError:
                continue
            if prefer is None or info.get("server_name") == prefer:
                if fallback is not None:
                    fallback[0].close()
                fallback = (sock, info, auth)
                break
            if fallback is None:
                fallback = (sock, info, auth)
            else:
                sock.close()
        if fallback is None:
            return None
        sock, info, auth = fallback
        if info.get("tls_required") or not info.get("headers", False):
            sock.close()
            raise DirectPublisherUnsupported("the NATS server requires TLS or has no headers")
        try:
            self._handshake(sock, auth)
        except OSError:
            sock.close()
            return None
        self._sock = sock
        self.server_name = info.get("server_name")
        self.max_payload = int(info.get("max_payload", self.max_payload))
        return self.server_name

    def _read_info(self, sock: socket.socket) -> dict[str, Any]:
        self._buf = bytearray()
        line = self._read_line(sock)
        if not line.startswith(b"INFO "):
            raise OSError(f"not a NATS server: {line[:40]!r}")
        info: dict[str, Any] = json.loads(line[5:])
        return info

    def _handshake(self, sock: socket.socket, auth: dict[str, str]) -> None:
        options = {"verbose": False, "pedantic": False, "lang": "python-hourglass",
                   "version": "1", "protocol": 1, "headers": True, "no_responders": True,
                   "name": self.name, **auth}
        self._inbox = f"_INBOX.{uuid.uuid4().hex}".encode()
        sock.sendall(b"CONNECT " + json.dumps(options).encode() + b"\r\nPING\r\nSUB "
                     + self._inbox + b".* 1\r\nPING\r\n")
        pongs = 0
        while pongs < 2:  # the second one: the subscription is in place
            line = self._read_line(sock)
            if line.startswith(b"-ERR"):
                raise OSError(f"NATS refused the connection: {line.decode(errors='replace')}")
            if line == b"PONG":
                pongs += 1
            elif line == b"PING":
                sock.sendall(b"PONG\r\n")

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        sock, self._sock, self.server_name = self._sock, None, None
        self._buf = bytearray()
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def keepalive(self) -> None:
        """Answer what the server sent meanwhile (its PINGs: a connection idle past two of
        them, 4 min by default, is closed by the server as stale, and the next publish would
        find it gone); a connection found closed is dropped (made again at the next publish)."""
        with self._lock:
            sock = self._sock
            if sock is None:
                return
            try:
                sock.setblocking(False)
                try:
                    while True:
                        chunk = sock.recv(1 << 16)
                        if not chunk:
                            raise OSError("the NATS server closed the connection")
                        self._buf += chunk
                except BlockingIOError:
                    pass
                finally:
                    sock.settimeout(self.timeout_s)
                while (i := self._buf.find(_CRLF)) >= 0:
                    line = bytes(self._buf[:i])
                    if line.startswith((b"MSG ", b"HMSG ")):
                        break  # (a late ack: left for the next publish to skip)
                    del self._buf[:i + 2]
                    if line == b"PING":
                        sock.sendall(b"PONG\r\n")
                    elif line.startswith(b"-ERR"):
                        raise OSError(line.decode(errors="replace"))
            except OSError:
                self._close()

    # --- reading ------------------------------------------------------------------------------
    def _fill(self, sock: socket.socket) -> None:
        chunk = sock.recv(1 << 16)  # (the GIL let go while it waits)
        if not chunk:
            raise OSError("the NATS server closed the connection")
        self._buf += chunk

    def _read_line(self, sock: socket.socket) -> bytes:
        while True:
            i = self._buf.find(_CRLF)
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[:i + 2]
                return line
            self._fill(sock)

    def _read_bytes(self, sock: socket.socket, n: int) -> bytes:
        while len(self._buf) < n + 2:
            self._fill(sock)
        data = bytes(self._buf[:n])
        del self._buf[:n + 2]  # (and its CRLF)
        return data

    # --- publishing ---------------------------------------------------------------------------
    def publish(self, payload: bytes, expected_last_seq: int) -> int:
        """Append ``payload`` to the stream if it ends at ``expected_last_seq``; its sequence.
        NotLeader when JetStream refuses it for that; Unavailable when unsure (no answer in
        time, no connection, no stream leader): the connection is then made again at the
        next publish, and a late answer to this one is never taken for another's."""
        with self._lock:
            if self._sock is None and self._connect(None) is None:
                raise Unavailable("no NATS server answered the publisher")
            sock = self._sock
            assert sock is not None
            self._next_reply += 1
            reply = self._inbox + b".%d" % self._next_reply
            header = b"NATS/1.0\r\nNats-Expected-Last-Sequence: %d\r\n\r\n" % expected_last_seq
            try:
                sock.sendall(b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
                    self.subject, reply, len(header), len(header) + len(payload), header,
                    payload))
                answer = self._await(sock, reply)
            except (OSError, ValueError) as exc:  # (socket.timeout is an OSError)
                self._close()
                raise Unavailable(f"NATS did not answer the publish: {exc}") from exc
        return _ack_seq(answer)

    def _await(self, sock: socket.socket, reply: bytes) -> tuple[bytes, bytes]:
        """(headers, payload) of the message sent to ``reply``."""
        while True:
            line = self._read_line(sock)
            if line.startswith(b"HMSG ") or line.startswith(b"MSG "):
                parts = line.split()
                if parts[0] == b"HMSG":
                    hlen, tlen = int(parts[-2]), int(parts[-1])
                    data = self._read_bytes(sock, tlen)
                    headers, body = data[:hlen], data[hlen:]
                else:
                    headers, body = b"", self._read_bytes(sock, int(parts[-1]))
                if parts[1] == reply:
                    return headers, body
                continue  # a late answer to a publish given up on
            if line == b"PING":
                sock.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise OSError(line.decode(errors="replace"))
            # INFO (the cluster changed), PONG, +OK: nothing to do


def _ack_seq(answer: tuple[bytes, bytes]) -> int:
    headers, body = answer
    if headers and not body:  # a status: 503 no responders (no stream leader), 408, ...
        status = headers.split(_CRLF, 1)[0].decode(errors="replace")
        raise Unavailable(f"NATS answered the publish with {status!r}")
    try:
        ack = json.loads(body)
    except ValueError as exc:
        raise Unavailable(f"an undecodable answer to a publish: {body[:80]!r}") from exc
    error = ack.get("error") if isinstance(ack, dict) else None
    if error:
        if int(error.get("err_code", 0)) == WRONG_LAST_SEQUENCE:
            raise NotLeader(f"the write-ahead stream refused the append: {error}")
        raise Unavailable(f"JetStream refused the publish: {error}")
    try:
        return int(ack["seq"])
    except (KeyError, TypeError, ValueError) as exc:
        raise Unavailable(f"an answer to a publish without its sequence: {body[:80]!r}") from exc


__all__ = ["DirectPublisher", "DirectPublisherUnsupported"]
