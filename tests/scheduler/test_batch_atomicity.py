"""A send batch that mixes due-now and scheduled messages is all or nothing, also when the
RocksDB write fails after the CommitLog append (the due-now records are revoked from the
log, never replayed) and when the process dies in that window (recovery skips and revokes
the records marked FLAG_BATCH). Pure batches keep the replay path. Also CommitLog.revoke.

Run as a module (``python -m tests.scheduler.test_batch_atomicity DIR``) it is the child of
the kill -9 test: it acknowledges scheduled sends on stdout, then dies by SIGKILL right after
the CommitLog append of a mixed batch, before its RocksDB write.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.committer import Log
from scheduler.config import EngineConfig
from scheduler.engine import open_commitlog
from scheduler.model import SendRequest
from storage.commitlog import CommitLog
from storage.constants import CF_META, COMMITLOG_DIR, META_APPLIED_POSITION, ROCKSDB_DIR
from storage.errors import InvalidArgument, NotFound, StorageError
from storage.keys import unpack_u64
from storage.records import FLAG_BATCH, MessageStatus, decode_log_record
from storage.rocks import RocksStore
from tests.support.engine import START_MS, FlakyLog, FlakyStore, Harness, read_topic

REPO = Path(__file__).resolve().parents[2]
LATER_MS = 1000


def mixed_batch(topic: str = "t") -> list[SendRequest]:
    return [SendRequest(topic=topic, body=b"now", msg_id="now-1"),
            SendRequest(topic=topic, body=b"now", msg_id="now-2"),
            SendRequest(topic=topic, body=b"later", msg_id="later-1", delay_ms=LATER_MS)]


def flaky_parts(harness: Harness) -> tuple[FlakyLog, FlakyStore]:
    assert harness.log is not None and harness.store is not None
    return harness.log, harness.store


def assert_none_of_it(broker: Broker, topic: str = "t") -> None:
    for msg_id in ("now-1", "now-2", "later-1"):
        with pytest.raises(NotFound):
            broker.status(topic, msg_id)
    assert [m.msg_id for m in read_topic(broker, topic)
            if m.msg_id in ("now-1", "now-2", "later-1")] == []


def resend_is_stored_once(broker: Broker, clock: FakeClock, topic: str = "t") -> None:
    """The client's retry of the batch: stored whole, once; a second retry is a duplicate."""
    before = broker.end_offset(topic)
    results = broker.send_batch(mixed_batch(topic))
    assert [(r.msg_id, r.status, r.duplicate) for r in results] == [
        ("now-1", MessageStatus.DELIVERED, False), ("now-2", MessageStatus.DELIVERED, False),
        ("later-1", MessageStatus.SCHEDULED, False)]
    assert all(r.duplicate for r in broker.send_batch(mixed_batch(topic)))
    clock.advance(LATER_MS)
    broker.drain()
    got = read_topic(broker, topic)[before:]
    assert [(m.msg_id, m.offset) for m in got] == [
        ("now-1", before), ("now-2", before + 1), ("later-1", before + 2)]


def log_records(data_dir: Path) -> list[tuple[int, str, int]]:
    """(position, msgId, flags) of every record of the log on disk (read-only open)."""
    log = CommitLog(data_dir / COMMITLOG_DIR, segment_size=1 << 20, read_only=True)
    try:
        return [(p, (r := decode_log_record(payload)).msg_id, r.flags)
                for p, payload in log.iter_from(0)]
    finally:
        log.close()


def applied_position(data_dir: Path) -> int:
    store = RocksStore(data_dir / ROCKSDB_DIR, timer_shards=None, read_only=True)
    try:
        raw = store.get(CF_META, META_APPLIED_POSITION)
    finally:
        store.close()
    return 0 if raw is None else unpack_u64(raw)


# --- the engine -------------------------------------------------------------------------------

