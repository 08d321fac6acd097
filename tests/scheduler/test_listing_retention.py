"""list_scheduled paging, status retention, the watermark race, snapshots."""

from __future__ import annotations

import random
import threading

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.codec import decode_keys
from scheduler.listing import list_scheduled
from scheduler.model import SendRequest
from storage.constants import CF_EXPIRY
from storage.errors import InvalidArgument, NotFound
from storage.records import MessageStatus
from tests.support.engine import START_MS, Harness, read_topic, run_threads


def test_list_scheduled_pages_by_deliver_time(broker: Broker, clock: FakeClock) -> None:
    rng = random.Random(3)
    expected = []
    for i in range(130):
        delay = rng.randrange(1, 10_000)
        topic = "mine" if i % 2 else f"other{i % 5}"
        broker.send(SendRequest(topic=topic, body=b"x", msg_id=f"m{i:03d}", delay_ms=delay))
        if topic == "mine":
            expected.append((START_MS + delay, f"m{i:03d}"))
    expected.sort()
    seen: list[tuple[int, str]] = []
    cursor = None
    while True:
        page, cursor = broker.list_scheduled("mine", from_ms=None, to_ms=None, limit=7,
                                             cursor=cursor)
        assert len(page) <= 7
        assert all(m.status is MessageStatus.SCHEDULED and m.topic == "mine" for m in page)
        seen.extend((m.deliver_at, m.msg_id) for m in page)
        if cursor is None:
            break
    assert seen == expected
    # a window [from, to)
    lo, hi = expected[10][0], expected[20][0]
    page, _ = broker.list_scheduled("mine", from_ms=lo, to_ms=hi, limit=1000, cursor=None)
    assert [(m.deliver_at, m.msg_id) for m in page] == [e for e in expected if lo <= e[0] < hi]
    # delivered messages leave the listing
    clock.advance(expected[5][0] - START_MS)
    broker.drain()
    page, _ = broker.list_scheduled("mine", from_ms=None, to_ms=None, limit=1000, cursor=None)
    assert [(m.deliver_at, m.msg_id) for m in page] == expected[6:]


def test_list_scheduled_bounds_its_work_and_checks_its_input(broker: Broker) -> None:
    broker.send_batch([SendRequest(topic="busy", body=b"x", delay_ms=10 + i)
                       for i in range(50)])
    broker.send(SendRequest(topic="rare", body=b"x", msg_id="r", delay_ms=1000))
    page, cursor = list_scheduled(broker.parts.store, "rare", from_ms=None, to_ms=None, limit=10,
                                  cursor=None, scan_budget=20)
    assert page == [] and cursor is not None  # short page: go on from the cursor
    while cursor is not None and not page:
        page, cursor = list_scheduled(broker.parts.store, "rare", from_ms=None, to_ms=None,
                                      limit=10, cursor=cursor, scan_budget=20)
    assert [m.msg_id for m in page] == ["r"]
    for bad in ({"limit": 0}, {"limit": 1001}, {"cursor": "%%%"}, {"from_ms": -1}):
        kw = {"from_ms": None, "to_ms": None, "limit": 10, "cursor": None, **bad}
        with pytest.raises(InvalidArgument):
            broker.list_scheduled("busy", **kw)  # type: ignore[arg-type]
    _, foreign = broker.list_scheduled("busy", from_ms=None, to_ms=None, limit=1, cursor=None)
    with pytest.raises(InvalidArgument, match="another topic"):
        broker.list_scheduled("rare", from_ms=None, to_ms=None, limit=1, cursor=foreign)


