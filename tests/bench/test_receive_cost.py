"""bench/receive_cost.py: every group drains the whole topic, a batch of 1000 at a time, and
each step of each batch is timed."""

from __future__ import annotations

import pytest

from bench import receive_cost


def test_each_group_drains_the_topic_and_every_step_is_timed(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert receive_cost.main(["--messages", "2500", "--groups", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("6 batches of up to 1000")  # 1000, 1000, 500 per group
    for step in ("receive", "answer", "ack"):
        assert f"{step} " in out