def test_a_failed_write_revokes_the_due_half_and_nothing_is_ever_visible(
        harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(flaky=True)
    log, store = flaky_parts(harness)
    broker.send(SendRequest(topic="t", body=b"x", msg_id="before"))
    end = log.end_position
    store.fail_writes = 1  # the append works, the one RocksDB write fails
    with pytest.raises(StorageError):
        broker.send_batch(mixed_batch())
    assert log.records == 3  # "before" and the batch's two due-now records were appended
    assert log.revokes == [end] and log.end_position == end  # and taken back at once
    assert broker.ready  # nothing to replay
    assert_none_of_it(broker)
    # every later operation: another send (which would replay), a cancel, delivery
    broker.send(SendRequest(topic="t", body=b"x", msg_id="after"))
    with pytest.raises(NotFound):
        broker.cancel("t", "later-1")
    clock.advance(LATER_MS)
    broker.drain()
    assert_none_of_it(broker)
    assert [(m.msg_id, m.offset) for m in read_topic(broker, "t")] == [("before", 0),
                                                                       ("after", 1)]
    assert broker.stats().pending == 0 and broker.metrics.replayed.value == 0
    broker.close()
    broker = harness.open()  # and after a restart
    assert broker.metrics.replayed.value == 0
    assert_none_of_it(broker)
    assert [m for _, m, _ in log_records(harness.data_dir)] == ["before", "after"]
    resend_is_stored_once(broker, clock)


def test_a_batch_the_flusher_checkpointed_is_taken_back_with_its_checkpoint(
        harness: Harness, clock: FakeClock) -> None:
    """The async flusher may msync the appended records and checkpoint them before the
    RocksDB write fails: the revoke lowers the checkpoint first, so the next open neither
    keeps them nor refuses zeros below the checkpoint."""
    broker = harness.open(flaky=True)
    log, store = flaky_parts(harness)
    inner = log.inner
    assert isinstance(inner, CommitLog)

    def flush_then_fail(positions: list[int]) -> None:
        inner.flush()
        assert inner.flushed_position > positions[-1]
        store.fail_writes = 1

    log.after_append = flush_then_fail
    with pytest.raises(StorageError):
        broker.send_batch(mixed_batch())
    log.after_append = None
    assert inner.flushed_position == inner.end_position == log.revokes[0] == 0
    broker.close()
    broker = harness.open()
    assert_none_of_it(broker)
    assert log_records(harness.data_dir) == []
    resend_is_stored_once(broker, clock)


@pytest.mark.parametrize("revoke_failures", [1, 2])
def test_when_the_revoke_fails_replay_skips_the_batch(harness: Harness, clock: FakeClock,
                                                      revoke_failures: int) -> None:
    """The fallback: the records stay in the log marked FLAG_BATCH; the replay before the
    next write never applies them and revokes them (or, failing again, leaves them there,
    below the next applied position, for good)."""
    broker = harness.open(flaky=True)
    log, store = flaky_parts(harness)
    store.fail_writes, log.fail_revokes = 1, revoke_failures
    with pytest.raises(StorageError):
        broker.send_batch(mixed_batch())
    assert not broker.ready  # the log holds records RocksDB does not know
    assert_none_of_it(broker)  # a read does not replay, and would not apply them either
    after = broker.send(SendRequest(topic="t", body=b"x", msg_id="after"))  # replays first
    assert after.status is MessageStatus.DELIVERED and broker.ready
    assert broker.metrics.replayed.value == 0
    assert log.revokes == ([0] if revoke_failures == 1 else [])
    on_disk = [(m, bool(flags & FLAG_BATCH)) for _, m, flags in log_records(harness.data_dir)]
    dead = [("now-1", True), ("now-2", True)] if revoke_failures == 2 else []
    assert on_disk == [*dead, ("after", False)]
    clock.advance(LATER_MS)
    broker.drain()
    assert_none_of_it(broker)
    assert [(m.msg_id, m.offset) for m in read_topic(broker, "t")] == [("after", 0)]
    broker.close()
    broker = harness.open()
    assert_none_of_it(broker)
    assert broker.metrics.replayed.value == 0
    resend_is_stored_once(broker, clock)


def test_a_write_that_raised_but_landed_keeps_the_batch_whole(harness: Harness,
                                                             clock: FakeClock) -> None:
    """The write's outcome is what RocksDB holds, not what it said: a batch whose write
    landed is never revoked (its consume-queue entries point at those records)."""
    broker = harness.open(flaky=True)
    log, store = flaky_parts(harness)
    store.fail_after_writes = 1
    with pytest.raises(StorageError):
        broker.send_batch(mixed_batch())
    assert log.revokes == []
    assert [broker.status("t", m).status for m in ("now-1", "now-2", "later-1")] == [
        MessageStatus.DELIVERED, MessageStatus.DELIVERED, MessageStatus.SCHEDULED]
    broker.send(SendRequest(topic="t", body=b"x", msg_id="after"))  # replays: nothing to do
    assert broker.ready and broker.metrics.replayed.value == 0
    clock.advance(LATER_MS)
    broker.drain()
    expected = [("now-1", 0), ("now-2", 1), ("after", 2), ("later-1", 3)]
    assert [(m.msg_id, m.offset) for m in read_topic(broker, "t")] == expected
    broker.close()
    broker = harness.open()
    assert [(m.msg_id, m.offset) for m in read_topic(broker, "t")] == expected


def test_pure_batches_keep_the_replay_path(harness: Harness, clock: FakeClock) -> None:
    """All due now: a failed write is replayed (the 503 send may appear, at most once), as
    before; only mixed batches carry FLAG_BATCH."""
    broker = harness.open(flaky=True)
    log, store = flaky_parts(harness)
    store.fail_writes = 1
    with pytest.raises(StorageError):
        broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"d{i}") for i in range(3)])
    assert log.revokes == []
    again = broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"d{i}")
                               for i in range(3)])
    assert all(r.duplicate and r.status is MessageStatus.DELIVERED for r in again)
    assert broker.metrics.replayed.value == 3
    broker.send_batch(mixed_batch())
    clock.advance(LATER_MS)
    broker.drain()
    got = read_topic(broker, "t")
    assert [(m.msg_id, bool(m.flags & FLAG_BATCH)) for m in got] == [
        ("d0", False), ("d1", False), ("d2", False), ("now-1", True), ("now-2", True),
        ("later-1", False)]


