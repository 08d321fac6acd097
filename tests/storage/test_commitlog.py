"""CommitLog on real files under tmp_path."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from storage import commitlog, segment
from storage.commitlog import HEADER_SIZE, CommitLog
from storage.errors import InvalidArgument, StorageError
from storage.segment import Segment


def test_append_read_and_reopen(tmp_path: Path) -> None:
    payloads = [bytes([i % 251]) * (i * 7 % 300) for i in range(200)]
    with CommitLog(tmp_path / "log", segment_size=4096) as log:
        positions = log.append_batch(payloads[:120])
        positions += log.append_batch(payloads[120:])
        assert [log.read(p) for p in positions] == payloads
        assert log.read_many(positions) == payloads  # across segments, in one loop
        assert log.read_many(positions[::-7]) == payloads[::-7]
        for bad in (positions[3] + 1, log.end_position, log.end_position + 10**6):
            with pytest.raises(InvalidArgument):
                log.read_many([positions[0], bad])
        assert [p for p, _ in log.iter_from(0)] == positions
        end = log.end_position
    with CommitLog(tmp_path / "log", segment_size=4096) as log:
        assert log.end_position == end
        assert [payload for _, payload in log.iter_from(positions[50])] == payloads[50:]
        assert log.verify().errors == []
        assert log.verify().records == 200


def test_large_records_go_in_gathered_and_read_the_same(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of large records are written with one gathered write of headers and payloads
    (``Segment.write_gather``, more pieces than one ``pwritev`` takes), not framed into one
    buffer: the segment files hold the very bytes the framed write gives, across
    segment rolls, and read back, recover and verify alike."""
    payloads = [bytes([i % 251]) * (4000 + i * 37 % 9000) for i in range(700)]
    payloads[100:110] = [b"s" * 10] * 10  # small ones inside a run of large ones
    calls: list[int] = []
    gather = segment.Segment.write_gather

    def spy(self: segment.Segment, offset: int, pieces: list[bytes], total: int) -> None:
        calls.append(len(pieces))
        gather(self, offset, pieces, total)

    monkeypatch.setattr(segment.Segment, "write_gather", spy)
    monkeypatch.setattr(segment, "_IOV_MAX", 64)  # (a run takes several pwritev calls)

    def fill(path: Path) -> list[int]:
        with CommitLog(path, segment_size=1 << 20) as log:
            positions = log.append_batch(payloads[:450]) + log.append_batch(payloads[450:])
            assert log.read_many(positions) == payloads
        return positions

    gathered = fill(tmp_path / "gathered")
    assert calls and max(calls) > 64  # the gathered path wrote them
    monkeypatch.setattr(commitlog, "GATHER_MIN_RECORD", 1 << 40)  # never gathered
    calls.clear()
    framed = fill(tmp_path / "framed")
    assert not calls
    assert gathered == framed
    files = _segments(tmp_path / "gathered")
    assert len(files) > 3 and files == _segments(tmp_path / "framed")
    for base in files:
        name = f"{base:020d}"
        assert (tmp_path / "gathered" / name).read_bytes() == (
            tmp_path / "framed" / name).read_bytes()
    with CommitLog(tmp_path / "gathered", segment_size=1 << 20, full_check=True) as log:
        assert log.verify().errors == []
        assert [p for _, p in log.iter_from(0)] == payloads


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


def _segments(path: Path) -> list[int]:
    return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())


