"""The send path's common case, a batch of body-only messages (bodies due later, nothing else),
is stored from columns built in C (``Intake.columns``, ``WritePaths.submit_columns``) and answered
from them (``api._native.scheduled_answer``). It must store, count and answer exactly what
the general path (``Intake.prepare``, ``WritePaths.submit``) does, and leave every other batch
to it: checked column by column, answer by answer, and through two live servers, one with the
columns path and one without, fed the same requests on the same fake clock."""

from __future__ import annotations

import base64
import dataclasses
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import UNSET

from api.native import native as api_native
from api.schemas import BatchIn, MessageIn
from scheduler import model
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.codec import cancel_handles, scheduled_values
from scheduler.intake import ColumnBatch, Intake
from scheduler.levels import DelayLevels
from scheduler.model import SendRequest
from scheduler.native import native
from storage.constants import CF_EXPIRY, CF_INDEX, CF_META, timer_cf
from storage.records import MessageStatus
from tests.support.engine import make_config, read_topic
from tests.support.live import ADMIN, T0, Live, serve_twins

needs_native = pytest.mark.skipif(native is None or api_native is None,
                                  reason="scheduler/_native or api/_native is not built")

NOW = 1_800_000_000_000
MAX_DELAY = 40 * 86_400_000
MAX_BODY = 512
TOPIC = "columns.orders"

msg_ids = st.from_regex(r"\A[A-Za-z0-9_.:-]{1,40}\Z")
bodies = st.one_of(st.text(max_size=40).map(lambda t: {"body": t}),
                   st.binary(max_size=40).map(lambda b: {"body_base64": b}))
timings = st.one_of(st.integers(NOW + 1, NOW + MAX_DELAY).map(lambda at: {"deliver_at": at}),
                    st.integers(1, MAX_DELAY).map(lambda d: {"delay_ms": d}))
body_only_messages = st.builds(lambda body, timing, msg_id: MessageIn(
    **body, **timing, **({} if msg_id is None else {"msg_id": msg_id})),
    bodies, timings, st.none() | msg_ids)


def new_intake() -> Intake:
    return Intake(levels=DelayLevels.parse("1s 5s 10s"), max_delay_ms=MAX_DELAY,
                  max_body_bytes=MAX_BODY, shards=4)


def request_of(m: MessageIn) -> SendRequest:
    from api.bodies import to_send_request
    return to_send_request(m, TOPIC)


@needs_native
@settings(max_examples=150, deadline=None)
@given(st.lists(body_only_messages, min_size=1, max_size=30))
def test_plain_columns_are_what_prepare_makes(messages: list[MessageIn]) -> None:
    intake = new_intake()
    intake.prepare(request_of(messages[0]), NOW)  # the topic is known once sent to
    intake._ids._counter = itertools.count(7)  # the same generated ids on both paths
    columns = intake.columns(TOPIC, messages, NOW, UNSET)
    assert columns is not None
    intake._ids._counter = itertools.count(7)
    prepared = [intake.prepare(request_of(m), NOW) for m in messages]
    stored = scheduled_values(prepared, NOW)
    assert columns.topic == TOPIC and columns.shard == prepared[0].shard
    assert columns.msg_ids == [p.msg_id for p in prepared]
    assert columns.deliver_ats == [p.deliver_at for p in prepared]
    assert columns.timer_keys == [p.timer_key for p in prepared]
    assert columns.index_keys == [p.index_key for p in prepared]
    assert [(v, e) for v, e in zip(columns.values, columns.entries, strict=True)] == stored
    assert columns.given == [p.index_key for p in prepared if not p.generated_id]


@needs_native
@settings(max_examples=150, deadline=None)
@given(st.lists(body_only_messages, min_size=1, max_size=30), st.booleans())
def test_plain_columns_from_msgpack_bytes_are_the_same(messages: list[MessageIn],
                                                       by_msgspec: bool) -> None:
    """Read straight from a msgpack body (as msgspec or msgpack-python writes it), the same
    columns as from the decoded messages."""
    intake = new_intake()
    intake.prepare(request_of(messages[0]), NOW)
    doc = BatchIn(messages=messages)
    raw = msgspec.msgpack.encode(doc) if by_msgspec else msgpack.packb(
        msgspec.to_builtins(doc, builtin_types=(bytes,)))
    intake._ids._counter = itertools.count(7)
    from_bytes = intake.columns(TOPIC, raw, NOW, max_count=1000)
    intake._ids._counter = itertools.count(7)
    assert from_bytes is not None
    assert from_bytes.msg_ids is None  # no str made: each msgId is read from its index key
    assert with_ids(from_bytes) == intake.columns(TOPIC, messages, NOW, UNSET)
    assert intake.columns(TOPIC, raw, NOW, max_count=len(messages) - 1) is None  # too many


