"""Errors only the HTTP layer raises: a caller without a valid token, a token that may not do
what it asks, a server too busy to hold another long poll, a token holding too many. They
belong to the one hierarchy of storage/errors.py (a ``code`` each); api/problems.py maps the
codes to statuses."""

from __future__ import annotations

from storage.errors import HourglassError, Unavailable


class Unauthorized(HourglassError):
    code = "UNAUTHORIZED"


class Forbidden(HourglassError):
    code = "FORBIDDEN"


class Overloaded(Unavailable):
    """Too many long polls at once: try again shortly (Retry-After)."""

    retry_after_s = 1


class TooManyLongPolls(HourglassError):
    """One token holds ``max_long_polls_per_token`` long polls and streams already (429)."""

    code = "TOO_MANY_REQUESTS"
    retry_after_s = 1
