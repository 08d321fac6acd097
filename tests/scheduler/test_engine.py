"""The engine builder (scheduler/engine.py): it opens storage and wires the parts without
starting a thread, closes what it opened when a part refuses to be built, and a follower's
parts run no thread."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.clock import FakeClock
from scheduler.engine import EngineParts, build_engine
from scheduler.metrics import EngineMetrics
from scheduler.model import SendRequest
from storage.errors import InvalidArgument
from tests.support.engine import START_MS, make_config


def _build(data_dir: Path, *, follower: bool = False, **overrides: object) -> EngineParts:
    config = make_config(data_dir, **overrides)
    return build_engine(config, levels=config.check(), clock=FakeClock(START_MS),
                        metrics=EngineMetrics(), follower=follower, clustered=False,
                        check_running=lambda: None, notify=lambda _topics: None)


def test_built_parts_run_no_thread_until_started(tmp_path: Path) -> None:
    parts = _build(tmp_path)
    try:
        assert not any(s.is_alive() for s in parts.scanners)
        parts.start()
        assert all(s.is_alive() for s in parts.scanners)
        [result] = parts.writes.submit([parts.intake.prepare(
            SendRequest(topic="t", body=b"x", msg_id="m", delay_ms=60_000), START_MS)])
        assert result.msg_id == "m"
    finally:
        parts.stop()
    assert not any(s.is_alive() for s in parts.scanners)


def test_a_part_that_refuses_closes_the_storage_already_opened(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="transaction settings"):
        _build(tmp_path, transaction_check_interval_ms=0)
    # RocksDB's lock and the log's files were released: the directory opens again, at once
    parts = _build(tmp_path)
    parts.start()
    parts.stop()


def test_a_followers_parts_start_no_thread(tmp_path: Path) -> None:
    _build(tmp_path).stop()  # a leader made the store
    parts = _build(tmp_path, follower=True)
    parts.start()
    try:
        assert parts.guard is not None and parts.replicator is None
        assert not any(s.is_alive() for s in parts.scanners)
    finally:
        parts.stop()


def test_a_followers_watermark_lag_is_how_late_its_oldest_due_message_is(
        tmp_path: Path) -> None:
    """A follower's scanners never run, so "now minus what they covered" would be the age of
    the epoch (1.8e12 ms on a follower that applied nothing due). Its lag is how late the
    oldest due message it holds undelivered is."""
    leader = _build(tmp_path)
    leader.start()
    leader.writes.submit([leader.intake.prepare(
        SendRequest(topic="t", body=b"x", msg_id="m", delay_ms=60_000), START_MS)])
    leader.stop()  # the message is pending: due at START_MS + 60 000, not delivered
    parts = _build(tmp_path, follower=True)
    parts.start()
    try:
        assert set(parts.lags(START_MS).values()) == {0.0}  # nothing due yet
        lags = parts.lags(START_MS + 60_000 + 750)
        assert sorted(lags.values())[-1] == 750.0  # the shard holding it, 750 ms late
        assert sum(lags.values()) == 750.0  # the others have nothing due
    finally:
        parts.stop()