def with_ids(columns: ColumnBatch) -> ColumnBatch:
    """``columns`` with its msgIds column made (``ColumnBatch.ids``)."""
    return dataclasses.replace(columns, msg_ids=columns.ids())


def escapes(text: str) -> bool:
    """Whether JSON writes ``text`` with an escape (a quote, a backslash, a control)."""
    return any(c in '"\\' or ord(c) < 0x20 for c in text)


@needs_native
@settings(max_examples=150, deadline=None)
@given(st.lists(body_only_messages, min_size=1, max_size=30), st.booleans())
def test_columns_from_json_bytes_are_the_same(messages: list[MessageIn],
                                                    by_msgspec: bool) -> None:
    """Read straight from a JSON body (as msgspec or orjson writes it), the same columns as
    from the decoded messages; a body in base64, or a string JSON escapes, is left to the
    schema's decoder (None)."""
    intake = new_intake()
    intake.prepare(request_of(messages[0]), NOW)
    doc = BatchIn(messages=messages)
    raw = msgspec.json.encode(doc) if by_msgspec else orjson.dumps(msgspec.to_builtins(doc))
    intake._ids._counter = itertools.count(7)
    from_bytes = intake.columns(TOPIC, raw, NOW, max_count=1000, json=True)
    intake._ids._counter = itertools.count(7)
    if any(m.body is UNSET or escapes(m.body) for m in messages):
        assert from_bytes is None
        return
    assert from_bytes is not None
    assert from_bytes.msg_ids is None
    decoded = msgspec.json.decode(raw, type=BatchIn).messages
    assert with_ids(from_bytes) == intake.columns(TOPIC, decoded, NOW, UNSET)
    assert intake.columns(TOPIC, raw, NOW, max_count=len(messages) - 1, json=True) is None


GOOD_JSON = '{"body":"x","delayMs":5}'
NOT_PLAIN_JSON: list[tuple[str, str]] = [
    ("unknown key", '{"body":"x","delayMs":5,"foo":1}'),
    ("tags", '{"body":"x","delayMs":5,"tags":"t"}'),
    ("null msgId", '{"body":"x","delayMs":5,"msgId":null}'),
    ("msgId with a space", '{"body":"x","delayMs":5,"msgId":"a b"}'),
    ("msgId of 129", '{"body":"x","delayMs":5,"msgId":"' + "a" * 129 + '"}'),
    ("msgId escaped", '{"body":"x","delayMs":5,"msgId":"\\u0061"}'),
    ("negative delay", '{"body":"x","delayMs":-5}'),
    ("float delay", '{"body":"x","delayMs":5.0}'),
    ("exponent", '{"body":"x","delayMs":5e3}'),
    ("leading zero", '{"body":"x","delayMs":05}'),
    ("19 digits", '{"body":"x","deliverAt":1000000000000000000}'),
    ("delay as a string", '{"body":"x","delayMs":"5"}'),
    ("a key twice", '{"body":"x","delayMs":5,"delayMs":6}'),
    ("both bodies", '{"body":"x","bodyBase64":"eA==","delayMs":5}'),
    ("base64 body", '{"bodyBase64":"eA==","delayMs":5}'),
    ("escaped body", '{"body":"a\\nb","delayMs":5}'),
    ("raw control in body", '{"body":"a\tb","delayMs":5}'),
    ("escaped key", '{"\\u0062ody":"x","delayMs":5}'),
    ("no timing", '{"body":"x"}'),
    ("both timings", '{"body":"x","delayMs":5,"deliverAt":5}'),
    ("not an object", '["x"]'),
    ("trailing comma", '{"body":"x","delayMs":5,}'),
    ("missing colon", '{"body" "x","delayMs":5}'),
    ("cut short", '{"body":"x","delayMs":5'),
]


