"""What comes in: validation of a send, its timing, its msgId, and the prepared form the
send path stores.

``Intake.prepare`` does no I/O: it checks the request, resolves when it is due
(scheduler/timing.py), generates a msgId when the client gave none, and builds the timer key,
the index key and the shard. A batch is prepared completely before anything is stored, so
one bad message rejects the whole batch and changes nothing.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from scheduler.codec import cancel_handles, message_value
from scheduler.levels import DelayLevels
from scheduler.model import SendOutcome, SendRequest
from scheduler.native import native
from scheduler.timing import resolve_timing
from storage.constants import (
    MSG_ID_PATTERN,
    PROP_TIMER_DEL_UNIQKEY,
    TOPIC_PATTERN,
    is_system_topic,
)
from storage.errors import InvalidArgument, PayloadTooLarge, TopicInvalid
from storage.keys import SEP, pack_u64, topic_shard
from storage.records import FLAG_LEVEL_SHIFT, MessageRecord, MessageStatus


class MessageIdGenerator:
    """Unique, roughly time-sortable ids: 12 hex digits of epoch ms, 8 random hex digits
    drawn once per generator (so two processes, or a restart, never collide), and an 8-digit
    counter. 28 characters, all in ``[0-9A-F]``; unique for 2**32 ids per generator per ms."""

    def __init__(self) -> None:
        self._instance = secrets.token_hex(4).upper()
        self._counter = itertools.count()  # next() on a count is atomic under the GIL
        self._prefix = (-1, "")  # (ms, its first 20 characters): one tuple, swapped atomically

    def next(self, now_ms: int) -> str:
        count = next(self._counter) & 0xFFFFFFFF
        return self.prefix(now_ms) + f"{count:08X}"

    def prefix(self, now_ms: int) -> str:
        """The first 20 characters of the ids made at ``now_ms``; the counter's low 32 bits
        (``counter``), in 8 hex digits, follow."""
        ms, prefix = self._prefix
        if ms != now_ms:  # a batch shares one ms: format it once
            prefix = f"{now_ms & 0xFFFFFFFFFFFF:012X}{self._instance}"
            self._prefix = (now_ms, prefix)
        return prefix

    @property
    def counter(self) -> Iterator[int]:
        return self._counter


class PreparedMessage(msgspec.Struct, kw_only=True, gc=False):
    """A validated send, ready to store. ``generated_id``: the engine made the msgId up, so
    it cannot be a re-send and needs no idempotency look-up (always False for a cancel
    marker: the send path sorts the markers out of the messages it looks up, so that
    messages without properties pay nothing for them). ``cancels``: the msgId, in the same
    topic, that this message cancels (RocketMQ's TIMER_DEL_UNIQKEY); such a marker is never
    stored nor delivered itself (scheduler/writes.py). ``record`` is the stored
    MessageRecord, built on demand (the hot paths encode the fields directly). A Struct: a
    batch builds one per message, and its constructor runs in C."""

    topic: str
    msg_id: str
    generated_id: bool
    deliver_at: int
    level: int | None
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: Mapping[str, str]
    born_at: int
    flags: int
    timer_key: bytes
    index_key: bytes
    shard: int
    tx_id: str | None = None
    cancels: str | None = None

    @property
    def record(self) -> MessageRecord:
        return MessageRecord(body=self.body, tags=self.tags, keys=self.keys,
                             properties=self.properties, born_at=self.born_at,
                             deliver_at=self.deliver_at, flags=self.flags)

    @record.setter
    def record(self, record: MessageRecord) -> None:
        """Replace the stored fields (deliver_at and the keys stay as prepared)."""
        self.body, self.tags, self.keys = record.body, record.tags, tuple(record.keys)
        self.properties, self.born_at, self.flags = record.properties, record.born_at, \
            record.flags

    def value(self) -> bytes:
        """The encoded MessageRecord (value of the timer column family)."""
        return message_value(self.body, self.tags, self.keys, self.properties, self.born_at,
                             self.deliver_at, self.flags)


@dataclass(frozen=True, slots=True)
class ColumnBatch:
    """A send batch of *body-only* messages as columns (``Intake.columns``): for each message, its
    msgId, deliverAt, timer key, index key, stored value (MessageRecord) and SCHEDULED index
    entry; ``given``: the index keys of the msgIds the client chose. No object per message:
    the send path's common case (bodies due later, nothing else) stores these as they are.
    ``topic`` and ``shard`` are the first message's; ``topics`` and ``shards`` each
    message's when the batch holds more than one topic (only ``Broker.send_batch``'s can),
    else None."""

    topic: str
    shard: int
    msg_ids: list[str] | None  # None: read them from the index keys (``ids``)
    deliver_ats: list[int]
    timer_keys: list[bytes]
    index_keys: list[bytes]
    values: list[bytes]
    entries: list[bytes]
    given: list[bytes]
    topics: list[str] | None = None
    shards: list[int] | None = None

    def deliver_ats_by_topic(self) -> dict[str, list[int]]:
        if self.topics is None:
            return {self.topic: self.deliver_ats}
        out: dict[str, list[int]] = {}
        for topic, at in zip(self.topics, self.deliver_ats, strict=True):
            ats = out.get(topic)
            if ats is None:
                out[topic] = [at]
            else:
                ats.append(at)
        return out

    def ids(self) -> list[str]:
        """The msgIds, in order: ``msg_ids``, else from the index keys (one topic's: its name
        and NUL, then the msgId, ASCII), made only for an answer that shows them."""
        if self.msg_ids is not None:
            return self.msg_ids
        skip = len(self.topic.encode("utf-8")) + len(SEP)
        if native is not None:
            ids: list[str] = native.key_tails(self.index_keys, skip)
            return ids
        return [key[skip:].decode("ascii") for key in self.index_keys]

    def results(self) -> list[SendOutcome]:
        """What the send path answers for these messages, stored and none a duplicate."""
        scheduled = MessageStatus.SCHEDULED
        topics = [self.topic] * len(self.index_keys) if self.topics is None else self.topics
        return [SendOutcome(msg_id=msg_id, topic=topic, deliver_at=at, status=scheduled,
                           cancel_handle=handle)
                for msg_id, topic, at, handle in zip(self.ids(), topics, self.deliver_ats,
                                                     cancel_handles(self.timer_keys),
                                                     strict=True)]


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
        shards: int, max_record_bytes: int | None = None,
    ) -> None:
        self.levels = levels
        self._max_delay_ms = max_delay_ms
        self._max_body = max_body_bytes
        # body + attributes: beyond it the log record would not fit in a CommitLog segment
        self._max_record = max_body_bytes if max_record_bytes is None else max_record_bytes
        self._shards = shards
        self._ids = MessageIdGenerator()
        # topics already validated -> (key part "topic NUL", shard); few, checked once each
        self._topics: dict[str, tuple[bytes, int]] = {}

    def new_msg_id(self, now_ms: int) -> str:
        return self._ids.next(now_ms)

    def columns(self, topic: str, messages: list[Any] | bytes, now_ms: int,
                unset: object = None, *, max_count: int = 0,
                json: bool = False) -> ColumnBatch | None:
        """The columns of a batch of body-only messages (``scheduler._native.batch_columns``: bodies
        due later, no tags, keys, properties nor level) to a topic sent to before, as
        ``prepare`` would make them at ``now_ms``: from the decoded request (a list of
        api.schemas.MessageIn, ``unset`` marking an absent field), from a msgpack request
        body of at most ``max_count`` messages (``msgpack_columns``; ``json``: a JSON body,
        ``json_columns``), not decoded first, or
        from the engine's SendRequests (``request_columns``; ``topic``: the first one's, and
        others may follow). None for any other batch, and without the compiled extension:
        ``prepare`` takes it (tests/api/test_columns_send.py holds the paths equal)."""
        if native is None:
            return None
        ids = self._ids
        if messages and type(messages[0]) is SendRequest:  # the engine's own (send_batch)
            made = native.request_columns(messages, self._topics, now_ms, self._max_delay_ms,
                                         self._max_body, ids.prefix(now_ms), ids.counter)
            if made is None:
                return None
            (msg_ids, deliver_ats, timer_keys, index_keys, values, entries, given), topics, \
                shards = made
            return ColumnBatch(topic, self._topics[topic][1], msg_ids, deliver_ats, timer_keys,
                              index_keys, values, entries, given, topics, shards)
        known = self._topics.get(topic)
        if known is None:
            return None
        if isinstance(messages, bytes):
            columns = (native.json_columns if json else native.msgpack_columns)(
                messages, max_count, known[0], now_ms, self._max_delay_ms, self._max_body,
                ids.prefix(now_ms), ids.counter)
        else:
            columns = native.batch_columns(messages, known[0], now_ms, self._max_delay_ms,
                                         self._max_body, unset, ids.prefix(now_ms),
                                         ids.counter)
        return None if columns is None else ColumnBatch(topic, known[1], *columns)

    def prepare(
        self, request: SendRequest, now_ms: int, *, flags: int = 0, allow_system: bool = False,
        tx_id: str | None = None,
    ) -> PreparedMessage:
        """Validate ``request`` and resolve it at ``now_ms``; raises InvalidArgument (or a
        subclass: TopicInvalid, DelayTooLong, PayloadTooLarge)."""
        topic = request.topic
        known = self._topics.get(topic)
        if known is None:  # (system topics are never cached)
            check_topic(topic, allow_system=allow_system)
            known = (topic.encode("utf-8") + SEP, topic_shard(topic, self._shards))
            if not is_system_topic(topic):
                self._topics[topic] = known
        body = request.body
        if type(body) is not bytes:
            raise InvalidArgument("body must be bytes")
        if len(body) > self._max_body:
            raise PayloadTooLarge(f"body is {len(body)} bytes; the maximum is {self._max_body}")
        tags, keys, props = request.tags, request.keys, request.properties
        cancels = None
        if tags is not None or keys or props:
            _check_attributes(tags, keys, props)
            size = len(body) + _attribute_bytes(tags, keys, props)
            if size > self._max_record:
                raise PayloadTooLarge(f"body and attributes are {size} bytes; a message holds "
                                      f"at most {self._max_record}")
            if props and not allow_system:  # (the engine's own system-topic sends: never)
                cancels = _cancel_target(topic, props)
        at, delay, level = request.deliver_at, request.delay_ms, None
        # the common cases, checked inline: no timing (now), deliverAt, or delayMs in range
        if request.delay_level is None and not props and (
                (delay is None and (at is None or (
                    type(at) is int and 0 <= at <= now_ms + self._max_delay_ms)))
                or (at is None and type(delay) is int and 0 <= delay <= self._max_delay_ms)):
            at = now_ms + delay if delay is not None else now_ms if at is None else at
        else:
            timing = resolve_timing(
                now_ms=now_ms, levels=self.levels, max_delay_ms=self._max_delay_ms,
                deliver_at=at, delay_ms=request.delay_ms, delay_level=request.delay_level,
                properties=props)
            at, level = timing.deliver_at, timing.level
            if level is not None:  # kept with the message (scheduler/backlog.py)
                flags |= level << FLAG_LEVEL_SHIFT
        if request.msg_id is None:
            msg_id, generated = self._ids.next(now_ms), cancels is None
        else:
            msg_id, generated = check_msg_id(request.msg_id), False
        index_key = known[0] + msg_id.encode("utf-8")
        prepared = PreparedMessage(
            topic=topic, msg_id=msg_id, generated_id=generated, deliver_at=at, level=level,
            body=body, tags=tags, keys=keys if type(keys) is tuple else tuple(keys),
            properties=props, born_at=now_ms, flags=flags, timer_key=pack_u64(at) + index_key,
            index_key=index_key, shard=known[1], tx_id=tx_id)
        if cancels is not None:
            prepared.cancels = cancels
        return prepared


def _check_attributes(tags: object, keys: object, props: object) -> None:
    if tags is not None and not isinstance(tags, str):
        raise InvalidArgument("tags must be a string")
    if isinstance(keys, str) or not isinstance(keys, tuple | list) or not all(
            isinstance(k, str) for k in keys):
        raise InvalidArgument("keys must be a list of strings")
    if not isinstance(props, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in props.items()):
        raise InvalidArgument("properties must map strings to strings")


def _attribute_bytes(tags: str | None, keys: object, props: Mapping[str, str]) -> int:
    """UTF-8 bytes of the attributes (checked by ``_check_attributes``): a bound of what
    they add to the log record, with a few bytes of framing each."""
    assert isinstance(keys, tuple | list)
    return (len((tags or "").encode()) + sum(len(k.encode()) + 5 for k in keys)
            + sum(len(k.encode()) + len(v.encode()) + 10 for k, v in props.items()))
def _cancel_target(topic: str, properties: Mapping[str, str]) -> str | None:
    """The msgId a TIMER_DEL_UNIQKEY property names: the bare msgId, or RocketMQ 5's
    ``topic+msgId`` (the topic must be the send's own: a marker cancels in its topic only)."""
    value = properties.get(PROP_TIMER_DEL_UNIQKEY)
    if value is None:
        return None
    named, plus, msg_id = value.rpartition("+")
    if plus and named != topic:
        raise InvalidArgument(f"{PROP_TIMER_DEL_UNIQKEY} {value!r} names topic {named!r}; a "
                              f"cancel marker cancels a message of its own topic {topic!r}")
    try:
        return check_msg_id(msg_id)
    except InvalidArgument:
        raise InvalidArgument(f"{PROP_TIMER_DEL_UNIQKEY} {value!r} is not a msgId nor "
                              f"topic+msgId") from None


def expiry_key(expires_at: int, index_key: bytes) -> bytes:
    """Key of the expiry column family: 8-byte expiresAt + index key (topic NUL msgId)."""
    return pack_u64(expires_at) + index_key


#: After the 8-byte expiresAt, what marks the expiry entry of one whole delivery commit (no
#: index key starts with NUL; transaction entries have NUL "t/" there)
EXPIRY_GROUP_MARK = SEP + b"\x01"


def expiry_group_key(expires_at: int, position: int) -> bytes:
    """Key of the ONE expiry entry of a delivery commit: 8-byte expiresAt, NUL 0x01, the
    8-byte log position of its first record (unique); its value lists the index keys of
    every message the commit delivered (scheduler/codec.py ``encode_keys``)."""
    return pack_u64(expires_at) + EXPIRY_GROUP_MARK + pack_u64(position)


__all__ = [
    "EXPIRY_GROUP_MARK",
    "ColumnBatch",
    "Intake",
    "MessageIdGenerator",
    "PreparedMessage",
    "check_msg_id",
    "check_topic",
    "expiry_group_key",
    "expiry_key",
    "topic_shard",
]
