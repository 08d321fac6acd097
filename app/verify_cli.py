"""``hourglass verify``: an integrity check of a data directory, for post-mortems.

It changes nothing on disk (the CommitLog and the store are opened read-only, so it also runs
beside a live server) and checks:

1. the CommitLog: every record's framing and CRC32C (``CommitLog.verify``);
2. the applied position recorded in RocksDB is not past the log's end;
3. the consume queues: each topic's offsets run from its first offset (0, or where the log's
   retention moved it: scheduler/retention.py) without a gap, and each entry points at a log
   record of that topic with that queue offset and the recorded size: none points below the
   log's first position (a log that starts past position 0 is a log whose oldest segments
   were deleted).

Exit code 0 when everything is consistent, 1 when a problem was found, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from storage.commitlog import CommitLog
from storage.constants import CF_CQ, CF_META, COMMITLOG_DIR, META_APPLIED_POSITION, ROCKSDB_DIR
from storage.consume_queue import run_entries, topic_first_key
from storage.errors import HourglassError
from storage.keys import decode_cq_key, unpack_u64
from storage.records import decode_log_record
from storage.rocks import RocksStore

MAX_LISTED = 20  # problems listed one by one; the rest are counted


@dataclass
class Report:
    log_records: int = 0
    log_bytes: int = 0
    log_end: int = 0
    log_first: int = 0  # where the log starts (retention deleted the segments before)
    applied_position: int = 0
    topics: dict[str, int] = field(default_factory=dict)  # topic -> consume-queue end offset
    entries: int = 0  # consume-queue entries checked (from each topic's first offset)
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_LISTED:
            self.problems.append(text)


def verify(data_dir: Path) -> Report:
    report = Report()
    log = CommitLog(data_dir / COMMITLOG_DIR, read_only=True)
    try:
        checked = log.verify()
        report.log_records, report.log_bytes = checked.records, checked.bytes
        report.log_end = log.end_position
        report.log_first = log.first_position
        for error in checked.errors:
            report.problem(f"commitlog: {error}")
        store = RocksStore(data_dir / ROCKSDB_DIR, timer_shards=None, read_only=True)
        try:
            raw = store.get(CF_META, META_APPLIED_POSITION)
            report.applied_position = 0 if raw is None else unpack_u64(raw)
            if report.applied_position > report.log_end:
                report.problem(f"applied position {report.applied_position} is past the "
                               f"log's end {report.log_end}: log records were lost")
            _check_consume_queues(store, log, report)
        finally:
            store.close()
    finally:
        log.close()
    return report


def _check_consume_queues(store: RocksStore, log: CommitLog, report: Report) -> None:
    for key, value in store.scan(CF_CQ):
        topic, first = decode_cq_key(key)
        if topic not in report.topics:  # its first entry: where retention left the topic
            raw = store.get(CF_META, topic_first_key(topic))
            report.topics[topic] = 0 if raw is None else unpack_u64(raw)
        try:
            entries = run_entries(key, value, len(key) - 8)
        except HourglassError as exc:
            report.problem(f"consume queue {topic}@{first}: {exc}")
            continue
        for offset, position, size in entries:
            _check_entry(log, report, topic, offset, position, size)


def _check_entry(log: CommitLog, report: Report, topic: str, offset: int, position: int,
                 size: int) -> None:
    """One consume-queue entry: no gap before it, and the record it points at is its own."""
    expected = report.topics.get(topic, 0)
    if offset != expected:
        report.problem(f"consume queue {topic}: offset {offset} where {expected} was "
                       "expected (a gap)")
    report.topics[topic] = offset + 1
    report.entries += 1
    try:
        payload = log.read(position)
        record = decode_log_record(payload)
    except HourglassError as exc:
        report.problem(f"consume queue {topic}@{offset}: log position {position}: {exc}")
        return
    if (record.topic, record.queue_offset, len(payload)) != (topic, offset, size):
        report.problem(
            f"consume queue {topic}@{offset}: points at {record.topic}@"
            f"{record.queue_offset} ({len(payload)} bytes, expected {size})")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="hourglass verify",
        description="Check a data directory's CommitLog and consume queues (read-only).")
    parser.add_argument("--data-dir", default="data", type=Path,
                        help="the server's data directory (default: ./data)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if not (args.data_dir / COMMITLOG_DIR).is_dir() or not (args.data_dir / ROCKSDB_DIR).is_dir():
        print(f"hourglass verify: {args.data_dir} is not an hourglass data directory "
              f"(no {COMMITLOG_DIR}/ and {ROCKSDB_DIR}/ in it)", file=sys.stderr)
        return 2
    try:
        report = verify(args.data_dir)
    except HourglassError as exc:
        print(f"hourglass verify: cannot open {args.data_dir}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print(f"commitlog: {report.log_records} records, {report.log_bytes} payload bytes, "
              f"from {report.log_first} to {report.log_end}; applied position "
              f"{report.applied_position}")
        print(f"consume queues: {len(report.topics)} topics, {report.entries} entries")
        for problem in report.problems:
            print(f"PROBLEM: {problem}")
        if report.problem_count > len(report.problems):
            print(f"... and {report.problem_count - len(report.problems)} more problems")
        print("OK" if not report.problem_count else f"{report.problem_count} problem(s) found")
    return 0 if not report.problem_count else 1
