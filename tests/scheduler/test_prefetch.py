"""The scanner's read-ahead (scheduler/prefetch.py): keys due at an instant are read before
it, delivered from there at that instant (never before), and every path that writes or
deletes a timer key while they are held cuts the read-ahead, so the delivered set is what
the writes say. Real RocksDB and CommitLog, a FakeClock; the engine's own scanner thread
reads ahead when fake time comes within ``scan_prefetch_ms`` of the due instant, and the
state machine also calls the read-ahead at arbitrary points between its steps."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from scheduler.prefetch import PREFETCH_MIN_GAP_MS, Prefetch
from scheduler.timer_index import TimerIndex
from storage.constants import PROP_TIMER_DEL_UNIQKEY, timer_cf
from storage.keys import encode_timer_key, time_bound
from storage.records import MessageStatus
from tests.scheduler.test_stateful import EngineMachine
from tests.support.engine import START_MS, Harness, make_config, read_topic

LEAD = 200  # scan_prefetch_ms of these tests
DUE = START_MS + 1_000
WAIT_S = 30.0


def _k(at: int, msg_id: str) -> bytes:
    return encode_timer_key(at, "t", msg_id)


# --- the read-ahead itself ------------------------------------------------------------------

def _prefetch(keys: list[bytes], end: bytes, size: int = 10) -> Prefetch:
    pre = Prefetch(time_bound(0))
    pre.extend([(k, b"v" * size) for k in keys], end)
    return pre


def test_take_hands_on_only_what_is_due_and_says_when_to_look_next() -> None:
    keys = [_k(5, "a"), _k(5, "b"), _k(7, "c")]
    pre = _prefetch(keys, time_bound(20))
    items, after, more = pre.take(time_bound(6), 10, None)
    assert [k for k, _ in items] == keys[:2] and after == keys[2] and not more
    pre.advance(time_bound(6))
    items, after, more = pre.take(time_bound(8), 10, None)
    assert [k for k, _ in items] == keys[2:] and more  # ran out below 8: read on from 20
    assert not pre


def test_take_stops_at_the_batch_limit_and_at_the_byte_budget_of_large_values() -> None:
    keys = [_k(5, f"m{i}") for i in range(6)]
    pre = _prefetch(keys, time_bound(20))
    assert [k for k, _ in pre.take(time_bound(6), 4, None)[0]] == keys[:4]
    big = _prefetch(keys, time_bound(20), size=1000)
    items, after, more = big.take(time_bound(6), 100, 2500)  # 3 values pass 2500 bytes
    assert [k for k, _ in items] == keys[:3] and after is None and not more


def test_a_write_inside_the_read_ahead_cuts_it_there_and_one_outside_does_not() -> None:
    keys = [_k(5, "a"), _k(5, "c"), _k(6, "e")]
    pre = _prefetch(keys, time_bound(10))
    assert not pre.truncate(_k(10, "z"))  # at or past its end: nothing read ahead changes
    assert len(pre) == 3 and pre.end == time_bound(10)
    assert pre.truncate(_k(5, "b"))  # between a and c: a stays, the rest is read again
    assert [k for k, _ in pre.items] == keys[:1] and pre.end == _k(5, "b")
    items, _, more = pre.take(time_bound(11), 10, None)
    assert [k for k, _ in items] == keys[:1] and more  # (the scan reads on from b)


# --- the engine: a burst read ahead, and every writing path meanwhile --------------------------

@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Harness, FakeClock]]:
    clock = FakeClock(START_MS)
    harness = Harness(tmp_path / "data", clock)
    yield harness, clock
    harness.close_all()


def _open(harness: Harness, **overrides: Any) -> Broker:
    settings_: dict[str, Any] = {"timer_shards": 1, "scan_prefetch_ms": LEAD,
                                 "scan_batch_size": 16}
    settings_.update(overrides)
    return harness.open(**settings_)


def _read_ahead(broker: Broker, clock: FakeClock, due: int = DUE) -> None:
    """Move fake time to half the lead before ``due`` and wait until the scanner has read
    every key due by ``due`` + the lead ahead (or its message bound)."""
    clock.set(due - LEAD // 2)
    state = broker.parts.shards[0]
    cap = broker.config.scan_prefetch_messages
    deadline = time.monotonic() + WAIT_S
    while True:
        with state.lock:
            pre = state.prefetch
            if pre is not None and (pre.end == time_bound(due + LEAD) or len(pre) >= cap):
                return
        assert time.monotonic() < deadline, "the scanner never read ahead"
        time.sleep(0.001)


def _burst(broker: Broker, n: int = 40, due: int = DUE) -> list[str]:
    ids = [f"m{i:03d}" for i in range(0, 2 * n, 2)]  # (odd ones sort between them)
    broker.send_batch([SendRequest(topic="t", body=m.encode(), msg_id=m, deliver_at=due)
                       for m in ids])
    return ids


def _delivered(broker: Broker, topic: str = "t") -> list[str]:
    broker.drain()
    return [r.msg_id for r in read_topic(broker, topic)]


class ReadSpy:
    """Counts the keys TimerIndex.read_due returns while installed."""

    def __init__(self) -> None:
        self.keys = 0
        self._original = TimerIndex.read_due

    def __enter__(self) -> ReadSpy:
        original, spy = self._original, self

        def read_due(index: TimerIndex, *args: Any, **kwargs: Any) -> Any:
            read = original(index, *args, **kwargs)
            spy.keys += len(read.items)
            return read

        TimerIndex.read_due = read_due  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        TimerIndex.read_due = self._original  # type: ignore[method-assign]


def test_a_burst_is_read_before_it_is_due_and_delivered_from_there_at_its_instant(
        engine: tuple[Harness, FakeClock]) -> None:
    harness, clock = engine
    broker = _open(harness)
    ids = _burst(broker)
    broker.send(SendRequest(topic="t", body=b"later", msg_id="later", deliver_at=DUE + 500))
    _read_ahead(broker, clock)
    assert broker.metrics.scan_prefetched.value == len(ids)  # "later" is past the window
    with ReadSpy() as spy:
        clock.set(DUE - 1)
        assert _delivered(broker) == []  # read ahead, never delivered early
        clock.set(DUE)
        assert _delivered(broker) == ids
    assert spy.keys == 0  # every key came from the read-ahead
    clock.set(DUE + 500)
    assert _delivered(broker) == [*ids, "later"]
    assert all(r.stored_at >= r.deliver_at for r in read_topic(broker, "t"))


def test_a_read_ahead_bounded_by_messages_is_read_on_from_rocksdb(
        engine: tuple[Harness, FakeClock]) -> None:
    harness, clock = engine
    broker = _open(harness, scan_prefetch_messages=10)
    ids = _burst(broker)
    _read_ahead(broker, clock)
    assert broker.metrics.scan_prefetched.value == 10
    with ReadSpy() as spy:
        clock.set(DUE)
        assert _delivered(broker) == ids
    assert spy.keys == len(ids) - 10


def test_no_read_ahead_for_a_key_due_sooner_than_the_minimum_gap(
        engine: tuple[Harness, FakeClock]) -> None:
    harness, clock = engine
    broker = _open(harness)
    broker.send(SendRequest(topic="t", body=b"x", msg_id="soon",
                            deliver_at=START_MS + PREFETCH_MIN_GAP_MS - 1))
    broker.drain()
    assert broker.parts.shards[0].prefetch is None
    clock.advance(PREFETCH_MIN_GAP_MS - 1)
    assert _delivered(broker) == ["soon"]
    assert broker.metrics.scan_prefetched.value == 0


def _send_into(broker: Broker, ids: list[str]) -> list[str]:
    # (tags: the send path of prepared messages, WritePaths.submit, not the columns)
    broker.send(SendRequest(topic="t", body=b"x", tags="x", msg_id="m001", deliver_at=DUE))
    return sorted([*ids, "m001"])


def _send_batch_into(broker: Broker, ids: list[str]) -> list[str]:
    broker.send_batch([SendRequest(topic="t", body=b"x", tags="x", msg_id=m, deliver_at=DUE + d)
                       for m, d in (("m003", 0), ("a-first", 0), ("m-window", LEAD - 1))])
    return [*sorted([*ids, "m003", "a-first"]), "m-window"]


def _send_columns_into(broker: Broker, ids: list[str]) -> list[str]:
    stored = broker.send_columns("t", [SendRequest(topic="t", body=b"x", msg_id=m,
                                                   deliver_at=DUE) for m in ("m005", "m011")])
    assert stored is not None  # (WritePaths.submit_columns took them)
    return sorted([*ids, "m005", "m011"])


def _cancel_in(broker: Broker, ids: list[str]) -> list[str]:
    assert broker.cancel("t", ids[7]).status is MessageStatus.CANCELLED
    return [m for m in ids if m != ids[7]]


def _cancel_marker_in(broker: Broker, ids: list[str]) -> list[str]:
    [marker] = broker.send_batch([SendRequest(
        topic="t", body=b"", msg_id="marker", deliver_at=DUE + LEAD - 1,
        properties={PROP_TIMER_DEL_UNIQKEY: ids[3]})])
    assert marker.cancel is not None and marker.cancel.status == "CANCELLED"
    return [m for m in ids if m != ids[3]]


def _transaction_commit_into(broker: Broker, ids: list[str]) -> list[str]:
    tx = broker.transactions.prepare(
        SendRequest(topic="t", body=b"x", msg_id="m007", deliver_at=DUE), producer_group="pg")
    broker.transactions.commit(tx.transaction_id)
    rolled = broker.transactions.prepare(
        SendRequest(topic="t", body=b"x", msg_id="m009", deliver_at=DUE), producer_group="pg")
    broker.transactions.rollback(rolled.transaction_id)
    return sorted([*ids, "m007"])


PATHS: dict[str, Callable[[Broker, list[str]], list[str]]] = {
    "send": _send_into, "send_batch": _send_batch_into, "send_columns": _send_columns_into,
    "cancel": _cancel_in, "cancel_marker": _cancel_marker_in,
    "transaction": _transaction_commit_into,
}


@pytest.mark.parametrize("path", PATHS)
def test_a_write_while_the_burst_is_read_ahead_is_delivered_as_it_says(
        engine: tuple[Harness, FakeClock], path: str) -> None:
    harness, clock = engine
    broker = _open(harness)
    ids = _burst(broker)
    _read_ahead(broker, clock)
    expected = PATHS[path](broker, ids)
    clock.set(DUE + LEAD)
    assert _delivered(broker) == expected
    for msg_id in expected:
        assert broker.status("t", msg_id).status is MessageStatus.DELIVERED
    assert broker.stats().pending == 0


def test_a_nack_scheduled_into_the_read_ahead_is_delivered_again(
        engine: tuple[Harness, FakeClock]) -> None:
    harness, clock = engine
    broker = _open(harness)
    broker.send(SendRequest(topic="t", body=b"x", msg_id="first", deliver_at=START_MS + 10))
    clock.set(START_MS + 10)
    assert _delivered(broker) == ["first"]
    leased = broker.groups.receive("t", "g", 10, 60_000)
    assert leased.receipts is not None and len(leased.receipts) == 1
    ids = _burst(broker)
    _read_ahead(broker, clock)
    broker.groups.nack("t", "g", leased.receipts, delay_ms=DUE - clock.now_ms())
    clock.set(DUE)
    assert _delivered(broker) == ["first", *ids]
    again = broker.groups.receive("t", "g", 100, 60_000)
    shown = [m.record.msg_id for m in again.messages]
    assert "first" in shown and len(shown) == len(ids) + 1


def test_a_redrive_into_the_read_ahead_is_scanned_again(
        engine: tuple[Harness, FakeClock]) -> None:
    harness, clock = engine
    broker = _open(harness, flaky=True)
    broker.send(SendRequest(topic="t", body=b"x", msg_id="poison", deliver_at=START_MS + 10))
    store = harness.store
    assert store is not None
    batch = store.batch()
    batch.put(timer_cf(0), encode_timer_key(START_MS + 10, "t", "poison"), b"\xc1 garbage")
    store.write(batch)
    clock.set(START_MS + 10)
    broker.drain()
    assert [p.msg_id for p in broker.quarantine.messages()] == ["poison"]
    ids = _burst(broker)
    _read_ahead(broker, clock)
    # due at once (just past the scanner's frontier): below the burst, inside the read-ahead
    assert broker.quarantine.redrive() == 1
    assert broker.quarantine.messages() == []
    clock.set(DUE)
    assert _delivered(broker) == ids
    [parked] = broker.quarantine.messages()  # scanned again (and parked again: still garbage)
    assert DUE - LEAD < parked.deliver_at < DUE


def test_a_poison_value_read_ahead_is_parked_and_the_rest_delivered(
        engine: tuple[Harness, FakeClock]) -> None:
    harness, clock = engine
    broker = _open(harness, flaky=True)
    ids = _burst(broker)
    store = harness.store
    assert store is not None
    batch = store.batch()
    batch.put(timer_cf(0), encode_timer_key(DUE, "t", ids[5]), b"\xc1 garbage")
    store.write(batch)
    _read_ahead(broker, clock)
    clock.set(DUE)
    assert _delivered(broker) == [m for m in ids if m != ids[5]]
    assert [p.msg_id for p in broker.quarantine.messages()] == [ids[5]]


# --- the engine against its model, read-ahead anywhere -----------------------------------------

class PrefetchMachine(EngineMachine):
    """tests/scheduler/test_stateful.py's model, with the read-ahead on: sends due far enough
    for the scanner to read them ahead, and the read-ahead of every shard's next due instant
    called between any two steps (as the scanner would at that instant's lead)."""

    def _open(self) -> Broker:
        broker = Broker(make_config(self.dir, timer_shards=2, scan_batch_size=3,
                                    delivery_batch_max=4, delivery_queue_batches=2,
                                    scan_prefetch_ms=60, scan_prefetch_messages=5),
                        self.clock)
        broker.start()
        return broker

    @rule(topic=st.sampled_from(("a", "b", "c")), msg_id=st.sampled_from(
        tuple(f"m{i}" for i in range(8))), delay=st.sampled_from((25, 40, 60, 100)))
    def send_ahead(self, topic: str, msg_id: str, delay: int) -> None:
        self.send(topic, msg_id, delay)

    @rule()
    def read_ahead(self) -> None:
        for scanner in self.broker.parts.scanners:
            target = scanner.state.wake_at
            if target is not None:
                scanner.prefetch(target)


PrefetchMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestPrefetchStateful = PrefetchMachine.TestCase


def test_large_values_are_read_when_due_not_ahead(engine: tuple[Harness, FakeClock]) -> None:
    """A burst of 16 KiB bodies is not read ahead (it tripled such a drain over HTTP); it
    is delivered at its instant all the same."""
    harness, clock = engine
    broker = _open(harness)
    ids = [f"b{i:03d}" for i in range(20)]
    broker.send_batch([SendRequest(topic="t", body=b"x" * 16384, msg_id=m, deliver_at=DUE)
                       for m in ids])
    state = broker.parts.shards[0]
    with ReadSpy() as spy:
        clock.set(DUE - LEAD // 2)
        deadline = time.monotonic() + WAIT_S
        while spy.keys == 0:  # the read-ahead's first read (under the shard's lock)
            assert time.monotonic() < deadline, "the scanner never looked ahead"
            time.sleep(0.001)
        with state.lock:
            assert state.prefetch is None
    clock.set(DUE - 1)
    assert _delivered(broker) == []
    clock.set(DUE)
    assert _delivered(broker) == ids
