"""CommitLog retention (scheduler/retention.py): aged segments go, with every consume-queue
entry, ledger entry and group position that points into them; readers below the new first
offset are told (OffsetExpired), never skipped silently; a crash between the steps leaves a
store that opens and verifies. Real RocksDB, real segment files, a FakeClock."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from app.verify_cli import verify
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from scheduler.retention import IDLE_CHECK_MS, LogRetention
from storage.commitlog import CommitLog
from storage.constants import CF_CQ, CF_META, META_LEDGER_PREFIX, META_LOG_FIRST_POSITION
from storage.errors import OffsetExpired
from storage.keys import unpack_u64
from storage.records import MessageStatus
from tests.support.engine import START_MS, Harness, advance_until, run_threads

SEGMENT = 64 << 10
RETENTION_MS = 60_000
BODY = b"x" * 1000


def _open(harness: Harness, *, upkeep: bool = False, **overrides: Any) -> Broker:
    settings: dict[str, Any] = {
        "segment_size": SEGMENT, "max_body_bytes": 16 << 10,
        "commitlog_retention_ms": RETENTION_MS, "disk_clean_ratio": 1.0,
        "cleanup_interval_ms": 3_600_000, "retention_ms": 10 * RETENTION_MS,
    }
    settings.update(overrides)
    broker = harness.open(**settings)
    if not upkeep:  # the test runs the rounds itself, deterministically
        broker.parts.maintenance._retention = None
    return broker


def _retention(broker: Broker) -> LogRetention:
    assert broker.parts.retention is not None
    return broker.parts.retention


def _log(broker: Broker) -> CommitLog:
    log = broker.parts.log
    assert isinstance(log, CommitLog)
    return log


def _segments(data: Path) -> list[str]:
    return sorted(p.name for p in (data / "commitlog").iterdir() if p.name.isdigit())


def _sealed(broker: Broker) -> list[int]:
    """Bases of the segment files below the one appends go to (not the spare the flusher
    makes ahead, whenever it does)."""
    current = _log(broker)._segments[-1].base
    return [int(name) for name in _segments(broker.config.data_dir) if int(name) < current]


def _send_now(broker: Broker, clock: FakeClock, n: int, *, start: int = 0,
              topics: tuple[str, ...] = ("a", "b"), step_ms: int = 1000) -> None:
    """``n`` messages due at once (straight to the log), one per ``step_ms`` of fake time."""
    for i in range(start, start + n):
        broker.send(SendRequest(topic=topics[i % len(topics)], body=BODY, msg_id=f"m{i}"))
        clock.advance(step_ms)


def _offsets(broker: Broker, topic: str, offset: int) -> list[int]:
    out: list[int] = []
    while True:
        page = broker.pull(topic, offset, 1000)
        if not page.messages:
            return out
        out += [m.queue_offset for m in page.messages]
        offset = page.next_offset


def test_segments_age_out_with_what_points_into_them(harness: Harness,
                                                    clock: FakeClock) -> None:
    broker = _open(harness)
    data = harness.data_dir
    _send_now(broker, clock, 70)  # one a second: segment 0 and part of 1 (~60 a segment)
    retention = _retention(broker)
    retention.run_once()
    assert _log(broker).first_position == 0  # nothing is older than the retention yet
    clock.advance(100_000)
    _send_now(broker, clock, 150, start=70, step_ms=10)  # a few more segments, 1.5 s
    before = _sealed(broker)
    assert len(before) >= 3
    retention.run_once()
    # segment 0's newest record is older than the first of segment 1 (~60 s): 110 s old,
    # past the retention; segment 1's next one was stored a moment ago
    assert _sealed(broker) == before[1:]
    first_position = _log(broker).first_position
    assert first_position == before[1]
    stored = broker.parts.store.get(CF_META, META_LOG_FIRST_POSITION)
    assert stored is not None and unpack_u64(stored) == first_position
    for topic in ("a", "b"):
        info = broker.topic(topic)
        assert 0 < info.first_offset < info.end_offset == 110
        with pytest.raises(OffsetExpired) as caught:
            broker.pull(topic, info.first_offset - 1, 10)
        assert caught.value.first_offset == info.first_offset
        # from the first offset on: every message still there, in order, no gap
        assert _offsets(broker, topic, info.first_offset) == list(
            range(info.first_offset, 110))
    # no consume-queue entry and no ledger entry points below the log's first position
    store = broker.parts.store
    assert store is not None
    for key, value in store.scan(CF_CQ):
        assert int.from_bytes(value[:8], "big") >= first_position, key
    for _, value in store.scan(CF_META, META_LEDGER_PREFIX, META_LEDGER_PREFIX + b"\xff"):
        assert int.from_bytes(value[:8], "big") >= first_position
    # an expired record's status stays DELIVERED, without its offset; a kept one has it
    gone = broker.status("a", "m0")
    assert gone.status is MessageStatus.DELIVERED and gone.offset is None
    kept = broker.status("a", "m218")
    assert kept.status is MessageStatus.DELIVERED and kept.offset == 109
    # sends go on at the end offsets
    broker.send(SendRequest(topic="a", body=b"after", msg_id="after"))
    assert broker.topic("a").end_offset == 111
    # the metrics count it
    assert broker.metrics.log_segments_deleted.labels("retention").value == 1
    assert broker.metrics.log_bytes_deleted.labels("retention").value == SEGMENT
    # everything but the segment being written goes once it is old enough
    clock.advance(RETENTION_MS)
    retention.run_once()
    assert _log(broker).sealed_segments() == [] == _sealed(broker)
    harness.close_all()
    report = verify(data)
    assert report.problem_count == 0, report.problems
    assert report.log_first > 0
    assert report.entries == report.log_records  # one entry per record kept, none more


def test_the_upkeep_thread_deletes_within_a_round_of_falling_due(
        harness: Harness, clock: FakeClock) -> None:
    broker = _open(harness, upkeep=True)
    _send_now(broker, clock, 200, step_ms=10)
    assert len(_segments(harness.data_dir)) >= 3
    advance_until(clock, lambda: _log(broker).first_position > 0, step=1000)
    assert clock.now_ms() - START_MS <= RETENTION_MS + IDLE_CHECK_MS + 2_000 + 1_000


def test_a_topic_whose_log_is_all_deleted_keeps_its_offsets(harness: Harness,
                                                           clock: FakeClock) -> None:
    broker = _open(harness)
    _send_now(broker, clock, 10, topics=("quiet",))
    _send_now(broker, clock, 150, start=10, topics=("busy",), step_ms=10)
    clock.advance(2 * RETENTION_MS)
    _send_now(broker, clock, 70, start=160, topics=("busy",), step_ms=10)
    _retention(broker).run_once()
    assert broker.topic("quiet").first_offset == broker.topic("quiet").end_offset == 10
    broker.send(SendRequest(topic="quiet", body=b"later", msg_id="later"))
    page = broker.pull("quiet", 10, 10)
    assert [m.queue_offset for m in page.messages] == [10]
    harness.close_all()
    reopened = _open(harness)  # the offsets come back from RocksDB, not from memory
    assert reopened.topic("quiet").first_offset == 10
    assert reopened.topic("quiet").end_offset == 11


def test_pending_messages_are_never_touched(harness: Harness, clock: FakeClock) -> None:
    broker = _open(harness)
    for i in range(50):  # due in ten retention periods
        broker.send(SendRequest(topic="later", body=BODY, msg_id=f"p{i}",
                                delay_ms=10 * RETENTION_MS))
    _send_now(broker, clock, 200, step_ms=10)
    clock.advance(2 * RETENTION_MS)
    _send_now(broker, clock, 70, start=200, step_ms=10)
    _retention(broker).run_once()
    assert _log(broker).first_position > 0
    assert broker.topic("later").pending == 50
    clock.advance(10 * RETENTION_MS)
    broker.drain()
    assert _offsets(broker, "later", 0) == list(range(50))


def test_a_crash_after_the_rocksdb_write_leaves_a_store_that_verifies(
        harness: Harness, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 1 done, the files not yet removed (a kill -9 there): the store verifies, opens,
    and the next round removes them."""
    broker = _open(harness)
    data = harness.data_dir
    _send_now(broker, clock, 200, step_ms=10)
    clock.advance(2 * RETENTION_MS)
    _send_now(broker, clock, 70, start=200, step_ms=10)
    before = _sealed(broker)
    log = _log(broker)
    monkeypatch.setattr(log, "drop_segments_below", lambda position: [])
    _retention(broker).run_once()
    assert _sealed(broker) == before  # only RocksDB changed
    first = broker.topic("a").first_offset
    assert first > 0
    with pytest.raises(OffsetExpired):
        broker.pull("a", 0, 10)
    monkeypatch.undo()
    harness.close_all()
    report = verify(data)
    assert report.problem_count == 0, report.problems
    reopened = _open(harness)
    _retention(reopened).run_once()
    assert len(_sealed(reopened)) < len(before)
    assert reopened.topic("a").first_offset == first
    assert _offsets(reopened, "a", first) == list(range(first, 135))
    harness.close_all()
    assert verify(data).problem_count == 0


