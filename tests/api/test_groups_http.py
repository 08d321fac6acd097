"""Consumer groups with competing members over real HTTP: receive, ack, nack, group state,
dead letters and redrive; bad input; members in several processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler.clock import FakeClock
from scheduler.group_state import retry_topic
from tests.support.live import ADMIN, CONSUMER, T0, Live, make_settings, serve

REPO = Path(__file__).resolve().parents[2]
G = "/v1/topics/orders.g/groups/workers"


def send(c: httpx.Client, n: int, topic: str = "orders.g") -> None:
    r = c.post(f"/v1/topics/{topic}/messages:batch", json={"messages": [
        {"body": f"m{i}", "msgId": f"m{i}", "properties": {"n": str(i)}} for i in range(n)]})
    assert r.status_code == 201, r.text


def forged(receipt: str) -> str:
    """The receipt with one character of its tag (the hash binding it to the group) changed."""
    head, tag, offset = receipt.split(".")
    return f"{head}.{'1' if tag[0] == '0' else '0'}{tag[1:]}.{offset}"


def state(c: httpx.Client, path: str = G) -> dict[str, Any]:
    r = c.get(path)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_receive_ack_nack_dead_letters_and_redrive(live: Live) -> None:
    with live.client() as c, live.client(CONSUMER) as consumer:
        send(c, 3)
        r = consumer.post(f"{G}:receive", json={"max": 2, "leaseMs": 5_000})
        assert r.status_code == 200, r.text
        first = r.json()
        assert first["leaseUntil"] == T0 + 5_000
        assert [m["msgId"] for m in first["messages"]] == ["m0", "m1"]
        m0 = first["messages"][0]
        assert (m0["body"], m0["offset"], m0["topic"], m0["properties"]) == \
            ("m0", 0, "orders.g", {"n": "0"})
        assert (m0["deliveryCount"], m0["reconsumeTimes"]) == (1, 0)
        rest = consumer.post(f"{G}:receive", content=b"").json()["messages"]  # defaults
        assert [m["msgId"] for m in rest] == ["m2"]
        assert state(consumer) == {"committedOffset": 0, "endOffset": 3, "leased": 3,
                                   "retrying": 0, "deadLettered": 0}

        acked = consumer.post(f"{G}:ack", json={"receipts": [m0["receipt"], rest[0]["receipt"]]})
        assert acked.json() == {"acked": 2, "stale": []}
        assert state(consumer)["committedOffset"] == 1
        assert consumer.get(f"{G}/offset").json() == {"offset": 1}

        # lease expiry: m1 is handed out again, with deliveryCount 2; the old receipt is stale
        live.advance(5_000)
        again = consumer.post(f"{G}:receive", json={}).json()["messages"]
        assert [(m["msgId"], m["deliveryCount"]) for m in again] == [("m1", 2)]
        old = first["messages"][1]["receipt"]
        assert consumer.post(f"{G}:ack", json={"receipts": [old]}).json() == \
            {"acked": 0, "stale": [old]}

        nacked = consumer.post(f"{G}:nack", json={"receipts": [again[0]["receipt"]],
                                                  "delayLevel": 2})
        assert nacked.json() == {"retrying": 1, "deadLettered": 0, "stale": []}
        assert state(consumer)["retrying"] == 1
        assert consumer.post(f"{G}:receive", json={}).json()["messages"] == []
        live.advance(5_000)  # level 2 = 5 s
        (retry,) = consumer.post(f"{G}:receive", json={}).json()["messages"]
        assert (retry["msgId"], retry["offset"], retry["reconsumeTimes"], retry["body"]) == \
            ("m1", 1, 1, "m1")
        assert retry["properties"] == {"n": "1"}

    live_groups = live.broker.groups
    assert live_groups.stats()["orders.g/workers"].redelivered == 1


def test_receive_acknowledges_the_previous_batch_first(live: Live) -> None:
    with live.client(CONSUMER) as consumer, live.client() as c:
        send(c, 3)
        first = consumer.post(f"{G}:receive", json={"max": 2}).json()
        assert "acked" not in first and "stale" not in first  # no ack asked, none answered
        receipts = [m["receipt"] for m in first["messages"]]
        nxt = consumer.post(f"{G}:receive", json={"max": 2, "ack": receipts})
        assert nxt.status_code == 200, nxt.text
        doc = nxt.json()
        assert (doc["acked"], doc["stale"]) == (2, [])
        assert [m["msgId"] for m in doc["messages"]] == ["m2"]
        assert state(consumer)["committedOffset"] == 2  # durable, as :ack
        live.advance(30_000)  # the leases end: the acknowledged two never come back
        again = consumer.post(f"{G}:receive", json={"ack": receipts}).json()
        assert [m["msgId"] for m in again["messages"]] == ["m2"]
        assert (again["acked"], again["stale"]) == (0, receipts)
        for bad in ([], ["not a receipt"] * 1001, "r"):
            r = consumer.post(f"{G}:receive", json={"ack": bad})
            assert r.status_code == 400, (bad, r.text)
        assert state(consumer)["leased"] == 1  # the refused requests leased nothing


def test_dead_letters_after_max_reconsume_times_and_redrive(live_factory: Any) -> None:
    live: Live = live_factory()
    with live.client() as c:
        send(c, 1)
        receipt = c.post(f"{G}:receive", json={}).json()["messages"][0]["receipt"]
        for _ in range(16):
            assert c.post(f"{G}:nack", json={"receipts": [receipt], "delayMs": 0}).json()[
                "retrying"] == 1
            live.broker.drain()
            receipt = c.post(f"{G}:receive", json={}).json()["messages"][0]["receipt"]
        assert c.post(f"{G}:nack", json={"receipts": [receipt]}).json() == \
            {"retrying": 0, "deadLettered": 1, "stale": []}
        live.broker.drain()
        assert state(c)["deadLettered"] == 1
        page = c.get(f"{G}/dead-letters").json()
        assert page["nextOffset"] == 1
        ((letter),) = page["messages"]
        assert (letter["msgId"], letter["body"], letter["reconsumeTimes"], letter["offset"]) \
            == ("m0", "m0", 16, 0)
        assert c.post(f"{G}/dead-letters:redrive", json={}).json() == {"redriven": 1}
        assert state(c)["deadLettered"] == 0
        (back,) = c.post(f"{G}:receive", json={}).json()["messages"]
        assert (back["msgId"], back["reconsumeTimes"]) == ("m0", 0)
        metrics = c.get("/metrics").text
        assert 'hourglass_group_dead_lettered_total{group="orders.g/workers"} 1.0' in metrics
        stats = c.get("/v1/admin/stats").json()["groups"]["orders.g/workers"]
        assert (stats["leased"], stats["retrying"], stats["backlog"]) == (1, 1, 0)


def test_bad_input_is_a_problem_and_changes_nothing(live: Live) -> None:
    with live.client() as c:
        send(c, 2)
        got = c.post(f"{G}:receive", json={"max": 2}).json()["messages"]
        (other,) = c.post("/v1/topics/orders.g/groups/other:receive", json={"max": 1}).json()[
            "messages"]
        before = state(c)
        receipt = got[0]["receipt"]
        cases: list[tuple[str, Any, int]] = [
            (":receive", {"leaseMs": 999}, 400),
            (":receive", {"leaseMs": 43_200_001}, 400),
            (":receive", {"max": 1001}, 400),
            (":receive", {"max": 0}, 400),
            (":receive", {"waitMs": 30_001}, 400),
            (":receive", {"lease_ms": 5000}, 400),
            (":ack", {"receipts": []}, 400),
            (":ack", {"receipts": [receipt] * 1001}, 400),
            (":ack", {"receipts": [receipt, "garbage"]}, 400),
            (":ack", {"receipts": [receipt, forged(receipt)]}, 404),
            (":ack", {"receipts": [receipt, other["receipt"]]}, 404),
            (":ack", {}, 400),
            (":nack", {"receipts": [receipt], "delayMs": 1, "delayLevel": 1}, 400),
            (":nack", {"receipts": [receipt], "delayLevel": 0}, 400),
            (":nack", {"receipts": [receipt], "delayMs": -1}, 400),
            (":nack", {"receipts": [receipt], "delayMs": 11 * 366 * 86_400_000}, 400),
            (":nack", {"receipts": [receipt, other["receipt"]]}, 404),
            ("/dead-letters:redrive", {"max": 0}, 400),
        ]
        for suffix, body, status in cases:
            r = c.post(G + suffix, json=body)
            assert r.status_code == status, (suffix, body, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
            assert r.json()["code"] in ("INVALID_ARGUMENT", "NOT_FOUND", "DELAY_TOO_LONG")
        r = c.post(f"{G}:receive", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400
        assert c.post("/v1/topics/orders.g/groups/bad%20group:receive", json={}).status_code \
            == 400
        assert c.get(f"{G}/dead-letters?max=1001").status_code == 400
        # receipts of another topic
        send(c, 1, topic="orders.h")
        (foreign,) = c.post("/v1/topics/orders.h/groups/workers:receive", json={}).json()[
            "messages"]
        assert c.post(f"{G}:ack", json={"receipts": [foreign["receipt"]]}).status_code == 404
        assert state(c) == before
        assert c.post(f"{G}:ack", json={"receipts": [m["receipt"] for m in got]}).json()[
            "acked"] == 2
    with live.client(CONSUMER) as consumer:
        assert consumer.post("/v1/topics/payments/groups/g:receive", json={}).status_code \
            == 403
    with live.client(None) as anonymous:
        assert anonymous.post(f"{G}:receive", json={}).status_code == 401


def test_receive_long_polls_until_a_delivery(live: Live) -> None:
    import threading

    with live.client() as c:
        answers: list[httpx.Response] = []
        waiter = threading.Thread(target=lambda: answers.append(
            c.post(f"{G}:receive", json={"waitMs": 20_000})))
        waiter.start()
        with live.client() as sender:
            send(sender, 1)
        waiter.join(timeout=20)
        assert [m["msgId"] for m in answers[0].json()["messages"]] == ["m0"]


MEMBER = textwrap.dedent("""
    import json, sys, httpx
    import os, time
    base, token, out = sys.argv[1], sys.argv[2], sys.argv[3]
    G = "/v1/topics/orders.g/groups/workers"
    seen = []
    with httpx.Client(base_url=base, headers={"Authorization": "Bearer " + token},
                      timeout=30) as c:
        assert c.get("/healthz").status_code == 200  # connected before the start
        open(out + ".ready", "w").close()
        while not os.path.exists(os.path.join(os.path.dirname(out), "go")):
            time.sleep(0.01)  # start together (a barrier across processes)
        idle = 0
        while idle < 20:
            got = c.post(G + ":receive", json={"max": 10, "waitMs": 100}).json()["messages"]
            if not got:
                idle += 1
                continue
            idle = 0
            seen += [[m["msgId"], m["reconsumeTimes"]] for m in got]
            fail = [m["receipt"] for m in got
                    if int(m["msgId"][1:]) % 5 == 0 and m["reconsumeTimes"] == 0]
            done = [m["receipt"] for m in got if m["receipt"] not in fail]
            if done:
                assert c.post(G + ":ack", json={"receipts": done}).json()["acked"] == len(done)
            if fail:
                r = c.post(G + ":nack", json={"receipts": fail, "delayMs": 0}).json()
                assert r["retrying"] == len(fail), r
    with open(out, "w") as f:
        json.dump(seen, f)
