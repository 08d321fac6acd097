"""Connection limits over real sockets: a cap on open connections and on long
polls (503 UNAVAILABLE with Retry-After past it), request headers of at most 64 KiB (431),
and connections whose headers do not arrive in time are closed."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from scheduler.clock import FakeClock
from tests.support.live import ADMIN, CONSUMER, T0, Live, make_settings, serve

REQUEST = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"


@contextmanager
def started(tmp_path: Path, **overrides: Any) -> Iterator[Live]:
    with serve(replace(make_settings(tmp_path / "data"), **overrides), FakeClock(T0)) as live:
        yield live


def connect(live: Live) -> socket.socket:
    host, port = live.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection (or 10 s pass: a failure)."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(response.split(b"\r\n\r\n", 1)[1])
    return doc


def test_connections_past_the_cap_are_answered_503_and_closed(tmp_path: Path) -> None:
    with started(tmp_path, max_connections=4) as live, ExitStack() as stack:
        held = []
        for _ in range(4):
            sock = stack.enter_context(connect(live))
            sock.sendall(REQUEST)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")  # open and counted
            held.append(sock)
        with connect(live) as extra:
            response = read_all(extra)
        assert status_of(response) == 503, response
        assert b"retry-after: 1" in response.lower()
        assert body_of(response)["code"] == "UNAVAILABLE"
        held.pop().close()  # room again
        deadline = time.monotonic() + 10
        while True:  # the server notices the close asynchronously
            with connect(live) as again:
                again.sendall(REQUEST)
                if again.recv(65536).startswith(b"HTTP/1.1 200"):
                    break
            assert time.monotonic() < deadline


def test_request_headers_over_64_kib_are_431(tmp_path: Path) -> None:
    with started(tmp_path) as live:
        big = b"x-filler: " + b"a" * (70 << 10) + b"\r\n"
        with connect(live) as sock:  # complete headers, one piece
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + big + b"\r\n")
            response = read_all(sock)
        assert status_of(response) == 431, response[:200]
        with connect(live) as sock:  # a header that never ends: refused without its end
            sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-filler: " + b"a" * (66 << 10))
            response = read_all(sock)
        assert status_of(response) == 431, response[:200]
        with httpx.Client(base_url=live.base_url) as client:  # 60 KiB of headers are fine
            r = client.get("/healthz", headers={"x-filler": "a" * (60 << 10)})
            assert r.status_code == 200
        with connect(live) as sock:  # a big body arriving with its headers is no header
            body = b'{"body": "' + b"b" * (200 << 10) + b'"}'
            sock.sendall(b"POST /v1/topics/orders.h/messages HTTP/1.1\r\nhost: x\r\n"
                         b"authorization: Bearer " + ADMIN.encode() + b"\r\n"
                         b"content-type: application/json\r\nconnection: close\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body)
            assert status_of(read_all(sock)) == 201


def test_a_request_that_is_not_http_gets_a_problem_document(tmp_path: Path) -> None:
    """uvicorn answers what its parser refuses in text/plain; the API answers problems."""
    with started(tmp_path) as live:
        for bad in (b"GET /healthz HTTP/1.1\r\nhost: x\r\nprefer: a\x01b\r\n\r\n",
                    b"GET /healthz HTTP/9.9\r\nhost: x\r\n\r\n",
                    b"NOT HTTP AT ALL\r\n\r\n"):
            with connect(live) as sock:
                sock.sendall(bad)
                response = read_all(sock)
            assert status_of(response) == 400, response[:200]
            assert b"content-type: application/problem+json" in response.lower()
            assert body_of(response)["code"] == "INVALID_ARGUMENT"
        with connect(live) as sock:  # the server goes on answering
            sock.sendall(REQUEST)
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_a_connection_whose_headers_do_not_arrive_is_closed(tmp_path: Path) -> None:
    with started(tmp_path, header_timeout_ms=300) as live:
        with connect(live) as silent:  # says nothing at all
            assert read_all(silent) == b""
        with connect(live) as slow:  # starts a request and stalls
            slow.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
            assert read_all(slow) == b""
        with connect(live) as kept:  # a kept-alive connection: the same for its next request
            kept.sendall(REQUEST)
            assert kept.recv(65536).startswith(b"HTTP/1.1 200")
            kept.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert read_all(kept) == b""


def test_long_polls_past_the_cap_are_503_with_retry_after(tmp_path: Path) -> None:
    with started(tmp_path, max_long_polls=2) as live:
        results: list[httpx.Response] = []

        def poll() -> None:
            with live.client(CONSUMER) as c:
                results.append(c.get("/v1/topics/orders.lp/messages",
                                     params={"waitMs": 30_000}))

        waiting = [threading.Thread(target=poll) for _ in range(2)]
        for t in waiting:
            t.start()
        notifier = live.app.state.ctx.notifier
        deadline = time.monotonic() + 10
        while notifier.polls < 2:  # both are waiting (start-up of the two requests)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with live.client(CONSUMER) as c:
            r = c.get("/v1/topics/orders.lp/messages", params={"waitMs": 30_000})
            assert r.status_code == 503 and r.json()["code"] == "UNAVAILABLE", r.text
            assert r.headers["retry-after"] == "1"
            r = c.post("/v1/topics/orders.lp/groups/g:receive", json={"waitMs": 30_000})
            assert r.status_code == 503 and r.json()["code"] == "UNAVAILABLE", r.text
            # a pull that does not wait is not a long poll
            assert c.get("/v1/topics/orders.lp/messages").status_code == 200
        with live.client(ADMIN) as c:  # a delivery releases the two
            assert c.post("/v1/topics/orders.lp/messages", json={"body": "x"}).status_code == 201
        for t in waiting:
            t.join(timeout=30)
        assert [len(r.json()["messages"]) for r in results] == [1, 1]
        assert notifier.polls == 0


