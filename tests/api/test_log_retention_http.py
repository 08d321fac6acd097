"""The log's retention over real HTTP: GET /v1/topics/{topic}, 410 OFFSET_EXPIRED with
firstOffset for a pull or a stream below it, a group behind it goes on from it and shows
``expired``, /metrics counts deletions and lost messages."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.clock import FakeClock
from tests.support.live import CONSUMER, PRODUCER, T0, Live, make_settings, serve

TOPIC = "orders.kept"


@pytest.fixture
def live_small(tmp_path: Path) -> Iterator[Live]:
    settings = make_settings(tmp_path / "data")
    settings = replace(settings, engine=replace(
        settings.engine, segment_size=64 << 10, max_body_bytes=16 << 10,
        commitlog_retention_ms=60_000, disk_clean_ratio=1.0))
    with serve(settings, FakeClock(T0)) as server:
        yield server


def _send(live: Live, n: int, start: int) -> None:
    with live.client() as c:
        body = {"messages": [{"body": "x" * 1000, "msgId": f"m{i}"}
                             for i in range(start, start + n)]}
        assert c.post(f"/v1/topics/{TOPIC}/messages:batch", json=body).status_code == 201


def _expire_old_segments(live: Live) -> int:
    _send(live, 60, 0)
    live.fake_clock.advance(100_000)
    for k in range(1, 4):
        _send(live, 60, 60 * k)
    live.fake_clock.advance(70_000)
    retention = live.broker.parts.retention
    assert retention is not None
    retention.run_once()
    first = live.broker.topic(TOPIC).first_offset
    assert first > 0
    return first


def test_get_topic_and_the_410_below_its_first_offset(live_small: Live) -> None:
    live = live_small
    with live.client(CONSUMER) as c:
        assert c.get(f"/v1/topics/{TOPIC}").json() == {
            "topic": TOPIC, "firstOffset": 0, "endOffset": 0, "pending": 0}
    first = _expire_old_segments(live)
    with live.client(PRODUCER) as c:
        assert c.post(f"/v1/topics/{TOPIC}/messages",
                      json={"body": "later", "delayMs": 60_000}).status_code == 201
        assert c.get(f"/v1/topics/{TOPIC}").json() == {
            "topic": TOPIC, "firstOffset": first, "endOffset": 240, "pending": 1}
    with live.client(CONSUMER) as c:
        r = c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": first - 1})
        assert r.status_code == 410
        assert r.headers["content-type"].startswith("application/problem+json")
        problem = r.json()
        assert problem["code"] == "OFFSET_EXPIRED" and problem["status"] == 410
        assert problem["firstOffset"] == first
        r = c.get(f"/v1/topics/{TOPIC}/messages:stream", params={"offset": 0})
        assert r.status_code == 410 and r.json()["firstOffset"] == first
        r = c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": first, "max": 1000})
        assert r.status_code == 200
        assert [m["offset"] for m in r.json()["messages"]] == list(range(first, 240))
        # a bad topic is still a 400, an unknown one answers its empty log
        assert c.get("/v1/topics/orders.bad%20name").status_code == 400
        assert c.get("/v1/topics/orders.none").json()["endOffset"] == 0
    with live.client(CONSUMER) as c:  # another role's topic: 403
        assert c.get("/v1/topics/payments").status_code == 403
    # the dashboard's overview shows first and end offsets, and the file system's use
    with live.client() as c:
        overview = c.get("/v1/admin/overview").json()
        row = next(t for t in overview["topics"] if t["topic"] == TOPIC)
        assert (row["firstOffset"], row["delivered"]) == (first, 240)
        assert 0 < overview["disk"]["usedRatio"] <= 1 and overview["disk"]["freeBytes"] > 0
    # the message whose record went: DELIVERED, without an offset
    with live.client() as c:
        info = c.get(f"/v1/topics/{TOPIC}/messages/m0").json()
        assert info["status"] == "DELIVERED" and "offset" not in info


def test_a_group_behind_it_goes_on_from_it_and_shows_expired(live_small: Live) -> None:
    live = live_small
    with live.client(CONSUMER) as c:
        assert c.put(f"/v1/topics/{TOPIC}/groups/slow/offset",
                     json={"offset": 0}).status_code == 200
    first = _expire_old_segments(live)
    with live.client(CONSUMER) as c:
        r = c.get(f"/v1/topics/{TOPIC}/messages", params={"group": "slow", "max": 5})
        assert r.status_code == 200
        assert [m["offset"] for m in r.json()["messages"]] == list(range(first, first + 5))
        assert c.get(f"/v1/topics/{TOPIC}/groups/slow/offset").json() == {"offset": first}
        state = c.get(f"/v1/topics/{TOPIC}/groups/slow").json()
        assert state["expired"] == first and state["committedOffset"] == first
        # competing members: a receive goes on from the first offset too
        got = c.post(f"/v1/topics/{TOPIC}/groups/workers:receive", json={"max": 3}).json()
        assert [m["offset"] for m in got["messages"]] == [first, first + 1, first + 2]
        assert c.get(f"/v1/topics/{TOPIC}/groups/workers").json()["expired"] == first
        metrics = c.get("/metrics").text
    assert f'hourglass_group_expired_total{{group="{TOPIC}/slow"}} {float(first)}' in metrics
    assert 'hourglass_commitlog_segments_deleted_total{reason="retention"}' in metrics
    assert "hourglass_disk_used_ratio " in metrics


def test_the_contract_names_it(live_small: Live) -> None:
    with live_small.client() as c:
        doc = c.get("/openapi.json").json()
    op = doc["paths"]["/v1/topics/{topic}"]["get"]
    assert op["operationId"] == "getTopic"
    assert "410" in doc["paths"]["/v1/topics/{topic}/messages"]["get"]["responses"]
    assert set(doc["components"]["schemas"]["TopicInfo"]["properties"]) == {
        "topic", "firstOffset", "endOffset", "pending"}
    assert T0  # (a fake clock: nothing here waits)