# --- kill -9 between the append and the RocksDB write ------------------------------------------

def child(data_dir: str) -> None:
    from tests.scheduler.crash_child import DieAfterAppend

    holder: list[DieAfterAppend] = []

    def factory(directory: Path, cfg: EngineConfig) -> Log:
        holder.append(DieAfterAppend(open_commitlog(directory, cfg)))
        return holder[0]

    config = EngineConfig(data_dir=Path(data_dir), segment_size=1 << 20,
                          max_body_bytes=512 << 10, timer_shards=2)
    broker = Broker(config, FakeClock(START_MS), log_factory=factory)
    broker.start()
    broker.send(SendRequest(topic="t", body=b"x", msg_id="before"))
    results = broker.send_batch([SendRequest(topic="t", body=b"x", msg_id=f"s{i}",
                                             delay_ms=LATER_MS) for i in range(50)])
    print(" ".join(["before", *(r.msg_id for r in results)]), flush=True)  # acknowledged
    holder[0].armed = True
    broker.send_batch(mixed_batch())
    print("NOT KILLED", flush=True)


@pytest.mark.slow
def test_kill_9_between_the_append_and_the_write_leaves_none_of_the_batch(
        harness: Harness, clock: FakeClock) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.scheduler.test_batch_atomicity", str(harness.data_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    acknowledged = proc.stdout.split()
    assert len(acknowledged) == 51
    # the window: the batch's due-now records are in the log, past the applied position
    records = log_records(harness.data_dir)
    applied = applied_position(harness.data_dir)
    assert [(m, f & FLAG_BATCH) for p, m, f in records if p >= applied] == [
        ("now-1", FLAG_BATCH), ("now-2", FLAG_BATCH)]
    broker = harness.open()
    assert_none_of_it(broker)
    assert broker.metrics.replayed.value == 0
    assert [m for _, m, _ in log_records(harness.data_dir)] == ["before"]  # revoked
    clock.advance(LATER_MS)
    broker.drain()
    got = read_topic(broker, "t")
    assert sorted(m.msg_id for m in got) == sorted(acknowledged)  # each acknowledged once
    assert [m.offset for m in got] == list(range(51))
    resend_is_stored_once(broker, clock)


# --- CommitLog.revoke -------------------------------------------------------------------------

