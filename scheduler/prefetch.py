"""A scanner's read-ahead: the keys of a shard's next due range, read before they are due.

A burst (50 k keys due at one instant) used to be read when it fell due: the scanner's
reads were ~40 % of the burst's CPU in process (50 k: 35-43 ms of 95-120), all of it
after the due time, under the one GIL the commits need too. Now a scanner that will sleep
until a due instant at least ``PREFETCH_MIN_GAP_MS`` away wakes ``scan_prefetch_ms``
before it and reads the keys due by then + ``scan_prefetch_ms`` (at most
``scan_prefetch_messages`` keys and ``scan_prefetch_bytes`` of values) into a ``Prefetch``;
the scan at the due instant takes them from it instead of RocksDB. It delivers nothing
early: a scan still hands on only the keys below ``time_bound(now + 1)``. The keys are split
into the committer's columns as they are read (``codec.split_due``: index keys, values,
deliverAts, topics; ``ScanBatch.split``), which the commits at the due time then take as they are.

The invariant, guarded by the shard's lock: ``items[pos:]`` are exactly the shard's keys
(and values) in [``start``, ``end``), ``start`` being the shard's scan frontier. Every path
that writes or deletes a timer key holds that lock and calls ``ShardState.touched(key)``
(send, batch send, cancel and cancel markers, transaction commits and nacks through the
send path, redrive); a key in [start, end) cuts the read-ahead there (``truncate``): what
lies below the key is unchanged, what lies at or above it is read again from RocksDB when it
is due. A cancel answered CANCELLED therefore either cut the read-ahead before the scan took
its key (and RocksDB no longer has it), or came after the scan handed it on (below the
frontier: the committer's skip set, as before). No other path writes timer keys at or above
a frontier: the committer's replay deletes keys it delivered (below the frontier),
maintenance deletes below the persisted watermark, and a cluster follower, which applies
the leader's writes, runs no scanner.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import itemgetter

from scheduler.codec import split_due
from scheduler.committer import Split

#: a scanner idle for less than this until its next key reads it when it is due, as before:
#: a steady flow (W3: keys due every ms or so) gains nothing from reading a scan early and
#: would pay a second wake-up a scan for it (docs/performance.md, W3)
PREFETCH_MIN_GAP_MS = 20

_KEY, _VALUE = itemgetter(0), itemgetter(1)


class Prefetch:
    """The keys of [``start``, ``end``) of one shard, read ahead; consumed from ``pos``."""

    __slots__ = ("_taken", "bytes", "columns", "end", "items", "pos", "start")

    def __init__(self, start: bytes) -> None:
        self.start = start  # the shard's frontier when the read-ahead began (moved by take)
        self.end = start  # every key of [start, end) is in items[pos:]
        self.items: list[tuple[bytes, bytes]] = []
        self.pos = 0
        self.bytes = 0  # of the values read ahead (the bound of scan_prefetch_bytes)
        #: items split into the committer's columns (None: a key split_due refuses, a
        #: poison one: the commit splits, and parks it, as it would have)
        self.columns: Split | None = ([], [], [], [])
        self._taken = (0, 0)  # the last take's range of items

    def __len__(self) -> int:
        return len(self.items) - self.pos

    def extend(self, items: list[tuple[bytes, bytes]], end: bytes) -> None:
        """Add the keys a read found in [self.end, end) (all of them)."""
        self.items += items
        self.bytes += sum(map(len, map(_VALUE, items)))  # (no Python call a pair)
        self.end = end
        if self.columns is not None and items:
            try:
                split = split_due(items)
            except Exception:
                self.columns = None
            else:
                for column, more in zip(self.columns, split, strict=True):
                    column += more  # type: ignore[operator]

    def truncate(self, key: bytes) -> bool:
        """A timer key at ``key`` was written or deleted: keep only what lies below it.
        True when the read-ahead covered that key (something read ahead was let go)."""
        if not self.start <= key < self.end:
            return False
        cut = bisect_left(self.items, key, lo=self.pos, key=_KEY)
        del self.items[cut:]
        if self.columns is not None:
            for column in self.columns:
                del column[cut:]
        self.end = key
        return True

    def take(self, end: bytes, limit: int, max_bytes: int | None,
             ) -> tuple[list[tuple[bytes, bytes]], bytes | None, bool]:
        """A scan of [start, end) from the read-ahead: up to ``limit`` pairs (of large
        values only about ``max_bytes``, as RocksStore.read_range_next cuts them), the
        first key at or after ``end`` when known, and whether the read-ahead ran out below
        ``end`` with room left in the batch (then the caller reads on from ``self.end``,
        and ``after`` means nothing). Moves ``pos`` (``split`` gives the columns of what it
        took); the caller moves ``start`` to the scan's new frontier (``advance``)."""
        items, pos = self.items, self.pos
        stop = min(bisect_left(items, end, lo=pos, key=_KEY), pos + limit)
        if max_bytes is not None and stop > pos and self.bytes * limit >= max_bytes * len(items):
            # large values: only as many as add up to max_bytes (the last may pass it)
            taken, i = 0, pos
            while i < stop and taken < max_bytes:
                taken += len(items[i][1])
                i += 1
            if taken >= max_bytes:
                stop = i
        out = items[pos:stop]
        self.pos = stop
        self._taken = (pos, stop)
        if len(out) == limit or (max_bytes is not None and stop < len(items)
                                 and items[stop][0] < end):
            return out, None, False  # cut: the scan goes on at once, as after a full read
        if stop < len(items):
            return out, items[stop][0], False  # the next key read ahead: when to look next
        return out, None, True

    def split(self) -> Split | None:
        """The columns of what the last ``take`` handed out (None: none were made)."""
        columns = self.columns
        if columns is None:
            return None
        first, stop = self._taken
        return (columns[0][first:stop], columns[1][first:stop],
                columns[2][first:stop], columns[3][first:stop])

    def advance(self, frontier: bytes) -> None:
        """The scan that took from it moved the shard's frontier to ``frontier``."""
        self.start = frontier
