"""Check-back callbacks against hostile producer endpoints, over real HTTP: an
answer that drips in or never ends is cut at a total deadline and a size cap (UNKNOWN), the
cap counts compressed and decoded bytes, and URLs on ports outside the allow-list (a port
named for another host included) cannot be registered."""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.checkback.client import CheckAnswer, CheckbackClient
from scheduler.checkback.registry import CallbackRegistration
from scheduler.clock import FakeClock
from scheduler.model import PendingCheck
from tests.support.live import ADMIN, T0, make_settings, serve

COMMIT = b'{"status": "COMMIT"}'


def _gzip(data: bytes, *, empty_blocks: int = 0) -> bytes:
    """``data`` gzip-compressed, followed in the deflate stream by ``empty_blocks`` empty
    stored blocks (5 bytes each on the wire, nothing decoded: still a valid stream)."""
    deflate = zlib.compressobj(wbits=31)
    head = deflate.compress(data) + deflate.flush(zlib.Z_SYNC_FLUSH)  # byte-aligned here
    return head + b"\x00\x00\x00\xff\xff" * empty_blocks + deflate.flush()


def _deflate(data: bytes, *, raw: bool) -> bytes:
    deflate = zlib.compressobj(wbits=-15 if raw else 15)
    return deflate.compress(data) + deflate.flush()


# kind -> (Content-Encoding, body) of a producer's answer
ENCODED_ANSWERS = {
    "gzip": ("gzip", _gzip(COMMIT)),
    "deflate": ("deflate", _deflate(COMMIT, raw=False)),
    "raw-deflate": ("deflate", _deflate(COMMIT, raw=True)),
    # 10 MiB on the wire that decode to nothing, then the answer: the compressed size counts
    "gzip-padded": ("gzip", _gzip(COMMIT, empty_blocks=2 << 20)),
    # ~50 KiB on the wire, 48 MiB decoded: the decoded size counts, and is not all inflated
    "gzip-bomb": ("gzip", _gzip(b" " * (48 << 20) + COMMIT)),
    "gzip-trailer": ("gzip", _gzip(COMMIT) + b"\x00" * (10 << 20)),  # after the gzip member
    "br": ("br", COMMIT),  # a coding not offered
}


def _read_request(conn: socket.socket) -> None:
    request = b""
    while b"\r\n\r\n" not in request:
        chunk = conn.recv(65536)
        if not chunk:
            return
        request += chunk
    head, _, body = request.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


@contextmanager
def hostile_endpoint(kind: str) -> Iterator[str]:
    """A producer endpoint answering 200 with ``{"status": "COMMIT"}`` preceded by 10 MiB of
    blanks ("huge"), with its bytes dripping one every 50 ms ("drip"), or encoded as
    ``ENCODED_ANSWERS[kind]`` says."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # accept() notices ``stop``
    stop = threading.Event()

    def serve_one(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                _read_request(conn)  # all of it: closing on unread bytes would reset the answer
                answer = COMMIT
                body = b" " * (10 << 20) + answer if kind == "huge" else answer
                encoding = b""
                if kind in ENCODED_ANSWERS:
                    coding, body = ENCODED_ANSWERS[kind]
                    encoding = b"content-encoding: %s\r\n" % coding.encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"%scontent-length: %d\r\n\r\n" % (encoding, len(body)))
                if kind != "drip":
                    conn.sendall(body)
                for byte in body if kind == "drip" else b"":
                    if stop.wait(0.05):
                        return
                    conn.sendall(bytes([byte]))
            except OSError:
                pass  # the client hung up: what it should do

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/tx-check"
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=10)


def _check() -> PendingCheck:
    return PendingCheck(transaction_id="01ARZ3NDEKTSV4RRFFQ69G5FAV", msg_id="m",
                            topic="orders", producer_group="pg", check_times=1, prepared_at=1,
                            body=b"x", tags=None, keys=(), properties={})


def test_a_dripping_or_endless_answer_is_unknown_within_the_deadline() -> None:
    client = CheckbackClient(timeout_ms=500, workers=1)
    try:
        for kind in ("drip", "huge"):
            with hostile_endpoint(kind) as url:
                started = time.monotonic()
                answer = client.ask(CallbackRegistration(producer_group="pg", url=url),
                                    _check(), 1)
                took = time.monotonic() - started
            assert answer is CheckAnswer.UNKNOWN, kind
            assert took < 2.0, (kind, took)  # the deadline, not a read timeout per byte
    finally:
        client.close()


@pytest.mark.parametrize("kind, expected", [
    ("gzip", CheckAnswer.COMMIT), ("deflate", CheckAnswer.COMMIT),
    ("raw-deflate", CheckAnswer.COMMIT), ("gzip-padded", CheckAnswer.UNKNOWN),
    ("gzip-bomb", CheckAnswer.UNKNOWN), ("gzip-trailer", CheckAnswer.UNKNOWN),
    ("br", CheckAnswer.UNKNOWN),
])
def test_the_answer_cap_counts_compressed_and_decoded_bytes(kind: str,
                                                            expected: CheckAnswer) -> None:
    """64 KiB on the wire and 64 KiB decoded at most, and a bomb is never inflated whole
    (before: the cap counted decoded bytes only, after httpx had inflated a whole chunk)."""
    client = CheckbackClient(timeout_ms=5_000, workers=1)
    try:
        with hostile_endpoint(kind) as url:
            tracemalloc.start()
            try:
                answer = client.ask(CallbackRegistration(producer_group="pg", url=url),
                                    _check(), 1)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert answer is expected, kind
        assert peak < 4 << 20, (kind, peak)  # the bomb inflated whole is 48 MiB
    finally:
        client.close()


def test_callback_urls_on_other_ports_cannot_be_registered(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    settings = replace(settings, engine=replace(
        settings.engine, transaction_callback_allowed_hosts=(
            "orders.internal", "10.0.0.7:8080", "*.example.com", "a.example.com:9000",
            "[::1]:08443")))
    path = "/v1/producer-groups/pg/check-callback"
    with serve(settings, FakeClock(T0)) as live, live.client(ADMIN) as admin:
        for url, status in (("http://orders.internal/check", 200),
                            ("https://orders.internal/check", 200),
                            # 10.0.0.7's port, not orders.internal's (issue 32, finding 7)
                            ("http://orders.internal:8080/check", 400),
                            ("http://orders.internal:6379/check", 400),  # e.g. Redis
                            ("http://10.0.0.7:22/check", 400),
                            ("http://10.0.0.7:8080/check", 200),
                            ("http://a.example.com:9000/check", 200),
                            ("http://b.example.com:9000/check", 400),  # a's port only
                            ("https://b.example.com/check", 200),
                            ("http://[::1]:8443/check", 200),
                            ("http://[::1]:8080/check", 400)):
            r = admin.put(path, json={"url": url})
            assert r.status_code == status, (url, r.text)
            if status == 400:
                assert "port" in r.json()["detail"]
