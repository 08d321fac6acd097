"""Security and robustness over real HTTP: tenant isolation, whole-string names,
bounded inputs and answers. Each test here failed on the code before the fix."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from api.auth import Role, TokenSpec
from tests.support.live import (
    ADMIN,
    CONSUMER,
    PRODUCER,
    PRODUCER_ALL,
    TOKENS,
    Live,
)

BILLING = "producer-billing-0123456789"  # producer, topics billing.* only: another tenant
TENANT_TOKENS = (*TOKENS, TokenSpec(token=BILLING, role=Role.PRODUCER, topics=("billing.*",),
                                    name="billing"))


@pytest.fixture
def start(live_factory: Callable[..., Live]) -> Callable[..., Live]:
    """Servers with one more tenant's token, and ``engine`` settings overridden."""
    return lambda **engine: live_factory(tokens=TENANT_TOKENS, engine=engine)


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    doc: dict[str, Any] = response.json()
    assert doc["code"] == code, doc
    return doc


def prepare(client: httpx.Client, topic: str, msg_id: str, group: str = "pg",
            body: str | None = None) -> str:
    r = client.post(f"/v1/topics/{topic}/transactions",
                    json={"body": body if body is not None else msg_id, "msgId": msg_id,
                          "producerGroup": group})
    assert r.status_code == 201, r.text
    return str(r.json()["transactionId"])


# --- tenant isolation ---------------------------------------------------------------------
def test_commit_and_rollback_of_another_tenants_transaction_are_404(
        start: Callable[..., Live]) -> None:
    live = start()
    with live.client(PRODUCER) as orders, live.client(BILLING) as billing:
        tx = prepare(orders, "orders.a", "m1")
        unknown = problem(billing.post("/v1/transactions/01ARZ3NDEKTSV4RRFFQ69G5FAV/commit"),
                          404, "NOT_FOUND")
        for action in ("commit", "rollback"):
            doc = problem(billing.post(f"/v1/transactions/{tx}/{action}"), 404, "NOT_FOUND")
            assert "orders" not in doc["detail"]
            assert doc["title"] == unknown["title"]
        # nothing changed: the owner still decides
        status = orders.get("/v1/topics/orders.a/messages/m1").json()["status"]
        assert status == "PREPARED"
        r = orders.post(f"/v1/transactions/{tx}/commit")
        assert r.status_code == 200 and r.json()["status"] == "COMMITTED", r.text
        # a producer of every topic and the admin may settle anything
        tx2 = prepare(orders, "orders.a", "m2")
        with live.client(PRODUCER_ALL) as anyone:
            assert anyone.post(f"/v1/transactions/{tx2}/rollback").status_code == 200


def test_check_back_poll_hands_out_only_checks_of_the_callers_topics(
        start: Callable[..., Live]) -> None:
    live = start()
    checks = "/v1/producer-groups/shared/transaction-checks"
    with live.client(PRODUCER) as orders, live.client(BILLING) as billing:
        prepare(orders, "orders.a", "o1", group="shared", body="secret order")
        prepare(billing, "billing.a", "b1", group="shared")
        prepare(orders, "orders.a", "o2", group="shared")
        live.advance(6_000)  # past the immunity
        got = billing.get(checks, params={"max": 10}).json()["checks"]
        assert [(c["topic"], c["msgId"]) for c in got] == [("billing.a", "b1")]
        # the orders checks were not counted by billing's poll: orders gets them, checkTimes 1
        got = orders.get(checks, params={"max": 10}).json()["checks"]
        assert [(c["msgId"], c["checkTimes"]) for c in got] == [("o1", 1), ("o2", 1)]
        # polling many times cannot push another tenant's message to DISCARDED
        for _ in range(20):
            live.advance(30_000)
            assert all(c["topic"] == "billing.a"
                       for c in billing.get(checks, params={"max": 10}).json()["checks"])
        assert orders.get("/v1/topics/orders.a/messages/o1").json()["status"] == "PREPARED"


def test_group_offsets_need_the_consumer_role_on_the_topic(live: Live) -> None:
    path = "/v1/topics/orders.a/groups/g1/offset"
    with live.client(PRODUCER) as producer, live.client(CONSUMER) as consumer:
        problem(producer.put(path, json={"offset": 5}), 403, "FORBIDDEN")
        problem(consumer.put("/v1/topics/billing.a/groups/g1/offset", json={"offset": 5}),
                403, "FORBIDDEN")
        assert consumer.put(path, json={"offset": 0}).json() == {"offset": 0}
        assert consumer.get(path).json() == {"offset": 0}


# --- names match whole --------------------------------------------------------------------
@pytest.mark.parametrize("topic", ["orders.x%0A", "SCHEDULE_TOPIC_XXXX%0A", "orders.x%0D",
                                   "orders.x%00"])
def test_a_topic_with_a_trailing_control_character_is_refused(live: Live, topic: str) -> None:
    with live.client(ADMIN) as client:
        r = client.post(f"/v1/topics/{topic}/messages", json={"body": "x"})
        problem(r, 400, "TOPIC_INVALID")
        problem(client.post(f"/v1/topics/{topic}/messages:batch",
                            json={"messages": [{"body": "x"}]}), 400, "TOPIC_INVALID")
        problem(client.get(f"/v1/topics/{topic}/messages"), 400, "TOPIC_INVALID")
    assert live.broker.stats().pending == 0


