"""The due timeline: pending messages counted by deliver time, per topic and in all, kept up
to date so that ``GET /v1/admin/timeline`` answers from memory (never a scan of the keys).

Resolution: one second of deliverAt (``RESOLUTION_MS``). Each pending message is counted per
second, per minute and per hour of its deliverAt (``LEVELS``), for its topic and for all
topics; memory grows with the (topic, second) pairs that hold pending messages (never more
than the messages), and a topic with nothing pending holds nothing.

A query picks its bucket width from ``WIDTHS_MS`` (the narrowest that fits the window into
the buckets asked for), starts the first bucket at ``from`` rounded down to the width's level
(a whole second, minute or hour: so there may be one bucket more than asked, the last one
reaching past ``to``), and reads one count per level unit inside the window: at most 30
look-ups per bucket below a day, one per hour above. The cost depends on the window, never on
how many messages are pending (the longest window: one C pass of ``dict.get`` over 87 840
hour counts).

Kept by the Backlog (scheduler/backlog.py), at the same points and under the same locks as
its per-topic counts: a send that schedules, a cancel, a delivery commit, a run-time replay;
loaded at start from the persisted counts (scheduler/backlog_store.py: the minutes and hours,
and per hour what reads its seconds when a query first needs them, ``_load_seconds``), or,
for a data directory from before they were persisted, counted once by the Backlog's scan
(``Loader``: in C, a chunk at a time).
The cost is per batch of batches: a send or a delivery only appends its topics and deliverAt
values to a buffer (two list references, under the lock), and the buffer is folded into the
counts when a query reads them, or once it holds ``FOLD_AT`` messages. A fold counts the
(topic, second) pairs of everything buffered in C (``collections.Counter`` over
``zip``/``map``), then each *distinct* pair updates six counts (three levels, its topic and
all). Folded per batch, a send batch of 1000 messages due over an hour (each in its own
second) cost ~1.2 ms, ~1.2 µs a message and ~10 % of the ingest's CPU; folded by the
hundred thousand, messages share their seconds and the fold costs ~0.1 µs a message.

Parked poison messages (scheduler/poison.py) leave the counts when parked, as in the
Backlog's per-topic counts; a redrive counts them again.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import floordiv
from typing import Any, Literal

from scheduler.native import native
from storage.errors import InvalidArgument

RESOLUTION_MS = 1_000  # counts are per second of deliverAt
SECOND, MINUTE, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000
LEVELS: tuple[int, ...] = (SECOND, MINUTE, HOUR)  # level units, ms
#: the bucket widths a query may answer with, ms (a width is a whole number of level units)
WIDTHS_MS: tuple[int, ...] = (
    *(s * SECOND for s in (1, 2, 5, 10, 15, 30)),
    *(m * MINUTE for m in (1, 2, 5, 10, 15, 30)),
    *(h * HOUR for h in (1, 2, 3, 6, 12)),
    *(d * DAY for d in (1, 2, 7, 14, 30, 60, 90, 180, 365, 730, 1830, 3660)),
)
_RATIOS = tuple(unit // RESOLUTION_MS for unit in LEVELS)
_BIG: Literal["big"] = "big"
MAX_BUCKETS = 1_000
FOLD_AT = 1 << 16  # buffered messages folded at the latest (a query folds what is buffered)
MAX_SPAN_MS = 3_660 * DAY  # to - from: the longest window (the default max delay + 10 days)


@dataclass(frozen=True, kw_only=True, slots=True)
class TimelineView:
    """Pending messages per bucket: bucket i is [start + i * width, start + (i+1) * width)."""

    topic: str | None  # None: every topic
    start: int  # epoch ms, ``from`` rounded down to the width's level unit
    end: int  # start + len(counts) * width, >= ``to``
    width_ms: int
    counts: list[int]
    pending: int  # pending messages of the topic (or in all), in the window or not


def pick_width(from_ms: int, to_ms: int, buckets: int) -> tuple[int, int, int]:
    """(width, level unit, first bucket's start): the narrowest width of ``WIDTHS_MS`` with
    ``buckets`` buckets covering [from, to); the start is ``from`` rounded down to the width's
    unit, so the answer may hold one bucket more (the last one reaching past ``to``)."""
    for width in WIDTHS_MS:
        if width * buckets >= to_ms - from_ms:
            unit = next(u for u in reversed(LEVELS) if width % u == 0)
            return width, unit, from_ms // unit * unit
    raise InvalidArgument(f"the window needs more than {buckets} buckets of the widest width "
                          f"({WIDTHS_MS[-1]} ms)")


def check_window(from_ms: int, to_ms: int, buckets: int) -> None:
    if not 0 <= from_ms < to_ms:
        raise InvalidArgument(f"the window must have 0 <= from < to, got from={from_ms}, "
                              f"to={to_ms}")
    if to_ms - from_ms > MAX_SPAN_MS:
        raise InvalidArgument(f"the window (to - from) is at most {MAX_SPAN_MS} ms "
                              f"({MAX_SPAN_MS // DAY} days)")
    if not 1 <= buckets <= MAX_BUCKETS:
        raise InvalidArgument(f"buckets must be between 1 and {MAX_BUCKETS}, got {buckets}")


class TimelineCounts:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # per topic (None: every topic), per level (LEVELS order): deliverAt // unit -> count
        self._series: dict[str | None, tuple[dict[int, int], ...]] = {}
        self._totals: dict[str | None, int] = {}  # topic (None: all) -> pending
        # per topic (None: all), per hour: per-second counts persisted (backlog_store.py) and
        # not read yet (``load_seconds`` decodes them into the series when a query needs them):
        # a start reads the minutes and hours only
        self._lazy: dict[str | None, dict[int, Callable[[], Mapping[int, int]]]] = {}
        # (+1 became pending / -1 stopped being, topics, deliverAt values), not yet counted
        self._buffered: list[tuple[int, str | Sequence[str], Sequence[int]]] = []
        self._buffered_n = 0

    # --- keeping it ----------------------------------------------------------------------------
    def add(self, topics: str | Sequence[str], deliver_ats: Sequence[int]) -> None:
        """Messages became pending: their topics (one each, in the order of ``deliver_ats``;
        or one str, the topic of them all) and deliverAt values. The caller hands the
        sequences over: they are kept, not copied, until folded."""
        self._buffer(1, topics, deliver_ats)

    def remove(self, topics: str | Sequence[str], deliver_ats: Sequence[int]) -> None:
        """Messages stopped being pending (delivered); as ``add``."""
        self._buffer(-1, topics, deliver_ats)

    def remove_one(self, topic: str, deliver_at: int) -> None:
        """One message stopped being pending (cancelled)."""
        self.remove(topic, (deliver_at,))

    def replace(self, series: dict[str | None, tuple[dict[int, int], ...]],
                lazy: dict[str | None, dict[int, Callable[[], Mapping[int, int]]]] | None = None,
                ) -> None:
        """Start again from per-topic (None: all) tables of counts per level (``Loader``).
        ``lazy``: per topic, per hour, what reads the per-second counts of that hour that
        ``series`` does not hold yet (its seconds table holds only changes to them)."""
        totals = {key: sum(levels[2].values()) for key, levels in series.items()}
        with self._lock:
            self._series = {key: levels for key, levels in series.items() if totals[key]}
            self._totals = {key: n for key, n in totals.items() if n}
            self._lazy = {key: hours for key, hours in (lazy or {}).items()
                          if key in self._series and hours}
            self._buffered, self._buffered_n = [], 0

    def _load_seconds(self, key: str | None, first: int, end: int) -> None:
        """Read the lazily kept per-second counts of ``key`` in seconds [first, end) (lock
        held), adding them to the changes the seconds table holds."""
        hours = self._lazy.get(key)
        if not hours:
            return
        ratio = _RATIOS[2]
        lo, hi = first // ratio, -(-end // ratio)
        wanted = ([h for h in hours if lo <= h < hi] if len(hours) < hi - lo
                  else [h for h in range(lo, hi) if h in hours])
        seconds = self._series[key][0]
        for hour in wanted:
            for second, n in hours.pop(hour)().items():
                _bump(seconds, second, n)
        if not hours:
            del self._lazy[key]

    def settle(self, hours: Mapping[tuple[str | None, int], Mapping[int, int]]) -> None:
        """The per-second counts of lazily held hours, as they stand before their records
        change (scheduler/backlog_store.py's fold): counted now, never read again."""
        with self._lock:
            for (key, hour), counts in hours.items():
                lazy = self._lazy.get(key)
                if lazy is None or lazy.pop(hour, None) is None:
                    continue
                seconds = self._series[key][0]
                for second, n in counts.items():
                    _bump(seconds, second, n)
                if not lazy:
                    del self._lazy[key]

    def _buffer(self, sign: int, topics: str | Sequence[str],
                deliver_ats: Sequence[int]) -> None:
        with self._lock:
            self._buffered.append((sign, topics, deliver_ats))
            self._buffered_n += len(deliver_ats)
            if self._buffered_n >= FOLD_AT:
                self._fold()

    def _fold(self) -> None:
        """Count what is buffered (lock held): what became pending first, so that no count
        passes through 0 on its way (a message delivered right after it was sent). The
        seconds of each topic's deliverAt values are counted in C (``Counter`` over ``map``),
        the minutes and hours summed from the distinct seconds: no Python step per message,
        but for the messages of a batch of several topics (sorted out one by one)."""
        buffered, self._buffered, self._buffered_n = self._buffered, [], 0
        values: dict[tuple[int, str], list[int]] = {}  # (sign, topic) -> deliverAt values
        for sign, topics, deliver_ats in buffered:
            if isinstance(topics, str):
                known = values.get((sign, topics))
                if known is None:
                    values[(sign, topics)] = list(deliver_ats)
                else:
                    known += deliver_ats
                continue
            for topic, at in zip(topics, deliver_ats, strict=True):
                known = values.get((sign, topic))
                if known is None:
                    values[(sign, topic)] = [at]
                else:
                    known.append(at)
        for sign in (1, -1):
            counts: dict[str, tuple[Mapping[int, int], ...]] = {}
            for (s, topic), ats in values.items():
                if s == sign:
                    per_second = _per_second(ats)
                    counts[topic] = (per_second, *_coarser(per_second))
            if counts:
                self._apply(counts, sign)

    def _apply(self, counts: dict[str, tuple[Mapping[int, int], ...]], sign: int) -> None:
        """Add ``sign`` x the per-level counts of each topic to its series and to all's
        (lock held)."""
        series, totals = self._series, self._totals
        for topic, levels in counts.items():
            n = sign * sum(levels[0].values())
            for key in (topic, None):
                tables = series.get(key)
                if tables is None:
                    tables = series[key] = tuple({} for _ in LEVELS)
                for table, level in zip(tables, levels, strict=True):
                    _merge(table, level, sign)
                if not _bump(totals, key, n):  # nothing pending left: free its tables
                    del series[key]
                    self._lazy.pop(key, None)  # (what it held is all gone too)

    # --- reading -------------------------------------------------------------------------------
    def query(self, from_ms: int, to_ms: int, buckets: int, topic: str | None) -> TimelineView:
        """Pending messages of ``topic`` (None: all) due in [from, to), in ``buckets`` buckets
        or one more (see the module doc); InvalidArgument for a bad window."""
        check_window(from_ms, to_ms, buckets)
        width, unit, start = pick_width(from_ms, to_ms, buckets)
        n = -(-(to_ms - start) // width)
        per = width // unit  # level units per bucket
        first = start // unit
        with self._lock:
            if self._buffered:
                self._fold()
            if unit == SECOND:
                self._load_seconds(topic, first, first + n * per)
            levels = self._series.get(topic)
            if levels is None:
                values = [0] * (n * per)
            else:
                table = levels[LEVELS.index(unit)]
                values = list(map(table.get, range(first, first + n * per), repeat(0)))
            pending = self._totals.get(topic, 0)
        counts = values if per == 1 else [sum(values[i:i + per])
                                          for i in range(0, len(values), per)]
        return TimelineView(topic=topic, start=start, end=start + n * width, width_ms=width,
                            counts=counts, pending=pending)

    def pending(self, topic: str | None = None) -> int:
        with self._lock:
            if self._buffered:
                self._fold()
            return self._totals.get(topic, 0)

    def series(self) -> dict[str | None, tuple[dict[int, int], ...]]:
        """The counts as they stand, per topic (None: all), per level (a copy)."""
        with self._lock:
            if self._buffered:
                self._fold()
            out = {key: tuple(dict(table) for table in levels)
                   for key, levels in self._series.items()}
            for key, hours in self._lazy.items():  # (read, not kept: they stay lazy)
                seconds = out[key][0]
                for read in hours.values():
                    for second, n in read().items():
                        _bump(seconds, second, n)
            return out

    def entries(self) -> int:
        """Counts held (every level, every series): what the timeline's memory grows with."""
        with self._lock:
            if self._buffered:
                self._fold()
            for key in list(self._lazy):
                self._load_seconds(key, 0, 1 << 62)
            return sum(len(table) for levels in self._series.values() for table in levels)


class Loader:
    """The counts of the start-up scan (Backlog.rebuild), in bulk: for each pending key the
    scan appends its 8-byte deliverAt prefix to ``prefixes[raw topic]`` (one append, no
    other Python step per key) and calls ``flush()`` every ``CHUNK`` keys; the counting is
    done in C, a chunk at a time. (Counting a (topic, second) per key in Python cost ~2 µs a
    key, more than the rest of the scan.)"""

    CHUNK = 1 << 16

    def __init__(self) -> None:
        self.prefixes: defaultdict[bytes, list[bytes]] = defaultdict(list)
        self._levels: dict[bytes | None, tuple[Counter[int], ...]] = {}

    def flush(self) -> None:
        for raw_topic, prefixes in self.prefixes.items():
            seconds = list(map(floordiv, map(int.from_bytes, prefixes, repeat(_BIG)),
                               repeat(RESOLUTION_MS)))
            for key in (raw_topic, None):
                levels = self._levels.get(key)
                if levels is None:
                    levels = self._levels[key] = tuple(Counter() for _ in LEVELS)
                for level, ratio in zip(levels, _RATIOS, strict=True):
                    level.update(seconds if ratio == 1 else map(floordiv, seconds,
                                                                repeat(ratio)))
        self.prefixes.clear()

    def into(self, timeline: TimelineCounts) -> None:
        """Replace ``timeline``'s counts with what was loaded."""
        self.flush()
        series: dict[str | None, tuple[dict[int, int], ...]] = {
            None if raw is None else raw.decode("utf-8"): levels  # Counters: dicts
            for raw, levels in self._levels.items()}
        timeline.replace(series)


def _per_second_py(deliver_ats: list[int]) -> Mapping[int, int]:
    """The values counted per second of deliverAt, in C. Values that repeat (a delivery
    batch: what fell due in the same few milliseconds) are counted as they are and then
    summed per second, one step per distinct value; spread ones are divided first."""
    if len(set(deliver_ats[:64])) <= 8:
        per_second: Counter[int] = Counter()
        for at, n in Counter(deliver_ats).items():
            per_second[at // RESOLUTION_MS] += n
        return per_second
    return Counter(map(floordiv, deliver_ats, repeat(RESOLUTION_MS)))


def _per_second_native(deliver_ats: list[int]) -> Mapping[int, int]:
    """The same counts, in C (scheduler/_native.pyx), one pass over runs of equal seconds."""
    assert native is not None
    try:
        counts: dict[int, int] = native.per_second(deliver_ats, RESOLUTION_MS)
    except OverflowError:  # past int64: never an epoch-ms deliverAt
        return _per_second_py(deliver_ats)
    return counts


_per_second = _per_second_py if native is None else _per_second_native
per_second = _per_second  # (scheduler/backlog_store.py: a write's delta)


def _coarser_py(per_second: Mapping[int, int]) -> tuple[Mapping[int, int], ...]:
    """The counts per unit of each level above the second, from the counts per second."""
    levels = tuple(Counter[int]() for _ in _RATIOS[1:])
    for second, n in per_second.items():
        for ratio, level in zip(_RATIOS[1:], levels, strict=True):
            level[second // ratio] += n
    return levels


def _coarser_native(per_second: Mapping[int, int]) -> tuple[Mapping[int, int], ...]:
    """The same, in C (scheduler/_native.pyx ``per_unit``): a fold's 3 600 seconds of an hour
    summed into minutes and hours in ~0.1 ms, not ~1 ms a level."""
    assert native is not None
    try:
        return tuple(native.per_unit(per_second, ratio) for ratio in _RATIOS[1:])
    except (OverflowError, TypeError):  # (a count past 32 bits, a key past int64: never)
        return _coarser_py(per_second)


_coarser = _coarser_py if native is None else _coarser_native


def _merge(table: dict[int, int], counts: Mapping[int, int], sign: int) -> None:
    """``table`` += ``sign`` x ``counts``, dropping what reaches 0."""
    get = table.get
    if sign > 0:  # (a count may start below 0: changes to lazily read ones, replace)
        for key, n in counts.items():
            value = get(key, 0) + n
            if value:
                table[key] = value
            else:
                del table[key]
        return
    for key, n in counts.items():
        value = get(key, 0) - n
        if value:
            table[key] = value
        else:
            del table[key]


def _bump(table: dict[Any, int], key: object, n: int) -> int:
    """Add ``n`` to ``table[key]``, dropping the key at 0; returns the new count."""
    value = table.get(key, 0) + n
    if value:
        table[key] = value
    else:
        del table[key]
    return value


__all__ = ["FOLD_AT", "LEVELS", "MAX_BUCKETS", "MAX_SPAN_MS", "RESOLUTION_MS", "WIDTHS_MS",
           "Loader",
           "TimelineCounts", "TimelineView", "check_window", "per_second", "pick_width"]
