"""RocksStore: one RocksDB (rocksdict, raw mode) with hourglass's column families.

Column families (storage/constants.py): ``timer.0..n-1`` (delayed messages, key = timer key),
``half`` (half messages by next-check time), ``index``, ``cq``, ``expiry``, ``tx``, ``meta``.
Every RocksDB failure surfaces as ``StorageError``; a wrong column-family name or a batch used
twice is ``InvalidArgument``. The store knows column families, not timers: what is due and
each shard's persisted frontier are the scheduler's (scheduler/timer_index.py).

Iteration never keeps a RocksDB iterator alive across a ``yield``: ``scan`` reads in chunks
and re-seeks after the last key it returned, so an abandoned generator holds nothing and
``close()`` really closes (rocksdict keeps the DB lock while any iterator lives).

A full disk does not need a restart (storage/write_guard.py): below ``disk_reserve_bytes`` of
free space writes are refused before RocksDB sees them, and after RocksDB's sticky I/O error
(a WAL append that met ENOSPC) the store refuses writes until there is room again, then
closes and reopens the DB in place; RocksDB recovers every acknowledged write from its WAL.
Every operation holding a RocksDB handle passes the ``Gate`` (storage/gate.py), which the
reopen (and ``close``) pass alone, so no handle of the old DB survives it.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import rocksdict

from storage.batch import Batch
from storage.constants import (
    CF_META,
    CF_TIMER_PREFIX,
    META_FORMAT_VERSION,
    META_SHARDS,
    timer_cf,
)
from storage.errors import InvalidArgument, StorageError
from storage.gate import Gate
from storage.keys import MAX_U64, pack_u64, time_bound, unpack_u64
from storage.rocks_options import (
    StoreTuning,
    all_cf_names,
    cf_options,
    db_options,
    is_time_ordered,
)
from storage.write_guard import MonotonicClock, NowMs, WriteGuard

if TYPE_CHECKING:
    from storage.replication import Replicator

log = logging.getLogger(__name__)

STORE_FORMAT_VERSION = 1
MAX_TIMER_SHARDS = 256
_SCAN_CHUNK = 1024
DEFAULT_DISK_RETRY_INTERVAL_MS = 1000


def _storage_error(what: str, exc: BaseException) -> StorageError:
    return StorageError(f"RocksDB {what} failed: {exc}")


#: pairs a bounded due-range read takes before it judges their values' size
#: (``RocksStore.read_range_next``)
_SIZED_HEAD = 32


class RangeRead(NamedTuple):
    """``RocksStore.read_range_next``'s answer."""

    items: list[tuple[bytes, bytes]]  # the pairs read, in key order
    after: bytes | None  # when complete: the first key at or after the range's end, if any
    complete: bool  # items are every pair of the range (else the limit or max_bytes cut it)


