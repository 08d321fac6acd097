"""Delay levels (RocketMQ messageDelayLevel) and the resolution of a send's timing."""

from __future__ import annotations

import pytest

from scheduler.levels import DelayLevels
from scheduler.timing import resolve_timing
from storage.constants import DEFAULT_DELAY_LEVELS
from storage.errors import DelayTooLong, InvalidArgument

NOW = 1_700_000_000_000
LEVELS = DelayLevels.parse(DEFAULT_DELAY_LEVELS)
MAX = 10 * 366 * 86_400_000


def resolve(**kw: object) -> tuple[int, int | None]:
    t = resolve_timing(now_ms=NOW, levels=LEVELS, max_delay_ms=MAX, **kw)  # type: ignore[arg-type]
    return t.deliver_at - NOW, t.level


def test_default_levels_are_rocketmqs_eighteen() -> None:
    s, m, h = 1000, 60_000, 3_600_000
    assert LEVELS.delays_ms == (1 * s, 5 * s, 10 * s, 30 * s, 1 * m, 2 * m, 3 * m, 4 * m, 5 * m,
                                6 * m, 7 * m, 8 * m, 9 * m, 10 * m, 20 * m, 30 * m, 1 * h, 2 * h)
    assert LEVELS.max_level == 18


def test_units_and_whitespace() -> None:
    levels = DelayLevels.parse("  2s\t3m 4h  1d ")
    assert levels.delays_ms == (2_000, 180_000, 14_400_000, 86_400_000)


@pytest.mark.parametrize("spec", ["", "   ", "1x", "1", "s", "1.5s", "-1s", "1s 2", "1S"])
def test_bad_configuration_is_a_clear_error(spec: str) -> None:
    with pytest.raises(InvalidArgument, match="messageDelayLevel"):
        DelayLevels.parse(spec)


def test_levels_clamp_to_the_highest_and_reject_below_one() -> None:
    assert LEVELS.delay_ms(1) == 1000
    assert LEVELS.delay_ms(18) == 7_200_000
    assert LEVELS.delay_ms(19) == 7_200_000
    assert LEVELS.delay_ms(10_000) == 7_200_000
    assert LEVELS.clamp(99) == 18
    for bad in (0, -1):
        with pytest.raises(InvalidArgument):
            LEVELS.delay_ms(bad)


def test_explicit_fields() -> None:
    assert resolve() == (0, None)
    assert resolve(delay_ms=1500) == (1500, None)
    assert resolve(deliver_at=NOW + 42) == (42, None)
    assert resolve(delay_level=3) == (10_000, 3)
    assert resolve(delay_level=30) == (7_200_000, 18)


def test_at_most_one_timing_field() -> None:
    with pytest.raises(InvalidArgument, match="at most one"):
        resolve(delay_ms=1, deliver_at=NOW + 5)
    with pytest.raises(InvalidArgument, match="at most one"):
        resolve(delay_level=1, delay_ms=5)


def test_past_deliver_at_is_kept_and_due_now() -> None:
    assert resolve(deliver_at=NOW - 10_000) == (-10_000, None)
    assert resolve(deliver_at=0) == (-NOW, None)


@pytest.mark.parametrize("kw", [{"delay_ms": -1}, {"deliver_at": -5}, {"delay_level": 0},
                                {"delay_level": -3}, {"delay_ms": "5"}, {"deliver_at": 1.5},
                                {"delay_level": True}])
def test_bad_explicit_values(kw: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        resolve(**kw)


def test_maximum_delay() -> None:
    assert resolve(delay_ms=MAX) == (MAX, None)
    with pytest.raises(DelayTooLong):
        resolve(delay_ms=MAX + 1)
    with pytest.raises(DelayTooLong):
        resolve(deliver_at=NOW + MAX + 1)
    with pytest.raises(DelayTooLong):
        resolve(properties={"TIMER_DELAY_SEC": str(MAX // 1000 + 1)})
    with pytest.raises(DelayTooLong):
        resolve(deliver_at=1 << 70)


def test_rocketmq_property_precedence() -> None:
    every = {"DELAY": "2", "TIMER_DELAY_SEC": "7", "TIMER_DELAY_MS": "300",
             "TIMER_DELIVER_MS": str(NOW + 9)}
    assert resolve(properties=every) == (5_000, 2)  # a level wins over the timer properties
    without_level = {k: v for k, v in every.items() if k != "DELAY"}
    assert resolve(properties=without_level) == (7_000, None)  # TIMER_DELAY_SEC next
    del without_level["TIMER_DELAY_SEC"]
    assert resolve(properties=without_level) == (300, None)  # then TIMER_DELAY_MS
    del without_level["TIMER_DELAY_MS"]
    assert resolve(properties=without_level) == (9, None)  # then TIMER_DELIVER_MS
    assert resolve(properties={"unrelated": "x"}) == (0, None)


def test_delay_property_zero_or_negative_means_no_level_as_in_rocketmq() -> None:
    assert resolve(properties={"DELAY": "0", "TIMER_DELAY_MS": "250"}) == (250, None)
    assert resolve(properties={"DELAY": "-4"}) == (0, None)
    assert resolve(properties={"DELAY": " 40 "}) == (7_200_000, 18)  # clamped like 4.x


def test_explicit_fields_win_over_properties() -> None:
    assert resolve(delay_ms=10, properties={"DELAY": "3"}) == (10, None)


@pytest.mark.parametrize("name", ["DELAY", "TIMER_DELAY_SEC", "TIMER_DELAY_MS",
                                  "TIMER_DELIVER_MS"])
def test_malformed_properties_are_invalid(name: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        resolve(properties={name: "soon"})
