"""Engine metrics: plain thread-safe counters, gauges and fixed-bucket histograms.

The engine updates them; ``api/`` exports them to Prometheus (a custom Collector that walks
``broker.metrics.collect()``). Nothing here knows about Prometheus: every metric has a
``name`` (snake_case, no prefix: the exporter adds ``hourglass_``), a ``help`` text, and a
``kind`` of "counter", "gauge" or "histogram".

Fields of :class:`EngineMetrics` (all counts are messages unless stated otherwise):

=============================  =========  =========================================================
attribute                      kind       meaning
=============================  =========  =========================================================
scheduled                      counter    sends stored in a timer CF for a future deliverAt
scheduled_by_level             counter    the same, per RocketMQ delay level (label ``level``)
delivered                      counter    messages appended to the CommitLog (due + immediate)
delivered_immediate            counter    of which were already due on arrival
duplicates                     counter    idempotent re-sends answered with the first result
cancelled                      counter    successful cancels (first cancel of a message only)
expired                        counter    final-state index entries removed after the retention
replayed                       counter    log records applied to RocksDB by recovery / replay
retries                        counter    failed delivery attempts that were retried (back-off)
storage_errors                 counter    storage failures seen by the engine (any path)
pending                        gauge      messages scheduled and not yet delivered or cancelled
pending_by_topic               gauge      the same per topic (label topic: the backlog_topic_labels
                                          topics with most, the rest as ``__other__``)
oldest_pending_ms              gauge      per topic (same labels): oldest pending deliverAt, ms
pending_by_level               gauge      pending messages sent with a delay level (label level)
delivery_queue_batches         gauge      scan batches waiting in the bounded delivery queue
delivery_queue_messages        gauge      messages in those batches
blocked                        gauge      1 while delivery is blocked by failures (not ready)
watermark_lag_ms               gauge      per shard (label shard): now - time its scanner covered
lateness_ms                    histogram  storedAt - deliverAt of delivered messages, ms
scan_batch_size                histogram  keys per non-empty due-range scan
scan_prefetched                counter    timer keys read ahead of their due time (a burst's first
                                          ``scan_prefetch_messages``: scheduler/prefetch.py)
commit_batch_size              histogram  messages per CommitLog append + RocksDB commit
listener_overruns              counter    per listener (label listener): delivery listener calls
                                          over their budget (scheduler/listeners.py)
tx_prepared                    counter    half messages prepared (scheduler/transactions.py)
tx_committed                   counter    transactions committed (by the producer or a check)
tx_rolled_back                 counter    transactions rolled back
tx_discarded                   counter    half messages discarded into TRANS_CHECK_MAX_TIME_TOPIC
tx_checks_sent                 counter    check-backs handed out (polls and callback POSTs)
tx_checks_unanswered           counter    check-backs counted with nobody to ask (RocketMQ's rule)
tx_check_answers               counter    check-callback answers (label ``answer``)
tx_prepared_pending            gauge      half messages waiting for commit, rollback or discard
group_backlog                  gauge      per group (label ``group`` = "topic/group" for the first
                                          ``group_metric_labels`` groups, the rest summed under
                                          ``__other__``; so for every group_* metric): end offset
                                          - committed offset of its topic
group_leased                   gauge      per group: messages leased to members now
group_retrying                 gauge      per group: nacked messages scheduled back, not yet acked
group_dead_letters             gauge      per group: dead letters not redriven
group_acked                    counter    per group: messages acknowledged
group_nacked                   counter    per group: messages nacked (retried or dead-lettered)
group_dead_lettered            counter    per group: messages that became dead letters
group_redelivered              counter    per group: leases that expired (handed out again)
group_expired                  counter    per group: messages it lost to CommitLog retention (its
                                          committed offset was below its topic's firstOffset)
log_segments_deleted           counter    CommitLog segments deleted (label ``reason``: retention
                                          or disk, scheduler/retention.py)
log_bytes_deleted              counter    bytes of those segments (label ``reason``)
log_early_deletions            counter    deletions made early: the disk above disk_clean_ratio
disk_used_ratio                gauge      used / size of the data directory's file system
=============================  =========  =========================================================

Lateness of a message that was due on arrival is 0 by definition (it is appended at once);
it is counted in ``delivered_immediate`` and observed as ``storedAt - max(deliverAt, bornAt)``.
"""

