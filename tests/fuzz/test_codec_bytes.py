"""The codecs against arbitrary input (tests/storage/test_codecs.py has the round trips of
valid records; this is everything else): random bytes, random msgpack documents, random
handle strings.

- Key decoders raise only InvalidArgument (handles: NotFound); whatever they accept
  re-encodes to exactly the same bytes, so a key has one reading.
- Record decoders (storage/records.py, scheduler/tx_records.py) raise only CorruptionError,
  and what they return is well typed (a record with ``topic=5`` would fail far away, as a 500).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.tx_records import decode_entry, decode_half
from storage.errors import CorruptionError, InvalidArgument, NotFound
from storage.keys import (
    cq_key,
    decode_cq_key,
    decode_handle,
    decode_index_key,
    decode_timer_key,
    encode_handle,
    encode_timer_key,
    index_key,
)
from storage.records import (
    IndexEntry,
    LogRecord,
    MessageRecord,
    decode_index,
    decode_log_record,
    decode_message,
)

FUZZ = settings(max_examples=200, deadline=None, derandomize=True)

# bytes shaped like keys: a time, a name, NUL, an id (sometimes not UTF-8, sometimes short)
key_like = st.one_of(
    st.binary(max_size=40),
    st.tuples(st.binary(min_size=8, max_size=8), st.binary(max_size=12),
              st.sampled_from([b"\x00", b""]), st.binary(max_size=12)).map(b"".join),
)


@FUZZ
@given(key_like)
def test_timer_keys_decode_to_their_one_reading_or_refuse(raw: bytes) -> None:
    try:
        decoded = decode_timer_key(raw)
    except InvalidArgument:
        return
    assert encode_timer_key(*decoded) == raw


@FUZZ
@given(key_like)
def test_index_keys_decode_to_their_one_reading_or_refuse(raw: bytes) -> None:
    try:
        topic, msg_id = decode_index_key(raw)
    except InvalidArgument:
        return
    assert index_key(topic, msg_id) == raw


@FUZZ
@given(st.one_of(key_like, st.tuples(st.binary(max_size=12),
                                     st.binary(min_size=8, max_size=8)).map(
                                         lambda t: t[0] + b"\x00" + t[1])))
def test_consume_queue_keys_decode_to_their_one_reading_or_refuse(raw: bytes) -> None:
    try:
        topic, offset = decode_cq_key(raw)
    except InvalidArgument:
        return
    assert cq_key(topic, offset) == raw


@FUZZ
@given(st.one_of(st.text(max_size=80), st.binary(max_size=50).map(
    lambda b: encode_handle(1, "t", "m")[:4] + b.hex())))
def test_cancel_handles_are_ours_or_not_found(handle: str) -> None:
    try:
        decoded = decode_handle(handle)
    except NotFound:
        return
    assert decode_handle(encode_handle(*decoded)) == decoded


RECORD_DECODERS: dict[str, Callable[[bytes], Any]] = {
    "MessageRecord": decode_message, "LogRecord": decode_log_record, "IndexEntry": decode_index,
    "HalfMessage": decode_half, "TransactionEntry": decode_entry,
}

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=10) | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=4),
    max_leaves=12,
)
versioned = st.lists(msgpack_values, max_size=12).map(lambda v: msgpack.packb([1, *v]))


@pytest.mark.parametrize("name", sorted(RECORD_DECODERS))
@FUZZ
@given(raw=st.one_of(st.binary(max_size=64), msgpack_values.map(msgpack.packb), versioned))
def test_record_decoders_raise_only_corruption(name: str, raw: bytes) -> None:
    try:
        RECORD_DECODERS[name](raw)
    except CorruptionError:
        pass


TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    MessageRecord: {"body": (bytes,), "tags": (str, type(None)), "keys": (tuple,),
                    "properties": (dict,), "born_at": (int,), "deliver_at": (int,),
                    "flags": (int,)},
    LogRecord: {"topic": (str,), "msg_id": (str,), "queue_offset": (int,), "body": (bytes,),
                "tags": (str, type(None)), "keys": (tuple,), "properties": (dict,),
                "born_at": (int,), "deliver_at": (int,), "stored_at": (int,), "flags": (int,)},
    IndexEntry: {"deliver_at": (int,), "updated_at": (int,),
                 "queue_offset": (int, type(None)), "log_position": (int, type(None)),
                 "tx_id": (str, type(None))},
}


@settings(max_examples=200, deadline=None, derandomize=True)
@given(raw=versioned)
def test_decoded_records_are_well_typed(raw: bytes) -> None:
    for decode in (decode_message, decode_log_record, decode_index):
        try:
            record = decode(raw)
        except CorruptionError:
            continue
        for name, types in TYPES[type(record)].items():
            assert isinstance(getattr(record, name), types), (record, name)
