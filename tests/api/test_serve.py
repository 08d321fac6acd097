"""``hourglass serve`` as a real process: generated admin token, readiness, clean SIGTERM."""

from __future__ import annotations

import gc
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app.server import GC_GEN0_THRESHOLD
from scheduler.clock import FakeClock
from tests.support.live import T0, make_settings, serve

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_generates_a_token_and_stops_cleanly(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOURGLASS_")}
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--data-dir", str(data), "--port", str(port)],
        env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:  # start-up: poll readiness
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "not ready in time"
            time.sleep(0.1)
        token_file = data / "admin.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        output = (tmp_path / "server.log").read_text()
        assert str(token_file) in output
        assert token not in output
        assert httpx.get(f"{base}/v1/admin/stats", timeout=10).status_code == 401
        stats = httpx.get(f"{base}/v1/admin/stats", timeout=10,
                          headers={"Authorization": f"Bearer {token}"})
        assert stats.status_code == 200
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in (tmp_path / "server.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_the_served_process_freezes_what_start_up_made(tmp_path: Path) -> None:
    """``hourglass serve`` moves everything alive after start-up out of the cyclic GC's
    reach and collects the young generation less often (app.server.tune_gc); the test
    servers do neither."""
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        with serve(make_settings(tmp_path / "a"), clock=FakeClock(T0)) as live:
            assert httpx.get(f"{live.base_url}/healthz").status_code == 200
            assert gc.get_freeze_count() == 0
            assert gc.get_threshold() == thresholds
        with serve(make_settings(tmp_path / "b"), clock=FakeClock(T0), tune_gc=True) as live:
            assert gc.get_freeze_count() > 10_000  # modules, the app, the engine
            assert gc.get_threshold() == (GC_GEN0_THRESHOLD, *thresholds[1:])
            assert httpx.get(f"{live.base_url}/healthz").status_code == 200
    finally:
        gc.unfreeze()  # give this test process its collector back
        gc.set_threshold(*thresholds)