def json_batch(*messages: str, head: str = '{"messages":[', tail: str = "]}") -> bytes:
    return (head + ",".join(messages) + tail).encode()


NOT_PLAIN_JSON_BATCHES: list[tuple[str, bytes]] = [
    ("no messages", json_batch()),
    ("another top key", json_batch(GOOD_JSON, tail='],"x":1}')),
    ("trailing bytes", json_batch(GOOD_JSON) + b"x"),
    ("cut short", json_batch(GOOD_JSON)[:-1]),
    ("body not UTF-8", json_batch(GOOD_JSON).replace(b'"x"', b'"\xff"')),
    ("messages escaped", json_batch(GOOD_JSON, head='{"\\u006dessages":[')),
    ("messages not a list", b'{"messages":' + GOOD_JSON.encode() + b"}"),
]


@needs_native
@pytest.mark.parametrize(
    "raw", [json_batch(GOOD_JSON, m) for _, m in NOT_PLAIN_JSON]
    + [r for _, r in NOT_PLAIN_JSON_BATCHES],
    ids=[n for n, _ in NOT_PLAIN_JSON] + [n for n, _ in NOT_PLAIN_JSON_BATCHES])
def test_json_bytes_that_are_not_body_only_are_left_to_the_decoder(raw: bytes) -> None:
    """(Whitespace between the tokens is plain: the good batch is written with it.)"""
    intake = new_intake()
    intake.prepare(request_of(MessageIn(body="fine", delay_ms=10)), NOW)
    spaced = b' \n{ "messages" :\t[ {"body" : "x" , "delayMs": 5 } ,\r\n' \
             b'{"msgId":"a.b-c:d_9","deliverAt":%d,"body":""}] } ' % (NOW + 1)
    assert intake.columns(TOPIC, spaced, NOW, max_count=1000, json=True) is not None
    assert intake.columns(TOPIC, raw, NOW, max_count=1000, json=True) is None


def raw_batch(*messages: bytes, head: bytes = b"\x81\xa8messages") -> bytes:
    return head + bytes([0x90 | len(messages)]) + b"".join(messages)


GOOD = b"\x82\xa4body\xa1x\xa7delayMs\x05"
NOT_PLAIN_BYTES: list[tuple[str, bytes]] = [
    ("unknown key", raw_batch(b"\x83\xa4body\xa1x\xa7delayMs\x05\xa3foo\x01")),
    ("tags", raw_batch(b"\x83\xa4body\xa1x\xa7delayMs\x05\xa4tags\xa1t")),
    ("nil msgId", raw_batch(b"\x83\xa4body\xa1x\xa7delayMs\x05\xa5msgId\xc0")),
    ("msgId with a space", raw_batch(b"\x83\xa4body\xa1x\xa7delayMs\x05\xa5msgId\xa3a b")),
    ("msgId of 129", raw_batch(b"\x83\xa4body\xa1x\xa7delayMs\x05\xa5msgId\xd9\x81"
                               + b"a" * 129)),
    ("negative delay", raw_batch(b"\x82\xa4body\xa1x\xa7delayMs\xff")),
    ("float delay", raw_batch(b"\x82\xa4body\xa1x\xa7delayMs\xcb" + bytes(8))),
    ("non-canonical int", raw_batch(b"\x82\xa4body\xa1x\xa7delayMs\xcd\x00\x05")),
    ("a key twice", raw_batch(b"\x83\xa4body\xa1x\xa7delayMs\x05\xa7delayMs\x06")),
    ("both bodies", raw_batch(b"\x83\xa4body\xa1x\xaabodyBase64\xc4\x01x\xa7delayMs\x05")),
    ("body as bin", raw_batch(b"\x82\xa4body\xc4\x01x\xa7delayMs\x05")),
    ("bodyBase64 as str", raw_batch(b"\x82\xaabodyBase64\xa1x\xa7delayMs\x05")),
    ("body not UTF-8", raw_batch(b"\x82\xa4body\xa1\xff\xa7delayMs\x05")),
    ("no timing", raw_batch(b"\x81\xa4body\xa1x")),
    ("both timings", raw_batch(b"\x83\xa4body\xa1x\xa7delayMs\x05\xa9deliverAt\x05")),
    ("trailing byte", raw_batch(GOOD) + b"\x00"),
    ("cut short", raw_batch(GOOD)[:-1]),
    ("no messages", raw_batch()),
    ("another top key", raw_batch(GOOD, head=b"\x82\xa8messages") + b"\xa1x\x01"),
    ("not a map", b"\x91" + GOOD),
]


