"""bench/send_cost.py: every batch takes the columns path, is stored, and each stage of the
send path is timed (a stage the send path stops calling would read 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import send_cost
from storage.rocks import RocksStore


@pytest.mark.parametrize("at_once", [False, True])
def test_every_batch_is_stored_and_every_stage_timed(tmp_path: Path, at_once: bool) -> None:
    write = RocksStore.write
    figures = send_cost.run(tmp_path / "data", 3, at_once, seed=1)
    assert RocksStore.write is write  # (the stages' timers are taken off again)
    assert set(figures) == {"send_columns", *(label for _, _, label in send_cost.STAGES)}
    assert all(us > 0 for us in figures.values()), figures
    assert figures["send_columns"] > figures["RocksDB write (RocksStore.write)"]


def test_main_prints_the_stages(capsys: pytest.CaptureFixture[str]) -> None:
    assert send_cost.main(["--batches", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CPU µs a message, 2 batches of 1000 due at random over an hour:")
    assert "msgId look-up (RocksStore.multi_get)" in out
