"""Value codecs (msgpack) for the records hourglass stores.

Every record is a msgpack array whose first element is its format version. Decoders accept
arrays with trailing fields they do not know (written by a newer version) and fill fields a
shorter (older) array lacks with their defaults, so the format can evolve by appending fields.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from storage.errors import CorruptionError
from storage.native import native

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
FLAG_BATCH = 8  # due on arrival in a send batch that also stored scheduled messages: it
# counts only with that batch's RocksDB write, never by replay (scheduler/committer.py)
FLAG_LEVEL_SHIFT = 8  # flags >> 8: the RocketMQ delay level the message was sent with (0: none)


class _Record(msgspec.Struct, frozen=True, kw_only=True, array_like=True, gc=False):
    """Base of the stored records: a msgpack array, the format version first. Decoding
    checks every field's type (bytes that slipped past the checksums fail as
    CorruptionError, not later as a TypeError), ignores trailing fields it does not know and
    fills missing trailing fields with their defaults. Untracked by the cyclic GC (``gc``):
    they hold only strings, numbers and containers of them, and a pull decodes 1000 at once,
    which would otherwise set off a collection or two each time."""

    version: int = FORMAT_VERSION


class MessageRecord(_Record, frozen=True, kw_only=True, array_like=True, gc=False):
    """A message waiting for its time (value of the timer and half column families)."""

    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = msgspec.field(default_factory=dict)
    born_at: int = 0
    deliver_at: int = 0
    flags: int = 0


class LogRecord(_Record, frozen=True, kw_only=True, array_like=True, gc=False):
    """A delivered message as it is appended to the CommitLog, and as a pull returns it.

    ``queue_offset`` is the message's offset in its topic's consume queue, assigned at append
    time, so the consume queues can be rebuilt from the log alone and replay is idempotent.
    """

    topic: str
    msg_id: str
    queue_offset: int
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = msgspec.field(default_factory=dict)
    born_at: int = 0
    deliver_at: int = 0
    stored_at: int = 0
    flags: int = 0

    @property
    def offset(self) -> int:
        """The queue offset (the name a consumer knows it by)."""
        return self.queue_offset


class IndexEntry(_Record, frozen=True, kw_only=True, array_like=True, gc=False):
    """State of one (topic, msgId): value of the index column family."""

    status: MessageStatus
    deliver_at: int
    updated_at: int = 0
    queue_offset: int | None = None
    log_position: int | None = None
    tx_id: str | None = None


R = TypeVar("R", MessageRecord, LogRecord, IndexEntry)


def mapping_hook(obj: Any) -> Any:
    """msgspec enc_hook: any other Mapping is encoded as the dict it holds."""
    if isinstance(obj, Mapping):  # e.g. a read-only MappingProxyType of properties
        return dict(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_encoder = msgspec.msgpack.Encoder(enc_hook=mapping_hook)
_decoders: dict[type, msgspec.msgpack.Decoder[Any]] = {
    cls: msgspec.msgpack.Decoder(cls) for cls in (MessageRecord, LogRecord, IndexEntry)}
_log_decoder = msgspec.msgpack.Decoder(LogRecord)


def _pack(obj: _Record) -> bytes:
    return _encoder.encode(obj)


def _unpack(cls: type[R], raw: bytes) -> R:
    try:
        record: R = _decoders[cls].decode(raw)
    except (msgspec.DecodeError, ValueError) as exc:  # ValidationError is a DecodeError
        raise CorruptionError(f"cannot decode {cls.__name__}: {exc}") from None
    return record


def fields_of(cls: type[_Record]) -> tuple[str, ...]:
    """The stored fields of a record type, in order, after the format version."""
    return cls.__struct_fields__[1:]


def encode_message(record: MessageRecord) -> bytes:
    return _pack(record)


def decode_message(raw: bytes) -> MessageRecord:
    return _unpack(MessageRecord, raw)


def encode_log_record(record: LogRecord) -> bytes:
    return _pack(record)


def decode_log_record(raw: bytes) -> LogRecord:
    return _unpack(LogRecord, raw)


def decode_log_records(payloads: list[bytes]) -> list[LogRecord]:
    """``[decode_log_record(p) for p in payloads]``, the loop in C."""
    try:
        return list(map(_log_decoder.decode, payloads))
    except (msgspec.DecodeError, ValueError) as exc:
        raise CorruptionError(f"cannot decode LogRecord: {exc}") from None


class _LogHead(_Record, frozen=True, kw_only=True, array_like=True, gc=False):
    """The first fields of a LogRecord (the decoder skips the rest unread)."""

    topic: str
    msg_id: str
    queue_offset: int


_head_decoder = msgspec.msgpack.Decoder(_LogHead)


def log_record_head(payload: bytes) -> _LogHead:
    """Topic, msgId and queue offset of a LogRecord, the rest unread."""
    try:
        return _head_decoder.decode(payload)
    except (msgspec.DecodeError, ValueError) as exc:
        raise CorruptionError(f"cannot decode LogRecord: {exc}") from None


def log_record_offsets_py(payloads: list[bytes]) -> list[int]:
    """The queue offset of each LogRecord in ``payloads``, read from its head: about half
    the CPU of decoding them whole (the rest is checked when it is decoded or transcoded)."""
    try:
        return [head.queue_offset for head in map(_head_decoder.decode, payloads)]
    except (msgspec.DecodeError, ValueError) as exc:
        raise CorruptionError(f"cannot decode LogRecord: {exc}") from None


def _log_record_offsets_native(payloads: list[bytes]) -> list[int]:
    """The same, the heads read in C (storage/_native.pyx); a list with anything else than
    records as written goes to ``log_record_offsets_py``, which raises where it must."""
    assert native is not None
    offsets: list[int] | None = native.record_offsets(payloads)
    return log_record_offsets_py(payloads) if offsets is None else offsets


log_record_offsets = log_record_offsets_py if native is None else _log_record_offsets_native


def encode_index(entry: IndexEntry) -> bytes:
    return _pack(entry)


def decode_index(raw: bytes) -> IndexEntry:
    return _unpack(IndexEntry, raw)
