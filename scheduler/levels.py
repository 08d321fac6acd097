"""RocketMQ 4.x delay levels (``messageDelayLevel``).

RocketMQ's ``ScheduleMessageService.parseDelayLevel`` reads a space-separated list such as
"1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h": each item is an integer and a
unit (s, m, h, d); item i is level i + 1. A level above the highest is clamped to the
highest (``HookUtils.transformDelayLevelMessage``); level 0 means "not delayed".

Unlike RocketMQ, which logs and carries on with a half-parsed table, a bad configuration is
a clear error when the engine starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from storage.errors import InvalidArgument

_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_ITEM = re.compile(r"^(\d{1,12})([smhd])\Z")


@dataclass(frozen=True, kw_only=True, slots=True)
class DelayLevels:
    """The delay of each level, ms; ``delays_ms[0]`` is level 1."""

    delays_ms: tuple[int, ...]

    @classmethod
    def parse(cls, spec: str) -> DelayLevels:
        """Parse a ``messageDelayLevel`` string; raises InvalidArgument naming the bad item."""
        items = spec.split()
        if not items:
            raise InvalidArgument("messageDelayLevel is empty: give e.g. \"1s 5s 10s 1m\"")
        delays = []
        for position, item in enumerate(items, start=1):
            match = _ITEM.match(item)
            if match is None:
                raise InvalidArgument(
                    f"messageDelayLevel item {position} ({item!r}) is not <integer><unit> "
                    f"with unit s, m, h or d")
            delays.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
        return cls(delays_ms=tuple(delays))

    @property
    def max_level(self) -> int:
        return len(self.delays_ms)

    @property
    def max_delay_ms(self) -> int:
        return max(self.delays_ms)

    def clamp(self, level: int) -> int:
        """The level actually used: ``level`` itself, or the highest when above it."""
        if level < 1:
            raise InvalidArgument(f"delay level must be >= 1, got {level}")
        return min(level, self.max_level)

    def delay_ms(self, level: int) -> int:
        """Delay of ``level`` (clamped to the highest); InvalidArgument for level < 1."""
        return self.delays_ms[self.clamp(level) - 1]

    def spec(self) -> str:
        """The canonical ``messageDelayLevel`` text of this table (largest exact unit)."""
        out = []
        for delay in self.delays_ms:
            for unit in ("d", "h", "m", "s"):
                if delay % _UNIT_MS[unit] == 0:
                    out.append(f"{delay // _UNIT_MS[unit]}{unit}")
                    break
        return " ".join(out)