@pytest.mark.parametrize("field,value", [("msgId", "m1\n"), ("producerGroup", "g\n")])
def test_ids_with_a_trailing_newline_are_refused(live: Live, field: str, value: str) -> None:
    with live.client(PRODUCER) as client:
        doc = {"body": "x", "msgId": "m1", "producerGroup": "g", field: value}
        problem(client.post("/v1/topics/orders.a/transactions", json=doc), 400,
                "INVALID_ARGUMENT")
        if field == "msgId":
            problem(client.post("/v1/topics/orders.a/messages", json={"body": "x", field: value}),
                    400, "INVALID_ARGUMENT")
        problem(client.get("/v1/topics/orders.a/messages/m1"), 404, "NOT_FOUND")


@pytest.mark.parametrize("path", [
    "/v1/topics/orders.a/groups/g%0A/offset",
    "/v1/topics/orders.a/messages?group=g%0A",
    "/v1/producer-groups/g%0A/transaction-checks",
    "/v1/topics/orders.a/messages/m1%0A",
])
def test_names_in_paths_and_queries_match_whole(live: Live, path: str) -> None:
    with live.client(ADMIN) as client:
        problem(client.get(path), 400, "INVALID_ARGUMENT")


@pytest.mark.parametrize("immunity", ["9" * 5000, "0" * 5000 + "7"], ids=["nines", "zeros-7"])
def test_a_huge_check_immunity_string_is_not_a_500(live: Live, immunity: str) -> None:
    """As RocketMQ: a string that is not a Java long counts as the transaction timeout (6 s);
    leading zeros do not make a number long."""
    checks = "/v1/producer-groups/g/transaction-checks"
    with live.client(PRODUCER) as client:
        r = client.post("/v1/topics/orders.a/transactions",
                        json={"body": "x", "producerGroup": "g", "checkImmunitySeconds": immunity})
        assert r.status_code == 201, r.text
        live.advance(6_000)
        due = len(client.get(checks).json()["checks"])
        assert due == (1 if immunity.startswith("9") else 0)
        live.advance(1_000)
        assert len(client.get(checks).json()["checks"]) == 1 - due


def test_a_listing_cursor_never_carries_another_topics_key(start: Callable[..., Live],
                                                           ) -> None:
    live = start(listing_scan_budget=10)  # stops on another topic's key
    with live.client(ADMIN) as client:
        secret = [{"body": "x", "msgId": f"secret-{i}", "deliverAt": live.clock.now_ms() + 60_000}
                  for i in range(50)]
        assert client.post("/v1/topics/hidden.topic/messages:batch",
                           json={"messages": secret}).status_code == 201
        mine = {"body": "y", "msgId": "mine", "deliverAt": live.clock.now_ms() + 120_000}
        assert client.post("/v1/topics/orders.a/messages", json=mine).status_code == 201
        cursor = None
        seen: list[str] = []
        for _ in range(20):
            params = {"limit": 5} | ({"cursor": cursor} if cursor else {})
            r = client.get("/v1/topics/orders.a/scheduled", params=params)
            assert r.status_code == 200, r.text
            seen += [m["msgId"] for m in r.json()["messages"]]
            cursor = r.json()["nextCursor"]
            if cursor is None:
                break
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            assert b"hidden" not in raw and b"secret" not in raw, raw
        assert seen == ["mine"] and cursor is None


# --- bounded answers ----------------------------------------------------------------------
MIB = 1 << 20


def test_a_pull_answers_at_most_max_answer_bytes_of_bodies(start: Callable[..., Live]) -> None:
    live = start()  # default: 8 MiB of bodies past the first message
    with live.client(ADMIN) as client:
        for i in range(4):
            body = base64.b64encode(bytes([i]) * (3 * MIB)).decode()
            r = client.post("/v1/topics/orders.big/messages", json={"bodyBase64": body})
            assert r.status_code == 201, r.text
        live.broker.drain()
        page = client.get("/v1/topics/orders.big/messages", params={"max": 10}).json()
        assert [m["offset"] for m in page["messages"]] == [0, 1] and page["nextOffset"] == 2
        page = client.get("/v1/topics/orders.big/messages", params={"offset": 2}).json()
        assert [m["offset"] for m in page["messages"]] == [2, 3] and page["nextOffset"] == 4


def test_a_first_message_above_the_bound_is_still_answered(start: Callable[..., Live]) -> None:
    live = start(max_answer_bytes=MIB)
    with live.client(ADMIN) as client:
        for size in (2 * MIB, 10, 10):
            body = "x" * size
            assert client.post("/v1/topics/orders.big/messages",
                               json={"body": body}).status_code == 201
        live.broker.drain()
        page = client.get("/v1/topics/orders.big/messages", params={"max": 10}).json()
        assert [len(m["body"]) for m in page["messages"]] == [2 * MIB]
        page = client.get("/v1/topics/orders.big/messages",
                          params={"offset": page["nextOffset"]}).json()
        assert [len(m["body"]) for m in page["messages"]] == [10, 10]


def test_a_check_back_poll_answers_at_most_max_answer_bytes(start: Callable[..., Live]) -> None:
    live = start(max_answer_bytes=5 * MIB)
    checks = "/v1/producer-groups/pg/transaction-checks"
    with live.client(PRODUCER) as client:
        for i in range(3):
            prepare(client, "orders.a", f"m{i}", body="x" * (2 * MIB))
        live.advance(6_000)
        first = client.get(checks, params={"max": 10}).json()["checks"]
        assert [c["msgId"] for c in first] == ["m0", "m1"]
        rest = client.get(checks, params={"max": 10}).json()["checks"]
        assert [(c["msgId"], c["checkTimes"]) for c in rest] == [("m2", 1)]
        assert client.get(checks, params={"max": 10}).json()["checks"] == []
