"""`hourglass snapshot create|list|remove`: offline, and through a running server (real
`hourglass serve` on 127.0.0.1) when the server holds the RocksDB lock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import snapshot_cli
from app.cli import main as hourglass
from bench.support.analysis_workload import WorkloadSpec, build_store
from storage.snapshots import list_snapshots, read_manifest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    store, _ = build_store(tmp_path / "rocksdb",
                           WorkloadSpec(messages=1_000, delivered=300, cancelled=100))
    store.close()
    return tmp_path


def _json(capsys: pytest.CaptureFixture[str]) -> object:
    return json.loads(capsys.readouterr().out)


def test_offline_create_list_remove(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert hourglass(["snapshot", "create", "--data-dir", str(data_dir), "--json"]) == 0
    created = _json(capsys)
    assert isinstance(created, dict)
    snap = Path(created["path"])
    assert read_manifest(snap)["rocksdb"]["meta"]["timerShards"] == 2
    assert hourglass(["snapshot", "list", "--data-dir", str(data_dir), "--json"]) == 0
    rows = _json(capsys)
    assert isinstance(rows, list) and len(rows) == 1
    row = rows[0]
    assert row["snapshotId"] == created["snapshotId"]
    # pinned: the snapshot's SSTs compaction has since dropped from the live DB (opening the
    # store may have compacted): computed here by name
    live = {f.name for f in (data_dir / "rocksdb").iterdir()}
    assert row["pinnedBytes"] == sum(f.stat().st_size for f in (snap / "db").iterdir()
                                     if f.suffix == ".sst" and f.name not in live)
    assert row["totalBytes"] > row["pinnedBytes"]
    assert hourglass(["snapshot", "list", "--data-dir", str(data_dir)]) == 0
    assert created["snapshotId"] in capsys.readouterr().out
    assert hourglass(["snapshot", "remove", created["snapshotId"],
                      "--data-dir", str(data_dir)]) == 0
    assert not snap.exists()
    capsys.readouterr()
    assert hourglass(["snapshot", "remove", created["snapshotId"],
                      "--data-dir", str(data_dir)]) == 1
    assert "no snapshot" in capsys.readouterr().err


def test_not_a_data_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert hourglass(["snapshot", "create", "--data-dir", str(tmp_path)]) == 2
    assert "holds no hourglass store" in capsys.readouterr().err
    assert not (tmp_path / "snapshots").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server(data_dir: Path) -> Iterator[str]:
    """`hourglass serve` on a free loopback port; yields its URL once uvicorn says so."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOURGLASS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--data-dir", str(data_dir),
         "--port", str(port)], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    started = threading.Event()
    lines: list[str] = []

    def watch() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "Application startup complete" in line:
                started.set()
        started.set()  # the process ended: let the test fail with its output

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert started.wait(120) and proc.poll() is None, "".join(lines)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)
        watcher.join(30)
        assert proc.stderr is not None
        proc.stderr.close()


def test_create_goes_through_the_server_holding_the_lock(
    data_dir: Path, server: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("HOURGLASS_ADMIN_TOKEN", raising=False)
    monkeypatch.setattr(snapshot_cli, "DEFAULT_URL", server)  # "the server on this machine"
    # no --url: opening the store finds RocksDB's lock taken, so the server is asked, with
    # the admin token it generated in the data directory
    assert hourglass(["snapshot", "create", "--data-dir", str(data_dir), "--json"]) == 0
    created = _json(capsys)
    assert isinstance(created, dict)
    (snap,) = list_snapshots(data_dir / "snapshots")
    assert snap.snapshot_id == created["snapshotId"]
    assert read_manifest(snap.path)["extra"]  # the engine's positions
    assert hourglass(["snapshot", "list", "--data-dir", str(data_dir)]) == 0
    capsys.readouterr()
    assert hourglass(["snapshot", "create", "--data-dir", str(data_dir), "--url", server,
                      "--token", "wrong"]) == 1
    assert "HTTP 401" in capsys.readouterr().err
    assert len(list_snapshots(data_dir / "snapshots")) == 1


def test_locked_store_and_no_server_is_a_clear_error(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from storage.rocks import RocksStore;"
         f"s = RocksStore({str(data_dir / 'rocksdb')!r}, timer_shards=None); print('open');"
         "sys.stdout.flush(); sys.stdin.read()"],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        monkeypatch.setattr(snapshot_cli, "DEFAULT_URL", f"http://127.0.0.1:{_free_port()}")
        assert hourglass(["snapshot", "create", "--data-dir", str(data_dir),
                          "--token", "t"]) == 1
        assert "locked by a running server" in capsys.readouterr().err
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
        assert holder.stdout is not None
        holder.stdout.close()
    assert not (data_dir / "snapshots").exists() or not list_snapshots(data_dir / "snapshots")
