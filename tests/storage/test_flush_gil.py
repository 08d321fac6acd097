"""CommitLog flushes release the GIL: an msync of tens of MiB must not stall other threads.

The stall is measured, not assumed: a second thread records when each iteration of a loop
ran; during each msync its longest pause must be a small part of the msync, where
``mmap.flush`` (msync under the GIL) froze it from the msync's start to its end (~90 % of it,
measured: with the old code both stall tests fail).
"""

from __future__ import annotations

import itertools
import resource
import shutil
import threading
import time
from pathlib import Path

import pytest

from storage.commitlog import CHECKPOINT_NAME, CommitLog
from storage.errors import StorageError
from storage.log_format import HEADER_SIZE
from storage.segment import Segment

_MIB = 1 << 20
_DIRTY = 128 * _MIB  # what one flush msyncs: 50-60 ms on this disk when quiet


class _Spinner(threading.Thread):
    """Records the time of each iteration of a pure-Python loop while it runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.ticks: list[float] = []
        self._running = threading.Event()
        self._halt = threading.Event()

    def run(self) -> None:
        ticks, clock, stop = self.ticks, time.perf_counter, self._halt
        self._running.set()
        while not stop.is_set():
            ticks.append(clock())

    def __enter__(self) -> _Spinner:
        self.start()
        self._running.wait()
        time.sleep(0.02)  # in its steady state: holding the GIL, handing it over every 5 ms
        return self

    def __exit__(self, *exc: object) -> None:
        self._halt.set()
        self.join()

    def assert_ran_during(self, windows: list[tuple[float, float]]) -> None:
        """Over each (start, end) window, the longest stretch without an iteration is a
        scheduler hiccup, not the window: below half of it, or 25 ms for short windows (the
        interpreter hands the GIL over every 5 ms; the machine is shared). Holding the GIL
        through an msync freezes this thread for the whole window (stall ~= window)."""
        assert windows
        for start, end in windows:
            inside = [t for t in self.ticks if start <= t <= end]
            edges = [start, *inside, end]
            stall = max(b - a for a, b in itertools.pairwise(edges))
            assert inside, f"no iteration of the other thread in a {end - start:.3f} s call"
            assert stall < max(0.5 * (end - start), 0.025), (
                f"the other thread stalled {stall * 1000:.1f} ms of a "
                f"{(end - start) * 1000:.1f} ms call")


@pytest.fixture
def msync_windows(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """The (start, end) times of every Segment.sync call made during the test."""
    windows: list[tuple[float, float]] = []
    sync = Segment.sync

    def timed(seg: Segment, start: int, stop: int) -> None:
        began = time.perf_counter()
        try:
            sync(seg, start, stop)
        finally:
            windows.append((began, time.perf_counter()))

    monkeypatch.setattr(Segment, "sync", timed)
    return windows


def _fill(log: CommitLog, total: int) -> None:
    payload = bytes(range(256)) * 256  # 64 KiB, not all zeros
    per_batch = 64
    for _ in range(total // (len(payload) * per_batch)):
        log.append_batch([payload] * per_batch)


def test_flush_leaves_other_threads_running(
    tmp_path: Path, msync_windows: list[tuple[float, float]],
) -> None:
    log = CommitLog(tmp_path / "log", segment_size=_DIRTY + _MIB, flush_interval_ms=3_600_000)
    try:
        _fill(log, _DIRTY)
        assert log.flushed_position < log.end_position
        msync_windows.clear()  # (opening syncs the empty recovered tail)
        with _Spinner() as spinner:
            log.flush()
        assert log.flushed_position == log.end_position
    finally:
        log.close()
        shutil.rmtree(tmp_path / "log")  # pytest keeps the last runs' tmp_path: free the disk
    spinner.assert_ran_during(msync_windows[:1])  # the flush's msync (close() adds none)


def test_segment_sync_leaves_other_threads_running(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, 0, _DIRTY)
    try:
        chunk = bytes(range(256)) * 4096  # 1 MiB
        for pos in range(0, _DIRTY, len(chunk)):
            seg.mm[pos:pos + len(chunk)] = chunk
        with _Spinner() as spinner:
            start = time.perf_counter()
            seg.sync(0, seg.size)
            end = time.perf_counter()
    finally:
        seg.close()
        seg.path.unlink()
    spinner.assert_ran_during([(start, end)])


@pytest.mark.parametrize("policy", ["async", "sync"])
def test_flushed_records_survive_reopen(tmp_path: Path, policy: str) -> None:
    directory = tmp_path / "log"
    payloads = [i.to_bytes(4, "little") * (1 + i % 700) for i in range(3000)]
    log = CommitLog(directory, segment_size=256 * 1024, flush_policy=policy,
                    flush_interval_ms=3_600_000)
    try:
        positions = log.append_batch(payloads[:1500]) + log.append_batch(payloads[1500:])
        log.flush()
        end = log.end_position
        assert log.flushed_position == end
        assert len(list(directory.glob("0" * 10 + "*"))) > 1  # spans segments
    finally:
        log.close()
    with CommitLog(directory, read_only=True) as reopened:
        assert reopened.end_position == end
        assert [reopened.read(p) for p in positions] == payloads
    checkpoint = (directory / CHECKPOINT_NAME).read_bytes()
    assert int.from_bytes(checkpoint[:8], "little") == end  # the flush recorded it
    with CommitLog(directory, full_check=True) as again:  # every record checked on open
        assert again.end_position == end


def test_segment_sync_clamps_its_range_and_refuses_a_closed_segment(tmp_path: Path) -> None:
    seg = Segment.create(tmp_path, 0, 64 * 1024)
    seg.mm[5000:5005] = b"hello"
    seg.sync(5000, 5005)  # unaligned start: rounded down to the page
    seg.sync(-10, 10 * seg.size)  # clamped to the segment
    seg.sync(100, 100)  # empty: nothing to do
    seg.close()  # the sync released its hold on the mapping's buffer
    with pytest.raises(ValueError, match="closed"):
        seg.sync(0, 10)
    read_only = Segment.open(seg.path, writable=False)
    try:
        read_only.sync(0, read_only.size)  # nothing to sync in a read-only mapping
        assert read_only.mm[5000:5005] == b"hello"
    finally:
        read_only.close()


def test_flush_after_close_is_refused(tmp_path: Path) -> None:
    log = CommitLog(tmp_path / "log", segment_size=64 * 1024)
    log.append_batch([b"x"])
    log.close()
    with pytest.raises(StorageError, match="closed"):
        log.flush()


def test_close_waits_for_an_msync_in_flight(tmp_path: Path) -> None:
    """The msync runs without the GIL: a close() meanwhile must neither unmap the pages under
    it nor fail; it waits, and a later sync is refused."""
    seg = Segment.create(tmp_path, 0, 32 * _MIB)
    seg.mm[:] = bytes(range(256)) * (seg.size // 256)
    outcome: list[BaseException | None] = []
    began = threading.Event()

    def sync() -> None:
        began.set()
        try:
            seg.sync(0, seg.size)
            outcome.append(None)
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    syncer = threading.Thread(target=sync)
    syncer.start()
    began.wait()
    seg.close()  # mid-msync (or, if the syncer is slow to start, before it: ValueError)
    syncer.join()
    assert seg.mm.closed
    assert outcome == [None] or isinstance(outcome[0], ValueError), outcome
    with pytest.raises(ValueError, match="closed"):
        seg.sync(0, 10)
    seg.path.unlink()


def _resident_bytes(path: Path) -> int:
    """Bytes of this process's mappings of ``path`` that are in memory (smaps ``Rss``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            inside = line.endswith(str(path))
        elif inside and head and head[0] == "Rss:":
            total += int(head[1]) * 1024
    return total


