"""A scan's delivery commit leaves the index entries SCHEDULED; below the persisted frontier
they read as DELIVERED, and the delivery ledger gives their offsets (scheduler/ledger.py).
A parked message, the one exception to the rule: tests/scheduler/test_poison.py."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from storage.constants import CF_INDEX, CF_META, META_LEDGER_PREFIX
from storage.errors import AlreadyDelivered
from storage.keys import index_key
from storage.records import MessageStatus, decode_index
from storage.rocks import RocksStore
from tests.support.engine import START_MS, Harness, advance_until, read_topic


def _stored_status(store: RocksStore, topic: str, msg_id: str) -> MessageStatus:
    raw = store.get(CF_INDEX, index_key(topic, msg_id))
    assert raw is not None
    return decode_index(raw).status


def _ledger_entries(store: RocksStore) -> int:
    return sum(1 for _ in store.scan(CF_META, META_LEDGER_PREFIX, META_LEDGER_PREFIX + b"\xff"))


def test_scan_deliveries_answer_delivered_with_their_offsets(harness: Harness,
                                                             clock: FakeClock) -> None:
    """Two topics in one shard, due at different times, delivered in commits of several
    small scans: every status names the offset its record has in the topic's queue, and
    survives a restart."""
    broker = harness.open(flaky=True, timer_shards=1, scan_batch_size=7, delivery_batch_max=64)
    store = harness.store
    assert store is not None
    sent = [(topic, f"{topic}-{i}") for i in range(40) for topic in ("a", "b")]
    broker.send_batch([SendRequest(topic=t, body=m.encode(), msg_id=m, deliver_at=START_MS + 10
                                   + i % 13) for i, (t, m) in enumerate(sent)])
    broker.send(SendRequest(topic="a", body=b"later", msg_id="later", delay_ms=60_000))
    clock.advance(30)
    broker.drain()
    offsets = {(r.topic, r.msg_id): r.queue_offset
               for topic in ("a", "b") for r in read_topic(broker, topic)}
    assert len(offsets) == 80
    # nothing rewritten: the stored entries still say SCHEDULED
    assert {_stored_status(store, t, m) for t, m in sent} == {MessageStatus.SCHEDULED}
    assert _ledger_entries(store) >= 80 // 7
    for _ in range(2):
        for topic, msg_id in sent:
            info = broker.status(topic, msg_id)
            assert (info.status, info.offset) == (MessageStatus.DELIVERED,
                                                  offsets[(topic, msg_id)])
        assert broker.status("a", "later").status is MessageStatus.SCHEDULED
        broker.close()
        broker = harness.open(timer_shards=1)  # the frontier and the ledger are persisted
    with pytest.raises(AlreadyDelivered):
        broker.cancel("b", "b-3")
    again = broker.send(SendRequest(topic="a", body=b"x", msg_id="a-5", delay_ms=10))
    assert (again.duplicate, again.status) == (True, MessageStatus.DELIVERED)
    assert broker.cancel("a", "later").status is MessageStatus.CANCELLED


def test_a_cancel_of_a_queued_message_keeps_the_offsets_of_the_others(
        harness: Harness, clock: FakeClock) -> None:
    """Scans of 4 wait on a failing log, then go in one commit; two of their messages are
    cancelled meanwhile (the committer skips them): each scan's ledger entry counts the
    records that went, so the others' offsets are right and the cancelled ones stay
    CANCELLED."""
    broker = harness.open(flaky=True, timer_shards=1, scan_batch_size=4, delivery_batch_max=64)
    assert harness.log is not None
    for i in range(10):
        broker.send(SendRequest(topic="t", body=b"x", msg_id=f"m{i}", delay_ms=10))
    harness.log.fail_appends = 1_000_000
    clock.advance(10)
    advance_until(clock, lambda: broker.metrics.retries.value >= 2)
    broker.cancel("t", "m1")
    broker.cancel("t", "m6")
    harness.log.fail_appends = 0
    advance_until(clock, lambda: broker.ready)
    broker.drain()
    offsets = {r.msg_id: r.queue_offset for r in read_topic(broker, "t")}
    assert len(offsets) == 8
    for i in range(10):
        info = broker.status("t", f"m{i}")
        if i in (1, 6):
            assert (info.status, info.offset) == (MessageStatus.CANCELLED, None)
        else:
            assert (info.status, info.offset) == (MessageStatus.DELIVERED, offsets[f"m{i}"])


def test_the_ledger_goes_with_the_retention(harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(flaky=True, retention_ms=60_000, timer_shards=2, scan_batch_size=5)
    store = harness.store
    assert store is not None
    broker.send_batch([SendRequest(topic=f"t{i % 4}", body=b"x", msg_id=f"m{i}",
                                   delay_ms=10 + i) for i in range(40)])
    clock.advance(100)
    broker.drain()
    assert _ledger_entries(store) >= 8
    clock.advance(30_000)
    broker.send(SendRequest(topic="t0", body=b"x", msg_id="young", delay_ms=10))
    clock.advance(10)
    broker.drain()
    young = _ledger_entries(store)
    clock.advance(30_000)  # the first 40 are past the retention, "young" is not
    _wait(lambda: broker.metrics.expired.value >= 40)
    _wait(lambda: _ledger_entries(store) == 1)
    assert young > 1
    assert broker.status("t0", "young").offset == 10


def _wait(condition: Callable[[], bool]) -> None:
    """A bounded wait for the clean-up thread (fake time stands still meanwhile)."""
    pause = threading.Event()  # never set
    for _ in range(2000):
        if condition():
            return
        pause.wait(0.005)
    raise AssertionError("the clean-up thread did not get there")
