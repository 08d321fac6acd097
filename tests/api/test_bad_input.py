"""Bad input: each case gets the right 4xx problem document and stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson
import pytest

from scheduler.clock import FakeClock
from tests.api.test_http_contract import problem
from tests.support.live import T0, Live, make_settings, serve

TOPIC = "orders.bad"
MAX_BODY = 64 * 1024
MAX_REQUEST = 1 << 20
GOOD: dict[str, Any] = {"body": "fine"}


@pytest.fixture(scope="module")
def small_limits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    settings = make_settings(tmp_path_factory.mktemp("bad") / "data",
                             max_request_bytes=MAX_REQUEST)
    settings = replace(settings, engine=replace(settings.engine, max_body_bytes=MAX_BODY))
    with serve(settings, clock=FakeClock(T0)) as server:
        yield server


def stored(live: Live) -> tuple[Any, ...]:
    stats = live.broker.stats()
    return (stats.pending, stats.scheduled, stats.delivered,
            live.broker.end_offset(TOPIC))


# (id, path suffix or None for the topic's send path, raw body, status, code)
CASES: list[tuple[str, str | None, bytes, int, str]] = [
    ("malformed-json", None, b'{"body": "x"', 400, "INVALID_ARGUMENT"),
    ("not-an-object", None, b'["body"]', 400, "INVALID_ARGUMENT"),
    ("empty-body", None, b"", 400, "INVALID_ARGUMENT"),
    ("invalid-utf8", None, b'{"body": "\xff"}', 400, "INVALID_ARGUMENT"),
    ("body-wrong-type", None, b'{"body": 5}', 400, "INVALID_ARGUMENT"),
    ("delay-wrong-type", None, b'{"body": "x", "delayMs": "10"}', 400, "INVALID_ARGUMENT"),
    ("delay-float", None, b'{"body": "x", "delayMs": 1.5}', 400, "INVALID_ARGUMENT"),
    ("keys-wrong-type", None, b'{"body": "x", "keys": "k"}', 400, "INVALID_ARGUMENT"),
    ("property-not-string", None, b'{"body": "x", "properties": {"a": 1}}', 400,
     "INVALID_ARGUMENT"),
    ("both-bodies", None, b'{"body": "x", "bodyBase64": "eA=="}', 400, "INVALID_ARGUMENT"),
    ("no-body", None, b'{"tags": "t"}', 400, "INVALID_ARGUMENT"),
    ("bad-base64", None, b'{"bodyBase64": "***"}', 400, "INVALID_ARGUMENT"),
    ("two-timing-fields", None, b'{"body": "x", "delayMs": 5, "delayLevel": 2}', 400,
     "INVALID_ARGUMENT"),
    ("three-timing-fields", None,
     b'{"body": "x", "delayMs": 5, "delayLevel": 2, "deliverAt": 1}', 400,
     "INVALID_ARGUMENT"),
    ("negative-delay", None, b'{"body": "x", "delayMs": -1}', 400, "INVALID_ARGUMENT"),
    ("huge-delay", None, b'{"body": "x", "delayMs": 1000000000000000}', 400,
     "DELAY_TOO_LONG"),
    ("huge-deliver-at", None, b'{"body": "x", "deliverAt": 100000000000000000000000}', 400,
     "DELAY_TOO_LONG"),
    ("level-zero", None, b'{"body": "x", "delayLevel": 0}', 400, "INVALID_ARGUMENT"),
    ("bad-level-property", None, b'{"body": "x", "properties": {"DELAY": "soon"}}', 400,
     "INVALID_ARGUMENT"),
    ("unknown-field", None, b'{"body": "x", "delay_ms": 5}', 400, "INVALID_ARGUMENT"),
    ("bad-msg-id", None, b'{"body": "x", "msgId": "a b"}', 400, "INVALID_ARGUMENT"),
    ("long-msg-id", None, orjson.dumps({"body": "x", "msgId": "m" * 129}), 400,
     "INVALID_ARGUMENT"),
    ("oversize-body", None, orjson.dumps({"body": "x" * (MAX_BODY + 1)}), 413,
     "PAYLOAD_TOO_LARGE"),
    ("oversize-base64-body", None,
     orjson.dumps({"bodyBase64": "eHh4" * (MAX_BODY // 3 + 1)}), 413, "PAYLOAD_TOO_LARGE"),
    ("oversize-request", None, orjson.dumps({"body": "x", "tags": "t" * MAX_REQUEST}), 413,
     "PAYLOAD_TOO_LARGE"),
    ("bad-topic", "/v1/topics/bad%20topic/messages", orjson.dumps(GOOD), 400,
     "TOPIC_INVALID"),
    ("long-topic", f"/v1/topics/{'t' * 128}/messages", orjson.dumps(GOOD), 400,
     "TOPIC_INVALID"),
    ("system-topic", "/v1/topics/SCHEDULE_TOPIC_XXXX/messages", orjson.dumps(GOOD), 400,
     "TOPIC_INVALID"),
    ("system-topic-trans", "/v1/topics/TRANS_CHECK_MAX_TIME_TOPIC/messages",
     orjson.dumps(GOOD), 400, "TOPIC_INVALID"),
    ("system-topic-prefix", "/v1/topics/rmq_sys_x/messages", orjson.dumps(GOOD), 400,
     "TOPIC_INVALID"),
    ("system-topic-underscores", "/v1/topics/__x/messages", orjson.dumps(GOOD), 400,
     "TOPIC_INVALID"),
    ("batch-over-1000", f"/v1/topics/{TOPIC}/messages:batch",
     orjson.dumps({"messages": [GOOD] * 1001}), 400, "INVALID_ARGUMENT"),
    ("batch-empty", f"/v1/topics/{TOPIC}/messages:batch", b'{"messages": []}', 400,
     "INVALID_ARGUMENT"),
    ("batch-one-bad-schema", f"/v1/topics/{TOPIC}/messages:batch",
     orjson.dumps({"messages": [GOOD, GOOD, {"body": 1}]}), 400, "INVALID_ARGUMENT"),
    ("batch-one-both-bodies", f"/v1/topics/{TOPIC}/messages:batch",
     orjson.dumps({"messages": [GOOD, {"body": "x", "bodyBase64": "eA=="}]}), 400,
     "INVALID_ARGUMENT"),
    ("batch-one-too-late", f"/v1/topics/{TOPIC}/messages:batch",
     orjson.dumps({"messages": [GOOD, {"body": "x", "delayMs": 10**15}]}), 400,
     "DELAY_TOO_LONG"),
    ("batch-one-oversize", f"/v1/topics/{TOPIC}/messages:batch",
     orjson.dumps({"messages": [GOOD, {"body": "x" * (MAX_BODY + 1)}]}), 413,
     "PAYLOAD_TOO_LARGE"),
    ("batch-system-topic", "/v1/topics/__sys/messages:batch",
     orjson.dumps({"messages": [GOOD]}), 400, "TOPIC_INVALID"),
    ("batch-malformed-msgpack", f"/v1/topics/{TOPIC}/messages:batch", b"\xc1\xc1", 400,
     "INVALID_ARGUMENT"),
    ("offset-negative", f"/v1/topics/{TOPIC}/groups/g/offset", b'{"offset": -1}', 400,
     "INVALID_ARGUMENT"),
    ("prepare-without-group", f"/v1/topics/{TOPIC}/transactions", orjson.dumps(GOOD), 400,
     "INVALID_ARGUMENT"),
]


@pytest.mark.parametrize(("path", "raw", "status", "code"),
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_bad_input_is_refused_and_stores_nothing(
    small_limits: Live, path: str | None, raw: bytes, status: int, code: str
) -> None:
    live = small_limits
    before = stored(live)
    content_type = ("application/x-msgpack" if raw.startswith(b"\xc1")
                    else "application/json")
    method = "PUT" if path and path.endswith("/offset") else "POST"
    with live.client(headers={"Content-Type": content_type}) as c:
        response = c.request(method, path or f"/v1/topics/{TOPIC}/messages", content=raw)
    problem(response, status, code)
    live.broker.drain()
    assert stored(live) == before
    assert live.broker.groups.offset(TOPIC, "g") == 0


def test_chunked_oversize_request_is_413(small_limits: Live) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"body": "'
        for _ in range(MAX_REQUEST // 65536 + 2):
            yield b"x" * 65536
        yield b'"}'

    before = stored(small_limits)
    with small_limits.client(headers={"Content-Type": "application/json"}) as c:
        problem(c.post(f"/v1/topics/{TOPIC}/messages", content=chunks()), 413,
                "PAYLOAD_TOO_LARGE")
    assert stored(small_limits) == before


def test_good_input_still_works_after_all_that(small_limits: Live) -> None:
    with small_limits.client() as c:
        assert c.post(f"/v1/topics/{TOPIC}/messages", json=GOOD).status_code == 201
        assert c.post(f"/v1/topics/{TOPIC}/messages",
                      json={"body": "x" * MAX_BODY}).status_code == 201  # at the limit
