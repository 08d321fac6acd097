"""Half messages on the real engine: prepare, commit, rollback, check-back by polling, discard.

Real RocksDB and CommitLog under tmp_path; a FakeClock drives every due time."""

from __future__ import annotations

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from scheduler.tx_records import is_transaction_id, new_transaction_id
from storage.constants import TOPIC_TRANS_CHECK_MAX_TIME
from storage.errors import Conflict, InvalidArgument, NotFound, TopicInvalid
from storage.records import MessageStatus
from tests.support.engine import START_MS, Harness, read_topic

from .conftest import prepare

INTERVAL = 30_000


def _ids(broker: Broker, topic: str) -> list[str]:
    return [m.msg_id for m in read_topic(broker, topic)]


def test_prepare_is_invisible_until_commit(broker: Broker, clock: FakeClock) -> None:
    result = prepare(broker, "m1", body=b"payload")
    assert result.status == "PREPARED" and result.msg_id == "m1" and result.topic == "orders"
    assert is_transaction_id(result.transaction_id) and result.deliver_at is None
    info = broker.status("orders", "m1")
    assert info.status is MessageStatus.PREPARED
    clock.advance(3_600_000)
    broker.drain()
    assert _ids(broker, "orders") == []
    assert broker.stats().transactions_prepared == 1
    assert broker.stats().pending == 0  # not a scheduled message

    committed = broker.transactions.commit(result.transaction_id)
    assert committed.status == "COMMITTED" and committed.deliver_at == clock.now_ms()
    delivered = read_topic(broker, "orders")  # no timing: delivered at once, synchronously
    assert [(m.msg_id, m.body) for m in delivered] == [("m1", b"payload")]
    assert delivered[0].born_at == START_MS  # born when prepared
    assert broker.status("orders", "m1").status is MessageStatus.DELIVERED
    assert broker.stats().transactions_prepared == 0


def test_transaction_ids_are_unique(broker: Broker) -> None:
    ids = {prepare(broker, f"m{i}").transaction_id for i in range(200)}
    assert len(ids) == 200


def test_a_committed_delayed_message_is_delivered_at_its_time_and_not_before(
        broker: Broker, clock: FakeClock) -> None:
    deliver_at = START_MS + 10_000
    tx = prepare(broker, "later", deliver_at=deliver_at)
    clock.advance(1_000)
    committed = broker.transactions.commit(tx.transaction_id)
    assert committed.deliver_at == deliver_at
    assert broker.status("orders", "later").status is MessageStatus.SCHEDULED
    clock.set(deliver_at - 1)
    broker.drain()
    assert _ids(broker, "orders") == []
    clock.set(deliver_at)
    broker.drain()
    delivered = read_topic(broker, "orders")
    assert [m.msg_id for m in delivered] == ["later"]
    assert delivered[0].stored_at >= deliver_at
    clock.advance(INTERVAL * 20)  # no check-back, no second delivery
    broker.drain()
    assert _ids(broker, "orders") == ["later"]
    assert broker.transactions.poll_checks("pg", 10) == []


def test_relative_delays_count_from_the_commit(broker: Broker, clock: FakeClock) -> None:
    """RocketMQ resolves a delay when it stores the committed message; so does hourglass."""
    by_ms = prepare(broker, "by-ms", delay_ms=5_000)
    by_level = prepare(broker, "by-level", delay_level=3)  # 10 s
    by_prop = broker.transactions.prepare(
        SendRequest(topic="orders", body=b"p", msg_id="by-prop",
                    properties={"TIMER_DELAY_SEC": "2"}), producer_group="pg")
    clock.advance(3_000)
    commit_at = clock.now_ms()
    assert broker.transactions.commit(by_ms.transaction_id).deliver_at == commit_at + 5_000
    assert broker.transactions.commit(by_level.transaction_id).deliver_at == commit_at + 10_000
    assert broker.transactions.commit(by_prop.transaction_id).deliver_at == commit_at + 2_000
    clock.set(commit_at + 4_999)
    broker.drain()
    assert _ids(broker, "orders") == ["by-prop"]
    clock.set(commit_at + 10_000)
    broker.drain()
    assert _ids(broker, "orders") == ["by-prop", "by-ms", "by-level"]


