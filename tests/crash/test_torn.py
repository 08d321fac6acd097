"""The torn tail the crash harness makes is the one a kill mid-append leaves, and recovery
drops exactly it: the records before survive, appends after it work and survive a reopen."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from bench.crash.torn import MODES, _frame, _torn_length, tear_tail
from storage.commitlog import CHECKPOINT_NAME, CommitLog
from storage.constants import CF_META, META_APPLIED_POSITION
from storage.keys import pack_u64
from storage.records import LogRecord, decode_log_record, encode_log_record
from storage.rocks import RocksStore

SEGMENT = 64 * 1024


def make_data_dir(tmp_path: Path, records: int, applied: int) -> tuple[Path, list[bytes]]:
    """A stopped server's data directory: ``records`` log records, the first ``applied``
    of them applied to RocksDB and flushed (the checkpoint says so), the rest not."""
    data = tmp_path / "data"
    payloads = [encode_log_record(LogRecord(topic="t", msg_id=f"m{i}", queue_offset=i,
                                            body=b"x" * (50 + i * 7))) for i in range(records)]
    log = CommitLog(data / "commitlog", segment_size=SEGMENT)
    positions = log.append_batch(payloads)
    end = log.end_position
    log.close()
    floor = positions[applied] if applied < records else end
    raw = struct.pack("<Q", floor)
    (data / "commitlog" / CHECKPOINT_NAME).write_bytes(raw + struct.pack("<I", crc32c(raw)))
    store = RocksStore(data / "rocksdb", timer_shards=2)
    batch = store.batch()
    batch.put(CF_META, META_APPLIED_POSITION, pack_u64(floor))
    store.write(batch)
    store.close()
    return data, payloads


def records_of(log: CommitLog) -> list[bytes]:
    return [bytes(p) for _, p in log.iter_from(0)]


SEEDS = range(8)  # cuts at different places (a record's last bytes are often zeros: flags=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_a_fabricated_half_written_record_is_dropped(tmp_path: Path, mode: str,
                                                      seed: int) -> None:
    data, payloads = make_data_dir(tmp_path, records=30, applied=30)
    torn = tear_tail(data, random.Random(seed), topic="t", tag="x", mode=mode)
    assert torn is not None and torn.mode == mode and torn.fabricated == ("t", "torn-x")
    damaged = CommitLog(data / "commitlog", read_only=True)
    try:
        report = damaged.verify()
    finally:
        damaged.close()
    segment = data / "commitlog" / f"{0:020d}"
    if torn.mode == "truncate":  # the file ends inside the record (under a header's length
        assert segment.stat().st_size < SEGMENT  # of it left reads as the segment's padding)
    else:
        assert not report.ok  # the damage is really there
    log = CommitLog(data / "commitlog", segment_size=SEGMENT)
    assert records_of(log) == payloads
    log.append_batch([b"after"])
    log.close()
    log = CommitLog(data / "commitlog", segment_size=SEGMENT)
    assert records_of(log) == [*payloads, b"after"]
    assert all(decode_log_record(p).msg_id != "torn-x" for p in payloads)
    log.close()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mode", MODES)
def test_the_last_unapplied_record_is_cut_and_only_it(tmp_path: Path, mode: str,
                                                      seed: int) -> None:
    data, payloads = make_data_dir(tmp_path, records=30, applied=25)
    torn = tear_tail(data, random.Random(seed), topic="t", tag="y", mode=mode)
    assert torn is not None and torn.fabricated is None and torn.dropped_records == 1
    log = CommitLog(data / "commitlog", segment_size=SEGMENT)
    assert records_of(log) == payloads[:-1]
    log.close()


@given(st.binary(max_size=60), st.integers(0, 8), st.randoms(use_true_random=False))
def test_a_torn_record_never_reads_back_whole(payload: bytes, trailing_zeros: int,
                                             rng: random.Random) -> None:
    """What a tear keeps, followed by the zeros the rest of a segment holds, is never the
    whole record (a cut inside trailing zero bytes would leave it valid: the bug this pins)."""
    record = _frame(payload + bytes(trailing_zeros))
    keep = _torn_length(record, rng)
    assert 1 <= keep < len(record)
    assert record[:keep] + bytes(len(record) - keep) != record