def test_a_crash_between_two_file_removals_leaves_a_log_that_opens(
        harness: Harness, clock: FakeClock) -> None:
    """The oldest file went, the next not yet: the log still starts with a whole segment."""
    broker = _open(harness)
    data = harness.data_dir
    _send_now(broker, clock, 250, step_ms=10)
    clock.advance(2 * RETENTION_MS)
    _send_now(broker, clock, 70, start=250, step_ms=10)
    log = _log(broker)
    real = log.delete_segments
    calls: list[int] = []

    def only_the_first(segments: Any) -> None:
        calls.append(len(segments))
        real(segments[:1])  # the rest stay, as after a kill -9 between two unlinks

    log.delete_segments = only_the_first  # type: ignore[method-assign]
    _retention(broker).run_once()
    assert calls and calls[0] >= 2
    harness.close_all()
    assert verify(data).problem_count == 0
    reopened = _open(harness)
    assert _log(reopened).first_position > 0
    _retention(reopened).run_once()  # the leftovers below the stored first position go
    stored = reopened.parts.store.get(CF_META, META_LOG_FIRST_POSITION)
    assert stored is not None and _log(reopened).first_position == unpack_u64(stored)
    first = reopened.topic("a").first_offset
    assert _offsets(reopened, "a", first) == list(range(first, 160))


