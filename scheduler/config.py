"""Engine tunables: one frozen dataclass, integer milliseconds and bytes inside, that checks
itself (``check``, which the Broker calls before it opens anything).

app/settings.py builds it from defaults < TOML < HOURGLASS_* env < CLI flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scheduler.levels import DelayLevels
from storage.commitlog import DEFAULT_SEGMENT_SIZE
from storage.constants import DEFAULT_DELAY_LEVELS
from storage.errors import InvalidArgument
from storage.log_format import HEADER_SIZE

TEN_YEARS_MS = 10 * 366 * 24 * 3600 * 1000
#: bytes of a log record besides its body and attributes (names, times, framing), at most
RECORD_SLACK = 1024


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    data_dir: Path
    # name                          default           unit / meaning
    timer_shards: int = 2  #                           timer column families = scanner threads
    scan_batch_size: int = 1000  #                      keys per due-range scan
    scan_batch_bytes: int = 4 << 20  #                  and bytes of their values (large bodies:
    #                                                   256 of 16 KiB, not 16 MiB a scan)
    scan_interval_ms: int = 2  #                        ms of real time at least between two scans
    #                                                   of a shard that found it all (0: none)
    scan_prefetch_ms: int = 200  #                      ms before a due instant a scanner idle
    #                                                   till then reads its keys ahead (0: never)
    scan_prefetch_messages: int = 65_536  #             keys read ahead at most
    scan_prefetch_bytes: int = 16 << 20  #              and bytes of their values
    delivery_queue_batches: int = 32  #                 bounded hand-off queue, in scan batches
    delivery_queue_bytes: int = 64 << 20  #             and in bytes of the queued messages'
    #                                                   stored values (estimated; large bodies)
    delivery_batch_max: int = 4096  #                   messages per log append + RocksDB commit
    segment_size: int = DEFAULT_SEGMENT_SIZE  #         bytes per CommitLog segment file (a fresh
    #                                                   server allocates one; larger for big logs)
    rocksdb_memory_bytes: int = 256 << 20  #            RocksDB memory: memtables + block cache
    flush_policy: str = "async"  #                      "async" (every flush_interval_ms) | "sync"
    flush_interval_ms: int = 200  #                     ms between async CommitLog flushes
    sync_writes: bool = False  #                        fsync the RocksDB WAL on every write
    max_delay_ms: int = TEN_YEARS_MS  #                 ms; beyond -> DELAY_TOO_LONG
    message_delay_level: str = DEFAULT_DELAY_LEVELS  #  RocketMQ 4.x levels (units s, m, h, d)
    retention_ms: int = 72 * 3600 * 1000  #             ms a final status stays readable
    max_body_bytes: int = 4 << 20  #                    bytes; a larger body -> PAYLOAD_TOO_LARGE
    max_answer_bytes: int = 8 << 20  #                  bytes of bodies in one pull or check-back
    #                                                   poll answer, past its first message
    listing_scan_budget: int = 100_000  #               timer keys one scheduled-listing page reads
    compact_after_deletes: int = 1_000_000  #           delivered keys of a shard between clean-ups
    #                                                   (delete_range + compaction) of its prefix
    cleanup_interval_ms: int = 60_000  #                ms; a shard's delivered prefix is cleaned
    #                                                   at least this often while it grows
    retry_max_backoff_ms: int = 60_000  #               ms; back-off = min(n * 100 ms, this)
    backlog_topic_labels: int = 50  #                   topics with their own backlog label in
    #                                                   /metrics and stats; the rest: "__other__"
    transaction_timeout_ms: int = 6_000  #              ms; minimum check immunity
    transaction_check_interval_ms: int = 30_000  #      ms between check-backs of one message
    transaction_check_max: int = 15  #                  checks before DISCARDED
    transaction_unanswered_checks: str = "count"  #     a check due with no callback that no poll
    #                                                   takes: "count" (RocketMQ: a round counts
    #                                                   whether a producer answers or not) |
    #                                                   "wait" (counts only when taken)
    transaction_callback_allowed_hosts: tuple[str, ...] = ()  # check-callback URL hosts
    #                                                   ("*.example.com": subdomains); () = none
    transaction_callback_timeout_ms: int = 3_000  #     ms per check-callback POST; past it: UNKNOWN
    transaction_callback_workers: int = 4  #            concurrent check-callback POSTs
    max_reconsume_times: int = 16  #                   nacks of a message before it is a dead letter
    group_lease_window: int = 10_000  #                 messages; a group leases a log's offsets
    #                                                   only below committedOffset + this (bounds
    #                                                   its leases and unfilled acks, per log)
    max_groups_per_topic: int = 1_000  #               consumer groups (competing members) per
    #                                                   topic; a receive creating one more -> 409
    group_metric_labels: int = 50  #                    groups with their own label in /metrics;
    #                                                   the rest summed under "__other__"
    group_quick_retries_per_s: int = 100  #             a group's quick retries (nacks with
    #                                                   delayMs < 1 s, redriven dead letters) a
    group_quick_retry_burst: int = 2_000  #             second, and at most this many at once
    #                                                   (past them: 429 TOO_MANY_REQUESTS)
    disk_reserve_bytes: int = 64 << 20  #               bytes; less free on RocksDB's filesystem ->
    #                                                   writes refused (503) before ENOSPC; 0 = off
    commitlog_retention_ms: int = 72 * 3600 * 1000  #   ms; a CommitLog segment whose newest record
    #                                                   is older is deleted (RocketMQ's
    #                                                   fileReservedTime; scheduler/retention.py)
    disk_clean_ratio: float = 0.85  #                   used / size of the data directory's file
    #                                                   system past which the oldest segments go
    #                                                   early (diskMaxUsedSpaceRatio); 1.0 = never
    disk_retry_interval_ms: int = 1_000  #              ms between free-space re-checks (and RocksDB
    #                                                   reopens) while writes are refused

    @property
    def max_record_bytes(self) -> int:
        """Bytes of body and attributes (tags, keys, properties) one message may have: what a
        CommitLog segment holds besides the record's framing and names."""
        return self.segment_size - HEADER_SIZE - RECORD_SLACK

    def check(self) -> DelayLevels:
        """Validate the tunables; returns the parsed delay levels. InvalidArgument on a bad
        one."""
        levels = DelayLevels.parse(self.message_delay_level)
        for name in _POSITIVE:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"engine setting {name} must be a positive integer, got "
                                      f"{value!r}")
        if not isinstance(self.max_reconsume_times, int) or self.max_reconsume_times < 0:
            raise InvalidArgument("engine setting max_reconsume_times must be an integer >= 0")
        for name in ("retention_ms", "scan_interval_ms", "scan_prefetch_ms"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"engine setting {name} must be >= 0")
        ratio = self.disk_clean_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
            raise InvalidArgument(f"engine setting disk_clean_ratio must be a number in (0, 1], "
                                  f"got {ratio!r}")
        if self.max_record_bytes < self.max_body_bytes:
            raise InvalidArgument(
                f"segment_size={self.segment_size} cannot hold a message of max_body_bytes="
                f"{self.max_body_bytes} (it would be accepted and never delivered): make "
                f"segment_size at least max_body_bytes + {RECORD_SLACK + HEADER_SIZE}")
        if levels.max_delay_ms > self.max_delay_ms:
            raise InvalidArgument(f"messageDelayLevel has a level of {levels.max_delay_ms} ms, "
                                  f"beyond max_delay_ms={self.max_delay_ms}")
        return levels


#: the tunables that must be integers >= 1
_POSITIVE = ("timer_shards", "scan_batch_size", "scan_batch_bytes", "scan_prefetch_messages",
             "scan_prefetch_bytes", "delivery_queue_batches",
             "delivery_queue_bytes", "delivery_batch_max",
             "max_delay_ms", "max_body_bytes", "retry_max_backoff_ms", "compact_after_deletes",
             "cleanup_interval_ms", "flush_interval_ms", "group_lease_window",
             "listing_scan_budget", "max_answer_bytes", "backlog_topic_labels",
             "max_groups_per_topic", "group_metric_labels", "group_quick_retries_per_s",
             "group_quick_retry_burst",
             "commitlog_retention_ms")
