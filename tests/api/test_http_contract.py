"""Every endpoint of the v1 contract over real HTTP against a real Broker (FakeClock-driven)."""

from __future__ import annotations

import base64

import httpx
import pytest

from storage.constants import CF_INDEX
from storage.errors import StorageError
from storage.keys import index_key
from tests.support.live import T0, Live

TOPIC = "orders.eu"


def problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json; charset=utf-8"
    doc = response.json()
    assert set(doc) == {"type", "title", "status", "detail", "code"}
    assert doc["status"] == status
    assert doc["code"] == code
    assert doc["type"].startswith("urn:hourglass:problem:")
    assert doc["detail"]
    return doc


def send(client: httpx.Client, topic: str = TOPIC, **message: object) -> httpx.Response:
    return client.post(f"/v1/topics/{topic}/messages", json={"body": "hello", **message})


# --- sending -------------------------------------------------------------------------------
def test_send_scheduled_then_delivered_at_its_time(live: Live) -> None:
    with live.client() as c:
        r = send(c, msgId="m-1", delayMs=5_000, tags="TagA", keys=["k1"],
                 properties={"p": "v"})
        assert r.status_code == 201
        sent = r.json()
        assert sent == {"msgId": "m-1", "topic": TOPIC, "deliverAt": T0 + 5_000,
                        "status": "SCHEDULED", "cancelHandle": sent["cancelHandle"],
                        "duplicate": False}
        assert c.get(f"/v1/topics/{TOPIC}/messages/m-1").json() == {
            "msgId": "m-1", "topic": TOPIC, "status": "SCHEDULED", "deliverAt": T0 + 5_000}
        live.advance(4_999)
        assert c.get(f"/v1/topics/{TOPIC}/messages").json() == {"messages": [],
                                                                  "nextOffset": 0}
        live.advance(1)
        info = c.get(f"/v1/topics/{TOPIC}/messages/m-1").json()
        assert info == {"msgId": "m-1", "topic": TOPIC, "status": "DELIVERED",
                        "deliverAt": T0 + 5_000, "offset": 0}
        pulled = c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": 0}).json()
        (msg,) = pulled["messages"]
        assert pulled["nextOffset"] == 1
        assert msg == {"offset": 0, "msgId": "m-1", "topic": TOPIC, "tags": "TagA",
                       "keys": ["k1"], "properties": {"p": "v"}, "bodyBase64": "aGVsbG8=",
                       "body": "hello", "bornAt": T0, "deliverAt": T0 + 5_000,
                       "storedAt": T0 + 5_000}


def test_send_now_delivers_and_binary_body_has_no_text(live: Live) -> None:
    raw = b"\xff\x00binary"
    with live.client() as c:
        r = c.post(f"/v1/topics/{TOPIC}/messages",
                   json={"bodyBase64": base64.b64encode(raw).decode()})
        assert r.status_code == 201
        assert r.json()["status"] == "DELIVERED"
        assert r.json()["deliverAt"] == T0
        live.broker.drain()
        (msg,) = c.get(f"/v1/topics/{TOPIC}/messages").json()["messages"]
        assert base64.b64decode(msg["bodyBase64"]) == raw
        assert "body" not in msg


def test_timing_fields_and_rocketmq_levels(live: Live) -> None:
    with live.client() as c:
        assert send(c, deliverAt=T0 + 60_000).json()["deliverAt"] == T0 + 60_000
        assert send(c, deliverAt=T0 - 60_000).json()["status"] == "DELIVERED"  # past: now
        assert send(c, delayLevel=3).json()["deliverAt"] == T0 + 10_000  # "1s 5s 10s ..."
        assert send(c, delayLevel=99).json()["deliverAt"] == T0 + 7_200_000  # clamped to 2h
        assert send(c, properties={"DELAY": "2"}).json()["deliverAt"] == T0 + 5_000


def test_duplicate_send_answers_200_with_the_first_result(live: Live) -> None:
    with live.client() as c:
        first = send(c, msgId="dup", delayMs=1_000)
        again = send(c, msgId="dup", delayMs=9_000, body="other")
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json() == {**first.json(), "duplicate": True}
        assert live.broker.stats().pending == 1


def test_batch_in_order_and_atomic(live: Live) -> None:
    with live.client() as c:
        r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": [
            {"body": f"b{i}", "msgId": f"b-{i}", "delayMs": 1_000 * (3 - i)} for i in range(3)
        ]})
        assert r.status_code == 201
        assert [x["msgId"] for x in r.json()["results"]] == ["b-0", "b-1", "b-2"]
        assert [x["deliverAt"] for x in r.json()["results"]] == [T0 + 3_000, T0 + 2_000,
                                                                 T0 + 1_000]
        live.advance(3_000)
        msgs = c.get(f"/v1/topics/{TOPIC}/messages").json()["messages"]
        assert [m["msgId"] for m in msgs] == ["b-2", "b-1", "b-0"]  # by deliver time


