"""``list_scheduled``: one topic's pending messages by deliver time, paged by an opaque cursor.

Timer keys are ordered by (deliverAt, topic, msgId) and spread over the shards, so a page
is a k-way merge of the shards' key ranges, filtered by topic. That costs the keys of other
topics in the same time range, so every call reads at most ``scan_budget`` keys: a page can
come back short (even empty) with a cursor to go on from; ``None`` means the range is done.
The cursor is where to go on from, so paging is stable under concurrent sends and
deliveries (a message delivered meanwhile simply no longer shows up). It never carries
another topic's key: when the budget stops on one, at (T, other topic, msgId), the page goes
on from the first key this topic could have after it, (T, this topic) or (T + 1); the keys
skipped are other topics'.
"""

from __future__ import annotations

import base64
import binascii
import heapq
from collections.abc import Iterator

from scheduler.model import MessageLookup
from scheduler.timer_index import TimerIndex
from storage.constants import timer_cf
from storage.errors import InvalidArgument
from storage.keys import MAX_U64, decode_timer_key, time_bound
from storage.records import MessageStatus
from storage.rocks import RocksStore

CURSOR_VERSION = 2  # 1 carried the last key looked at, possibly another topic's
MAX_PAGE = 1000
SCAN_BUDGET = 100_000  # keys read per call at most (EngineConfig.listing_scan_budget)


def encode_cursor(topic: str, start: bytes) -> str:
    """Opaque: version, the topic it belongs to, and the key to go on from (inclusive):
    8 bytes of time, maybe followed by the topic, NUL and more."""
    raw = bytes([CURSOR_VERSION]) + topic.encode("utf-8") + b"\x00" + start
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str, topic: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        if not raw or raw[0] != CURSOR_VERSION:
            raise ValueError("unknown cursor version")
        cursor_topic, sep, start = raw[1:].partition(b"\x00")
        if not sep or len(start) < 8:
            raise ValueError("no position")
    except (ValueError, binascii.Error):
        raise InvalidArgument(f"malformed cursor {cursor!r}") from None
    own = topic.encode("utf-8") + b"\x00"
    if cursor_topic != topic.encode("utf-8") or (len(start) > 8
                                                  and not start[8:].startswith(own)):
        raise InvalidArgument("the cursor belongs to another topic")
    return start


def resume_after(key: bytes, own: bytes) -> bytes:
    """The first key at or after which this topic (``own`` = topic NUL) can have keys
    following ``key``, made of ``key``'s time and ``own`` only."""
    if key[8:8 + len(own)] == own:
        return key + b"\x00"
    if key[8:] < own:
        return key[:8] + own
    return time_bound(min(decode_timer_key(key)[0] + 1, MAX_U64))


def _shard_keys(store: RocksStore, cf: str, start: bytes, end: bytes | None) -> Iterator[bytes]:
    for key, _ in store.scan(cf, start, end):
        yield key


def list_scheduled(
    store: RocksStore, topic: str, *, from_ms: int | None, to_ms: int | None, limit: int,
    cursor: str | None, scan_budget: int = SCAN_BUDGET,
) -> tuple[list[MessageLookup], str | None]:
    """Pending messages of ``topic`` with from_ms <= deliverAt < to_ms, by deliver time."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidArgument(f"limit must be in 1..{MAX_PAGE}")
    for name, value in (("from", from_ms), ("to", to_ms)):
        if value is not None and not 0 <= value <= MAX_U64:
            raise InvalidArgument(f"{name} must be a time in epoch ms")
    start = time_bound(from_ms or 0)
    if cursor is not None:
        start = max(start, decode_cursor(cursor, topic))
    end = None if to_ms is None else time_bound(to_ms)
    if end is not None and end <= start:
        return [], None
    # below a shard's persisted frontier every key is delivered (or cancelled), not yet
    # cleaned away (scheduler/maintenance.py): each shard is read from its frontier on
    timers = TimerIndex(store)
    merged = heapq.merge(*(_shard_keys(store, timer_cf(shard), max(start, timers.frontier(shard)),
                                       end) for shard in range(timers.shards)))
    wanted = topic.encode("utf-8") + b"\x00"
    page: list[MessageLookup] = []
    last = None
    for read, key in enumerate(merged, start=1):
        last = key
        if key[8:8 + len(wanted)] == wanted:
            deliver_at, _, msg_id = decode_timer_key(key)
            page.append(MessageLookup(msg_id=msg_id, topic=topic,
                                    status=MessageStatus.SCHEDULED, deliver_at=deliver_at))
            if len(page) == limit:
                break
        if read >= scan_budget:
            break
    else:
        return page, None  # the range is exhausted
    return page, encode_cursor(topic, resume_after(last, wanted)) if last is not None else None
