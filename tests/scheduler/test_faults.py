"""Storage faults: retried with back-off, never dropped, never duplicated."""

from __future__ import annotations

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from storage.errors import StorageError, Unavailable
from storage.records import MessageStatus
from storage.rocks import Batch
from tests.support.engine import Harness, advance_until, open_failing_after_append, read_topic


def test_commitlog_failure_is_retried_with_backoff_and_nothing_is_lost(
        harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(flaky=True, retry_max_backoff_ms=300)
    log = harness.log
    assert log is not None
    broker.send_batch([SendRequest(topic="t", body=f"{i}".encode(), msg_id=f"m{i}",
                                   delay_ms=10) for i in range(50)])
    log.fail_appends = 5
    assert broker.ready
    clock.advance(10)
    advance_until(clock, lambda: broker.metrics.retries.value >= 1, step=1)
    assert not broker.ready and broker.metrics.blocked.value == 1
    # back-off grows by 100 ms per attempt and is driven by the engine clock: without time
    # passing, no further attempt is made
    retries = broker.metrics.retries.value
    assert broker.metrics.retries.value == retries
    advance_until(clock, lambda: broker.ready, step=50)
    broker.drain()
    assert broker.metrics.retries.value == 5
    got = read_topic(broker, "t")
    assert sorted(m.msg_id for m in got) == sorted(f"m{i}" for i in range(50))
    assert broker.metrics.blocked.value == 0 and broker.stats().pending == 0


def test_rocksdb_failure_after_the_append_is_replayed_not_duplicated(
        harness: Harness, clock: FakeClock) -> None:
    """The log append succeeds, the RocksDB commit fails: the records are in the log; the
    retry must apply them (replay) and append nothing twice."""
    broker, log, _ = open_failing_after_append(harness, messages=30, store_failures=1)
    clock.advance(10)
    advance_until(clock, lambda: broker.metrics.retries.value >= 1, step=1)
    advance_until(clock, lambda: broker.ready)
    broker.drain()
    got = read_topic(broker, "t")
    assert sorted(m.msg_id for m in got) == sorted(f"m{i}" for i in range(30))
    assert [m.offset for m in got] == list(range(30))
    assert log.records == 30  # the retry appended nothing: the first append was replayed
    assert broker.metrics.replayed.value == 30
    assert all(broker.status("t", f"m{i}").status is MessageStatus.DELIVERED
               for i in range(30))
    assert broker.stats().pending == 0


def test_failed_immediate_send_is_unavailable_and_a_resend_is_exactly_once(
        harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(flaky=True)
    store, log = harness.store, harness.log
    assert store is not None and log is not None
    log.fail_appends = 1
    with pytest.raises(Unavailable):
        broker.send(SendRequest(topic="t", body=b"a", msg_id="a"))
    assert read_topic(broker, "t") == []
    assert broker.send(SendRequest(topic="t", body=b"a", msg_id="a")).status is (
        MessageStatus.DELIVERED)
    # now the append works but RocksDB fails: the client sees 503, the log has the record
    store.fail_writes = 1
    with pytest.raises(StorageError):
        broker.send(SendRequest(topic="t", body=b"b", msg_id="b"))
    assert not broker.ready
    again = broker.send(SendRequest(topic="t", body=b"b", msg_id="b"))  # the client retries
    assert again.duplicate and again.status is MessageStatus.DELIVERED
    assert broker.ready
    assert [m.msg_id for m in read_topic(broker, "t")] == ["a", "b"]


def test_a_failed_scheduled_send_changes_nothing(harness: Harness) -> None:
    broker = harness.open(flaky=True)
    assert harness.store is not None
    harness.store.fail_writes = 1
    with pytest.raises(Unavailable):
        broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"m{i}", delay_ms=10)
                           for i in range(3)])
    assert broker.stats().pending == 0
    assert broker.list_scheduled("t", from_ms=None, to_ms=None, limit=10, cursor=None)[0] == []


def test_memory_stays_bounded_while_delivery_is_blocked(harness: Harness,
                                                        clock: FakeClock) -> None:
    """Flow control: with delivery failing, scanners stop once the queue is full."""
    broker = hold_a_burst(harness, clock, chunks=10, topics=1, scan_batch_size=50,
                          delivery_queue_batches=3, delivery_batch_max=50)
    # let the scanners run as far as they can: the queue never exceeds its bound
    for _ in range(50):
        clock.advance(1)
        assert broker.metrics.delivery_queue_batches.value <= 3
        assert broker.metrics.delivery_queue_messages.value <= 150
    scanned = broker.metrics.scan_batch_size.snapshot().count
    assert scanned <= 2 * (3 + 1 + 1)  # queue + the batch in commit + one blocked in put
    assert release_and_count(harness, broker, clock, topics=1) == 10_000