class RocksStore:
    def __init__(
        self, path: str | Path, *, timer_shards: int | None = 2, sync_writes: bool = False,
        read_only: bool = False, tuning: StoreTuning | None = None, clock: NowMs | None = None,
        disk_reserve_bytes: int = 0, disk_retry_interval_ms: int = DEFAULT_DISK_RETRY_INTERVAL_MS,
    ) -> None:
        """Open (or create) the store at ``path``.

        ``timer_shards`` must equal the count the data was written with (kept in ``meta``);
        ``None`` adopts the persisted count (e.g. to open a checkpoint). ``read_only`` opens
        without the write lock (checkpoints, analysis); writes then raise StorageError.
        ``disk_reserve_bytes`` (0: none) and ``disk_retry_interval_ms`` (on ``clock``, default a
        monotonic one) set the full-disk handling of storage/write_guard.py.
        """
        if timer_shards is not None and not 1 <= timer_shards <= MAX_TIMER_SHARDS:
            raise InvalidArgument(f"timer_shards must be in 1..{MAX_TIMER_SHARDS}")
        if disk_reserve_bytes < 0 or disk_retry_interval_ms < 0:
            raise InvalidArgument("disk_reserve_bytes and disk_retry_interval_ms must be >= 0")
        self._path = Path(path)
        self._read_only = read_only
        self._tuning = tuning or StoreTuning()
        self._db: rocksdict.Rdict | None = None
        self._cfs: dict[str, rocksdict.Rdict] = {}
        self._handles: dict[str, Any] = {}
        self._families: list[str] = []  # the column families this store opens (sorted)
        self._cleaned: dict[str, int] = {}  # cf -> bound of its last cleanup_prefix
        self._shards = 0
        self._closed = False
        self._gate = Gate()
        # a due-range scan of large values leaves the block cache alone (``read_range_next``)
        self._no_fill = rocksdict.ReadOptions()
        self._no_fill.fill_cache(False)  # type: ignore[call-arg]  # (the stub lacks the bool)
        self._clock = clock or MonotonicClock()
        self._replicator: Replicator | None = None  # cluster mode (storage/replication.py)
        self._no_wal: rocksdict.WriteOptions | None = None  # (``disable_wal``)
        self._no_wal_reopens = 0  # ``reopens`` when it was disabled
        self._guard = WriteGuard(self._path, clock=self._clock,
                                 reserve_bytes=0 if read_only else disk_reserve_bytes,
                                 retry_interval_ms=disk_retry_interval_ms)
        self.reopens = 0  # successful reopens (after RocksDB's sticky error, or asked for)
        existing = self._existing_cfs()
        if read_only and existing is None:
            raise StorageError(f"no RocksDB store at {self._path}")
        self._cache = rocksdict.Cache(self._tuning.block_cache_bytes)
        self._opts = db_options(self._tuning, create=not read_only)
        self._shards = self._open(existing, timer_shards)
        self._families = sorted(self._cfs)
        self._sync_write = rocksdict.WriteOptions()
        self._sync_write.sync = True
        self._async_write = rocksdict.WriteOptions()
        self._async_write.sync = False
        self._default_write = self._sync_write if sync_writes else self._async_write

    # --- opening ----------------------------------------------------------------------------
    def _existing_cfs(self) -> list[str] | None:
        if not (self._path / "CURRENT").exists():
            return None
        try:
            return list(rocksdict.Rdict.list_cf(str(self._path), rocksdict.Options(raw_mode=True)))
        except Exception as exc:
            raise _storage_error(f"listing column families of {self._path}", exc) from exc

    def _open(self, existing: list[str] | None, requested: int | None) -> int:
        """Open the DB; returns the shard count. An existing store is opened with the timer
        CFs it has, so a wrong count is refused before any column family is created."""
        if existing is None:
            if requested is None:
                raise InvalidArgument(f"{self._path} is a new store: give timer_shards")
            names = set(all_cf_names(requested))
        elif self._read_only:
            names = set(existing)
        else:
            names = set(existing) | set(all_cf_names(0))
        names.discard("default")
        self._connect(sorted(names))
        try:
            shards = self._settle_shards(requested, existing is None)
        except BaseException:
            self.close()
            raise
        return shards

    def _connect(self, names: list[str]) -> None:
        families = {n: cf_options(n, self._tuning, self._cache) for n in names}
        access = (rocksdict.AccessType.read_only() if self._read_only
                  else rocksdict.AccessType.read_write())
        try:
            if not self._read_only:
                os.makedirs(self._path, exist_ok=True)
            self._db = rocksdict.Rdict(str(self._path), options=self._opts,
                                       column_families=families, access_type=access)
            for name in families:
                self._cfs[name] = self._db.get_column_family(name)
                self._handles[name] = self._db.get_column_family_handle(name)
        except Exception as exc:
            self._drop_handles()
            self._db = None
            raise _storage_error(f"opening {self._path}", exc) from exc

    def _settle_shards(self, requested: int | None, new: bool) -> int:
        meta = self._cfs.get(CF_META)
        raw = None if meta is None else meta.get(META_SHARDS)
        persisted = None if raw is None else unpack_u64(raw)
        if persisted is None and not new:  # written before the count was recorded
            persisted = sum(1 for n in self._cfs if n.startswith(CF_TIMER_PREFIX)) or None
        if requested is None:
            if persisted is None:
                raise InvalidArgument(f"{self._path} records no timer shard count; give one")
            requested = persisted
        elif persisted is not None and persisted != requested:
            raise InvalidArgument(
                f"{self._path} was written with timer_shards={persisted}; opening it with "
                f"timer_shards={requested} would misplace messages (re-shard offline instead)"
            )
        if self._read_only:
            return requested
        db = self._live_db()
        try:
            for name in all_cf_names(requested):
                if name not in self._cfs:
                    self._cfs[name] = db.create_column_family(
                        name, cf_options(name, self._tuning, self._cache))
                    self._handles[name] = db.get_column_family_handle(name)
            if raw is None:
                self._cfs[CF_META].put(META_SHARDS, pack_u64(requested))
                self._cfs[CF_META].put(META_FORMAT_VERSION, pack_u64(STORE_FORMAT_VERSION))
        except Exception as exc:
            raise _storage_error("initialising column families", exc) from exc
        return requested

    # --- basic properties -----------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def timer_shards(self) -> int:
        return self._shards

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def writable(self) -> bool:
        """True while writes are accepted (open, not read-only, not refused for a full disk).

        While they are refused, reading this also does what a write would: re-reads the free
        space and, after RocksDB's sticky I/O error, reopens the DB when there is room, at most
        every ``disk_retry_interval_ms``. So a readiness probe drives the recovery even when no
        write comes; it may then take as long as a reopen (the WAL's replay): call it off the
        event loop.
        """
        if self._read_only or self._closed:
            return False
        guard = self._guard
        if guard.refusal is None and guard.next_check_ms > self._clock.now_ms():
            return True
        try:
            self._admit()
        except StorageError:
            return False
        return True

    @property
    def refusal(self) -> str | None:
        """Why writes are refused (a full disk, RocksDB's sticky error), or None."""
        return self._guard.refusal

    def timer_cf_names(self) -> list[str]:
        return [timer_cf(i) for i in range(self._shards)]

    def _unavailable(self) -> StorageError:
        if self._closed:
            return StorageError("the store is closed")
        return StorageError(self._guard.refusal or "the store is being reopened")

    def _live_db(self) -> rocksdict.Rdict:
        if self._db is None:
            raise self._unavailable()
        return self._db

    def _check_cf(self, cf: str) -> None:
        """Validate a CF name without taking its handle (for checks outside the gate)."""
        if self._closed:
            raise self._unavailable()
        if cf not in self._families:
            raise InvalidArgument(f"unknown column family {cf!r}")

    def _cf(self, cf: str) -> rocksdict.Rdict:
        """The handle of ``cf``: only inside the gate, and never kept past it."""
        try:
            return self._cfs[cf]
        except KeyError:
            if self._db is None:
                raise self._unavailable() from None
            raise InvalidArgument(f"unknown column family {cf!r}") from None

    def _failed(self, what: str, exc: BaseException) -> StorageError:
        """A failed write-side operation: an I/O error stops writes until the reopen."""
        self._guard.failed(exc)
        return _storage_error(what, exc)

    # --- generic access -------------------------------------------------------------------------
    def batch(self) -> Batch:
        if self._closed:
            raise self._unavailable()
        return Batch(self._handles, self._gate, capture=self._replicator is not None)

    def check_leading(self) -> None:
        """NotLeader when a replicator says this node may not act as the leader now
        (storage/replication.py); single-node mode: always may."""
        if self._replicator is not None:
            self._replicator.check_leading()

    def attach_replicator(self, replicator: Replicator | None) -> None:
        """Cluster mode: every ``write`` goes through ``replicator`` (which ships the batch's
        captured operations, then calls ``write_local``); None detaches it."""
        self._replicator = replicator

    def write(self, batch: Batch, *, sync: bool | None = None) -> None:
        if self._replicator is not None:
            self._replicator.write(batch, sync)
            return
        self.write_local(batch, sync=sync)

    def write_local(self, batch: Batch, *, sync: bool | None = None) -> None:
        """``write`` without the replicator: this node's RocksDB only."""
        wb = batch._take()
        if self._read_only:
            raise StorageError("the store is open read-only")
        guard = self._guard
        if guard.refusal is not None or guard.next_check_ms <= self._clock.now_ms():
            self._admit()
        if self._no_wal is not None and self.reopens != self._no_wal_reopens:
            raise StorageError(f"{self._path} was reopened without a WAL: its memtables were "
                               "lost, the store is back at its last flush; open it again")
        opts = self._no_wal or (self._default_write if sync is None else (
            self._sync_write if sync else self._async_write))
        with self._gate:
            db = self._live_db()
            try:
                db.write(wb, opts)
            except Exception as exc:
                del db  # a traceback kept somewhere must not keep the DB open
                raise self._failed("write", exc) from exc

    def _admit(self) -> None:
        """Raise StorageError while writes are refused; reopen first when it is time."""
        if self._closed:
            raise self._unavailable()
        if self._guard.admit():
            self.reopen()

    @property
    def wal(self) -> bool:
        """False once ``disable_wal`` ran: a process kill loses the memtables."""
        return self._no_wal is None

    def disable_wal(self, *, vector_timers: bool = False) -> None:
        """Write without RocksDB's write-ahead log from now on (a cluster follower: the
        write-ahead stream is its WAL); ``vector_timers``: and with vector memtables in the
        timer CFs (``StoreTuning.timer_vector_memtable``: a follower only writes them, apart
        from its recount and listings). The DB is opened again with ``atomic_flush``, so the
        memtables of all column families reach disk together: after a kill -9 the store is
        what it was at one write, the last one flushed, never some families newer than
        others. ``sync`` is then ignored (RocksDB syncs nothing without a WAL); ``close``
        flushes the memtables. Until this store is closed there is no way back, and a later
        ``reopen`` (after a full disk) makes every write raise StorageError: the memtables
        are gone, and only opening the store again (the engine's start: ``settle_log``) puts
        its user back in step with it."""
        if self._read_only or self._no_wal is not None:
            return
        self._opts.set_atomic_flush(True)
        if vector_timers:
            self._tuning = dataclasses.replace(self._tuning, timer_vector_memtable=True)
            self._opts.set_allow_concurrent_memtable_write(False)
        self.reopen()
        self._no_wal_reopens = self.reopens
        no_wal = rocksdict.WriteOptions()
        no_wal.disable_wal = True  # type: ignore[method-assign,assignment]  # (a property: the stub is wrong)
        self._no_wal = no_wal

    def get(self, cf: str, key: bytes) -> bytes | None:
        with self._gate:
            handle = self._cf(cf)
            try:
                value: bytes | None = handle.get(key)
            except Exception as exc:
                raise _storage_error("get", exc) from exc
        return value

    def multi_get(self, cf: str, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            self._check_cf(cf)
            return []
        with self._gate:
            handle = self._cf(cf)
            try:
                values: list[bytes | None] = handle.get(list(keys))  # type: ignore[assignment]
            except Exception as exc:
                raise _storage_error("multi_get", exc) from exc
        return values

    def _chunk(self, cf: str, start: bytes | None, upper: bytes | None, n: int,
               reverse: bool) -> list[tuple[bytes, bytes]]:
        """At most ``n`` pairs of ``cf`` from ``start`` (inclusive; backwards: the last key <
        upper)."""
        ro = rocksdict.ReadOptions()
        if upper is not None:
            # NB rocksdict's set_iterate_lower_bound sets the upper bound: never use it.
            ro.set_iterate_upper_bound(upper)
        with self._gate:
            handle = self._cf(cf)
            try:
                if reverse:
                    it = handle.items(backwards=True, read_opt=ro)
                else:
                    it = handle.items(from_key=start or b"", read_opt=ro)
                out: list[tuple[bytes, bytes]] = list(itertools.islice(it, n))  # type: ignore[arg-type]
                del it
            except Exception as exc:
                raise _storage_error("scan", exc) from exc
        return out

    def read_range(self, cf: str, start: bytes, end: bytes | None, limit: int,
                   reverse: bool = False) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` pairs of [start, end) read with one bounded iterator (one seek +
        ``limit`` nexts); ``reverse`` returns the last ones, last first."""
        self._check_cf(cf)
        if limit <= 0 or (end is not None and end <= start):
            return []
        out = self._chunk(cf, start, end, limit, reverse)
        if reverse and start:
            out = list(itertools.takewhile(lambda kv: kv[0] >= start, out))
        return out

    def read_range_next(self, cf: str, start: bytes, end: bytes, limit: int, *,
                        fill_cache: bool = True, max_bytes: int | None = None) -> RangeRead:
        """Up to ``limit`` pairs of [start, end) (``RangeRead.items``), whether they are all
        of it (``complete``), and then the first key at or after ``end`` (``after``; None: no
        such key), which a timer scan needs to know when to look next
        (scheduler/timer_index.py). ``fill_cache`` False: the data blocks it reads from SST
        files do not go into the block cache (a scanner's reads of large values and of a
        burst: each due key is read once, docs/performance.md, W2).

        The first ``_SIZED_HEAD`` pairs come from one iterator that also names the key after
        the range when the range ends among them (a steady flow's scans: one seek, as
        before). A read that goes past them reads on with a second iterator bounded at
        ``end`` (RocksDB's iterate upper bound: it stops there by itself, with no Python
        call a pair; a burst's reads ~20 % faster alone), and only if it reaches the end
        with room left, looks past it with a third seek.

        ``max_bytes``: pairs of large values stop once their values add up to it (the last
        one may pass it; then the read is not complete, though fewer than ``limit`` came).
        Whether the values are large is judged from the first ``_SIZED_HEAD`` pairs: smaller
        ones are read ``limit`` at a time, uncounted (no Python call a pair)."""
        self._check_cf(cf)
        past: list[bytes] = []

        def before_end(item: tuple[bytes, bytes]) -> bool:
            if item[0] < end:
                return True
            past.append(item[0])
            return False

        n = min(limit, _SIZED_HEAD)
        plain = None if fill_cache else self._no_fill
        with self._gate:
            handle = self._cf(cf)
            try:
                it: Iterator[tuple[bytes, bytes]] = handle.items(  # type: ignore[assignment]
                    from_key=start, read_opt=plain)
                out = list(itertools.islice(itertools.takewhile(before_end, it), n))
                if len(out) < n:  # the range ended among them (the next key seen, if any)
                    return RangeRead(out, past[0] if past else None, True)
                if n == limit:
                    return RangeRead(out, None, False)
                bounded = rocksdict.ReadOptions()
                # NB rocksdict's set_iterate_lower_bound sets the upper bound: never use it.
                bounded.set_iterate_upper_bound(end)
                if not fill_cache:
                    bounded.fill_cache(False)  # type: ignore[call-arg]  # (the stub lacks the bool)
                it = handle.items(  # type: ignore[assignment]
                    from_key=out[-1][0] + b"\x00", read_opt=bounded)
                rest: list[tuple[bytes, bytes]]
                if max_bytes is None:
                    rest, cut = list(itertools.islice(it, limit - n)), False
                else:
                    rest, cut = self._rest(it, out, limit, max_bytes)
                del it
                out += rest
                if len(out) == limit or cut:
                    return RangeRead(out, None, False)
                keys: Iterator[bytes] = handle.keys(  # type: ignore[assignment]
                    from_key=end, read_opt=plain)
                after = next(keys, None)
                del keys
            except Exception as exc:
                raise _storage_error("scan", exc) from exc
        return RangeRead(out, after, True)

    @staticmethod
    def _rest(due: Iterator[tuple[bytes, bytes]], head: list[tuple[bytes, bytes]], limit: int,
              max_bytes: int) -> tuple[list[tuple[bytes, bytes]], bool]:
        """``read_range_next`` past its first pairs ``head``: the rest up to ``limit``, and
        for values large enough that ``limit`` of them would pass ``max_bytes``, only until
        all the values add up to ``max_bytes``; and whether that bound cut the read."""
        taken = sum(len(value) for _, value in head)
        room = limit - len(head)
        if taken * limit < max_bytes * len(head):  # small values: ``limit`` of them fit
            return list(itertools.islice(due, room)), False
        rest: list[tuple[bytes, bytes]] = []
        while room and taken < max_bytes:
            item = next(due, None)
            if item is None:
                return rest, False
            rest.append(item)
            taken += len(item[1])
            room -= 1
        return rest, room > 0

    def scan(
        self, cf: str, start: bytes = b"", end: bytes | None = None, limit: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end) in order (iterate_upper_bound = end), at most ``limit``.

        ``reverse`` yields the same range from its last key down. Reads in chunks of up to
        1024 pairs, so it is not a point-in-time view across chunks (use a checkpoint for
        that); each pair yielded was current when its chunk was read.
        """
        self._check_cf(cf)
        if limit is not None and limit < 0:
            raise InvalidArgument("limit must be >= 0")
        return self._scan(cf, start, end, limit, reverse)

    def _scan(self, cf: str, start: bytes, end: bytes | None,
              limit: int | None, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        # Holds only the CF *name* between yields: a suspended generator must not keep a
        # column-family handle (and with it the DB lock) alive after close() or a reopen.
        remaining = MAX_U64 if limit is None else limit
        if end is not None and end <= start:
            return
        upper, lower = end, start
        while remaining > 0:
            n = min(_SCAN_CHUNK, remaining)
            chunk = self._chunk(cf, lower, upper, n, reverse)
            if reverse:
                chunk = list(itertools.takewhile(lambda kv: kv[0] >= start, chunk))
            yield from chunk
            remaining -= len(chunk)
            if len(chunk) < n:
                return
            if reverse:
                upper = chunk[-1][0]
            else:
                lower = chunk[-1][0] + b"\x00"

    # --- time-ordered column families ------------------------------------------------------
    def _time_ordered(self, cf: str) -> str:
        if not is_time_ordered(cf):
            raise InvalidArgument(f"{cf!r} is not a time-ordered column family")
        self._check_cf(cf)
        return cf

    def cleanup_prefix(self, cf: str, before_ms: int) -> None:
        """delete_range [0, before_ms) of a time-ordered CF, then compact that range."""
        self._time_ordered(cf)
        if self._read_only:
            raise StorageError("the store is open read-only")
        if before_ms <= self._cleaned.get(cf, 0):
            return  # nothing new below the bound since the last clean-up of this CF
        self._admit()
        end = time_bound(before_ms)
        compact = rocksdict.CompactOptions()
        compact.set_bottommost_level_compaction(
            rocksdict.BottommostLevelCompaction.force_optimized())
        with self._gate:
            handle = self._cf(cf)
            try:
                handle.delete_range(pack_u64(0), end, self._no_wal or self._default_write)
                handle.compact_range(None, end, compact)
            except Exception as exc:
                del handle
                raise self._failed(f"cleanup of {cf}", exc) from exc
        self._cleaned[cf] = before_ms

    # --- operations -----------------------------------------------------------------------------
    def checkpoint(self, dest: str | Path) -> Path:
        """A consistent copy (hard links) of the whole DB at ``dest`` (which must not exist)."""
        dest = Path(dest)
        if dest.exists():
            raise InvalidArgument(f"checkpoint destination {dest} already exists")
        with self._gate:
            db = self._live_db()
            try:
                checkpoint = rocksdict.Checkpoint(db)
                checkpoint.create_checkpoint(str(dest))
                del checkpoint
            except Exception as exc:
                del db
                raise _storage_error(f"checkpoint to {dest}", exc) from exc
        return dest

    def property(self, cf: str, name: str) -> str | None:
        value = self._property(cf, name, as_int=False)
        return None if value is None else str(value)

    def property_int(self, cf: str, name: str) -> int | None:
        value = self._property(cf, name, as_int=True)
        return None if value is None else int(value)

    def _property(self, cf: str, name: str, *, as_int: bool) -> Any:
        with self._gate:
            handle = self._cf(cf)
            try:
                if as_int:
                    return handle.property_int_value(name)
                return handle.property_value(name)
            except Exception as exc:
                raise _storage_error(f"property {name}", exc) from exc

    def statistics_text(self) -> str:
        """RocksDB's statistics dump (tickers and histograms), DB-wide since open."""
        self._live_db()
        return str(self._opts.get_statistics() or "")

    def statistics(self) -> dict[str, int]:
        """The RocksDB tickers (``rocksdb.number.db.next`` ... ) as name -> count."""
        counters: dict[str, int] = {}
        for line in self.statistics_text().splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[1] == "COUNT":
                counters[parts[0]] = int(parts[3])
        return counters

    def live_files(self) -> list[dict[str, Any]]:
        """SST files of the whole DB: name, size, level, start/end key, entries, deletions."""
        with self._gate:
            db = self._live_db()
            try:
                return [dict(f) for f in db.live_files()]
            except Exception as exc:
                del db
                raise _storage_error("live_files", exc) from exc

    def flush(self, *, wait: bool = True) -> None:
        """Flush every CF's memtable to SST files (and the WAL)."""
        if self._read_only:
            self._live_db()
            return
        with self._gate:
            self._live_db()
            try:
                for handle in self._cfs.values():
                    handle.flush(wait)
            except Exception as exc:
                raise self._failed("flush", exc) from exc

    # --- closing and reopening ------------------------------------------------------------------
    def _drop_handles(self) -> None:
        self._cfs.clear()
        self._handles.clear()

    def _release(self) -> BaseException | None:
        """Drop every handle and close the DB (gate held exclusively); returns what close
        raised. After RocksDB's background error, close raises ("Writer has previous
        error") and still closes."""
        db, self._db = self._db, None
        self._drop_handles()
        if db is None:
            return None
        try:
            db.close()
        except Exception as exc:
            return exc
        finally:
            del db
        return None

    def reopen(self) -> None:
        """Close and reopen the DB in place, with the same options: RocksDB replays its WAL,
        so every acknowledged write is there. Operations in flight finish first; new ones
        wait for it. Raises StorageError when it cannot reopen (the store then answers
        StorageError until a later attempt works). The write path calls it after RocksDB's
        sticky I/O error once there is room again."""
        started = time.monotonic()
        with self._gate.exclusive():
            try:
                if self._closed:
                    raise self._unavailable()
                closing = self._release()
                try:
                    self._connect(self._families)
                except StorageError as exc:
                    if "lock" not in str(exc):
                        raise
                    gc.collect()  # a handle of the old DB kept alive by a reference cycle
                    self._connect(self._families)
            except BaseException as exc:
                self._guard.reopen_failed(exc)
                raise
        self.reopens += 1
        log.info("%s reopened in %.3f s (closing it said: %s)", self._path,
                 time.monotonic() - started, closing)
        self._guard.reopened()

    def close(self) -> None:
        with self._gate.exclusive():
            self._closed = True
            if self._no_wal is not None and self._db is not None and not self._guard.sticky:
                # without a WAL, what is only in the memtables reaches disk now; one column
                # family at a time, ``meta`` (the applied sequence) last: killed half-way, the
                # store restarts at an older sequence, and applying the stream again from
                # there over families that already hold those writes ends in the same state
                try:
                    for name in sorted(self._cfs, key=lambda cf: cf == CF_META):
                        self._cfs[name].flush(True)
                except Exception:
                    log.exception("flushing %s's memtables at close", self._path)
            exc = self._release()
        if exc is not None and not self._guard.sticky:
            raise _storage_error("close", exc) from exc

    def __enter__(self) -> RocksStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("read-only" if self._read_only else "open")
        return f"RocksStore({str(self._path)!r}, timer_shards={self._shards}, {state})"


__all__ = ["Batch", "RocksStore", "StoreTuning"]
