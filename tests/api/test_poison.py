"""Poison messages over real HTTP: a scheduled message that can never be delivered
(here: bigger than a CommitLog segment, after the segment size was lowered) is parked, the
rest of its batch and every other topic are delivered, the operator sees it in
``/v1/admin/stats``, ``/metrics`` and ``/v1/admin/parked``, and redrives it once fixed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.wiring import build_app
from scheduler.clock import FakeClock
from storage.errors import InvalidArgument
from tests.support.live import ADMIN, T0, make_settings, serve

MIB = 1 << 20


def settings(data: Path, **engine: Any) -> Any:
    base = make_settings(data)
    return replace(base, engine=replace(base.engine, **engine))


def test_a_message_too_big_for_a_segment_is_parked_and_the_rest_delivered(
        tmp_path: Path) -> None:
    data, clock = tmp_path / "data", FakeClock(T0)
    due = T0 + 1_000
    with serve(settings(data), clock) as live, live.client(ADMIN) as client:
        for topic, msg_id, size in (("orders.a", "small-1", 10), ("orders.a", "big", 3 * MIB),
                                    ("orders.b", "small-2", 10), ("orders.a", "small-3", 10)):
            r = client.post(f"/v1/topics/{topic}/messages",
                            json={"body": "x" * size, "msgId": msg_id, "deliverAt": due})
            assert r.status_code == 201, r.text
    # the operator lowers the segment size: "big" can no longer be appended to the log
    with serve(settings(data, segment_size=2 * MIB, max_body_bytes=MIB), clock) as live, \
            live.client(ADMIN) as client:
        clock.advance(1_000)
        live.broker.drain(timeout_s=10)
        got = client.get("/v1/topics/orders.a/messages").json()["messages"]
        assert [m["msgId"] for m in got] == ["small-1", "small-3"]
        got = client.get("/v1/topics/orders.b/messages").json()["messages"]
        assert [m["msgId"] for m in got] == ["small-2"]
        assert client.get("/readyz").status_code == 200  # delivery is not blocked
        stats = client.get("/v1/admin/stats").json()
        assert stats["parked"] == 1 and stats["pending"] == 0
        assert "hourglass_parked_messages 1.0" in client.get("/metrics").text
        [parked] = client.get("/v1/admin/parked").json()["messages"]
        assert (parked["topic"], parked["msgId"], parked["deliverAt"]) == ("orders.a", "big", due)
        assert "exceeds a CommitLog segment" in parked["reason"]
        # later messages go on being delivered
        assert client.post("/v1/topics/orders.a/messages",
                           json={"body": "y", "msgId": "after"}).status_code == 201
    # the cause fixed, the parked message goes back to the scheduler and is delivered once
    with serve(settings(data), clock) as live, live.client(ADMIN) as client:
        assert client.get("/v1/admin/stats").json()["parked"] == 1  # durable
        assert client.post("/v1/admin/parked:redrive").json() == {"redriven": 1}
        live.advance(1)
        got = client.get("/v1/topics/orders.a/messages").json()["messages"]
        assert [m["msgId"] for m in got] == ["small-1", "small-3", "after", "big"]
        assert len(got[-1]["body"]) == 3 * MIB
        assert client.get("/v1/admin/stats").json()["parked"] == 0
        assert client.get("/v1/admin/parked").json() == {"messages": []}
        assert client.get("/v1/topics/orders.a/messages/big").json()["status"] == "DELIVERED"


def test_a_send_whose_record_would_not_fit_a_segment_is_refused(tmp_path: Path) -> None:
    with serve(settings(tmp_path / "data", segment_size=2 * MIB, max_body_bytes=MIB),
               FakeClock(T0)) as live, live.client(ADMIN) as client:
        wide = "\U0001F600" * 4096  # 16 KiB of UTF-8 per property value
        properties = {f"p{i}": wide for i in range(128)}  # 2 MiB of attributes
        r = client.post("/v1/topics/orders.a/messages",
                        json={"body": "x" * 1000, "properties": properties, "deliverAt": T0 + 10})
        assert r.status_code == 413, r.text
        assert r.json()["code"] == "PAYLOAD_TOO_LARGE"
        assert live.broker.stats().pending == 0


def test_a_segment_smaller_than_the_largest_body_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="segment_size"):
        build_app(settings(tmp_path / "data", segment_size=2 * MIB, max_body_bytes=4 * MIB))
