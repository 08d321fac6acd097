"""Key codecs: timer keys, index keys, consume-queue keys and cancel handles.

Timer key = 8-byte big-endian unsigned ``deliverAt`` (epoch ms) + topic (UTF-8) + NUL + msgId.
Topics may not contain NUL, so the separator is unambiguous, and since every topic byte is
greater than NUL, the byte order of keys equals the order of (deliverAt, topic, msgId)
(strings compared by their UTF-8 bytes, i.e. by code point).
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib

from storage.errors import InvalidArgument, NotFound

_U64 = struct.Struct(">Q")
SEP = b"\x00"
MAX_U64 = (1 << 64) - 1
_HANDLE_VERSION = 1


def _utf8(name: str, value: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: not a valid name, not a server error
        raise InvalidArgument(f"{name} is not valid Unicode text") from None


def _check_part(name: str, value: str) -> bytes:
    raw = _utf8(name, value)
    if not raw:
        raise InvalidArgument(f"{name} must not be empty")
    if SEP in raw:
        raise InvalidArgument(f"{name} must not contain NUL")
    return raw


def pack_u64(value: int) -> bytes:
    if not 0 <= value <= MAX_U64:
        raise InvalidArgument(f"{value} is out of the unsigned 64-bit range")
    return _U64.pack(value)


def unpack_u64(raw: bytes, offset: int = 0) -> int:
    return int(_U64.unpack_from(raw, offset)[0])


def encode_timer_key(deliver_at: int, topic: str, msg_id: str) -> bytes:
    """Order-preserving key of a timed entry (delayed message or half message)."""
    return pack_u64(deliver_at) + _check_part("topic", topic) + SEP + _utf8("msgId", msg_id)


def decode_timer_key(key: bytes) -> tuple[int, str, str]:
    if len(key) < 10:
        raise InvalidArgument("timer key too short")
    sep = key.find(SEP, 8)
    if sep <= 8:
        raise InvalidArgument("timer key has no topic separator")
    try:
        return unpack_u64(key), key[8:sep].decode("utf-8"), key[sep + 1 :].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("timer key is not UTF-8") from None


def time_bound(deliver_at: int) -> bytes:
    """The smallest key whose deliverAt is ``deliver_at``: scan
    ``[time_bound(a), time_bound(b))`` for every key with a <= deliverAt < b.
    For "due at or before now" use ``time_bound(now + 1)``."""
    return pack_u64(min(max(deliver_at, 0), MAX_U64))


def index_key(topic: str, msg_id: str) -> bytes:
    return _check_part("topic", topic) + SEP + _utf8("msgId", msg_id)


def decode_index_key(key: bytes) -> tuple[str, str]:
    sep = key.find(SEP)
    if sep <= 0:
        raise InvalidArgument("index key has no topic separator")
    try:
        return key[:sep].decode("utf-8"), key[sep + 1 :].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("index key is not UTF-8") from None


def topic_prefix(topic: str) -> bytes:
    """Prefix shared by every index / consume-queue key of ``topic``."""
    return _check_part("topic", topic) + SEP


def cq_key(topic: str, queue_offset: int) -> bytes:
    return topic_prefix(topic) + pack_u64(queue_offset)


def decode_cq_key(key: bytes) -> tuple[str, int]:
    sep = key.find(SEP)
    if sep <= 0 or len(key) != sep + 9:
        raise InvalidArgument("malformed consume-queue key")
    try:
        return key[:sep].decode("utf-8"), unpack_u64(key, sep + 1)
    except UnicodeDecodeError:
        raise InvalidArgument("consume-queue key is not UTF-8") from None


def encode_handle(deliver_at: int, topic: str, msg_id: str) -> str:
    """Opaque cancel handle: it carries the timer key, so cancelling needs no index look-up."""
    raw = bytes([_HANDLE_VERSION]) + encode_timer_key(deliver_at, topic, msg_id)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_handle(handle: str) -> tuple[int, str, str]:
    """(deliverAt, topic, msgId) of a handle; a handle that is not one of ours is NotFound."""
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
        if not raw or raw[0] != _HANDLE_VERSION:
            raise ValueError("unknown handle version")
        return decode_timer_key(raw[1:])
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise NotFound(f"unknown cancel handle {handle!r}") from exc


def topic_shard(topic: str, shards: int) -> int:
    """The timer shard of every message of ``topic``: one topic lives in one shard, so its
    scanner hands the topic's due messages on in deliver-time order, even when a backlog
    falls due at once (placement by (topic, msgId) would interleave shards in a catch-up)."""
    return zlib.crc32(topic.encode("utf-8")) % shards
