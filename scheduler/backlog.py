"""The backlog: pending messages per topic and per delay level, and the oldest pending
deliverAt per topic (RocketMQ monitors SCHEDULE_TOPIC_XXXX per delay level; RIP-43 adds
per-topic timer metrics).

Exact, and cheap. The counts are kept incrementally by whoever changes the backlog: a send
that schedules (scheduler/writes.py, under the shard locks, so before any scan or cancel
sees the message), a cancel, a delivery commit and a run-time replay (scheduler/broker.py),
parking and redriving poison messages (scheduler/poison.py); each of those writes persists
its change too (scheduler/backlog_store.py), and a start ``load``s the persisted counts. A
data directory from before they were persisted is counted once by a scan over the pending
keys (``rebuild``). A message's delay level is kept in its stored
flags (``storage.records.FLAG_LEVEL_SHIFT``): the engine reads the level of a delivered or
cancelled message only while some message sent with a level is pending (``has_levels``).

The oldest pending deliverAt of a topic is exact without an entry per message: a send
lowers it; a delivery of the topic (deliveries go in key order, so they take its oldest
first) or the cancel of its oldest marks it stale; a read refreshes the stale topics with
one pass over the keys of each shard concerned, from the shard's persisted frontier (every
key at or above it is pending), stopping at the first key of each (keys are in time order and
a topic lives in one shard). A busy topic's next key is near the frontier; a topic is stale
again only after another delivery or cancel of it.

Exported with a cardinality cap (``labelled``): the ``top`` topics by pending count, and
everything else under the label ``OTHER``.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING

from scheduler.codec import message_level
from scheduler.timeline import HOUR, MINUTE, Loader, TimelineCounts
from scheduler.timer_index import TimerIndex
from storage.keys import decode_timer_key, time_bound, topic_shard

if TYPE_CHECKING:
    from scheduler.backlog_store import Lazy
    from scheduler.intake import PreparedMessage
    from storage.rocks import RocksStore

_DELIVER_AT = attrgetter("deliver_at")
OTHER = "__other__"  # the label of the topics past the cap ("__": no client topic has it)


class Backlog:
    def __init__(self, store: RocksStore, cfs: Sequence[str], top: int) -> None:
        """``cfs``: the timer column family of each shard; ``top``: topic labels exported."""
        self._store = store
        self._timers = TimerIndex(store)
        self._cfs = cfs
        self._top = top
        self._lock = threading.Lock()
        self._topics: dict[str, int] = {}  # pending count, > 0
        self._oldest: dict[str, int] = {}  # oldest pending deliverAt (a lower bound if stale)
        self._stale: set[str] = set()
        self._levels: dict[int, int] = {}  # pending count, > 0
        self._refreshing: frozenset[str] = frozenset()  # topics ``_refresh`` is looking up
        self.timeline = TimelineCounts()  # the same backlog by deliver time (scheduler/timeline.py)

    # --- keeping it --------------------------------------------------------------------------
    def rebuild(self) -> int:
        """The start-up scan: every pending key of every shard; returns their number."""
        store, timers = self._store, self._timers
        topics: Counter[bytes] = Counter()
        oldest: dict[bytes, int] = {}
        levels: Counter[int] = Counter()
        loader = Loader()  # the timeline's counts, in C a chunk at a time
        prefixes, chunk, n = loader.prefixes, Loader.CHUNK, 0
        for shard, cf in enumerate(self._cfs):
            for key, value in store.scan(cf, timers.frontier(shard)):
                ikey = key[8:]
                raw_topic = ikey[:ikey.index(0)]
                prefixes[raw_topic].append(key[:8])
                n += 1
                if n == chunk:
                    loader.flush()
                    n = 0
                if raw_topic not in oldest:  # the first key of a topic: its oldest
                    oldest[raw_topic] = int.from_bytes(key[:8], "big")
                topics[raw_topic] += 1
                level = message_level(value)
                if level:
                    levels[level] += 1
        with self._lock:
            self._topics = {t.decode("utf-8"): n for t, n in topics.items()}
            self._oldest = {t.decode("utf-8"): at for t, at in oldest.items()}
            self._stale.clear()
            self._levels = dict(levels)
        loader.into(self.timeline)
        return sum(topics.values())

    def load(self, series: Mapping[str | None, tuple[dict[int, int], ...]],
             levels: Mapping[int, int], lazy: Lazy | None = None) -> int:
        """Start from persisted counts (scheduler/backlog_store.py) instead of the scan:
        ``series`` as the TimelineCounts keeps them (per topic, per level unit), ``levels``: pending
        per delay level, ``lazy``: the per-second counts ``series`` does not hold yet
        (``TimelineCounts.replace``). Every topic's oldest is then a lower bound (the first minute
        that holds one of its messages), refreshed when read. Returns the pending messages."""
        topics = {t: sum(tables[2].values()) for t, tables in series.items() if t is not None}
        oldest = {t: _first_minute(tables) * MINUTE
                  for t, tables in series.items() if t is not None and topics[t]}
        with self._lock:
            self._topics = {t: n for t, n in topics.items() if n}
            self._oldest = oldest
            self._stale = set(self._topics)
            self._levels = {level: n for level, n in levels.items() if n}
        self.timeline.replace(dict(series), lazy)
        return sum(self._topics.values())

    def scheduled(self, messages: Sequence[PreparedMessage]) -> None:
        """Messages just stored for later; called under their shards' locks, so that no
        scan (hence no delivery) and no cancel of them comes before. (Loops in C: a send
        batch is usually of one topic.)"""
        names = {m.topic for m in messages}
        deliver_ats: dict[str, list[int]]
        if len(names) == 1:
            deliver_ats = {names.pop(): list(map(_DELIVER_AT, messages))}
        else:
            deliver_ats = {}
            for m in messages:
                deliver_ats.setdefault(m.topic, []).append(m.deliver_at)
        self.scheduled_at(deliver_ats, [m.level for m in messages if m.level is not None])

    def scheduled_at(self, deliver_ats: Mapping[str, list[int]],
                     levels: Sequence[int] = ()) -> None:
        """``scheduled`` by columns: the deliverAt of each message stored, by topic, and the
        delay levels among them (same locking)."""
        with self._lock:
            topics, oldest = self._topics, self._oldest
            for topic, ats in deliver_ats.items():
                first, count = min(ats), topics.get(topic)
                if count is None:
                    topics[topic] = len(ats)
                    oldest[topic] = first
                else:
                    topics[topic] = count + len(ats)
                    if first < oldest[topic]:
                        oldest[topic] = first
                        if topic in self._refreshing:  # what it finds may be later
                            self._stale.add(topic)
            for level in levels:
                self._add_level(level, 1)
        for topic, ats in deliver_ats.items():
            self.timeline.add(topic, ats)

    @property
    def has_levels(self) -> bool:
        """Some message sent with a delay level is pending (read without the lock: whether
        the levels of delivered or cancelled messages are needed)."""
        return bool(self._levels)

    def delivered(self, topics: Sequence[str], levels: Iterable[int] = (), *,
                  deliver_ats: Sequence[int]) -> None:
        """Messages of ``topics`` (one entry per message) left the backlog by delivery;
        ``levels``: their delay levels (0: none), while ``has_levels``; ``deliver_ats``:
        their deliverAt (same order as ``topics``)."""
        first = topics[0] if topics else None
        counts: Mapping[str, int]
        if first is not None and topics.count(first) == len(topics):  # one topic: C speed
            counts = {first: len(topics)}
            self.timeline.remove(first, deliver_ats)
        else:
            counts = Counter(topics)
            self.timeline.remove(topics, deliver_ats)
        with self._lock:
            for topic, n in counts.items():
                self._remove(topic, n)
                if topic in self._topics:
                    self._stale.add(topic)
            for level in levels:
                if level:
                    self._add_level(level, -1)

    def cancelled(self, topic: str, deliver_at: int, level: int) -> None:
        """A message (sent with ``level``, 0: none) left the backlog by a cancel."""
        with self._lock:
            self._remove(topic, 1)
            if self._oldest.get(topic) == deliver_at:
                self._stale.add(topic)
            if level:
                self._add_level(level, -1)
        self.timeline.remove_one(topic, deliver_at)

    def _remove(self, topic: str, n: int) -> None:
        left = self._topics.get(topic, 0) - n
        if left > 0:
            self._topics[topic] = left
        else:
            self._topics.pop(topic, None)
            self._oldest.pop(topic, None)
            self._stale.discard(topic)

    def _add_level(self, level: int, n: int) -> None:
        count = self._levels.get(level, 0) + n
        if count > 0:
            self._levels[level] = count
        else:
            self._levels.pop(level, None)

    # --- reading -----------------------------------------------------------------------------
    def by_level(self) -> dict[int, int]:
        with self._lock:
            return dict(self._levels)

    def pending(self, topic: str) -> int:
        """Messages of ``topic`` waiting (scheduled, not yet delivered or cancelled)."""
        with self._lock:
            return self._topics.get(topic, 0)

    def by_topic(self) -> dict[str, tuple[int, int]]:
        """topic -> (pending, oldest pending deliverAt), every topic with a backlog."""
        self._refresh()
        with self._lock:
            return {t: (n, self._oldest[t]) for t, n in self._topics.items()}

    def labelled(self) -> dict[str, tuple[int, int]]:
        """``by_topic`` with at most ``top`` topics, the rest summed up under ``OTHER``
        (its oldest: the oldest of them)."""
        topics = self.by_topic()
        if len(topics) <= self._top:
            return topics
        ranked = sorted(topics.items(), key=lambda item: (-item[1][0], item[0]))
        out = dict(ranked[:self._top])
        rest = [v for _, v in ranked[self._top:]]
        out[OTHER] = (sum(n for n, _ in rest), min(at for _, at in rest))
        return out

    def _refresh(self) -> None:
        """Find the oldest pending key of every stale topic (see the module doc)."""
        with self._lock:
            stale, self._stale = self._stale, set()
            self._refreshing = frozenset(stale)
        if not stale:
            return
        by_shard: dict[int, set[bytes]] = {}
        for topic in stale:
            by_shard.setdefault(topic_shard(topic, len(self._cfs)), set()).add(
                topic.encode("utf-8"))
        found: dict[str, int] = {}
        with self._lock:  # (lower bounds: no key of theirs lies before)
            after = {shard: min(self._oldest.get(t.decode("utf-8"), 0) for t in wanted)
                     for shard, wanted in by_shard.items()}
        for shard, wanted in by_shard.items():
            start = max(self._timers.frontier(shard), time_bound(after[shard]))
            for key, _ in self._store.scan(self._cfs[shard], start):
                ikey = key[8:]
                raw_topic = ikey[:ikey.index(0)]
                if raw_topic in wanted:
                    wanted.discard(raw_topic)
                    found[raw_topic.decode("utf-8")] = decode_timer_key(key)[0]
                    if not wanted:
                        break
        with self._lock:
            self._refreshing = frozenset()
            for topic in stale:
                if topic in self._topics and topic not in self._stale:  # not changed since
                    if topic in found:
                        self._oldest[topic] = found[topic]
                    else:  # its keys went meanwhile: look again next time
                        self._stale.add(topic)


def _first_minute(tables: tuple[dict[int, int], ...]) -> int:
    """The first minute that holds a pending message (TimelineCounts tables: seconds, minutes,
    hours), found from the hour down: no pass over every minute."""
    _, minutes, hours = tables
    hour = min(hours)
    per_hour = HOUR // MINUTE
    return min(m for m in range(hour * per_hour, (hour + 1) * per_hour) if m in minutes)


__all__ = ["OTHER", "Backlog"]
