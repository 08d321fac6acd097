"""The error hierarchy of hourglass. The API maps each ``code`` to a problem document."""

from __future__ import annotations


class HourglassError(Exception):
    """Root of every error hourglass raises on purpose."""

    code = "INTERNAL"
    status = 500

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


class InvalidArgument(HourglassError, ValueError):
    code = "INVALID_ARGUMENT"
    status = 400


class TopicInvalid(InvalidArgument):
    code = "TOPIC_INVALID"


class DelayTooLong(InvalidArgument):
    code = "DELAY_TOO_LONG"


class PayloadTooLarge(InvalidArgument):
    code = "PAYLOAD_TOO_LARGE"
    status = 413


class NotFound(HourglassError, LookupError):
    code = "NOT_FOUND"
    status = 404


class AlreadyDelivered(HourglassError):
    code = "ALREADY_DELIVERED"
    status = 409


class Conflict(HourglassError):
    code = "CONFLICT"
    status = 409


class Unauthorized(HourglassError):
    code = "UNAUTHORIZED"
    status = 401


class Forbidden(HourglassError):
    code = "FORBIDDEN"
    status = 403


class TooManyRequests(HourglassError):
    code = "TOO_MANY_REQUESTS"
    status = 429


class Unavailable(HourglassError):
    """Storage cannot take the write now (disk full, I/O error, engine blocked)."""

    code = "UNAVAILABLE"
    status = 503


class Overloaded(Unavailable):
    """Too many connections or long polls at once: try again shortly (Retry-After)."""

    retry_after_s = 1


class StorageError(Unavailable):
    """A RocksDB or CommitLog operation failed; nothing half-written is visible."""


class CorruptionError(HourglassError):
    """On-disk data failed a checksum or format check."""

    code = "CORRUPTION"
