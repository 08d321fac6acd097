"""A real local HTTP server that plays a producer's check-back endpoint in tests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Producer:
    """How the endpoint answers: ``answers[transactionId]`` (default ``default``); an answer
    "SLOW" holds the response until ``release`` is set (to provoke a client timeout),
    "HTTP500" answers a server error, anything else is sent as ``{"status": answer}``."""

    default: str = "UNKNOWN"
    answers: dict[str, str] = field(default_factory=dict)
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def seen(self, tx_id: str) -> int:
        with self.lock:
            return sum(1 for r in self.received if r["transactionId"] == tx_id)


@contextmanager
def producer_endpoint(producer: Producer) -> Iterator[str]:
    """Serve ``producer`` on 127.0.0.1; yields the check URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            payload = json.loads(raw)
            with producer.lock:
                producer.received.append(payload)
                producer.headers.append({k.lower(): v for k, v in self.headers.items()})
                answer = producer.answers.get(payload["transactionId"], producer.default)
            if answer == "SLOW":
                producer.release.wait(30)
                answer = "COMMIT"  # too late: the client gave up
            if answer == "HTTP500":
                self._reply(500, b'{"status": "COMMIT"}')
                return
            self._reply(200, json.dumps({"status": answer}).encode())

        def _reply(self, status: int, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out and hung up

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/tx-check"
    finally:
        producer.release.set()
        server.shutdown()
        server.server_close()
        thread.join()