def test_revoke_across_a_segment_roll_and_the_checkpoint(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    kept, taken = [b"k%d" % i * 40 for i in range(5)], [b"t%d" % i * 90 for i in range(12)]
    with CommitLog(directory, segment_size=1024) as log:
        log.append_batch(kept)
        start = log.end_position
        positions = log.append_batch(taken)  # crosses at least one segment end
        assert positions[-1] >= 1024
        segments = sorted(p.name for p in directory.iterdir() if p.name[0].isdigit())
        log.flush()
        assert log.flushed_position == log.end_position
        with pytest.raises(InvalidArgument):
            log.revoke(positions[0] + 1)  # not a record boundary: changes nothing
        assert log.end_position > start and log.read(positions[-1]) == taken[-1]
        log.revoke(start)
        assert log.end_position == log.flushed_position == start
        assert sorted(p.name for p in directory.iterdir() if p.name[0].isdigit()) == \
            segments[:1]
        first = (directory / segments[0]).read_bytes()  # records and end-of-segment mark
        assert first[start:] == bytes(len(first) - start)  # are zeroed
        with pytest.raises(InvalidArgument):
            log.read(positions[0])
        log.revoke(start)  # at the end: nothing to do
        again = log.append_batch([b"new"])
        assert again == [start]
    with CommitLog(directory, segment_size=1024, full_check=True) as log:
        assert [bytes(p) for _, p in log.iter_from(0)] == [*kept, b"new"]
        assert log.verify().ok


def _spare_made(directory: Path, base: int) -> None:
    """Wait (bounded) for the background flusher to make the spare segment at ``base``."""
    deadline = time.monotonic() + 30
    while not (directory / f"{base:020d}").exists():
        assert time.monotonic() < deadline, "the flusher made no spare segment"
        time.sleep(0.005)


def test_revoke_drops_a_spare_segment_that_would_no_longer_follow_on(tmp_path: Path) -> None:
    """The flusher makes the next segment ahead of time; after a revoke that drops the
    segment it was made for, a left-over spare would be a gap that recovery refuses."""
    directory = tmp_path / "log"
    with CommitLog(directory, segment_size=1024, flush_interval_ms=1) as log:
        log.append_batch([b"a" * 400])  # under half of segment 0: no spare yet
        start, rolled = log.append_batch([b"b" * 200, b"b" * 600])
        assert rolled == 1024  # the second record opened segment 1
        _spare_made(directory, 2048)  # segment 1 is over half full
        log.revoke(start)  # back into segment 0: segment 1 goes, and so must the spare
        assert log.end_position == start
        with CommitLog(directory, segment_size=1024, read_only=True) as view:
            report = view.verify()  # what recovery would find after a kill -9 now
        assert report.ok and report.records == 1, report.errors
        log.append_batch([b"c" * 600])
    with CommitLog(directory, segment_size=1024) as reopened:
        assert [bytes(p) for _, p in reopened.iter_from(0)] == [b"a" * 400, b"c" * 600]


if __name__ == "__main__":
    child(sys.argv[1])


def test_a_batch_whose_marker_cancels_is_all_or_nothing(harness: Harness,
                                                         clock: FakeClock) -> None:
    """A due-now message and a cancel marker (TIMER_DEL_UNIQKEY) in one batch: when the
    write fails, neither the delivery nor the cancel happens, also after a restart."""
    broker = harness.open(flaky=True)
    log, store = flaky_parts(harness)
    broker.send(SendRequest(topic="t", body=b"x", msg_id="target", delay_ms=LATER_MS))
    batch = [SendRequest(topic="t", body=b"now", msg_id="now-1"),
             SendRequest(topic="t", body=b"", properties={"TIMER_DEL_UNIQKEY": "target"})]
    store.fail_writes = 1
    with pytest.raises(StorageError):
        broker.send_batch(batch)
    assert log.end_position == 0  # the due-now record was revoked, not left to replay
    broker.close()
    broker = harness.open()
    with pytest.raises(NotFound):
        broker.status("t", "now-1")
    assert broker.status("t", "target").status is MessageStatus.SCHEDULED
    results = broker.send_batch(batch)  # the retry does both
    assert results[1].cancel is not None and results[1].cancel.status == "CANCELLED"
    clock.advance(LATER_MS)
    broker.drain()
    assert [m.msg_id for m in read_topic(broker, "t")] == ["now-1"]
