"""The timer index: the ``timer.N`` column families read as "what is due, and how far delivery
got", over the RocksStore's generic get / read / batch API.

A timer key is ``time_bound(deliverAt) + topic + NUL + msgId`` (storage/keys.py), so a shard's
column family is ordered by due time. Each shard has a persisted *frontier* (``meta``,
``META_WATERMARK_PREFIX`` + shard): every timer key below it is delivered or cancelled, every
key at or above it is pending. It is either ``time_bound(ms)`` or, after a scan that stopped
inside a millisecond, the last key delivered + NUL; its first eight bytes read as the shard's
*watermark* in ms. The committer writes it with each delivery commit (``put_frontier``), the
scanner reads from it (``read_due``), the ledger reads "below it" as DELIVERED, and the
maintenance thread deletes the prefix below it (``RocksStore.cleanup_prefix``).
"""

from __future__ import annotations

from storage.batch import Batch
from storage.constants import CF_META, META_WATERMARK_PREFIX, timer_cf
from storage.errors import InvalidArgument
from storage.keys import MAX_U64, time_bound, unpack_u64
from storage.rocks import RangeRead, RocksStore


def _frontier_key(shard: int) -> bytes:
    return META_WATERMARK_PREFIX + str(shard).encode()


class TimerIndex:
    """The timer shards of one store. Holds nothing but the store: cheap to make where needed."""

    __slots__ = ("_store",)

    def __init__(self, store: RocksStore) -> None:
        self._store = store

    @property
    def shards(self) -> int:
        return self._store.timer_shards

    def cf(self, shard: int) -> str:
        """The column family of ``shard``; InvalidArgument outside 0..shards-1."""
        shards = self._store.timer_shards
        if not 0 <= shard < shards:
            raise InvalidArgument(f"shard {shard} is outside 0..{shards - 1}")
        return timer_cf(shard)

    def due(self, shard: int, from_ms: int, now_ms: int, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` (key, value) of shard with from_ms <= deliverAt <= now_ms, in order."""
        cf = self.cf(shard)
        if limit <= 0 or now_ms < from_ms:
            return []
        upper = None if now_ms >= MAX_U64 else time_bound(now_ms + 1)
        return self._store.read_range(cf, time_bound(from_ms), upper, limit)

    def read_due(self, cf: str, start: bytes, end: bytes, limit: int, *,
                 fill_cache: bool = True, max_bytes: int | None = None) -> RangeRead:
        """A scanner's read: up to ``limit`` pairs of [start, end) (start: the frontier, end:
        ``time_bound(now + 1)``), whether they are all of it (``complete``: else ``limit``
        or ``max_bytes`` cut the read, and the scan goes on at once), and when complete the
        first key at or after ``end`` (None: none): when to look next
        (``RocksStore.read_range_next``: RocksDB stops at ``end`` by itself). ``fill_cache``
        False: its blocks stay out of the block cache; ``max_bytes``: large values stop at
        about that many bytes."""
        return self._store.read_range_next(cf, start, end, limit, fill_cache=fill_cache,
                                           max_bytes=max_bytes)

    def oldest_due(self, shard: int, frontier: bytes, now_ms: int) -> int | None:
        """The due time of the first pending key of ``shard`` (at or after ``frontier``)
        if it is due by ``now_ms``, else None: one seek (two when nothing is due)."""
        pairs = self.read_due(self.cf(shard), frontier, time_bound(now_ms + 1), 1,
                              fill_cache=False).items
        return unpack_u64(pairs[0][0]) if pairs else None

    def frontier(self, shard: int) -> bytes:
        """Persisted scan frontier of shard: every timer key below it is delivered or
        cancelled, every key at or above it is pending. Either ``time_bound(ms)`` or, after a
        scan that stopped inside a millisecond, the last key delivered + NUL."""
        raw = self._store.get(CF_META, _frontier_key(shard))
        return time_bound(0) if raw is None else raw

    def watermark(self, shard: int) -> int:
        """Persisted scan watermark of shard, in ms (0 if none): every key below
        ``time_bound(watermark)`` is delivered or cancelled (see ``frontier``)."""
        return unpack_u64(self.frontier(shard))

    @staticmethod
    def put_frontier(batch: Batch, shard: int, key: bytes) -> None:
        """Add "frontier of shard = key" to ``batch`` (the engine writes it with each
        delivery commit)."""
        batch.put(CF_META, _frontier_key(shard), key)

    def cleanup(self, shard: int) -> int:
        """Delete the shard's delivered prefix (below its watermark) and compact it; returns
        the watermark."""
        watermark = self.watermark(shard)
        self._store.cleanup_prefix(self.cf(shard), watermark)
        return watermark