def test_next_segment_is_made_ahead_and_used_at_the_roll(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = CommitLog(path, segment_size=1024, flush_interval_ms=3_600_000)
    assert _segments(path) == [0]  # made at open, not on the first append
    log.append_batch([b"x" * 100] * 3)
    log._prepare_spare()  # what the flusher does each tick: nothing below half full
    assert _segments(path) == [0]
    log.append_batch([b"x" * 100] * 2)
    log._prepare_spare()
    assert _segments(path) == [0, 1024]
    positions = log.append_batch([b"y" * 100] * 5)
    assert positions[-2:] == [896, 1024]  # 896 + 112 = 1008: the 10th record rolls
    assert [log.read(p) for p in positions] == [b"y" * 100] * 5
    log._prepare_spare()  # a spare for 2048 is not needed yet ...
    assert _segments(path) == [0, 1024]
    log.append_batch([b"z" * 100] * 4)
    log._prepare_spare()  # ... now it is, and close() removes it again
    assert _segments(path) == [0, 1024, 2048]
    log.close()
    assert _segments(path) == [0, 1024]
    with CommitLog(path, segment_size=1024) as log:
        assert len(list(log.iter_from(0))) == 14


def test_one_writer_per_log_but_readers_may_look(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with CommitLog(path, segment_size=4096) as log:
        log.append_batch([b"a", b"b"])
        log.flush()
        with pytest.raises(StorageError, match="another writer"):
            CommitLog(path, segment_size=4096)
        with CommitLog(path, read_only=True) as reader:
            assert [p for _, p in reader.iter_from(0)] == [b"a", b"b"]
            with pytest.raises(StorageError):
                reader.append_batch([b"c"])
    with CommitLog(path, segment_size=4096) as log:  # the lock went with close()
        assert log.end_position > 0


def _resident_kib(path: Path) -> int:
    """This process's resident KiB of the mapping of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(" ", 1)[0]
        if "-" in first and ":" not in first:
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_the_flusher_gives_back_the_pages_of_segments_behind_the_last_two(
        tmp_path: Path) -> None:
    """A burst writes segment after segment faster than the idle rounds (a minute apart)
    run: the flusher gives back every segment's pages but the last two's, and what it gave
    back reads as before (from the page cache)."""
    size = 1 << 20
    log = CommitLog(tmp_path / "log", segment_size=size, flush_interval_ms=3_600_000)
    try:
        payloads = [bytes([i % 251]) * 5000 for i in range(1000)]  # ~5 MB: 5+ segments
        positions = log.append_batch(payloads)
        log.append_batch([b"z"])  # (reads of ``positions`` then come from the segments)
        segments = list(log._segments)
        assert len(segments) >= 5
        # the segments the append made itself are not populated (storage/segment.py): their
        # pages come into the mapping as they are read (here: at most the page of an
        # end-of-segment header, written through the mapping)
        assert all(_resident_kib(seg.path) <= 4 for seg in segments[1:])
        assert [p for _, p in log.iter_from(0)] == [*payloads, b"z"]
        assert all(_resident_kib(seg.path) > 0 for seg in segments)
        assert log._release_behind() == len(segments) - 2
        assert [_resident_kib(seg.path) for seg in segments[:-2]] == [0] * (len(segments) - 2)
        assert all(_resident_kib(seg.path) > 0 for seg in segments[-2:])
        assert log._release_behind() == 0  # nothing more to give back
        assert log.read_many(positions) == payloads  # released pages read back intact
        assert _resident_kib(segments[0].path) > 0
        # read again, they are given back again by the next round
        assert log._release_behind() == len(segments) - 2
        assert [_resident_kib(seg.path) for seg in segments[:-2]] == [0] * (len(segments) - 2)
        log.flush()
    finally:
        log.close()
    reopened = CommitLog(tmp_path / "log", segment_size=size)
    try:
        assert reopened.read_many(positions) == payloads
    finally:
        reopened.close()


def test_spares_are_populated_for_writes_through_the_mapping_only(tmp_path: Path) -> None:
    """The flusher's spare segment has its pages mapped in ahead after a small append (the
    next ones go through the mapping), not after a burst's (``pwrite``: nothing to map, and
    32 MiB more RSS a segment)."""
    size = 1 << 20
    for payload, resident in ((b"s" * 100, True), (b"b" * 20_000, False)):
        with CommitLog(tmp_path / payload[:1].decode(), segment_size=size,
                       flush_interval_ms=3_600_000) as log:
            while log.end_position < size // 2:  # to half full: appends of one kind
                log.append_batch([payload] * max(1, 10_000 // len(payload)))
            log.append_batch([payload])  # the last append: through the mapping or not
            log._prepare_spare()  # (the flusher, asked at half full, may have made it)
            assert log._spare is not None
            assert (_resident_kib(log._spare.path) >= size // 1024 // 2) is resident


def test_a_read_of_the_last_append_answers_its_payloads(tmp_path: Path) -> None:
    """Records of the last append read back as the very payloads appended (no copy out of
    the mapping, no second CRC32C: a caught-up stream's frame); any other read, and any
    read after a revoke, comes from the segments."""
    with CommitLog(tmp_path / "log", segment_size=1 << 20, flush_interval_ms=3_600_000) as log:
        older = [b"old-%d" % i * 100 for i in range(10)]
        old_positions = log.append_batch(older)
        payloads = [b"new-%d" % i * 1000 for i in range(10)]
        positions = log.append_batch(payloads)
        hit = log.read_many(positions[2:7])
        assert hit == payloads[2:7] and all(a is b for a, b in zip(hit, payloads[2:7], strict=True))
        assert log.read(positions[9]) is payloads[9]
        # what the cache does not hold exactly is read from the segments, equal, not the same
        for read in (old_positions, old_positions[-1:] + positions[:1], positions[::2]):
            got = log.read_many(read)
            assert got == [older[old_positions.index(p)] if p in old_positions
                           else payloads[positions.index(p)] for p in read]
            assert not any(g is p for g in got for p in payloads)
        bounded = log.read_many(positions, max_bytes=len(payloads[0]) * 3)
        assert bounded == payloads[:3]
        log.revoke(positions[0])
        others = [b"oth-%d" % i * 1000 for i in range(10)]
        assert log.append_batch(others) == positions and log.read_many(positions) == others
        log.revoke(positions[0])
        assert log.end_position == positions[0]
        with pytest.raises(InvalidArgument):
            log.read_many(positions[:1])


def test_the_flush_loop_releases_segments_behind(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "log", segment_size=1 << 20, flush_interval_ms=1)
    try:
        log.append_batch([b"x" * 5000] * 1000)
        segments = list(log._segments)
        for _ in range(6000):  # the flusher's next tick does it (a minute at most, not timed)
            if all(seg.released for seg in segments[:-2]):
                break
            log._stop.wait(0.01)
        assert [seg.released for seg in segments] == [True] * (len(segments) - 2) + [False] * 2
    finally:
        log.close()


def test_an_append_past_half_a_segment_has_the_flusher_make_the_next_one_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst fills a segment faster than the flusher ticks: the append that fills the
    last segment past half asks the flusher for the next one at once (not at its next tick,
    an hour away here), so the roll-over uses it and the appending thread makes none."""
    makers: list[str] = []
    create = Segment.create

    def recording(*args: Any, **kwargs: Any) -> Segment:
        makers.append(threading.current_thread().name)
        return create(*args, **kwargs)

    monkeypatch.setattr(Segment, "create", recording)
    path = tmp_path / "log"
    with CommitLog(path, segment_size=1 << 16, flush_interval_ms=3_600_000) as log:
        assert makers == [threading.current_thread().name]  # segment 0, at open
        log.append_batch([b"x" * 8000] * 3)  # 24 KiB of 64: no spare yet
        log.append_batch([b"x" * 8000] * 2)  # 40 KiB: past half
        deadline = time.monotonic() + 30
        while _segments(path) != [0, 1 << 16]:
            assert time.monotonic() < deadline, "the flusher made no spare"
            time.sleep(0.005)
        positions = log.append_batch([b"y" * 8000] * 4)  # rolls over into the spare
        assert positions[-1] >= 1 << 16
        assert makers[1:] == [f"commitlog-flush:{path.name}"]
        assert log.read_many(positions) == [b"y" * 8000] * 4