def test_segment_create_populates_its_pages_and_leaves_other_threads_running(
        tmp_path: Path) -> None:
    """A new segment's pages are faulted in up front, and other threads run meanwhile
    (MAP_POPULATE held the GIL through the whole mmap call: 757 ms for 256 MiB here)."""
    windows = []
    with _Spinner() as spinner:
        for base in (0, _DIRTY):
            began = time.perf_counter()
            seg = Segment.create(tmp_path, base, _DIRTY)
            windows.append((began, time.perf_counter()))
            try:
                assert _resident_bytes(seg.path) == _DIRTY
            finally:
                seg.close()
    spinner.assert_ran_during(windows)


def test_segment_create_populates_where_the_kernel_refuses_the_advice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before Linux 5.14 madvise refuses MADV_POPULATE_READ: the pages are populated by
    MAP_POPULATE instead, and the segment works the same."""
    import storage.segment as segment

    refused: list[int] = []
    monkeypatch.setattr(segment, "populate",
                        lambda mm: refused.append(len(mm)) or False)
    seg = Segment.create(tmp_path, 0, 8 * _MIB)
    try:
        assert refused == [8 * _MIB]
        assert _resident_bytes(seg.path) == 8 * _MIB
        seg.mm[:5] = b"hello"
        assert seg.mm[:5] == b"hello"
    finally:
        seg.close()


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


@pytest.mark.parametrize("through", ["log", "mapping"])
def test_appends_go_into_the_file_not_through_the_mapping(tmp_path: Path, through: str) -> None:
    """Batches of appends ``pwrite`` into the file: the mapping's page-table entries stay
    read-only and clean, so writing the pages back needs no TLB shoot-down
    (storage/segment.py). Seen from the process: 8 MiB appended in batches of 100 KB takes
    no page fault, and reads through the mapping see it.
    The same bytes written through the mapping (``through="mapping"``, what appends did
    before) fault about once a page: the kernel write-protects a shared file page until it
    is written, to track it as dirty in the page-table entry."""
    record = bytes(range(200)) * 5
    pages = 8 * _MIB // 4096
    if through == "mapping":  # the contrast: the same bytes copied into a new segment
        seg = Segment.create(tmp_path, 0, 8 * _MIB)
        try:
            before = _minor_faults()
            for off in range(0, 8 * _MIB - len(record), len(record)):
                seg.mm[off:off + len(record)] = record
            faults = _minor_faults() - before
        finally:
            seg.close()
        assert faults > pages // 4, faults
        return
    log = CommitLog(tmp_path / "log", segment_size=16 * _MIB, flush_interval_ms=3_600_000)
    count = 8 * _MIB // (len(record) + HEADER_SIZE)
    try:
        log.append_batch([record])  # the log's first segment is made (and populated) now
        before = _minor_faults()
        positions = []
        for start in range(0, count, 100):
            positions += log.append_batch([record] * min(100, count - start))
        faults = _minor_faults() - before
        assert faults < pages // 20, faults
        assert log.read_many(positions[-3:]) == [record] * 3  # through the mapping
        log.flush()
    finally:
        log.close()