def test_batch_in_msgpack(live: Live) -> None:
    import msgpack

    payload = msgpack.packb({"messages": [{"bodyBase64": b"\x01\x02", "msgId": "mp-1"},
                                          {"body": "text", "delayMs": 10}]})
    with live.client() as c:
        r = c.post(f"/v1/topics/{TOPIC}/messages:batch", content=payload,
                   headers={"Content-Type": "application/x-msgpack",
                            "Accept": "application/x-msgpack"})
        assert r.status_code == 201
        assert r.headers["content-type"] == "application/x-msgpack"
        results = msgpack.unpackb(r.content)["results"]
        assert results[0]["msgId"] == "mp-1"
        assert results[1]["status"] == "SCHEDULED"
        live.advance(10)
        pulled = c.get(f"/v1/topics/{TOPIC}/messages", headers={
            "Accept": "application/x-msgpack"})
        messages = msgpack.unpackb(pulled.content)["messages"]
        assert messages[0]["bodyBase64"] == b"\x01\x02"
        assert messages[1]["body"] == "text"


# --- cancelling ------------------------------------------------------------------------------
def test_cancel_by_handle_is_truthful_and_idempotent(live: Live) -> None:
    with live.client() as c:
        handle = send(c, msgId="c-1", delayMs=1_000).json()["cancelHandle"]
        r = c.delete(f"/v1/scheduled/{handle}")
        assert r.status_code == 200
        assert r.json() == {"msgId": "c-1", "topic": TOPIC, "status": "CANCELLED"}
        assert c.delete(f"/v1/scheduled/{handle}").json()["status"] == "CANCELLED"
        live.advance(5_000)
        assert c.get(f"/v1/topics/{TOPIC}/messages").json()["messages"] == []
        assert c.get(f"/v1/topics/{TOPIC}/messages/c-1").json()["status"] == "CANCELLED"

        delivered = send(c, msgId="c-2").json()["cancelHandle"]
        live.broker.drain()
        problem(c.delete(f"/v1/scheduled/{delivered}"), 409, "ALREADY_DELIVERED")
        problem(c.delete("/v1/scheduled/not-a-handle"), 404, "NOT_FOUND")


def test_cancel_by_id(live: Live) -> None:
    with live.client() as c:
        send(c, msgId="c-3", delayMs=1_000)
        r = c.delete(f"/v1/topics/{TOPIC}/messages/c-3")
        assert r.json() == {"msgId": "c-3", "topic": TOPIC, "status": "CANCELLED"}
        assert c.delete(f"/v1/topics/{TOPIC}/messages/c-3").status_code == 200
        problem(c.delete(f"/v1/topics/{TOPIC}/messages/never-sent"), 404, "NOT_FOUND")
        send(c, msgId="c-4")
        live.broker.drain()
        problem(c.delete(f"/v1/topics/{TOPIC}/messages/c-4"), 409, "ALREADY_DELIVERED")
        problem(c.get(f"/v1/topics/{TOPIC}/messages/never-sent"), 404, "NOT_FOUND")
        problem(c.get(f"/v1/topics/{TOPIC}/messages/bad%20id"), 400, "INVALID_ARGUMENT")


def test_list_scheduled_pages_by_deliver_time(live: Live) -> None:
    with live.client() as c:
        for i in range(5):
            send(c, msgId=f"s-{i}", delayMs=1_000 * (5 - i))
        first = c.get(f"/v1/topics/{TOPIC}/scheduled", params={"limit": 2}).json()
        assert [m["msgId"] for m in first["messages"]] == ["s-4", "s-3"]
        assert all(m["status"] == "SCHEDULED" for m in first["messages"])
        second = c.get(f"/v1/topics/{TOPIC}/scheduled",
                       params={"limit": 10, "cursor": first["nextCursor"]}).json()
        assert [m["msgId"] for m in second["messages"]] == ["s-2", "s-1", "s-0"]
        assert second["nextCursor"] is None
        window = c.get(f"/v1/topics/{TOPIC}/scheduled",
                       params={"from": T0 + 2_000, "to": T0 + 3_000}).json()
        assert [m["msgId"] for m in window["messages"]] == ["s-3"]  # to is exclusive
        problem(c.get(f"/v1/topics/{TOPIC}/scheduled", params={"from": 5, "to": 4}), 400,
                "INVALID_ARGUMENT")


