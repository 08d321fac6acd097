"""TimerStore: one RocksDB (rocksdict, raw mode) with hourglass's column families.

Column families (storage/constants.py): ``timer.0..n-1`` (delayed messages, key = timer key),
``half`` (half messages by next-check time), ``index``, ``cq``, ``expiry``, ``tx``, ``meta``.
Every RocksDB failure surfaces as ``StorageError``; a wrong column-family name or a batch used
twice is ``InvalidArgument``.

Iteration never keeps a RocksDB iterator alive across a ``yield``: ``scan`` reads in chunks
and re-seeks after the last key it returned, so an abandoned generator holds nothing and
``close()`` really closes (rocksdict keeps the DB lock while any iterator lives).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import rocksdict

from storage.constants import (
    CF_META,
    CF_TIMER_PREFIX,
    META_FORMAT_VERSION,
    META_SHARDS,
    META_WATERMARK_PREFIX,
    timer_cf,
)
from storage.errors import InvalidArgument, StorageError
from storage.keys import MAX_U64, pack_u64, time_bound, topic_shard, unpack_u64
from storage.rocks_options import (
    StoreTuning,
    all_cf_names,
    cf_options,
    db_options,
    is_time_ordered,
)

STORE_FORMAT_VERSION = 1
MAX_TIMER_SHARDS = 256
_SCAN_CHUNK = 1024


def _storage_error(what: str, exc: BaseException) -> StorageError:
    return StorageError(f"RocksDB {what} failed: {exc}")


class Batch:
    """Operations applied atomically by ``TimerStore.write`` (one RocksDB WriteBatch).

    A Batch is written once; using it after ``write`` raises ``InvalidArgument``. The
    ``*_many`` methods take lists so hot paths pay no Python call per record.
    """

    __slots__ = ("_handles", "_wb")

    def __init__(self, handles: dict[str, Any]) -> None:
        self._handles = handles
        self._wb: rocksdict.WriteBatch | None = rocksdict.WriteBatch(raw_mode=True)

    def _target(self, cf: str) -> tuple[rocksdict.WriteBatch, Any]:
        wb = self._wb
        if wb is None:
            raise InvalidArgument("this batch was already written; make a new one")
        try:
            return wb, self._handles[cf]
        except KeyError:
            if not self._handles:  # the store's handles are dropped when it closes
                raise StorageError("the store is closed") from None
            raise InvalidArgument(f"unknown column family {cf!r}") from None

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        wb, handle = self._target(cf)
        wb.put(key, value, handle)

    def delete(self, cf: str, key: bytes) -> None:
        wb, handle = self._target(cf)
        wb.delete(key, handle)

    def delete_range(self, cf: str, begin: bytes, end: bytes) -> None:
        wb, handle = self._target(cf)
        wb.delete_range(begin, end, handle)

    def put_many(self, cf: str, items: Iterable[tuple[bytes, bytes]]) -> None:
        wb, handle = self._target(cf)
        put = wb.put
        for key, value in items:
            put(key, value, handle)

    def delete_many(self, cf: str, keys: Iterable[bytes]) -> None:
        wb, handle = self._target(cf)
        delete = wb.delete
        for key in keys:
            delete(key, handle)

    def __len__(self) -> int:
        return 0 if self._wb is None else int(self._wb.len())

    def _take(self) -> rocksdict.WriteBatch:
        wb = self._wb
        if wb is None:
            raise InvalidArgument("this batch was already written; make a new one")
        self._wb = None
        return wb


class TimerStore:
    def __init__(
        self, path: str | Path, *, timer_shards: int | None = 2, sync_writes: bool = False,
        read_only: bool = False, tuning: StoreTuning | None = None,
    ) -> None:
        """Open (or create) the store at ``path``.

        ``timer_shards`` must equal the count the data was written with (kept in ``meta``);
        ``None`` adopts the persisted count (e.g. to open a checkpoint). ``read_only`` opens
        without the write lock (checkpoints, analysis); writes then raise StorageError.
        """
        if timer_shards is not None and not 1 <= timer_shards <= MAX_TIMER_SHARDS:
            raise InvalidArgument(f"timer_shards must be in 1..{MAX_TIMER_SHARDS}")
        self._path = Path(path)
        self._read_only = read_only
        self._tuning = tuning or StoreTuning()
        self._db: rocksdict.Rdict | None = None
        self._cfs: dict[str, rocksdict.Rdict] = {}
        self._handles: dict[str, Any] = {}
        self._cleaned: dict[str, int] = {}  # cf -> bound of its last cleanup_prefix
        self._shards = 0
        existing = self._existing_cfs()
        if read_only and existing is None:
            raise StorageError(f"no RocksDB store at {self._path}")
        self._cache = rocksdict.Cache(self._tuning.block_cache_bytes)
        self._opts = db_options(self._tuning, create=not read_only)
        self._shards = self._open(existing, timer_shards)
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
        return self._db is None

    def timer_cf_names(self) -> list[str]:
        return [timer_cf(i) for i in range(self._shards)]

    def shard_of(self, topic: str) -> int:
        """The timer shard of ``topic``'s messages (storage.keys.topic_shard)."""
        return topic_shard(topic, self._shards)

    def _live_db(self) -> rocksdict.Rdict:
        if self._db is None:
            raise StorageError("the store is closed")
        return self._db

    def _cf(self, cf: str) -> rocksdict.Rdict:
        try:
            return self._cfs[cf]
        except KeyError:
            if self._db is None:
                raise StorageError("the store is closed") from None
            raise InvalidArgument(f"unknown column family {cf!r}") from None

    # --- generic access -------------------------------------------------------------------------
    def batch(self) -> Batch:
        self._live_db()
        return Batch(self._handles)

    def write(self, batch: Batch, *, sync: bool | None = None) -> None:
        db = self._live_db()
        wb = batch._take()
        if self._read_only:
            raise StorageError("the store is open read-only")
        opts = self._default_write if sync is None else (
            self._sync_write if sync else self._async_write)
        try:
            db.write(wb, opts)
        except Exception as exc:
            raise _storage_error("write", exc) from exc

    def get(self, cf: str, key: bytes) -> bytes | None:
        handle = self._cf(cf)
        try:
            value: bytes | None = handle.get(key)
        except Exception as exc:
            raise _storage_error("get", exc) from exc
        return value

    def multi_get(self, cf: str, keys: Sequence[bytes]) -> list[bytes | None]:
        handle = self._cf(cf)
        if not keys:
            return []
        try:
            values: list[bytes | None] = handle.get(list(keys))  # type: ignore[assignment]
        except Exception as exc:
            raise _storage_error("multi_get", exc) from exc
        return values

    def _chunk(self, cf: rocksdict.Rdict, start: bytes | None, upper: bytes | None, n: int,
               reverse: bool) -> list[tuple[bytes, bytes]]:
        """At most ``n`` pairs from ``start`` (inclusive; backwards: the last key < upper)."""
        ro = rocksdict.ReadOptions()
        if upper is not None:
            # NB rocksdict's set_iterate_lower_bound sets the upper bound: never use it.
            ro.set_iterate_upper_bound(upper)
        try:
            if reverse:
                it = cf.items(backwards=True, read_opt=ro)
            else:
                it = cf.items(from_key=start or b"", read_opt=ro)
            out: list[tuple[bytes, bytes]] = list(itertools.islice(it, n))  # type: ignore[arg-type]
            del it
        except Exception as exc:
            raise _storage_error("scan", exc) from exc
        return out

    def read_range(self, cf: str, start: bytes, end: bytes | None, limit: int,
                   reverse: bool = False) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` pairs of [start, end) read with one bounded iterator (one seek +
        ``limit`` nexts); ``reverse`` returns the last ones, last first."""
        handle = self._cf(cf)
        if limit <= 0 or (end is not None and end <= start):
            return []
        out = self._chunk(handle, start, end, limit, reverse)
        if reverse and start:
            out = list(itertools.takewhile(lambda kv: kv[0] >= start, out))
        return out

    def scan(
        self, cf: str, start: bytes = b"", end: bytes | None = None, limit: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end) in order (iterate_upper_bound = end), at most ``limit``.

        ``reverse`` yields the same range from its last key down. Reads in chunks of up to
        1024 pairs, so it is not a point-in-time view across chunks (use a checkpoint for
        that); each pair yielded was current when its chunk was read.
        """
        self._cf(cf)
        if limit is not None and limit < 0:
            raise InvalidArgument("limit must be >= 0")
        return self._scan(cf, start, end, limit, reverse)

    def _scan(self, cf: str, start: bytes, end: bytes | None,
              limit: int | None, reverse: bool) -> Iterator[tuple[bytes, bytes]]:
        # Holds only the CF *name* between yields: a suspended generator must not keep a
        # column-family handle (and with it the DB lock) alive after close().
        remaining = MAX_U64 if limit is None else limit
        if end is not None and end <= start:
            return
        upper, lower = end, start
        while remaining > 0:
            n = min(_SCAN_CHUNK, remaining)
            chunk = self._chunk(self._cf(cf), lower, upper, n, reverse)
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

    # --- timer column families ------------------------------------------------------------------
    def _timer(self, shard: int) -> rocksdict.Rdict:
        if not 0 <= shard < self._shards:
            raise InvalidArgument(f"shard {shard} is outside 0..{self._shards - 1}")
        return self._cf(timer_cf(shard))

    def due(self, shard: int, from_ms: int, now_ms: int, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` (key, value) of shard with from_ms <= deliverAt <= now_ms, in order."""
        return self._due(self._timer(shard), from_ms, now_ms, limit)

    def due_in(self, cf: str, from_ms: int, now_ms: int, limit: int) -> list[tuple[bytes, bytes]]:
        """``due`` for any time-ordered CF (timer shards, ``half``, ``expiry``)."""
        if not is_time_ordered(cf):
            raise InvalidArgument(f"{cf!r} is not a time-ordered column family")
        return self._due(self._cf(cf), from_ms, now_ms, limit)

    def _due(self, handle: rocksdict.Rdict, from_ms: int, now_ms: int,
             limit: int) -> list[tuple[bytes, bytes]]:
        if limit <= 0 or now_ms < from_ms:
            return []
        upper = None if now_ms >= MAX_U64 else time_bound(now_ms + 1)
        return self._chunk(handle, time_bound(from_ms), upper, limit, False)

    def next_due_at(self, shard: int, from_ms: int) -> int | None:
        """deliverAt of the first key of shard at or after from_ms, or None."""
        return self._next_at(self._timer(shard), from_ms)

    def next_at_in(self, cf: str, from_ms: int) -> int | None:
        """``next_due_at`` for any time-ordered CF."""
        if not is_time_ordered(cf):
            raise InvalidArgument(f"{cf!r} is not a time-ordered column family")
        return self._next_at(self._cf(cf), from_ms)

    def _next_at(self, handle: rocksdict.Rdict, from_ms: int) -> int | None:
        first = self._chunk(handle, time_bound(from_ms), None, 1, False)
        return unpack_u64(first[0][0]) if first else None

    def watermark(self, shard: int) -> int:
        """Persisted scan watermark of shard (0 if none)."""
        raw = self.get(CF_META, META_WATERMARK_PREFIX + str(shard).encode())
        return 0 if raw is None else unpack_u64(raw)

    @staticmethod
    def put_watermark(batch: Batch, shard: int, ms: int) -> None:
        """Add "watermark of shard = ms" to ``batch`` (the engine writes it with its deletes)."""
        batch.put(CF_META, META_WATERMARK_PREFIX + str(shard).encode(), pack_u64(ms))

    def cleanup_prefix(self, cf: str, before_ms: int) -> None:
        """delete_range [0, before_ms) of a time-ordered CF, then compact that range."""
        if not is_time_ordered(cf):
            raise InvalidArgument(f"{cf!r} is not a time-ordered column family")
        handle = self._cf(cf)
        if self._read_only:
            raise StorageError("the store is open read-only")
        if before_ms <= self._cleaned.get(cf, 0):
            return  # nothing new below the bound since the last clean-up of this CF
        end = time_bound(before_ms)
        compact = rocksdict.CompactOptions()
        compact.set_bottommost_level_compaction(
            rocksdict.BottommostLevelCompaction.force_optimized())
        try:
            handle.delete_range(pack_u64(0), end, self._default_write)
            handle.compact_range(None, end, compact)
        except Exception as exc:
            raise _storage_error(f"cleanup of {cf}", exc) from exc
        self._cleaned[cf] = before_ms

    # --- operations -----------------------------------------------------------------------------
    def checkpoint(self, dest: str | Path) -> Path:
        """A consistent copy (hard links) of the whole DB at ``dest`` (which must not exist)."""
        dest = Path(dest)
        db = self._live_db()
        if dest.exists():
            raise InvalidArgument(f"checkpoint destination {dest} already exists")
        try:
            checkpoint = rocksdict.Checkpoint(db)
            checkpoint.create_checkpoint(str(dest))
            del checkpoint
        except Exception as exc:
            raise _storage_error(f"checkpoint to {dest}", exc) from exc
        return dest

    def property(self, cf: str, name: str) -> str | None:
        handle = self._cf(cf)
        try:
            value = handle.property_value(name)
        except Exception as exc:
            raise _storage_error(f"property {name}", exc) from exc
        return None if value is None else str(value)

    def property_int(self, cf: str, name: str) -> int | None:
        handle = self._cf(cf)
        try:
            value = handle.property_int_value(name)
        except Exception as exc:
            raise _storage_error(f"property {name}", exc) from exc
        return None if value is None else int(value)

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
        db = self._live_db()
        try:
            return [dict(f) for f in db.live_files()]
        except Exception as exc:
            raise _storage_error("live_files", exc) from exc

    def flush(self, *, wait: bool = True) -> None:
        """Flush every CF's memtable to SST files (and the WAL)."""
        self._live_db()
        if self._read_only:
            return
        try:
            for handle in self._cfs.values():
                handle.flush(wait)
        except Exception as exc:
            raise _storage_error("flush", exc) from exc

    def _drop_handles(self) -> None:
        self._cfs.clear()
        self._handles.clear()

    def close(self) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        self._drop_handles()
        try:
            db.close()
        except Exception as exc:
            raise _storage_error("close", exc) from exc
        finally:
            del db

    def __enter__(self) -> TimerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._db is None else ("read-only" if self._read_only else "open")
        return f"TimerStore({str(self._path)!r}, timer_shards={self._shards}, {state})"


__all__ = ["Batch", "StoreTuning", "TimerStore"]
