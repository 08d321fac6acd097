"""RocketMQ fidelity over real HTTP and a real Broker: delay properties cleared on
delivery, cancel by message (TIMER_DEL_UNIQKEY), backlog gauges, checks without a producer."""

from __future__ import annotations

import dataclasses
import random
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.config import EngineConfig
from scheduler.timer_index import TimerIndex
from storage.constants import timer_cf
from storage.errors import InvalidArgument
from storage.keys import decode_timer_key
from storage.records import decode_message
from tests.support.live import T0, Live, make_settings, serve

TOPIC = "orders.eu"


def send(client: httpx.Client, topic: str = TOPIC, **message: object) -> httpx.Response:
    return client.post(f"/v1/topics/{topic}/messages", json={"body": "hello", **message})


def pull(client: httpx.Client, topic: str = TOPIC) -> list[dict]:
    r = client.get(f"/v1/topics/{topic}/messages", params={"offset": 0, "max": 1000})
    assert r.status_code == 200, r.text
    return r.json()["messages"]


# --- 2. delay properties cleared on delivery ---------------------------------------------------
def test_delay_properties_are_cleared_on_delivery(live: Live) -> None:
    with live.client() as c:
        by_level = send(c, msgId="lvl", properties={"DELAY": "2", "TIMER_DELAY_SEC": "60",
                                                    "order": "42"})
        assert by_level.json()["deliverAt"] == T0 + 5_000  # a level wins
        timer = send(c, msgId="tmr", properties={"TIMER_DELAY_SEC": "3", "TIMER_DELAY_MS": "9",
                                                 "TIMER_DELIVER_MS": "1", "DELAYED": "kept"})
        assert timer.json()["deliverAt"] == T0 + 3_000
        past = send(c, msgId="now", properties={"TIMER_DELIVER_MS": str(T0 - 1), "k": "v"})
        assert past.json()["status"] == "DELIVERED"
        plain = send(c, msgId="plain", delayMs=1_000, properties={"p": "v"})
        assert plain.status_code == 201
        live.advance(5_000)
        delivered = {m["msgId"]: m for m in pull(c)}
        assert delivered["lvl"]["properties"] == {"order": "42"}
        assert delivered["lvl"]["deliverAt"] == T0 + 5_000  # the original time stays known
        assert delivered["tmr"]["properties"] == {"DELAYED": "kept"}
        assert delivered["now"]["properties"] == {"k": "v"}
        assert delivered["plain"]["properties"] == {"p": "v"}
        # a consumer re-sending what it received is not delayed again
        again = send(c, msgId="lvl-again", properties=delivered["lvl"]["properties"])
        assert again.json()["status"] == "DELIVERED"


def test_a_committed_delayed_transaction_is_delivered_without_delay_properties(
        live: Live) -> None:
    with live.client() as c:
        r = c.post(f"/v1/topics/{TOPIC}/transactions", json={
            "body": "tx", "msgId": "tx-1", "producerGroup": "pg",
            "properties": {"TIMER_DELAY_SEC": "2", "x": "y"}})
        assert r.status_code == 201, r.text
        tx = r.json()["transactionId"]
        assert c.post(f"/v1/transactions/{tx}/commit").json()["deliverAt"] == T0 + 2_000
        live.advance(2_000)
        (msg,) = pull(c)
        assert (msg["msgId"], msg["properties"]) == ("tx-1", {"x": "y"})


# --- 1. cancel by message (RIP-43's TIMER_DEL_UNIQKEY) -----------------------------------------
def marker(target: str, **message: object) -> dict:
    return {"body": "", "properties": {"TIMER_DEL_UNIQKEY": target}, **message}


def test_a_marker_cancels_its_target_and_is_never_delivered(live: Live) -> None:
    with live.client() as c:
        send(c, msgId="t-1", delayMs=5_000)
        r = c.post(f"/v1/topics/{TOPIC}/messages", json=marker("t-1", msgId="del-1"))
        assert r.status_code == 201, r.text
        result = r.json()
        assert result["cancel"] == {"msgId": "t-1", "status": "CANCELLED"}
        assert (result["msgId"], result["status"]) == ("del-1", "CANCELLED")
        again = c.post(f"/v1/topics/{TOPIC}/messages", json=marker("t-1", msgId="del-1"))
        assert again.json()["cancel"] == {"msgId": "t-1", "status": "CANCELLED"}  # idempotent
        assert c.get(f"/v1/topics/{TOPIC}/messages/t-1").json()["status"] == "CANCELLED"
        assert c.get(f"/v1/topics/{TOPIC}/messages/del-1").status_code == 404  # not stored
        assert live.broker.stats().pending == 0
        assert live.broker.stats().cancelled == 1
        live.advance(10_000)
        assert pull(c) == []  # neither the target nor the marker