from __future__ import annotations

import bisect
import collections
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat

#: lateness buckets, ms (upper bounds, inclusive): sub-ms precision up to minutes of backlog
LATENESS_BUCKETS_MS: tuple[float, ...] = (
    0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
    300_000,
)
#: batch-size buckets, messages
BATCH_BUCKETS: tuple[float, ...] = (1, 10, 100, 500, 1_000, 2_000, 4_096, 8_192, 16_384)


class Counter:
    """Monotonic counter, optionally with one label (``counter.labels(value).inc()``)."""

    kind = "counter"

    def __init__(self, name: str, help: str, label: str | None = None) -> None:
        self.name = name
        self.help = help
        self.label = label
        self._lock = threading.Lock()
        self._value = 0
        self._children: dict[str, Counter] = {}

    def inc(self, amount: int = 1) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        with self._lock:
            self._value += amount

    @property
    def value(self) -> int:
        """Own value, or with a label the sum over every label value."""
        with self._lock:
            if self.label is None:
                return self._value
            children = list(self._children.values())
        return sum(child.value for child in children)

    def labels(self, value: object) -> Counter:
        if self.label is None:
            raise ValueError(f"{self.name} has no label")
        key = str(value)
        with self._lock:
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = Counter(self.name, self.help)
            return child

    def samples(self) -> list[tuple[dict[str, str], float]]:
        """(labels, value) pairs: one unlabeled sample, or one per label value."""
        if self.label is None:
            return [({}, float(self.value))]
        with self._lock:
            children = sorted(self._children.items())
        return [({self.label: key}, float(child.value)) for key, child in children]


class Gauge:
    """A value that goes up and down; or, with ``set_function``, read from a callback when
    collected (used for values that change with time alone, such as watermark lag)."""

    kind = "gauge"

    def __init__(self, name: str, help: str, label: str | None = None) -> None:
        self.name = name
        self.help = help
        self.label = label
        self._lock = threading.Lock()
        self._value = 0.0
        self._function: Callable[[], float] | None = None
        self._label_function: Callable[[], dict[str, float]] | None = None

    def set(self, value: float) -> None:
        with self._lock:
            self._value = value

    def inc(self, amount: float = 1) -> None:
        with self._lock:
            self._value += amount

    def dec(self, amount: float = 1) -> None:
        with self._lock:
            self._value -= amount

    def set_function(self, function: Callable[[], float]) -> None:
        self._function = function

    def set_label_function(self, function: Callable[[], dict[str, float]]) -> None:
        """For a labelled gauge: ``function()`` -> {label value: value}."""
        if self.label is None:
            raise ValueError(f"{self.name} has no label")
        self._label_function = function

    @property
    def value(self) -> float:
        if self._function is not None:
            return float(self._function())
        with self._lock:
            return self._value

    def samples(self) -> list[tuple[dict[str, str], float]]:
        if self.label is not None:
            values = self._label_function() if self._label_function is not None else {}
            return [({self.label: key}, float(v)) for key, v in sorted(values.items())]
        return [({}, self.value)]