def test_a_past_deliver_at_is_delivered_at_commit(broker: Broker, clock: FakeClock) -> None:
    tx = prepare(broker, "past", deliver_at=START_MS + 1_000)
    clock.advance(5_000)
    assert broker.transactions.commit(tx.transaction_id).deliver_at == START_MS + 1_000
    assert _ids(broker, "orders") == ["past"]


def test_a_rolled_back_message_is_never_delivered(broker: Broker, clock: FakeClock) -> None:
    tx = prepare(broker, "gone", delay_ms=100)
    rolled = broker.transactions.rollback(tx.transaction_id)
    assert rolled.status == "ROLLED_BACK"
    assert broker.status("orders", "gone").status is MessageStatus.ROLLED_BACK
    clock.advance(INTERVAL * 40)
    broker.drain()
    assert _ids(broker, "orders") == []
    assert broker.transactions.poll_checks("pg", 100) == []
    assert broker.transactions.rollback(tx.transaction_id).status == "ROLLED_BACK"  # idempotent
    with pytest.raises(Conflict):
        broker.transactions.commit(tx.transaction_id)
    assert broker.metrics.tx_rolled_back.value == 1


def test_commit_is_idempotent_and_rollback_after_commit_conflicts(
        broker: Broker, clock: FakeClock) -> None:
    tx = prepare(broker, "once", delay_ms=1_000)
    first = broker.transactions.commit(tx.transaction_id)
    clock.advance(500)
    again = broker.transactions.commit(tx.transaction_id)
    assert again == first
    with pytest.raises(Conflict):
        broker.transactions.rollback(tx.transaction_id)
    clock.advance(1_000)
    broker.drain()
    assert broker.transactions.commit(tx.transaction_id) == first  # also after delivery
    assert _ids(broker, "orders") == ["once"]
    assert broker.metrics.tx_committed.value == 1
    assert broker.transactions.get(tx.transaction_id).status == "COMMITTED"


def test_unknown_transactions_are_not_found(broker: Broker) -> None:
    for tx_id in (new_transaction_id(START_MS), "not-a-transaction", ""):
        with pytest.raises(NotFound):
            broker.transactions.commit(tx_id)
        with pytest.raises(NotFound):
            broker.transactions.rollback(tx_id)
        with pytest.raises(NotFound):
            broker.transactions.get(tx_id)


def test_prepare_validates_like_a_send_and_stores_nothing_on_bad_input(broker: Broker) -> None:
    bad = [
        (SendRequest(topic=TOPIC_TRANS_CHECK_MAX_TIME, body=b"x"), "pg", TopicInvalid),
        (SendRequest(topic="bad topic", body=b"x"), "pg", TopicInvalid),
        (SendRequest(topic="t", body=b"x", delay_level=0), "pg", InvalidArgument),
        (SendRequest(topic="t", body=b"x", delay_ms=-1), "pg", InvalidArgument),
        (SendRequest(topic="t", body=b"x", msg_id="bad id"), "pg", InvalidArgument),
        (SendRequest(topic="t", body=b"x"), "bad group", InvalidArgument),
        (SendRequest(topic="t", body=b"x"), "", InvalidArgument),
    ]
    for request, group, error in bad:
        with pytest.raises(error):
            broker.transactions.prepare(request, producer_group=group)
    assert broker.metrics.tx_prepared.value == 0
    assert broker.stats().transactions_prepared == 0


def test_a_resent_prepare_answers_the_first_transaction(broker: Broker) -> None:
    first = prepare(broker, "dup")
    again = prepare(broker, "dup")
    assert again.duplicate and again.transaction_id == first.transaction_id
    with pytest.raises(Conflict):  # another producer group cannot take the msgId
        prepare(broker, "dup", group="other")
    with pytest.raises(Conflict):  # nor can a non-transactional send
        broker.send(SendRequest(topic="orders", body=b"x", msg_id="dup"))
    broker.send(SendRequest(topic="orders", body=b"x", msg_id="plain", delay_ms=10))
    with pytest.raises(Conflict):  # nor can a prepare take a non-transactional message's msgId
        prepare(broker, "plain")
    assert broker.metrics.tx_prepared.value == 1


def test_a_prepared_message_cannot_be_cancelled(broker: Broker) -> None:
    prepare(broker, "m")
    with pytest.raises(Conflict):
        broker.cancel("orders", "m")