def test_deletion_racing_pulls_receives_and_deliveries(harness: Harness,
                                                      clock: FakeClock) -> None:
    """Readers from several threads while segments go: each answer is a run of consecutive
    offsets from where it asked, or OffsetExpired carrying a first offset above it."""
    broker = _open(harness)
    _send_now(broker, clock, 300, step_ms=10, topics=("r",))
    stop = threading.Event()
    problems: list[str] = []

    def puller() -> None:
        offset = 0
        while not stop.is_set():
            try:
                page = broker.pull("r", offset, 50)
            except OffsetExpired as exc:
                if exc.first_offset is None or exc.first_offset <= offset:
                    problems.append(f"expired at {offset} with first {exc.first_offset}")
                offset = exc.first_offset or offset
                continue
            got = [m.queue_offset for m in page.messages]
            if got and got != list(range(offset, offset + len(got))):
                problems.append(f"asked {offset}, got {got[:3]}...")
            offset = page.next_offset if got else 0

    def receiver() -> None:
        groups = broker.groups
        while not stop.is_set():
            result = groups.receive("r", "g", 20, 1000)
            offsets = [r.record.queue_offset for r in result.messages]
            first = broker.first_offset("r")
            if any(o < first - 20 for o in offsets):  # (a receive races the move by a step)
                problems.append(f"received {offsets[:3]} below {first}")
            if result.messages:
                groups.ack("r", "g", [r.receipt for r in result.messages])

    def sender_and_retention() -> None:
        try:
            for round_ in range(12):
                for i in range(20):  # delivered by the scanners and the delivery stage
                    broker.send(SendRequest(topic="r", body=BODY, msg_id=f"d{round_}-{i}",
                                            delay_ms=100 + i))
                _send_now(broker, clock, 60, start=1000 + 60 * round_, step_ms=10,
                          topics=("r",))
                clock.advance(RETENTION_MS // 3)
                broker.drain()
                _retention(broker).run_once()
        finally:
            stop.set()

    run_threads([puller, puller, receiver, sender_and_retention])
    assert not problems, problems[:5]
    assert _log(broker).first_position > 0
    first = broker.topic("r").first_offset
    assert _offsets(broker, "r", first) == list(range(first, 300 + 12 * 80))
    harness.close_all()
    assert verify(harness.data_dir).problem_count == 0


def test_a_group_behind_the_first_offset_continues_from_it(harness: Harness,
                                                           clock: FakeClock) -> None:
    broker = _open(harness)
    groups = broker.groups
    _send_now(broker, clock, 10, topics=("g",))
    got = groups.receive("g", "slow", 4, 30_000)  # leases 0-3, acks 0 and 2
    groups.ack("g", "slow", [got.messages[0].receipt, got.messages[2].receipt])
    assert groups.state("g", "slow").committed_offset == 1
    _send_now(broker, clock, 150, start=10, topics=("g",), step_ms=10)
    clock.advance(2 * RETENTION_MS)
    _send_now(broker, clock, 70, start=160, topics=("g",), step_ms=10)
    _retention(broker).run_once()
    first = broker.topic("g").first_offset
    assert first > 4
    # reading the group shows what it lost, and changes nothing
    state = groups.state("g", "slow")
    assert state.committed_offset == first
    assert state.expired == first - 1 - 1  # offsets 1..first-1, less the acked 2
    # its next receive goes on from the first offset; the old receipts are stale
    again = groups.receive("g", "slow", 5, 30_000)
    assert [m.record.queue_offset for m in again.messages] == list(range(first, first + 5))
    assert groups.ack("g", "slow", [got.messages[1].receipt]).acked == 0
    assert groups.state("g", "slow").expired == first - 2
    assert broker.metrics.group_expired.labels("g/slow").value == first - 2
    # a pull by a group behind it starts at the first offset, counted the same way
    broker.groups.set_offset("g", "puller", 0)
    assert broker.groups.read_offset("g", "puller") == first
    assert broker.groups.offset("g", "puller") == first
    assert groups.state("g", "puller").expired == first
    harness.close_all()
    reopened = _open(harness)  # expired and the moved offsets are durable
    assert reopened.groups.state("g", "slow").expired == first - 2
    assert reopened.groups.offset("g", "slow") >= first


def _mapped_kib(path: Path) -> int:
    """This process's resident KiB of the mapping of ``path`` (/proc/self/smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    total, inside = 0, False
    for line in lines:
        if line[:1].isalnum() and "-" in line.split(" ", 1)[0] and ":" not in line.split()[0]:
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_idle_segments_give_their_pages_back(harness: Harness, clock: FakeClock) -> None:
    # (no flusher tick: it gives back all but the last two itself, tests/storage)
    broker = _open(harness, commitlog_retention_ms=10 * RETENTION_MS,
                   flush_interval_ms=3_600_000)
    _send_now(broker, clock, 250, step_ms=10)
    log = _log(broker)
    sealed = log._segments[:-1]
    assert len(sealed) >= 2
    assert all(_mapped_kib(seg.path) > 0 for seg in sealed)  # populated when made
    log.release_idle()  # the first round only notes what was touched since the last
    assert log.release_idle() == len(sealed)  # nobody read them since
    assert [_mapped_kib(seg.path) for seg in sealed] == [0] * len(sealed)
    assert _mapped_kib(log._segments[-1].path) > 0  # the one appends go to stays
    # a read of a released segment works: its pages come back from the page cache
    assert _offsets(broker, "a", 0) == list(range(125))
    assert _mapped_kib(sealed[0].path) > 0
    assert log.release_idle() == 0  # read since the last round: kept a round
    assert log.release_idle() == len(sealed)
    assert _mapped_kib(sealed[0].path) == 0


def test_disk_above_the_ratio_deletes_early_oldest_first(
        harness: Harness, clock: FakeClock) -> None:
    """The ratio on a fake file system; the real one is tests/faults/test_log_retention_disk.py."""
    broker = _open(harness)
    _send_now(broker, clock, 300, step_ms=10)
    retention = _retention(broker)
    used = [0.95]
    retention._used_ratio = lambda _path: used[0]
    retention._clean_ratio = 0.85
    log = _log(broker)
    firsts: list[int] = []
    real = retention._delete_below

    def watch(cut: int, reason: str) -> Any:
        firsts.append(log.first_position)
        deletion = real(cut, reason)
        if len(firsts) == 2:
            used[0] = 0.5  # two segments freed enough
        return deletion

    retention._delete_below = watch  # type: ignore[method-assign]
    retention.run_once()
    assert len(firsts) == 2 and firsts[0] < firsts[1]  # oldest first, one at a time
    assert broker.metrics.log_early_deletions.value == 2
    assert broker.metrics.log_segments_deleted.labels("disk").value == 2
    assert broker.topic("a").first_offset > 0
    assert START_MS  # (the records are fresh: only the disk made them go)


def test_the_upkeep_thread_runs_a_round_a_second_at_most(harness: Harness,
                                                         clock: FakeClock) -> None:
    """Under a steady flow an expiry falls due every few ms; a round per due expiry kept the
    thread at 100 % of a core (the retention soak). Here one falls due each fake ms while
    fake time moves on by 1 ms steps for half a fake second: one round, not hundreds."""
    broker = _open(harness, upkeep=True, retention_ms=10_000, cleanup_interval_ms=60_000)
    maintenance = broker.parts.maintenance
    assert maintenance is not None
    for i in range(1_500):  # their expiries fall due one a millisecond
        broker.send(SendRequest(topic="e", body=b"x", msg_id=f"e{i}"))
        clock.advance(1)
    rounds = [0]
    real = maintenance.expire_due

    def counted() -> int:
        rounds[0] += 1
        return real()

    maintenance.expire_due = counted  # type: ignore[method-assign]
    clock.advance(10_000 - 1_500 + 10)  # to 10 ms past the first expiry
    for _ in range(500):
        clock.advance(1)
        time.sleep(0.001)
    assert 1 <= rounds[0] <= 2, rounds[0]


def test_retry_and_dead_letter_topics_fall_under_the_same_retention(
        harness: Harness, clock: FakeClock) -> None:
    broker = _open(harness, max_reconsume_times=1)
    groups = broker.groups
    _send_now(broker, clock, 6, topics=("jobs",))
    got = groups.receive("jobs", "w", 6, 30_000)
    assert groups.nack("jobs", "w", [m.receipt for m in got.messages],
                       delay_ms=1_000).retrying == 6
    clock.advance(1_000)
    broker.drain()
    again = groups.receive("jobs", "w", 6, 30_000)  # the retries, from the retry topic
    assert len(again.messages) == 6
    assert groups.nack("jobs", "w", [m.receipt for m in again.messages[:4]]).dead_lettered == 4
    groups.ack("jobs", "w", [m.receipt for m in again.messages[4:]])
    retry, dlq = groups._group("jobs", "w").streams[1].log_topic, \
        groups._group("jobs", "w").dlq_topic
    assert broker.topic(retry).end_offset == 6 and broker.topic(dlq).end_offset == 4
    assert groups.state("jobs", "w").dead_lettered == 4
    _send_now(broker, clock, 150, start=100, topics=("other",), step_ms=10)
    clock.advance(2 * RETENTION_MS)
    _send_now(broker, clock, 70, start=300, topics=("other",), step_ms=10)
    _retention(broker).run_once()
    for topic, end in ((retry, 6), (dlq, 4), ("jobs", 6)):
        info = broker.topic(topic)
        assert info.first_offset == info.end_offset == end, topic
    # the dead letters went with their segment: none left to list or to count
    assert groups.dead_letters("jobs", "w", None, 10).messages == []
    with pytest.raises(OffsetExpired) as caught:
        groups.dead_letters("jobs", "w", 0, 10)
    assert caught.value.first_offset == 4
    assert groups.redrive("jobs", "w", 10) == 0
    state = groups.state("jobs", "w")
    assert state.dead_lettered == 0 and state.expired == 0  # it had handled them all
