"""``hourglass bench breakdown``: every stage runs against a real engine and a real RocksDB,
and the WAL arm without a WAL really writes none (so their difference is the WAL's cost)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main as hourglass
from bench.breakdown import wal_cost


def test_the_wal_arms_differ_by_the_wal_alone(tmp_path: Path) -> None:
    wal = wal_cost(tmp_path / "db", rounds=4)
    written = wal["wal_bytes_per_message"]
    # a timer entry (key ~30 B, value ~110 B) and an index entry (~25 B) a message
    assert written["with WAL"] >= 150
    assert written["without WAL"] == 0
    assert wal["fast_crc32"] in ("Supported on x86", "Not supported on x86",
                                 "Supported on Arm64", "Not supported on Arm64")
    us = wal["us_per_message"]
    assert us["the WAL"] == round(us["with WAL"] - us["without WAL"], 3)


def test_the_breakdown_runs_from_the_command_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "breakdown.json"
    assert hourglass(["bench", "breakdown", "--rounds", "2", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(figures) == {"rounds", "us_per_message", "us_per_request", "wal"}
    assert figures["us_per_message"]["ingest"]["total (JSON)"] > 0
    assert "Fast CRC32 supported" in capsys.readouterr().out
