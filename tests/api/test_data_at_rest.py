"""Data at rest: ``hourglass serve`` keeps its data directory 0700 and every file
0600 (message bodies, callback secrets in RocksDB, the CommitLog, snapshots), refuses an
admin token others can read, and ``hourglass analyze`` takes no path from a manifest."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.api.test_serve import REPO, free_port


@contextmanager
def served(data: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOURGLASS_")}
    env["HOURGLASS_SEGMENT_SIZE"] = "8MiB"
    with (tmp_path / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--data-dir", str(data),
             "--port", str(port)], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield f"http://127.0.0.1:{port}", proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)


def wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:  # start-up: poll readiness
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "not ready in time"
        time.sleep(0.1)


def test_every_directory_is_0700_and_every_file_0600(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with served(data, tmp_path) as (base, proc):
        wait_ready(base, proc, tmp_path / "server.log")
        auth = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
        with httpx.Client(base_url=base, headers=auth, timeout=30) as client:
            assert client.post("/v1/topics/orders/messages",
                               json={"body": "secret body"}).status_code == 201
            assert client.post("/v1/topics/orders/messages",
                               json={"body": "later", "delayMs": 60_000}).status_code == 201
            assert client.post("/v1/admin/snapshots").status_code == 201
    seen = 0
    for root, _dirs, files in os.walk(data):
        for name in [root, *(os.path.join(root, f) for f in files)]:
            mode = stat.S_IMODE(os.lstat(name).st_mode)
            assert mode & 0o077 == 0, f"{name} is {mode:o}"
            seen += 1
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert seen > 20  # RocksDB's files, the CommitLog, the snapshot


def test_serve_refuses_an_admin_token_others_can_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    token = data / "admin.token"
    token.write_text("a-token-long-enough-0123456789abcdef\n")
    token.chmod(0o644)
    with served(data, tmp_path) as (_, proc):
        assert proc.wait(timeout=60) == 2
    output = (tmp_path / "server.log").read_text()
    assert "readable by others" in output and "chmod 600" in output


def test_analyze_takes_no_path_from_a_manifest(tmp_path: Path) -> None:
    from spark_jobs.analyze import main as analyze

    data = tmp_path / "data"
    with served(data, tmp_path) as (base, proc):
        wait_ready(base, proc, tmp_path / "server.log")
        auth = {"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"}
        snapshot = httpx.post(f"{base}/v1/admin/snapshots", headers=auth, timeout=30)
        assert snapshot.status_code == 201, snapshot.text
    path = Path(snapshot.json()["path"])
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["snapshotId"] = "../../outside"
    (path / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out" / "report"
    code = analyze([str(path), "--out", str(out), "--export-parquet", str(tmp_path / "out" / "x"),
                    "--quiet"])
    assert code == 2
    assert not (tmp_path / "outside").exists() and not out.exists()
