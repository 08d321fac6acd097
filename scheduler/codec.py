"""Hot-path encoders: byte-for-byte the formats of storage/records.py, from plain values.

The send and delivery paths encode several records per message; building a record Struct
first only to encode it would cost a construction each time. These functions pack the same
msgpack arrays directly (one msgspec encode, ~0.3 µs), and turn a stored MessageRecord value
into a LogRecord payload. tests/scheduler/test_codec.py proves, with hypothesis, that every
function here produces exactly the bytes ``storage.records`` produces, and that decoding
gives the same records.
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from scheduler.native import native
from storage.constants import PROP_DELAY_LEVEL, PROP_TIMER_PREFIX
from storage.records import (
    FLAG_LEVEL_SHIFT,
    FORMAT_VERSION,
    MessageStatus,
    decode_message,
    mapping_hook,
)

#: The bytes msgpack.packb(use_bin_type=True) gives; other Mappings of properties (the API
#: passes a read-only MappingProxyType) are encoded as dicts through the hook. The common
#: case, no properties at all, is swapped for one private empty dict (``properties or
#: _EMPTY``): the hook costs ~1 µs a call (an ABC isinstance and a dict), 9 % of a batch.
_pack = msgspec.msgpack.Encoder(enc_hook=mapping_hook).encode
_EMPTY: dict[str, str] = {}  # never handed out, never mutated
_b64 = binascii.b2a_base64
_V = FORMAT_VERSION
_SCHEDULED = MessageStatus.SCHEDULED.value
_DELIVERED = MessageStatus.DELIVERED.value
_U64 = struct.Struct(">Q")


def message_value(body: bytes, tags: str | None, keys: tuple[str, ...],
                  properties: Mapping[str, str], born_at: int, deliver_at: int,
                  flags: int) -> bytes:
    """== encode_message(MessageRecord(...)) (value of a timer column family)."""
    return _pack([_V, body, tags, keys, properties or _EMPTY, born_at, deliver_at, flags])


def index_value(status: str, deliver_at: int, updated_at: int, queue_offset: int | None = None,
                log_position: int | None = None, tx_id: str | None = None) -> bytes:
    """== encode_index(IndexEntry(...)); ``status`` is the MessageStatus value."""
    return _pack([_V, status, deliver_at, updated_at, queue_offset, log_position, tx_id])


def scheduled_values_py(messages: Sequence[Any],
                        at: int) -> list[tuple[bytes, bytes] | None]:
    """For each prepared message (scheduler.intake.PreparedMessage) due after ``at``: its
    timer value (== ``message_value``) and its index entry SCHEDULED at ``at`` (==
    ``index_value``); None for the ones due by then. One loop for a whole send batch."""
    pack, empty, v, scheduled = _pack, _EMPTY, _V, _SCHEDULED
    return [(pack([v, m.body, m.tags, m.keys, m.properties or empty, m.born_at, m.deliver_at,
                   m.flags]),
             pack([v, scheduled, m.deliver_at, at, None, None, m.tx_id]))
            if m.deliver_at > at else None for m in messages]


def _scheduled_values_native(messages: Sequence[Any],
                             at: int) -> list[tuple[bytes, bytes] | None]:
    """The same, in C (scheduler/_native.pyx), for a batch without properties; any other
    batch (properties, a value past int64, a string that cannot be encoded) is done by
    ``scheduled_values_py``, which raises where it must."""
    assert native is not None
    try:
        values: list[tuple[bytes, bytes] | None] = native.scheduled_values(
            messages if isinstance(messages, list) else list(messages), at)
    except (TypeError, OverflowError, UnicodeEncodeError):
        return scheduled_values_py(messages, at)
    return values


scheduled_values = scheduled_values_py if native is None else _scheduled_values_native


def delivered_properties(properties: Mapping[str, str]) -> Mapping[str, str]:
    """The properties a message is delivered with: without ``DELAY`` and the ``TIMER_*``
    properties, as RocketMQ clears them when a delayed message falls due (4.x
    ``messageTimeup``, 5.x ``TimerMessageStore``), so that a consumer re-sending it does not
    delay it again. ``properties`` itself when it holds none of them (no copy)."""
    for name in properties:
        if name == PROP_DELAY_LEVEL or name.startswith(PROP_TIMER_PREFIX):
            return {k: v for k, v in properties.items()
                    if k != PROP_DELAY_LEVEL and not k.startswith(PROP_TIMER_PREFIX)}
    return properties


def log_payload(topic: str, msg_id: str, queue_offset: int, body: bytes, tags: str | None,
                keys: tuple[str, ...], properties: Mapping[str, str], born_at: int,
                deliver_at: int, stored_at: int, flags: int) -> bytes:
    """== encode_log_record(LogRecord(...)), with ``delivered_properties``."""
    return _pack([_V, topic, msg_id, queue_offset, body, tags, keys,
                  delivered_properties(properties) if properties else _EMPTY,
                  born_at, deliver_at, stored_at, flags])


def log_payload_from_value(value: bytes, topic: str, msg_id: str, queue_offset: int,
                           deliver_at: int, stored_at: int) -> bytes:
    """The LogRecord payload of a stored MessageRecord value (a timer CF value), as
    ``encode_log_record`` would write it after ``decode_message`` (which checks the value),
    with ``delivered_properties`` (nothing to do for a message without properties)."""
    m = decode_message(value)
    props = m.properties
    return _pack([_V, topic, msg_id, queue_offset, m.body, m.tags, m.keys,
                  delivered_properties(props) if props else props,
                  m.born_at, deliver_at, stored_at, m.flags])


def log_payloads_py(values: list[bytes], topics: list[str], ikeys: list[bytes],
                    queue_offsets: list[int], deliver_ats: list[int],
                    stored_at: int) -> list[bytes]:
    """``log_payload_from_value`` of each stored value (a delivery commit's payloads); each
    msgId is read from its index key (``ikeys``: topic NUL msgId, ``split_due``'s column)."""
    return [log_payload_from_value(v, t, ikey_msg_id(k), o, at, stored_at)
            for v, t, k, o, at in zip(values, topics, ikeys, queue_offsets, deliver_ats,
                                      strict=True)]


def ikey_msg_id(ikey: bytes) -> str:
    """The msgId of an index key (topic NUL msgId); ValueError for one without a NUL or
    whose msgId is not UTF-8."""
    return ikey[ikey.index(0) + 1:].decode("utf-8")


def _log_payloads_native(values: list[bytes], topics: list[str], ikeys: list[bytes],
                         queue_offsets: list[int], deliver_ats: list[int],
                         stored_at: int) -> list[bytes]:
    """The same, in C (scheduler/_native.pyx); what it leaves (None: a message with
    properties, or a value not exactly as written) is done by ``log_payload_from_value``,
    which also raises for a value that cannot be decoded."""
    assert native is not None
    out: list[bytes | None] = native.log_payloads(values, topics, ikeys, queue_offsets,
                                                  deliver_ats, stored_at)
    for i, payload in enumerate(out):
        if payload is None:
            out[i] = log_payload_from_value(values[i], topics[i], ikey_msg_id(ikeys[i]),
                                            queue_offsets[i], deliver_ats[i], stored_at)
    return out  # type: ignore[return-value]  # no None left


log_payloads = log_payloads_py if native is None else _log_payloads_native


def split_due_py(items: list[tuple[bytes, bytes]]) -> tuple[
        list[bytes], list[bytes], list[int], list[str]]:
    """The columns of scanned (timer key, value) pairs: index keys, values, deliverAts,
    topics (storage.keys: key = deliverAt(8) + topic + NUL + msgId). One pass per column,
    no Python call per message; a topic's name is decoded once. The msgIds stay in the
    index keys: ``log_payloads`` reads them there (no str a message)."""
    ikeys = [key[8:] for key, _ in items]
    values = [value for _, value in items]
    deliver_ats = [at for (at,) in map(_U64.unpack_from, [k for k, _ in items])]
    names = [ikey.split(b"\x00", 1) for ikey in ikeys]
    topic_names = {raw: raw.decode("utf-8") for raw in {raw for raw, _ in names}}
    topics = [topic_names[raw] for raw, _ in names]  # (ValueError for a key without NUL)
    return ikeys, values, deliver_ats, topics


def _split_due_native(items: list[tuple[bytes, bytes]]) -> tuple[
        list[bytes], list[bytes], list[int], list[str]]:
    assert native is not None
    split = native.split_due(items)
    return split_due_py(items) if split is None else split  # (which raises)


def delivered_index_values_py(deliver_ats: list[int], now: int, offsets: list[int],
                              positions: list[int], tx_ids: list[str | None]) -> list[bytes]:
    """The index entries (DELIVERED) of a commit's messages."""
    return [index_value(_DELIVERED, at, now, offset, position, tx_id)
            for at, offset, position, tx_id in zip(deliver_ats, offsets, positions, tx_ids,
                                                   strict=True)]


def _delivered_index_values_native(deliver_ats: list[int], now: int, offsets: list[int],
                                   positions: list[int],
                                   tx_ids: list[str | None]) -> list[bytes]:
    assert native is not None
    if tx_ids.count(None) == len(tx_ids):
        values: list[bytes] | None = native.delivered_index_values(deliver_ats, now, offsets,
                                                                   positions)
        if values is not None:
            return values
    return delivered_index_values_py(deliver_ats, now, offsets, positions, tx_ids)


if native is None:
    split_due, delivered_index_values = split_due_py, delivered_index_values_py
else:
    split_due, delivered_index_values = _split_due_native, _delivered_index_values_native


def message_level(value: bytes) -> int:
    """The delay level (0: none) in the flags of a stored MessageRecord value."""
    return decode_message(value).flags >> FLAG_LEVEL_SHIFT


_keys_decoder = msgspec.msgpack.Decoder(list[bytes])


def encode_keys(keys: list[bytes]) -> bytes:
    """A list of keys as one value (msgpack array of bin): the index keys a delivery
    commit's one expiry entry names."""
    return _pack(keys)


def decode_keys(raw: bytes) -> list[bytes]:
    """The keys ``encode_keys`` wrote; msgspec.DecodeError / ValidationError otherwise."""
    return _keys_decoder.decode(raw)


def cancel_handle(timer_key: bytes) -> str:
    """== storage.keys.encode_handle(deliverAt, topic, msgId) of that timer key."""
    return _b64(_HANDLE_PREFIX + timer_key, newline=False).translate(_URLSAFE).rstrip(
        b"=").decode("ascii")


def cancel_handles_py(timer_keys: list[bytes]) -> list[str]:
    return list(map(cancel_handle, timer_keys))


def _cancel_handles_native(timer_keys: list[bytes]) -> list[str]:
    assert native is not None
    try:
        handles: list[str] = native.cancel_handles(timer_keys)
    except TypeError:  # (not bytes, or a key longer than any the engine makes)
        return cancel_handles_py(timer_keys)
    return handles


#: ``[cancel_handle(k) for k in timer_keys]``
cancel_handles = cancel_handles_py if native is None else _cancel_handles_native

_URLSAFE = bytes.maketrans(b"+/", b"-_")
_HANDLE_PREFIX = b"\x01"  # storage.keys handle version 1
