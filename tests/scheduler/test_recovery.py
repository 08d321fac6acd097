"""Recovery: restarts, shutdown mid-delivery, and crashes between the log append and the
RocksDB commit (in-process, and a real SIGKILL of a child process)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from storage.commitlog import CommitLog
from storage.constants import CF_META, COMMITLOG_DIR, META_APPLIED_POSITION, ROCKSDB_DIR
from storage.keys import unpack_u64
from storage.records import MessageStatus
from storage.rocks import RocksStore
from tests.support.engine import Harness, advance_until, open_failing_after_append, read_topic

REPO = Path(__file__).resolve().parents[2]


def test_restart_keeps_pending_messages_and_watermarks(harness: Harness,
                                                       clock: FakeClock) -> None:
    broker = harness.open()
    broker.send_batch([SendRequest(topic="t", body=f"{i}".encode(), msg_id=f"m{i}",
                                   delay_ms=100 * (i + 1)) for i in range(10)])
    clock.advance(350)
    broker.drain()
    assert broker.end_offset("t") == 3
    watermarks = broker.stats().watermarks
    broker.close()
    broker = harness.open()
    assert broker.stats().watermarks == watermarks
    assert broker.stats().pending == 7
    assert broker.status("t", "m9").status is MessageStatus.SCHEDULED
    clock.advance(1000)
    broker.drain()
    assert [m.msg_id for m in read_topic(broker, "t")] == [f"m{i}" for i in range(10)]


def test_shutdown_mid_delivery_loses_and_duplicates_nothing(harness: Harness,
                                                            clock: FakeClock) -> None:
    broker = harness.open(flaky=True, scan_batch_size=50, delivery_batch_max=50,
                          delivery_queue_batches=2)
    log = harness.log
    assert log is not None
    resume = threading.Event()
    # after the first delivery append, the next one waits until the close has begun: the
    # close then meets a delivery in progress, a full queue and most messages still due
    def hold() -> None:
        if log.appends > 0:
            resume.wait(60)

    log.before_append = hold
    for chunk in range(10):
        broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"{chunk}-{i}",
                                       delay_ms=10) for i in range(500)])
    clock.advance(10)
    closer = threading.Thread(target=broker.close)
    advance_until(clock, lambda: log.appends == 1, step=0)
    closer.start()
    assert broker.parts.stopping.wait(60)
    resume.set()
    closer.join(60)
    assert not closer.is_alive()
    partial = broker.metrics.delivered.value
    assert 0 < partial < 5000
    broker = harness.open()
    broker.drain(timeout_s=120)
    got = [m.msg_id for m in read_topic(broker, "t")]
    assert len(got) == 5000 == len(set(got))


def test_crash_between_log_append_and_rocksdb_commit(harness: Harness,
                                                     clock: FakeClock) -> None:
    """In process: the append works, every RocksDB commit after it fails, and the engine is
    abandoned in that state; a new Broker on the same directory delivers each once."""
    broker, log, _ = open_failing_after_append(harness, messages=40, store_failures=1_000_000)
    clock.advance(10)
    advance_until(clock, lambda: broker.metrics.retries.value >= 2, step=50)
    assert log.records > 0  # the log has records RocksDB does not know
    assert broker.end_offset("t") == 0
    broker.close()
    broker = harness.open()
    broker.drain()
    got = [m.msg_id for m in read_topic(broker, "t")]
    assert sorted(got) == sorted(f"m{i}" for i in range(40))
    assert broker.metrics.replayed.value == log.records
    assert all(broker.status("t", f"m{i}").status is MessageStatus.DELIVERED for i in range(40))
    assert broker.stats().pending == 0


def _run_child(data_dir: Path, mode: str, count: int) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.scheduler.crash_child", str(data_dir), mode, str(count)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    return [m for line in proc.stdout.splitlines() for m in line.split()]


def _log_and_applied(data_dir: Path) -> tuple[int, int]:
    log = CommitLog(data_dir / COMMITLOG_DIR, segment_size=1 << 20, read_only=True)
    try:
        records = sum(1 for _ in log.iter_from(0))
    finally:
        log.close()
    store = RocksStore(data_dir / ROCKSDB_DIR, timer_shards=None, read_only=True)
    try:
        raw = store.get(CF_META, META_APPLIED_POSITION)
    finally:
        store.close()
    return records, 0 if raw is None else unpack_u64(raw)


@pytest.mark.slow
def test_kill_9_after_the_append_of_a_delivery(harness: Harness, clock: FakeClock) -> None:
    acknowledged = _run_child(harness.data_dir, "delivery", 1000)
    assert len(acknowledged) == 1000
    records, applied = _log_and_applied(harness.data_dir)
    assert records > 0 and applied == 0  # the log has them, RocksDB does not
    clock.advance(1000)
    broker = harness.open()
    broker.drain()
    got = [m.msg_id for m in read_topic(broker, "t")]
    assert sorted(got) == sorted(acknowledged)  # every acknowledged send exactly once
    assert [m.offset for m in read_topic(broker, "t")] == list(range(1000))


@pytest.mark.slow
def test_kill_9_during_an_unacknowledged_immediate_send(harness: Harness,
                                                        clock: FakeClock) -> None:
    acknowledged = _run_child(harness.data_dir, "immediate", 200)
    broker = harness.open()
    # the unacknowledged send is there at most once; the acknowledged ones are pending
    assert [m.msg_id for m in read_topic(broker, "t")] in ([], ["now"])
    assert broker.stats().pending == 200
    again = broker.send(SendRequest(topic="t", body=b"now", msg_id="now"))  # client retry
    assert again.status is MessageStatus.DELIVERED
    clock.advance(1000)
    broker.drain()
    got = [m.msg_id for m in read_topic(broker, "t")]
    assert sorted(got) == sorted([*acknowledged, "now"])