@pytest.mark.parametrize(("immunity", "first_check_ms"), [
    ("1", 6_000), ("7", 7_000), ("-1", 6_000), ("100.5", 6_000), (None, 6_000), (7, 7_000),
])
def test_checks_start_only_after_the_immunity(
        broker: Broker, clock: FakeClock, immunity: str | int | None,
        first_check_ms: int) -> None:
    tx = prepare(broker, "m", immunity=immunity)
    clock.set(START_MS + first_check_ms - 1)
    assert broker.transactions.poll_checks("pg", 10) == []
    clock.set(START_MS + first_check_ms)
    [check] = broker.transactions.poll_checks("pg", 10)
    assert check.transaction_id == tx.transaction_id and check.check_times == 1
    assert check.prepared_at == START_MS and check.body == b"m" and check.topic == "orders"


def test_the_immunity_property_is_honoured(broker: Broker, clock: FakeClock) -> None:
    broker.transactions.prepare(
        SendRequest(topic="orders", body=b"x", msg_id="p",
                    properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "9"}), producer_group="pg")
    clock.set(START_MS + 8_999)
    assert broker.transactions.poll_checks("pg", 10) == []
    clock.set(START_MS + 9_000)
    assert len(broker.transactions.poll_checks("pg", 10)) == 1


def test_check_count_grows_and_stops_at_the_maximum_with_discard(
        broker: Broker, clock: FakeClock) -> None:
    tx = prepare(broker, "stuck", body=b"stuck body", delay_ms=1)
    clock.advance(6_000)
    for n in range(1, 16):
        [check] = broker.transactions.poll_checks("pg", 10)
        assert check.check_times == n
        assert broker.transactions.poll_checks("pg", 10) == []  # counted: not again at once
        clock.advance(INTERVAL - 1)
        assert broker.transactions.poll_checks("pg", 10) == []  # the next is one interval on
        clock.advance(1)
    assert broker.transactions.poll_checks("pg", 10) == []  # the 16th: discarded instead
    assert broker.status("orders", "stuck").status is MessageStatus.DISCARDED
    assert broker.transactions.get(tx.transaction_id).status == "DISCARDED"
    for action in (broker.transactions.commit, broker.transactions.rollback):
        with pytest.raises(Conflict):
            action(tx.transaction_id)
    clock.advance(INTERVAL * 10)
    broker.drain()
    assert _ids(broker, "orders") == []
    [discarded] = read_topic(broker, TOPIC_TRANS_CHECK_MAX_TIME)
    assert discarded.msg_id == tx.transaction_id and discarded.body == b"stuck body"
    assert discarded.properties["REAL_TOPIC"] == "orders"
    assert discarded.properties["UNIQ_KEY"] == "stuck"
    assert discarded.properties["PGROUP"] == "pg"
    assert discarded.properties["TRANSACTION_CHECK_TIMES"] == "15"
    m = broker.metrics
    assert (m.tx_checks_sent.value, m.tx_discarded.value, m.tx_prepared_pending.value) == \
        (15, 1, 0)