@needs_native
@pytest.mark.parametrize("raw", [r for _, r in NOT_PLAIN_BYTES],
                         ids=[n for n, _ in NOT_PLAIN_BYTES])
def test_msgpack_bytes_that_are_not_plain_are_left_to_the_decoder(raw: bytes) -> None:
    intake = new_intake()
    intake.prepare(request_of(MessageIn(body="fine", delay_ms=10)), NOW)
    assert intake.columns(TOPIC, raw_batch(GOOD, GOOD), NOW, max_count=1000) is not None
    assert intake.columns(TOPIC, raw, NOW, max_count=1000) is None


NOT_PLAIN: list[tuple[str, dict[str, Any]]] = [
    ("tags", {"body": "x", "delay_ms": 5, "tags": "t"}),
    ("keys", {"body": "x", "delay_ms": 5, "keys": ["k"]}),
    ("properties", {"body": "x", "delay_ms": 5, "properties": {"a": "b"}}),
    ("level", {"body": "x", "delay_level": 2}),
    ("both bodies", {"body": "x", "body_base64": b"x", "delay_ms": 5}),
    ("no body", {"delay_ms": 5}),
    ("two timings", {"body": "x", "delay_ms": 5, "deliver_at": NOW + 5}),
    ("no timing (due now)", {"body": "x"}),
    ("delay 0 (due now)", {"body": "x", "delay_ms": 0}),
    ("deliverAt now", {"body": "x", "deliver_at": NOW}),
    ("deliverAt past", {"body": "x", "deliver_at": 5}),
    ("too far", {"body": "x", "deliver_at": NOW + MAX_DELAY + 1}),
    ("delay too long", {"body": "x", "delay_ms": MAX_DELAY + 1}),
    ("body too large", {"body": "x" * (MAX_BODY + 1), "delay_ms": 5}),
    ("base64 body too large", {"body_base64": b"x" * (MAX_BODY + 1), "delay_ms": 5}),
    ("past int64", {"body": "x", "deliver_at": 2**63}),
    ("lone surrogate", {"body": "\ud800", "delay_ms": 5}),
]


@needs_native
@pytest.mark.parametrize("fields", [f for _, f in NOT_PLAIN], ids=[n for n, _ in NOT_PLAIN])
def test_anything_else_is_left_to_the_general_path(fields: dict[str, Any]) -> None:
    intake = new_intake()
    ok = MessageIn(body="fine", delay_ms=10)
    intake.prepare(request_of(ok), NOW)
    assert intake.columns(TOPIC, [ok], NOW, UNSET) is not None
    assert intake.columns(TOPIC, [ok, MessageIn(**fields), ok], NOW, UNSET) is None
    assert intake.columns("never.sent.to", [ok], NOW, UNSET) is None  # the topic: checked once


@needs_native
@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(msg_ids, st.integers(0, 2**63 - 1), st.binary(max_size=300)),
                min_size=0, max_size=20),
       st.from_regex(r"\A[A-Za-z0-9_.-]{1,127}\Z"))
def test_the_answer_is_what_respond_writes(rows: list[tuple[str, int, bytes]],
                                           topic: str) -> None:
    ids, ats, keys = ([r[i] for r in rows] for i in range(3))
    results = {"results": [
        model.SendOutcome(msg_id=i, topic=topic, deliver_at=at, status=MessageStatus.SCHEDULED,
                         cancel_handle=h)
        for i, at, h in zip(ids, ats, cancel_handles(keys), strict=True)]}
    assert api_native.scheduled_answer(ids, topic, ats, keys, True) == msgspec.msgpack.encode(
        results)
    assert api_native.scheduled_answer(ids, topic, ats, keys, False) == msgspec.json.encode(
        results)


