"""EngineConfig.check: every tunable checked before the engine opens anything."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from scheduler.broker import Broker
from scheduler.config import RECORD_SLACK, EngineConfig
from storage.errors import InvalidArgument
from storage.log_format import HEADER_SIZE

GOOD = EngineConfig(data_dir=Path("unused"))


def test_the_defaults_pass_and_give_rocketmqs_levels() -> None:
    levels = GOOD.check()
    assert levels.max_delay_ms == 2 * 3_600_000  # the 18th level: 2h


@pytest.mark.parametrize(("change", "message"), [
    ({"timer_shards": 0}, "timer_shards must be a positive integer"),
    ({"scan_batch_size": 1.5}, "scan_batch_size must be a positive integer"),
    ({"max_reconsume_times": -1}, "max_reconsume_times must be an integer >= 0"),
    ({"retention_ms": -1}, "retention_ms must be >= 0"),
    ({"message_delay_level": "1s 3h", "max_delay_ms": 3_600_000}, "beyond max_delay_ms"),
    ({"segment_size": 1 << 20, "max_body_bytes": 1 << 20}, "cannot hold a message"),
])
def test_a_bad_tunable_is_named(change: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        replace(GOOD, **change).check()  # type: ignore[arg-type]


def test_the_largest_record_is_what_a_segment_holds_besides_framing() -> None:
    config = replace(GOOD, segment_size=1 << 20, max_body_bytes=1000)
    assert config.max_record_bytes == (1 << 20) - HEADER_SIZE - RECORD_SLACK
    replace(config, max_body_bytes=config.max_record_bytes).check()  # exactly fits


def test_the_broker_refuses_a_bad_config_before_touching_the_disk(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="timer_shards"):
        Broker(replace(GOOD, data_dir=tmp_path / "data", timer_shards=0))
    assert not (tmp_path / "data").exists()
