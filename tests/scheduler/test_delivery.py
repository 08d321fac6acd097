"""Scheduling and delivery under a FakeClock: never early, in order, all of them."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from scheduler import delivery
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.committer import CommitOutcome, ScanBatch
from scheduler.delivery import INLINE_MAX, DeliveryStage
from scheduler.metrics import EngineMetrics, Histogram
from scheduler.model import SendRequest
from scheduler.scanner import Progress
from storage.errors import DelayTooLong, InvalidArgument, NotFound, TopicInvalid
from storage.records import MessageStatus
from tests.support.engine import START_MS, Harness, advance_until, read_topic


def test_never_early_and_in_deliver_time_order(broker: Broker, clock: FakeClock) -> None:
    delays = [700, 50, 300, 50, 1, 999, 300, 120, 5, 640]
    sent = [broker.send(SendRequest(topic="t", body=f"m{i}".encode(), msg_id=f"m{i}",
                                    delay_ms=d)) for i, d in enumerate(delays)]
    assert all(r.status is MessageStatus.SCHEDULED for r in sent)
    for step in range(0, 1001, 1):
        if step:
            clock.advance(1)
        broker.drain()
        got = read_topic(broker, "t")
        now = clock.now_ms()
        # exactly the messages due by now are in the log, and none early
        assert sorted(m.msg_id for m in got) == sorted(
            r.msg_id for r in sent if r.deliver_at <= now)
        assert all(m.stored_at >= m.deliver_at for m in got)
    got = read_topic(broker, "t")
    assert [m.offset for m in got] == list(range(len(delays)))
    assert [m.deliver_at for m in got] == sorted(m.deliver_at for m in got)
    assert broker.stats().pending == 0


def test_many_messages_with_one_deliver_at_are_all_delivered(harness: Harness,
                                                            clock: FakeClock) -> None:
    broker = harness.open(scan_batch_size=100, delivery_queue_batches=2, delivery_batch_max=250)
    due = START_MS + 10_000
    for chunk in range(20):
        broker.send_batch([SendRequest(topic=f"t{i % 3}", body=b"x" * 100,
                                       msg_id=f"c{chunk}-{i}", deliver_at=due)
                           for i in range(1000)])
    clock.advance(9_999)
    broker.drain()
    assert sum(broker.end_offset(f"t{i}") for i in range(3)) == 0
    clock.advance(1)
    broker.drain(timeout_s=120)
    got = [m for i in range(3) for m in read_topic(broker, f"t{i}")]
    assert len(got) == 20_000
    assert len({m.msg_id for m in got}) == 20_000
    assert all(m.deliver_at == due and m.stored_at == due for m in got)
    stats = broker.stats()
    assert stats.pending == 0 and stats.delivered == 20_000
    # each topic's offsets are dense
    for i in range(3):
        assert [m.offset for m in read_topic(broker, f"t{i}")] == list(
            range(broker.end_offset(f"t{i}")))
    assert broker.metrics.scan_batch_size.snapshot().count >= 200  # bounded scans of <= 100
    lateness = broker.metrics.lateness_ms.snapshot()
    assert lateness.count == 20_000 and lateness.sum == 0  # the FakeClock did not move
    assert broker.metrics.watermark_lag_ms.samples() == [({"shard": "0"}, 0.0),
                                                        ({"shard": "1"}, 0.0)]


def test_past_deliver_at_is_delivered_at_once(broker: Broker, clock: FakeClock) -> None:
    r = broker.send(SendRequest(topic="t", body=b"late", deliver_at=START_MS - 60_000))
    assert r.status is MessageStatus.DELIVERED
    r2 = broker.send(SendRequest(topic="t", body=b"now"))  # no timing at all: now
    assert r2.status is MessageStatus.DELIVERED
    got = read_topic(broker, "t")  # synchronously: no drain, no clock advance
    assert [m.body for m in got] == [b"late", b"now"]
    assert got[0].deliver_at == START_MS - 60_000 and got[0].stored_at == START_MS
    assert broker.status("t", r.msg_id).status is MessageStatus.DELIVERED
    assert broker.metrics.delivered_immediate.value == 2


def test_delay_levels_and_clamping(broker: Broker, clock: FakeClock) -> None:
    r1 = broker.send(SendRequest(topic="t", body=b"a", delay_level=1))
    r3 = broker.send(SendRequest(topic="t", body=b"b", properties={"DELAY": "3"}))
    r99 = broker.send(SendRequest(topic="t", body=b"c", delay_level=99))
    assert (r1.deliver_at, r3.deliver_at, r99.deliver_at) == (
        START_MS + 1000, START_MS + 10_000, START_MS + 7_200_000)
    by_level = {labels["level"]: v for labels, v in
                    broker.metrics.scheduled_by_level.samples()}
    assert by_level == {"1": 1.0, "3": 1.0, "18": 1.0}
    with pytest.raises(InvalidArgument):
        broker.send(SendRequest(topic="t", body=b"d", delay_level=0))
    clock.advance(7_200_000 - 1)
    broker.drain()
    assert [m.body for m in read_topic(broker, "t")] == [b"a", b"b"]
    clock.advance(1)
    broker.drain()
    assert [m.body for m in read_topic(broker, "t")] == [b"a", b"b", b"c"]


def test_maximum_delay_is_configurable_and_changes_nothing(harness: Harness) -> None:
    broker = harness.open(max_delay_ms=86_400_000)
    broker.send(SendRequest(topic="t", body=b"ok", msg_id="ok", delay_ms=86_400_000))
    with pytest.raises(DelayTooLong):
        broker.send(SendRequest(topic="t", body=b"x", msg_id="far", delay_ms=86_400_001))
    with pytest.raises(NotFound):
        broker.status("t", "far")
    assert broker.stats().pending == 1


def test_a_bad_message_rejects_the_whole_batch(broker: Broker) -> None:
    good = [SendRequest(topic="t", body=b"x", msg_id=f"g{i}", delay_ms=10) for i in range(5)]
    with pytest.raises(TopicInvalid):
        broker.send_batch([*good, SendRequest(topic="bad topic", body=b"x")])
    with pytest.raises(InvalidArgument):
        broker.send_batch([SendRequest(topic="t", body=b"x")] * 1001)
    for i in range(5):
        with pytest.raises(NotFound):
            broker.status("t", f"g{i}")
    assert broker.stats().pending == 0 and broker.end_offset("t") == 0


def test_idempotent_resend(broker: Broker, clock: FakeClock) -> None:
    first = broker.send(SendRequest(topic="t", body=b"one", msg_id="m", delay_ms=100))
    again = broker.send(SendRequest(topic="t", body=b"two", msg_id="m", delay_ms=5))
    assert again.duplicate and not first.duplicate
    assert (again.deliver_at, again.cancel_handle, again.status) == (
        first.deliver_at, first.cancel_handle, MessageStatus.SCHEDULED)
    # the same msgId in another topic is another message
    other = broker.send(SendRequest(topic="u", body=b"u", msg_id="m", delay_ms=100))
    assert not other.duplicate
    # within one batch the second occurrence is a duplicate of the first
    batch = broker.send_batch([
        SendRequest(topic="t", body=b"b1", msg_id="n", delay_ms=50),
        SendRequest(topic="t", body=b"b2", msg_id="n", delay_ms=70),
        SendRequest(topic="t", body=b"now", msg_id="k"),
        SendRequest(topic="t", body=b"now2", msg_id="k"),
    ])
    assert [r.duplicate for r in batch] == [False, True, False, True]
    assert batch[1].deliver_at == batch[0].deliver_at == START_MS + 50
    assert batch[3].status is MessageStatus.DELIVERED
    clock.advance(200)
    broker.drain()
    after = broker.send(SendRequest(topic="t", body=b"three", msg_id="m"))
    assert after.duplicate and after.status is MessageStatus.DELIVERED
    got = read_topic(broker, "t")
    assert sorted(m.body for m in got) == [b"b1", b"now", b"one"]  # each exactly once
    assert broker.metrics.duplicates.value == 4


def test_pull_group_offsets_and_listener(broker: Broker, clock: FakeClock) -> None:
    seen: list[set[str]] = []
    broker.add_delivery_listener(lambda topics: seen.append(set(topics)))
    broker.send_batch([SendRequest(topic="t", body=f"{i}".encode(), delay_ms=10)
                       for i in range(5)])
    assert seen == []
    clock.advance(10)
    broker.drain()
    assert seen and set().union(*seen) == {"t"}
    page = broker.pull("t", 1, 3)
    assert [m.offset for m in page.messages] == [1, 2, 3] and page.next_offset == 4
    assert broker.pull("t", 5, 10).messages == [] and broker.pull("t", 5, 10).next_offset == 5
    assert broker.groups.offset("t", "g") == 0
    assert broker.groups.set_offset("t", "g", 4) == 4
    assert broker.groups.offset("t", "g") == 4
    with pytest.raises(InvalidArgument):
        broker.groups.set_offset("t", "g", 6)
    with pytest.raises(InvalidArgument):
        broker.groups.set_offset("t", "g", -1)
    with pytest.raises(InvalidArgument):
        broker.pull("t", -1, 5)
    with pytest.raises(InvalidArgument):
        broker.pull("t", 0, 1001)


def test_bad_engine_configuration_fails_at_construction(tmp_path: object) -> None:
    from pathlib import Path

    from scheduler.config import EngineConfig

    data = Path(str(tmp_path))
    with pytest.raises(InvalidArgument, match="messageDelayLevel"):
        Broker(EngineConfig(data_dir=data, message_delay_level="1s 2x"))
    with pytest.raises(InvalidArgument, match="max_delay_ms"):
        Broker(EngineConfig(data_dir=data, message_delay_level="1s 2d", max_delay_ms=86_400_000))
    with pytest.raises(InvalidArgument, match="scan_batch_size"):
        Broker(EngineConfig(data_dir=data, scan_batch_size=0))


def test_the_delivered_prefix_is_cleaned_up(harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(flaky=True, timer_shards=1, compact_after_deletes=100)
    assert harness.store is not None
    broker.send_batch([SendRequest(topic="t", body=b"x", delay_ms=10 + i % 50)
                       for i in range(250)])
    clock.advance(100)
    broker.drain()
    advance_until(clock, lambda: bool(harness.store and harness.store.cleanups), step=1)
    cf, before = harness.store.cleanups[-1]
    assert cf == "timer.0" and before == broker.stats().watermarks["0"] > START_MS
    assert len(read_topic(broker, "t")) == 250


def test_the_first_batch_after_a_pause_is_committed_alone() -> None:
    """What falls due after a pause reaches the log in its first scan batch, not after the
    scanners have queued more; once a backlog is queued, commits take several batches."""
    commits: list[list[int]] = []
    release = threading.Event()

    class Recorder:
        def commit_due(self, scans: Sequence[ScanBatch]) -> CommitOutcome:
            commits.append([int(s.start) for s in scans])
            if len(commits) == 2:  # hold the second commit while more is queued
                assert release.wait(10)
            return CommitOutcome()

    def scan(name: int) -> ScanBatch:  # more than a scanner commits inline
        return ScanBatch(shard=0, start=str(name).encode(), end=b"~",
                         items=[(b"k", b"v")] * (INLINE_MAX + 1))

    progress = Progress()
    stage = DeliveryStage(committer=Recorder(), clock=FakeClock(START_MS),
                          metrics=EngineMetrics(), progress=progress, queue_batches=8,
                          batch_max=100_000, max_backoff_ms=100, on_commit=lambda _: None)
    for name in (1, 2, 3):  # queued while the stage was idle
        assert stage.put(scan(name))
    stage.start()
    try:
        deadline = time.monotonic() + 10
        while len(commits) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert stage.put(scan(4)) and stage.put(scan(5))  # queued behind a commit
        release.set()
        with progress.cond:
            assert progress.cond.wait_for(lambda: progress.committed == 5, 10)
    finally:
        release.set()
        stage.stop()
    assert commits == [[1], [2, 3], [4, 5]]


def test_a_batch_queued_for_a_waiting_consumer_hands_it_the_gil(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scanner yields the GIL (delivery.yield_gil) after queueing for a delivery thread
    that waits, and only then: a batch queued while it commits needs no hand-over."""
    yields: list[str] = []
    monkeypatch.setattr(delivery, "yield_gil",
                        lambda: yields.append(threading.current_thread().name))
    queue = delivery.BoundedQueue(4)
    batch = ScanBatch(shard=0, start=b"a", end=b"b", items=[(b"k", b"v")])
    got: list[ScanBatch | None] = []
    consumer = threading.Thread(target=lambda: got.append(queue.get()), name="consumer")
    consumer.start()
    deadline = time.monotonic() + 10
    while queue._waiting == 0 and time.monotonic() < deadline:  # the consumer waits in get
        time.sleep(0.001)
    assert queue.put(batch)
    consumer.join(10)
    assert got == [batch] and yields == ["MainThread"]
    assert queue.put(batch)  # nobody waits: no hand-over
    assert yields == ["MainThread"]


