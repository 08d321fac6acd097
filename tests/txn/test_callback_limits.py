"""Check-back callbacks against hostile producer endpoints, over real HTTP: an
answer that drips in or never ends is cut at a total deadline and a size cap (UNKNOWN), and
URLs on ports outside the allow-list cannot be registered."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from scheduler.checkback import CallbackRegistration, CheckAnswer, CheckbackClient
from scheduler.clock import FakeClock
from scheduler.model import TransactionCheck
from tests.support.live import ADMIN, T0, make_settings, serve


@contextmanager
def hostile_endpoint(kind: str) -> Iterator[str]:
    """A producer endpoint answering 200 with ``{"status": "COMMIT"}`` preceded by 10 MiB of
    blanks ("huge"), or with its bytes dripping one every 50 ms ("drip")."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # accept() notices ``stop``
    stop = threading.Event()

    def serve_one(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)
                answer = b'{"status": "COMMIT"}'
                body = b" " * (10 << 20) + answer if kind == "huge" else answer
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(body))
                if kind == "huge":
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


def _check() -> TransactionCheck:
    return TransactionCheck(transaction_id="01ARZ3NDEKTSV4RRFFQ69G5FAV", msg_id="m",
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
