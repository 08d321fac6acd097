"""CommitLog on real files under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.commitlog import HEADER_SIZE, CommitLog
from storage.errors import InvalidArgument, StorageError


def test_append_read_and_reopen(tmp_path: Path) -> None:
    payloads = [bytes([i % 251]) * (i * 7 % 300) for i in range(200)]
    with CommitLog(tmp_path / "log", segment_size=4096) as log:
        positions = log.append_batch(payloads[:120])
        positions += log.append_batch(payloads[120:])
        assert [log.read(p) for p in positions] == payloads
        assert [p for p, _ in log.iter_from(0)] == positions
        end = log.end_position
    with CommitLog(tmp_path / "log", segment_size=4096) as log:
        assert log.end_position == end
        assert [payload for _, payload in log.iter_from(positions[50])] == payloads[50:]
        assert log.verify().errors == []
        assert log.verify().records == 200


def test_records_never_span_segments(tmp_path: Path) -> None:
    with CommitLog(tmp_path / "log", segment_size=1000) as log:
        positions = log.append_batch([b"x" * 100] * 25)
        for p in positions:
            assert p // 1000 == (p + HEADER_SIZE + 100 - 1) // 1000
        assert positions[8] == 1000  # 8 records of 112 bytes fill 896; the 9th rolls
        with pytest.raises(InvalidArgument):
            log.append_batch([b"y" * (1000 - HEADER_SIZE + 1)])
        log.append_batch([b"z" * (1000 - HEADER_SIZE)])  # exactly one segment
        assert log.end_position % 1000 == 0
        assert log.read(log.append_batch([b"after"])[0]) == b"after"


def test_closed_log_refuses(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "log", segment_size=4096, flush_policy="sync")
    log.append_batch([b"a"])
    log.close()
    with pytest.raises(StorageError):
        log.append_batch([b"b"])
    with pytest.raises(StorageError):
        log.read(0)
