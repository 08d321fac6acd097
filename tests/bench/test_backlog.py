"""hourglass bench backlog: a real ingest in process, reported slice by slice, with RocksDB's
background threads counted apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import backlog


def test_every_message_is_stored_and_each_slice_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "backlog.json", tmp_path / "backlog.png"
    assert backlog.main(["--messages", "25000", "--slice", "10000", "--settle", "5",
                         "--json", str(out), "--plot", str(png)]) == 0
    doc = json.loads(out.read_text())
    assert [r["pending"] for r in doc["slices"]] == [10_000, 20_000, 25_000]
    assert [r["sent"] for r in doc["slices"]] == [10_000, 10_000, 5_000]
    assert doc["pending_after"] == 25_001  # and the topic's first send
    for row in doc["slices"]:
        assert row["msgs_per_s"] > 0 and row["python_us"] > 0 and row["rocksdb_us"] >= 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("pending     10,000:") and "RocksDB background" in lines[0]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_busy_threads_are_told_apart() -> None:
    before = backlog.thread_cpu()
    end = sum(range(3_000_000))  # CPU on this (python) thread
    after = backlog.thread_cpu()
    assert end > 0 and after["python"] >= before["python"] + 0.02
    # RocksDB's threads (alive in this process after any earlier test's store) did not
    # get this thread's work
    assert after["rocksdb"] - before["rocksdb"] < after["python"] - before["python"]


@pytest.mark.parametrize("bad", [["--slice", "1500"], ["--slice", "0"], ["--messages", "0"],
                                 ["--settle", "-1"]])
def test_bad_options_are_refused(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        backlog.main(bad)
    assert exc.value.code == 2
    assert "hourglass bench backlog" in capsys.readouterr().err
