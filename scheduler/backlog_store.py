"""The backlog's counts, persisted: a start reads them instead of scanning every pending key.

What is kept: the pending messages per (topic, second of deliverAt) and per delay level, the
counts the Backlog and its TimelineCounts hold in memory (scheduler/backlog.py, timeline.py); the
per-topic pending counts are their sums. Exact after ``kill -9`` at any point: every RocksDB
write that changes the backlog carries its change in the same WriteBatch, as a *delta*
record, so the counts on disk move atomically with the keys they count:

- a send that schedules (+), a cancel (-), a delivery commit (-: the keys its frontier
  passes, parked poison messages too), a replay of log records (-), a redrive of parked
  messages (+). "Pending" means what the start-up scan counted: every timer key at or above
  its shard's persisted frontier.
- ``meta`` ``META_BACKLOG_DELTA_PREFIX`` + 8-byte id -> msgpack
  ``[sign, {topic: deliverAt values as int64 little-endian}, {level: n}]`` (sign +1: became
  pending, -1: left). The values as they are (packed in C), not counted per second: a send
  path pays a few µs per batch; the fold counts them in C.

The maintenance thread *folds* the deltas into the base about once a second
(``fold``): the base is one record per (topic, hour of deliverAt), ``META_BACKLOG_BASE_PREFIX``
+ topic + NUL + 4-byte hour -> the 4-byte length of the minutes, msgpack ``{minute: n}``,
msgpack ``{second: n}`` (topic "" holds all topics together, so that a start loads the
all-topics series as it stands; it decodes the minutes only, and the TimelineCounts decodes an
hour's seconds when a query needs them), and
``META_BACKLOG_LEVELS`` -> ``{level: n}``. A fold reads the deltas with ids below the next id
(read under every shard lock and the commit lock: every delta below it is written, the writes
happen inside those locks), adds them to the base records they touch, and in ONE write puts
those records, deletes exactly the deltas it read and moves ``META_BACKLOG_FOLDED`` (every id
below it is folded: a start reads the deltas from there, never through the tombstones of the
folded ones). A clean stop folds what is left.

A start reads the base and the deltas not folded yet: its cost grows with the distinct
(topic, second) pairs pending and with the writes of the last second before a kill, not with
the messages pending. A data directory written before the counts were persisted (no
``META_BACKLOG_FOLDED``) is scanned once, as before, and its base written from the scan.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from operator import floordiv
from typing import Any, cast

import msgpack

from scheduler.timeline import LEVELS, RESOLUTION_MS, per_second
from storage.constants import (
    CF_META,
    META_BACKLOG_BASE_PREFIX,
    META_BACKLOG_DELTA_PREFIX,
    META_BACKLOG_FOLDED,
    META_BACKLOG_LEVELS,
    META_BACKLOG_SECONDS_PREFIX,
)
from storage.keys import pack_u64, unpack_u64
from storage.rocks import Batch, RocksStore

_HOUR_S = LEVELS[2] // LEVELS[0]  # seconds per hour
_MINUTE_S = LEVELS[1] // LEVELS[0]
_ALL = ""  # the base's topic of all topics together (no topic name is empty)
_DELTA_END = META_BACKLOG_DELTA_PREFIX + b"\xff" * 9
_BASE_END = META_BACKLOG_BASE_PREFIX[:-1] + bytes([META_BACKLOG_BASE_PREFIX[-1] + 1])
_packer = msgpack.Packer(use_bin_type=True)


def _pack(obj: object) -> bytes:
    return bytes(_packer.pack(obj))

#: per topic (None: all), per level (LEVELS order): deliverAt // unit -> count, as
#: TimelineCounts keeps them
Series = dict[str | None, tuple[dict[int, int], ...]]
#: per topic (None: all), per hour: what reads the per-second counts of the base
Lazy = dict[str | None, dict[int, Callable[[], Mapping[int, int]]]]


def _unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, strict_map_key=False)


def _delta_key(delta_id: int) -> bytes:
    return META_BACKLOG_DELTA_PREFIX + pack_u64(delta_id)


def _base_key(topic: str, hour: int) -> bytes:
    return META_BACKLOG_BASE_PREFIX + topic.encode("utf-8") + b"\x00" + hour.to_bytes(4, "big")


def _seconds_key(topic: str, hour: int) -> bytes:
    return (META_BACKLOG_SECONDS_PREFIX + topic.encode("utf-8") + b"\x00"
            + hour.to_bytes(4, "big"))


def _read_seconds(store: RocksStore, key: bytes) -> dict[int, int]:
    """A base hour's per-second counts as stored now (what a lazy TimelineCounts hour reads)."""
    raw = store.get(CF_META, key)
    return {} if raw is None else cast("dict[int, int]", _unpack(raw))


