"""CommitLog: fixed-size memory-mapped segments of length+magic+CRC32C framed records.

INTERFACE STUB — being implemented (issue 2). Signatures are the contract for scheduler/.
A position is a global byte offset: segment start offset + offset inside the segment.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    records: int
    bytes: int
    errors: list[str]


class CommitLog:
    def __init__(
        self, directory: str | Path, *, segment_size: int = 1 << 30,
        flush_policy: str = "async", flush_interval_ms: int = 200,
    ) -> None:
        """Opens (recovering: the tail after the last valid record is truncated) or creates."""
        raise NotImplementedError

    @property
    def end_position(self) -> int:
        """Position the next record will be written at."""
        raise NotImplementedError

    def append_batch(self, payloads: Sequence[bytes]) -> list[int]:
        """Append records; returns their positions. Raises StorageError on failure, in which
        case the log's end is unchanged (nothing of the failed batch becomes readable)."""
        raise NotImplementedError

    def read(self, position: int) -> bytes:
        raise NotImplementedError

    def iter_from(self, position: int) -> Iterator[tuple[int, bytes]]:
        """(position, payload) of every record from ``position`` to the end."""
        raise NotImplementedError

    def flush(self) -> None:
        raise NotImplementedError

    def verify(self) -> VerifyReport:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError
