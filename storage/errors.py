"""The error hierarchy of hourglass: each error carries a stable ``code``, and nothing about
HTTP. api/problems.py maps each code to a status and a title; api/errors.py adds the errors
only the HTTP layer raises."""

from __future__ import annotations


class HourglassError(Exception):
    """Root of every error hourglass raises on purpose."""

    code = "INTERNAL"

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


class InvalidArgument(HourglassError, ValueError):
    code = "INVALID_ARGUMENT"


class TopicInvalid(InvalidArgument):
    code = "TOPIC_INVALID"


class DelayTooLong(InvalidArgument):
    code = "DELAY_TOO_LONG"


class PayloadTooLarge(InvalidArgument):
    code = "PAYLOAD_TOO_LARGE"


class NotFound(HourglassError, LookupError):
    code = "NOT_FOUND"


class AlreadyDelivered(HourglassError):
    code = "ALREADY_DELIVERED"


class Conflict(HourglassError):
    code = "CONFLICT"


class TooManyRequests(HourglassError):
    """A rate bound was reached: the same request may succeed after ``retry_after_s``."""

    code = "TOO_MANY_REQUESTS"

    def __init__(self, detail: str = "", retry_after_s: int = 1) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


class OffsetExpired(HourglassError):
    """A read below what the log still holds: its records were deleted by retention
    (scheduler/retention.py). ``first_offset``: the topic's first offset still readable
    (None where only a log position was known: storage raises it so, the engine adds it)."""

    code = "OFFSET_EXPIRED"

    def __init__(self, detail: str = "", first_offset: int | None = None) -> None:
        super().__init__(detail)
        self.first_offset = first_offset





class Unavailable(HourglassError):
    """Storage cannot take the write now (disk full, I/O error, engine blocked, a store
    closed while a cluster node changes role): a 503 that tells when to try again."""

    code = "UNAVAILABLE"
    retry_after_s = 1


class NotLeader(Unavailable):
    """Cluster mode: this node may not write now (no leader during a failover, or it lost
    the lease and was refused by the write-ahead stream); retry after ``retry_after_s``."""


class ReplicationError(HourglassError):
    """Cluster mode: a write-ahead record does not fit this node's state (a gap, a log end
    that differs from the record's start): the node must not apply it."""

    code = "CORRUPTION"


class StorageError(Unavailable):
    """A RocksDB or CommitLog operation failed; nothing half-written is visible."""


class CorruptionError(HourglassError):
    """On-disk data failed a checksum or format check."""

    code = "CORRUPTION"