def test_drain_times_out_while_delivery_is_blocked(harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(flaky=True)
    assert harness.log is not None
    broker.send(SendRequest(topic="t", body=b"x", delay_ms=1))
    harness.log.fail_appends = 1_000
    clock.advance(1)
    with pytest.raises(TimeoutError):
        broker.drain(timeout_s=0.3)


def test_unavailable_after_close(broker: Broker) -> None:
    broker.close()
    with pytest.raises(Unavailable):
        broker.send(SendRequest(topic="t", body=b"x"))
    with pytest.raises(Unavailable):
        broker.status("t", "m")
    assert not broker.ready
    broker.close()  # idempotent


def test_a_failure_while_building_the_commit_still_marks_the_records_for_replay(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The append landed but adding its index/queue entries to the batch raised (a closed
    or reopening store): the records must be replayed, never appended twice or skipped."""
    broker = harness.open(flaky=True)
    log = harness.log
    assert log is not None
    real_put_many = Batch.put_many

    def failing_put_many(self: Batch, *args: object, **kwargs: object) -> None:
        monkeypatch.setattr(Batch, "put_many", real_put_many)  # once
        raise StorageError("injected: the store refused the batch")

    def arm(_positions: list[int]) -> None:
        monkeypatch.setattr(Batch, "put_many", failing_put_many)
        log.after_append = None

    log.after_append = arm
    with pytest.raises(StorageError):
        broker.send(SendRequest(topic="t", body=b"a", msg_id="a"))
    assert not broker.ready  # the record waits in the log for its replay
    assert broker.send(SendRequest(topic="t", body=b"b", msg_id="b")).status is (
        MessageStatus.DELIVERED)
    got = read_topic(broker, "t")
    assert [(m.msg_id, m.offset) for m in got] == [("a", 0), ("b", 1)]
    assert log.records == 2
    assert broker.status("t", "a").status is MessageStatus.DELIVERED


def test_a_burst_is_scanned_only_one_commit_ahead(harness: Harness, clock: FakeClock) -> None:
    """A burst's scanners read ahead only about one commit's worth (``delivery_batch_max``
    messages queued) of the batch being committed, not the whole burst: scanning
    ahead competes for the GIL with the commit, and the stream starts later
    (docs/performance.md, W2). Here the commit is held (failing appends) and the scanners
    run as far as they can."""
    broker = hold_a_burst(harness, clock, chunks=20, topics=4)
    for _ in range(50):
        clock.advance(1)
    # the queue (4096 messages: 5 batches of 1000) + the batch in the commit + one blocked
    # in put per shard
    assert broker.metrics.delivery_queue_messages.value <= 5000
    assert broker.metrics.scan_batch_size.snapshot().count <= 5 + 1 + 2
    assert release_and_count(harness, broker, clock, topics=4) == 20_000


def hold_a_burst(harness: Harness, clock: FakeClock, *, chunks: int, topics: int,
                 **options: int) -> Broker:
    """``chunks`` sends of 1000 messages over ``topics`` topics, all due at once, and the
    log failing every append: the commit is held while the scanners run."""
    broker = harness.open(flaky=True, **options)
    assert harness.log is not None
    for chunk in range(chunks):
        broker.send_batch([SendRequest(topic=f"t{i % topics}", body=b"x",
                                       msg_id=f"{chunk}-{i}", delay_ms=10)
                           for i in range(1000)])
    harness.log.fail_appends = 1_000_000
    clock.advance(10)
    advance_until(clock, lambda: broker.metrics.retries.value >= 3, step=1)
    return broker


def release_and_count(harness: Harness, broker: Broker, clock: FakeClock, *,
                      topics: int) -> int:
    """Let ``hold_a_burst``'s appends work again, drain, and count what was delivered."""
    assert harness.log is not None
    harness.log.fail_appends = 0
    advance_until(clock, lambda: broker.ready)
    broker.drain(timeout_s=120)
    return sum(len(read_topic(broker, f"t{k}")) for k in range(topics))
