"""Issue 32, finding 7 (the low ones), over real HTTP: hot-route integers take ASCII digits
only, ``/metrics`` may require a token, ``/docs`` runs under a strict Content-Security-Policy.
Each test here failed on the code before its fix."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.live import ADMIN, CONSUMER, Live


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    doc: dict[str, Any] = response.json()
    assert doc["code"] == code, doc
    return doc


# percent-encoded, as a client sends them: '+' would otherwise arrive as a space
NOT_ASCII_INTEGERS = ("%2B1_0", "1_0", "%2B3", "%207", "7%20", "%D9%A3",  # ARABIC-INDIC THREE
                      "%EF%BC%93", "3.0", "0x3", "")  # FULLWIDTH THREE


@pytest.mark.parametrize("path", [
    "/v1/topics/orders.a/messages?offset={}",
    "/v1/topics/orders.a/messages?offset=0&max={}",
    "/v1/topics/orders.a/messages?offset=0&waitMs={}",
    "/v1/topics/orders.a/groups/g/dead-letters?offset={}",
    "/v1/topics/orders.a/messages:stream?offset=0&durationMs={}",
])
def test_hot_route_integers_are_ascii_digits_only(shared_live: Live, path: str) -> None:
    with shared_live.client(CONSUMER) as client:
        for raw in NOT_ASCII_INTEGERS:
            doc = problem(client.get(path.format(raw)), 400, "INVALID_ARGUMENT")
            assert "ASCII digits" in doc["detail"], (raw, doc)
        doc = problem(client.get(path.format("-1")), 400, "INVALID_ARGUMENT")  # a number, refused
        assert "between" in doc["detail"], doc
        doc = problem(client.get(path.format("9" * 400)), 400, "INVALID_ARGUMENT")
        assert "between" in doc["detail"] and len(doc["detail"]) < 200, doc


def test_hot_route_integers_in_ascii_digits_still_work(shared_live: Live) -> None:
    with shared_live.client(ADMIN) as admin:
        assert admin.post("/v1/topics/orders.b/messages",
                          json={"body": "x", "msgId": "m1"}).status_code == 201
        shared_live.broker.drain()
        r = admin.get("/v1/topics/orders.b/messages?offset=000&max=0010&waitMs=0")
        assert r.status_code == 200, r.text
        assert [m["msgId"] for m in r.json()["messages"]] == ["m1"]
