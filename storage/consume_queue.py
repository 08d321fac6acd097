"""ConsumeQueue: per topic, queue offset -> (CommitLog position, payload size), in the ``cq`` CF.

Key = topic NUL 8-byte big-endian queue offset (storage/keys.py ``cq_key``), so one topic's
entries are contiguous and in offset order; value = 8-byte BE position + 4-byte BE size.
Reading N entries from offset O is one seek and N iterator steps (bounded by the key of
O + N), not N look-ups. Entries are written inside the caller's batch, next to the
timer deletes and index updates of the same delivery, so they commit atomically with them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from operator import itemgetter

from storage.commitlog import CommitLog
from storage.constants import CF_CQ
from storage.errors import CorruptionError, InvalidArgument
from storage.keys import MAX_U64, cq_key, topic_prefix
from storage.records import decode_log_record
from storage.timer_store import Batch, TimerStore

VALUE = struct.Struct(">QI")
_OFFSET = struct.Struct(">Q")
REBUILD_BATCH = 4096
_first = itemgetter(0)


@dataclass(frozen=True, kw_only=True, slots=True)
class CqEntry:
    queue_offset: int
    position: int
    size: int


class ConsumeQueue:
    def __init__(self, store: TimerStore) -> None:
        self._store = store

    @staticmethod
    def put(batch: Batch, topic: str, queue_offset: int, position: int, size: int) -> None:
        """Add entry ``queue_offset`` of ``topic`` to ``batch``."""
        if not (0 <= position <= MAX_U64 and 0 <= size < 1 << 32):
            raise InvalidArgument(f"bad consume-queue entry: position {position}, size {size}")
        batch.put(CF_CQ, cq_key(topic, queue_offset), VALUE.pack(position, size))

    @staticmethod
    def put_many(batch: Batch, topic: str, entries: list[tuple[int, int, int]]) -> None:
        """Add (queue_offset, position, size) entries of one topic to ``batch``."""
        prefix, pack_offset, pack_value = topic_prefix(topic), _OFFSET.pack, VALUE.pack
        try:
            batch.put_many(CF_CQ, [(prefix + pack_offset(o), pack_value(p, s))
                                   for o, p, s in entries])
        except struct.error as exc:
            raise InvalidArgument(f"bad consume-queue entry: {exc}") from None

    def read(self, topic: str, offset: int, n: int) -> list[CqEntry]:
        """Entries ``offset`` .. ``offset + n - 1`` of ``topic`` that exist, in order."""
        keys, packed, cut = self._entries(topic, offset, n)
        return [CqEntry(queue_offset=_OFFSET.unpack_from(key, cut)[0], position=position,
                        size=size)
                for key, (position, size) in zip(keys, VALUE.iter_unpack(packed), strict=True)]

    def positions(self, topic: str, offset: int, n: int) -> list[int]:
        """The CommitLog positions of the entries ``read`` returns: the pull path, without a
        Python step per entry (the checks and the unpacking run in C)."""
        return list(map(_first, VALUE.iter_unpack(self._entries(topic, offset, n)[1])))

    def _entries(self, topic: str, offset: int, n: int) -> tuple[tuple[bytes, ...], bytes, int]:
        """The keys of offsets [offset, offset + n) that exist, their values joined, and the
        key prefix length; CorruptionError for an entry of the wrong shape."""
        if offset < 0 or n < 0:
            raise InvalidArgument("offset and n must be >= 0")
        prefix = topic_prefix(topic)
        cut = len(prefix)
        if n == 0 or offset > MAX_U64:
            return (), b"", cut
        start = prefix + _OFFSET.pack(offset)
        end = prefix + _OFFSET.pack(offset + n) if offset + n <= MAX_U64 else _after(prefix)
        pairs = self._store.read_range(CF_CQ, start, end, n)
        if not pairs:
            return (), b"", cut
        keys, values = zip(*pairs, strict=True)
        if set(map(len, keys)) != {cut + 8} or set(map(len, values)) != {VALUE.size}:
            bad = next(k for k, v in pairs if len(k) != cut + 8 or len(v) != VALUE.size)
            raise CorruptionError(f"malformed consume-queue entry {bad!r}")
        return keys, b"".join(values), cut

    def end_offset(self, topic: str) -> int:
        """The next queue offset of ``topic`` (0 for a topic with no entries)."""
        prefix = topic_prefix(topic)
        last = self._store.read_range(CF_CQ, prefix, _after(prefix), 1, reverse=True)
        if not last:
            return 0
        key = last[0][0]
        if len(key) != len(prefix) + 8:
            raise CorruptionError(f"malformed consume-queue key {key!r}")
        return int(_OFFSET.unpack_from(key, len(prefix))[0]) + 1


def _after(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with ``prefix`` (topic NUL)."""
    return prefix[:-1] + b"\x01"


def rebuild(store: TimerStore, commitlog: CommitLog, from_position: int = 0) -> int:
    """Re-create the consume-queue entries of every log record from ``from_position`` on,
    from the records alone (each LogRecord carries topic and queue offset). Idempotent: an
    existing entry is overwritten with the same value. Returns the number of records."""
    count = 0
    batch = store.batch()
    for position, payload in commitlog.iter_from(from_position):
        record = decode_log_record(payload)
        ConsumeQueue.put(batch, record.topic, record.queue_offset, position, len(payload))
        count += 1
        if len(batch) >= REBUILD_BATCH:
            store.write(batch)
            batch = store.batch()
    if len(batch):
        store.write(batch)
    return count
