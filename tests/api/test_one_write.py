"""A response leaves in one write: uvicorn's protocol, as the server runs it, driven with real
HTTP bytes and a transport that records what it is asked to send."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from api.transport import ConnectionLimits
from scheduler.clock import FakeClock
from tests.support.live import ADMIN, T0, make_settings, serve


class RecordingTransport(asyncio.Transport):
    def __init__(self, extra: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.calls: list[bytes] = []  # one entry per write / writelines call
        self.seen: list[int] = []  # len(calls) after each chunk fed (exchange)
        self.closed = False
        self.extra = {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8080),
                      **(extra or {})}

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append(bytes(data))

    def writelines(self, chunks: Any) -> None:
        self.calls.append(b"".join(bytes(c) for c in chunks))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.extra.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = b"echo:" + body if body else b"hello"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


async def exchange(requests: list[bytes], *, settle: int = 20,
                   transport: RecordingTransport | None = None) -> RecordingTransport:
    """Feed ``requests`` to a fresh connection, one chunk at a time, each followed by a few
    loop turns for the application to answer; ``transport.seen`` holds how many calls had
    been made after each chunk."""
    config = Config(app=app, lifespan="off", log_level="warning", access_log=False)
    config.load()
    limits = ConnectionLimits(max_connections=10, max_header_bytes=65536,
                              header_timeout_ms=10_000)
    protocol = limits(config=config, server_state=ServerState(), app_state={},
                      _loop=asyncio.get_running_loop())
    transport = transport or RecordingTransport()
    protocol.connection_made(transport)
    for chunk in requests:
        protocol.data_received(chunk)
        for _ in range(settle):
            await asyncio.sleep(0)
        transport.seen.append(len(transport.calls))
    protocol.connection_lost(None)
    return transport


def responses(transport: RecordingTransport) -> list[bytes]:
    return [c for c in transport.calls if not c.startswith(b"HTTP/1.1 100")]


def test_status_line_headers_and_body_leave_in_one_write() -> None:
    transport = asyncio.run(exchange([b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"] * 3))
    assert len(transport.calls) == 3, transport.calls  # one per response, not two
    for call in transport.calls:
        assert call.startswith(b"HTTP/1.1 200 OK\r\n") and call.endswith(b"\r\n\r\nhello")


def test_under_tls_every_byte_goes_through_the_transport() -> None:
    """A TLS transport also names its socket: writing there would bypass the encryption."""
    plain, peer = socket.socketpair()
    with plain, peer:
        tls = RecordingTransport({"socket": plain, "ssl_object": object()})
        asyncio.run(exchange([b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"], transport=tls))
        assert len(tls.calls) == 1 and tls.calls[0].endswith(b"hello")
        peer.setblocking(False)
        with pytest.raises(BlockingIOError):
            peer.recv(1)  # nothing was written to the socket itself


def test_head_response_without_body_write_is_still_sent() -> None:
    transport = asyncio.run(exchange([b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n",
                                      b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"]))
    assert len(transport.calls) == 2, transport.calls
    head, get = transport.calls
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert get.endswith(b"hello")


def test_interim_100_continue_goes_out_before_the_body_arrives() -> None:
    transport = asyncio.run(exchange([
        b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n",
        b"abc"]))
    assert transport.seen[0] == 1  # the client waits for it before it sends the body
    assert transport.calls[0] == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert len(responses(transport)) == 1
    assert responses(transport)[0].endswith(b"echo:abc")


@pytest.mark.parametrize("pipelined", [2, 4])
def test_pipelined_requests_get_their_responses_in_order(pipelined: int) -> None:
    requests = b"".join(f"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\n{k}".encode()
                        for k in range(pipelined))
    transport = asyncio.run(exchange([requests], settle=50))
    answers = responses(transport)
    assert len(answers) == pipelined
    assert [a.rsplit(b":", 1)[1] for a in answers] == [str(k).encode()
                                                      for k in range(pipelined)]


def _body(head: bytes, rest: bytes) -> tuple[bytes, bytes] | None:
    """The body of a response whose head is ``head`` from the bytes after it (by its
    ``Content-Length``, or chunked: a big pull's answer, api/answers.py) and what follows
    it; None until all of it arrived."""
    lines = [line.lower() for line in head.split(b"\r\n")]
    length = next((int(line.split(b":")[1]) for line in lines
                   if line.startswith(b"content-length")), None)
    if length is not None:
        return (rest[:length], rest[length:]) if len(rest) >= length else None
    assert b"transfer-encoding: chunked" in lines, head
    body = b""
    while b"\r\n" in rest:
        size_line, after = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if len(after) < size + 2:
            return None
        if size == 0:
            return body, after[2:]
        body += after[:size]
        rest = after[size + 2:]
    return None


def test_responses_larger_than_the_socket_takes_arrive_whole_and_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real server and three pipelined requests: the direct ``writev`` sends what the
    socket takes of a 12 MiB pull answer (its buffer holds at most 4 MiB), the transport
    queues the rest, and what follows waits behind it."""
    writes = {"whole": 0, "part": 0}
    writev = os.writev

    def counting_writev(fd: int, chunks: Any) -> int:
        sent = writev(fd, chunks)
        writes["whole" if sent == sum(map(len, chunks)) else "part"] += 1
        return sent

    monkeypatch.setattr(os, "writev", counting_writev)
    with serve(make_settings(tmp_path / "data"), FakeClock(T0)) as live:
        with live.client() as c:  # 6 MiB of bodies: a pull answer beyond the socket's 4 MiB
            for i in range(12):
                r = c.post("/v1/topics/big/messages", json={"msgId": f"m{i}",
                                                             "body": f"{i:x}" * (512 << 10)})
                assert r.status_code == 201, r.text
            pull = c.get("/v1/topics/big/messages?offset=0&max=12").content
            health = c.get("/healthz").content
        assert len(pull) > 8 << 20
        host, port = live.base_url.removeprefix("http://").split(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(10)
        with sock:
            sock.connect((host, int(port)))
            get = (b"GET %s HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + ADMIN.encode()
                   + b"\r\n\r\n")
            pulling = get % b"/v1/topics/big/messages?offset=0&max=12"
            sock.sendall(pulling + get % b"/healthz" + pulling)
            received = b""
            bodies: list[bytes] = []
            while len(bodies) < 3:
                chunk = sock.recv(1 << 20)
                assert chunk, "connection closed early"
                received += chunk
                while b"\r\n\r\n" in received:
                    head, rest = received.split(b"\r\n\r\n", 1)
                    body = _body(head, rest)
                    if body is None:
                        break
                    assert head.startswith(b"HTTP/1.1 200 OK")
                    bodies.append(body[0])
                    received = body[1]
        assert bodies == [pull, health, pull]
    assert writes["whole"] >= 2 and writes["part"] >= 1, writes  # both paths were taken
