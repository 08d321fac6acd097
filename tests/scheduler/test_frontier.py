"""Delivery moves the persisted frontier instead of deleting what it delivered; scans are
paced.

A commit writes each shard's frontier (a timer key) in its one RocksDB batch and no delete
at all; everything below the frontier counts as delivered, and the maintenance thread
removes that dead prefix now and then with ONE range delete. These tests prove the parts:
no tombstone per commit, a frontier that stops inside a millisecond survives a restart
without a duplicate, the listing skips the dead prefix, and the timed clean-up runs.
"""

from __future__ import annotations

import itertools
import time

import pytest

from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from scheduler.scanner import Scanner
from scheduler.timer_index import TimerIndex
from storage.constants import CF_META, META_WATERMARK_PREFIX
from storage.keys import time_bound
from tests.support.engine import START_MS, Harness, advance_until, read_topic

TIMER = "timer.0"


def _memtable(harness: Harness, name: str) -> int:
    assert harness.store is not None
    value = harness.store.property_int(TIMER, f"rocksdb.{name}-active-mem-table")
    assert value is not None
    return value


def test_a_delivery_commit_deletes_nothing_and_persists_the_frontier(
        harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(flaky=True, timer_shards=1)
    n = 300  # one due instant per message: one commit each
    broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"m{i}", delay_ms=1 + i)
                       for i in range(n)])
    for _ in range(n):
        clock.advance(1)
        broker.drain()
    assert len(read_topic(broker, "t")) == n
    # the memtable holds the n puts and nothing else: no point or range delete per commit
    assert _memtable(harness, "num-entries") == n
    assert _memtable(harness, "num-deletes") == 0
    assert harness.store is not None
    frontier = TimerIndex(harness.store).frontier(0)
    assert frontier == time_bound(clock.now_ms() + 1)
    assert broker.stats().watermarks["0"] == clock.now_ms() + 1
    assert broker.list_scheduled("t", from_ms=None, to_ms=None, limit=1000,
                                 cursor=None) == ([], None)


def test_a_frontier_inside_a_millisecond_survives_a_restart(
        harness: Harness, clock: FakeClock) -> None:
    """250 messages due at one instant, delivered 100 per commit; the log fails after the
    first commit, the server stops and starts again: every message exactly once."""
    broker = harness.open(flaky=True, timer_shards=1, scan_batch_size=100,
                          delivery_batch_max=100)
    log = harness.log
    assert log is not None
    broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"m{i:03d}", delay_ms=10)
                       for i in range(250)])

    def fail_from_now_on(_positions: list[int]) -> None:
        log.fail_appends = 1 << 30

    log.after_append = fail_from_now_on
    clock.advance(10)
    advance_until(clock, lambda: broker.stats().retries > 0, step=1)
    assert [m.msg_id for m in read_topic(broker, "t")] == [f"m{i:03d}" for i in range(100)]
    store = harness.store
    assert store is not None
    frontier = store.get(CF_META, META_WATERMARK_PREFIX + b"0")
    assert frontier is not None and frontier.endswith(b"m099\x00")  # inside the millisecond
    page, _ = broker.list_scheduled("t", from_ms=None, to_ms=None, limit=1000, cursor=None)
    assert [m.msg_id for m in page] == [f"m{i:03d}" for i in range(100, 250)]
    broker.close()

    again = harness.open(timer_shards=1)
    again.drain()
    delivered = [m.msg_id for m in read_topic(again, "t")]
    assert delivered == [f"m{i:03d}" for i in range(250)]
    assert again.stats().pending == 0


def test_the_dead_prefix_is_cleaned_on_a_timer(harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(flaky=True, timer_shards=1, cleanup_interval_ms=5_000)
    store = harness.store
    assert store is not None
    broker.send_batch([SendRequest(topic="t", body=b"x", delay_ms=10) for _ in range(50)])
    clock.advance(10)
    broker.drain()
    assert store.cleanups == []  # 50 is far below compact_after_deletes: only the timer
    assert len(store.read_range(TIMER, b"", None, 100)) == 50  # dead, still stored
    advance_until(clock, lambda: bool(store.cleanups), step=500)
    assert clock.now_ms() >= START_MS + 10 + 5_000
    assert store.cleanups == [(TIMER, START_MS + 11)]
    assert store.read_range(TIMER, b"", None, 100) == []


def test_scans_are_paced_in_real_time(harness: Harness, clock: FakeClock,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """After a scan that found everything due, the next scan of that shard waits until the
    real millisecond boundary ``scan_interval_ms`` after the one the scan began in (so at
    least ``scan_interval_ms`` - 1 ms): messages due on 6 distinct instants, each made due
    by the fake clock right away, still take >= 5 intervals, and none is lost."""
    starts: list[float] = []
    step = Scanner.step

    def timed(scanner: Scanner) -> bool | None:
        starts.append(time.monotonic())
        return step(scanner)

    monkeypatch.setattr(Scanner, "step", timed)
    broker = harness.open(timer_shards=1, scan_interval_ms=100)
    broker.send_batch([SendRequest(topic="t", body=b"x", delay_ms=1 + i) for i in range(6)])
    for _ in range(6):
        clock.advance(1)
        broker.drain()
    assert len(read_topic(broker, "t")) == 6
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(gaps) >= 5 and min(gaps) >= 0.0985, gaps  # (interval - 1 ms, a margin)


@pytest.mark.parametrize(("started_ns", "interval_ms", "pause_ms"), [
    (1_000_300_000, 4, 3.7),  # began 0.3 ms into ms 1000: ends at 1004.000
    (1_000_000_000, 4, 4.0),  # began on the boundary itself
    (1_000_999_000, 1, 0.001),  # the next boundary
    (1_000_300_000, 0, 0.0),  # no pacing
])
def test_the_pause_ends_on_a_millisecond_boundary(harness: Harness, started_ns: int,
                                                   interval_ms: int, pause_ms: float) -> None:
    """deliverAt counts whole ms: a scan just after a boundary catches everything due in
    that ms at once (scheduler/scanner.py, pacing)."""
    broker = harness.open(timer_shards=1, scan_interval_ms=interval_ms)
    scanner = broker.parts.scanners[0]
    assert scanner._pause_end(50.0, started_ns) == pytest.approx(50.0 + pause_ms / 1000,
                                                                  abs=1e-9)