def test_the_queue_holds_at_most_its_bytes_of_values_and_always_one_batch() -> None:
    """Large bodies: the byte bound, not the batch count, stops a scanner; a batch larger
    than the bound still goes into an empty queue (else it could never be delivered)."""
    queue = delivery.BoundedQueue(32, max_bytes=10_000)

    def batch(n: int, size: int) -> ScanBatch:
        return ScanBatch(shard=0, start=b"a", end=b"b", items=[(b"k", b"v" * size)] * n)

    big = batch(10, 3000)  # 30 000 bytes: more than the bound alone
    assert delivery.batch_bytes(big) == 30_000
    assert queue.put(big)  # into the empty queue
    assert queue.bytes == 30_000
    blocked = threading.Event()
    done = threading.Event()

    def scanner() -> None:
        blocked.set()
        queue.put(batch(2, 100))
        done.set()

    t = threading.Thread(target=scanner)
    t.start()
    assert blocked.wait(10)
    assert not done.wait(0.2)  # full by bytes with one batch of 32 queued
    assert queue.get() is big
    queue.done()
    assert done.wait(10)  # room again: the waiting put goes in
    t.join(10)
    assert queue.bytes == 200 and queue.messages == 2
    assert queue.put(batch(40, 100))  # 200 + 4000 <= 10 000: no wait
    assert queue.bytes == 4200
    assert delivery.batch_bytes(ScanBatch(shard=0, start=b"a", end=b"b", items=[])) == 0
    mixed = ScanBatch(shard=0, start=b"a", end=b"b",
                      items=[(b"k", b"x" * 10), (b"k", b"x" * 40), (b"k", b"x" * 70)])
    assert delivery.batch_bytes(mixed) == 3 * (10 + 40 + 70) // 3
    queue.close()
    assert queue.bytes == 0