@needs_native
@pytest.mark.parametrize("msg_id", ['quote"d', "back\\slash", "new\nline", "é"])
def test_a_string_json_would_escape_is_left_to_msgspec(msg_id: str) -> None:
    assert api_native.scheduled_answer([msg_id], "t", [1], [b"k"], False) is None
    assert api_native.scheduled_answer(["ok"], msg_id, [1], [b"k"], False) is None
    # msgpack needs no escaping
    assert msgpack.unpackb(api_native.scheduled_answer([msg_id], "t", [1], [b"k"], True)) == {
        "results": [{"msgId": msg_id, "topic": "t", "deliverAt": 1, "status": "SCHEDULED",
                     "cancelHandle": cancel_handles([b"k"])[0], "duplicate": False}]}


# --- two live servers: with the columns path and without -------------------------------------
Pair = tuple[Live, Live, list[tuple[str, int]]]  # with, without, what took it on the first


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    with serve_twins(tmp_path) as (a, b):
        taken: list[tuple[str, int]] = []  # (from what, how many) of each column batch on a
        send_columns = a.broker.send_columns

        def counted(topic: str, messages: Any, *args: Any, **kwargs: Any) -> Any:
            columns = send_columns(topic, messages, *args, **kwargs)
            if columns is not None:
                taken.append(("bytes" if isinstance(messages, bytes) else "decoded",
                              len(columns.index_keys)))
            return columns

        a.broker.send_columns = counted  # type: ignore[method-assign]
        b.broker.send_columns = lambda *args, **kwargs: None  # type: ignore[method-assign]
        yield a, b, taken


def batch(rows: list[dict[str, Any]]) -> BatchIn:
    return BatchIn(messages=[MessageIn(**r) for r in rows])


def dump(live: Live) -> dict[str, list[tuple[bytes, bytes]]]:
    return dump_store(live.broker)


@needs_native  # (without it there is one path: what the other server takes)
def test_two_servers_store_and_answer_the_same(pair: Pair) -> None:
    a, b, taken = pair
    later = T0 + 60_000
    steps: list[tuple[str, BatchIn]] = [
        ("json", batch([{"body": "first", "delay_ms": 1000}])),  # topic not yet known
        ("json", batch([{"body": f"j{i}", "deliver_at": later + i * 7 % 13} for i in range(50)])),
        ("msgpack", batch([{"body_base64": bytes([i, 0, 255]), "delay_ms": 500 + i,
                            "msg_id": f"given-{i}"} for i in range(40)])),
        ("json", batch([{"body": "same again", "delay_ms": 5, "msg_id": "given-3"}])),  # re-send
        ("json", batch([{"body": "twice", "delay_ms": 5, "msg_id": "t-1"},
                        {"body": "twice", "delay_ms": 6, "msg_id": "t-1"}])),  # twice in one
        ("msgpack", batch([{"body": "tagged", "delay_ms": 5, "tags": "x"},
                           {"body": "columns", "delay_ms": 5}])),
        ("json", batch([{"body": "now"}, {"body": "later", "delay_ms": 9}])),  # one due now
        ("json", batch([{"body": "é ünïcode", "delay_ms": 2_000, "msg_id": "u:1"},
                        {"body": "", "delay_ms": 3_000}])),
    ]
    answers = []
    for encoding, doc in steps:
        answers.append([send(live, encoding, doc) for live in (a, b)])
    for k, (got, want) in enumerate(answers):
        assert got == want, f"step {k}"
    # the body-only ones took the columns path (straight from the bytes), the rest did not
    assert taken == [("bytes", 50), ("bytes", 40), ("bytes", 2)]
    assert dump(a) == dump(b)
    assert a.broker.stats().pending == b.broker.stats().pending == 1 + 50 + 40 + 1 + 2 + 1 + 2
    assert backlog(a) == backlog(b)
    for live in (a, b):
        live.advance(120_000)
    pulled = [pull_all(live) for live in (a, b)]
    assert pulled[0] == pulled[1] and len(pulled[0]) == 1 + 50 + 40 + 1 + 2 + 2 + 2
    assert dump(a) == dump(b)


def backlog(live: Live) -> tuple[Any, ...]:
    """Pending by topic (count, first deliverAt), and the due timeline per second."""
    broker = live.broker
    return (broker.overview().pending_by_topic,
            broker.timeline(T0, T0 + 120_000, 120, TOPIC))