def test_final_states_are_kept_for_the_retention_then_removed(harness: Harness,
                                                              clock: FakeClock) -> None:
    broker = harness.open(retention_ms=60_000)
    broker.send(SendRequest(topic="t", body=b"x", msg_id="delivered", delay_ms=10))
    broker.send(SendRequest(topic="t", body=b"x", msg_id="cancelled", delay_ms=10))
    broker.send(SendRequest(topic="t", body=b"x", msg_id="pending", delay_ms=3_600_000))
    broker.cancel("t", "cancelled")
    clock.advance(10)
    broker.drain()
    clock.advance(59_000)
    assert broker.status("t", "delivered").status is MessageStatus.DELIVERED
    assert broker.status("t", "cancelled").status is MessageStatus.CANCELLED
    clock.advance(1_000)
    _wait_expired(broker, 2)
    for gone in ("delivered", "cancelled"):
        with pytest.raises(NotFound):
            broker.status("t", gone)
    assert broker.status("t", "pending").status is MessageStatus.SCHEDULED
    assert broker.metrics.expired.value == 2
    assert [m.msg_id for m in read_topic(broker, "t")] == ["delivered"]  # the log keeps it


def test_sends_racing_the_scanner_are_never_stranded(harness: Harness,
                                                     clock: FakeClock) -> None:
    """The watermark race: while time moves and scanners scan, senders keep writing keys
    due within a few ms. None may be left below a scanner's frontier or erased by the
    range delete of a scanned batch: every acknowledged send reaches the log once."""
    broker = harness.open(scan_batch_size=8, delivery_batch_max=16)
    acknowledged: list[list[str]] = [[] for _ in range(3)]
    stop = threading.Event()

    def sender(k: int) -> None:
        rng = random.Random(k)
        for i in range(1500):
            r = broker.send(SendRequest(topic=f"t{k}", body=b"x", msg_id=f"{k}-{i}",
                                        deliver_at=clock.now_ms() + rng.randrange(0, 4)))
            acknowledged[k].append(r.msg_id)
        stop.set()

    def ticker() -> None:
        while not stop.is_set():
            clock.advance(1)

    run_threads([ticker, *(lambda k=k: sender(k) for k in range(3))])
    clock.advance(10)
    broker.drain(timeout_s=120)
    for k in range(3):
        got = [m.msg_id for m in read_topic(broker, f"t{k}")]
        assert len(got) == len(set(got)) == 1500
        assert sorted(got) == sorted(acknowledged[k])
    assert broker.stats().pending == 0
    assert broker.list_scheduled("t0", from_ms=None, to_ms=None, limit=10, cursor=None)[0] == []


def test_snapshot(broker: Broker) -> None:
    broker.send(SendRequest(topic="t", body=b"x", delay_ms=100))
    info = broker.snapshot()
    assert set(info) == {"snapshotId", "path", "createdAt"}
    assert info["createdAt"] == START_MS
    from pathlib import Path
    assert Path(info["path"]).exists()


def test_a_delivery_commit_writes_one_expiry_entry_for_all_its_messages(
        harness: Harness, clock: FakeClock) -> None:
    """2500 messages delivered by one commit: one expiry entry names them all, and at the
    end of the retention every one of them goes (in RocksDB writes of ~1000 index keys)."""
    broker = harness.open(flaky=True, retention_ms=60_000, timer_shards=1,
                          scan_batch_size=4096, delivery_batch_max=4096)
    store = harness.store
    assert store is not None
    for b in range(3):
        broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"m{b}-{i}", delay_ms=10)
                           for i in range(1000 if b < 2 else 500)])
    clock.advance(10)
    broker.drain()
    entries = list(store.scan(CF_EXPIRY))
    assert len(entries) == 1
    assert len(decode_keys(entries[0][1])) == 2500
    assert broker.status("t", "m2-499").status is MessageStatus.DELIVERED
    clock.advance(60_000)
    _wait_expired(broker, 2500)
    assert broker.metrics.expired.value == 2500
    assert list(store.scan(CF_EXPIRY)) == []
    for gone in ("m0-0", "m1-999", "m2-499"):
        with pytest.raises(NotFound):
            broker.status("t", gone)


def _wait_expired(broker: Broker, n: int) -> None:
    """A bounded wait (never a due time: fake time stands still) for the clean-up thread to
    have expired ``n`` index entries."""
    pause = threading.Event()  # never set
    for _ in range(2000):
        if broker.metrics.expired.value >= n:
            return
        pause.wait(0.005)