def test_marker_outcomes_are_a_cancel_by_ids_in_a_batch(live: Live) -> None:
    with live.client() as c:
        send(c, msgId="later", delayMs=60_000)
        send(c, msgId="gone")  # delivered at once
        send(c, msgId="other", delayMs=60_000)
        tx = c.post(f"/v1/topics/{TOPIC}/transactions",
                    json={"body": "h", "msgId": "half", "producerGroup": "pg"})
        assert tx.status_code == 201
        live.broker.drain()
        r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": [
            {"body": "plain", "msgId": "p-1", "delayMs": 1_000},
            marker("later"),
            marker(f"{TOPIC}+other"),  # RocketMQ 5's topic+uniqKey form
            marker("gone"),
            marker("never-sent"),
            marker("half"),
            marker("later"),  # twice in one batch: one cancel
        ]})
        assert r.status_code == 201, r.text
        results = r.json()["results"]
        assert results[0]["status"] == "SCHEDULED" and "cancel" not in results[0]
        assert [x["cancel"] for x in results[1:]] == [
            {"msgId": "later", "status": "CANCELLED"},
            {"msgId": "other", "status": "CANCELLED"},
            {"msgId": "gone", "status": "ALREADY_DELIVERED"},
            {"msgId": "never-sent", "status": "NOT_FOUND"},
            {"msgId": "half", "status": "CONFLICT"},
            {"msgId": "later", "status": "CANCELLED"},
        ]
        assert {x["status"] for x in results[1:]} == {"CANCELLED"}
        assert live.broker.stats().cancelled == 2
        assert live.broker.stats().pending == 1  # p-1
        live.advance(120_000)
        assert [m["msgId"] for m in pull(c)] == ["gone", "p-1"]


def test_bad_markers_are_400_and_change_nothing(live: Live) -> None:
    with live.client() as c:
        send(c, msgId="keep", delayMs=5_000)
        for value in ("other.topic+keep", "bad id", "", f"{TOPIC}+"):
            r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": [
                {"body": "x", "msgId": "first"}, marker(value)]})
            assert r.status_code == 400, value
            assert r.json()["code"] == "INVALID_ARGUMENT"
        assert c.get(f"/v1/topics/{TOPIC}/messages/keep").json()["status"] == "SCHEDULED"
        assert c.get(f"/v1/topics/{TOPIC}/messages/first").status_code == 404


def test_a_committed_transactional_marker_cancels(live: Live) -> None:
    with live.client() as c:
        send(c, msgId="target", delayMs=5_000)
        r = c.post(f"/v1/topics/{TOPIC}/transactions",
                   json={**marker("target", msgId="tx-del"), "producerGroup": "pg"})
        assert r.status_code == 201, r.text
        tx = r.json()["transactionId"]
        assert c.get(f"/v1/topics/{TOPIC}/messages/target").json()["status"] == "SCHEDULED"
        done = c.post(f"/v1/transactions/{tx}/commit").json()
        assert done["status"] == "COMMITTED"
        assert done["cancel"] == {"msgId": "target", "status": "CANCELLED"}
        assert c.get(f"/v1/topics/{TOPIC}/messages/tx-del").json()["status"] == "CANCELLED"
        live.advance(10_000)
        assert pull(c) == []


