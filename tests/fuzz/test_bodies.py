"""Request bodies nobody should send, and ones everybody does, in both encodings.

- Random bytes under any content type, random msgpack documents and message-shaped
  msgpack/JSON documents with values of every type, to every operation that takes a body:
  never 5xx; a refusal is a problem document of the contract; what is accepted is really
  stored (its status reads back).
- Valid messages of every shape (text or binary bodies, tags, keys, properties), sent as
  JSON or msgpack, come back from the log byte for byte: no corruption on the way.
"""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from storage.constants import (
    PROP_DELAY_LEVEL,
    PROP_TIMER_DELAY_MS,
    PROP_TIMER_DELAY_SEC,
    PROP_TIMER_DELIVER_MS,
)
from tests.fuzz.conftest import assert_problem, fuzz_settings
from tests.support.live import Live

TOPIC = "fuzz.bodies"
BODY_OPERATIONS = [
    ("POST", f"/v1/topics/{TOPIC}/messages"),
    ("POST", f"/v1/topics/{TOPIC}/messages:batch"),
    ("POST", f"/v1/topics/{TOPIC}/transactions"),
    ("PUT", f"/v1/topics/{TOPIC}/groups/g/offset"),
    ("PUT", "/v1/producer-groups/pg/check-callback"),
]
CONTENT_TYPES = ["application/json", "application/x-msgpack", "application/msgpack",
                 "application/vnd.msgpack", "text/plain", "", "application/json; charset=utf-8",
                 "APPLICATION/X-MSGPACK"]
_ids = itertools.count()

ints = st.integers(-(2**63), 2**64 - 1)  # what msgpack can hold
scalars = (st.none() | st.booleans() | ints | st.floats()
           | st.text(max_size=20) | st.binary(max_size=20))
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
times = st.one_of(ints, st.integers(0, 4_000_000_000_000),
                  st.text(max_size=6), st.floats())
message_shaped = st.fixed_dictionaries({}, optional={
    "body": st.one_of(st.text(max_size=30), st.binary(max_size=30), ints),
    "bodyBase64": st.one_of(st.binary(max_size=30), st.text(max_size=30)),
    "tags": st.one_of(st.text(max_size=20), ints, st.none()),
    "keys": st.one_of(st.lists(st.text(max_size=10), max_size=4), st.text(max_size=5)),
    "properties": st.one_of(st.dictionaries(st.text(max_size=10), st.text(max_size=10),
                                            max_size=4),
                            st.dictionaries(st.text(max_size=5), anything, max_size=2)),
    "msgId": st.one_of(st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True),
                       st.text(max_size=20)),
    "deliverAt": times, "delayMs": times, "delayLevel": st.one_of(st.integers(-5, 40), times),
    "producerGroup": st.one_of(st.just("pg"), st.text(max_size=10)),
    "offset": st.one_of(st.integers(-5, 10), times),
    "url": st.one_of(st.just("http://127.0.0.1:9/check"), st.text(max_size=30)),
})
documents = st.one_of(anything, message_shaped,
                      st.lists(message_shaped, max_size=3).map(lambda m: {"messages": m}))


def _encode(doc: Any, content_type: str) -> bytes:
    return msgpack.packb(doc) if "msgpack" in content_type.lower() else _json(doc)


def _json(doc: Any) -> bytes:
    """JSON where it can be (bytes as base64 text, NaN as NaN), else msgpack (bad JSON)."""

    def fix(v: Any) -> Any:
        if isinstance(v, bytes):
            return base64.b64encode(v).decode()
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        return v
    try:
        return json.dumps(fix(doc), allow_nan=True).encode()
    except (TypeError, ValueError):
        return msgpack.packb(doc)


@fuzz_settings(200)
@given(op=st.sampled_from(BODY_OPERATIONS), content_type=st.sampled_from(CONTENT_TYPES),
       body=st.one_of(st.binary(max_size=80), documents.map(lambda d: ("doc", d))))
def test_any_body_is_refused_cleanly_or_stored(fuzz_live: Live, op: tuple[str, str],
                                               content_type: str, body: Any) -> None:
    raw = body if isinstance(body, bytes) else _encode(body[1], content_type)
    with fuzz_live.client() as client:
        r = client.request(op[0], op[1], content=raw,
                           headers={"Content-Type": content_type} if content_type else {})
        if r.status_code >= 400:
            assert_problem(r)
            return
        assert r.status_code in (200, 201), r.text
        if op[1].endswith("/messages"):
            sent = r.json()
            info = client.get(f"/v1/topics/{TOPIC}/messages/{sent['msgId']}")
            assert info.status_code == 200 and info.json()["status"] in ("SCHEDULED",
                                                                         "DELIVERED"), info.text


texts = st.text(max_size=40)
TIMING_PROPERTIES = {PROP_DELAY_LEVEL, PROP_TIMER_DELIVER_MS, PROP_TIMER_DELAY_MS,
                     PROP_TIMER_DELAY_SEC}  # RocketMQ timing: not a plain property
valid_messages = st.fixed_dictionaries(
    {"body": st.one_of(texts, st.binary(max_size=200))},
    optional={"tags": st.text(max_size=30), "keys": st.lists(texts, max_size=5),
              "properties": st.dictionaries(
                  st.text(min_size=1, max_size=20).filter(lambda k: k not in TIMING_PROPERTIES),
                  texts, max_size=5)},
)


@fuzz_settings(100)
@given(message=valid_messages, as_msgpack=st.booleans())
def test_what_is_sent_is_what_is_read(fuzz_live: Live, message: dict[str, Any],
                                      as_msgpack: bool) -> None:
    doc = dict(message, msgId=f"rt-{next(_ids)}")
    body = doc.pop("body")
    if isinstance(body, bytes):
        doc["bodyBase64"] = body if as_msgpack else base64.b64encode(body).decode()
    else:
        doc["body"] = body
    with fuzz_live.client() as client:
        if as_msgpack:
            r = client.post(f"/v1/topics/{TOPIC}.rt/messages", content=msgpack.packb(doc),
                            headers={"Content-Type": "application/x-msgpack"})
        else:
            r = client.post(f"/v1/topics/{TOPIC}.rt/messages", json=doc)
        assert r.status_code == 201, r.text
        offset = client.get(f"/v1/topics/{TOPIC}.rt/messages/{doc['msgId']}").json()["offset"]
        got = client.get(f"/v1/topics/{TOPIC}.rt/messages",
                         params={"offset": offset, "max": 1}).json()["messages"][0]
    raw = body if isinstance(body, bytes) else body.encode()
    assert got["msgId"] == doc["msgId"]
    assert base64.b64decode(got["bodyBase64"]) == raw
    assert got["tags"] == doc.get("tags")
    assert got["keys"] == doc.get("keys", [])
    assert got["properties"] == doc.get("properties", {})
    assert got["storedAt"] >= got["deliverAt"]
