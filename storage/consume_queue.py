"""ConsumeQueue: per topic, queue offset -> (CommitLog position, payload size), in the ``cq`` CF.

Key = topic NUL 8-byte big-endian queue offset (storage/keys.py ``cq_key``), so one topic's
entries are contiguous and in offset order. Value = a *run*: the 8-byte BE position + 4-byte
BE size of that offset and of the offsets after it, one after another (12 bytes each). A
delivery commit appends a contiguous run of offsets per topic and writes it as ONE entry (a
put per message was ~0.5 µs of the commit and one iterator step per message of a pull); a
replayed record is a run of one, which is also the format before runs, so older stores read
the same. Runs never overlap: an offset is written once, by the commit (or the replay) of
the record that took it.

Reading N entries from offset O: one backward step finds the run holding O, then one seek
and at most N steps read the runs up to O + N. Entries are written inside the caller's batch,
next to the index updates of the same delivery, so they commit atomically with them.

A topic's end offset is read from RocksDB once and then kept in memory: the committer, the
one writer of entries, notes the ends each write landed (``landed``) before it wakes anyone,
and has them read again after a replay, a revoke or a write that raised (``forget``). Code
that writes entries around it must do the same.

The tail in memory. With the ends, ``landed`` takes the runs the write stored, and the
newest ``TAIL_ENTRIES`` entries of the ``TAIL_TOPICS`` topics written last stay in memory as
they are stored (a run's bytes). A reader that keeps up (a stream, a long poll) asks for
what the last commit wrote, and gets it from there without RocksDB: two iterators, ~13 µs
back to back but ~100 µs on a thread just woken (in process, a read of the last 8 entries
after 4 ms asleep), once per delivery commit of a steady trickle. The tail answers only
while it ends at the topic's noted end offset (it then holds the newest entries: nothing
lies past it), and ``forget`` drops it with the ends.

A consumer group's committed offset in a topic's log lives beside the queue it indexes: one
``meta`` key per (topic, group) holding the next offset the group has not consumed.
"""

from __future__ import annotations

import functools
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from storage.commitlog import CommitLog
from storage.constants import CF_CQ, CF_META, META_GROUP_OFFSET_PREFIX, META_TOPIC_FIRST_PREFIX
from storage.errors import CorruptionError, InvalidArgument
from storage.keys import MAX_U64, SEP, cq_key, pack_u64, topic_prefix, unpack_u64
from storage.native import native
from storage.records import decode_log_record
from storage.rocks import Batch, RocksStore

VALUE = struct.Struct(">QI")
_OFFSET = struct.Struct(">Q")
_POSITION, _SIZE = itemgetter(1), itemgetter(2)  # of an (offset, position, size) entry
REBUILD_BATCH = 4096
TAIL_ENTRIES = 1024  # per topic: the newest entries kept in memory (12 KiB; module doc)
TAIL_TOPICS = 256  # topics with a tail in memory, the ones written last
Run = tuple[str, int, bytes]  # (topic, first queue offset, value) of a stored run


@dataclass(frozen=True, kw_only=True, slots=True)
class CqEntry:
    queue_offset: int
    position: int
    size: int


def group_offset_key(topic: str, group: str) -> bytes:
    """CF_META key of ``group``'s committed offset in ``topic``'s log."""
    return META_GROUP_OFFSET_PREFIX + topic.encode() + SEP + group.encode()


