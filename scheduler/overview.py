"""Read models for the dashboard (api/routes/dashboard.py) that the engine's counters do not
hold: messages delivered per topic, transactions waiting per producer group, disk use.

Each is read from RocksDB or the file system when asked (a dashboard asks every few
seconds), bounded: at most ``TOPICS_MAX`` topics (two seeks each), at most
``TRANSACTIONS_SCAN_MAX`` prepared transactions looked at (``truncated`` says so).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.tx_records import prefix_end
from storage.constants import CF_CQ, CF_TX, TX_GROUP_PREFIX
from storage.keys import SEP
from storage.rocks import RocksStore

TOPICS_MAX = 1_000
TRANSACTIONS_SCAN_MAX = 100_000


@dataclass(frozen=True, kw_only=True, slots=True)
class PreparedCounts:
    """Prepared transactions of one producer group."""

    prepared: int
    due: int  # of which are due for a check-back now
    next_check_at: int  # the earliest next check, epoch ms


@dataclass(frozen=True, kw_only=True, slots=True)
class OverviewCounts:
    pending_by_topic: dict[str, tuple[int, int]]  # topic -> (pending, oldest deliverAt)
    delivered_by_topic: dict[str, int]  # topic -> messages in its log (its end offset)
    transactions: dict[str, PreparedCounts]  # producer group -> ...
    transactions_truncated: bool
    disk_bytes: dict[str, int] = field(default_factory=dict)  # "rocksdb", "commitlog"
    first_by_topic: dict[str, int] = field(default_factory=dict)  # topic -> first offset in
    #                                        its log (the log's retention deletes below it)
    disk_used_ratio: float | None = None  # used / size of the data directory's file system
    disk_free_bytes: int | None = None  # free for unprivileged writers there


def delivered_by_topic(store: RocksStore, end_offset: Callable[[str], int],
                       limit: int = TOPICS_MAX) -> dict[str, int]:
    """Every topic with a consume queue (at most ``limit``, in name order) -> its end offset:
    one seek finds the next topic's first key, ``end_offset`` its last."""
    out: dict[str, int] = {}
    start = b""
    while len(out) < limit:
        row = store.read_range(CF_CQ, start, None, 1)
        if not row:
            break
        raw_topic = row[0][0].split(SEP, 1)[0]
        topic = raw_topic.decode("utf-8")
        out[topic] = end_offset(topic)
        start = raw_topic + bytes([SEP[0] + 1])  # past every key of the topic
    return out


def waiting_transactions(store: RocksStore, now: int, limit: int = TRANSACTIONS_SCAN_MAX,
                         ) -> tuple[dict[str, PreparedCounts], bool]:
    """Per producer group: prepared transactions, how many are due for a check, the next
    check; and whether ``limit`` keys were not enough to see them all."""
    counts: dict[bytes, list[int]] = {}  # group -> [prepared, due, next check]
    seen = 0
    for key, _ in store.scan(CF_TX, TX_GROUP_PREFIX, prefix_end(TX_GROUP_PREFIX), limit=limit):
        seen += 1
        group, half_key = key[len(TX_GROUP_PREFIX):].split(SEP, 1)
        at = int.from_bytes(half_key[:8], "big")  # the next check (a timer key's time)
        entry = counts.get(group)
        if entry is None:
            counts[group] = [1, int(at <= now), at]  # keys in check order: the first is next
        else:
            entry[0] += 1
            entry[1] += at <= now
    return ({group.decode("utf-8"): PreparedCounts(prepared=p, due=d, next_check_at=n)
             for group, (p, d, n) in sorted(counts.items())}, seen >= limit)


def disk_bytes(directory: Path) -> int:
    """Bytes allocated on disk by the files under ``directory`` (CommitLog segments are
    preallocated: their allocated size, not their length)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:  # removed meanwhile (a compaction, a clean-up)
                continue
    return total


__all__ = ["OverviewCounts", "PreparedCounts", "delivered_by_topic", "disk_bytes",
           "waiting_transactions"]