def send(live: Live, encoding: str, doc: BatchIn) -> tuple[int, str, bytes]:
    if encoding == "msgpack":
        body = msgspec.msgpack.encode(doc)
        headers = {"Content-Type": "application/x-msgpack", "Accept": "application/x-msgpack"}
    else:
        body, headers = msgspec.json.encode(doc), {"Content-Type": "application/json"}
    with live.client(ADMIN) as client:
        r = client.post(f"/v1/topics/{TOPIC}/messages:batch", content=body, headers=headers)
    return r.status_code, r.headers["content-type"], r.content


def pull_all(live: Live) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    offset = 0
    with live.client(ADMIN) as client:
        while True:
            r = client.get(f"/v1/topics/{TOPIC}/messages", params={"offset": offset,
                                                                  "max": 100})
            assert r.status_code == 200
            page = r.json()
            if not page["messages"]:
                return out
            out.extend(page["messages"])
            offset = page["nextOffset"]


def test_base64_bodies_survive_the_plain_path(pair: Pair) -> None:
    a, _, taken = pair
    send(a, "json", batch([{"body": "first", "delay_ms": 10}]))
    raw = bytes(range(256))
    status, _, answer = send(a, "json", batch([{"body_base64": raw, "delay_ms": 1000}]))
    assert status == 201 and taken == ([("decoded", 1)] if native is not None else [])
    a.advance(5_000)
    got = {m["msgId"]: m for m in pull_all(a)}
    msg_id = msgspec.json.decode(answer)["results"][0]["msgId"]
    assert base64.b64decode(got[msg_id]["bodyBase64"]) == raw


# --- the engine's own sends (Broker.send_batch with SendRequests) ---------------------------
TOPICS = (TOPIC, "columns.b", "columns.d")  # shards 0, 2, 3 of 4; of 2: 0, 0, 1
body_only_requests = st.builds(
    lambda topic, body, timing, msg_id: SendRequest(
        topic=topic, body=body, msg_id=msg_id,
        deliver_at=timing.get("deliver_at"), delay_ms=timing.get("delay_ms")),
    st.sampled_from(TOPICS), st.binary(max_size=40), timings, st.none() | msg_ids)


@needs_native
@settings(max_examples=150, deadline=None)
@given(st.lists(body_only_requests, min_size=1, max_size=30))
def test_plain_columns_from_send_requests_are_what_prepare_makes(
        requests: list[SendRequest]) -> None:
    """Of one topic or of several (each sent to before), in any order."""
    intake = new_intake()
    for topic in TOPICS:
        intake.prepare(SendRequest(topic=topic, body=b""), NOW)
    intake._ids._counter = itertools.count(7)
    columns = intake.columns(requests[0].topic, requests, NOW)
    assert columns is not None
    intake._ids._counter = itertools.count(7)
    prepared = [intake.prepare(r, NOW) for r in requests]
    assert columns.msg_ids == [p.msg_id for p in prepared]
    assert columns.deliver_ats == [p.deliver_at for p in prepared]
    assert columns.timer_keys == [p.timer_key for p in prepared]
    assert columns.index_keys == [p.index_key for p in prepared]
    assert list(zip(columns.values, columns.entries, strict=True)) == scheduled_values(prepared,
                                                                                   NOW)
    assert columns.given == [p.index_key for p in prepared if not p.generated_id]
    assert (columns.topic, columns.shard) == (prepared[0].topic, prepared[0].shard)
    if len({r.topic for r in requests}) == 1:
        assert columns.topics is None and columns.shards is None
    else:
        assert columns.topics == [p.topic for p in prepared]
        assert columns.shards == [p.shard for p in prepared]
    assert columns.results() == [
        model.SendOutcome(msg_id=p.msg_id, topic=p.topic, deliver_at=p.deliver_at,
                         status=MessageStatus.SCHEDULED, cancel_handle=handle)
        for p, handle in zip(prepared, cancel_handles([p.timer_key for p in prepared]),
                             strict=True)]


NOT_PLAIN_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("a topic not sent to", {"topic": "columns.other"}),
    ("a topic not a str", {"topic": ["columns.orders"]}),
    ("a system topic", {"topic": "%RETRY%g"}),
    ("tags", {"tags": "t"}),
    ("keys", {"keys": ("k",)}),
    ("properties", {"properties": {"a": "b"}}),
    ("level", {"delay_ms": None, "delay_level": 2}),
    ("msgId not valid", {"msg_id": "a b"}),
    ("msgId too long", {"msg_id": "a" * 129}),
    ("a str body", {"body": "x"}),
    ("due now", {"delay_ms": 0}),
    ("no timing", {"delay_ms": None}),
    ("negative delay", {"delay_ms": -1}),
    ("both timings", {"deliver_at": NOW + 5}),
    ("body too large", {"body": b"x" * (MAX_BODY + 1)}),
]