def _split_base_key(key: bytes) -> tuple[str, int]:
    rest = key[len(META_BACKLOG_BASE_PREFIX):]
    return rest[:-5].decode("utf-8"), int.from_bytes(rest[-4:], "big")


class BacklogStore:
    """The persisted counts of one store (see the module doc)."""

    def __init__(self, store: RocksStore) -> None:
        self._store = store
        raw = store.get(CF_META, META_BACKLOG_FOLDED)
        #: the counts are persisted (False: a data directory from before; ``initialise``)
        self.enabled = raw is not None
        self._folded = 0 if raw is None else unpack_u64(raw)
        last = [unpack_u64(key[len(META_BACKLOG_DELTA_PREFIX):]) for key, _ in store.scan(
            CF_META, _delta_key(self._folded), _DELTA_END, limit=1, reverse=True)]
        self._ids = itertools.count(last[0] + 1 if last else self._folded)  # never reused
        self._fold_lock = threading.Lock()
        self.unfolded = 0  # deltas written since the last fold (a hint for the maintenance)
        self.on_first_delta: Callable[[], None] | None = None  # maintenance: plan a fold
        #: some message sent with a delay level is pending (the Backlog's ``has_levels``):
        #: whether a delivery must read the levels of what it delivers
        self.levels_pending: Callable[[], bool] = lambda: True
        #: called by a fold, before it rewrites them, with the per-second counts of the base
        #: hours it rewrites, per (topic, None: all; hour): the TimelineCounts reads the hours it
        #: holds lazily from them (``TimelineCounts.settle``), never a record the fold changed
        self.on_rewrite: Callable[[dict[tuple[str | None, int], dict[int, int]]], None] | None \
            = None

    # --- writing -----------------------------------------------------------------------------
    def put(self, batch: Batch, sign: int, deliver_ats: Mapping[str, Sequence[int]],
            levels: Iterable[int] = ()) -> None:
        """Stage in ``batch`` the change of messages (by topic: their deliverAt values)
        becoming pending (``sign`` 1) or leaving the backlog (-1); ``levels``: the delay
        levels among them (0: none). Call it inside the lock that orders the write (a shard
        lock or the commit lock) and write ``batch`` before leaving it."""
        if not self.enabled:
            return
        topics = {topic: _encode_ats(ats) for topic, ats in deliver_ats.items() if ats}
        by_level = Counter(level for level in levels if level)
        if not topics and not by_level:
            return
        batch.put(CF_META, _delta_key(next(self._ids)), _pack([sign, topics, dict(by_level)]))
        self.unfolded += 1
        if self.unfolded == 1 and self.on_first_delta is not None:
            self.on_first_delta()

    def put_columns(self, batch: Batch, sign: int, topics: Sequence[str],
                    deliver_ats: Sequence[int], levels: Iterable[int] = ()) -> None:
        """``put`` from columns: the topic and the deliverAt of each message."""
        if not self.enabled or not topics:
            return
        first = topics[0]
        by_topic: dict[str, list[int]]
        if topics.count(first) == len(topics):
            by_topic = {first: list(deliver_ats)}
        else:
            by_topic = {}
            for topic, at in zip(topics, deliver_ats, strict=True):
                ats = by_topic.get(topic)
                if ats is None:
                    by_topic[topic] = [at]
                else:
                    ats.append(at)
        self.put(batch, sign, by_topic, levels)

    # --- reading at start --------------------------------------------------------------------
    def load(self) -> tuple[Series, dict[int, int], Lazy]:
        """The counts as they stand: the base plus every delta not folded yet. Returns the
        TimelineCounts's series (their per-second tables hold only the deltas' changes), per
        topic (None: all) and hour what reads the base's per-second counts (the TimelineCounts
        reads them when a query needs them), and the pending count per delay level. Call
        before any write."""
        store = self._store
        series: Series = {}
        lazy: Lazy = {}
        for key, raw in store.scan(CF_META, META_BACKLOG_BASE_PREFIX, _BASE_END):
            topic, hour = _split_base_key(key)
            name = topic or None
            minutes = _unpack(raw)
            tables = series.get(name)
            if tables is None:
                tables = series[name] = ({}, {}, {})
                lazy[name] = {}
            tables[1].update(minutes)
            tables[2][hour] = sum(minutes.values())
            lazy[name][hour] = functools.partial(_read_seconds, store, _seconds_key(topic, hour))
        raw_levels = store.get(CF_META, META_BACKLOG_LEVELS)
        levels: dict[int, int] = {} if raw_levels is None else _unpack(raw_levels)
        for _, raw in store.scan(CF_META, _delta_key(self._folded), _DELTA_END):
            sign, topics, delta_levels = _unpack(raw)
            for topic, ats in topics.items():
                seconds = _seconds(ats)
                for name in (topic, None):
                    tables = series.get(name)
                    if tables is None:
                        tables = series[name] = ({}, {}, {})
                    for second, n in seconds.items():
                        for table, unit in zip(tables, (1, _MINUTE_S, _HOUR_S), strict=True):
                            _add(table, second // unit, sign * n)
            for level, n in delta_levels.items():
                _add(levels, level, sign * n)
            self.unfolded += 1
        return series, levels, lazy

    def initialise(self, series: Series, levels: Mapping[int, int]) -> None:
        """A data directory from before the counts were persisted: write the base from the
        start-up scan's counts (``series`` as the TimelineCounts holds them), then keep them."""
        batch = self._store.batch()
        for topic, tables in series.items():
            buckets: dict[int, dict[int, int]] = {}
            for second, n in tables[0].items():
                bucket = buckets.get(second // _HOUR_S)
                if bucket is None:
                    buckets[second // _HOUR_S] = {second: n}
                else:
                    bucket[second] = n
            for hour, seconds in buckets.items():
                batch.put(CF_META, _base_key(topic or _ALL, hour), _pack(_minutes(seconds)))
                batch.put(CF_META, _seconds_key(topic or _ALL, hour), _pack(seconds))
        batch.put(CF_META, META_BACKLOG_LEVELS, _pack(dict(levels)))
        next_id = next(self._ids)
        batch.put(CF_META, META_BACKLOG_FOLDED, pack_u64(next_id))
        self._store.write(batch)
        self._folded = next_id
        self._ids = itertools.count(next_id)
        self.enabled = True

    # --- folding -----------------------------------------------------------------------------
    def fold(self, locks: Callable[[], contextlib.AbstractContextManager[None]]) -> int:
        """Fold every delta written so far into the base (module doc); returns how many.
        ``locks``: every lock a delta is written under (to read the next id)."""
        if not self.enabled:
            return 0
        with self._fold_lock:
            with locks():
                end = next(self._ids)  # every id below it is written (or its write failed)
                self._ids = itertools.count(end)
                self.unfolded = 0
            if end == self._folded:
                return 0
            return self._fold_below(end)

    def _fold_below(self, end: int) -> int:
        store = self._store
        # per topic ("": all) and second: what became pending and what left, counted in C
        # once per topic and side (``per_second``: one step per run of equal seconds, as a
        # burst's deltas hold them; 15 instead of 94 µs a 1000 of one instant); then one
        # Python step per distinct second changed, not per message
        values: tuple[dict[str, array[int]], dict[str, array[int]]] = ({}, {})
        level_changes: dict[int, int] = {}
        folded: list[bytes] = []
        for key, raw in store.scan(CF_META, _delta_key(self._folded), _delta_key(end)):
            folded.append(key)
            sign, topics, delta_levels = _unpack(raw)
            gathered = values[0 if sign > 0 else 1]
            for topic, ats in topics.items():
                known = gathered.get(topic)
                if known is None:
                    gathered[topic] = _decode_ats(ats)
                else:
                    known.extend(_decode_ats(ats))
            for level, n in delta_levels.items():
                _add(level_changes, level, sign * n)
        counted: tuple[dict[str, Counter[int]], dict[str, Counter[int]]] = (
            {topic: Counter(per_second(ats.tolist())) for topic, ats in values[0].items()},
            {topic: Counter(per_second(ats.tolist())) for topic, ats in values[1].items()})
        for side in counted:  # all topics: the sum of the topics' (per distinct second)
            if len(side) == 1:
                side[_ALL] = next(iter(side.values()))
            elif side:
                every: Counter[int] = Counter()
                for counter in side.values():
                    every.update(counter)
                side[_ALL] = every
        added, removed = counted
        seconds_by_bucket: dict[tuple[str, int], dict[int, int]] = {}
        for name in {*added, *removed}:
            changes: dict[int, int] = dict(added.get(name, ()))
            for second, n in removed.get(name, {}).items():
                _add(changes, second, -n)
            for second, n in changes.items():
                bucket = seconds_by_bucket.get((name, second // _HOUR_S))
                if bucket is None:
                    seconds_by_bucket[(name, second // _HOUR_S)] = {second: n}
                else:
                    bucket[second] = n
        batch = store.batch()
        buckets = list(seconds_by_bucket)
        minute_keys = [_base_key(topic, hour) for topic, hour in buckets]
        second_keys = [_seconds_key(topic, hour) for topic, hour in buckets]
        old_minutes = store.multi_get(CF_META, minute_keys) if buckets else []
        old_seconds = store.multi_get(CF_META, second_keys) if buckets else []
        olds: dict[tuple[str | None, int], dict[int, int]] = {
            (topic or None, hour): {} if raw is None else _unpack(raw)
            for (topic, hour), raw in zip(buckets, old_seconds, strict=True)}
        if self.on_rewrite is not None:  # lazily read hours: read before they change
            self.on_rewrite(olds)
        for mkey, skey, raw_minutes, seconds, changes in zip(
                minute_keys, second_keys, old_minutes, olds.values(),
                seconds_by_bucket.values(), strict=True):
            seconds = dict(seconds)
            minutes = {} if raw_minutes is None else _unpack(raw_minutes)
            for second, n in changes.items():
                if n:
                    _add(seconds, second, n)
                    _add(minutes, second // _MINUTE_S, n)
            if seconds:
                batch.put(CF_META, mkey, _pack(minutes))
                batch.put(CF_META, skey, _pack(seconds))
            elif raw_minutes is not None:
                batch.delete(CF_META, mkey)
                batch.delete(CF_META, skey)
        if level_changes:
            raw_levels = store.get(CF_META, META_BACKLOG_LEVELS)
            levels = {} if raw_levels is None else _unpack(raw_levels)
            for level, n in level_changes.items():
                _add(levels, level, n)
            batch.put(CF_META, META_BACKLOG_LEVELS, _pack(levels))
        for key in folded:
            batch.delete(CF_META, key)
        batch.put(CF_META, META_BACKLOG_FOLDED, pack_u64(end))
        store.write(batch)
        self._folded = end
        return len(folded)


def _encode_ats(ats: Sequence[int]) -> bytes:
    """deliverAt values as a delta keeps them: int64 little-endian (packed in C)."""
    values = array("q", ats)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


def _decode_ats(raw: bytes) -> array[int]:
    values = array("q")
    values.frombytes(raw)
    if sys.byteorder == "big":
        values.byteswap()
    return values


def _seconds(raw: bytes) -> Counter[int]:
    """The deliverAt values of a delta counted per second (in C)."""
    return Counter(map(floordiv, _decode_ats(raw), repeat(RESOLUTION_MS)))


def _add(table: dict[int, int], key: int, n: int) -> None:
    """``table[key] += n``, dropping the key at 0."""
    value = table.get(key, 0) + n
    if value:
        table[key] = value
    else:
        table.pop(key, None)


def _minutes(seconds: Mapping[int, int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for second, n in seconds.items():
        _add(out, second // _MINUTE_S, n)
    return out


__all__ = ["BacklogStore", "Lazy", "Series"]
