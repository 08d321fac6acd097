"""Check-back by callback: the engine POSTs due checks to a real local HTTP server and applies
the answers (COMMIT, ROLLBACK, UNKNOWN; a timeout or an error is UNKNOWN)."""

from __future__ import annotations

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from storage.constants import TOPIC_TRANS_CHECK_MAX_TIME
from storage.errors import InvalidArgument, NotFound
from storage.records import MessageStatus
from tests.support.engine import Harness, read_topic

from .callback_server import Producer, producer_endpoint
from .conftest import prepare

INTERVAL = 30_000


def _settle(broker: Broker) -> None:
    """Wait (in real time) until the dispatcher has posted every check due at the fake
    clock's time and applied the answers."""
    broker.transactions.dispatcher.join(timeout_s=30)


def test_answers_are_applied(broker: Broker, clock: FakeClock) -> None:
    producer = Producer()
    with producer_endpoint(producer) as url:
        reg = broker.transactions.register_callback("pg", url)
        assert reg.url == url and broker.transactions.callbacks.get("pg") == reg
        txs = {name: prepare(broker, name).transaction_id
               for name in ("commit", "rollback", "unknown", "slow", "error")}
        producer.answers.update({txs["commit"]: "COMMIT", txs["rollback"]: "ROLLBACK",
                                 txs["unknown"]: "UNKNOWN", txs["slow"]: "SLOW",
                                 txs["error"]: "HTTP500"})
        clock.advance(5_999)
        _settle(broker)
        assert producer.received == []  # immunity first
        clock.advance(1)
        _settle(broker)
        assert sorted(r["msgId"] for r in producer.received) == sorted(txs)
        first = next(r for r in producer.received if r["msgId"] == "commit")
        assert first["transactionId"] == txs["commit"] and first["checkTimes"] == 1
        assert first["topic"] == "orders" and first["producerGroup"] == "pg"
        assert first["body"] == "commit" and first["bodyBase64"] == "Y29tbWl0"

        status = {name: broker.transactions.get(tx).status for name, tx in txs.items()}
        assert status == {"commit": "COMMITTED", "rollback": "ROLLED_BACK",
                          "unknown": "PREPARED", "slow": "PREPARED", "error": "PREPARED"}
        assert [m.msg_id for m in read_topic(broker, "orders")] == ["commit"]
        answers = broker.metrics.tx_check_answers
        assert {k: answers.labels(k).value for k in ("COMMIT", "ROLLBACK", "UNKNOWN")} == \
            {"COMMIT": 1, "ROLLBACK": 1, "UNKNOWN": 3}

        # unknown, timed out and failed ones are asked again one interval later, and only they
        producer.answers[txs["slow"]] = "COMMIT"
        clock.advance(INTERVAL)
        _settle(broker)
        assert {name: producer.seen(tx) for name, tx in txs.items()} == \
            {"commit": 1, "rollback": 1, "unknown": 2, "slow": 2, "error": 2}
        assert broker.transactions.get(txs["slow"]).status == "COMMITTED"
        assert broker.metrics.tx_checks_sent.value == 8
    assert sorted(m.msg_id for m in read_topic(broker, "orders")) == ["commit", "slow"]


def test_unanswered_checks_end_in_a_discard(harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(transaction_callback_allowed_hosts=("127.0.0.1:*",),
                          transaction_check_max=3)
    producer = Producer(default="UNKNOWN")
    with producer_endpoint(producer) as url:
        broker.transactions.register_callback("pg", url)
        tx = prepare(broker, "never")
        clock.advance(6_000)
        for _ in range(4):
            _settle(broker)
            clock.advance(INTERVAL)
        _settle(broker)
    assert [r["checkTimes"] for r in producer.received] == [1, 2, 3]
    assert broker.status("orders", "never").status is MessageStatus.DISCARDED
    broker.drain()
    assert [m.msg_id for m in read_topic(broker, TOPIC_TRANS_CHECK_MAX_TIME)] == \
        [tx.transaction_id]


def test_only_registered_groups_get_callbacks(broker: Broker, clock: FakeClock) -> None:
    producer = Producer(default="COMMIT")
    with producer_endpoint(producer) as url:
        broker.transactions.register_callback("with-url", url)
        prepare(broker, "a", group="with-url")
        polled = prepare(broker, "b", group="polling")
        clock.advance(6_000)
        _settle(broker)
        assert [r["msgId"] for r in producer.received] == ["a"]
        [check] = broker.transactions.poll_checks("polling", 10)  # untouched by the dispatcher
        assert check.transaction_id == polled.transaction_id and check.check_times == 1

        broker.transactions.callbacks.delete("with-url")
        prepare(broker, "c", group="with-url")
        clock.advance(6_000)
        _settle(broker)
        assert [r["msgId"] for r in producer.received] == ["a"]
        assert [c.msg_id for c in broker.transactions.poll_checks("with-url", 10)] == ["c"]
    with pytest.raises(NotFound):
        broker.transactions.callbacks.get("with-url")


def test_registration_is_admin_configured_and_persistent(
        harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(transaction_callback_allowed_hosts=("127.0.0.1:*",))
    with pytest.raises(InvalidArgument, match="allow-list"):
        broker.transactions.register_callback("pg", "http://10.0.0.1/check")
    broker.transactions.register_callback("pg", "http://127.0.0.1:1/check")
    broker.close()
    broker = harness.open(transaction_callback_allowed_hosts=("127.0.0.1:*",))
    assert broker.transactions.callbacks.get("pg").url == "http://127.0.0.1:1/check"
    broker.close()
    # the allow-list shrank: the registration is kept (and shown) but never called
    broker = harness.open()
    producer = Producer(default="COMMIT")
    with producer_endpoint(producer) as url:
        with pytest.raises(InvalidArgument, match="disabled"):
            broker.transactions.register_callback("pg", url)
        assert broker.transactions.callbacks.get("pg").url == "http://127.0.0.1:1/check"
        prepare(broker, "m")
        clock.advance(6_000)
        _settle(broker)
        assert [c.msg_id for c in broker.transactions.poll_checks("pg", 10)] == ["m"]
