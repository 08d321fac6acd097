"""Transactions over the real HTTP API (uvicorn on 127.0.0.1, real Broker, FakeClock)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from scheduler.tx_records import new_transaction_id
from tests.support.live import ADMIN, CONSUMER, PRODUCER, T0, Live

from .callback_server import Producer, producer_endpoint

TOPIC = "orders.tx"
CHECKS = "/v1/producer-groups/pg/transaction-checks"


@pytest.fixture
def start(live_factory: Callable[..., Live]) -> Callable[..., Live]:
    """Start a server whose engine takes ``engine`` overrides (e.g. the callback allow-list)."""
    return lambda **engine: live_factory(engine=engine)


def _problem(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == code


def _prepare(client: httpx.Client, msg_id: str, **fields: Any) -> str:
    r = client.post(f"/v1/topics/{TOPIC}/transactions",
                    json={"body": msg_id, "msgId": msg_id, "producerGroup": "pg", **fields})
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "PREPARED" and r.json()["msgId"] == msg_id
    return str(r.json()["transactionId"])


def test_prepare_check_commit_rollback(start: Callable[..., Live]) -> None:
    live = start()
    with live.client(PRODUCER) as producer, live.client(CONSUMER) as consumer:
        paid = _prepare(producer, "paid", checkImmunitySeconds=7, delayMs=1_000)
        unpaid = _prepare(producer, "unpaid")
        assert producer.get(f"/v1/topics/{TOPIC}/messages/paid").json()["status"] == "PREPARED"

        live.advance(6_000)
        [check] = producer.get(CHECKS).json()["checks"]
        assert (check["transactionId"], check["msgId"], check["topic"]) == \
            (unpaid, "unpaid", TOPIC)
        assert check["checkTimes"] == 1 and check["preparedAt"] == T0
        assert check["body"] == "unpaid"
        live.advance(1_000)  # the 7 s immunity of "paid" has passed
        assert [c["msgId"] for c in producer.get(CHECKS, params={"max": 10}).json()["checks"]] \
            == ["paid"]
        assert producer.get(CHECKS).json() == {"checks": []}

        commit_at = live.clock.now_ms()
        r = producer.post(f"/v1/transactions/{paid}/commit")
        assert r.status_code == 200, r.text
        assert r.json() == {"transactionId": paid, "msgId": "paid", "topic": TOPIC,
                            "status": "COMMITTED", "deliverAt": commit_at + 1_000}
        assert producer.post(f"/v1/transactions/{paid}/commit").json() == r.json()
        _problem(producer.post(f"/v1/transactions/{paid}/rollback"), 409, "CONFLICT")

        r = producer.post(f"/v1/transactions/{unpaid}/rollback")
        assert r.status_code == 200 and r.json()["status"] == "ROLLED_BACK"
        assert producer.post(f"/v1/transactions/{unpaid}/rollback").status_code == 200
        _problem(producer.post(f"/v1/transactions/{unpaid}/commit"), 409, "CONFLICT")

        for unknown in (new_transaction_id(T0), "no-such-transaction"):
            _problem(producer.post(f"/v1/transactions/{unknown}/commit"), 404, "NOT_FOUND")
            _problem(producer.post(f"/v1/transactions/{unknown}/rollback"), 404, "NOT_FOUND")
        _problem(consumer.post(f"/v1/transactions/{paid}/commit"), 403, "FORBIDDEN")

        live.advance(999)
        assert consumer.get(f"/v1/topics/{TOPIC}/messages", params={"offset": 0}).json()[
            "messages"] == []
        live.advance(1)
        delivered = consumer.get(f"/v1/topics/{TOPIC}/messages",
                                 params={"offset": 0}).json()["messages"]
        assert [(m["msgId"], m["body"]) for m in delivered] == [("paid", "paid")]
        assert producer.get(f"/v1/topics/{TOPIC}/messages/unpaid").json()["status"] == \
            "ROLLED_BACK"
    with live.client(None) as anonymous:
        metrics = anonymous.get("/metrics").text
    assert "hourglass_transactions_prepared_total 2.0" in metrics
    assert "hourglass_transactions_committed_total 1.0" in metrics
    assert "hourglass_transaction_checks_sent_total 2.0" in metrics


def test_discarded_messages_are_readable_by_an_admin(start: Callable[..., Live]) -> None:
    live = start(transaction_check_max=1)
    with live.client(PRODUCER) as producer, live.client(ADMIN) as admin, \
            live.client(CONSUMER) as consumer:
        tx = _prepare(producer, "stuck", properties={"k": "v"})
        live.advance(6_000)
        assert len(producer.get(CHECKS).json()["checks"]) == 1
        live.advance(30_000)
        assert producer.get(CHECKS).json() == {"checks": []}  # discarded instead
        assert producer.get(f"/v1/topics/{TOPIC}/messages/stuck").json()["status"] == \
            "DISCARDED"
        _problem(producer.post(f"/v1/transactions/{tx}/commit"), 409, "CONFLICT")
        live.advance(1)
        r = admin.get("/v1/topics/TRANS_CHECK_MAX_TIME_TOPIC/messages", params={"offset": 0})
        assert r.status_code == 200, r.text
        [message] = r.json()["messages"]
        assert message["msgId"] == tx and message["body"] == "stuck"
        assert message["properties"]["REAL_TOPIC"] == TOPIC
        assert message["properties"]["k"] == "v"
        forbidden = consumer.get("/v1/topics/TRANS_CHECK_MAX_TIME_TOPIC/messages",
                                 params={"offset": 0})
        _problem(forbidden, 403, "FORBIDDEN")
        assert consumer.get(f"/v1/topics/{TOPIC}/messages", params={"offset": 0}).json()[
            "messages"] == []


def test_check_callback_routes_and_a_callback_commit(start: Callable[..., Live]) -> None:
    live = start(transaction_callback_allowed_hosts=("127.0.0.1:*",))
    path = "/v1/producer-groups/pg/check-callback"
    producer_app = Producer(default="COMMIT")
    with live.client(PRODUCER) as producer, live.client(ADMIN) as admin, \
            producer_endpoint(producer_app) as url:
        _problem(producer.put(path, json={"url": url}), 403, "FORBIDDEN")
        _problem(admin.put(path, json={"url": "http://192.0.2.1/x"}), 400, "INVALID_ARGUMENT")
        _problem(admin.put(path, json={"url": url, "extra": 1}), 400, "INVALID_ARGUMENT")
        _problem(admin.put(path, content=b"{"), 400, "INVALID_ARGUMENT")
        _problem(admin.get(path), 404, "NOT_FOUND")
        r = admin.put(path, json={"url": url, "secret": "0123456789abcdef"})
        assert r.status_code == 200, r.text
        assert r.json() == {"producerGroup": "pg", "url": url, "hasSecret": True,
                            "registeredAt": T0}
        assert admin.get(path).json() == r.json()

        _prepare(producer, "by-callback")
        live.fake_clock.advance(6_000)
        live.broker.transactions.dispatcher.join()
        assert [p["msgId"] for p in producer_app.received] == ["by-callback"]
        assert "x-hourglass-signature" in producer_app.headers[0]
        live.broker.drain()
        assert producer.get(f"/v1/topics/{TOPIC}/messages/by-callback").json()["status"] == \
            "DELIVERED"

        assert admin.delete(path).status_code == 200
        _problem(admin.get(path), 404, "NOT_FOUND")
        _problem(admin.delete(path), 404, "NOT_FOUND")
        spec = admin.get("/openapi.json").json()
    operations = {op["operationId"] for item in spec["paths"].values() for op in item.values()}
    assert {"setCheckCallback", "getCheckCallback", "deleteCheckCallback"} <= operations


@pytest.mark.parametrize(("immunity", "first_check_after_ms"), [
    ("1", 6_000), ("7", 7_000), ("-1", 6_000), ("100.5", 6_000), (-1, 6_000), (7, 7_000),
])
def test_check_immunity_as_rocketmq_sends_it(start: Callable[..., Live], immunity: Any,
                                             first_check_after_ms: int) -> None:
    """RocketMQ's CHECK_IMMUNITY_TIME_IN_SECONDS is a string: any value is accepted and
    parsed as RocketMQ does (a whole number of seconds, at least the 6 s timeout)."""
    live = start()
    with live.client(PRODUCER) as producer:
        _prepare(producer, "m", checkImmunitySeconds=immunity)
        live.advance(first_check_after_ms - 1)
        assert producer.get(CHECKS).json() == {"checks": []}
        live.advance(1)
        assert [c["msgId"] for c in producer.get(CHECKS).json()["checks"]] == ["m"]


def test_a_repeated_prepare_answers_200_with_the_first_transaction(
    start: Callable[..., Live],
) -> None:
    live = start()
    with live.client(PRODUCER) as producer:
        first = _prepare(producer, "again")
        r = producer.post(f"/v1/topics/{TOPIC}/transactions",
                          json={"body": "again", "msgId": "again", "producerGroup": "pg"})
        assert r.status_code == 200, r.text
        assert r.json()["transactionId"] == first and r.json()["duplicate"] is True