def test_markers_racing_the_delivery_of_their_targets(live: Live) -> None:
    """Markers sent from many threads while the clock moves through their targets' deliver
    times: each target is either delivered once (ALREADY_DELIVERED) or never (CANCELLED)."""
    n, threads = 240, 6
    with live.client() as c:
        r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": [
            {"body": str(i), "msgId": f"r-{i}", "deliverAt": T0 + 1 + i} for i in range(n)]})
        assert r.status_code == 201
    outcomes: dict[str, str] = {}
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def cancel_some(k: int) -> None:
        ids = [f"r-{i}" for i in range(k, n, threads)]
        random.Random(k).shuffle(ids)
        with live.client() as client:
            start.wait()
            for msg_id in ids:
                res = client.post(f"/v1/topics/{TOPIC}/messages", json=marker(msg_id))
                assert res.status_code == 201, res.text
                with lock:
                    outcomes[msg_id] = res.json()["cancel"]["status"]

    workers = [threading.Thread(target=cancel_some, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    while any(w.is_alive() for w in workers):
        live.fake_clock.advance(1)
        time.sleep(0.001)  # let the scanners and the markers interleave (not for timing)
    for w in workers:
        w.join()
    live.advance(n + 10)
    with live.client() as c:
        delivered = [m["msgId"] for m in pull(c)]
    assert len(delivered) == len(set(delivered))  # never twice, markers never
    assert len(outcomes) == n
    assert {msg_id for msg_id, status in outcomes.items()
            if status == "ALREADY_DELIVERED"} == set(delivered)
    assert set(outcomes.values()) <= {"ALREADY_DELIVERED", "CANCELLED"}
    stats = live.broker.stats()
    assert stats.pending == 0
    assert stats.cancelled == n - len(delivered)


# --- 3. backlog per topic and per delay level --------------------------------------------------
def direct_backlog(broker: Broker) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Pending per topic, oldest deliverAt per topic and pending per level, counted from the
    timer column families (every key at or above a shard's persisted frontier)."""
    store = broker.parts.store
    assert store is not None
    topics: dict[str, int] = {}
    oldest: dict[str, int] = {}
    levels: dict[str, int] = {}
    for shard in range(store.timer_shards):
        for key, value in store.scan(timer_cf(shard), TimerIndex(store).frontier(shard)):
            at, topic, _ = decode_timer_key(key)
            topics[topic] = topics.get(topic, 0) + 1
            oldest[topic] = min(oldest.get(topic, at), at)
            level = decode_message(value).flags >> 8
            if level:
                levels[str(level)] = levels.get(str(level), 0) + 1
    return topics, oldest, levels


def scraped(client: httpx.Client, name: str, label: str) -> dict[str, float]:
    pattern = re.compile(rf'^hourglass_{name}{{{label}="([^"]+)"}} (\S+)$', re.M)
    return {k: float(v) for k, v in pattern.findall(client.get("/metrics").text)}


def assert_backlog_exact(live: Live) -> None:
    topics, oldest, levels = direct_backlog(live.broker)
    with live.client() as c:
        stats = c.get("/v1/admin/stats").json()
        assert stats["pendingByTopic"] == topics
        assert stats["oldestPendingByTopic"] == oldest
        assert stats["pendingByLevel"] == levels
        assert stats["pending"] == sum(topics.values())
        assert scraped(c, "pending_by_topic", "topic") == {t: float(n) for t, n in
                                                           topics.items()}
        assert scraped(c, "oldest_pending_deliver_at_ms", "topic") == {
            t: float(at) for t, at in oldest.items()}
        assert scraped(c, "pending_by_level", "level") == {k: float(n) for k, n in
                                                           levels.items()}


def test_backlog_gauges_equal_a_direct_count_after_a_mixed_workload_and_a_restart(
        tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    clock = FakeClock(T0)
    with serve(settings, clock) as live:
        with live.client() as c:
            for i, topic in enumerate(("orders.a", "orders.b", "orders.c")):
                r = c.post(f"/v1/topics/{topic}/messages:batch", json={"messages": [
                    {"body": "l", "msgId": f"{topic}-l{j}", "delayLevel": 1 + j % 4}
                    for j in range(12)] + [
                    {"body": "p", "msgId": f"{topic}-p{j}",
                     "properties": {"DELAY": str(2 + i)}} for j in range(5)] + [
                    {"body": "d", "msgId": f"{topic}-d{j}", "delayMs": 500 * (j + 1)}
                    for j in range(20)] + [
                    {"body": "now", "msgId": f"{topic}-n{j}"} for j in range(3)]})
                assert r.status_code == 201, r.text
            assert_backlog_exact(live)
            # cancels: by id (the topic's oldest, and a level one), by handle, by a marker
            assert c.delete("/v1/topics/orders.a/messages/orders.a-d0").status_code == 200
            assert c.delete("/v1/topics/orders.a/messages/orders.a-l3").status_code == 200
            handle = c.get("/v1/topics/orders.b/scheduled", params={"limit": 1}).json()
            first_b = handle["messages"][0]["msgId"]
            r = c.post("/v1/topics/orders.b/messages", json=marker(first_b))
            assert r.json()["cancel"]["status"] == "CANCELLED"
            tx = c.post("/v1/topics/orders.c/transactions", json={
                "body": "t", "producerGroup": "pg", "delayLevel": 2}).json()["transactionId"]
            assert_backlog_exact(live)  # a half message is not pending
            assert c.post(f"/v1/transactions/{tx}/commit").status_code == 200
            live.advance(1_000)  # level 1, the first delays
            assert_backlog_exact(live)
            live.advance(4_000)  # levels 1, 2 and the "DELAY: 2" ones
            assert_backlog_exact(live)
    with serve(settings, clock) as again:  # restart: rebuilt by the start-up scan
        assert_backlog_exact(again)
        assert again.broker.stats().pending_by_level != {}
        again.advance(30_000)
        assert_backlog_exact(again)
        stats = again.broker.stats()
        assert (stats.pending_by_topic, stats.pending_by_level) == ({}, {})


def test_topic_labels_are_capped(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    settings = dataclasses.replace(settings, engine=dataclasses.replace(
        settings.engine, backlog_topic_labels=2))
    with serve(settings, FakeClock(T0)) as live, live.client() as c:
        for topic, n in (("orders.a", 3), ("orders.b", 2), ("orders.c", 1), ("orders.d", 1)):
            for j in range(n):
                assert send(c, topic, delayMs=1_000 * (5 - j) + n).status_code == 201
        stats = c.get("/v1/admin/stats").json()
        assert stats["pendingByTopic"] == {"orders.a": 3, "orders.b": 2, "__other__": 2}
        oldest = stats["oldestPendingByTopic"]
        assert oldest["__other__"] == T0 + 5_001  # the oldest of orders.c and orders.d
        assert scraped(c, "pending_by_topic", "topic") == {
            "orders.a": 3.0, "orders.b": 2.0, "__other__": 2.0}


# --- 4. check-back rounds count without a producer ---------------------------------------------
INTERVAL = 30_000


def engine_settings(tmp_path: Path, **engine: object) -> Settings:
    settings = make_settings(tmp_path / "data")
    return dataclasses.replace(settings, engine=dataclasses.replace(settings.engine, **engine))


def prepare_half(client: httpx.Client, msg_id: str) -> str:
    r = client.post(f"/v1/topics/{TOPIC}/transactions",
                    json={"body": msg_id, "msgId": msg_id, "producerGroup": "pg"})
    assert r.status_code == 201, r.text
    return r.json()["transactionId"]


def rounds(live: Live, n: int) -> None:
    """``n`` check intervals pass, each followed by the check-back dispatcher's round."""
    for _ in range(n):
        live.advance(INTERVAL)
        live.broker.transactions.dispatcher.join()


def checks(client: httpx.Client) -> list[int]:
    r = client.get("/v1/producer-groups/pg/transaction-checks", params={"max": 10})
    assert r.status_code == 200, r.text
    return [c["checkTimes"] for c in r.json()["checks"]]


def test_a_half_message_nobody_checks_is_discarded_after_15_rounds(tmp_path: Path) -> None:
    with serve(engine_settings(tmp_path), FakeClock(T0)) as live, live.client() as c:
        tx = prepare_half(c, "orphan")
        rounds(live, 2)  # nobody polled for two intervals: from now on rounds count
        status = c.get(f"/v1/topics/{TOPIC}/messages/orphan").json()["status"]
        assert status == "PREPARED"
        rounds(live, 14)  # 15 rounds counted
        assert c.get(f"/v1/topics/{TOPIC}/messages/orphan").json()["status"] == "PREPARED"
        rounds(live, 1)  # the 16th: discarded, as RocketMQ does
        assert c.get(f"/v1/topics/{TOPIC}/messages/orphan").json()["status"] == "DISCARDED"
        assert c.post(f"/v1/transactions/{tx}/commit").status_code == 409
        live.broker.drain()
        (discarded,) = pull(c, "TRANS_CHECK_MAX_TIME_TOPIC")
        assert discarded["msgId"] == tx
        assert discarded["properties"]["TRANSACTION_CHECK_TIMES"] == "15"
        metrics = c.get("/metrics").text
        assert "hourglass_transaction_checks_unanswered_total 15.0" in metrics
        assert c.get("/v1/admin/stats").json()["transactionsPrepared"] == 0


def test_a_polling_producer_gets_every_round_and_its_absence_counts(tmp_path: Path) -> None:
    with serve(engine_settings(tmp_path), FakeClock(T0)) as live, live.client() as c:
        prepare_half(c, "polled")
        live.advance(6_000)
        seen = checks(c)
        for _ in range(4):  # a poller polling once an interval loses no round
            rounds(live, 1)
            seen += checks(c)
        assert seen == [1, 2, 3, 4, 5]
        assert "hourglass_transaction_checks_unanswered_total 0.0" in c.get("/metrics").text
        rounds(live, 2)  # the producer is gone: rounds count without it
        assert "hourglass_transaction_checks_unanswered_total 1.0" in c.get("/metrics").text
        assert checks(c) == []  # (a producer back again gets the next due round)
        rounds(live, 1)
        assert checks(c) == [7]


def test_the_old_rule_waits_for_a_poll(tmp_path: Path) -> None:
    settings = engine_settings(tmp_path, transaction_unanswered_checks="wait")
    with serve(settings, FakeClock(T0)) as live, live.client() as c:
        prepare_half(c, "waiting")
        rounds(live, 40)
        assert c.get(f"/v1/topics/{TOPIC}/messages/waiting").json()["status"] == "PREPARED"
        assert checks(c) == [1]


def test_the_rule_is_validated(tmp_path: Path) -> None:
    config = EngineConfig(data_dir=tmp_path / "data", transaction_unanswered_checks="never")
    with pytest.raises(InvalidArgument, match="transaction_unanswered_checks"):
        Broker(config, FakeClock(T0)).start()
