"""Send intake (validation, msgId generation) and the metrics primitives."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.intake import Intake, MessageIdGenerator, topic_shard
from scheduler.levels import DelayLevels
from scheduler.metrics import EngineMetrics, Histogram
from scheduler.model import SendRequest
from storage.constants import DEFAULT_DELAY_LEVELS, MSG_ID_PATTERN
from storage.errors import InvalidArgument, PayloadTooLarge, TopicInvalid
from storage.keys import decode_timer_key

NOW = 1_700_000_000_000


def make_intake() -> Intake:
    return Intake(levels=DelayLevels.parse(DEFAULT_DELAY_LEVELS), max_delay_ms=10**12,
                  max_body_bytes=100, shards=3)


def test_generated_ids_are_unique_valid_and_time_ordered() -> None:
    gen = MessageIdGenerator()
    ids = [gen.next(NOW + i // 10) for i in range(5000)]
    assert len(set(ids)) == len(ids)
    assert all(MSG_ID_PATTERN.match(i) for i in ids)
    assert ids == sorted(ids)  # one generator: time, then counter
    assert [i[:12] for i in ids[::10]] == [f"{NOW + k:012X}" for k in range(500)]
    assert gen.next(NOW)[:12] == f"{NOW:012X}"  # the clock's ms, even going back
    other = MessageIdGenerator()
    assert other.next(NOW) != gen.next(NOW)  # a second generator has its own random part


def test_generated_ids_are_unique_across_threads() -> None:
    gen = MessageIdGenerator()
    out: list[list[str]] = [[] for _ in range(4)]

    def work(slot: list[str]) -> None:
        slot.extend(gen.next(NOW) for _ in range(5000))

    threads = [threading.Thread(target=work, args=(slot,)) for slot in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for slot in out for i in slot]
    assert len(set(every)) == 20_000


def test_prepare_encodes_keys_consistently() -> None:
    intake = make_intake()
    m = intake.prepare(SendRequest(topic="orders", body=b"x", msg_id="m-1", delay_ms=5), NOW)
    assert decode_timer_key(m.timer_key) == (NOW + 5, "orders", "m-1")
    assert m.index_key == b"orders\x00m-1"
    assert m.shard == topic_shard("orders", 3) and not m.generated_id
    assert m.record.born_at == NOW and m.record.deliver_at == NOW + 5
    generated = intake.prepare(SendRequest(topic="orders", body=b"x"), NOW)
    assert generated.generated_id and MSG_ID_PATTERN.match(generated.msg_id)


@pytest.mark.parametrize(("request_kw", "error"), [
    ({"topic": "bad topic"}, TopicInvalid),
    ({"topic": ""}, TopicInvalid),
    ({"topic": "x" * 128}, TopicInvalid),
    ({"topic": "SCHEDULE_TOPIC_XXXX"}, TopicInvalid),
    ({"topic": "rmq_sys_foo"}, TopicInvalid),
    ({"topic": "__internal"}, TopicInvalid),
    ({"msg_id": "has space"}, InvalidArgument),
    ({"msg_id": "x" * 129}, InvalidArgument),
    ({"body": b"x" * 101}, PayloadTooLarge),
    ({"body": "text"}, InvalidArgument),
    ({"tags": 5}, InvalidArgument),
    ({"keys": "k"}, InvalidArgument),
    ({"properties": {"a": 1}}, InvalidArgument),
])
def test_bad_requests(request_kw: dict[str, object], error: type[Exception]) -> None:
    kw: dict[str, object] = {"topic": "t", "body": b"ok"}
    kw.update(request_kw)
    with pytest.raises(error):
        make_intake().prepare(SendRequest(**kw), NOW)  # type: ignore[arg-type]


def test_histogram_buckets_are_cumulative_with_quantiles() -> None:
    h = Histogram("h", "help", (1, 5, 10))
    h.observe_many([0, 1, 2, 5, 6, 50])
    snap = h.snapshot()
    assert snap.buckets == ((1, 2), (5, 4), (10, 5), (float("inf"), 6))
    assert snap.count == 6 and snap.sum == 64
    assert snap.quantile(0.5) == 5
    assert snap.quantile(0.99) == float("inf")
    with pytest.raises(ValueError):
        Histogram("h", "help", (5, 1))


@given(st.lists(st.integers(min_value=-5, max_value=50), max_size=80))
def test_observe_many_counts_as_observing_each(values: list[int]) -> None:
    """Few values are located one by one, more are counted first: the same histogram."""
    one_by_one, together = (Histogram("h", "help", (0, 1, 5, 10, 25)) for _ in range(2))
    for value in values:
        one_by_one.observe(value)
    together.observe_many(values)
    assert together.snapshot() == one_by_one.snapshot()


def test_counters_are_thread_safe_and_labelled() -> None:
    m = EngineMetrics()

    def work() -> None:
        for _ in range(20_000):
            m.delivered.inc()
            m.scheduled_by_level.labels(3).inc()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m.delivered.value == 80_000
    assert m.scheduled_by_level.samples() == [({"level": "3"}, 80_000.0)]
    with pytest.raises(ValueError):
        m.delivered.inc(-1)
    names = [metric.name for metric in m.collect()]
    assert len(names) == len(set(names))
    assert m.as_dict()["delivered_total"] == 80_000
