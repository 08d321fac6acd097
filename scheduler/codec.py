"""Hot-path encoders: byte-for-byte the formats of storage/records.py, without the generic
dataclass walk.

``storage.records`` encodes a record by walking its dataclass fields (about 4 µs for a
MessageRecord, measured); the send and delivery paths do that several times per message.
These functions pack the same msgpack arrays from plain values (about 0.8 µs), and turn a
stored MessageRecord value into a LogRecord payload without building either dataclass.
tests/scheduler/test_codec.py proves, with hypothesis, that every function here produces
exactly the bytes ``storage.records`` produces, and that decoding gives the same records.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

import msgpack

from storage.records import (
    FORMAT_VERSION,
    LogRecord,
    decode_message,
    encode_log_record,
)

_packb = msgpack.packb
_unpackb = msgpack.unpackb
_V = FORMAT_VERSION


def _props(properties: Mapping[str, str]) -> dict[str, str]:
    return properties if type(properties) is dict else dict(properties)


def message_value(body: bytes, tags: str | None, keys: tuple[str, ...],
                  properties: Mapping[str, str], born_at: int, deliver_at: int,
                  flags: int) -> bytes:
    """== encode_message(MessageRecord(...)) (value of a timer column family)."""
    return _packb([_V, body, tags, keys, _props(properties), born_at, deliver_at, flags])


def index_value(status: str, deliver_at: int, updated_at: int, queue_offset: int | None = None,
                log_position: int | None = None, tx_id: str | None = None) -> bytes:
    """== encode_index(IndexEntry(...)); ``status`` is the MessageStatus value."""
    return _packb([_V, status, deliver_at, updated_at, queue_offset, log_position, tx_id])


def log_payload(topic: str, msg_id: str, queue_offset: int, body: bytes, tags: str | None,
                keys: tuple[str, ...], properties: Mapping[str, str], born_at: int,
                deliver_at: int, stored_at: int, flags: int) -> bytes:
    """== encode_log_record(LogRecord(...))."""
    return _packb([_V, topic, msg_id, queue_offset, body, tags, keys, _props(properties),
                   born_at, deliver_at, stored_at, flags])


def log_payload_from_value(value: bytes, topic: str, msg_id: str, queue_offset: int,
                           deliver_at: int, stored_at: int) -> bytes:
    """The LogRecord payload of a stored MessageRecord value (a timer CF value), as
    ``encode_log_record`` would write it after ``decode_message``."""
    try:
        v = _unpackb(value, raw=False, use_list=False, strict_map_key=True)
    except Exception:  # garbage: decode_message below raises CorruptionError
        v = None
    if type(v) is not tuple or len(v) != 8 or v[0] != _V:  # anything else: the general path
        msg = decode_message(value)
        return encode_log_record(LogRecord(
            topic=topic, msg_id=msg_id, queue_offset=queue_offset, body=msg.body,
            tags=msg.tags, keys=msg.keys, properties=msg.properties, born_at=msg.born_at,
            deliver_at=deliver_at, stored_at=stored_at, flags=msg.flags))
    return _packb([_V, topic, msg_id, queue_offset, v[1], v[2], v[3], v[4], v[5], deliver_at,
                   stored_at, v[7]])


def cancel_handle(timer_key: bytes) -> str:
    """== storage.keys.encode_handle(deliverAt, topic, msgId) of that timer key."""
    return base64.urlsafe_b64encode(_HANDLE_PREFIX + timer_key).rstrip(b"=").decode("ascii")


_HANDLE_PREFIX = b"\x01"  # storage.keys handle version 1