class ConsumeQueue:
    def __init__(self, store: RocksStore) -> None:
        self._store = store
        # topic -> the end offset of its entries in RocksDB: read once, then moved on by the
        # committer after each write that lands (``landed``), and forgotten when a replay or
        # a revoke changes what landed otherwise (``forget``). A receive asked RocksDB every
        # time: a reverse seek, ~11 % of the event loop under a steady trickle (W3).
        self._ends: dict[str, int] = {}
        self._ends_lock = threading.Lock()
        self._generation = 0  # of ``forget``: a read from before one is not kept
        # topic -> (first offset, run bytes) of its newest entries (module doc); replaced,
        # never changed in place, so a reader without the lock sees one tail or the next
        self._tails: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        # topic -> its first offset still in the log (retention moves it: ``trim``), read
        # from RocksDB once per topic
        self._firsts: dict[str, int] = {}

    def group_offset(self, topic: str, group: str) -> int:
        """``group``'s committed offset in ``topic``'s log (0 before its first commit)."""
        raw = self._store.get(CF_META, group_offset_key(topic, group))
        return 0 if raw is None else unpack_u64(raw)

    @staticmethod
    def put_group_offset(batch: Batch, topic: str, group: str, offset: int) -> None:
        """Add "``group``'s committed offset in ``topic``'s log = ``offset``" to ``batch``."""
        batch.put(CF_META, group_offset_key(topic, group), pack_u64(offset))

    @staticmethod
    def put(batch: Batch, topic: str, queue_offset: int, position: int, size: int) -> None:
        """Add entry ``queue_offset`` of ``topic`` to ``batch`` (a run of one)."""
        if not (0 <= position <= MAX_U64 and 0 <= size < 1 << 32):
            raise InvalidArgument(f"bad consume-queue entry: position {position}, size {size}")
        batch.put(CF_CQ, cq_key(topic, queue_offset), VALUE.pack(position, size))

    @staticmethod
    def put_run(batch: Batch, topic: str, first: int, positions: list[int],
                sizes: list[int]) -> list[Run]:
        """Add the entries of offsets ``first``, ``first + 1``, ... (one run: a delivery
        commit's of one topic) to ``batch``, from the columns of their positions and
        sizes; returns the run stored (for ``landed``)."""
        if not positions:
            return []
        key, value = _run_entry(topic_prefix(topic), first, positions, sizes)
        batch.put(CF_CQ, key, value)
        return [(topic, first, value)]

    @staticmethod
    def put_many(batch: Batch, topic: str, entries: list[tuple[int, int, int]]) -> list[Run]:
        """Add (queue_offset, position, size) entries of one topic to ``batch``: one run per
        stretch of consecutive offsets (a delivery commit's are one stretch); returns the
        runs stored (for ``landed``)."""
        if not entries:
            return []
        prefix = topic_prefix(topic)
        pairs, runs = [], []
        start = 0
        for i in range(1, len(entries) + 1):
            if i == len(entries) or entries[i][0] != entries[i - 1][0] + 1:
                run = entries[start:i]
                pair = _run_entry(prefix, run[0][0], map(_POSITION, run), map(_SIZE, run))
                pairs.append(pair)
                runs.append((topic, run[0][0], pair[1]))
                start = i
        batch.put_many(CF_CQ, pairs)
        return runs

    def read(self, topic: str, offset: int, n: int) -> list[CqEntry]:
        """Entries ``offset`` .. ``offset + n - 1`` of ``topic`` that exist, in order."""
        return [CqEntry(queue_offset=first + i, position=position, size=size)
                for first, raw in self._slices(topic, offset, n)
                for i, (position, size) in enumerate(VALUE.iter_unpack(raw))]

    def positions(self, topic: str, offset: int, n: int) -> list[int]:
        """The CommitLog positions of the entries ``read`` returns: the pull path (unpacked
        in C, no tuple per entry kept: a stream reading 1000 behind a burst's commits)."""
        out: list[int] = []
        for _, raw in self._slices(topic, offset, n):
            out += _positions(raw)
        return out

    def _slices(self, topic: str, offset: int, n: int) -> list[tuple[int, bytes]]:
        """The entries of the offsets [offset, offset + n) that exist, as (first queue
        offset, stored bytes of those entries) per run, in order; CorruptionError for an
        entry of the wrong shape."""
        if offset < 0 or n < 0:
            raise InvalidArgument("offset and n must be >= 0")
        if n == 0 or offset > MAX_U64:
            return []
        tail = self._tails.get(topic)
        if tail is not None and offset >= tail[0]:
            first, raw = tail
            count = len(raw) // VALUE.size
            if first + count == self._ends.get(topic):  # the newest entries: nothing after
                lo, hi = offset - first, min(offset + n - first, count)
                if lo >= hi:
                    return []
                return [(offset, raw[lo * VALUE.size:hi * VALUE.size])]
        prefix = topic_prefix(topic)
        cut = len(prefix)
        stop = offset + n
        end = prefix + _OFFSET.pack(stop) if stop <= MAX_U64 else _after(prefix)
        here = prefix + _OFFSET.pack(offset)
        # the run holding ``offset`` starts at or before it: the last key <= here
        before = self._store.read_range(CF_CQ, prefix, here + b"\x00", 1, reverse=True)
        start = before[0][0] if before else here
        pairs = self._store.read_range(CF_CQ, start, end, n)
        out: list[tuple[int, bytes]] = []
        for key, value in pairs:
            first = _run_start(key, value, cut)
            lo = max(offset - first, 0)
            hi = min(stop - first, len(value) // VALUE.size)
            if lo < hi:
                out.append((first + lo, value[lo * VALUE.size:hi * VALUE.size]))
        return out

    def end_offset(self, topic: str) -> int:
        """The next queue offset of ``topic`` (0 for a topic with no entries)."""
        end = self._ends.get(topic)
        if end is not None:
            return end
        generation = self._generation
        end = self._read_end(topic)
        with self._ends_lock:  # a write may have landed meanwhile: its end is the later one
            if generation == self._generation:
                known = self._ends.get(topic)
                if known is not None and known > end:
                    return known
                self._ends[topic] = end
        return end

    def landed(self, ends: dict[str, int], runs: Sequence[Run] = ()) -> None:
        """A write just landed entries up to these end offsets (topic -> end), ``runs`` among
        them (what ``put_run`` and ``put_many`` returned): the committer, its lock held, so
        each is the latest."""
        with self._ends_lock:
            tails = self._tails
            for topic, first, value in runs:
                tail = tails.get(topic)
                if tail is not None and tail[0] + len(tail[1]) // VALUE.size == first:
                    first, value = tail[0], tail[1] + value  # it goes on from the tail
                extra = len(value) // VALUE.size - TAIL_ENTRIES
                if extra > 0:
                    first, value = first + extra, value[extra * VALUE.size:]
                tails[topic] = (first, value)
                tails.move_to_end(topic)
            while len(tails) > TAIL_TOPICS:
                tails.popitem(last=False)
            self._ends.update(ends)

    def forget(self) -> None:
        """What landed may differ from what was noted (a replay, a revoke, a write that raised):
        read each end offset from RocksDB again (and no entry from the tail)."""
        with self._ends_lock:
            self._generation += 1
            self._ends.clear()
            self._tails.clear()

    def _read_end(self, topic: str) -> int:
        prefix = topic_prefix(topic)
        last = self._store.read_range(CF_CQ, prefix, _after(prefix), 1, reverse=True)
        if not last:  # none, or retention deleted them all: the log goes on from its first
            return self.first_offset(topic)
        key, value = last[0]
        return _run_start(key, value, len(prefix)) + len(value) // VALUE.size


    # --- retention (scheduler/retention.py) -------------------------------------------------
    def first_offset(self, topic: str) -> int:
        """The first offset of ``topic`` the log still holds (0 until retention deleted
        some): below it a read is ``OffsetExpired``."""
        first = self._firsts.get(topic)
        if first is None:
            raw = self._store.get(CF_META, topic_first_key(topic))
            first = 0 if raw is None else unpack_u64(raw)
            with self._ends_lock:  # a trim meanwhile moved it on: keep the later one
                first = self._firsts.setdefault(topic, first)
        return first

    def trim_topic(self, batch: Batch, topic: str, position: int) -> int | None:
        """Add to ``batch`` the removal of ``topic``'s entries that point below the log
        ``position``, and the topic's new first offset; returns that offset (None when no
        entry points below it). Entries of a topic are in log order, so they are a prefix of
        its queue; a run that straddles ``position`` is stored again from its first entry at
        or above it. Call ``moved_first`` BEFORE the batch is written (module doc of
        scheduler/retention.py: why)."""
        prefix = topic_prefix(topic)
        cut = len(prefix)
        stop = _after(prefix)
        start = prefix
        first: int | None = None
        done = False
        while not done:
            rows = self._store.read_range(CF_CQ, start, stop, REBUILD_BATCH)
            done = len(rows) < REBUILD_BATCH
            for key, value in rows:
                start_offset = _run_start(key, value, cut)
                if VALUE.unpack_from(value)[0] >= position:
                    done = True
                    break
                batch.delete(CF_CQ, key)
                count = len(value) // VALUE.size
                if VALUE.unpack_from(value, len(value) - VALUE.size)[0] < position:
                    first = start_offset + count  # all of it below (no tuple per entry)
                    continue
                kept = [e for e in run_entries(key, value, cut) if e[1] >= position]
                self.put_many(batch, topic, kept)
                first = kept[0][0]
                done = True
                break
            if rows:
                start = rows[-1][0] + b"\x00"
        if first is not None:
            batch.put(CF_META, topic_first_key(topic), pack_u64(first))
        return first

    def forget_firsts(self) -> None:
        """Read each topic's first offset from RocksDB again (a cluster follower, after it
        applied a record of the leader's retention: scheduler/broker.py ``apply``)."""
        with self._ends_lock:
            self._firsts.clear()

    def moved_first(self, topic: str, first: int) -> None:
        """``topic``'s first offset is ``first`` from now on (retention, before its write);
        the tail in memory no longer answers for the offsets below it."""
        with self._ends_lock:
            self._firsts[topic] = max(first, self._firsts.get(topic, 0))
            tail = self._tails.get(topic)
            if tail is not None and tail[0] < first:
                cut = (first - tail[0]) * VALUE.size
                if cut >= len(tail[1]):
                    del self._tails[topic]
                else:  # (replaced, never changed in place: module doc)
                    self._tails[topic] = (first, tail[1][cut:])

    def topics(self, after: str | None = None, limit: int = 1000) -> list[str]:
        """Up to ``limit`` topics with consume-queue entries, in name order, after ``after``:
        one seek per topic."""
        out: list[str] = []
        start = b"" if after is None else _after(topic_prefix(after))
        while len(out) < limit:
            rows = self._store.read_range(CF_CQ, start, None, 1)
            if not rows:
                break
            key = rows[0][0]
            sep = key.find(SEP)
            if sep <= 0:
                raise CorruptionError(f"malformed consume-queue key {key!r}")
            out.append(key[:sep].decode())
            start = key[:sep] + b"\x01"
        return out


def topic_first_key(topic: str) -> bytes:
    """CF_META key of ``topic``'s first offset still in the log."""
    return META_TOPIC_FIRST_PREFIX + topic.encode()


def run_entries(key: bytes, value: bytes, cut: int) -> list[tuple[int, int, int]]:
    """(queue offset, position, size) of each entry of the run stored as ``key`` -> ``value``
    (``cut``: the length of the key's topic prefix); CorruptionError when malformed."""
    first = _run_start(key, value, cut)
    return [(first + i, position, size)
            for i, (position, size) in enumerate(VALUE.iter_unpack(value))]


def _run_entry(prefix: bytes, first: int, positions: Iterable[int],
               sizes: Iterable[int]) -> tuple[bytes, bytes]:
    """The key and value of a run of entries from offset ``first`` (module doc)."""
    value = None
    if native is not None and type(positions) is list and type(sizes) is list:
        value = native.cq_run(positions, sizes)  # a delivery commit's: one C pass
    try:
        return prefix + _OFFSET.pack(first), value if value is not None else cq_run_py(
            positions, sizes)
    except struct.error as exc:
        raise InvalidArgument(f"bad consume-queue entry: {exc}") from None


def cq_run_py(positions: Iterable[int], sizes: Iterable[int]) -> bytes:
    """A run's value: each entry's position and size (``VALUE``), back to back (the twin of
    storage/_native.pyx ``cq_run``); struct.error for one out of range."""
    return b"".join(map(VALUE.pack, positions, sizes))


def _run_start(key: bytes, value: bytes, cut: int) -> int:
    """The first queue offset of a stored run; CorruptionError for a malformed entry."""
    if len(key) != cut + 8 or not value or len(value) % VALUE.size:
        raise CorruptionError(f"malformed consume-queue entry {key!r}")
    return int(_OFFSET.unpack_from(key, cut)[0])


#: entries whose positions one ``struct`` call reads into one tuple, their sizes skipped
_BLOCK = 64
_BLOCK_POSITIONS = struct.Struct(">" + "Q4x" * _BLOCK)


@functools.lru_cache(maxsize=_BLOCK)
def _positions_struct(n: int) -> struct.Struct:
    """Reads the positions of ``n`` entries (fewer than ``_BLOCK``) into one tuple."""
    return struct.Struct(">" + "Q4x" * n)


def _positions(raw: bytes) -> list[int]:
    """The positions of the stored entries ``raw`` (``VALUE`` each): a tuple per 64 entries,
    not per entry (``iter_unpack``) with an ``itemgetter`` over them: 1000 in ~30 µs against
    ~140 (a receive's, a pull's and a stream's read of 1000)."""
    n = len(raw) // VALUE.size
    whole = n - n % _BLOCK
    cut = whole * VALUE.size
    view = memoryview(raw)
    out: list[int] = []
    for block in _BLOCK_POSITIONS.iter_unpack(view[:cut]):
        out += block
    if n > whole:
        out += _positions_struct(n - whole).unpack(view[cut:])
    return out


def _after(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with ``prefix`` (topic NUL)."""
    return prefix[:-1] + b"\x01"


def rebuild(store: RocksStore, commitlog: CommitLog, from_position: int = 0) -> int:
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
