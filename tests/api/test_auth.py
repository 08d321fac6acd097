"""The auth matrix: no token, wrong token, wrong role, topic outside the token's patterns."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.api.test_http_contract import problem
from tests.support.live import (
    ADMIN,
    CONSUMER,
    PRODUCER,
    PRODUCER_ALL,
    Live,
)

OK_TOPIC = "orders.eu"  # inside orders.*
OTHER_TOPIC = "billing"  # outside orders.*

Call = Callable[[httpx.Client, str], httpx.Response]

# name -> (call(client, topic), permitted roles)
CALLS: dict[str, tuple[Call, set[str]]] = {
    "sendMessage": (lambda c, t: c.post(f"/v1/topics/{t}/messages", json={"body": "x"}),
                    {"admin", "producer"}),
    "sendBatch": (lambda c, t: c.post(f"/v1/topics/{t}/messages:batch",
                                      json={"messages": [{"body": "x"}]}),
                  {"admin", "producer"}),
    "cancelMessage": (lambda c, t: c.delete(f"/v1/topics/{t}/messages/unknown"),
                      {"admin", "producer"}),
    "getMessage": (lambda c, t: c.get(f"/v1/topics/{t}/messages/unknown"),
                   {"admin", "producer", "consumer"}),
    "getTopic": (lambda c, t: c.get(f"/v1/topics/{t}"), {"admin", "producer", "consumer"}),
    "listScheduled": (lambda c, t: c.get(f"/v1/topics/{t}/scheduled"),
                      {"admin", "producer", "consumer"}),
    "pullMessages": (lambda c, t: c.get(f"/v1/topics/{t}/messages"),
                     {"admin", "consumer"}),
    "streamMessages": (lambda c, t: c.get(f"/v1/topics/{t}/messages:stream",
                                          params={"durationMs": 1}),
                       {"admin", "consumer"}),
    "getGroupOffset": (lambda c, t: c.get(f"/v1/topics/{t}/groups/g/offset"),
                       {"admin", "consumer"}),
    "commitGroupOffset": (lambda c, t: c.put(f"/v1/topics/{t}/groups/g/offset",
                                             json={"offset": 0}),
                          {"admin", "consumer"}),
    "receiveMessages": (lambda c, t: c.post(f"/v1/topics/{t}/groups/g:receive", json={}),
                        {"admin", "consumer"}),
    "ackMessages": (lambda c, t: c.post(f"/v1/topics/{t}/groups/g:ack",
                                        json={"receipts": ["x"]}), {"admin", "consumer"}),
    "nackMessages": (lambda c, t: c.post(f"/v1/topics/{t}/groups/g:nack",
                                         json={"receipts": ["x"]}), {"admin", "consumer"}),
    "getGroup": (lambda c, t: c.get(f"/v1/topics/{t}/groups/g"), {"admin", "consumer"}),
    "listDeadLetters": (lambda c, t: c.get(f"/v1/topics/{t}/groups/g/dead-letters"),
                        {"admin", "consumer"}),
    "redriveDeadLetters": (lambda c, t: c.post(f"/v1/topics/{t}/groups/g/dead-letters:redrive",
                                               json={}), {"admin", "consumer"}),
}
TX_CALLS: dict[str, tuple[Call, set[str]]] = {
    "prepareTransaction": (lambda c, t: c.post(f"/v1/topics/{t}/transactions",
                                               json={"body": "x", "producerGroup": "pg"}),
                           {"admin", "producer"}),
}
TOPICLESS: dict[str, tuple[Callable[[httpx.Client], httpx.Response], set[str]]] = {
    "getStats": (lambda c: c.get("/v1/admin/stats"), {"admin"}),
    "createSnapshot": (lambda c: c.post("/v1/admin/snapshots"), {"admin"}),
    "listParked": (lambda c: c.get("/v1/admin/parked"), {"admin"}),
    "getTimeline": (lambda c: c.get("/v1/admin/timeline"), {"admin"}),
    "getOverview": (lambda c: c.get("/v1/admin/overview"), {"admin"}),
    "getCaller": (lambda c: c.get("/v1/whoami"), {"admin", "producer", "consumer"}),
    "getCluster": (lambda c: c.get("/v1/cluster"), {"admin", "producer", "consumer"}),
    "redriveParked": (lambda c: c.post("/v1/admin/parked:redrive"), {"admin"}),
    "setCheckCallback": (lambda c: c.put("/v1/producer-groups/pg/check-callback",
                                         json={"url": "https://not-allowed.example/x"}),
                         {"admin"}),
    "getCheckCallback": (lambda c: c.get("/v1/producer-groups/pg/check-callback"), {"admin"}),
    "deleteCheckCallback": (lambda c: c.delete("/v1/producer-groups/pg/check-callback"),
                            {"admin"}),
}
TX_TOPICLESS: dict[str, tuple[Callable[[httpx.Client], httpx.Response], set[str]]] = {
    "commitTransaction": (lambda c: c.post("/v1/transactions/unknown/commit"),
                          {"admin", "producer"}),
    "rollbackTransaction": (lambda c: c.post("/v1/transactions/unknown/rollback"),
                            {"admin", "producer"}),
    "pollTransactionChecks": (lambda c: c.get("/v1/producer-groups/pg/transaction-checks"),
                              {"admin", "producer"}),
}
TOKENS = {"admin": ADMIN, "producer": PRODUCER, "consumer": CONSUMER}


def allowed(response: httpx.Response) -> bool:
    """Past auth: anything but 401/403 (404 for the unknown ids used here is fine)."""
    assert response.status_code < 500, response.text
    return response.status_code not in (401, 403)


@pytest.mark.parametrize("name", [
    *sorted(CALLS), *sorted(TX_CALLS)])
def test_topic_calls(shared_live: Live, name: str) -> None:
    live = shared_live
    call, roles = {**CALLS, **TX_CALLS}[name]
    with live.client(token=None) as anonymous:
        problem(call(anonymous, OK_TOPIC), 401, "UNAUTHORIZED")
        assert call(anonymous, OK_TOPIC).headers["www-authenticate"].startswith("Bearer")
    with live.client(token="not-a-token-0123456789") as stranger:
        problem(call(stranger, OK_TOPIC), 401, "UNAUTHORIZED")
    with live.client(token=None, headers={"Authorization": f"Basic {ADMIN}"}) as basic:
        problem(call(basic, OK_TOPIC), 401, "UNAUTHORIZED")
    for role, token in TOKENS.items():
        with live.client(token=token) as c:
            if role in roles:
                assert allowed(call(c, OK_TOPIC)), (role, name)
                outside = call(c, OTHER_TOPIC)
                if role == "admin":
                    assert allowed(outside)
                else:
                    doc = problem(outside, 403, "FORBIDDEN")
                    assert "topic" in doc["detail"]
            else:
                problem(call(c, OK_TOPIC), 403, "FORBIDDEN")


@pytest.mark.parametrize("name", [
    *sorted(TOPICLESS), *sorted(TX_TOPICLESS)])
def test_topicless_calls(shared_live: Live, name: str) -> None:
    live = shared_live
    call, roles = {**TOPICLESS, **TX_TOPICLESS}[name]
    with live.client(token=None) as anonymous:
        problem(call(anonymous), 401, "UNAUTHORIZED")
    for role, token in TOKENS.items():
        with live.client(token=token) as c:
            response = call(c)
            if role in roles:
                assert allowed(response), (role, name)
            else:
                problem(response, 403, "FORBIDDEN")


def test_cancel_by_handle_checks_the_handles_topic(live: Live) -> None:
    with live.client(token=PRODUCER_ALL) as c:
        handle = c.post(f"/v1/topics/{OTHER_TOPIC}/messages",
                        json={"body": "x", "delayMs": 1_000}).json()["cancelHandle"]
    with live.client(token=PRODUCER) as restricted:
        problem(restricted.delete(f"/v1/scheduled/{handle}"), 403, "FORBIDDEN")
    with live.client(token=CONSUMER) as consumer:
        problem(consumer.delete(f"/v1/scheduled/{handle}"), 403, "FORBIDDEN")
    with live.client(token=None) as anonymous:
        problem(anonymous.delete(f"/v1/scheduled/{handle}"), 401, "UNAUTHORIZED")
    assert live.broker.stats().pending == 1  # none of that cancelled anything
    with live.client(token=PRODUCER_ALL) as c:
        assert c.delete(f"/v1/scheduled/{handle}").json()["status"] == "CANCELLED"


def test_unauthenticated_is_401_before_any_validation(shared_live: Live) -> None:
    with shared_live.client(token=None) as anonymous:
        problem(anonymous.get("/v1/topics/bad topic!/messages", params={"max": -1}), 401,
                "UNAUTHORIZED")
        problem(anonymous.post("/v1/topics/orders.eu/messages", content=b"{"), 401,
                "UNAUTHORIZED")


def test_open_endpoints_need_no_token(shared_live: Live) -> None:
    with shared_live.client(token=None) as anonymous:
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
            assert anonymous.get(path).status_code == 200, path


def test_every_other_operation_requires_a_token(shared_live: Live) -> None:
    """No route of the OpenAPI document was forgotten by the auth matrix above."""
    with shared_live.client(token=None) as anonymous:
        spec = anonymous.get("/openapi.json").json()
    secured = {op["operationId"] for item in spec["paths"].values() for op in item.values()
               if op.get("security")}
    assert secured == {*CALLS, *TX_CALLS, *TOPICLESS, *TX_TOPICLESS, "cancelByHandle"}
