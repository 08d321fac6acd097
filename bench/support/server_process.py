"""A real ``hourglass serve`` in a subprocess on 127.0.0.1: start, wait until it answers,
``kill -9``, restart on the same data directory and port. Shared by the crash harness, the
fault suite and the soak.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0  # imports + RocksDB open + CommitLog recovery, on a loaded machine


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` different free loopback ports. Each is bound until all are chosen: ports taken
    one after another, each released before the next, can be the same one twice (it
    happened: a nats-server given one port to listen on and to serve its monitor on)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(n):
            s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def serve_argv() -> list[str]:
    """``hourglass serve`` of this interpreter's environment (the .venv script if present)."""
    script = Path(sys.executable).parent / "hourglass"
    if script.exists() and os.access(script, os.X_OK):
        return [str(script), "serve"]
    return [sys.executable, "-m", "app.cli", "serve"]


class ServerError(RuntimeError):
    """The server did not come up (or died); the message holds the tail of its log."""


class ServerProcess:
    """One data directory, one port, any number of (re)starts. ``settings`` are extra
    ``HOURGLASS_*`` settings by name (``{"segment_size": "4MiB"}``); ``argv`` replaces
    ``hourglass serve`` (it gets the same flags); ``env`` adds environment variables."""

    def __init__(self, data_dir: Path, *, token: str, log_path: Path,
                 settings: Mapping[str, str] | None = None, port: int | None = None,
                 argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.token = token
        self.log_path = log_path
        self.port = port or free_port()
        self.settings = dict(settings or {})
        self.argv = list(argv) if argv is not None else serve_argv()
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOURGLASS_")}
        env["HOURGLASS_ADMIN_TOKEN"] = self.token
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
        env.setdefault("HOURGLASS_LOG_LEVEL", "warning")
        for name, value in self.settings.items():
            env["HOURGLASS_" + name.upper()] = str(value)
        env.update(self.extra_env)
        return env

    def start(self, *, ready: str = "/healthz", timeout_s: float = STARTUP_TIMEOUT_S) -> float:
        """Start and wait until ``ready`` answers 200; returns the seconds that took
        (process start + recovery). Raises ServerError if it exits or never answers."""
        if self.alive():
            raise ServerError("the server is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [*self.argv, "--data-dir", str(self.data_dir), "--host", "127.0.0.1",
                "--port", str(self.port)]
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self.starts + 1} on port {self.port}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self._env(),
                                         start_new_session=True)
        self.starts += 1
        deadline = t0 + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise ServerError(f"hourglass serve exited with {self.proc.returncode}:\n"
                                      f"{self.log_tail()}")
                with contextlib.suppress(httpx.TransportError):
                    if client.get(self.base_url + ready).status_code == 200:
                        return time.monotonic() - t0
                if time.monotonic() > deadline:
                    self.kill()
                    raise ServerError(f"{ready} did not answer 200 within {timeout_s:.0f} s:\n"
                                      f"{self.log_tail()}")
                time.sleep(0.02)  # start-up of another process: nothing to wait on but a poll

    def kill(self) -> None:
        """SIGKILL, no warning: nothing is flushed, closed or shut down."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Graceful stop (SIGTERM: uvicorn shuts down, the engine flushes and closes);
        SIGKILL after ``timeout_s``. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def client(self, timeout_s: float = 10.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=timeout_s,
                            headers={"Authorization": f"Bearer {self.token}"})

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
