"""``Prefer: return=minimal`` on sendBatch (RFC 7240): the batch is stored exactly as without
it, and answered with a ``BatchSummary`` (how many, which were duplicates) and the header
``Preference-Applied`` instead of a SendResult per message. Checked through two live servers
on the same fake clock, one asked for the minimal answer and one not, fed the same batches:
body-only ones (the columns path), re-sends, duplicates within a batch, messages due now, both
encodings; and bad input answered 400 with nothing stored either way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest
from starlette.requests import Request

from api.bodies import prefers_minimal
from tests.api.test_columns_send import dump_store
from tests.support.live import ADMIN, T0, Live, serve_twins

TOPIC = "orders.minimal"
MINIMAL = {"Prefer": "return=minimal"}


def request_with(*prefer: str) -> Request:
    headers = [(b"prefer", value.encode()) for value in prefer]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})


@pytest.mark.parametrize(("headers", "minimal"), [
    ((), False),
    (("return=minimal",), True),
    (("Return = \"MINIMAL\"",), True),
    (("respond-async, wait=10, return=minimal",), True),
    (("respond-async", "return=minimal; foo=bar"),  True),  # several Prefer headers
    (("return=representation",), False),
    (("return=representation, return=minimal",), False),  # only the first instance counts
    (("return-minimal",), False),
    (("handling=lenient",), False),
    (("return=minimalist",), False),
])
def test_the_prefer_header_is_read_as_rfc_7240_says(headers: tuple[str, ...],
                                                   minimal: bool) -> None:
    assert prefers_minimal(request_with(*headers)) is minimal


Pair = tuple[Live, Live]  # asked for the minimal answer, and not


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    with serve_twins(tmp_path) as twins:
        yield twins


def post(live: Live, doc: Any, encoding: str, extra: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], Any]:
    if encoding == "msgpack":
        body = msgpack.packb(doc)
        headers = {"Content-Type": "application/x-msgpack", "Accept": "application/x-msgpack"}
    else:
        body, headers = orjson.dumps(doc), {"Content-Type": "application/json"}
    with live.client(ADMIN) as client:
        r = client.post(f"/v1/topics/{TOPIC}/messages:batch", content=body,
                        headers={**headers, **(extra or {})})
    msgpack_answer = r.headers["content-type"] == "application/x-msgpack"
    answer = msgpack.unpackb(r.content) if msgpack_answer else r.json()
    return r.status_code, dict(r.headers), answer


def test_a_minimal_answer_stores_the_same_and_names_the_duplicates(pair: Pair) -> None:
    minimal, full = pair
    later = T0 + 60_000
    steps: list[tuple[str, list[dict[str, Any]]]] = [
        ("json", [{"body": "first", "delayMs": 1000}]),
        ("msgpack", [{"msgId": f"m{i}", "body": f"b{i}", "deliverAt": later + i}
                     for i in range(300)]),  # body-only: stored from columns
        ("json", [{"msgId": f"j{i}", "body": "x", "delayMs": 500 + i} for i in range(20)]),
        ("msgpack", [{"msgId": "m7", "body": "again", "deliverAt": later},  # a re-send
                     {"msgId": "new-1", "body": "new", "deliverAt": later},
                     {"msgId": "m9", "body": "again", "deliverAt": later}]),
        ("json", [{"msgId": "t-1", "body": "twice", "delayMs": 5},
                  {"msgId": "t-1", "body": "twice", "delayMs": 6}]),  # twice in one batch
        ("json", [{"body": "now"}, {"body": "tagged", "tags": "x", "delayMs": 9}]),
    ]
    for k, (encoding, messages) in enumerate(steps):
        doc = {"messages": messages}
        status, headers, summary = post(minimal, doc, encoding, MINIMAL)
        full_status, full_headers, results = post(full, doc, encoding)
        assert status == full_status == 201, f"step {k}"
        assert headers["preference-applied"] == "return=minimal"
        assert "preference-applied" not in full_headers
        assert headers["content-type"] == full_headers["content-type"]
        assert summary == {
            "count": len(messages),
            "duplicates": [i for i, r in enumerate(results["results"]) if r["duplicate"]],
        }, f"step {k}"
    # what the duplicates were, spelled out once
    assert post(minimal, {"messages": steps[3][1]}, "json", MINIMAL)[2] == {
        "count": 3, "duplicates": [0, 1, 2]}
    assert dump_store(minimal.broker) == dump_store(full.broker)
    for live in pair:
        live.advance(120_000)
    for live in pair:  # every message once: nothing stored twice, nothing left out
        stats = live.broker.stats()  # (delivered counts the ones due at once too)
        assert (stats.pending, stats.delivered) == (
            0, 1 + 300 + 20 + 1 + 1 + 2)


def test_return_representation_is_the_default_answer(pair: Pair) -> None:
    minimal, full = pair
    doc = {"messages": [{"msgId": "r1", "body": "x", "delayMs": 1000}]}
    status, headers, answer = post(minimal, doc, "json", {"Prefer": "return=representation"})
    assert status == 201 and "preference-applied" not in headers
    assert answer == post(full, doc, "json")[2]
    assert answer["results"][0]["msgId"] == "r1"


@pytest.mark.parametrize("doc", [
    {"messages": []},
    {"messages": [{"body": "x", "delayMs": -1}]},
    {"messages": [{"body": "ok", "delayMs": 10}, {"bodyBase64": "@@", "delayMs": 10}]},
    {"messages": [{"body": "x", "delayMs": 10}] * 1001},
])
def test_bad_input_is_refused_the_same_and_stores_nothing(pair: Pair, doc: Any) -> None:
    minimal, full = pair
    for encoding in ("json", "msgpack"):
        status, headers, problem = post(minimal, doc, encoding, MINIMAL)
        assert status == 400 and problem["code"] == "INVALID_ARGUMENT"
        assert "preference-applied" not in headers
        full_status, full_headers, full_problem = post(full, doc, encoding)
        assert (full_status, full_problem) == (status, problem)  # refused the same
        assert full_headers["content-type"] == headers["content-type"]
    for live in pair:
        assert live.broker.stats().pending == 0
    assert dump_store(minimal.broker) == dump_store(full.broker)


def test_the_openapi_document_declares_the_preference(pair: Pair) -> None:
    live, _ = pair
    with live.client(None) as client:
        doc = client.get("/openapi.json").json()
    op = doc["paths"]["/v1/topics/{topic}/messages:batch"]["post"]
    (prefer,) = [p for p in op["parameters"] if p["name"] == "Prefer"]
    assert prefer["in"] == "header" and not prefer["required"]
    assert prefer["schema"]["enum"] == ["return=minimal", "return=representation"]
    answers = [{"$ref": "#/components/schemas/BatchResult"},
               {"$ref": "#/components/schemas/BatchSummary"}]
    for media in ("application/json", "application/x-msgpack"):
        assert op["responses"]["201"]["content"][media]["schema"] == {"oneOf": answers}
    summary = doc["components"]["schemas"]["BatchSummary"]
    assert set(summary["required"]) == {"count", "duplicates"}
