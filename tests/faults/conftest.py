"""Fixtures of the fault suites.

- ``faulty_server``: the real app over real HTTP (uvicorn in a thread, 127.0.0.1) on a real
  Broker whose CommitLog and RocksStore are the fault-injecting wrappers of the engine tests
  (tests/support/engine.py: ``FlakyLog.fail_appends``, ``FlakyStore.fail_writes``).
- ``small_fs``: a size-limited tmpfs mounted under tmp_path, for a real full disk (ENOSPC
  from the kernel); skipped where this process may not mount.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.auth import Role, TokenSpec
from app.settings import load_settings
from app.wiring import build_app
from scheduler.broker import Broker
from scheduler.clock import SystemClock
from scheduler.committer import Log
from scheduler.config import EngineConfig
from scheduler.engine import open_commitlog
from storage.rocks import RocksStore
from tests.disk import tmpfs
from tests.support.engine import FlakyLog, FlakyStore
from tests.support.uvicorn_thread import serve_in_thread

TOKEN = "faults-admin-token-0123456789"


class FaultyServer:
    """A served Broker with fault switches; ``client()`` as a ServerProcess's."""

    def __init__(self, base_url: str, broker: Broker, log: FlakyLog, store: FlakyStore) -> None:
        self.base_url = base_url
        self.broker = broker
        self.log = log
        self.store = store
        self.token = TOKEN

    def client(self, timeout_s: float = 30.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=timeout_s,
                            headers={"Authorization": f"Bearer {TOKEN}"})

    def clear_faults(self) -> None:
        self.log.fail_appends = 0
        self.store.fail_writes = 0


@contextlib.contextmanager
def serve_faulty(data_dir: Path, **engine: Any) -> Iterator[FaultyServer]:
    settings = load_settings(cli={"data_dir": str(data_dir)})
    settings = replace(settings, tokens=(TokenSpec(token=TOKEN, role=Role.ADMIN, name="admin"),),
                       engine=replace(settings.engine, segment_size=1 << 20,
                                      max_body_bytes=512 << 10,
                                      flush_interval_ms=50, retry_max_backoff_ms=300, **engine))
    parts: dict[str, Any] = {}

    def log_factory(directory: Path, cfg: EngineConfig) -> Log:
        parts["log"] = FlakyLog(open_commitlog(directory, cfg))
        return parts["log"]

    def store_factory(directory: Path, cfg: EngineConfig) -> RocksStore:
        parts["store"] = FlakyStore(directory, timer_shards=cfg.timer_shards)
        return parts["store"]

    broker = Broker(settings.engine, SystemClock(), log_factory=log_factory,
                    store_factory=store_factory)
    app = build_app(settings, broker=broker)
    with serve_in_thread(app, settings) as base_url:
        faulty = FaultyServer(base_url, broker, parts["log"], parts["store"])
        try:
            yield faulty
        finally:
            faulty.clear_faults()


@pytest.fixture
def faulty_server(tmp_path: Path) -> Iterator[FaultyServer]:
    with serve_faulty(tmp_path / "data") as server:
        yield server


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs: a disk that really fills up."""
    with tmpfs(tmp_path, 48, "; the injected faults of test_fault_storm.py still run") as fs:
        yield fs