# --- consuming -------------------------------------------------------------------------------
def test_pull_by_group_and_commit_offsets(live: Live) -> None:
    with live.client() as c:
        c.post(f"/v1/topics/{TOPIC}/messages:batch",
               json={"messages": [{"body": str(i)} for i in range(5)]})
        live.broker.drain()
        offset_url = f"/v1/topics/{TOPIC}/groups/g1/offset"
        assert c.get(offset_url).json() == {"offset": 0}
        page = c.get(f"/v1/topics/{TOPIC}/messages", params={"group": "g1", "max": 2}).json()
        assert [m["body"] for m in page["messages"]] == ["0", "1"]
        assert c.put(offset_url, json={"offset": page["nextOffset"]}).json() == {"offset": 2}
        assert c.get(offset_url).json() == {"offset": 2}
        rest = c.get(f"/v1/topics/{TOPIC}/messages", params={"group": "g1"}).json()
        assert [m["offset"] for m in rest["messages"]] == [2, 3, 4]
        assert rest["nextOffset"] == 5
        assert c.get(f"/v1/topics/{TOPIC}/messages",
                     params={"offset": 4, "max": 1}).json()["nextOffset"] == 5
        problem(c.put(offset_url, json={"offset": -1}), 400, "INVALID_ARGUMENT")
        problem(c.put(offset_url, json={"offset": "2"}), 400, "INVALID_ARGUMENT")
        problem(c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": -1}), 400,
                "INVALID_ARGUMENT")
        problem(c.get(f"/v1/topics/{TOPIC}/messages", params={"max": 1001}), 400,
                "INVALID_ARGUMENT")
        problem(c.get(f"/v1/topics/{TOPIC}/messages", params={"waitMs": 30_001}), 400,
                "INVALID_ARGUMENT")


# --- operations ------------------------------------------------------------------------------
def test_health_ready_stats_snapshot_metrics(live: Live) -> None:
    with live.client(token=None) as anonymous, live.client() as c:
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        assert anonymous.get("/readyz").json() == {"status": "ready"}
        send(c, delayMs=1_000)
        # hot routes (api/hot.py) count in the HTTP metrics too, errors with their status
        assert c.put(f"/v1/topics/{TOPIC}/groups/g/offset", json={"offset": -1}
                     ).status_code == 400
        stats = c.get("/v1/admin/stats").json()
        assert stats["pending"] == 1
        snap = c.post("/v1/admin/snapshots")
        assert snap.status_code == 201
        assert {"snapshotId", "path", "createdAt"} <= set(snap.json())
        text = anonymous.get("/metrics")
        assert text.headers["content-type"].startswith("text/plain")
        body = text.text
        assert "hourglass_ready 1.0" in body
        assert "hourglass_pending 1.0" in body
        assert 'hourglass_http_requests_total{method="POST",route="/v1/topics/{topic}/messages"' \
               ',status="201"} 1.0' in body
        assert 'hourglass_http_requests_total{method="PUT",route="/v1/topics/{topic}/groups/' \
               '{group}/offset",status="400"} 1.0' in body
        assert "hourglass_http_requests_in_flight 1.0" in body  # this very request only
        assert "hourglass_delivery_lateness_ms_bucket" in body


def test_stats_document_names_and_types(live: Live) -> None:
    with live.client() as c:
        send(c, msgId="later", delayMs=1_000)
        assert c.post(f"/v1/topics/{TOPIC}/groups/g:receive", json={"max": 1}).status_code == 200
        stats = c.get("/v1/admin/stats").json()
    assert list(stats) == [
        "ready", "pending", "scheduled", "delivered", "deliveredImmediate", "cancelled",
        "duplicates", "retries", "deliveryQueueBatches", "deliveryQueueMessages",
        "watermarkLagMs", "latenessP50Ms", "latenessP99Ms", "transactionsPrepared", "groups",
        "parked", "pendingByTopic", "oldestPendingByTopic", "pendingByLevel", "timerShards",
        "watermarks", "appliedLogPosition", "logEndPosition"]
    assert stats["ready"] is True and stats["pending"] == stats["scheduled"] == 1
    assert stats["pendingByTopic"] == {TOPIC: 1}
    assert stats["oldestPendingByTopic"] == {TOPIC: T0 + 1_000}
    assert stats["timerShards"] == 2 and set(stats["watermarks"]) == {"0", "1"}
    assert stats["groups"] == {f"{TOPIC}/g": {
        "backlog": 0, "committedOffset": 0, "endOffset": 0, "leased": 0, "retrying": 0,
        "deadLettered": 0, "redelivered": 0}}


