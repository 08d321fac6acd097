"""scheduler/codec.py writes exactly the bytes storage/records.py and storage/keys.py write."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.codec import (
    cancel_handle,
    delivered_properties,
    index_value,
    log_payload,
    log_payload_from_value,
    message_value,
    scheduled_values,
)
from storage.keys import encode_handle, encode_timer_key
from storage.records import (
    IndexEntry,
    LogRecord,
    MessageRecord,
    MessageStatus,
    decode_log_record,
    encode_index,
    encode_log_record,
    encode_message,
)

texts = st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s)
ints = st.integers(min_value=0, max_value=(1 << 64) - 1)
records = st.builds(
    MessageRecord, body=st.binary(max_size=300), tags=st.none() | st.text(max_size=10),
    keys=st.lists(st.text(max_size=8), max_size=3).map(tuple),
    properties=st.dictionaries(
        st.text(max_size=8) | st.sampled_from(["DELAY", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS",
                                               "TIMER_X"]),
        st.text(max_size=8), max_size=4),
    born_at=ints, deliver_at=ints, flags=st.integers(min_value=0, max_value=7))


@settings(max_examples=300)
@given(record=records)
def test_message_value(record: MessageRecord) -> None:
    assert message_value(record.body, record.tags, record.keys, record.properties,
                         record.born_at, record.deliver_at, record.flags) == encode_message(record)


@settings(max_examples=200)
@given(record=records, at=ints, tx_id=st.none() | st.text(max_size=20))
def test_scheduled_values(record: MessageRecord, at: int, tx_id: str | None) -> None:
    """One message of a send batch: its timer value and SCHEDULED index entry, or None when
    it is due by ``at`` (the PreparedMessage fields it reads are the record's, plus tx_id)."""
    message = SimpleNamespace(**{f: getattr(record, f) for f in record.__struct_fields__},
                              tx_id=tx_id)
    expected = None if record.deliver_at <= at else (
        encode_message(record),
        encode_index(IndexEntry(status=MessageStatus.SCHEDULED, deliver_at=record.deliver_at,
                                updated_at=at, tx_id=tx_id)))
    assert scheduled_values([message], at) == [expected]


@settings(max_examples=300)
@given(status=st.sampled_from(list(MessageStatus)), deliver_at=ints, updated_at=ints,
       queue_offset=st.none() | ints, log_position=st.none() | ints,
       tx_id=st.none() | st.text(max_size=20))
def test_index_value(status: MessageStatus, deliver_at: int, updated_at: int,
                     queue_offset: int | None, log_position: int | None,
                     tx_id: str | None) -> None:
    entry = IndexEntry(status=status, deliver_at=deliver_at, updated_at=updated_at,
                       queue_offset=queue_offset, log_position=log_position, tx_id=tx_id)
    assert index_value(status.value, deliver_at, updated_at, queue_offset, log_position,
                       tx_id) == encode_index(entry)


@settings(max_examples=300)
@given(record=records, topic=texts, msg_id=texts, queue_offset=ints, deliver_at=ints,
       stored_at=ints)
def test_log_payloads(record: MessageRecord, topic: str, msg_id: str, queue_offset: int,
                      deliver_at: int, stored_at: int) -> None:
    """The log record, with DELAY and every TIMER_* property cleared (as RocketMQ delivers)."""
    delivered = {k: v for k, v in record.properties.items()
                 if k != "DELAY" and not k.startswith("TIMER_")}
    expected = encode_log_record(LogRecord(
        topic=topic, msg_id=msg_id, queue_offset=queue_offset, body=record.body,
        tags=record.tags, keys=record.keys, properties=delivered,
        born_at=record.born_at, deliver_at=deliver_at, stored_at=stored_at, flags=record.flags))
    assert log_payload(topic, msg_id, queue_offset, record.body, record.tags, record.keys,
                       record.properties, record.born_at, deliver_at, stored_at,
                       record.flags) == expected
    from_value = log_payload_from_value(encode_message(record), topic, msg_id, queue_offset,
                                        deliver_at, stored_at)
    assert from_value == expected
    assert decode_log_record(from_value).body == record.body


def test_delivered_properties_keeps_the_mapping_without_delay_properties() -> None:
    props = {"a": "1", "DELAYED": "x", "TIMERS": "y"}  # near misses stay
    assert delivered_properties(props) is props
    assert delivered_properties({"DELAY": "3", "TIMER_DELAY_SEC": "9", "k": "v"}) == {"k": "v"}


def test_log_payload_from_an_older_shorter_value() -> None:
    import msgpack

    old = msgpack.packb([1, b"body", "tag", ("k",), {"a": "b"}, 5])  # no deliverAt, no flags
    payload = log_payload_from_value(old, "t", "m", 3, 10, 11)
    rec = decode_log_record(payload)
    assert (rec.body, rec.tags, rec.keys, rec.born_at, rec.deliver_at, rec.stored_at,
            rec.flags) == (b"body", "tag", ("k",), 5, 10, 11, 0)


@settings(max_examples=300)
@given(deliver_at=ints, topic=texts, msg_id=st.text(max_size=20))
def test_cancel_handle(deliver_at: int, topic: str, msg_id: str) -> None:
    key = encode_timer_key(deliver_at, topic, msg_id)
    assert cancel_handle(key) == encode_handle(deliver_at, topic, msg_id)
