"""What comes in: validation of a send, its timing, its msgId, and the prepared form the
send path stores.

``Intake.prepare`` does no I/O: it checks the request, resolves when it is due
(scheduler/timing.py), generates a msgId when the client gave none, and encodes the timer
key, index key and stored record. A batch is prepared completely before anything is stored,
so one bad message rejects the whole batch and changes nothing.
"""

from __future__ import annotations

import itertools
import secrets
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.levels import DelayLevels
from scheduler.model import SendRequest
from scheduler.timing import resolve_timing
from storage.constants import MSG_ID_PATTERN, TOPIC_PATTERN, is_system_topic
from storage.errors import InvalidArgument, PayloadTooLarge, TopicInvalid
from storage.keys import encode_timer_key, pack_u64
from storage.records import MessageRecord


class MessageIdGenerator:
    """Unique, roughly time-sortable ids: 12 hex digits of epoch ms, 8 random hex digits
    drawn once per generator (so two processes, or a restart, never collide), and an 8-digit
    counter. 28 characters, all in ``[0-9A-F]``; unique for 2**32 ids per generator per ms."""

    def __init__(self) -> None:
        self._instance = secrets.token_hex(4).upper()
        self._counter = itertools.count()  # next() on a count is atomic under the GIL

    def next(self, now_ms: int) -> str:
        count = next(self._counter) & 0xFFFFFFFF
        return f"{now_ms & 0xFFFFFFFFFFFF:012X}{self._instance}{count:08X}"


@dataclass(slots=True, kw_only=True)
class PreparedMessage:
    """A validated send, ready to store. ``generated_id``: the engine made the msgId up, so
    it cannot be a re-send and needs no idempotency look-up."""

    topic: str
    msg_id: str
    generated_id: bool
    deliver_at: int
    level: int | None
    record: MessageRecord
    timer_key: bytes
    index_key: bytes
    shard: int
    tx_id: str | None = None


def topic_shard(topic: str, shards: int) -> int:
    """The timer shard of every message of ``topic``: one topic lives in one shard, so its
    scanner hands the topic's due messages on in deliver-time order, even when a backlog
    falls due at once (placement by (topic, msgId) would interleave shards in a catch-up)."""
    return zlib.crc32(topic.encode("utf-8")) % shards


def check_topic(topic: object, *, allow_system: bool = False) -> str:
    if not isinstance(topic, str) or not TOPIC_PATTERN.match(topic):
        raise TopicInvalid(f"topic {topic!r} does not match {TOPIC_PATTERN.pattern}")
    if not allow_system and is_system_topic(topic):
        raise TopicInvalid(f"{topic!r} is a system topic: it cannot be sent to")
    return topic


def check_msg_id(msg_id: object) -> str:
    if not isinstance(msg_id, str) or not MSG_ID_PATTERN.match(msg_id):
        raise InvalidArgument(f"msgId {msg_id!r} does not match {MSG_ID_PATTERN.pattern}")
    return msg_id


class Intake:
    def __init__(
        self, *, levels: DelayLevels, max_delay_ms: int, max_body_bytes: int,
        shards: int,
    ) -> None:
        self.levels = levels
        self._max_delay_ms = max_delay_ms
        self._max_body = max_body_bytes
        self._shards = shards
        self._ids = MessageIdGenerator()
        self._topics: set[str] = set()  # topics already validated (few; checked once each)

    def new_msg_id(self, now_ms: int) -> str:
        return self._ids.next(now_ms)

    def prepare(
        self, request: SendRequest, now_ms: int, *, flags: int = 0, allow_system: bool = False,
        tx_id: str | None = None,
    ) -> PreparedMessage:
        """Validate ``request`` and resolve it at ``now_ms``; raises InvalidArgument (or a
        subclass: TopicInvalid, DelayTooLong, PayloadTooLarge)."""
        topic = request.topic
        if topic not in self._topics:
            check_topic(topic, allow_system=allow_system)
            if not is_system_topic(topic):
                self._topics.add(topic)
        body = request.body
        if not isinstance(body, bytes):
            raise InvalidArgument("body must be bytes")
        if len(body) > self._max_body:
            raise PayloadTooLarge(f"body is {len(body)} bytes; the maximum is {self._max_body}")
        _check_attributes(request)
        timing = resolve_timing(
            now_ms=now_ms, levels=self.levels, max_delay_ms=self._max_delay_ms,
            deliver_at=request.deliver_at, delay_ms=request.delay_ms,
            delay_level=request.delay_level, properties=request.properties)
        if request.msg_id is None:
            msg_id, generated = self._ids.next(now_ms), True
        else:
            msg_id, generated = check_msg_id(request.msg_id), False
        record = MessageRecord(
            body=body, tags=request.tags, keys=tuple(request.keys),
            properties=dict(request.properties), born_at=now_ms,
            deliver_at=timing.deliver_at, flags=flags)
        timer_key = encode_timer_key(timing.deliver_at, topic, msg_id)
        return PreparedMessage(
            topic=topic, msg_id=msg_id, generated_id=generated, deliver_at=timing.deliver_at,
            level=timing.level, record=record, timer_key=timer_key,
            index_key=timer_key[8:], shard=topic_shard(topic, self._shards), tx_id=tx_id)


def _check_attributes(request: SendRequest) -> None:
    if request.tags is not None and not isinstance(request.tags, str):
        raise InvalidArgument("tags must be a string")
    if isinstance(request.keys, str) or not all(isinstance(k, str) for k in request.keys):
        raise InvalidArgument("keys must be a list of strings")
    props = request.properties
    if not isinstance(props, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise InvalidArgument("properties must map strings to strings")


def expiry_key(expires_at: int, index_key: bytes) -> bytes:
    """Key of the expiry column family: 8-byte expiresAt + index key (topic NUL msgId)."""
    return pack_u64(expires_at) + index_key


__all__ = ["Intake", "MessageIdGenerator", "PreparedMessage", "check_msg_id",
           "check_topic", "expiry_key", "topic_shard"]