@dataclass(frozen=True, kw_only=True, slots=True)
class HistogramSnapshot:
    """Cumulative bucket counts (Prometheus style): ``buckets[i]`` = (upper bound, number of
    observations <= bound); the last bound is +inf."""

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum: float

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding the q-quantile (a conservative estimate)."""
        if not 0 <= q <= 1:
            raise ValueError("q must be in [0, 1]")
        if self.count == 0:
            return 0.0
        rank = q * self.count
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                return bound
        return float("inf")


#: up to this many values, ``observe_many`` locates each on its own: a Counter costs more
#: than it saves (a steady trickle's delivery commits hold a few messages each)
_FEW = 32


class Histogram:
    """Fixed-bucket histogram. ``observe_many`` takes a whole batch under one lock."""

    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(set(buckets)):
            raise ValueError("histogram buckets must be strictly increasing")
        self.name = name
        self.help = help
        self.bounds: tuple[float, ...] = tuple(buckets)
        self._lock = threading.Lock()
        self._counts = [0] * (len(self.bounds) + 1)  # last slot: above the highest bound
        self._count = 0
        self._sum = 0.0

    def observe(self, value: float) -> None:
        slot = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self._counts[slot] += 1
            self._count += 1
            self._sum += value

    def observe_many(self, values: Iterable[float]) -> None:
        if isinstance(values, list | tuple) and len(values) <= _FEW:
            pairs: Iterable[tuple[float, int]] = zip(values, repeat(1))  # (no Counter)
        else:
            pairs = collections.Counter(values).items()  # batches repeat values
        self._observe_pairs(pairs)

    def observe_counts(self, counts: Mapping[int, int] | Mapping[float, int]) -> None:
        """``observe_many`` of values already counted: value -> how many times."""
        self._observe_pairs(counts.items())

    def _observe_pairs(self, pairs: Iterable[tuple[float, int]]) -> None:
        bounds = self.bounds
        locate = bisect.bisect_left
        local = [0] * len(self._counts)
        total = 0.0
        n = 0
        for value, count in pairs:
            local[locate(bounds, value)] += count
            total += value * count
            n += count
        if not n:
            return
        with self._lock:
            for i, c in enumerate(local):
                if c:
                    self._counts[i] += c
            self._count += n
            self._sum += total

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            counts = list(self._counts)
            count, total = self._count, self._sum
        cumulative = 0
        buckets = []
        for bound, c in zip((*self.bounds, float("inf")), counts, strict=True):
            cumulative += c
            buckets.append((bound, cumulative))
        return HistogramSnapshot(buckets=tuple(buckets), count=count, sum=total)


Metric = Counter | Gauge | Histogram


class EngineMetrics:
    """Every metric of the engine; see the module docstring for the meaning of each."""

    def __init__(self) -> None:
        self.scheduled = Counter("scheduled_total", "Messages stored for later delivery")
        self.scheduled_by_level = Counter(
            "scheduled_by_level_total", "Messages scheduled by RocketMQ delay level", "level")
        self.delivered = Counter("delivered_total", "Messages appended to the CommitLog")
        self.delivered_immediate = Counter(
            "delivered_immediate_total", "Messages already due on arrival, appended at once")
        self.duplicates = Counter("duplicate_sends_total", "Idempotent re-sends of a msgId")
        self.cancelled = Counter("cancelled_total", "Messages cancelled before delivery")
        self.expired = Counter("expired_total", "Final states removed after the retention")
        self.replayed = Counter("replayed_total", "Log records applied to RocksDB by replay")
        self.retries = Counter("delivery_retries_total", "Failed delivery attempts retried")
        self.storage_errors = Counter("storage_errors_total", "Storage failures seen")
        self.pending = Gauge("pending", "Messages scheduled, not yet delivered or cancelled")
        self.pending_by_topic = Gauge(
            "pending_by_topic", "Pending messages per topic (top topics, the rest: __other__)",
            "topic")
        self.oldest_pending_ms = Gauge(
            "oldest_pending_deliver_at_ms", "Oldest pending deliverAt per topic, epoch ms",
            "topic")
        self.pending_by_level = Gauge(
            "pending_by_level", "Pending messages sent with a RocketMQ delay level", "level")
        self.delivery_queue_batches = Gauge(
            "delivery_queue_batches", "Scan batches waiting in the delivery queue")
        self.delivery_queue_messages = Gauge(
            "delivery_queue_messages", "Messages waiting in the delivery queue")
        self.blocked = Gauge("delivery_blocked", "1 while delivery is blocked by failures")
        self.parked = Gauge("parked_messages", "Due messages parked: undeliverable for a "
                            "reason of their own (GET /v1/admin/parked)")
        self.watermark_lag_ms = Gauge(
            "watermark_lag_ms", "Now minus the time a shard's scanner has covered", "shard")
        self.lateness_ms = Histogram(
            "delivery_lateness_ms", "storedAt - deliverAt of delivered messages, ms",
            LATENESS_BUCKETS_MS)
        self.scan_batch_size = Histogram(
            "scan_batch_size", "Keys per non-empty due-range scan", BATCH_BUCKETS)
        self.scan_prefetched = Counter(
            "scan_prefetched_total", "Timer keys read ahead of their due time")
        self.commit_batch_size = Histogram(
            "commit_batch_size", "Messages per log append + RocksDB commit", BATCH_BUCKETS)
        self.listener_overruns = Counter(
            "delivery_listener_overruns_total",
            "Delivery listener calls over their budget (not messages)", "listener")
        # transactions (scheduler/transactions.py, scheduler/checkback/)
        self.tx_prepared = Counter("transactions_prepared_total", "Half messages prepared")
        self.tx_committed = Counter("transactions_committed_total", "Transactions committed")
        self.tx_rolled_back = Counter(
            "transactions_rolled_back_total", "Transactions rolled back")
        self.tx_discarded = Counter(
            "transactions_discarded_total", "Half messages discarded after the maximum checks")
        self.tx_checks_sent = Counter(
            "transaction_checks_sent_total", "Check-backs handed out (polls and callbacks)")
        self.tx_checks_unanswered = Counter(
            "transaction_checks_unanswered_total",
            "Check-back rounds counted with no poll and no callback to take them")
        self.tx_check_answers = Counter(
            "transaction_check_answers_total", "Check-callback answers", "answer")
        self.tx_prepared_pending = Gauge(
            "transactions_prepared", "Half messages waiting for commit, rollback or discard")
        # consumer groups with competing members (scheduler/groups.py)
        self.group_backlog = Gauge(
            "group_backlog", "End offset minus committed offset of a group", "group")
        self.group_leased = Gauge("group_leased", "Messages leased to a group's members",
                                  "group")
        self.group_retrying = Gauge(
            "group_retrying", "Nacked messages scheduled back to a group, not yet acked", "group")
        self.group_dead_letters = Gauge(
            "group_dead_letters", "Dead letters of a group not redriven", "group")
        self.group_acked = Counter("group_acked_total", "Messages a group acknowledged", "group")
        self.group_nacked = Counter("group_nacked_total", "Messages a group nacked", "group")
        self.group_dead_lettered = Counter(
            "group_dead_lettered_total", "Messages that became dead letters of a group", "group")
        self.group_redelivered = Counter(
            "group_redelivered_total", "Leases of a group that expired (handed out again)",
            "group")
        self.group_expired = Counter(
            "group_expired_total", "Messages a group lost to CommitLog retention", "group")
        self.log_segments_deleted = Counter(
            "commitlog_segments_deleted_total", "CommitLog segments deleted", "reason")
        self.log_bytes_deleted = Counter(
            "commitlog_bytes_deleted_total", "Bytes of CommitLog segments deleted", "reason")
        self.log_early_deletions = Counter(
            "commitlog_early_deletions_total",
            "CommitLog deletions made early: the disk was above disk_clean_ratio")
        self.disk_used_ratio = Gauge(
            "disk_used_ratio", "Used / size of the data directory's file system")

    def collect(self) -> Iterator[Metric]:
        """Every metric, in a stable order."""
        for value in vars(self).values():
            if isinstance(value, Counter | Gauge | Histogram):
                yield value

    def as_dict(self) -> dict[str, object]:
        """A JSON-able view (for stats and tests): name -> value, labelled values as dicts,
        histograms as {count, sum, p50, p99} (None when beyond the highest bucket)."""
        out: dict[str, object] = {}
        for metric in self.collect():
            if isinstance(metric, Histogram):
                snap = metric.snapshot()
                out[metric.name] = {"count": snap.count, "sum": snap.sum,
                                    "p50": _finite(snap.quantile(0.5)),
                                    "p99": _finite(snap.quantile(0.99))}
            elif metric.label is not None:
                out[metric.name] = {labels[metric.label]: v for labels, v in metric.samples()}
            else:
                out[metric.name] = metric.samples()[0][1]
        return out


def _finite(value: float) -> float | None:
    return None if value == float("inf") else value