def test_a_commit_takes_queued_batches_up_to_its_bytes_not_only_its_count() -> None:
    commits: list[list[int]] = []

    class Recorder:
        def commit_due(self, scans: Sequence[ScanBatch]) -> CommitOutcome:
            commits.append([int(s.start) for s in scans])
            return CommitOutcome()

    def scan(name: int) -> ScanBatch:  # 1000 values of 10 000 bytes (one object, shared)
        return ScanBatch(shard=0, start=str(name).encode(), end=b"~",
                         items=[(b"k", b"v" * 10_000)] * 1000)

    assert delivery.batch_bytes(scan(0)) * 2 > delivery.COMMIT_BYTES_MAX
    progress = Progress()
    stage = DeliveryStage(committer=Recorder(), clock=FakeClock(START_MS),
                          metrics=EngineMetrics(), progress=progress, queue_batches=8,
                          batch_max=100_000, max_backoff_ms=100, on_commit=lambda _: None)
    for name in (1, 2, 3, 4, 5):  # queued while the stage was idle
        assert stage.put(scan(name))
    stage.start()
    try:
        with progress.cond:
            assert progress.cond.wait_for(lambda: progress.committed == 5, 10)
    finally:
        stage.stop()
    # the first alone (after a pause), then two at a time: the second takes it past 16 MiB
    assert commits == [[1], [2, 3], [4, 5]]


