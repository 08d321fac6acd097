"""Property tests of the key and value codecs (storage/keys.py, storage/records.py)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.errors import CorruptionError, InvalidArgument, NotFound
from storage.keys import (
    MAX_U64,
    cq_key,
    decode_cq_key,
    decode_handle,
    decode_index_key,
    decode_timer_key,
    encode_handle,
    encode_timer_key,
    index_key,
    time_bound,
)
from storage.records import (
    IndexEntry,
    LogRecord,
    MessageRecord,
    MessageStatus,
    decode_index,
    decode_log_record,
    decode_log_records,
    decode_message,
    encode_index,
    encode_log_record,
    encode_message,
)

# Any text without NUL and lone surrogates is a valid codec input (the API is stricter).
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"),
                min_size=1, max_size=20)
msg_ids = st.text(st.characters(codec="utf-8"), max_size=20)
times = st.integers(min_value=0, max_value=MAX_U64)
triples = st.tuples(times, names, msg_ids)


def _order(t: tuple[int, str, str]) -> tuple[int, bytes, bytes]:
    """The documented order: deliverAt, then topic, then msgId, strings by code point."""
    return t[0], t[1].encode(), t[2].encode()


@given(triples)
def test_timer_key_round_trip(t: tuple[int, str, str]) -> None:
    assert decode_timer_key(encode_timer_key(*t)) == t
    assert decode_handle(encode_handle(*t)) == t


@given(triples, triples)
def test_timer_key_order_equals_triple_order(a: tuple[int, str, str],
                                             b: tuple[int, str, str]) -> None:
    ka, kb = encode_timer_key(*a), encode_timer_key(*b)
    assert (ka < kb) == (_order(a) < _order(b))
    assert (ka == kb) == (a == b)  # no two distinct triples give one key


@given(st.lists(triples, min_size=2, max_size=30, unique=True))
def test_sorting_keys_sorts_triples(ts: list[tuple[int, str, str]]) -> None:
    by_key = sorted(ts, key=lambda t: encode_timer_key(*t))
    assert by_key == sorted(ts, key=_order)
    assert len({encode_timer_key(*t) for t in ts}) == len(ts)


@given(triples, times)
def test_time_bound_splits_by_deliver_at(t: tuple[int, str, str], bound: int) -> None:
    assert (encode_timer_key(*t) < time_bound(bound)) == (t[0] < bound)


@given(names, msg_ids, st.integers(min_value=0, max_value=MAX_U64))
def test_index_and_cq_keys_round_trip(topic: str, msg_id: str, offset: int) -> None:
    assert decode_index_key(index_key(topic, msg_id)) == (topic, msg_id)
    assert decode_cq_key(cq_key(topic, offset)) == (topic, offset)


@given(names, names, st.integers(0, MAX_U64), st.integers(0, MAX_U64))
def test_cq_keys_group_by_topic_then_offset(t1: str, t2: str, o1: int, o2: int) -> None:
    k1, k2 = cq_key(t1, o1), cq_key(t2, o2)
    assert (k1 < k2) == ((t1.encode(), o1) < (t2.encode(), o2))


@pytest.mark.parametrize("topic", ["", "a\x00b", "\ud800"])
def test_invalid_topics_are_invalid_argument(topic: str) -> None:
    with pytest.raises(InvalidArgument):
        encode_timer_key(1, topic, "m")
    with pytest.raises(InvalidArgument):
        index_key(topic, "m")


def test_invalid_times_and_keys() -> None:
    with pytest.raises(InvalidArgument):
        encode_timer_key(-1, "t", "m")
    with pytest.raises(InvalidArgument):
        encode_timer_key(MAX_U64 + 1, "t", "m")
    for bad in (b"", b"\x00" * 9, b"\x00" * 8 + b"\x00m", b"\x00" * 8 + b"\xff\x00m"):
        with pytest.raises(InvalidArgument):
            decode_timer_key(bad)
    for handle in ("", "not-a-handle", "AAAA", encode_handle(1, "t", "m")[:-3] + "!!!"):
        with pytest.raises(NotFound):
            decode_handle(handle)


texts = st.text(max_size=30)
messages = st.builds(
    MessageRecord,
    body=st.binary(max_size=200),
    tags=st.none() | texts,
    keys=st.lists(texts, max_size=4).map(tuple),
    properties=st.dictionaries(texts, texts, max_size=4),
    born_at=times,
    deliver_at=times,
    flags=st.integers(0, 255),
)
log_records = st.builds(
    LogRecord,
    topic=names, msg_id=msg_ids, queue_offset=times, body=st.binary(max_size=200),
    tags=st.none() | texts, keys=st.lists(texts, max_size=4).map(tuple),
    properties=st.dictionaries(texts, texts, max_size=4),
    born_at=times, deliver_at=times, stored_at=times, flags=st.integers(0, 255),
)
index_entries = st.builds(
    IndexEntry,
    status=st.sampled_from(MessageStatus), deliver_at=times, updated_at=times,
    queue_offset=st.none() | times, log_position=st.none() | times, tx_id=st.none() | texts,
)


@given(messages)
def test_message_record_round_trip(record: MessageRecord) -> None:
    assert decode_message(encode_message(record)) == record


@given(log_records)
def test_log_record_round_trip(record: LogRecord) -> None:
    assert decode_log_record(encode_log_record(record)) == record


@given(index_entries)
def test_index_entry_round_trip(entry: IndexEntry) -> None:
    decoded = decode_index(encode_index(entry))
    assert decoded == entry
    assert isinstance(decoded.status, MessageStatus)


def test_records_evolve_by_appending_fields() -> None:
    record = MessageRecord(body=b"x", tags="t", deliver_at=5)
    newer = [*msgpack.unpackb(encode_message(record)), "a field from the future"]
    assert decode_message(msgpack.packb(newer)) == record
    older = msgpack.unpackb(encode_message(record))[:3]  # version, body, tags
    assert decode_message(msgpack.packb(older)) == MessageRecord(body=b"x", tags="t")


@pytest.mark.parametrize("raw", [
    b"", b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([]), msgpack.packb(["v1"]),
    msgpack.packb([1]),  # IndexEntry without its required status
    msgpack.packb([1, "NO_SUCH_STATUS", 0]),
])
def test_garbage_is_corruption(raw: bytes) -> None:
    with pytest.raises(CorruptionError):
        decode_index(raw)


@given(st.lists(log_records, max_size=5))
def test_log_records_decode_in_bulk(records: list[LogRecord]) -> None:
    payloads = [encode_log_record(r) for r in records]
    assert decode_log_records(payloads) == records
    wrong_type = msgpack.packb([1, "topic", 42, 0, b"body"])  # msgId must be a string
    with pytest.raises(CorruptionError, match=r"cannot decode LogRecord: Expected `str`"):
        decode_log_records([*payloads, wrong_type])
