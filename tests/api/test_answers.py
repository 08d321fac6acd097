"""Big answers made piece by piece (api/answers.py), over real HTTP: a pull whose bodies pass
``PIECEWISE_FROM`` answers exactly the bytes of the answer made at once (JSON, msgpack,
``Prefer: body=once``), chunked, and small answers keep their ``Content-Length``."""

from __future__ import annotations

import base64
import os

import msgspec
import pytest

from api.answers import PIECE_BYTES, PIECEWISE_FROM, pieces
from api.routes.consume import pull_msgpack, pull_result
from tests.support.live import ADMIN, Live

TOPIC = "orders.big"


def test_pieces_cover_every_item_once_in_order() -> None:
    assert pieces([]) == []
    assert pieces([5], 10) == [(0, 1)]
    assert pieces([4, 4, 4, 4, 20, 1], 10) == [(0, 3), (3, 5), (5, 6)]


@pytest.mark.parametrize(("accept", "once"), [
    ("application/json", False), ("application/json", True),
    ("application/x-msgpack", False), ("application/x-msgpack", True)])
def test_a_big_pull_answers_the_bytes_made_at_once(shared_live: Live, accept: str,
                                                   once: bool) -> None:
    live = shared_live
    with live.client(ADMIN) as c:
        if not c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": 0}).json()["messages"]:
            # text and binary bodies, 3 MiB in all: several pieces
            messages = [{"bodyBase64": base64.b64encode(os.urandom(20_000)).decode()}
                        if i % 3 == 0 else {"body": f"text {i} " + "x" * 20_000}
                        for i in range(150)]
            assert c.post(f"/v1/topics/{TOPIC}/messages:batch",
                          json={"messages": messages}).status_code == 201
            live.broker.drain()
        headers = {"Accept": accept, **({"Prefer": "body=once"} if once else {})}
        r = c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": 1, "max": 1000},
                  headers=headers)
        assert r.status_code == 200
        payloads = live.broker.read(TOPIC, 1, 1000)
        assert len(payloads) == 149 and sum(map(len, payloads)) > PIECEWISE_FROM + PIECE_BYTES
        if "msgpack" in accept:
            whole = pull_msgpack(payloads, 1, once)
        else:
            whole = msgspec.json.encode(pull_result(payloads, 1, once))
        assert r.content == whole
        assert r.headers["content-type"].startswith(accept)
        assert "content-length" not in r.headers  # (chunked)
        assert r.headers.get("preference-applied") == ("body=once" if once else None)
        small = c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": 1, "max": 3},
                      headers=headers)
        assert int(small.headers["content-length"]) == len(small.content)


def test_a_big_receive_answers_the_bytes_made_at_once(shared_live: Live) -> None:
    """Made piece by piece by its documents' own encoder (api/routes/groups.py): the same
    JSON as at once, every message leased once."""
    live = shared_live
    topic = "orders.bigreceive"
    with live.client(ADMIN) as c:
        messages = [{"msgId": f"r{i}", "body": f"text {i} " + "y" * 20_000} for i in range(120)]
        assert c.post(f"/v1/topics/{topic}/messages:batch",
                      json={"messages": messages}).status_code == 201
        live.broker.drain()
        r = c.post(f"/v1/topics/{topic}/groups/g:receive", json={"max": 1000})
        assert r.status_code == 200
        assert "content-length" not in r.headers  # (chunked)
        doc = msgspec.json.decode(r.content)
        assert [m["msgId"] for m in doc["messages"]] == [f"r{i}" for i in range(120)]
        assert r.content == msgspec.json.encode(doc)  # (compact, as msgspec writes it)
        assert set(doc) == {"messages", "leaseUntil"} and doc["leaseUntil"] > 0
        assert all(m["deliveryCount"] == 1 and m["receipt"] for m in doc["messages"])
        again = c.post(f"/v1/topics/{topic}/groups/g:receive", json={"max": 1000}).json()
        assert again["messages"] == []  # all leased
