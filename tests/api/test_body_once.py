"""``Prefer: body=once`` on the answers that carry delivered messages (pull, receive, dead
letters): each message carries its body once, as ``body`` when it is UTF-8 text, else as
``bodyBase64``, and the answer says ``Preference-Applied: body=once``. Everything else in the
answer is what the default answer holds. Checked over real HTTP, in JSON and in msgpack, with
text and binary bodies; the compiled encoder against the Python one is
tests/storage/test_native.py."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import msgpack
import pytest

from api.bodies import prefers_body_once
from tests.api.test_prefer_minimal import request_with
from tests.support.live import ADMIN, Live

TOPIC = "orders.once"
TEXT, BINARY = "plain text, ünïcode", b"\xff\xfe\x00 not utf-8"
ONCE = {"Prefer": "body=once"}
MSGPACK = {"Accept": "application/x-msgpack"}


@pytest.mark.parametrize(("headers", "once"), [
    ((), False),
    (("body=once",), True),
    (("Body = \"ONCE\"",), True),
    (("return=minimal, body=once",), True),
    (("respond-async", "body=once; x=y"), True),  # several Prefer headers
    (("body=twice",), False),
    (("body=both, body=once",), False),  # only the first instance counts
    (("body-once",), False),
])
def test_the_preference_is_read_as_rfc_7240_says(headers: tuple[str, ...], once: bool) -> None:
    assert prefers_body_once(request_with(*headers)) is once


def decode(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    if r.headers["content-type"] == "application/x-msgpack":
        doc: dict[str, Any] = msgpack.unpackb(r.content)
        return doc
    doc = r.json()
    for m in doc["messages"]:  # JSON carries the bytes in base64
        if "bodyBase64" in m:
            m["bodyBase64"] = base64.b64decode(m["bodyBase64"])
    return doc


def check_pair(full: httpx.Response, once: httpx.Response, bodies: dict[str, bytes]) -> None:
    """``once`` holds what ``full`` holds, each body once; only it says the preference."""
    assert "preference-applied" not in full.headers
    assert once.headers["preference-applied"] == "body=once"
    a, b = decode(full), decode(once)
    assert [m["msgId"] for m in a["messages"]] == [m["msgId"] for m in b["messages"]]
    assert sorted(m["msgId"] for m in a["messages"]) == sorted(bodies)
    for m, lean in zip(a["messages"], b["messages"], strict=True):
        body = bodies[m["msgId"]]
        assert m["bodyBase64"] == body  # the default: the bytes always, the text beside them
        assert ("body" in m) is (body == TEXT.encode())
        if "body" in m:
            assert m["body"] == TEXT and "bodyBase64" not in lean and lean["body"] == TEXT
        else:
            assert "body" not in lean and lean["bodyBase64"] == body
        rest = {k: v for k, v in m.items() if k not in ("body", "bodyBase64", "receipt")}
        assert rest == {k: v for k, v in lean.items()
                        if k not in ("body", "bodyBase64", "receipt")}
    rest_a = {k: v for k, v in a.items() if k != "messages"}
    assert rest_a == {k: v for k, v in b.items() if k != "messages"}


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_pull_and_receive_carry_each_body_once(live: Live, encoding: str) -> None:
    accept = MSGPACK if encoding == "msgpack" else {}
    with live.client(ADMIN, headers=accept) as c:
        r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": [
            {"msgId": "text", "body": TEXT},
            {"msgId": "bytes", "bodyBase64": base64.b64encode(BINARY).decode()},
            {"msgId": "later", "body": TEXT, "delayMs": 1000}]})
        assert r.status_code == 201, r.text
        live.advance(1000)
        bodies = {"text": TEXT.encode(), "bytes": BINARY, "later": TEXT.encode()}
        pull = f"/v1/topics/{TOPIC}/messages?offset=0&max=10"
        check_pair(c.get(pull), c.get(pull, headers=ONCE), bodies)
        # a long poll answers the same way
        check_pair(c.get(pull + "&waitMs=50"), c.get(pull + "&waitMs=50", headers=ONCE), bodies)
        # two groups, each leasing all three: the same messages, the same counts
        full = c.post(f"/v1/topics/{TOPIC}/groups/a:receive", json={"max": 10})
        once = c.post(f"/v1/topics/{TOPIC}/groups/b:receive", json={"max": 10}, headers=ONCE)
        check_pair(full, once, bodies)
        # with the previous batch acknowledged in the same request (acked and stale answered)
        receipts = [m["receipt"] for m in decode(once)["messages"]]
        again = c.post(f"/v1/topics/{TOPIC}/groups/b:receive",
                       json={"ack": receipts, "waitMs": 0}, headers=ONCE)
        assert again.headers["preference-applied"] == "body=once"
        assert {k: v for k, v in decode(again).items() if k != "leaseUntil"} == \
            {"messages": [], "acked": 3, "stale": []}


def test_dead_letters_carry_each_body_once(live: Live) -> None:
    group = f"/v1/topics/{TOPIC}/groups/dead"
    with live.client(ADMIN) as c:
        r = c.post(f"/v1/topics/{TOPIC}/messages:batch", json={"messages": [
            {"msgId": "text", "body": TEXT},
            {"msgId": "bytes", "bodyBase64": base64.b64encode(BINARY).decode()}]})
        assert r.status_code == 201, r.text
        for _ in range(17):  # 16 retries, then the dead-letter queue
            receipts = [m["receipt"] for m in c.post(f"{group}:receive", json={"max": 10}
                                                     ).json()["messages"]]
            assert len(receipts) == 2
            c.post(f"{group}:nack", json={"receipts": receipts, "delayMs": 0})
            live.broker.drain()
        assert c.get(group).json()["deadLettered"] == 2
        bodies = {"text": TEXT.encode(), "bytes": BINARY}
        for accept in ({}, MSGPACK):
            check_pair(c.get(f"{group}/dead-letters", headers=accept),
                       c.get(f"{group}/dead-letters", headers={**accept, **ONCE}), bodies)


def test_the_openapi_document_offers_the_preference(live: Live) -> None:
    with live.client(ADMIN) as c:
        doc = c.get("/openapi.json").json()
    for path, method in (("/v1/topics/{topic}/messages", "get"),
                         ("/v1/topics/{topic}/groups/{group}:receive", "post"),
                         ("/v1/topics/{topic}/groups/{group}/dead-letters", "get")):
        prefer = [p for p in doc["paths"][path][method]["parameters"] if p["name"] == "Prefer"]
        assert [p["schema"]["enum"] for p in prefer] == [["body=once"]], path
    delivered = doc["components"]["schemas"]["Delivered"]
    assert "bodyBase64" in delivered["properties"]
    assert "bodyBase64" not in delivered["required"]  # absent with body=once and a text body
