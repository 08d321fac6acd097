"""When is a message due? The timing fields of a send, with RocketMQ's precedence.

Explicit fields first: at most one of ``deliver_at`` (absolute, epoch ms), ``delay_ms``
(relative) and ``delay_level`` (RocketMQ 4.x level). With none of them, the RocketMQ
properties are honoured in the order the RocketMQ 5 broker uses
(``HookUtils.checkIfTimerMessage`` / ``transformTimerMessage``):

1. ``DELAY`` (a 4.x level) when it is > 0: it wins, and the timer properties are ignored
   (RocketMQ clears them); ``DELAY`` <= 0 means "no level", as in RocketMQ;
2. ``TIMER_DELAY_SEC`` (relative, seconds);
3. ``TIMER_DELAY_MS`` (relative, ms);
4. ``TIMER_DELIVER_MS`` (absolute, epoch ms).

With none of these either, the message is due now. A time in the past means "now" (it is
appended at once; its ``deliver_at`` keeps the requested value). A delay beyond the
configured maximum is ``DelayTooLong``; malformed values are ``InvalidArgument``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduler.levels import DelayLevels
from storage.constants import (
    PROP_DELAY_LEVEL,
    PROP_TIMER_DELAY_MS,
    PROP_TIMER_DELAY_SEC,
    PROP_TIMER_DELIVER_MS,
)
from storage.errors import DelayTooLong, InvalidArgument
from storage.keys import MAX_U64


@dataclass(frozen=True, kw_only=True, slots=True)
class Timing:
    deliver_at: int  # epoch ms, >= 0
    level: int | None  # the (clamped) delay level used, if any


def _int_property(properties: Mapping[str, str], name: str) -> int | None:
    raw = properties.get(name)
    if raw is None:
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        raise InvalidArgument(f"property {name} must be an integer, got {raw!r}") from None


def _check_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name} must be an integer, got {value!r}")
    return value


def resolve_timing(
    *, now_ms: int, levels: DelayLevels, max_delay_ms: int, deliver_at: int | None = None,
    delay_ms: int | None = None, delay_level: int | None = None,
    properties: Mapping[str, str] | None = None,
) -> Timing:
    """The deliver time of a send; raises InvalidArgument / DelayTooLong."""
    given = [n for n, v in (("deliverAt", deliver_at), ("delayMs", delay_ms),
                            ("delayLevel", delay_level)) if v is not None]
    if len(given) > 1:
        raise InvalidArgument(f"give at most one of deliverAt, delayMs, delayLevel (got "
                              f"{', '.join(given)})")
    level: int | None = None
    if deliver_at is not None:
        at = _check_int("deliverAt", deliver_at)
    elif delay_ms is not None:
        if _check_int("delayMs", delay_ms) < 0:
            raise InvalidArgument(f"delayMs must be >= 0, got {delay_ms}")
        at = now_ms + delay_ms
    elif delay_level is not None:
        level = levels.clamp(_check_int("delayLevel", delay_level))
        at = now_ms + levels.delays_ms[level - 1]
    else:
        props = properties or {}
        prop_level = _int_property(props, PROP_DELAY_LEVEL)
        if prop_level is not None and prop_level > 0:
            level = levels.clamp(prop_level)
            at = now_ms + levels.delays_ms[level - 1]
        elif (sec := _int_property(props, PROP_TIMER_DELAY_SEC)) is not None:
            at = now_ms + sec * 1000
        elif (ms := _int_property(props, PROP_TIMER_DELAY_MS)) is not None:
            at = now_ms + ms
        elif (absolute := _int_property(props, PROP_TIMER_DELIVER_MS)) is not None:
            at = absolute
        else:
            at = now_ms
    if at < 0:
        raise InvalidArgument(f"deliver time {at} is before the epoch")
    if at - now_ms > max_delay_ms or at > MAX_U64:
        raise DelayTooLong(f"deliver time {at} is {at - now_ms} ms ahead; the maximum delay "
                           f"is {max_delay_ms} ms")
    return Timing(deliver_at=at, level=level)
