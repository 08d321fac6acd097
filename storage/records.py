"""Value codecs (msgpack) for the records hourglass stores.

Every record is a msgpack array whose first element is its format version. Decoders accept
arrays with trailing fields they do not know (written by a newer version) and fill fields a
shorter (older) array lacks with their defaults, so the format can evolve by appending fields.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

import msgpack

from storage.errors import CorruptionError

FORMAT_VERSION = 1


class MessageStatus(enum.StrEnum):
    SCHEDULED = "SCHEDULED"
    DELIVERED = "DELIVERED"
    CANCELLED = "CANCELLED"
    PREPARED = "PREPARED"
    ROLLED_BACK = "ROLLED_BACK"
    DISCARDED = "DISCARDED"

    def __str__(self) -> str:
        return self.value


FINAL_STATUSES = frozenset(
    {MessageStatus.DELIVERED, MessageStatus.CANCELLED, MessageStatus.ROLLED_BACK,
     MessageStatus.DISCARDED}
)

# MessageRecord.flags bits
FLAG_IMMEDIATE = 1  # was due on arrival: never stored in a timer column family
FLAG_TRANSACTIONAL = 2  # came from a committed half message
FLAG_DISCARDED = 4  # a half message discarded into TRANS_CHECK_MAX_TIME_TOPIC


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageRecord:
    """A message waiting for its time (value of the timer and half column families)."""

    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    born_at: int = 0
    deliver_at: int = 0
    flags: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class LogRecord:
    """A delivered message as it is appended to the CommitLog.

    ``queue_offset`` is the message's offset in its topic's consume queue, assigned at append
    time, so the consume queues can be rebuilt from the log alone and replay is idempotent.
    """

    topic: str
    msg_id: str
    queue_offset: int
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    born_at: int = 0
    deliver_at: int = 0
    stored_at: int = 0
    flags: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class IndexEntry:
    """State of one (topic, msgId): value of the index column family."""

    status: MessageStatus
    deliver_at: int
    updated_at: int = 0
    queue_offset: int | None = None
    log_position: int | None = None
    tx_id: str | None = None


R = TypeVar("R", MessageRecord, LogRecord, IndexEntry)

_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in (MessageRecord, LogRecord, IndexEntry)
}


_OPT_STR = (str, type(None))
_OPT_INT = (int, type(None))
#: the type each stored field must decode to, in field order; checked on decode so that bytes
#: which slipped past the checksums fail here as CorruptionError, not later as a TypeError
_TYPES: dict[type, tuple[tuple[type, ...], ...]] = {
    MessageRecord: ((bytes,), _OPT_STR, (tuple,), (dict,), (int,), (int,), (int,)),
    LogRecord: ((str,), (str,), (int,), (bytes,), _OPT_STR, (tuple,), (dict,), (int,), (int,),
                (int,), (int,)),
    IndexEntry: ((str,), (int,), (int,), _OPT_INT, _OPT_INT, _OPT_STR),
}


def _check_types(cls: type, values: tuple[Any, ...]) -> None:
    """``values``: the record's fields in order (a prefix of them, for an older record)."""
    for name, value, types in zip(_FIELDS[cls], values, _TYPES[cls], strict=False):
        if not isinstance(value, types):
            raise CorruptionError(f"cannot decode {cls.__name__}: {name} is a "
                                  f"{type(value).__name__}")
    if cls is not IndexEntry:
        at = 5 if cls is LogRecord else 2  # position of keys; properties follow
        keys = values[at] if len(values) > at else ()
        props = values[at + 1] if len(values) > at + 1 else {}
        if (keys and not all(isinstance(k, str) for k in keys)) or (props and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in props.items())):
            raise CorruptionError(f"cannot decode {cls.__name__}: keys and properties must "
                                  "be strings")


def _pack(obj: Any) -> bytes:
    names = _FIELDS[type(obj)]
    values: list[Any] = [FORMAT_VERSION]
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, MessageStatus):
            value = value.value
        elif isinstance(value, Mapping):
            value = dict(value)
        values.append(value)
    return msgpack.packb(values, use_bin_type=True)


def _unpack(cls: type[R], raw: bytes) -> R:
    try:
        values = msgpack.unpackb(raw, raw=False, use_list=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CorruptionError(f"cannot decode {cls.__name__}: {exc}") from exc
    if not isinstance(values, tuple) or not values or not isinstance(values[0], int):
        raise CorruptionError(f"cannot decode {cls.__name__}: not a versioned record")
    names = _FIELDS[cls]
    fields_ = values[1 : len(names) + 1]
    _check_types(cls, fields_)
    kwargs = dict(zip(names, fields_, strict=False))
    try:
        if cls is IndexEntry and "status" in kwargs:
            kwargs["status"] = MessageStatus(kwargs["status"])
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise CorruptionError(f"cannot decode {cls.__name__}: {exc}") from exc


def encode_message(record: MessageRecord) -> bytes:
    return _pack(record)


def decode_message(raw: bytes) -> MessageRecord:
    return _unpack(MessageRecord, raw)


def encode_log_record(record: LogRecord) -> bytes:
    return _pack(record)


def decode_log_record(raw: bytes) -> LogRecord:
    return _unpack(LogRecord, raw)


def encode_index(entry: IndexEntry) -> bytes:
    return _pack(entry)


def decode_index(raw: bytes) -> IndexEntry:
    return _unpack(IndexEntry, raw)
