"""TimerStore: RocksDB (rocksdict) with hourglass's column families.

INTERFACE STUB — being implemented (issue 2). Signatures are the contract for scheduler/.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path


class Batch:
    """Operations applied atomically by ``TimerStore.write`` (one RocksDB WriteBatch)."""

    def put(self, cf: str, key: bytes, value: bytes) -> None:
        raise NotImplementedError

    def delete(self, cf: str, key: bytes) -> None:
        raise NotImplementedError

    def delete_range(self, cf: str, begin: bytes, end: bytes) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class TimerStore:
    def __init__(
        self, path: str | Path, *, timer_shards: int = 2, sync_writes: bool = False,
        read_only: bool = False,
    ) -> None:
        raise NotImplementedError

    @property
    def timer_shards(self) -> int:
        raise NotImplementedError

    def shard_of(self, topic: str, msg_id: str) -> int:
        """Stable shard of a message (crc32 of its index key modulo timer_shards)."""
        raise NotImplementedError

    # generic access; every failure raises storage.errors.StorageError
    def batch(self) -> Batch:
        raise NotImplementedError

    def write(self, batch: Batch, *, sync: bool | None = None) -> None:
        raise NotImplementedError

    def get(self, cf: str, key: bytes) -> bytes | None:
        raise NotImplementedError

    def multi_get(self, cf: str, keys: Sequence[bytes]) -> list[bytes | None]:
        raise NotImplementedError

    def scan(
        self, cf: str, start: bytes = b"", end: bytes | None = None, limit: int | None = None,
        reverse: bool = False,
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keys in [start, end) in order (iterate_upper_bound = end), at most ``limit``."""
        raise NotImplementedError

    # timer column families
    def due(self, shard: int, from_ms: int, now_ms: int, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to ``limit`` (key, value) of shard with from_ms <= deliverAt <= now_ms, in order."""
        raise NotImplementedError

    def next_due_at(self, shard: int, from_ms: int) -> int | None:
        """deliverAt of the first key of shard at or after from_ms, or None."""
        raise NotImplementedError

    def watermark(self, shard: int) -> int:
        """Persisted scan watermark of shard (0 if none)."""
        raise NotImplementedError

    def cleanup_prefix(self, cf: str, before_ms: int) -> None:
        """delete_range [0, before_ms) of a time-ordered CF, then compact that range."""
        raise NotImplementedError

    # operations
    def checkpoint(self, dest: str | Path) -> Path:
        raise NotImplementedError

    def property(self, cf: str, name: str) -> str | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