def test_each_delivered_message_counts_its_own_lateness(harness: Harness,
                                                        clock: FakeClock) -> None:
    """A commit counts its lateness once per deliverAt (one instant: one count), not once per
    message: the histogram still holds every message's storedAt - deliverAt as the log does,
    for commits of many instants and of one."""
    broker = harness.open(scan_batch_size=200, delivery_batch_max=1000)
    due = START_MS + 10_000
    broker.send_batch([SendRequest(topic="mixed", body=b"x", msg_id=f"m{i}",
                                   deliver_at=due - 5 * (i % 4)) for i in range(300)])
    broker.send_batch([SendRequest(topic="one", body=b"x", msg_id=f"o{i}", deliver_at=due + 1)
                       for i in range(500)])
    clock.advance(10_003)
    broker.drain()
    got = read_topic(broker, "mixed") + read_topic(broker, "one")
    assert len(got) == 800
    late = [m.stored_at - m.deliver_at for m in got]
    assert sorted(set(late)) == [2, 3, 8, 13, 18]
    expected = Histogram("x", "", broker.metrics.lateness_ms.bounds)
    expected.observe_many(late)
    assert broker.metrics.lateness_ms.snapshot() == expected.snapshot()


def test_a_histogram_takes_counted_values_as_it_takes_them_one_by_one() -> None:
    counted, one_by_one = (Histogram("h", "", (1, 5, 10)) for _ in range(2))
    counted.observe_counts({0: 3, 5: 2, 7: 1, 11: 4})
    counted.observe_counts({})
    for value in [0, 0, 0, 5, 5, 7, 11, 11, 11, 11]:
        one_by_one.observe(value)
    assert counted.snapshot() == one_by_one.snapshot()
    assert counted.snapshot().count == 10 and counted.snapshot().sum == 61
