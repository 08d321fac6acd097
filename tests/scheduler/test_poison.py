"""Poison isolation in the engine: a due message whose stored value cannot be
decoded is parked, the messages around it in the same delivery batch are delivered with
gapless offsets, and a storage fault still blocks and retries (tests/scheduler/test_faults.py).
The HTTP side, with a message too big for a segment, is tests/api/test_poison.py."""

from __future__ import annotations

from scheduler.clock import FakeClock
from scheduler.model import SendRequest
from storage.constants import timer_cf
from storage.keys import encode_timer_key, topic_shard
from storage.records import MessageStatus
from tests.support.engine import START_MS, Harness, read_topic


def test_an_undecodable_message_is_parked_and_its_batch_delivered(harness: Harness,
                                                                  clock: FakeClock) -> None:
    broker = harness.open(flaky=True)
    due = START_MS + 1_000
    broker.send_batch([SendRequest(topic="t", body=f"m{i}".encode(), msg_id=f"m{i}",
                                   deliver_at=due) for i in range(5)])
    store = harness.store
    assert store is not None
    key = encode_timer_key(due, "t", "m2")
    cf = timer_cf(topic_shard("t", broker.config.timer_shards))
    batch = store.batch()
    batch.put(cf, key, b"\xc1 not a message record")  # garbage where m2's value was
    store.write(batch)
    clock.advance(1_000)
    broker.drain()
    got = read_topic(broker, "t")
    assert [m.msg_id for m in got] == ["m0", "m1", "m3", "m4"]
    assert [m.offset for m in got] == [0, 1, 2, 3]  # no offset lost to the poison
    assert broker.ready
    [parked] = broker.quarantine.messages()
    assert (parked.topic, parked.msg_id, parked.deliver_at) == ("t", "m2", due)
    assert "cannot be decoded" in parked.reason
    assert broker.stats().parked == 1 and broker.stats().pending == 0
    # below the frontier its index entry says SCHEDULED, as the delivered ones' do; parked,
    # it was not delivered (scheduler/ledger.py asks the parked set)
    assert broker.status("t", "m3").status is MessageStatus.DELIVERED
    assert broker.status("t", "m2").status is MessageStatus.SCHEDULED
    broker.send(SendRequest(topic="t", body=b"after", msg_id="after"))  # delivery goes on
    assert [m.msg_id for m in read_topic(broker, "t")][-1] == "after"
