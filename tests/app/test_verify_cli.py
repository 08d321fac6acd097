"""hourglass verify over a real data directory written by a real Broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.verify_cli import main, verify
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from scheduler.model import SendRequest
from storage.constants import CF_CQ, COMMITLOG_DIR, ROCKSDB_DIR
from storage.consume_queue import ConsumeQueue, run_entries
from storage.keys import cq_key
from storage.rocks import RocksStore


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data directory holding 30 delivered messages over two topics, 10 still pending."""
    clock = FakeClock()
    broker = Broker(EngineConfig(data_dir=tmp_path, segment_size=4096, max_body_bytes=1024),
                    clock)
    broker.start()
    try:
        for i in range(40):
            broker.send(SendRequest(topic=f"t{i % 2}", body=b"x" * 100, msg_id=f"m{i}",
                                    delay_ms=1000 if i < 30 else 60_000))
        clock.advance(1000)
        broker.drain()
    finally:
        broker.close()
    return tmp_path


def test_a_consistent_directory_verifies(
    data_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--data-dir", str(data_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["log_records"] == 30
    assert report["topics"] == {"t0": 15, "t1": 15}
    assert report["applied_position"] == report["log_end"] > 0
    assert report["problems"] == []


def test_a_flipped_bit_in_the_log_is_reported(data_dir: Path) -> None:
    segment = sorted((data_dir / COMMITLOG_DIR).glob("0*"))[0]
    raw = bytearray(segment.read_bytes())
    raw[200] ^= 0x01  # inside the payload of an early record
    segment.write_bytes(bytes(raw))
    report = verify(data_dir)
    assert report.problem_count >= 1
    assert any("CRC" in p for p in report.problems)
    assert main(["--data-dir", str(data_dir)]) == 1


def test_a_gap_in_a_consume_queue_is_reported(data_dir: Path) -> None:
    with RocksStore(data_dir / ROCKSDB_DIR, timer_shards=None) as store:
        prefix = cq_key("t0", 0)[:-8]
        runs = [(k, v) for k, v in store.scan(CF_CQ) if k.startswith(prefix)]
        entries = [e for k, v in runs for e in run_entries(k, v, len(prefix))]
        assert [e[0] for e in entries] == list(range(15))
        batch = store.batch()
        for key, _ in runs:
            batch.delete(CF_CQ, key)
        ConsumeQueue.put_many(batch, "t0", [e for e in entries if e[0] != 3])  # 3 left out
        store.write(batch)
    report = verify(data_dir)
    assert any("t0: offset 4 where 3 was expected" in p for p in report.problems)


def test_not_a_data_directory_is_a_usage_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--data-dir", str(tmp_path / "nope")]) == 2
    assert "not an hourglass data directory" in capsys.readouterr().err