@needs_native
@pytest.mark.parametrize("fields", [f for _, f in NOT_PLAIN_REQUESTS],
                         ids=[n for n, _ in NOT_PLAIN_REQUESTS])
def test_other_send_requests_are_left_to_prepare(fields: dict[str, Any]) -> None:
    intake = new_intake()
    ok = SendRequest(topic=TOPIC, body=b"fine", delay_ms=10)
    intake.prepare(ok, NOW)
    assert intake.columns(TOPIC, [ok, ok], NOW) is not None
    odd = msgspec.structs.replace(ok, **fields)
    assert intake.columns(TOPIC, [ok, odd, ok], NOW) is None
    assert intake.columns(odd.topic, [odd, ok], NOW) is None


@needs_native
def test_send_batch_stores_and_answers_the_same_either_way(tmp_path: Path) -> None:
    """Broker.send_batch through the columns path and through prepare alone: the same results,
    the same RocksDB contents, the same deliveries."""
    brokers = []
    for name in ("columns", "general"):
        clock = FakeClock(T0)
        broker = Broker(make_config(tmp_path / name), clock)
        broker.start()
        ids = broker.parts.intake._ids
        ids._instance, ids._counter = "0123ABCD", itertools.count()
        brokers.append((broker, clock))
    columns, general = (b for b, _ in brokers)
    general.parts.intake.columns = lambda *args, **kwargs: None  # type: ignore[method-assign]
    submit_columns, taken = columns.parts.writes.submit_columns, []
    columns.parts.writes.submit_columns = lambda batch: (  # type: ignore[method-assign]
        taken.append(submit_columns(batch)) or taken[-1])
    batches = [
        [SendRequest(topic=topic, body=b"first", delay_ms=10) for topic in TOPICS],
        [SendRequest(topic=TOPIC, body=bytes([i]), delay_ms=100 + i % 7,
                     msg_id=None if i % 3 else f"r-{i}") for i in range(60)],
        [SendRequest(topic=TOPICS[i % 3], body=bytes([i]), delay_ms=50 + i % 5,
                     msg_id=None if i % 4 else f"m-{i}") for i in range(40)],
        [SendRequest(topic=TOPIC, body=b"again", delay_ms=5, msg_id="r-3")],  # a re-send
        [SendRequest(topic=TOPIC, body=b"t", delay_ms=5, tags="x")],
        [SendRequest(topic=TOPIC, body=b"now")],
    ]
    try:
        for batch in batches:
            assert columns.send_batch(batch) == general.send_batch(batch)
        # the first batch makes the topics known (no columns path before); a re-send: general
        assert taken == [True, True, False]
        assert dump_store(columns) == dump_store(general)
        for broker, clock in brokers:
            clock.advance(1_000)
            broker.drain()
        delivered = [read_topic(columns, topic) for topic in TOPICS]
        assert delivered == [read_topic(general, topic) for topic in TOPICS]
        assert sum(map(len, delivered)) == 3 + 60 + 40 + 1 + 1
        # the two shards' scanners interleave in the log as their threads run: the keys of
        # the timer and index column families (expiry keys hold log positions)
        after = [{cf: keys for cf, keys in keys_of(dump_store(b)).items()
                  if cf not in (CF_EXPIRY, CF_META)} for b in (columns, general)]
        assert after[0] == after[1]
    finally:
        for broker, _ in brokers:
            broker.close()


def keys_of(dump: dict[str, list[tuple[bytes, bytes]]]) -> dict[str, list[bytes]]:
    return {cf: [key for key, _ in items] for cf, items in dump.items()}


def dump_store(broker: Broker) -> dict[str, list[tuple[bytes, bytes]]]:
    store = broker.parts.store
    assert store is not None
    cfs = [timer_cf(s) for s in range(store.timer_shards)] + [CF_INDEX, CF_EXPIRY, CF_META]
    return {cf: list(store.scan(cf)) for cf in cfs}
