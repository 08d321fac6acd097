"""ConsumeQueue over the cq column family, with a real CommitLog for rebuild."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.commitlog import CommitLog
from storage.constants import CF_CQ
from storage.consume_queue import ConsumeQueue, CqEntry, rebuild
from storage.errors import CorruptionError, InvalidArgument
from storage.keys import cq_key
from storage.records import LogRecord, encode_log_record
from storage.rocks import RocksStore


def _fill(store: RocksStore, topic: str, n: int, base: int = 0) -> None:
    b = store.batch()
    ConsumeQueue.put_many(b, topic, [(i, base + i * 100, 90 + i % 7) for i in range(n)])
    store.write(b)


def test_read_and_end_offset(store: RocksStore) -> None:
    cq = ConsumeQueue(store)
    assert cq.end_offset("orders") == 0
    assert cq.read("orders", 0, 10) == []
    _fill(store, "orders", 500)
    _fill(store, "orders.eu", 7, base=10**6)  # a topic that extends "orders"
    _fill(store, "order", 3, base=10**7)  # a topic that "orders" extends
    cq.forget()  # (written around it: end offsets are read again)
    assert cq.end_offset("orders") == 500
    assert cq.end_offset("orders.eu") == 7
    assert cq.end_offset("order") == 3
    got = cq.read("orders", 100, 50)
    assert got == [CqEntry(queue_offset=i, position=i * 100, size=90 + i % 7)
                   for i in range(100, 150)]
    assert [e.queue_offset for e in cq.read("orders", 495, 100)] == list(range(495, 500))
    assert cq.read("orders", 500, 10) == []
    b = store.batch()
    ConsumeQueue.put(b, "orders", 500, 123, 4)
    store.write(b)
    assert cq.end_offset("orders") == 500  # until told: the committer does (landed)
    cq.landed({"orders": 501})
    assert cq.end_offset("orders") == 501
    assert cq.read("orders", 500, 1) == [CqEntry(queue_offset=500, position=123, size=4)]
    for offset, n in ((0, 1000), (100, 50), (495, 100), (501, 10), (0, 0)):
        assert cq.positions("orders", offset, n) == [e.position for e in cq.read(
            "orders", offset, n)]


def test_end_offsets_are_read_once_then_noted(store: RocksStore) -> None:
    cq = ConsumeQueue(store)
    _fill(store, "a", 40)
    reads: list[str] = []
    read_end = cq._read_end
    cq._read_end = lambda topic: reads.append(topic) or read_end(topic)  # type: ignore[method-assign]
    assert [cq.end_offset("a") for _ in range(3)] == [40, 40, 40]
    assert reads == ["a"]
    cq.landed({"a": 45, "b": 3})
    assert (cq.end_offset("a"), cq.end_offset("b")) == (45, 3)
    assert reads == ["a"]
    cq.forget()
    assert (cq.end_offset("a"), cq.end_offset("b")) == (40, 0)  # what RocksDB holds
    assert reads == ["a", "a", "b"]


def test_a_write_landing_during_a_read_wins(store: RocksStore) -> None:
    """A reader that read RocksDB before the committer noted a later end does not put its
    older figure back; one that read before a ``forget`` keeps nothing."""
    cq = ConsumeQueue(store)
    _fill(store, "a", 10)
    read_end = cq._read_end

    def landed_meanwhile(topic: str) -> int:
        end = read_end(topic)
        cq.landed({topic: 25})
        return end

    cq._read_end = landed_meanwhile  # type: ignore[method-assign]
    assert cq.end_offset("a") == 25
    cq._read_end = read_end  # type: ignore[method-assign]
    assert cq.end_offset("a") == 25

    def forgotten_meanwhile(topic: str) -> int:
        end = read_end(topic)
        cq.forget()
        return end + 1000  # (what a read racing a revoke might have seen)

    cq.forget()
    cq._read_end = forgotten_meanwhile  # type: ignore[method-assign]
    assert cq.end_offset("a") == 1010  # this caller's answer ...
    cq._read_end = read_end  # type: ignore[method-assign]
    assert cq.end_offset("a") == 10  # ... is not kept


def test_a_malformed_entry_is_corruption(store: RocksStore) -> None:
    _fill(store, "t", 10)
    cq = ConsumeQueue(store)
    b = store.batch()
    b.put(CF_CQ, cq_key("t", 10), b"\x00" * 11)  # one byte short of position + size
    store.write(b)
    for read in (cq.read, cq.positions):
        with pytest.raises(CorruptionError, match="malformed"):
            read("t", 0, 20)
    with pytest.raises(CorruptionError, match="malformed"):
        cq.end_offset("t")
    assert cq.positions("t", 5, 5) == [i * 100 for i in range(5, 10)]  # not reaching it


def test_a_commit_writes_one_run_and_reads_cut_it_anywhere(store: RocksStore) -> None:
    """Consecutive offsets are ONE stored entry (a run); runs of one (replay, older stores)
    and runs of many read alike, from any offset, across run boundaries."""
    b = store.batch()
    ConsumeQueue.put_many(b, "t", [(i, 1000 + i, 10 + i) for i in range(100)])
    ConsumeQueue.put(b, "t", 100, 2000, 5)  # a replayed record: a run of one
    ConsumeQueue.put_many(b, "t", [(i, 3000 + i, 7) for i in (101, 102, 104, 105)])
    store.write(b)
    assert len(list(store.scan(CF_CQ))) == 4  # [0..99], [100], [101, 102], [104, 105]
    cq = ConsumeQueue(store)
    assert cq.end_offset("t") == 106
    expected = ([CqEntry(queue_offset=i, position=1000 + i, size=10 + i) for i in range(100)]
                + [CqEntry(queue_offset=100, position=2000, size=5)]
                + [CqEntry(queue_offset=i, position=3000 + i, size=7)
                   for i in (101, 102, 104, 105)])
    for offset in (0, 1, 37, 99, 100, 101, 103, 104, 105, 106):
        for n in (1, 2, 5, 64, 200):
            want = [e for e in expected if offset <= e.queue_offset < offset + n]
            assert cq.read("t", offset, n) == want, (offset, n)
            assert cq.positions("t", offset, n) == [e.position for e in want]


def test_a_run_from_columns_is_the_run_of_its_entries(store: RocksStore) -> None:
    """``put_run`` (a delivery commit of one topic) stores what ``put_many`` stores for the
    same consecutive entries: one key, the same value."""
    positions, sizes = [5000 + 37 * i for i in range(50)], [30 + i % 9 for i in range(50)]
    b = store.batch()
    ConsumeQueue.put_run(b, "a", 7, positions, sizes)
    ConsumeQueue.put_many(b, "b", list(zip(range(7, 57), positions, sizes, strict=True)))
    store.write(b)
    runs = {key[:1]: (key[1:], value) for key, value in store.scan(CF_CQ)}
    assert runs[b"a"] == runs[b"b"] and len(runs) == 2
    assert ConsumeQueue(store).positions("a", 0, 100) == positions
    b = store.batch()
    with pytest.raises(InvalidArgument):
        ConsumeQueue.put_run(b, "t", 0, [1, 2], [10, 1 << 32])
    with pytest.raises(InvalidArgument):
        ConsumeQueue.put_run(b, "bad\x00topic", 0, [1], [10])
    assert len(b) == 0


def test_read_costs_two_seeks_and_a_step_per_run(store: RocksStore) -> None:
    _fill(store, "t", 20_000)  # one run
    b = store.batch()
    for i in range(1000):  # runs of one, as replays and stores before runs wrote them
        ConsumeQueue.put(b, "u", i, i * 100, 10)
    store.write(b)
    cq = ConsumeQueue(store)
    for topic, offset, steps in (("t", 10_000, 2), ("u", 500, 101)):
        before = store.statistics()
        assert len(cq.read(topic, offset, 100)) == 100
        after = store.statistics()
        seeks = after["rocksdb.number.db.seek"] - before["rocksdb.number.db.seek"]
        assert seeks <= 2, seeks  # the run holding the offset (backwards), then forwards
        nexts = (after["rocksdb.number.db.next"] - before["rocksdb.number.db.next"]
                 + after["rocksdb.number.db.prev"] - before["rocksdb.number.db.prev"])
        assert nexts <= steps, nexts


def test_bad_input_changes_nothing(store: RocksStore) -> None:
    b = store.batch()
    with pytest.raises(InvalidArgument):
        ConsumeQueue.put(b, "t", 0, -1, 10)
    with pytest.raises(InvalidArgument):
        ConsumeQueue.put(b, "bad\x00topic", 0, 1, 10)
    with pytest.raises(InvalidArgument):
        ConsumeQueue.put_many(b, "t", [(0, 1, 1 << 32)])
    assert len(b) == 0
    with pytest.raises(InvalidArgument):
        ConsumeQueue(store).read("t", -1, 5)


def test_rebuild_from_the_log(store: RocksStore, tmp_path: Path) -> None:
    records = [
        LogRecord(topic=t, msg_id=f"m{i}", queue_offset=i // 2, body=b"x" * i)
        for i in range(300) for t in (("a", "b")[i % 2],)
    ]
    with CommitLog(tmp_path / "log", segment_size=4096) as log:
        payloads = [encode_log_record(r) for r in records]
        positions = log.append_batch(payloads)
        assert rebuild(store, log) == 300
        cq = ConsumeQueue(store)
        assert cq.end_offset("a") == 150 and cq.end_offset("b") == 150
        a = cq.read("a", 0, 1000)
        assert [e.position for e in a] == positions[0::2]
        assert [e.size for e in a] == [len(p) for p in payloads[0::2]]
        assert [log.read(e.position) for e in cq.read("b", 10, 3)] == payloads[21:27:2]
        # idempotent, and a partial rebuild only touches what follows from_position
        keys_before = list(store.scan(CF_CQ))
        assert rebuild(store, log) == 300
        assert rebuild(store, log, from_position=positions[200]) == 100
        assert list(store.scan(CF_CQ)) == keys_before


def test_group_offsets_are_per_topic_and_group_and_survive_a_reopen(tmp_path: Path) -> None:
    with RocksStore(tmp_path / "db", timer_shards=1) as store:
        queue = ConsumeQueue(store)
        assert queue.group_offset("orders", "billing") == 0  # before its first commit
        b = store.batch()
        ConsumeQueue.put_group_offset(b, "orders", "billing", 42)
        ConsumeQueue.put_group_offset(b, "orders", "audit", 7)
        ConsumeQueue.put_group_offset(b, "refunds", "billing", 3)
        store.write(b, sync=True)
    with RocksStore(tmp_path / "db", timer_shards=1) as store:
        queue = ConsumeQueue(store)
        assert [queue.group_offset("orders", "billing"), queue.group_offset("orders", "audit"),
                queue.group_offset("refunds", "billing"), queue.group_offset("refunds", "audit")
                ] == [42, 7, 3, 0]


def _land(store: RocksStore, cq: ConsumeQueue, topic: str, first: int, count: int,
          *, gap_at: int | None = None) -> list[CqEntry]:
    """Store entries ``first`` .. ``first + count - 1`` of ``topic`` as the committer does
    (put_run, or put_many with offset ``gap_at`` left out), then note them landed."""
    entries = [(o, 10_000 * o + len(topic), 50 + o % 13) for o in range(first, first + count)
               if o != gap_at]
    b = store.batch()
    if gap_at is None:
        runs = ConsumeQueue.put_run(b, topic, first, [e[1] for e in entries],
                                    [e[2] for e in entries])
    else:
        runs = ConsumeQueue.put_many(b, topic, entries)
    store.write(b)
    cq.landed({topic: first + count}, runs)
    return [CqEntry(queue_offset=o, position=p, size=s) for o, p, s in entries]


class _NoRocks:
    """Counts the RocksDB reads a ConsumeQueue makes (``read_range``), or refuses them."""

    def __init__(self, store: RocksStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.refuse = False
        real = store.read_range

        def read_range(*args: object, **kwargs: object) -> object:
            self.calls += 1
            assert not self.refuse, "a read of the tail went to RocksDB"
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(store, "read_range", read_range)


def test_the_newest_entries_are_read_from_memory(
        store: RocksStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the last commits landed is answered from the tail: a reader that keeps up (a
    stream, a long poll) costs no RocksDB read; older entries, and everything after a
    ``forget``, come from RocksDB, the same."""
    monkeypatch.setattr("storage.consume_queue.TAIL_ENTRIES", 100)
    cq = ConsumeQueue(store)
    stored = _land(store, cq, "t", 0, 80) + _land(store, cq, "t", 80, 50)  # tail: 30..129
    rocks = _NoRocks(store, monkeypatch)
    rocks.refuse = True
    for offset, n in ((30, 100), (129, 1), (100, 1000), (130, 5), (10**6, 3), (129, 0)):
        assert cq.read("t", offset, n) == stored[offset:offset + n], (offset, n)
        assert cq.positions("t", offset, n) == [e.position for e in stored[offset:offset + n]]
    rocks.refuse = False
    assert cq.read("t", 29, 2) == stored[29:31] and rocks.calls == 2  # before the tail
    cq.forget()
    assert cq.read("t", 120, 5) == stored[120:125] and rocks.calls == 4