def test_the_check_settings_are_configurable(harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(transaction_timeout_ms=1_000, transaction_check_interval_ms=5_000,
                          transaction_check_max=2)
    prepare(broker, "m")
    clock.advance(1_000)
    assert [c.check_times for c in broker.transactions.poll_checks("pg", 5)] == [1]
    clock.advance(5_000)
    assert [c.check_times for c in broker.transactions.poll_checks("pg", 5)] == [2]
    clock.advance(5_000)
    assert broker.transactions.poll_checks("pg", 5) == []
    assert broker.status("orders", "m").status is MessageStatus.DISCARDED


def test_polls_are_per_group_oldest_first_and_bounded(broker: Broker, clock: FakeClock) -> None:
    for i in range(5):
        prepare(broker, f"a{i}", group="A")
        clock.advance(1)
    prepare(broker, "b0", group="B")
    clock.advance(6_000)
    assert [c.msg_id for c in broker.transactions.poll_checks("A", 3)] == ["a0", "a1", "a2"]
    assert [c.msg_id for c in broker.transactions.poll_checks("A", 3)] == ["a3", "a4"]
    assert broker.transactions.poll_checks("A", 3) == []
    assert [(c.msg_id, c.producer_group) for c in broker.transactions.poll_checks("B", 3)] == \
        [("b0", "B")]
    assert broker.transactions.poll_checks("C", 3) == []
    for bad in (0, 1001, -1):
        with pytest.raises(InvalidArgument):
            broker.transactions.poll_checks("A", bad)
    with pytest.raises(InvalidArgument):
        broker.transactions.poll_checks("no spaces", 1)


def test_a_prepare_earlier_than_the_poll_floor_is_still_found(
        broker: Broker, clock: FakeClock) -> None:
    """A poll remembers where the group's due keys start; a later prepare with a shorter
    immunity lands before the previous keys and must not be skipped."""
    prepare(broker, "long", immunity="60")
    clock.advance(10_000)
    assert broker.transactions.poll_checks("pg", 10) == []  # nothing due: floor moves to now
    prepare(broker, "short")  # due at now + 6 s, before "long"
    clock.advance(6_000)
    assert [c.msg_id for c in broker.transactions.poll_checks("pg", 10)] == ["short"]
    clock.advance(44_000)  # "long" is due; the group polled within two check intervals
    assert [c.msg_id for c in broker.transactions.poll_checks("pg", 10)] == ["short", "long"]


def test_a_commit_after_checks_delivers_once(broker: Broker, clock: FakeClock) -> None:
    tx = prepare(broker, "m")
    clock.advance(6_000)
    [check] = broker.transactions.poll_checks("pg", 10)
    broker.transactions.commit(check.transaction_id)
    clock.advance(INTERVAL)
    assert broker.transactions.poll_checks("pg", 10) == []
    assert _ids(broker, "orders") == ["m"]
    assert broker.transactions.get(tx.transaction_id).status == "COMMITTED"


def test_everything_survives_a_restart(harness: Harness, clock: FakeClock) -> None:
    broker = harness.open()
    prepared = prepare(broker, "stays-prepared")
    committed = prepare(broker, "committed-later", deliver_at=START_MS + 20_000)
    rolled = prepare(broker, "rolled-back")
    now_tx = prepare(broker, "committed-now")
    clock.advance(6_000)
    assert len(broker.transactions.poll_checks("pg", 10)) == 4  # checkTimes 1 each
    broker.transactions.commit(committed.transaction_id)
    broker.transactions.rollback(rolled.transaction_id)
    broker.transactions.commit(now_tx.transaction_id)
    broker.close()

    broker = harness.open()
    assert broker.stats().transactions_prepared == 1
    states = {tx.msg_id: broker.transactions.get(tx.transaction_id).status
              for tx in (prepared, committed, rolled, now_tx)}
    assert states == {"stays-prepared": "PREPARED", "committed-later": "COMMITTED",
                      "rolled-back": "ROLLED_BACK", "committed-now": "COMMITTED"}
    assert broker.status("orders", "stays-prepared").status is MessageStatus.PREPARED
    assert broker.status("orders", "rolled-back").status is MessageStatus.ROLLED_BACK
    assert _ids(broker, "orders") == ["committed-now"]
    clock.set(START_MS + 20_000)
    broker.drain()
    assert _ids(broker, "orders") == ["committed-now", "committed-later"]
    clock.advance(INTERVAL)
    [check] = broker.transactions.poll_checks("pg", 10)  # the count survived too
    assert (check.msg_id, check.check_times) == ("stays-prepared", 2)
    broker.transactions.commit(prepared.transaction_id)
    assert _ids(broker, "orders") == ["committed-now", "committed-later", "stays-prepared"]


def test_finished_transactions_expire_after_the_retention(
        harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(retention_ms=60_000)
    rolled = prepare(broker, "r")
    committed = prepare(broker, "c")
    broker.transactions.rollback(rolled.transaction_id)
    broker.transactions.commit(committed.transaction_id)
    open_tx = prepare(broker, "p")
    clock.advance(59_999)
    assert broker.transactions.get(rolled.transaction_id).status == "ROLLED_BACK"

    def expired(tx_id: str) -> bool:
        try:
            broker.transactions.get(tx_id)
        except NotFound:
            return True
        return False

    from tests.support.engine import advance_until
    advance_until(clock, lambda: expired(rolled.transaction_id)
                  and expired(committed.transaction_id), step=1)
    assert broker.transactions.get(open_tx.transaction_id).status == "PREPARED"
    with pytest.raises(NotFound):
        broker.status("orders", "r")