""")


def test_members_in_separate_processes_share_the_work(live: Live, tmp_path: Path) -> None:
    total = 400
    with live.client() as c:
        send(c, total)
    outs = [tmp_path / f"member{i}.json" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", MEMBER, live.base_url, ADMIN, str(out)],
                              cwd=REPO) for out in outs]
    deadline = time.monotonic() + 60
    while not all(Path(f"{out}.ready").exists() for out in outs):
        assert time.monotonic() < deadline, "the members did not start"
        time.sleep(0.01)
    (tmp_path / "go").touch()
    for p in procs:
        assert p.wait(timeout=120) == 0
    seen = [tuple(x) for out in outs for x in json.loads(out.read_text())]
    # the lease (30 s of fake time) never expires here: each instance was handed out once
    counts = Counter(seen)
    assert max(counts.values()) == 1
    assert {m for m, _ in seen} == {f"m{i}" for i in range(total)}
    assert {m for m, r in seen if r == 1} == {f"m{i}" for i in range(0, total, 5)}
    assert sum(1 for out in outs if json.loads(out.read_text())) >= 2  # work was shared
    with live.client() as c:
        assert state(c) == {"committedOffset": total, "endOffset": total, "leased": 0,
                            "retrying": 0, "deadLettered": 0}
    assert live.broker.end_offset(retry_topic("orders.g", "workers")) == total // 5


def test_msgpack_receive_says_what_json_says(live: Live) -> None:
    """The msgpack answer (transcoded from the stored bytes, the ack's outcome with it) and
    the JSON answer of the same messages, received by two groups, hold the same document;
    a retry (shown as its original) comes back through msgpack as well."""
    import base64

    import msgspec

    with live.client() as c, live.client(CONSUMER) as consumer:
        send(c, 20)
        r = c.post("/v1/topics/orders.g/messages:batch", json={"messages": [
            {"bodyBase64": base64.b64encode(b"\xff\xfe").decode(), "msgId": "binary"}]})
        assert r.status_code == 201, r.text
        as_json = consumer.post(f"{G}:receive", json={"max": 30}).json()
        packed = {"Content-Type": "application/x-msgpack", "Accept": "application/x-msgpack"}
        other = "/v1/topics/orders.g/groups/others"
        r = consumer.post(f"{other}:receive", headers=packed,
                          content=msgspec.msgpack.encode({"max": 30}))
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-msgpack"
        as_msgpack = msgspec.msgpack.decode(r.content)
        assert len(as_msgpack["messages"]) == len(as_json["messages"]) == 21
        first = dict(as_msgpack["messages"][0])
        second = as_msgpack["messages"][1]["receipt"]
        for j, m in zip(as_json["messages"], as_msgpack["messages"], strict=True):
            assert base64.b64decode(j.pop("bodyBase64")) == m.pop("bodyBase64")
            assert j.pop("receipt") and m.pop("receipt")  # (each group its own)
            assert j == m
        assert "body" not in as_msgpack["messages"][-1]  # not UTF-8: bodyBase64 only
        nack = consumer.post(f"{other}:nack", json={"receipts": [first["receipt"]],
                                                     "delayMs": 1000})
        assert nack.status_code == 200 and nack.json()["retrying"] == 1, nack.text
        live.clock.advance(2_000)
        deadline = time.monotonic() + 30
        while True:
            r = consumer.post(f"{other}:receive", headers=packed,
                              content=msgspec.msgpack.encode({"max": 5}))
            assert r.status_code == 200, r.text
            again = msgspec.msgpack.decode(r.content)
            if again["messages"] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        retry = again["messages"][0]
        assert (retry["msgId"], retry["offset"], retry["topic"], retry["reconsumeTimes"],
                retry["properties"]) == (first["msgId"], first["offset"], "orders.g", 1,
                                          first["properties"])
        r = consumer.post(f"{other}:receive", headers=packed,
                          content=msgspec.msgpack.encode({"ack": [second, first["receipt"]]}))
        acked = msgspec.msgpack.decode(r.content)
        assert (acked["messages"], acked["acked"], acked["stale"]) == ([], 1, [first["receipt"]])


# --- issue 32: sealed receipts, bounded answers, bounded groups, quick retries ------------------
MIB = 1 << 20


@pytest.fixture
def start(live_factory: Callable[..., Live]) -> Callable[..., Live]:
    """Servers with ``engine`` settings overridden (each on a data directory of its own,
    unless ``data`` names one: a restart)."""
    return lambda data=None, **engine: live_factory(data=data, engine=engine)


def with_offset(receipt: str, offset: int) -> str:
    """The receipt with its offset (the part after the last dot) replaced."""
    head, tag, _ = receipt.split(".")
    return f"{head}.{tag}.{offset:x}"


def test_a_receipt_with_another_offset_is_404_and_nothing_past_the_end_is_acked(
        live: Live) -> None:
    with live.client(CONSUMER) as consumer, live.client() as c:
        send(c, 3)
        (m0,) = consumer.post(f"{G}:receive", json={"max": 1}).json()["messages"]
        before = state(consumer)
        receipt = m0["receipt"]
        cases = [
            [with_offset(receipt, 1)],  # a message in the log not handed out yet
            [with_offset(receipt, 3)],  # the log's end: nothing there yet
            [with_offset(receipt, 0xFFFF_FFFF)],  # far past the end
            [receipt, with_offset(receipt, 2)],  # a good receipt does not carry a forged one
            [with_offset(receipt, o) for o in range(20_000, 21_000)],  # past the lease window
        ]
        for receipts in cases:
            for verb in (":ack", ":nack"):
                r = consumer.post(f"{G}{verb}", json={"receipts": receipts})
                assert r.status_code == 404, (verb, receipts[:2], r.text)
                assert r.json()["code"] == "NOT_FOUND"
            r = consumer.post(f"{G}:receive", json={"max": 1, "ack": receipts})
            assert r.status_code == 404, r.text
        assert state(consumer) == before  # nothing acknowledged, nothing leased
        assert consumer.get(f"{G}/offset").json() == {"offset": 0}
        # the real receipt still works, and only for its message
        assert consumer.post(f"{G}:ack", json={"receipts": [receipt]}).json() == \
            {"acked": 1, "stale": []}
        got = consumer.post(f"{G}:receive", json={"max": 10}).json()["messages"]
        assert [m["offset"] for m in got] == [1, 2]
        assert consumer.post(f"{G}:ack", json={"receipts": [m["receipt"] for m in got]}).json()[
            "acked"] == 2
        assert state(consumer)["committedOffset"] == 3 == state(consumer)["endOffset"]


def test_an_old_style_receipt_is_404_and_a_receipt_outlives_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with serve(make_settings(data), clock=FakeClock(T0)) as live, live.client() as c:
        send(c, 2)
        got = c.post(f"{G}:receive", json={"max": 2}).json()["messages"]
        head, tag, offset = got[0]["receipt"].split(".")
        old = f"1{head[1:]}.{tag[:12]}.{offset}"  # the shape of an unkeyed version-1 receipt
        assert c.post(f"{G}:ack", json={"receipts": [old]}).status_code == 404
    # the key is kept in the data directory: after a restart the receipts still hold
    with serve(make_settings(data), clock=FakeClock(T0)) as live, live.client() as c:
        assert c.post(f"{G}:ack", json={"receipts": [m["receipt"] for m in got]}).json() == \
            {"acked": 2, "stale": []}
        assert state(c)["committedOffset"] == 2
    # another data directory has another key: the same receipts are not its own
    with serve(make_settings(tmp_path / "other"), clock=FakeClock(T0)) as live, \
            live.client() as c:
        send(c, 2)
        assert len(c.post(f"{G}:receive", json={"max": 2}).json()["messages"]) == 2
        r = c.post(f"{G}:ack", json={"receipts": [got[0]["receipt"]]})
        assert r.status_code == 404, r.text


def test_receive_dead_letters_nack_and_redrive_are_bounded_in_bytes(
        start: Callable[..., Live]) -> None:
    live = start(max_answer_bytes=MIB, max_reconsume_times=0)  # a nack: a dead letter
    with live.client(CONSUMER) as consumer, live.client() as c:
        for i in range(5):
            r = c.post("/v1/topics/orders.g/messages", json={"body": str(i) * 400_000})
            assert r.status_code == 201, r.text
        live.broker.drain()
        batches = []
        for _ in range(3):
            got = consumer.post(f"{G}:receive", json={"max": 10}).json()["messages"]
            batches.append([m["receipt"] for m in got])
        assert [len(b) for b in batches] == [2, 2, 1]  # 1 MiB: two of 400 kB, not three
        # a nack of more than a receive hands out is refused whole
        r = consumer.post(f"{G}:nack", json={"receipts": batches[0] + batches[1]})
        assert r.status_code == 413, r.text
        assert r.json()["code"] == "PAYLOAD_TOO_LARGE"
        assert state(consumer) == {"committedOffset": 0, "endOffset": 5, "leased": 5,
                                   "retrying": 0, "deadLettered": 0}
        for receipts in batches:  # what one receive handed out is nacked in one request
            assert consumer.post(f"{G}:nack", json={"receipts": receipts}).json()[
                "deadLettered"] == len(receipts)
        live.broker.drain()
        assert state(consumer)["deadLettered"] == 5
        page = consumer.get(f"{G}/dead-letters", params={"max": 10}).json()
        assert [len(m["body"]) for m in page["messages"]] == [400_000] * 2
        assert page["nextOffset"] == 2
        page = consumer.get(f"{G}/dead-letters", params={"max": 10, "offset": 2}).json()
        assert [m["offset"] for m in page["messages"]] == [2, 3] and page["nextOffset"] == 4
        assert consumer.post(f"{G}/dead-letters:redrive", json={"max": 10}).json() == \
            {"redriven": 2}
        assert state(consumer)["deadLettered"] == 3


def test_reads_never_create_a_group(live: Live) -> None:
    base = "/v1/topics/orders.g/groups"
    with live.client(CONSUMER) as consumer, live.client() as c:
        send(c, 3)
        for i in range(50):  # reads of groups that do not exist
            g = f"{base}/reader{i}"
            assert state(consumer, g) == {"committedOffset": 0, "endOffset": 3, "leased": 0,
                                          "retrying": 0, "deadLettered": 0}
            page = consumer.get(f"{g}/dead-letters").json()
            assert page == {"messages": [], "nextOffset": 0}
            assert consumer.get(f"{g}/offset").json() == {"offset": 0}
            assert consumer.post(f"{g}/dead-letters:redrive", json={}).json() == {"redriven": 0}
            r = consumer.post(f"{g}:ack", json={"receipts": ["20a.0123456789abcdef.0"]})
            assert r.status_code == 404, r.text
        assert c.get("/v1/admin/stats").json()["groups"] == {}
        assert "reader" not in c.get("/metrics").text
        assert live.broker.groups._groups == {}


def test_max_groups_per_topic_bounds_the_receives_that_make_groups(
        start: Callable[..., Live]) -> None:
    live = start(max_groups_per_topic=2)
    base = "/v1/topics/orders.g/groups"
    with live.client(CONSUMER) as consumer, live.client() as c:
        send(c, 3)
        # receives make groups: two per topic here
        for name in ("a", "b"):
            assert consumer.post(f"{base}/{name}:receive", json={}).status_code == 200
        r = consumer.post(f"{base}/c:receive", json={"max": 1})
        assert r.status_code == 409, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "CONFLICT" and "max_groups_per_topic" in r.json()["detail"]
        r = consumer.post(f"{base}/c:receive", json={"waitMs": 100})  # a long poll as well
        assert r.status_code == 409, r.text
        assert state(consumer, f"{base}/c")["leased"] == 0
        assert consumer.post(f"{base}/a:receive", json={}).status_code == 200  # its own: yes
        send(c, 1, topic="orders.h")  # another topic has its own count
        assert consumer.post("/v1/topics/orders.h/groups/c:receive", json={}).status_code == 200
        # offsets of pull groups are not consumer groups: a commit is not bounded by it
        r = consumer.put(f"{base}/pulls/offset", json={"offset": 1})
        assert r.status_code == 200, r.text
        assert sorted(c.get("/v1/admin/stats").json()["groups"]) == \
            ["orders.g/a", "orders.g/b", "orders.h/c"]


def test_group_metrics_have_a_bounded_label_set_and_one_walk_per_scrape(
        start: Callable[..., Live]) -> None:
    live = start(group_metric_labels=2)
    base = "/v1/topics/orders.g/groups"
    with live.client() as c:
        send(c, 10)
        receipts = {}
        for i in range(5):  # group g0 leases no message, g1 1, ... g4 4
            r = c.post(f"{base}/g{i}:receive", json={"max": max(i, 1)})
            assert r.status_code == 200, r.text
            receipts[i] = [m["receipt"] for m in r.json()["messages"]]
        assert c.post(f"{base}/g0:ack", json={"receipts": receipts[0]}).json()["acked"] == 1
        assert c.post(f"{base}/g3:nack", json={"receipts": receipts[3][:1],
                                               "delayMs": 60_000}).json()["retrying"] == 1
        groups = live.broker.groups
        walks = []
        walk = groups._metric_values
        groups._metric_values = lambda: walks.append(1) or walk()  # type: ignore[method-assign]
        text = c.get("/metrics").text
        assert len(walks) == 1  # the four gauges of a scrape: one walk of the groups
        assert 'hourglass_group_leased{group="orders.g/g0"} 0.0' in text
        assert 'hourglass_group_leased{group="orders.g/g1"} 1.0' in text
        assert 'hourglass_group_leased{group="__other__"} 8.0' in text  # 2 + 2 + 4
        assert 'hourglass_group_backlog{group="__other__"} 29.0' in text  # 10 + 9 + 10
        assert 'hourglass_group_backlog{group="orders.g/g0"} 9.0' in text
        assert 'hourglass_group_retrying{group="__other__"} 1.0' in text
        assert 'hourglass_group_acked_total{group="orders.g/g0"} 1.0' in text
        assert 'hourglass_group_nacked_total{group="__other__"} 1.0' in text
        assert "g2" not in text and "g3" not in text and "g4" not in text
        assert c.get("/metrics").status_code == 200 and len(walks) == 2


def test_a_scrape_does_not_wait_for_a_busy_group(live: Live) -> None:
    with live.client() as c:
        send(c, 2)
        assert len(c.post(f"{G}:receive", json={}).json()["messages"]) == 2
        g = live.broker.groups._groups[("orders.g", "workers")]
        with g.lock:  # (a scrape used to take every group's lock, four times)
            r = c.get("/metrics", timeout=5)
        assert r.status_code == 200
        assert 'hourglass_group_leased{group="orders.g/workers"} 2.0' in r.text


def test_quick_retries_of_a_group_are_rate_bounded(start: Callable[..., Live]) -> None:
    """A consumer-only token cannot grow the log at will by nacking with delayMs 0 and
    redriving: nacks with delayMs < 1 s and redriven dead letters draw on a bucket per group
    (here 2 a second, 3 at once) on the engine clock; past it, 429 and nothing changes."""
    live = start(group_quick_retries_per_s=2, group_quick_retry_burst=3)
    with live.client(CONSUMER) as consumer, live.client() as c:
        send(c, 6)
        got = [m["receipt"] for m in consumer.post(f"{G}:receive", json={"max": 6}).json()[
            "messages"]]
        assert consumer.post(f"{G}:nack", json={"receipts": got[:3], "delayMs": 0}).json()[
            "retrying"] == 3
        before = state(consumer)
        r = consumer.post(f"{G}:nack", json={"receipts": got[3:4], "delayMs": 999})
        assert r.status_code == 429, r.text
        assert r.json()["code"] == "TOO_MANY_REQUESTS" and r.headers["Retry-After"] == "1"
        assert state(consumer) == before  # nothing changed
        # a nack with a delay of a second or more is not a quick one
        assert consumer.post(f"{G}:nack", json={"receipts": got[3:4], "delayMs": 1000}).json()[
            "retrying"] == 1
        live.advance(500)  # one more in half a second
        assert consumer.post(f"{G}:nack", json={"receipts": got[4:5], "delayMs": 0}).json()[
            "retrying"] == 1
        assert consumer.post(f"{G}:nack", json={"receipts": got[5:], "delayMs": 0}
                             ).status_code == 429
        # another group has its own bucket
        other = "/v1/topics/orders.g/groups/other"
        (m,) = consumer.post(f"{other}:receive", json={"max": 1}).json()["messages"]
        assert consumer.post(f"{other}:nack", json={"receipts": [m["receipt"]],
                                                    "delayMs": 0}).status_code == 200


def test_redrives_are_rate_bounded(start: Callable[..., Live]) -> None:
    live = start(group_quick_retries_per_s=1, group_quick_retry_burst=3,
                 max_reconsume_times=0)
    with live.client(CONSUMER) as consumer, live.client() as c:
        send(c, 6)
        got = [m["receipt"] for m in consumer.post(f"{G}:receive", json={"max": 6}).json()[
            "messages"]]
        assert consumer.post(f"{G}:nack", json={"receipts": got}).json()["deadLettered"] == 6
        live.broker.drain()
        assert consumer.post(f"{G}/dead-letters:redrive", json={"max": 10}).json() == \
            {"redriven": 3}
        r = consumer.post(f"{G}/dead-letters:redrive", json={"max": 10})
        assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
        assert state(consumer)["deadLettered"] == 3
        live.advance(2_000)
        assert consumer.post(f"{G}/dead-letters:redrive", json={"max": 10}).json() == \
            {"redriven": 2}


def test_by_default_a_group_makes_at_most_2000_quick_retries_at_once(live: Live) -> None:
    with live.client(CONSUMER) as consumer, live.client() as c:
        for _ in range(3):
            r = c.post("/v1/topics/orders.g/messages:batch", json={"messages": [
                {"body": "x"} for _ in range(1000)]})
            assert r.status_code == 201, r.text
        live.broker.drain()
        codes = []
        for _ in range(3):
            got = consumer.post(f"{G}:receive", json={"max": 1000}).json()["messages"]
            r = consumer.post(f"{G}:nack", json={"receipts": [m["receipt"] for m in got],
                                                 "delayMs": 0})
            codes.append(r.status_code)
        assert codes == [200, 200, 429]
        assert r.headers["Retry-After"] == "10"  # room for 1000 at 100 a second
        live.advance(9_000)
        r = consumer.post(f"{G}:nack", json={"receipts": [m["receipt"] for m in got],
                                             "delayMs": 0})
        assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
        live.advance(1_000)
        assert consumer.post(f"{G}:nack", json={"receipts": [m["receipt"] for m in got],
                                                "delayMs": 0}).status_code == 200


# --- issue 35 target 2: the usual receive in one buffer ----------------------------------------
def test_a_full_receive_in_both_encodings_is_every_message_once_and_acks_whole(
        live: Live) -> None:
    """Receives of 1000 (the usual receive: its answer written from three columns in one
    buffer, api/_native.pyx ``received_msgpack`` / ``received_json``) in msgpack and in
    JSON, each piggybacking the ack of the one before: every message once, in order, with
    its own body, offset and a receipt that acknowledges it; the group ends with every
    message acknowledged and none leased."""
    import msgspec

    body = "b" * 600
    with live.client() as c, live.client(CONSUMER) as consumer:
        for start in range(0, 3000, 1000):
            r = c.post("/v1/topics/orders.g/messages:batch", json={"messages": [
                {"body": f"{i}:{body}", "msgId": f"m{i}"} for i in range(start, start + 1000)]})
            assert r.status_code == 201, r.text
        live.broker.drain()
        packed = {"Content-Type": "application/x-msgpack", "Accept": "application/x-msgpack"}
        seen: list[int] = []
        receipts: list[str] = []
        for turn in range(4):
            ask: dict[str, Any] = {"max": 1000, **({"ack": receipts} if receipts else {})}
            if turn % 2:
                r = consumer.post(f"{G}:receive", json=ask)
                answer = r.json()
            else:
                r = consumer.post(f"{G}:receive", headers=packed,
                                  content=msgspec.msgpack.encode(ask))
                answer = msgspec.msgpack.decode(r.content)
            assert r.status_code == 200, r.text
            assert int(r.headers["content-length"]) == len(r.content)
            if receipts:
                assert (answer["acked"], answer["stale"]) == (len(receipts), [])
            for m in answer["messages"]:
                assert m["body"] == f"{m['offset']}:{body}" and m["msgId"] == f"m{m['offset']}"
                assert (m["deliveryCount"], m["reconsumeTimes"]) == (1, 0)
            seen += [m["offset"] for m in answer["messages"]]
            receipts = [m["receipt"] for m in answer["messages"]]
        assert seen == list(range(3000)) and receipts == []
        assert state(consumer) == {"committedOffset": 3000, "endOffset": 3000, "leased": 0,
                                   "retrying": 0, "deadLettered": 0}
