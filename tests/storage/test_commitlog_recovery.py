"""CommitLog durability and recovery: a real kill -9, then torn/garbage/zeroed/flipped bytes.

One subprocess appends 100 records, flushes after the first 60 (so the checkpoint says 60
records are durable) and kills itself with SIGKILL mid-way through its life. Each test
damages a copy of what it left on disk, as a power cut or bit rot would, and reopens it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from storage.commitlog import HEADER_SIZE, CommitLog
from storage.errors import CorruptionError, StorageError

SEGMENT = 1024
REPO = Path(__file__).resolve().parents[2]

CRASH_SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    from storage.commitlog import CommitLog
    log = CommitLog(sys.argv[1], segment_size=1024, flush_policy="async",
                    flush_interval_ms=3_600_000)
    payloads = [(b"record-%03d|" % i) * (1 + i % 9) for i in range(100)]
    positions = log.append_batch(payloads[:60])
    log.flush()
    positions += log.append_batch(payloads[60:])
    print(json.dumps({"positions": positions, "end": log.end_position,
                      "payloads": [p.decode() for p in payloads]}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _run_python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("crashed") / "log"
    proc = _run_python(CRASH_SCRIPT, str(path))
    assert proc.returncode == -9, proc.stderr
    info = json.loads(proc.stdout)
    info["payloads"] = [p.encode() for p in info["payloads"]]
    return path, info


@pytest.fixture
def copy(crashed: tuple[Path, dict], tmp_path: Path) -> tuple[Path, dict]:
    dest = tmp_path / "log"
    shutil.copytree(crashed[0], dest)
    return dest, crashed[1]


def _patch(log_dir: Path, position: int, data: bytes) -> None:
    """Overwrite bytes of the segment holding ``position``, at most to its end (a segment
    file never grows: past it, the next segment, which the crashed writer may have made
    already, begins)."""
    seg = log_dir / f"{position - position % SEGMENT:020d}"
    with open(seg, "r+b") as f:
        f.seek(position % SEGMENT)
        f.write(data[:SEGMENT - position % SEGMENT])


def _reopen(log_dir: Path, *, read_only: bool = False, repair: bool = False,
            full_check: bool = False) -> CommitLog:
    return CommitLog(log_dir, segment_size=SEGMENT, flush_interval_ms=3_600_000,
                     read_only=read_only, repair=repair, full_check=full_check)


def _records(log: CommitLog) -> list[bytes]:
    return [payload for _, payload in log.iter_from(0)]


def _append_still_works(log: CommitLog) -> None:
    before = _records(log)
    (pos,) = log.append_batch([b"after recovery"])
    assert log.read(pos) == b"after recovery"
    assert _records(log) == [*before, b"after recovery"]
    assert log.verify().errors == []


def test_kill_9_loses_nothing_written_to_the_mapping(copy: tuple[Path, dict]) -> None:
    path, info = copy
    with _reopen(path) as log:
        assert log.end_position == info["end"]
        assert _records(log) == info["payloads"]
        assert [p for p, _ in log.iter_from(0)] == info["positions"]
        assert log.verify().records == 100
        _append_still_works(log)
    with _reopen(path) as log:  # and the appended record survives a clean reopen too
        assert _records(log)[-1] == b"after recovery"


def test_torn_last_record_is_truncated(copy: tuple[Path, dict]) -> None:
    path, info = copy
    last = info["positions"][-1]
    size = len(info["payloads"][-1])
    _patch(path, last + HEADER_SIZE + size // 2, bytes(size - size // 2))  # half written
    with _reopen(path) as log:
        assert log.end_position == last
        assert _records(log) == info["payloads"][:-1]
        _append_still_works(log)


def test_torn_header_is_truncated(copy: tuple[Path, dict]) -> None:
    path, info = copy
    last = info["positions"][-1]
    _patch(path, last + 4, b"\xff\xff\x00\x00")  # impossible length
    with _reopen(path) as log:
        assert log.end_position == last
        _append_still_works(log)


def test_garbage_after_the_end_is_zeroed(copy: tuple[Path, dict]) -> None:
    path, info = copy
    _patch(path, info["end"] + 100, os.urandom(500))
    _patch(path, info["end"], b"HLG1")  # even a plausible magic at the end
    with _reopen(path) as log:
        assert log.end_position == info["end"]
        assert _records(log) == info["payloads"]
        _append_still_works(log)
    seg_start = info["end"] - info["end"] % SEGMENT
    raw = (path / f"{seg_start:020d}").read_bytes()
    tail = raw[info["end"] % SEGMENT + HEADER_SIZE + len(b"after recovery"):]
    assert tail == bytes(len(tail))


def test_zeroed_tail_drops_only_the_unflushed_records(copy: tuple[Path, dict]) -> None:
    path, info = copy
    cut = info["positions"][90]
    _patch(path, cut, bytes(info["end"] - cut) if cut // SEGMENT == info["end"] // SEGMENT
           else bytes(SEGMENT - cut % SEGMENT))
    with _reopen(path) as log:
        assert log.end_position == cut
        assert _records(log) == info["payloads"][:90]
        _append_still_works(log)


def test_flipped_bit_in_the_unflushed_tail_is_caught_by_the_crc(copy: tuple[Path, dict]) -> None:
    path, info = copy
    victim = info["positions"][95]
    with _reopen(path, read_only=True) as ro:
        original = ro.read(victim)
    _patch(path, victim + HEADER_SIZE + 3, bytes([original[3] ^ 0x10]))
    with _reopen(path, read_only=True) as ro:  # changes nothing on disk
        report = ro.verify()
        assert report.errors == [f"position {victim}: CRC32C mismatch"]
        assert report.records == 99  # the walk goes on after a bad CRC
    with _reopen(path) as log:
        assert log.end_position == victim
        assert _records(log) == info["payloads"][:95]
        _append_still_works(log)


def test_bit_rot_in_a_live_log_is_reported_not_returned(tmp_path: Path) -> None:
    with CommitLog(tmp_path / "log", segment_size=SEGMENT, flush_policy="sync") as log:
        positions = log.append_batch([b"%03d" % i * 20 for i in range(40)])
        log.append_batch([b"later"])  # (the last append's records read as appended: commitlog)
        victim = positions[17]
        _patch(tmp_path / "log", victim + HEADER_SIZE + 5, b"#")  # shared mapping sees it
        with pytest.raises(CorruptionError, match="CRC32C"):
            log.read(victim)
        assert log.read(positions[18]) == b"018" * 20
        report = log.verify()
        assert report.errors == [f"position {victim}: CRC32C mismatch"]
        assert report.records == 40
        with pytest.raises(CorruptionError):
            list(log.iter_from(positions[10]))
        _patch(tmp_path / "log", victim + 4, b"\xff\xff\xff\x00")  # impossible length
        report = log.verify()
        assert report.errors == [f"position {victim}: impossible length {0xffffff}"]


def test_corruption_below_the_flushed_position_is_refused(copy: tuple[Path, dict]) -> None:
    path, info = copy
    victim = info["positions"][10]  # the first 60 records were flushed before the crash
    _patch(path, victim + HEADER_SIZE, b"\x00")
    with pytest.raises(CorruptionError, match="flushed"):
        _reopen(path, full_check=True)
    with _reopen(path, read_only=True) as ro:  # nothing was changed by the refused open
        assert ro.verify().errors == [f"position {victim}: CRC32C mismatch"]
    with _reopen(path, full_check=True, repair=True) as log:
        assert _records(log) == info["payloads"][:10]
        _append_still_works(log)


def test_default_open_trusts_the_flushed_prefix_and_reads_catch_rot(
    copy: tuple[Path, dict],
) -> None:
    path, info = copy
    victim = info["positions"][10]
    _patch(path, victim + HEADER_SIZE, b"\x00")
    with _reopen(path) as log:  # walks only the unflushed tail: open time does not grow
        assert log.end_position == info["end"]  # with the size of the log
        with pytest.raises(CorruptionError, match="CRC32C"):
            log.read(victim)
        with pytest.raises(CorruptionError, match="CRC32C"):
            log.read_many(info["positions"][8:12])
        assert log.read(info["positions"][11]) == info["payloads"][11]
        assert log.verify().errors == [f"position {victim}: CRC32C mismatch"]


def test_missing_segments_before_the_checkpoint_are_refused(copy: tuple[Path, dict]) -> None:
    path, _ = copy
    segments = sorted(p for p in path.iterdir() if p.name.isdigit())
    for seg in segments[2:]:
        seg.unlink()
    with pytest.raises(CorruptionError, match="missing"):
        _reopen(path)


def test_missing_middle_segment_is_refused(copy: tuple[Path, dict]) -> None:
    path, _ = copy
    segments = sorted(p for p in path.iterdir() if p.name.isdigit())
    assert len(segments) >= 3
    segments[1].unlink()
    with pytest.raises(CorruptionError, match="does not start"):
        _reopen(path)
    with _reopen(path, read_only=True) as ro:
        assert any("does not start" in e for e in ro.verify().errors)


def test_empty_segment_left_by_a_crash_during_roll_over(copy: tuple[Path, dict]) -> None:
    path, info = copy
    last = info["end"] - info["end"] % SEGMENT  # (the segment the records end in)
    for spare in (p for p in path.iterdir() if p.name.isdigit() and int(p.name) > last):
        spare.unlink()  # a spare the writer had made (or begun) before it was killed
    stray = path / f"{last + SEGMENT:020d}"
    stray.write_bytes(bytes(SEGMENT))
    with _reopen(path) as log:
        assert log.end_position == info["end"]
        _append_still_works(log)
    assert not stray.exists()


def test_full_disk_at_segment_creation_raises_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "log"
    with CommitLog(path, segment_size=SEGMENT, flush_policy="sync") as log:
        # 448 of 1024 bytes: under half, so the flusher makes no spare segment ahead (an
        # append past half asks for one at once, and it would race the patch below)
        positions = log.append_batch([b"x" * 100] * 4)
        end = log.end_position

        def no_space(fd: int, offset: int, length: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr("storage.segment.os.posix_fallocate", no_space)
        batch = [b"y" * 500, b"z" * 100]  # the second record needs a new segment
        with pytest.raises(StorageError, match="No space left"):
            log.append_batch(batch)
        assert log.end_position == end
        assert sorted(p.name for p in path.iterdir() if p.name.isdigit()) == [f"{0:020d}"]
        assert [p for p, _ in log.iter_from(0)] == positions
        assert log.verify().errors == []
        monkeypatch.undo()
        more = log.append_batch(batch)
        assert [log.read(p) for p in more] == batch
        assert more[1] == SEGMENT
    with CommitLog(path, segment_size=SEGMENT) as log:
        assert len(list(log.iter_from(0))) == 6


def test_async_flusher_advances_the_checkpoint(tmp_path: Path) -> None:
    with CommitLog(tmp_path / "log", segment_size=SEGMENT, flush_interval_ms=5) as log:
        log.append_batch([b"a"] * 10)
        end = log.end_position
        assert log.wait_flushed(end, timeout_s=30)
        assert log.flushed_position == end
    with CommitLog(tmp_path / "log", segment_size=SEGMENT, flush_policy="sync") as log:
        assert log.flushed_position == end


def test_bad_configuration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="flush_policy"):
        CommitLog(tmp_path / "a", flush_policy="sometimes")
    with pytest.raises(ValueError, match="segment_size"):
        CommitLog(tmp_path / "b", segment_size=10)
    with pytest.raises(StorageError):
        CommitLog(tmp_path / "missing", read_only=True)


def test_an_empty_spare_segment_left_by_a_kill_is_no_segment(copy: tuple[Path, dict]) -> None:
    """A kill -9 between a spare segment's creation and its allocation leaves an empty file
    after the last segment: a read-only open ignores it, a writer removes it."""
    path, info = copy
    last = info["end"] - info["end"] % SEGMENT  # (the segment the records end in)
    for spare in (p for p in path.iterdir() if p.name.isdigit() and int(p.name) > last):
        spare.unlink()  # a spare the writer had made (or begun) before it was killed
    stray = path / f"{last + SEGMENT:020d}"
    stray.write_bytes(b"")
    with _reopen(path, read_only=True) as ro:
        assert ro.end_position == info["end"]
        assert ro.verify().errors == []
    assert stray.exists()  # a reader changes nothing
    with _reopen(path) as log:
        assert log.end_position == info["end"]
        _append_still_works(log)
    assert not stray.exists()