def test_readyz_503_when_the_engine_is_not_ready(live: Live,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(type(live.broker), "ready", property(lambda self: False))
    with live.client(token=None) as c:
        problem(c.get("/readyz"), 503, "UNAVAILABLE")
        assert "hourglass_ready 0.0" in c.get("/metrics").text


def test_storage_fault_is_503_and_stores_nothing(live: Live,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> None:
        raise StorageError("disk full")

    monkeypatch.setattr(live.broker.parts.writes, "submit", broken)  # the storing step of a send
    with live.client() as c:
        problem(send(c, msgId="x"), 503, "UNAVAILABLE")
        problem(c.post(f"/v1/topics/{TOPIC}/messages:batch",
                       json={"messages": [{"body": "x"}]}), 503, "UNAVAILABLE")
        monkeypatch.undo()
        problem(c.get(f"/v1/topics/{TOPIC}/messages/x"), 404, "NOT_FOUND")


def test_corrupt_stored_data_is_a_corruption_problem(live: Live) -> None:
    with live.client() as c:
        assert send(c, msgId="m-bad", delayMs=5_000).status_code == 201
        store = live.broker.parts.store  # the live RocksDB: overwrite the message's index entry
        assert store is not None
        batch = store.batch()
        batch.put(CF_INDEX, index_key(TOPIC, "m-bad"), b"\xff not an index entry")
        store.write(batch)
        doc = problem(c.get(f"/v1/topics/{TOPIC}/messages/m-bad"), 500, "CORRUPTION")
        assert doc["title"] == "Data corruption"
        assert "IndexEntry" in doc["detail"]


def test_unknown_path_and_method_are_problems(live: Live) -> None:
    with live.client() as c:
        problem(c.get("/v1/nothing-here"), 404, "NOT_FOUND")
        assert c.put("/healthz").status_code == 405
        assert c.put("/healthz").headers["content-type"].startswith("application/problem+json")


# --- transactions ------------------------------------------------------------------------------
def test_transactions_prepare_commit_rollback_and_checks(live: Live) -> None:
    with live.client() as c:
        def prepare(msg_id: str, **fields: object) -> dict:
            r = c.post(f"/v1/topics/{TOPIC}/transactions",
                       json={"body": msg_id, "msgId": msg_id, "producerGroup": "pg", **fields})
            assert r.status_code == 201, r.text
            return r.json()

        kept = prepare("tx-keep", delayMs=1_000)
        assert kept["status"] == "PREPARED"
        dropped = prepare("tx-drop")
        waiting = prepare("tx-wait", checkImmunitySeconds=60)
        live.broker.drain()
        assert c.get(f"/v1/topics/{TOPIC}/messages").json()["messages"] == []  # invisible

        committed = c.post(f"/v1/transactions/{kept['transactionId']}/commit")
        assert committed.status_code == 200
        assert committed.json()["status"] == "COMMITTED"
        assert committed.json()["deliverAt"] >= T0 + 1_000
        again = c.post(f"/v1/transactions/{kept['transactionId']}/commit")
        assert again.json()["status"] == "COMMITTED"  # idempotent
        problem(c.post(f"/v1/transactions/{kept['transactionId']}/rollback"), 409, "CONFLICT")

        rolled = c.post(f"/v1/transactions/{dropped['transactionId']}/rollback")
        assert rolled.json()["status"] == "ROLLED_BACK"
        problem(c.post(f"/v1/transactions/{dropped['transactionId']}/commit"), 409, "CONFLICT")
        problem(c.post("/v1/transactions/01ARZ3NDEKTSV4RRFFQ69G5FAV/commit"), 404, "NOT_FOUND")

        checks_url = "/v1/producer-groups/pg/transaction-checks"
        assert c.get(checks_url).json() == {"checks": []}  # immunity not over yet
        live.advance(6_000)  # the transaction timeout (6 s): tx-wait is still immune (60 s)
        assert c.get(checks_url).json() == {"checks": []}
        live.advance(54_000)
        (check,) = c.get(checks_url, params={"max": 10}).json()["checks"]
        assert check["transactionId"] == waiting["transactionId"]
        assert check["msgId"] == "tx-wait"
        assert check["topic"] == TOPIC
        assert check["body"] == "tx-wait"
        assert check["checkTimes"] >= 1
        assert check["preparedAt"] == T0
        problem(c.get(checks_url, params={"max": 0}), 400, "INVALID_ARGUMENT")

        pulled = c.get(f"/v1/topics/{TOPIC}/messages").json()["messages"]
        assert [m["msgId"] for m in pulled] == ["tx-keep"]


def test_an_unexpected_error_is_a_500_problem(live: Live,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(*_: object, **__: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(live.broker, "send", bug)  # a hot route (served ahead of FastAPI)
    monkeypatch.setattr(live.broker.groups, "offset", bug)  # an ordinary route
    monkeypatch.setattr(live.broker.groups, "set_offset", bug)  # one with a body
    with live.client() as c:
        problem(send(c), 500, "INTERNAL")
        problem(c.get(f"/v1/topics/{TOPIC}/groups/g/offset"), 500, "INTERNAL")
        problem(c.put(f"/v1/topics/{TOPIC}/groups/g/offset", json={"offset": 1}), 500,
                "INTERNAL")
        assert c.get("/healthz").status_code == 200  # the server carries on
