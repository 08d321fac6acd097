"""The check-callback pieces that need no engine: URL policy, answers, the HTTP client
(against a real local server), and the persistent registry (real RocksDB)."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path

import httpx
import pytest

from scheduler.checkback.client import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    CheckAnswer,
    CheckbackClient,
    check_payload,
    parse_answer,
)
from scheduler.checkback.policy import host_allowed, validate_callback_url
from scheduler.checkback.registry import CallbackRegistration, CallbackRegistry
from scheduler.clock import FakeClock
from scheduler.model import PendingCheck
from storage.errors import InvalidArgument, NotFound
from storage.rocks import RocksStore
from tests.txn.callback_server import Producer, producer_endpoint

ALLOWED = ("127.0.0.1:*", "*.internal.example:8443", "Checks.Example.COM")


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1", True),
    ("checks.example.com", True),
    ("CHECKS.example.com.", True),
    ("a.internal.example", True),
    ("a.b.internal.example", True),
    ("internal.example", False),  # "*." means subdomains only
    ("evilinternal.example", False),
    ("example.com", False),
    ("127.0.0.2", False),
    ("localhost", False),
])
def test_host_allow_list(host: str, ok: bool) -> None:
    assert host_allowed(host, ALLOWED) is ok


@pytest.mark.parametrize("url", [
    "ftp://127.0.0.1/x",
    "http://user:pw@127.0.0.1/x",
    "http:///x",
    "/relative/path",
    "http://127.0.0.1:99999/x",
    "http://127.0.0.1/x#frag",
    "http://169.254.169.254/latest/meta-data",
    "",
    "http://127.0.0.1/" + "x" * 3000,
])
def test_bad_or_forbidden_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument):
        validate_callback_url(url, ALLOWED)


@pytest.mark.parametrize(("url", "ok"), [
    ("http://checks.example.com/x", True),  # 80
    ("https://checks.example.com/x", True),  # 443
    ("http://svc.internal.example:8443/x", True),  # a port the allow-list names for it
    ("http://checks.example.com:8443/x", False),  # ... for another host only
    ("http://checks.example.com:6379/x", False),  # any other port: refused
    ("https://checks.example.com:22/x", False),
    ("http://127.0.0.1:6379/x", True),  # "127.0.0.1:*": any port of that host
])
def test_port_allow_list(url: str, ok: bool) -> None:
    if ok:
        assert validate_callback_url(url, ALLOWED) == url
    else:
        with pytest.raises(InvalidArgument, match="port"):
            validate_callback_url(url, ALLOWED)


def test_no_allow_list_means_no_callbacks() -> None:
    with pytest.raises(InvalidArgument, match="disabled"):
        validate_callback_url("http://127.0.0.1/x", ())
    assert validate_callback_url("https://a.internal.example:8443/c?x=1", ALLOWED)


def _response(status: int, text: str) -> httpx.Response:
    return httpx.Response(status, text=text)


@pytest.mark.parametrize(("status", "text", "answer"), [
    (200, '{"status": "COMMIT"}', CheckAnswer.COMMIT),
    (200, '{"status": "rollback"}', CheckAnswer.ROLLBACK),
    (200, '{"status": "UNKNOWN"}', CheckAnswer.UNKNOWN),
    (200, '{"status": "COMMIT_MESSAGE"}', CheckAnswer.COMMIT),  # RocketMQ's names
    (200, '{"status": "ROLLBACK_MESSAGE"}', CheckAnswer.ROLLBACK),
    (200, '{"status": "UNKNOW"}', CheckAnswer.UNKNOWN),
    (200, "COMMIT", CheckAnswer.COMMIT),
    (204, "", CheckAnswer.UNKNOWN),
    (200, '{"status": "MAYBE"}', CheckAnswer.UNKNOWN),
    (200, '{"status": 1}', CheckAnswer.UNKNOWN),
    (200, '{"status": "COMMIT"', CheckAnswer.UNKNOWN),
    (200, '["COMMIT"]', CheckAnswer.UNKNOWN),
    (500, '{"status": "COMMIT"}', CheckAnswer.UNKNOWN),
    (302, '{"status": "COMMIT"}', CheckAnswer.UNKNOWN),
])
def test_parse_answer(status: int, text: str, answer: CheckAnswer) -> None:
    assert parse_answer(_response(status, text)) is answer


def _check(tx_id: str = "TX1", body: bytes = b"hello") -> PendingCheck:
    return PendingCheck(transaction_id=tx_id, msg_id="m1", topic="orders",
                            producer_group="pg", check_times=1, prepared_at=1000, body=body,
                            tags="TagA", keys=("k1",), properties={"a": "b"})


def test_payload_carries_the_message() -> None:
    payload = check_payload(_check())
    assert payload == {
        "transactionId": "TX1", "msgId": "m1", "topic": "orders", "producerGroup": "pg",
        "checkTimes": 1, "preparedAt": 1000, "tags": "TagA", "keys": ["k1"],
        "properties": {"a": "b"}, "bodyBase64": "aGVsbG8=", "body": "hello",
    }
    assert "body" not in check_payload(_check(body=b"\xff\xfe"))


def test_client_against_a_real_server() -> None:
    producer = Producer(answers={"C": "COMMIT", "R": "ROLLBACK", "U": "UNKNOWN", "E": "HTTP500",
                                 "S": "SLOW"})
    client = CheckbackClient(timeout_ms=300, workers=2)
    try:
        with producer_endpoint(producer) as url:
            reg = CallbackRegistration(producer_group="pg", url=url)
            assert client.ask(reg, _check("C"), 1) is CheckAnswer.COMMIT
            assert client.ask(reg, _check("R"), 1) is CheckAnswer.ROLLBACK
            assert client.ask(reg, _check("U"), 1) is CheckAnswer.UNKNOWN
            assert client.ask(reg, _check("E"), 1) is CheckAnswer.UNKNOWN
            started = time.monotonic()
            assert client.ask(reg, _check("S"), 1) is CheckAnswer.UNKNOWN  # timed out
            assert time.monotonic() - started < 5
            assert [r["transactionId"] for r in producer.received] == ["C", "R", "U", "E", "S"]
            assert producer.received[0]["body"] == "hello"
            assert SIGNATURE_HEADER.lower() not in producer.headers[0]
        # nobody listening any more: connection refused is UNKNOWN, not an exception
        assert client.ask(reg, _check("C"), 1) is CheckAnswer.UNKNOWN
    finally:
        client.close()


def test_signed_callbacks_verify() -> None:
    producer = Producer(default="COMMIT")
    secret = "s3cret-s3cret-s3cret"
    client = CheckbackClient(timeout_ms=2_000, workers=1)
    try:
        with producer_endpoint(producer) as url:
            reg = CallbackRegistration(producer_group="pg", url=url, secret=secret)
            assert client.ask(reg, _check(), 1_700_000_000_123) is CheckAnswer.COMMIT
    finally:
        client.close()
    headers = producer.headers[0]
    assert headers[TIMESTAMP_HEADER.lower()] == "1700000000123"
    # the receiver's side: recompute over the raw body it received
    import orjson
    body = orjson.dumps(check_payload(_check()))
    expected = "sha256=" + hmac.new(secret.encode(), b"1700000000123." + body,
                                    hashlib.sha256).hexdigest()
    assert headers[SIGNATURE_HEADER.lower()] == expected


def test_registry_persists_and_validates(tmp_path: Path) -> None:
    clock = FakeClock()
    store = RocksStore(tmp_path / "db", timer_shards=1)
    try:
        registry = CallbackRegistry(store, ALLOWED, clock)
        reg = registry.register("pg-1", "http://127.0.0.1:9/x")
        assert reg.registered_at == clock.now_ms()
        registry.register("pg-2", "https://a.internal.example/y", secret="0123456789abcdef")
        for bad in (("pg-3", "http://evil.example/x", None),
                    ("bad group", "http://127.0.0.1/", None),
                    ("pg-3", "http://127.0.0.1/", "short")):
            with pytest.raises(InvalidArgument):
                registry.register(*bad)
        with pytest.raises(NotFound):
            registry.get("pg-3")
        registry.register("pg-1", "http://127.0.0.1:10/z")  # replaces
    finally:
        store.close()
    store = RocksStore(tmp_path / "db", timer_shards=1)
    try:
        registry = CallbackRegistry(store, ALLOWED, clock)
        assert sorted(registry.snapshot()) == ["pg-1", "pg-2"]
        assert registry.get("pg-1").url == "http://127.0.0.1:10/z"
        assert registry.get("pg-2").secret == "0123456789abcdef"
        assert registry.delete("pg-1").url == "http://127.0.0.1:10/z"
        with pytest.raises(NotFound):
            registry.delete("pg-1")
    finally:
        store.close()
    store = RocksStore(tmp_path / "db", timer_shards=1)
    try:
        assert sorted(CallbackRegistry(store, ALLOWED, clock).snapshot()) == ["pg-2"]
    finally:
        store.close()
