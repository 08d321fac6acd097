"""A real uvicorn serving the app in a thread of this process, on a free loopback port.

Tests reach the engine behind it directly (a FakeClock to drive, ``broker.drain()`` to wait
on), which a server in another process would not allow.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from fastapi import FastAPI

from app.server import Server
from app.settings import Settings
from app.wiring import uvicorn_config

START_TIMEOUT_S = 60


@contextmanager
def serve_in_thread(app: FastAPI, settings: Settings, *,
                    tune_gc: bool = False) -> Iterator[str]:
    """Serve ``app`` (built by app/wiring.py) on a pre-bound 127.0.0.1 socket; yields the
    base URL; stops the server and joins its thread on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn_config(app, replace(settings, host="127.0.0.1", port=port,
                                         log_level="warning"))
    server = Server(config, on_shutdown=app.state.ctx.release_waiters, tune_gc=tune_gc)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not server.started:  # start-up, not a due time: a short poll is fine here
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=START_TIMEOUT_S)
        sock.close()
