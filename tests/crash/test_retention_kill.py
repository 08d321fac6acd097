"""kill -9 of the real server while the log's retention deletes segments: the crash
harness's retention round (bench/crash/retention.py), bounded to 8 kills. After each kill the
stopped data directory verifies (no consume-queue entry points into a missing segment);
after each restart every topic reads without a gap from its first offset, which never moves
back, and every offset still holds the message it held before the kill."""

from __future__ import annotations

from pathlib import Path

from bench.crash.retention import TOPICS, run_retention_kills


def test_kills_during_deletions_leave_a_store_that_verifies(tmp_path: Path) -> None:
    report = run_retention_kills(tmp_path, kills=8, seed=31)
    print(report.summary())
    assert report.ok, report.summary()
    assert report.kills == 8
    assert report.deleted_segments > 8  # deletions ran between and across the kills
    assert sum(1 for first in report.first_offsets.values() if first > 0) == len(TOPICS)
