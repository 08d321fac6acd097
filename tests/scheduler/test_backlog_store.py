"""The backlog's persisted counts (scheduler/backlog_store.py) against a full scan of the
pending keys: after every step of sends (with and without delay levels, one topic or
several, column batches), cancels, deliveries, redriven poison messages, folds and restarts,
the counts in memory, the counts a start would load (base + deltas) and the counts the
start-up scan finds are the same. Real RocksDB and CommitLog, FakeClock."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from scheduler.backlog import Backlog
from scheduler.backlog_store import BacklogStore
from scheduler.broker import Broker
from scheduler.clock import FakeClock
from scheduler.maintenance import Maintenance
from scheduler.model import SendRequest
from storage.constants import CF_META, META_BACKLOG_FOLDED, timer_cf
from storage.errors import AlreadyDelivered, NotFound
from tests.support.engine import START_MS, make_config

TOPICS = ("a", "b", "c", "d")
#: delays (ms): due now, soon, in other seconds, minutes and hours
DELAYS = (0, 1, 7, 999, 1_000, 1_500, 61_000, 3_600_000, 7_300_000)


def scanned(broker: Broker) -> tuple[dict[str, int], dict[int, int], dict[object, object]]:
    """What the start-up scan finds in the broker's store now."""
    store = broker.parts.store
    assert store is not None
    backlog = Backlog(store, [timer_cf(s) for s in range(store.timer_shards)], top=50)
    backlog.rebuild()
    return ({t: n for t, (n, _) in backlog.by_topic().items()}, backlog.by_level(),
            backlog.timeline.series())


def kept(broker: Broker) -> tuple[dict[str, int], dict[int, int], dict[object, object]]:
    """The counts the broker keeps in memory."""
    backlog = broker.parts.backlog
    return ({t: n for t, (n, _) in backlog.by_topic().items()}, backlog.by_level(),
            backlog.timeline.series())


def loaded(broker: Broker) -> tuple[dict[str, int], dict[int, int], dict[object, object]]:
    """The counts a start would read now: the base plus the deltas not folded.

    The base's per-second counts are read lazily (by ``series`` here), so the fold lock is
    held until they are: this Backlog is not the broker's, no fold settles its lazy hours
    (``TimelineCounts.settle``), and a fold of the maintenance thread in between would add
    the deltas it folds to the base those lazy hours then read, counting them twice."""
    store, counts = broker.parts.store, broker.parts.counts
    assert store is not None
    backlog = Backlog(store, [timer_cf(s) for s in range(store.timer_shards)], top=50)
    with counts._fold_lock:  # (not while the maintenance thread folds)
        backlog.load(*BacklogStore(store).load())
        series = backlog.timeline.series()
    return ({t: n for t, (n, _) in backlog.by_topic().items()}, backlog.by_level(), series)


class CountsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="hourglass-counts-"))
        self.clock = FakeClock(START_MS)
        self.broker = self._open()
        self.sent: list[tuple[str, str]] = []
        self.n = 0

    def _open(self) -> Broker:
        broker = Broker(make_config(self.dir, timer_shards=2, scan_batch_size=3,
                                    delivery_batch_max=4, delivery_queue_batches=2),
                        self.clock)
        broker.start()
        return broker

    def teardown(self) -> None:
        self.broker.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _id(self) -> str:
        self.n += 1
        return f"m{self.n}"

    @rule(topic=st.sampled_from(TOPICS), delay=st.sampled_from(DELAYS),
          level=st.one_of(st.none(), st.integers(1, 4)))
    def send(self, topic: str, delay: int, level: int | None) -> None:
        msg_id = self._id()
        if level is None:
            self.broker.send(SendRequest(topic=topic, body=b"x", msg_id=msg_id,
                                         deliver_at=self.clock.now_ms() + delay))
        else:
            self.broker.send(SendRequest(topic=topic, body=b"x", msg_id=msg_id,
                                         delay_level=level))
        self.sent.append((topic, msg_id))

    @rule(items=st.lists(st.tuples(st.sampled_from(TOPICS), st.sampled_from(DELAYS)),
                         min_size=1, max_size=6), generated=st.booleans())
    def send_batch(self, items: list[tuple[str, int]], generated: bool) -> None:
        now = self.clock.now_ms()
        requests = [SendRequest(topic=t, body=b"x", msg_id=None if generated else self._id(),
                                deliver_at=now + d) for t, d in items]
        results = self.broker.send_batch(requests)
        self.sent += [(r.topic, r.msg_id) for r in results]

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if not self.sent:
            return
        topic, msg_id = data.draw(st.sampled_from(self.sent))
        try:
            self.broker.cancel(topic, msg_id)
        except (AlreadyDelivered, NotFound):
            pass

    @rule(ms=st.sampled_from((1, 500, 1_000, 60_000, 3_600_000)))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.broker.drain(timeout_s=60)

    @rule()
    def fold(self) -> None:
        self.broker.parts.counts.fold(self.broker.parts._all_locks)

    @rule()
    def restart(self) -> None:
        self.broker.close()
        self.broker = self._open()

    @rule()
    def restart_without_fold(self) -> None:
        """As after a kill: the deltas not folded are read by the next start."""
        broker = self.broker
        broker.parts._fold_counts = lambda: None  # type: ignore[method-assign]
        broker.close()
        self.broker = self._open()

    @invariant()
    def counts_match_a_full_scan(self) -> None:
        expected = scanned(self.broker)
        timeline = self.broker.parts.backlog.timeline
        for key, (seconds, _, hours) in expected[2].items():  # type: ignore[misc]
            for hour in list(hours)[:2]:  # an hour per second (reads its lazy seconds)
                for quarter in range(4):
                    first = hour * 3600 + quarter * 900
                    view = timeline.query(first * 1000, (first + 900) * 1000, 900, key)
                    assert view.counts == [seconds.get(first + i, 0) for i in range(900)]
        assert kept(self.broker) == expected
        assert loaded(self.broker) == expected
        assert self.broker.stats().pending == sum(expected[0].values())


CountsMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestCounts = CountsMachine.TestCase


def test_a_data_directory_without_counts_is_scanned_once_and_kept(tmp_path: Path) -> None:
    """A data directory from before the counts were persisted: the start scans it, writes
    the base, and the next start reads that instead."""
    clock = FakeClock(START_MS)
    broker = Broker(make_config(tmp_path), clock)
    broker.start()
    broker.send_batch([SendRequest(topic=t, body=b"x", msg_id=f"{t}{i}",
                                   deliver_at=START_MS + 1_000 * i)
                       for t in TOPICS for i in range(1, 20)])
    store = broker.parts.store
    assert store is not None
    batch = store.batch()  # as an older version left it: no counts at all
    for key, _ in list(store.scan(CF_META, b"bl", b"bm")):
        batch.delete(CF_META, key)
    store.write(batch)
    broker.parts._fold_counts = lambda: None  # type: ignore[method-assign]
    broker.close()
    broker = Broker(make_config(tmp_path), clock)
    broker.start()
    try:
        assert broker.parts.store.get(CF_META, META_BACKLOG_FOLDED) is not None
        assert broker.stats().pending == 4 * 19
        assert kept(broker) == scanned(broker) == loaded(broker)
    finally:
        broker.close()


def test_a_fold_after_a_start_leaves_its_lazily_read_seconds_right(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A start reads the base's minutes and holds its hours' seconds lazily, with the deltas
    not folded on top. When a fold then rewrites those hours, the timeline takes their
    seconds as they stood before (``TimelineCounts.settle``): read after the fold they would
    hold the folded deltas a second time (an extra count per message sent, one fewer per
    message delivered; the minutes and hours stay right)."""
    # the maintenance thread folds a round after a delta: here the test folds, when it chooses
    monkeypatch.setattr(Maintenance, "fold_counts", lambda self: 0)
    clock = FakeClock(START_MS)
    broker = Broker(make_config(tmp_path, timer_shards=2), clock)
    broker.start()
    sends = [SendRequest(topic=t, body=b"x", msg_id=f"{t}{i}", deliver_at=START_MS + 700 * i)
             for t in ("a", "b") for i in range(1, 12)]
    broker.send_batch(sends[:10])
    broker.parts.counts.fold(broker.parts._all_locks)  # a base for the first ten
    broker.send_batch(sends[10:])  # deltas: sends ...
    clock.advance(3_000)
    broker.drain(timeout_s=60)  # ... and deliveries
    broker.parts._fold_counts = lambda: None  # type: ignore[method-assign]
    broker.close()  # as after a kill: the deltas stay

    broker = Broker(make_config(tmp_path, timer_shards=2), clock)
    broker.start()
    try:
        counts, timeline = broker.parts.counts, broker.parts.backlog.timeline
        assert counts.unfolded > 0 and timeline._lazy  # deltas over a lazily held base
        assert counts.fold(broker.parts._all_locks) > 0
        assert kept(broker) == scanned(broker) == loaded(broker)
        assert broker.stats().pending == len(sends) - 2 * 4  # 0.7-2.8 s delivered per topic
    finally:
        broker.close()
