"""Truthful cancel: CANCELLED means never delivered, ALREADY_DELIVERED means in the log."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.delivery import INLINE_MAX
from scheduler.model import SendRequest
from storage.errors import AlreadyDelivered, InvalidArgument, NotFound
from storage.keys import encode_handle
from storage.records import MessageStatus
from tests.support.engine import START_MS, Harness, advance_until, read_topic, run_threads


def test_cancel_before_at_and_after_the_due_time(broker: Broker, clock: FakeClock) -> None:
    a = broker.send(SendRequest(topic="t", body=b"a", msg_id="a", delay_ms=100))
    b = broker.send(SendRequest(topic="t", body=b"b", msg_id="b", delay_ms=100))
    c = broker.send(SendRequest(topic="t", body=b"c", msg_id="c", delay_ms=100))
    # before: by handle
    assert broker.cancel_by_handle(a.cancel_handle).status is MessageStatus.CANCELLED
    # at the due time, before the scanner ran (the clock is at deliverAt, nothing drained):
    # the scanners wait at a gate until the cancel is answered (else they may win the race,
    # which is a legitimate ALREADY_DELIVERED, not the case this line is about)
    gate = threading.Event()
    for scanner in broker.parts.scanners:
        scan = scanner.step

        def gated(scan: Callable[[], bool | None] = scan) -> bool | None:
            gate.wait(30)
            return scan()

        scanner.step = gated  # type: ignore[method-assign]
    clock.advance(100)
    assert broker.cancel("t", "b").status is MessageStatus.CANCELLED
    gate.set()
    broker.drain()
    # after delivery
    with pytest.raises(AlreadyDelivered):
        broker.cancel_by_handle(c.cancel_handle)
    with pytest.raises(AlreadyDelivered):
        broker.cancel("t", "c")
    assert [m.msg_id for m in read_topic(broker, "t")] == ["c"]
    assert broker.status("t", "a").status is MessageStatus.CANCELLED
    assert broker.status("t", "b").status is MessageStatus.CANCELLED
    assert broker.status("t", "c").status is MessageStatus.DELIVERED
    # idempotent: a second cancel answers CANCELLED again and counts once
    assert broker.cancel("t", "a").status is MessageStatus.CANCELLED
    assert broker.cancel_by_handle(b.cancel_handle).status is MessageStatus.CANCELLED
    assert broker.metrics.cancelled.value == 2
    assert broker.stats().pending == 0
    clock.advance(1000)
    broker.drain()
    assert [m.msg_id for m in read_topic(broker, "t")] == ["c"]


def test_unknown_messages_and_handles_are_not_found(broker: Broker) -> None:
    with pytest.raises(NotFound):
        broker.cancel("t", "nope")
    with pytest.raises(NotFound):
        broker.cancel_by_handle("not-a-handle!")
    with pytest.raises(NotFound):
        broker.cancel_by_handle(encode_handle(START_MS + 5, "t", "nope"))
    r = broker.send(SendRequest(topic="t", body=b"x", msg_id="m", delay_ms=50))
    # a well-formed handle naming another deliver time is not this message's handle
    with pytest.raises(NotFound):
        broker.cancel_by_handle(encode_handle(r.deliver_at + 1, "t", "m"))
    with pytest.raises(InvalidArgument):
        broker.cancel("t", "bad id")
    assert broker.status("t", "m").status is MessageStatus.SCHEDULED


def test_cancel_of_a_message_already_queued_for_delivery(harness: Harness,
                                                         clock: FakeClock) -> None:
    """The scanner has handed the batch on, the delivery keeps failing; a cancel now must
    win, and the retried batch must leave the cancelled message out."""
    broker = harness.open(flaky=True)
    assert harness.log is not None
    for i in range(10):
        broker.send(SendRequest(topic="t", body=b"x", msg_id=f"m{i}", delay_ms=10))
    harness.log.fail_appends = 1_000_000
    clock.advance(10)
    advance_until(clock, lambda: broker.metrics.retries.value >= 2)  # queued, failing
    assert not broker.ready
    assert broker.cancel("t", "m3").status is MessageStatus.CANCELLED
    assert broker.cancel("t", "m7").status is MessageStatus.CANCELLED
    harness.log.fail_appends = 0
    advance_until(clock, lambda: broker.ready)
    broker.drain()
    got = [m.msg_id for m in read_topic(broker, "t")]
    assert sorted(got) == sorted(f"m{i}" for i in range(10) if i not in (3, 7))
    assert broker.stats().pending == 0


@pytest.mark.slow
@pytest.mark.parametrize(("count", "scan_batch", "iterations"), [
    (120, 16, 40),  # small batches: committed inline by the scanner when delivery is idle
    (900, 300, 12),  # batches above INLINE_MAX: through the queue (the skip-set window)
])
def test_cancels_racing_delivery_from_many_threads(
        harness: Harness, clock: FakeClock, count: int, scan_batch: int, iterations: int) -> None:
    """Many iterations: messages fall due while 4 threads cancel them. Every answer must be
    the truth: CANCELLED -> never in the log, ALREADY_DELIVERED -> in the log once."""
    assert (scan_batch > INLINE_MAX) == (count > 120)
    broker = harness.open(scan_batch_size=scan_batch, delivery_batch_max=2 * scan_batch,
                          delivery_queue_batches=4)
    rng = random.Random(7)
    for iteration in range(iterations):
        topic = f"race{iteration}"
        due = clock.now_ms() + 5
        broker.send_batch([SendRequest(topic=topic, body=b"x", msg_id=f"m{i}", deliver_at=due)
                           for i in range(count)])
        order = list(range(count))
        rng.shuffle(order)
        answers: dict[str, str] = {}
        lock = threading.Lock()

        def canceller(part: list[int], topic: str = topic,
                      answers: dict[str, str] = answers, lock: threading.Lock = lock) -> None:
            for i in part:
                try:
                    broker.cancel(topic, f"m{i}")
                    answer = "CANCELLED"
                except AlreadyDelivered:
                    answer = "DELIVERED"
                with lock:
                    answers[f"m{i}"] = answer

        def advance() -> None:
            clock.advance(5)

        run_threads([advance, *(lambda p=order[k::4]: canceller(p) for k in range(4))])
        broker.drain()
        in_log = [m.msg_id for m in read_topic(broker, topic)]
        assert len(in_log) == len(set(in_log)), "a message was delivered twice"
        delivered = set(in_log)
        for msg_id, answer in answers.items():
            status = broker.status(topic, msg_id).status
            if answer == "CANCELLED":
                assert msg_id not in delivered and status is MessageStatus.CANCELLED
            else:
                assert msg_id in delivered and status is MessageStatus.DELIVERED
        assert len(answers) == count
    assert broker.stats().pending == 0