def test_the_tail_answers_only_while_it_ends_at_the_end(
        store: RocksStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries landed without their runs (a writer that noted only the end) are newer than
    the tail: it no longer answers, RocksDB does."""
    cq = ConsumeQueue(store)
    stored = _land(store, cq, "t", 0, 10)
    b = store.batch()
    ConsumeQueue.put(b, "t", 10, 777, 7)
    store.write(b)
    cq.landed({"t": 11})
    rocks = _NoRocks(store, monkeypatch)
    assert cq.read("t", 5, 10) == [*stored[5:], CqEntry(queue_offset=10, position=777, size=7)]
    assert rocks.calls == 2


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commits=st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 40),
                                  st.integers(0, 45)), min_size=1, max_size=25),
       reads=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 400),
                                st.integers(0, 60)), min_size=1, max_size=20))
def test_reads_through_the_tail_equal_reads_from_rocksdb(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
        commits: list[tuple[str, int, int]], reads: list[tuple[str, int, int]]) -> None:
    """Commits of runs (some with a gap: several runs), small tails for few topics (so
    they are cut and dropped): every read answers what a ConsumeQueue without a tail reads
    from RocksDB."""
    monkeypatch.setattr("storage.consume_queue.TAIL_ENTRIES", 32)
    monkeypatch.setattr("storage.consume_queue.TAIL_TOPICS", 2)
    with RocksStore(tmp_path_factory.mktemp("cq") / "db", timer_shards=1) as store:
        cq = ConsumeQueue(store)
        ends = {"a": 0, "b": 0, "c": 0}
        for topic, count, gap in commits:
            first = ends[topic]
            _land(store, cq, topic, first, count, gap_at=first + gap if gap < count else None)
            ends[topic] = first + count
            for topic_, offset, n in reads:
                want = ConsumeQueue(store).read(topic_, offset, n)
                assert cq.read(topic_, offset, n) == want
                assert cq.positions(topic_, offset, n) == [e.position for e in want]
