"""Physical replication without NATS: a leader engine ships every write to an in-memory
stream, a follower's storage applies it; the logs are byte-identical and the answers equal."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from storage.constants import COMMITLOG_DIR
from storage.errors import NotLeader, ReplicationError
from storage.replication import applied_seq, settle_log
from tests.support.engine import START_MS, Harness, advance_until, read_topic
from tests.support.replication import MemoryStream, Pair, log_bytes, store_contents


def workload(broker: Broker, clock: FakeClock) -> None:
    """Sends (due now, scheduled, batches), cancels, a transaction committed and one rolled
    back, scanner deliveries, group receive/ack/nack and an offset commit."""
    broker.send_batch([SendRequest(topic="t", body=b"now-%d" % i, msg_id=f"n{i}")
                       for i in range(5)])
    broker.send_batch([SendRequest(topic="t", body=b"later-%d" % i, msg_id=f"d{i}",
                                   delay_ms=1000 + 10 * i) for i in range(20)])
    broker.send_batch([SendRequest(topic="u", body=b"mix", msg_id="u0"),
                       SendRequest(topic="u", body=b"mix", msg_id="u1", delay_ms=500)])
    broker.cancel("t", "d3")
    broker.send(SendRequest(topic="t", body=b"dup", msg_id="n0"))  # idempotent
    tx1 = broker.transactions.prepare(SendRequest(topic="t", body=b"tx1", msg_id="x1"),
                                     producer_group="pg")
    tx2 = broker.transactions.prepare(SendRequest(topic="t", body=b"tx2", msg_id="x2"),
                                     producer_group="pg")
    broker.transactions.commit(tx1.transaction_id)
    broker.transactions.rollback(tx2.transaction_id)
    clock.advance(2000)
    advance_until(clock, lambda: broker.end_offset("t") >= 5 + 19 + 1)
    g = broker.groups
    got = g.receive("t", "g", 6, 30_000)
    g.ack("t", "g", [m.receipt for m in got.messages[:3]])
    g.nack("t", "g", [got.messages[3].receipt])
    broker.groups.set_offset("u", "g2", 1)
    retry = g.topics("t", "g")[1]
    advance_until(clock, lambda: broker.end_offset(retry) >= 1, step=1000)


def test_a_follower_applying_the_stream_holds_the_same_log_bytes_and_answers(
        tmp_path: Path, clock: FakeClock, pair: Pair) -> None:
    stream, leader, follower = pair.stream, pair.leader, pair.follower
    workload(leader, clock)
    assert stream.records, "nothing was shipped"
    # the leader's maintenance thread may still be in a round the clock's last move woke
    # (a count fold, shipped as it lands): stopped first, so the follower catches up with
    # everything the leader wrote
    leader.parts.maintenance.stop()
    follower.catch_up(stream)
    end = leader.parts.log.end_position
    assert end > 0
    assert follower.log.end_position == end
    assert (log_bytes(tmp_path / "follower" / COMMITLOG_DIR, end)
            == log_bytes(tmp_path / "leader" / COMMITLOG_DIR, end))
    assert store_contents(follower.store) == store_contents(leader.parts.store)  # type: ignore[arg-type]
    assert applied_seq(follower.store) == len(stream.records)
    expected = {t: [(r.queue_offset, r.msg_id, r.body) for r in read_topic(leader, t)]
                for t in ("t", "u", leader.groups.topics("t", "g")[1])}
    assert all(expected.values()), expected  # every log has messages (the nack's retry too)
    statuses = {m: leader.status("t", m).status for m in ("n0", "d3", "d4", "x1", "x2")}
    pair.close()
    # the follower's data opened as an engine answers as the leader did
    harness = Harness(tmp_path / "follower", clock)
    try:
        again = harness.open()
        assert {t: [(r.queue_offset, r.msg_id, r.body) for r in read_topic(again, t)]
                for t in expected} == expected
        assert {m: again.status("t", m).status for m in statuses} == statuses
        assert again.groups.offset("u", "g2") == 1
    finally:
        harness.close_all()


def test_a_follower_refuses_writes_of_its_own_and_records_out_of_order(pair: Pair) -> None:
    stream, leader, follower = pair.stream, pair.leader, pair.follower
    leader.send(SendRequest(topic="t", body=b"a", msg_id="a"))
    leader.send(SendRequest(topic="t", body=b"b", msg_id="b"))
    with pytest.raises(NotLeader):
        follower.store.write(follower.store.batch())
    with pytest.raises(NotLeader):
        follower.log.append_batch([b"x"])
    assert follower.log.end_position == 0
    with pytest.raises(ReplicationError):
        follower.guard.apply(2, stream.records[1])  # 1 first
    follower.catch_up(stream)
    assert follower.guard.seq == len(stream.records)


def test_a_refused_publish_deposes_the_leader_and_revokes_its_unpublished_tail(
        pair: Pair) -> None:
    stream, leader, reps = pair.stream, pair.leader, pair.replicators
    leader.send(SendRequest(topic="t", body=b"a", msg_id="a"))
    end = leader.parts.log.end_position
    shipped = len(stream.records)
    stream.refuse_next = 1
    with pytest.raises(NotLeader):
        leader.send(SendRequest(topic="t", body=b"b", msg_id="b"))
    assert reps[-1].deposed is not None
    assert leader.parts.log.end_position == end
    with pytest.raises(NotLeader):  # for good: no write, no append
        leader.send(SendRequest(topic="t", body=b"c", msg_id="c"))
    assert leader.parts.log.end_position == end
    assert len(stream.records) == shipped
    assert [r.msg_id for r in read_topic(leader, "t")] == ["a"]


def test_a_restarting_node_cuts_the_log_tail_it_never_applied(pair: Pair) -> None:
    pair.leader.send(SendRequest(topic="t", body=b"a", msg_id="a"))
    follower = pair.follower
    follower.catch_up(pair.stream)
    end = follower.log.end_position
    follower.guard._applying = True  # a tail appended, never recorded (crash before write)
    follower.log.append_batch([b"torn"])
    follower.guard._applying = False
    assert follower.log.end_position > end
    assert settle_log(follower.store, follower.log) > 0
    assert follower.log.end_position == end


def test_single_node_mode_captures_nothing(tmp_path: Path) -> None:
    from storage.rocks import RocksStore

    store = RocksStore(tmp_path / "db", timer_shards=1)
    try:
        assert store.batch().ops is None
    finally:
        store.close()


assert START_MS  # (the shared fake clock starts there)


def test_a_record_larger_than_a_stream_message_goes_in_pieces(
        tmp_path: Path, small_messages_pair: Pair) -> None:
    stream, leader = small_messages_pair.stream, small_messages_pair.leader
    follower = small_messages_pair.follower
    leader.send_batch([SendRequest(topic="t", body=b"%04d" % i * 500, msg_id=f"b{i}")
                       for i in range(100)])  # ~200 KB: one record, a dozen messages
    assert len(stream.records) > 10
    assert all(len(m) <= stream.max_bytes for m in stream.records)
    follower.catch_up(stream)
    assert follower.guard.seq == len(stream.records)
    end = leader.parts.log.end_position
    assert (log_bytes(tmp_path / "follower" / COMMITLOG_DIR, end)
            == log_bytes(tmp_path / "leader" / COMMITLOG_DIR, end))


def test_pieces_of_a_record_its_leader_never_finished_are_dropped(pair: Pair) -> None:
    from storage.replication import LeaderReplicator, encode_record, stream_messages

    stream, leader, follower = pair.stream, pair.leader, pair.follower
    leader.send(SendRequest(topic="t", body=b"a", msg_id="a"))
    follower.catch_up(stream)
    applied = follower.guard.seq
    # a dead leader's unfinished record: its first two pieces only
    pieces = stream_messages(encode_record([], [(0, "meta", b"k", b"v" * 300)]), 100)
    stream.records += pieces[:2]
    follower.catch_up(stream)
    assert follower.guard.seq == applied and follower.guard.consumed == len(stream.records)
    # the next leader goes on after them: its record is applied, the pieces never
    rep = LeaderReplicator(leader.parts.store, leader.parts.log, stream,  # type: ignore[arg-type]
                           last_seq=len(stream.records))
    batch = leader.parts.store.batch()
    batch.ops = []
    rep.write(batch, None)
    follower.catch_up(stream)
    assert follower.guard.seq == len(stream.records)
    assert follower.store.get("meta", b"k") is None


def test_a_batch_made_before_the_replicator_was_attached_is_refused(tmp_path: Path) -> None:
    from storage.commitlog import CommitLog
    from storage.replication import LeaderReplicator
    from storage.rocks import RocksStore

    store = RocksStore(tmp_path / "db", timer_shards=1)
    log = CommitLog(tmp_path / "log", segment_size=4096)
    stream = MemoryStream()
    try:
        early = store.batch()  # captures nothing
        early.put("meta", b"k", b"v")
        rep = LeaderReplicator(store, log, stream)
        store.attach_replicator(rep)
        with pytest.raises(ReplicationError):
            store.write(early)
        assert stream.records == [] and store.get("meta", b"k") is None
        assert rep.deposed is None
    finally:
        log.close()
        store.close()


def test_a_log_is_cut_back_to_where_an_append_that_rolled_over_began(tmp_path: Path) -> None:
    """settle_log / a deposed leader cut the log back to the end recorded with the last
    record; when the next append had rolled over to a new segment, an end-of-segment header
    sits there: the cut takes it too, and the same append then lands where it did."""
    from storage.commitlog import CommitLog

    log = CommitLog(tmp_path / "log", segment_size=256)
    try:
        log.append_batch([b"a" * 100])
        end = log.end_position
        positions = log.append_batch([b"b" * 150])  # does not fit: rolls over
        assert positions[0] == 256 and end < 256
        log.revoke(end)
        assert log.end_position == end
        assert log.append_batch([b"b" * 150]) == positions
        assert log.read(positions[0]) == b"b" * 150
    finally:
        log.close()


def test_a_leader_whose_lease_lapsed_hands_out_nothing_and_a_follower_neither(
        clock: FakeClock, pair: Pair) -> None:
    """Leases live in the leader's memory only: a leader paused past its lease and resumed
    must not hand out what the next leader may have had acknowledged meanwhile."""
    stream, leader, follower = pair.stream, pair.leader, pair.follower
    leader.send_batch([SendRequest(topic="t", body=b"m%d" % i, msg_id=f"m{i}")
                       for i in range(4)])
    advance_until(clock, lambda: leader.end_offset("t") >= 4)
    assert len(leader.groups.receive("t", "g", 2, 30_000).messages) == 2
    stream.lease_lapsed = True
    with pytest.raises(NotLeader):
        leader.groups.receive("t", "g", 2, 30_000)
    stream.lease_lapsed = False  # (renewed)
    assert len(leader.groups.receive("t", "g", 2, 30_000).messages) == 2
    follower.catch_up(stream)
    with pytest.raises(NotLeader):
        follower.store.check_leading()
