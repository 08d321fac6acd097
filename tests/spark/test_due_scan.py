"""The due scan measured on a checkpoint with RocksDB's counters: point tombstones inside the
window, cancels ahead of it, range tombstones below the watermark (no Spark needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rocksdict

from spark_jobs.due_scan import measure_due_scans
from spark_jobs.physical_figures import read_amplification
from spark_jobs.rules import Thresholds, due_scan_range_tombstones, due_scan_tombstones
from spark_jobs.sources import sst_rows

NOW = 1_700_000_000_000
WATERMARK = NOW - 10_000
LIVE = 30_000


def _key(at: int, i: int) -> bytes:
    return at.to_bytes(8, "big") + b"orders\x00" + f"m{i:08d}".encode()


def _checkpoint(path: Path, deleted_at: list[int], ranges: int) -> Path:
    """A timer shard: LIVE keys due inside [watermark, now + 1 s), one flushed file; then
    point deletes of keys at ``deleted_at`` (put in one file, deleted in the next) and
    ``ranges`` range deletes below the watermark, each batch flushed to its own L0 file."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    db = rocksdict.Rdict(str(path), opts, column_families={"timer.0": rocksdict.Options(
        raw_mode=True)})
    cf = db.get_column_family("timer.0")
    for i in range(LIVE):
        cf[_key(NOW - 5_000 + i % 5_500, i)] = b"v" * 100
    for i, at in enumerate(deleted_at):
        cf[_key(at, LIVE + i)] = b"v" * 100
    below = [_key(WATERMARK - 60_000 + i, 900_000 + i) for i in range(2 * ranges)]
    for key in below:
        cf[key] = b"v"
    db.flush()
    for i, at in enumerate(deleted_at):
        del cf[_key(at, LIVE + i)]
    db.flush()
    for n in range(ranges):
        cf.delete_range(below[2 * n], below[2 * n + 1])
    db.flush()
    del cf
    db.close()
    return path


def _report(path: Path) -> dict[str, Any]:
    scans = measure_due_scans(path, {0: WATERMARK}, NOW, 1000)
    ssts = sst_rows(str(path)).to_pylist()
    return {"physical": {"readAmplification": read_amplification(ssts, {0: WATERMARK}, NOW, 1000,
                                                                 scans)}, "ssts": ssts}


def test_tombstones_inside_the_window_are_counted_and_fire(tmp_path: Path) -> None:
    deleted = [NOW + 200 + i % 700 for i in range(12_000)]  # cancelled just before due
    report = _report(_checkpoint(tmp_path / "db", deleted, ranges=0))
    shard = report["physical"]["readAmplification"]["byShard"]["0"]
    assert shard["liveKeys"] == LIVE  # every live key of the window, nothing else
    # each cancelled key costs its tombstone, and maybe the put it hides (another file)
    skipped = shard["internalKeysSkipped"]
    assert len(deleted) <= skipped <= 2 * len(deleted)
    assert shard["fromStart"]["internalKeysSkipped"] == skipped  # nothing deleted before
    assert shard["scanMicros"] > 0
    finding = due_scan_tombstones(report, {}, Thresholds())
    assert finding.fired and finding.value == skipped


def test_cancels_ahead_of_the_window_do_not_fire(tmp_path: Path) -> None:
    deleted = [NOW + 2_000 + i for i in range(12_000)]  # all due after now + 1 s
    report = _report(_checkpoint(tmp_path / "db", deleted, ranges=0))
    ra = report["physical"]["readAmplification"]
    shard = ra["byShard"]["0"]
    # the old estimate: every deletion of any SST overlapping the window
    overlapping = sum(f["num_deletions"] for f in report["ssts"]
                      if f["start_time"] < NOW + 1000 and f["end_time"] >= WATERMARK)
    assert overlapping == len(deleted) > Thresholds().due_scan_skipped_keys
    assert shard["internalKeysSkipped"] == 0 and shard["liveKeys"] == LIVE
    assert not due_scan_tombstones(report, {}, Thresholds()).fired


def test_range_tombstones_are_reported_apart(tmp_path: Path) -> None:
    report = _report(_checkpoint(tmp_path / "db", [], ranges=1_500))
    shard = report["physical"]["readAmplification"]["byShard"]["0"]
    assert shard["internalKeysSkipped"] == 0  # range deletes hide keys without a point skip
    assert shard["rangeTombstones"] == 1_500  # all in the one L0 file the window overlaps
    # each covers one of two keys below the watermark: from key 0 the other is still seen
    assert shard["fromStart"]["liveKeys"] == LIVE + 1_500
    finding = due_scan_range_tombstones(report, {}, Thresholds())
    assert finding.fired and finding.value == 1_500 and "delete_range rarely" in finding.advice
