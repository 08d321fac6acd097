"""The dashboard's API over real HTTP: the due timeline against a direct count of
the pending messages, through sends, cancels, transactions, deliveries and a restart; its
buckets and bad windows; the overview against the stats; who a token is."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import httpx
import pytest

from scheduler.clock import FakeClock
from scheduler.timeline import DAY, HOUR, MINUTE
from tests.api.test_http_contract import problem
from tests.support.live import (
    ADMIN,
    CONSUMER,
    PRODUCER,
    T0,
    Live,
    make_settings,
    serve,
)

TOPICS = ("orders.a", "orders.b", "orders.c")
URL = re.compile(r"https?://[^\s\"'`)]+")


def direct_count(c: httpx.Client, topic: str) -> list[int]:
    """Every pending deliverAt of ``topic``, read with listScheduled page by page."""
    out: list[int] = []
    cursor = None
    while True:
        params: dict[str, object] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        page = c.get(f"/v1/topics/{topic}/scheduled", params=params).json()
        out += [m["deliverAt"] for m in page["messages"]]
        cursor = page["nextCursor"]
        if not cursor:
            return out


def assert_timeline_exact(live: Live, window: tuple[int, int], buckets: int) -> None:
    """The timeline of each topic and of all equals the bucketed direct count."""
    with live.client() as c:
        every: Counter[int] = Counter()
        total = 0
        for topic in (*TOPICS, None):
            params: dict[str, object] = {"from": window[0], "to": window[1],
                                         "buckets": buckets}
            if topic is not None:
                params["topic"] = topic
            r = c.get("/v1/admin/timeline", params=params)
            assert r.status_code == 200, r.text
            doc = r.json()
            width, start = doc["bucketMs"], doc["from"]
            if topic is None:
                ats = list(every.elements())
                assert doc["pending"] == total
                assert "topic" not in doc
            else:
                ats = direct_count(c, topic)
                every.update(ats)
                total += len(ats)
                assert doc["topic"] == topic and doc["pending"] == len(ats)
            expected = [0] * len(doc["counts"])
            for at in ats:
                if start <= at < doc["to"]:
                    expected[(at - start) // width] += 1
            assert doc["counts"] == expected, topic
            assert doc["to"] == start + width * len(doc["counts"]) >= window[1]


def test_timeline_equals_a_direct_count_through_a_mixed_workload_and_a_restart(
        tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "data")
    clock = FakeClock(T0)
    window = (T0, T0 + 2 * HOUR)
    with serve(settings, clock) as live:
        with live.client() as c:
            for i, topic in enumerate(TOPICS):
                r = c.post(f"/v1/topics/{topic}/messages:batch", json={"messages": [
                    {"body": "l", "msgId": f"{topic}-l{j}", "delayLevel": 1 + j % 6}
                    for j in range(12)] + [
                    {"body": "d", "msgId": f"{topic}-d{j}", "delayMs": 700 * (j + 1) + i}
                    for j in range(40)] + [
                    {"body": "h", "msgId": f"{topic}-h{j}", "delayMs": 37 * MINUTE * (j + 1)}
                    for j in range(3)] + [
                    {"body": "now", "msgId": f"{topic}-n{j}"} for j in range(3)]})
                assert r.status_code == 201, r.text
            assert_timeline_exact(live, window, 60)
            assert_timeline_exact(live, window, 7)
            assert c.delete("/v1/topics/orders.a/messages/orders.a-d0").status_code == 200
            handle = c.get("/v1/topics/orders.b/scheduled", params={"limit": 1}).json()
            r = c.post("/v1/topics/orders.b/messages", json={
                "body": "m", "properties": {"TIMER_DEL_UNIQKEY": handle["messages"][0]["msgId"]}})
            assert r.status_code in (200, 201), r.text
            tx = c.post("/v1/topics/orders.c/transactions", json={
                "body": "t", "producerGroup": "pg", "delayMs": 90 * MINUTE}).json()
            assert_timeline_exact(live, window, 60)  # a half message is not pending
            assert c.post(f"/v1/transactions/{tx['transactionId']}/commit").status_code == 200
            assert_timeline_exact(live, window, 60)
            live.advance(10_000)  # deliveries
            assert_timeline_exact(live, window, 60)
    with serve(settings, clock) as again:  # rebuilt by the start-up scan
        assert_timeline_exact(again, window, 60)
        again.advance(3 * HOUR)
        assert_timeline_exact(again, window, 60)
        with again.client() as c:
            doc = c.get("/v1/admin/timeline", params={"from": T0, "to": T0 + DAY}).json()
            assert doc["pending"] == 0 and set(doc["counts"]) == {0}


def test_bucket_width_and_alignment(live: Live) -> None:
    with live.client() as c:
        for delay in (90_000, 90_500, 150_000):
            assert c.post("/v1/topics/orders.a/messages",
                          json={"body": "x", "delayMs": delay}).status_code == 201
        # 1 h in 60 buckets: 1 min each, from rounded down to its minute, so one more
        doc = c.get("/v1/admin/timeline", params={
            "from": T0 + 12_345, "to": T0 + 12_345 + HOUR, "buckets": 60}).json()
        start = (T0 + 12_345) // MINUTE * MINUTE
        assert doc["bucketMs"] == MINUTE and doc["from"] == start
        assert len(doc["counts"]) == 61 and doc["resolutionMs"] == 1_000
        assert doc["counts"][(T0 + 90_000 - start) // MINUTE] == 2
        assert doc["counts"][(T0 + 150_000 - start) // MINUTE] == 1
        # the same second counts once per message; 1 s buckets over 5 minutes
        doc = c.get("/v1/admin/timeline", params={
            "from": T0, "to": T0 + 5 * MINUTE, "buckets": 300}).json()
        assert doc["bucketMs"] == 1_000 and doc["counts"][90] == 2 and sum(doc["counts"]) == 3
        # defaults: from now, 24 h, 60 buckets: of 30 min (24 min is not a width)
        doc = c.get("/v1/admin/timeline").json()
        assert (doc["bucketMs"], doc["now"], len(doc["counts"])) == (30 * MINUTE, T0, 49)
        assert doc["from"] == T0 // MINUTE * MINUTE
        assert sum(doc["counts"]) == doc["pending"] == 3
        # the longest window, in the fewest buckets
        doc = c.get("/v1/admin/timeline", params={
            "from": T0, "to": T0 + 3_660 * DAY, "buckets": 1}).json()
        assert doc["bucketMs"] == 3_660 * DAY and sum(doc["counts"]) == 3


@pytest.mark.parametrize(("params", "what"), [
    ({"from": T0, "to": T0}, "from < to"),
    ({"from": T0 + 1, "to": T0}, "from < to"),
    ({"from": T0, "to": T0 + 3_661 * DAY}, "at most"),
    ({"buckets": 0}, "buckets"),
    ({"buckets": 1001}, "buckets"),
    ({"buckets": "ten"}, "buckets"),
    ({"from": -1}, "from"),
    ({"from": "x"}, "from"),
    ({"to": 2**64}, "to"),
    ({"topic": "bad topic"}, "topic"),
    ({"topic": "orders.a\n"}, "topic"),
    ({"from": T0 + 1, "to": T0 + 3_661 * DAY, "buckets": 1}, "at most"),
    ({"bucket": 10}, "unknown query parameter"),
    ({"": "false"}, "unknown query parameter"),
])
def test_bad_windows_are_400(shared_live: Live, params: dict[str, object],
                             what: str) -> None:
    with shared_live.client() as c:
        r = c.get("/v1/admin/timeline", params=params)
        doc = problem(r, 400, "TOPIC_INVALID" if what == "topic" else "INVALID_ARGUMENT")
        assert what in doc["detail"] or what == "topic", doc


def test_timeline_and_overview_are_for_admins(shared_live: Live) -> None:
    for token in (PRODUCER, CONSUMER):
        with shared_live.client(token=token) as c:
            problem(c.get("/v1/admin/timeline"), 403, "FORBIDDEN")
            problem(c.get("/v1/admin/overview"), 403, "FORBIDDEN")
    with shared_live.client(token=None) as c:
        problem(c.get("/v1/admin/timeline", params={"buckets": 0}), 401, "UNAUTHORIZED")


def test_overview_equals_the_stats_and_the_logs(live: Live) -> None:
    with live.client() as c:
        for topic, n in (("orders.a", 5), ("orders.b", 2)):
            assert c.post(f"/v1/topics/{topic}/messages:batch", json={"messages": [
                {"body": "x", "delayMs": 1_000 * (j + 1)} for j in range(n)]}).status_code == 201
        assert c.post("/v1/topics/orders.c/messages", json={"body": "now"}).status_code == 201
        assert c.post("/v1/topics/orders.a/messages",
                      json={"body": "x", "msgId": "gone", "delayMs": 60_000}).status_code == 201
        assert c.delete("/v1/topics/orders.a/messages/gone").status_code == 200
        for group in ("pg1", "pg1", "pg2"):
            assert c.post("/v1/topics/orders.a/transactions", json={
                "body": "t", "producerGroup": group}).status_code == 201
        live.advance(1_500)  # orders.a's and orders.b's first ones
        r = c.post("/v1/topics/orders.c/groups/g:receive", json={"max": 1})
        assert len(r.json()["messages"]) == 1
        stats = c.get("/v1/admin/stats").json()
        doc = c.get("/v1/admin/overview").json()
    for name in ("pending", "scheduled", "delivered", "cancelled", "retries", "parked",
                 "deliveryQueueBatches", "deliveryQueueMessages", "watermarkLagMs",
                 "transactionsPrepared", "ready"):
        assert doc[name] == stats[name], name
    assert (doc["pending"], doc["delivered"], doc["cancelled"]) == (5, 3, 1)
    assert doc["topics"] == [
        {"topic": "orders.a", "pending": 4, "oldestPendingAt": T0 + 2_000, "delivered": 1},
        {"topic": "orders.b", "pending": 1, "oldestPendingAt": T0 + 2_000, "delivered": 1},
        {"topic": "orders.c", "pending": 0, "delivered": 1}]
    assert doc["groups"] == [{"topic": "orders.c", "group": "g", "backlog": 1, "leased": 1,
                              "retrying": 0, "deadLettered": 0}]
    assert [(t["producerGroup"], t["prepared"]) for t in doc["transactions"]] == [
        ("pg1", 2), ("pg2", 1)]
    assert doc["transactionsPrepared"] == 3 and not doc["transactionsTruncated"]
    assert all(t["due"] == 0 and t["nextCheckAt"] > T0 for t in doc["transactions"])
    assert doc["lateness"]["count"] == 3 and doc["lateness"]["buckets"][-1] == {"count": 3}
    assert doc["lateness"]["p50Ms"] == stats["latenessP50Ms"]
    assert doc["disk"]["rocksdbBytes"] > 0 and doc["disk"]["commitlogBytes"] > 0
    assert doc["now"] == T0 + 1_500 and doc["deliveryBlocked"] is False


def test_whoami(shared_live: Live) -> None:
    expected = {ADMIN: ("admin", ["*"]), PRODUCER: ("producer", ["orders.*"]),
                CONSUMER: ("consumer", ["orders.*"])}
    for token, (role, topics) in expected.items():
        with shared_live.client(token=token) as c:
            doc = c.get("/v1/whoami").json()
        assert (doc["role"], doc["topics"]) == (role, topics)
        assert ("cancel" in doc["permissions"]) == (role != "consumer")
    with shared_live.client(token="wrong-token-0123456789") as c:
        problem(c.get("/v1/whoami"), 401, "UNAUTHORIZED")


def test_openapi_documents_the_dashboard(shared_live: Live) -> None:
    with shared_live.client(token=None) as c:
        spec = c.get("/openapi.json").json()
    op = spec["paths"]["/v1/admin/timeline"]["get"]
    assert op["operationId"] == "getTimeline"
    assert {p["name"] for p in op["parameters"]} == {"from", "to", "buckets", "topic"}
    assert op["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Timeline"}
    assert {"400", "401", "403", "503"} <= set(op["responses"])
    assert "from" in spec["components"]["schemas"]["Timeline"]["properties"]
    assert spec["paths"]["/v1/admin/overview"]["get"]["operationId"] == "getOverview"
    assert spec["paths"]["/v1/whoami"]["get"]["operationId"] == "getCaller"
    assert not any(path.startswith("/ui") for path in spec["paths"])


def test_the_page_is_served_by_hourglass(shared_live: Live) -> None:
    with shared_live.client(token=None) as c:
        page = c.get("/ui/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        for asset, kind in (("app.js", "text/javascript"), ("style.css", "text/css")):
            r = c.get(f"/ui/{asset}")
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind)
            assert set(URL.findall(r.text)) <= {"http://www.w3.org/2000/svg"}  # a namespace
        assert not URL.findall(page.text)  # nothing fetched from elsewhere
        assert c.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
        problem(c.get("/ui/missing.js"), 404, "NOT_FOUND")
        problem(c.get("/ui/sub/app.js"), 404, "NOT_FOUND")
