"""Synthetic hourglass stores with known answers, written as the engine writes them.

Used by the analysis benchmark (bench/analysis.py) and the Spark tests (tests/spark/): the
generator returns the ground truth (every message with its final state) so each figure of the
analysis can be checked against an independent computation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from scheduler.timer_index import TimerIndex
from storage.constants import CF_CQ, CF_INDEX, timer_cf
from storage.keys import (
    cq_key,
    decode_cq_key,
    encode_timer_key,
    index_key,
    pack_u64,
    topic_prefix,
    topic_shard,
)
from storage.records import IndexEntry, MessageRecord, MessageStatus, encode_index, encode_message
from storage.rocks import RocksStore

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    messages: int = 10_000
    delivered: int = 3_000  # the earliest messages, all due before now - 10 s
    cancelled: int = 1_000  # future messages cancelled
    overdue: int = 0  # due in [now - 10 s, now) but not delivered yet
    shards: int = 2
    now_ms: int = 1_700_000_000_000
    #: (topic, weight)
    topics: tuple[tuple[str, float], ...] = (
        ("orders", 0.6), ("payments", 0.25), ("emails", 0.1), ("audit", 0.05))
    #: (body size in bytes, weight)
    body_sizes: tuple[tuple[int, float], ...] = (
        (100, 0.7), (2_048, 0.2), (10_240, 0.09), (102_400, 0.01))
    #: share of future messages due in the same second (now + burst_at_ms)
    burst_share: float = 0.1
    burst_at_ms: int = 30 * 60_000
    seed: int = 7
    id_prefix: str = "m"  # msgIds are f"{id_prefix}-{i:08d}": vary it to add to a store
    batch_size: int = 5_000
    #: delivered timer keys stay in place (the engine deletes them in periodic clean-ups below
    #: the watermark, so a snapshot may hold them): dead but not deleted
    keep_delivered_keys: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Msg:
    topic: str
    msg_id: str
    shard: int
    deliver_at: int
    key_size: int
    value_size: int
    state: MessageStatus
    queue_offset: int | None = None


@dataclass(kw_only=True)
class Workload:
    spec: WorkloadSpec
    messages: list[Msg] = field(default_factory=list)
    watermarks: dict[int, int] = field(default_factory=dict)


T = TypeVar("T")


def _weighted(rng: random.Random, table: tuple[tuple[T, float], ...]) -> T:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table])[0]


def _future_delay(rng: random.Random, spec: WorkloadSpec) -> int:
    """A known delay mixture: burst second, 1 h, 1 day, 7 days."""
    u = rng.random()
    if u < spec.burst_share:
        return spec.burst_at_ms + rng.randrange(1000)
    if u < 0.5:
        return rng.randrange(1000, HOUR_MS)
    if u < 0.8:
        return rng.randrange(HOUR_MS, DAY_MS)
    return rng.randrange(DAY_MS, 7 * DAY_MS)


def _cq_end(store: RocksStore, topic: str) -> int:
    """The next consume-queue offset of ``topic`` (0 for a new topic)."""
    prefix = topic_prefix(topic)
    last = list(store.scan(CF_CQ, prefix, prefix[:-1] + b"\x01", limit=1, reverse=True))
    return decode_cq_key(last[0][0])[1] + 1 if last else 0


def generate(store: RocksStore, spec: WorkloadSpec) -> Workload:
    """Send ``spec.messages``, deliver the earliest ``delivered``, cancel ``cancelled``."""
    if spec.delivered + spec.cancelled + spec.overdue > spec.messages:
        raise ValueError("delivered + cancelled + overdue must not exceed messages")
    rng = random.Random(spec.seed)
    now = spec.now_ms
    plan: list[tuple[str, str, int, bytes]] = []
    for i in range(spec.messages):
        topic = _weighted(rng, spec.topics)
        if i < spec.delivered:
            deliver_at = now - 10_000 - rng.randrange(1, HOUR_MS)
        elif i < spec.delivered + spec.overdue:
            deliver_at = now - rng.randrange(1, 10_000)
        else:
            deliver_at = now + _future_delay(rng, spec)
        size = _weighted(rng, spec.body_sizes)
        record = MessageRecord(body=b"b" * size, born_at=now - DAY_MS, deliver_at=deliver_at)
        plan.append((topic, f"{spec.id_prefix}-{i:08d}", deliver_at, encode_message(record)))
    # 1. every send: timer key + index SCHEDULED, as Broker.send does
    for lo in range(0, len(plan), spec.batch_size):
        batch = store.batch()
        for topic, msg_id, deliver_at, value in plan[lo:lo + spec.batch_size]:
            shard = topic_shard(topic, store.timer_shards)
            batch.put(timer_cf(shard), encode_timer_key(deliver_at, topic, msg_id), value)
            batch.put(CF_INDEX, index_key(topic, msg_id), encode_index(IndexEntry(
                status=MessageStatus.SCHEDULED, deliver_at=deliver_at, updated_at=now - DAY_MS)))
        store.write(batch)
    store.flush()
    # 2. deliveries (in deliverAt order) and cancellations: delete the timer key, mark the index
    work = Workload(spec=spec)
    offsets = {topic: _cq_end(store, topic) for topic, _ in spec.topics}
    delivered = set(range(spec.delivered))
    first_future = spec.delivered + spec.overdue
    cancelled = set(range(first_future, first_future + spec.cancelled))
    batch = store.batch()
    for i in sorted(range(len(plan)), key=lambda i: plan[i][2]):  # deliveries in time order
        topic, msg_id, deliver_at, value = plan[i]
        shard = topic_shard(topic, store.timer_shards)
        key = encode_timer_key(deliver_at, topic, msg_id)
        state, offset = MessageStatus.SCHEDULED, None
        if i in delivered or i in cancelled:
            if i in cancelled or not spec.keep_delivered_keys:
                batch.delete(timer_cf(shard), key)
            if i in delivered:
                state = MessageStatus.DELIVERED
                offset = offsets.get(topic, 0)
                offsets[topic] = offset + 1
                batch.put(CF_CQ, cq_key(topic, offset), pack_u64(i) + len(value).to_bytes(4, "big"))
            else:
                state = MessageStatus.CANCELLED
            # a scan's delivery leaves the entry SCHEDULED (below the frontier written at the
            # end, that reads as DELIVERED: scheduler/ledger.py); every other one as a
            # message due on arrival (or a replay) has it: DELIVERED, with its offset
            if state is MessageStatus.CANCELLED or i % 2:
                batch.put(CF_INDEX, index_key(topic, msg_id), encode_index(IndexEntry(
                    status=state, deliver_at=deliver_at, updated_at=now, queue_offset=offset)))
        work.messages.append(Msg(topic=topic, msg_id=msg_id, shard=shard, deliver_at=deliver_at,
                                 key_size=len(key), value_size=len(value), state=state,
                                 queue_offset=offset))
        if len(batch) >= spec.batch_size:
            store.write(batch)
            batch = store.batch()
    store.write(batch)
    # the scanner's watermark: 10 s back, but never past a key still waiting in the shard (an
    # earlier round's message may be due in between), unless delivered keys are kept
    batch = store.batch()
    for shard in range(spec.shards):
        mark = now - 10_000
        if not spec.keep_delivered_keys:
            first = list(store.scan(timer_cf(shard), pack_u64(0), pack_u64(mark), limit=1))
            mark = int.from_bytes(first[0][0][:8], "big") if first else mark
        work.watermarks[shard] = mark
        TimerIndex.put_frontier(batch, shard, pack_u64(mark))
    store.write(batch)
    store.flush()
    return work


def build_store(path: Path, spec: WorkloadSpec) -> tuple[RocksStore, Workload]:
    store = RocksStore(path, timer_shards=spec.shards)
    try:
        return store, generate(store, spec)
    except BaseException:
        store.close()
        raise
