"""Consumer groups with competing members, in the engine: leases, acks, nacks through the
scheduler, dead letters, bounds (scheduler/groups.py). Real RocksDB and CommitLog, fake clock."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.group_state import ack_prefix, retry_topic
from scheduler.groups import GroupManager
from scheduler.model import SendRequest
from storage.constants import CF_META
from storage.errors import InvalidArgument, NotFound, StorageError
from tests.support.engine import Harness, read_topic, run_threads

LEASE = 30_000
LEVELS_MS = [1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000,
             360_000, 420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000,
             7_200_000]


def send(broker: Broker, n: int, topic: str = "t", start: int = 0) -> None:
    broker.send_batch([SendRequest(topic=topic, body=f"m{i}".encode(), msg_id=f"m{i}",
                                   properties={"k": str(i)}) for i in range(start, start + n)])


def groups(broker: Broker) -> GroupManager:
    return broker.groups


def test_receive_leases_each_message_to_one_member_until_the_lease_ends(
        broker: Broker, clock: FakeClock) -> None:
    send(broker, 10)
    g = groups(broker)
    first = g.receive("t", "g", 4, LEASE)
    second = g.receive("t", "g", 10, LEASE)
    assert [m.record.msg_id for m in first.messages] == [f"m{i}" for i in range(4)]
    assert [m.record.msg_id for m in second.messages] == [f"m{i}" for i in range(4, 10)]
    assert first.lease_until == clock.now_ms() + LEASE
    assert all(m.delivery_count == 1 and m.reconsume_times == 0 for m in first.messages)
    assert g.receive("t", "g", 10, LEASE).messages == []
    clock.advance(LEASE - 1)
    assert g.receive("t", "g", 10, LEASE).messages == []  # every lease still holds
    assert g.state("t", "g").leased == 10
    clock.advance(1)
    again = g.receive("t", "g", 10, LEASE)  # expired: handed out again, oldest first
    assert [m.record.msg_id for m in again.messages] == [f"m{i}" for i in range(10)]
    assert all(m.delivery_count == 2 for m in again.messages)
    assert g.stats()["t/g"].redelivered == 10
    # another group reads the same topic on its own
    assert len(g.receive("t", "other", 10, LEASE).messages) == 10


def test_acks_fill_gaps_into_the_committed_offset_and_survive_a_restart(
        harness: Harness, clock: FakeClock) -> None:
    broker = harness.open()
    send(broker, 6)
    got = groups(broker).receive("t", "g", 6, LEASE).messages
    receipts = [m.receipt for m in got]
    result = groups(broker).ack("t", "g", [receipts[1], receipts[3]])
    assert (result.acked, result.stale) == (2, [])
    assert broker.groups.offset("t", "g") == 0  # offset 0 is still out
    broker.close()
    broker = harness.open()  # leases are gone; acks are not
    state = groups(broker).state("t", "g")
    assert (state.committed_offset, state.end_offset, state.leased) == (0, 6, 0)
    # a receipt from before the restart still acknowledges while nobody holds the message
    assert groups(broker).ack("t", "g", [receipts[0]]).acked == 1
    assert broker.groups.offset("t", "g") == 2
    again = groups(broker).receive("t", "g", 10, LEASE).messages
    assert [m.record.queue_offset for m in again] == [2, 4, 5]
    assert groups(broker).ack("t", "g", [receipts[2]]).stale == [receipts[2]]  # held again
    assert groups(broker).ack("t", "g", [m.receipt for m in again]).acked == 3
    assert broker.groups.offset("t", "g") == 6
    broker.close()
    broker = harness.open()
    assert groups(broker).receive("t", "g", 10, LEASE).messages == []
    assert broker.pull("t", broker.groups.offset("t", "g"), 10).messages == []


def test_a_stale_receipt_changes_nothing(broker: Broker, clock: FakeClock) -> None:
    send(broker, 1)
    g = groups(broker)
    (old,) = g.receive("t", "g", 1, 1_000).messages
    clock.advance(1_000)
    (new,) = g.receive("t", "g", 1, LEASE).messages  # the lease expired; leased again
    assert new.delivery_count == 2
    assert g.ack("t", "g", [old.receipt]).stale == [old.receipt]
    nacked = g.nack("t", "g", [old.receipt])
    assert (nacked.retrying, nacked.stale) == (0, [old.receipt])
    assert g.state("t", "g").leased == 1
    assert g.ack("t", "g", [new.receipt, new.receipt]).acked == 1  # a repeat is stale
    assert g.ack("t", "g", [new.receipt]).stale == [new.receipt]
    assert broker.groups.offset("t", "g") == 1


def test_bad_receipts_are_rejected_before_anything_changes(broker: Broker) -> None:
    send(broker, 2)
    g = groups(broker)
    a, b = g.receive("t", "g", 2, LEASE).messages
    (other,) = g.receive("t", "h", 1, LEASE).messages
    send(broker, 1, topic="u")
    (other_topic,) = g.receive("u", "g", 1, LEASE).messages
    for bad in ("", "not-a-receipt", a.receipt[:-2], "!" * len(a.receipt)):
        with pytest.raises(InvalidArgument):
            g.ack("t", "g", [a.receipt, bad])
    for foreign in (other.receipt, other_topic.receipt):
        with pytest.raises(NotFound):
            g.ack("t", "g", [a.receipt, foreign])
        with pytest.raises(NotFound):
            g.nack("t", "g", [b.receipt, foreign])
    with pytest.raises(InvalidArgument):
        g.ack("t", "g", [])
    with pytest.raises(InvalidArgument):
        g.ack("t", "g", [a.receipt] * 1001)
    with pytest.raises(InvalidArgument):
        g.nack("t", "g", [a.receipt], delay_ms=5, delay_level=2)
    with pytest.raises(InvalidArgument):
        g.receive("t", "g", 1, 999)
    with pytest.raises(InvalidArgument):
        g.receive("t", "g", 1001, LEASE)
    state = g.state("t", "g")
    assert (state.committed_offset, state.leased, state.retrying) == (0, 2, 0)
    assert g.ack("t", "g", [a.receipt, b.receipt]).acked == 2


def test_the_default_nack_schedule_is_rocketmq_levels_3_to_18_then_a_dead_letter(
        broker: Broker, clock: FakeClock) -> None:
    send(broker, 1)
    g = groups(broker)
    (message,) = g.receive("t", "g", 1, LEASE).messages
    waits = []
    for failure in range(16):
        nacked_at = clock.now_ms()
        assert g.nack("t", "g", [message.receipt]).retrying == 1
        assert g.state("t", "g").retrying == 1
        clock.advance(LEVELS_MS[2 + failure] - 1)
        broker.drain()
        assert g.receive("t", "g", 1, LEASE).messages == []  # not a ms early
        clock.advance(1)
        broker.drain()
        (message,) = g.receive("t", "g", 1, LEASE).messages
        waits.append(clock.now_ms() - nacked_at)
        assert (message.record.msg_id, message.record.topic, message.record.offset) == \
            ("m0", "t", 0)
        assert message.record.body == b"m0"
        assert dict(message.record.properties) == {"k": "0"}
        assert (message.reconsume_times, message.delivery_count) == (failure + 1, 1)
    assert waits == LEVELS_MS[2:18]
    dead = g.nack("t", "g", [message.receipt])  # the 17th failure
    assert (dead.retrying, dead.dead_lettered) == (0, 1)
    state = g.state("t", "g")
    assert (state.retrying, state.dead_lettered, state.committed_offset) == (0, 1, 1)
    clock.advance(LEVELS_MS[-1])
    broker.drain()
    assert g.receive("t", "g", 1, LEASE).messages == []
    letters = g.dead_letters("t", "g", None, 10)
    ((letter, times),) = letters.messages
    assert (letter.msg_id, letter.body, times, dict(letter.properties)) == \
        ("m0", b"m0", 16, {"k": "0"})
    assert letters.next_offset == 1
    assert g.redrive("t", "g", 10) == 1
    assert g.redrive("t", "g", 10) == 0
    state = g.state("t", "g")
    assert (state.retrying, state.dead_lettered) == (1, 0)
    (back,) = g.receive("t", "g", 1, LEASE).messages  # redriven: due at once
    assert (back.record.msg_id, back.reconsume_times) == ("m0", 0)
    assert g.ack("t", "g", [back.receipt]).acked == 1
    assert g.state("t", "g").retrying == 0


def test_nack_at_a_given_level_or_delay_and_max_reconsume_times(
        harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(max_reconsume_times=1)
    send(broker, 2)
    g = groups(broker)
    a, b = g.receive("t", "g", 2, LEASE).messages
    assert g.nack("t", "g", [a.receipt], delay_level=1).retrying == 1
    assert g.nack("t", "g", [b.receipt], delay_ms=2_500).retrying == 1
    clock.advance(1_000)
    broker.drain()
    assert [m.record.msg_id for m in g.receive("t", "g", 5, LEASE).messages] == ["m0"]
    clock.advance(1_500)
    broker.drain()
    (again,) = g.receive("t", "g", 5, LEASE).messages
    assert again.record.msg_id == "m1"
    assert g.nack("t", "g", [again.receipt]).dead_lettered == 1  # max_reconsume_times=1


def test_a_nack_whose_write_fails_changes_nothing_also_after_replay(
        harness: Harness, clock: FakeClock) -> None:
    """The retry is due at once (delayMs 0), so it is appended to the log before the RocksDB
    write that also acks the original: when that write fails, the retry must not be
    replayed into the log on its own (the original is still unacknowledged: a duplicate)."""
    broker = harness.open(flaky=True)
    store = harness.store
    assert store is not None
    send(broker, 1)
    g = groups(broker)
    (message,) = g.receive("t", "g", 1, LEASE).messages
    store.fail_writes = 1
    with pytest.raises(StorageError):
        g.nack("t", "g", [message.receipt], delay_ms=0)
    send(broker, 1, start=1)  # the next commit replays whatever needs it
    assert read_topic(broker, retry_topic("t", "g")) == []
    assert g.state("t", "g").retrying == 0
    broker.close()
    broker = harness.open()
    assert read_topic(broker, retry_topic("t", "g")) == []
    got = groups(broker).receive("t", "g", 5, LEASE).messages
    assert [m.record.msg_id for m in got] == ["m0", "m1"]
    assert groups(broker).nack("t", "g", [got[0].receipt], delay_ms=0).retrying == 1
    (retry,) = groups(broker).receive("t", "g", 5, LEASE).messages
    assert (retry.record.msg_id, retry.reconsume_times) == ("m0", 1)


def test_leases_and_acks_stay_within_the_window(harness: Harness) -> None:
    broker = harness.open(group_lease_window=5)
    send(broker, 20)
    g = groups(broker)
    got = g.receive("t", "g", 20, LEASE).messages
    assert len(got) == 5
    assert g.ack("t", "g", [m.receipt for m in got[1:]]).acked == 4
    assert g.receive("t", "g", 20, LEASE).messages == []  # offset 0 holds the window
    assert g.ack("t", "g", [got[0].receipt]).acked == 1
    assert [m.record.offset for m in g.receive("t", "g", 20, LEASE).messages] == \
        list(range(5, 10))


def test_an_offset_commit_moves_the_group_and_ends_its_leases(broker: Broker) -> None:
    send(broker, 5)
    g = groups(broker)
    got = g.receive("t", "g", 2, LEASE).messages
    assert g.ack("t", "g", [got[1].receipt]).acked == 1
    assert broker.groups.set_offset("t", "g", 3) == 3
    assert g.state("t", "g").leased == 0
    assert g.ack("t", "g", [got[0].receipt]).stale == [got[0].receipt]  # below the offset
    assert [m.record.offset for m in g.receive("t", "g", 5, LEASE).messages] == [3, 4]
    assert broker.groups.set_offset("t", "g", 0) == 0  # replay
    assert [m.record.offset for m in g.receive("t", "g", 5, LEASE).messages] == \
        [0, 1, 2, 3, 4]  # the leases of 3 and 4 ended too
    with pytest.raises(InvalidArgument):
        broker.groups.set_offset("t", "g", 6)


def test_competing_members_in_threads_each_message_acknowledged_once(
        harness: Harness, clock: FakeClock) -> None:
    broker = harness.open(group_lease_window=64)
    total = 600
    send(broker, total)
    g = groups(broker)
    acked: Counter[str] = Counter()
    nacked: set[str] = set()
    held: dict[int, int] = {}  # offset -> member holding it right now
    lock = threading.Lock()

    def member(n: int) -> None:
        while True:
            got = g.receive("t", "g", 16, LEASE).messages
            if not got:
                if g.state("t", "g").committed_offset == total and \
                        g.state("t", "g").retrying == 0:
                    return
                time.sleep(0.001)  # others hold the rest: let them finish
                continue
            with lock:
                for m in got:
                    assert m.record.offset not in held, "two members hold one message"
                    held[m.record.offset] = n
            done, later = [], []
            for m in got:
                # every 7th message fails once, then succeeds on its retry
                if m.record.offset % 7 == 0 and m.reconsume_times == 0:
                    later.append(m)
                else:
                    done.append(m)
            with lock:  # released before the ack/nack answers: no longer held after it
                for m in got:
                    del held[m.record.offset]
                acked.update(m.record.msg_id for m in done)
                nacked.update(m.record.msg_id for m in later)
            if done:
                assert g.ack("t", "g", [m.receipt for m in done]).acked == len(done)
            if later:
                assert g.nack("t", "g", [m.receipt for m in later], delay_ms=0).retrying \
                    == len(later)

    run_threads([lambda n=n: member(n) for n in range(4)])
    assert acked == Counter({f"m{i}": 1 for i in range(total)})
    assert nacked == {f"m{i}" for i in range(0, total, 7)}
    state = g.state("t", "g")
    assert (state.committed_offset, state.leased, state.retrying) == (total, 0, 0)


def test_the_lease_bookkeeping_stays_bounded_however_long_members_run(
        harness: Harness) -> None:
    broker = harness.open(group_lease_window=8)
    send(broker, 1_000)
    g = groups(broker)
    state = g._group("t", "g")
    for _ in range(900):  # one lease per receive: acked leases leave the expiry list
        (got,) = g.receive("t", "g", 1, LEASE).messages
        assert g.ack("t", "g", [got.receipt]).acked == 1
        assert len(state.expiry) <= 65
    stuck = g.receive("t", "g", 1, LEASE).messages  # offset 900 is not acknowledged for now
    for _ in range(200):
        got = g.receive("t", "g", 1, LEASE).messages
        if got:
            g.ack("t", "g", [got[0].receipt])
        assert sum(len(s.leases) + len(s.acked) + len(s.returned) for s in state.streams) <= 8
    assert g.state("t", "g").committed_offset == 900
    assert len(state.streams[0].acked) == 7  # the window: 901..907 wait for 900
    g.ack("t", "g", [stuck[0].receipt])
    assert g.state("t", "g").committed_offset == 908
    assert not state.streams[0].acked


def ack_keys(broker: Broker, topic: str = "t", group: str = "g") -> dict[int, int]:
    """The ack keys RocksDB holds for the group: first offset -> end of each run."""
    from scheduler.group_state import ack_prefix
    from storage.constants import CF_META
    from storage.keys import unpack_u64

    store = broker.parts.store
    assert store is not None
    prefix = ack_prefix(topic, group)
    return {unpack_u64(k, len(prefix)): unpack_u64(v) if v else unpack_u64(k, len(prefix)) + 1
            for k, v in store.scan(CF_META, prefix, prefix + b"\xff")}


def test_acks_out_of_order_are_stored_a_key_per_run_and_survive_a_restart(
        harness: Harness) -> None:
    """Two members: the second acks its 40 before the first acks its 40. The second's are
    one RocksDB key (a run), not 40; after a restart they stay acknowledged; the first's ack
    then moves the committed offset past both and leaves no ack key behind."""
    broker = harness.open()
    send(broker, 100)
    groups(broker).receive("t", "g", 40, LEASE)  # the first member's 40, not acked yet
    second = groups(broker).receive("t", "g", 40, LEASE).messages
    # the second member acks all but one of its messages, out of order
    late = second[7]
    acked = [m.receipt for m in reversed(second) if m is not late]
    assert groups(broker).ack("t", "g", acked).acked == 39
    assert ack_keys(broker) == {40: 47, 48: 80}
    broker.close()
    broker = harness.open()
    state = groups(broker).state("t", "g")
    assert (state.committed_offset, state.leased) == (0, 0)
    again = groups(broker).receive("t", "g", 100, LEASE).messages  # all but the acked 39
    assert [m.record.queue_offset for m in again] == [*range(40), 47, *range(80, 100)]
    assert groups(broker).ack("t", "g", [m.receipt for m in again[:41]]).acked == 41
    assert broker.groups.offset("t", "g") == 80
    assert ack_keys(broker) == {}  # every run now below the committed offset: deleted
    assert groups(broker).ack("t", "g", [m.receipt for m in again[41:]]).acked == 20
    assert broker.groups.offset("t", "g") == 100 and ack_keys(broker) == {}


def test_acks_stored_a_key_per_offset_by_an_earlier_version_still_count(
        harness: Harness) -> None:
    """An ack key with an empty value (one offset, as versions before the runs stored
    them) is read as that one offset, and deleted once the committed offset passes it."""
    from scheduler.group_state import ack_prefix
    from storage.constants import CF_META
    from storage.keys import pack_u64

    broker = harness.open()
    send(broker, 10)
    groups(broker).receive("t", "g", 1, LEASE)  # the group exists
    store = broker.parts.store
    assert store is not None
    batch = store.batch()
    batch.put_many(CF_META, [(ack_prefix("t", "g") + pack_u64(o), b"") for o in (3, 4, 8)])
    store.write(batch)
    broker.close()
    broker = harness.open()
    got = groups(broker).receive("t", "g", 10, LEASE).messages
    assert [m.record.queue_offset for m in got] == [0, 1, 2, 5, 6, 7, 9]
    assert groups(broker).ack("t", "g", [m.receipt for m in got[:5]]).acked == 5
    assert broker.groups.offset("t", "g") == 7  # 0-6 acked (3 and 4 from before)
    assert ack_keys(broker) == {8: 9}
    groups(broker).set_offset("t", "g", 0)  # a replay drops every stored ack
    assert ack_keys(broker) == {}


def test_a_receipt_tag_is_a_blake2s_of_the_offset_under_an_hmac_of_the_lease(
        broker: Broker) -> None:
    """Seal: per lease a key, HMAC-SHA256 under the key kept in RocksDB of topic, group and
    the receipt's head; per receipt (version 4) the quarter ``offset & 3`` of a BLAKE2s-256
    keyed with it of ``offset >> 2`` in hex."""
    import hashlib
    import hmac

    from scheduler.group_state import Seal
    from storage.constants import CF_META, META_GROUP_RECEIPT_KEY

    send(broker, 6)
    got = groups(broker).receive("t", "g", 6, LEASE).messages
    key = broker.parts.store.get(CF_META, META_GROUP_RECEIPT_KEY)
    assert key is not None and len(key) == 32

    def expected(key: bytes, topic: str, group: str, head: str, offset: str) -> str:
        lease_key = hmac.new(key, f"{topic}\0{group}\0{head}".encode(), "sha256").digest()
        quad, quarter = divmod(int(offset, 16), 4)
        return hashlib.blake2s(f"{quad:x}".encode(), key=lease_key,
                               digest_size=32).hexdigest()[16 * quarter:16 * quarter + 16]

    for i, m in enumerate(got):
        head, tag, offset = m.receipt.split(".")
        assert head[0] == "4" and offset == f"{i:x}"
        assert tag == expected(key, "t", "g", head, offset)
    assert len({m.receipt.split(".")[1] for m in got}) == 6  # a quad's four tags differ
    seal = Seal(b"k" * 100, "a", "b")
    assert seal.tags("40f", ["1a", "0", "1b", "3"]) == [
        expected(b"k" * 100, "a", "b", "40f", o) for o in ("1a", "0", "1b", "3")]
    # each part binds: another topic, group, lease or offset gives another tag
    tags = {expected(b"k" * 32, *parts) for parts in (
        ("a", "b", "40f", "1a"), ("a", "c", "40f", "1a"), ("x", "b", "40f", "1a"),
        ("a", "b", "410", "1a"), ("a", "b", "40f", "1b"), ("a", "b", "30f", "1a"),
        ("a", "b", "40f", "1e"))}
    assert len(tags) == 7
    assert seal.tags("40f", []) == []


def test_a_version_3_receipt_issued_before_an_upgrade_still_acknowledges(
        broker: Broker) -> None:
    """Receipts of version 3 (BLAKE2s-64 of the offset in hex under the lease's key), as a
    server before version 4 issued them, are verified as such: one of this group
    acknowledges its message; its tag under version 4's rule, or a version 3 tag altered,
    is a receipt this server never issued."""
    import hashlib
    import hmac

    from storage.constants import CF_META, META_GROUP_RECEIPT_KEY

    send(broker, 3)
    groups(broker).receive("t", "g", 1, LEASE)  # makes the group and its receipt key
    key = broker.parts.store.get(CF_META, META_GROUP_RECEIPT_KEY)
    assert key is not None

    def v3(offset: int, head: str = "30abc") -> str:
        lease_key = hmac.new(key, f"t\0g\0{head}".encode(), "sha256").digest()
        tag = hashlib.blake2s(f"{offset:x}".encode(), key=lease_key, digest_size=8).hexdigest()
        return f"{head}.{tag}.{offset:x}"

    with pytest.raises(NotFound):
        groups(broker).ack("t", "g", [v3(1)[:-1] + "2"])  # another offset, the same tag
    with pytest.raises(NotFound):  # version 4's tag under a version 3 head
        groups(broker).ack("t", "g", ["3" + groups(broker).receive(
            "t", "g", 1, LEASE).messages[0].receipt[1:]])
    result = groups(broker).ack("t", "g", [v3(2)])  # nobody holds offset 2 now
    assert (result.acked, result.stale) == (1, [])
    assert groups(broker).receive("t", "g", 10, LEASE).messages == []  # 0, 1 held; 2 acked
    assert groups(broker).state("t", "g").leased == 2


def test_a_receipt_from_before_an_offset_commit_back_stays_within_the_window(
        harness: Harness) -> None:
    """No ack key past committed + window, whatever receipts a member kept: after an offset
    commit moved the group back, a receipt of an offset beyond the new window is stale."""
    broker = harness.open(group_lease_window=5)
    send(broker, 12)
    g = groups(broker)
    first = g.receive("t", "g", 5, LEASE).messages
    assert g.ack("t", "g", [m.receipt for m in first]).acked == 5
    later = g.receive("t", "g", 5, LEASE).messages  # offsets 5..9
    assert broker.groups.set_offset("t", "g", 0) == 0  # replay: the window is 0..4 again
    result = g.ack("t", "g", [m.receipt for m in later])
    assert (result.acked, result.stale) == (0, [m.receipt for m in later])
    prefix = ack_prefix("t", "g")
    assert list(broker.parts.store.scan(CF_META, prefix, prefix + b"\xff")) == []
    assert g.state("t", "g").committed_offset == 0


def test_a_group_keeps_at_most_kept_receipts_and_acks_the_others_by_their_seal(
        broker: Broker) -> None:
    from scheduler.group_state import KEPT_RECEIPTS

    for start in range(0, 3_000, 1_000):
        send(broker, 1_000, start=start)
    g = groups(broker)
    batches = [g.receive("t", "g", 1000, LEASE).messages for _ in range(3)]
    group = g._groups[("t", "g")]
    assert group.kept == KEPT_RECEIPTS == 2_000 and len(group.issued) == 2
    for batch in reversed(batches):  # the third by its seal, the others as kept
        assert g.ack("t", "g", [m.receipt for m in batch]).acked == 1000
    assert (group.kept, group.issued) == (0, {})  # acked whole: nothing kept any more
    assert broker.groups.offset("t", "g") == 3_000


def test_a_whole_lease_acked_as_issued_ends_it_and_a_part_acked_before_is_stale(
        broker: Broker, clock: FakeClock) -> None:
    """The usual ack (a receive's receipts as issued) takes the lease whole; once part of
    it was acknowledged, or its lease expired and another member holds a message again,
    the same receipts are taken one by one: what was acked already, or is held by the other
    lease, is stale, the rest acknowledged once."""
    send(broker, 12)
    g = groups(broker)
    first = g.receive("t", "g", 4, LEASE).messages
    whole = g.ack("t", "g", [m.receipt for m in first])
    assert (whole.acked, whole.stale) == (4, [])
    assert g.state("t", "g").committed_offset == 4 and g.state("t", "g").leased == 0
    second = [m.receipt for m in g.receive("t", "g", 4, LEASE).messages]
    assert g.ack("t", "g", [second[1]]).acked == 1
    again = g.ack("t", "g", second)  # as issued, but one of them is acknowledged already
    assert (again.acked, again.stale) == (3, [second[1]])
    assert g.state("t", "g").committed_offset == 8 and g.state("t", "g").leased == 0
    third = [m.receipt for m in g.receive("t", "g", 4, 1_000).messages]
    clock.advance(1_000)  # the lease expires: all four handed out again, to another member
    other = g.receive("t", "g", 2, LEASE).messages
    assert [m.record.queue_offset for m in other] == [8, 9] and other[0].delivery_count == 2
    late = g.ack("t", "g", third)
    assert (late.acked, late.stale) == (2, third[:2])  # 10, 11: nobody held them
    assert g.ack("t", "g", [m.receipt for m in other]).acked == 2
    state = g.state("t", "g")
    assert (state.committed_offset, state.leased) == (12, 0)
    assert g.receive("t", "g", 10, LEASE).messages == []


def test_the_offsets_of_a_receive_are_those_of_the_records_it_read(broker: Broker) -> None:
    """``_offsets_read``: a run of new offsets, all read, is taken as read; anything else (a
    gap, an offset handed out again, a read cut short) from the records' heads: the same
    offsets either way."""
    from scheduler.groups import _offsets_read
    from storage.records import log_record_offsets

    send(broker, 20)
    read = groups(broker)._read
    cases = [(list(range(3, 13)), {}),  # one run of new offsets
             ([3, 4, 6, 7], {}),  # a gap (acknowledged above the committed offset)
             ([5, 6, 7], {5: 2}),  # the first handed out again
             ([9, 8, 7], {9: 2, 8: 2, 7: 2})]  # expired ones, in the heap's order
    for taken, again in cases:
        payloads = read("t", taken)
        assert _offsets_read(taken, payloads, again) == log_record_offsets(payloads) \
            == sorted(taken)
    payloads = read("t", list(range(20)))[:15]  # a read cut short by its byte bound
    assert _offsets_read(list(range(20)), payloads, {}) == list(range(15))
