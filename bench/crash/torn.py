"""A torn CommitLog tail, made while the server is down: the last record cut mid-way.

A kill -9 in the middle of an append's memmove leaves the batch's bytes partly copied into
the page cache; those records were never committed to RocksDB, so none of them was
acknowledged (sends answer after the RocksDB write; scanned deliveries keep their timer keys
until it). This module reproduces that on disk, beyond the durable checkpoint:

- records past the position applied to RocksDB (if the kill left any): the last one is cut;
- otherwise a new record (``torn-N``, a message nobody sent) is framed and only part of it
  written, as an append in progress would leave it.

The cut is one of: ``zero`` (the rest reads as zeros), ``garble`` (random bytes instead of
the rest; the header may survive, the CRC will not match), ``truncate`` (the segment file
ends inside the record; only when it is the last file, since a spare segment made ahead
would then start past a shorter file, a layout recovery rightly refuses as foreign).
Recovery must drop exactly that record and keep everything before.
"""

from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from storage.commitlog import CHECKPOINT_NAME, CommitLog
from storage.constants import CF_META, META_APPLIED_POSITION
from storage.consume_queue import ConsumeQueue
from storage.keys import unpack_u64
from storage.log_format import CRC_SEED, HEADER, RECORD_MAGIC
from storage.records import LogRecord, encode_log_record
from storage.rocks import RocksStore
from storage.segment import NAME_PATTERN

MODES = ("zero", "garble", "truncate")


@dataclass(frozen=True, kw_only=True)
class TornWrite:
    mode: str
    position: int  # where the cut starts (global log position)
    record_at: int  # position of the record that was cut
    fabricated: tuple[str, str] | None  # (topic, msgId) of a record nobody sent, if made up
    dropped_records: int  # real (unapplied) records past the cut

    def describe(self) -> str:
        what = (f"fabricated {self.fabricated[1]}" if self.fabricated
                else f"{self.dropped_records} unapplied record(s)")
        return f"{self.mode} at {self.position} ({what})"


def _store_state(data_dir: Path, topic: str) -> tuple[int, int]:
    """(log position applied to RocksDB, next queue offset of ``topic``)."""
    store = RocksStore(data_dir / "rocksdb", timer_shards=None, read_only=True)
    try:
        raw = store.get(CF_META, META_APPLIED_POSITION)
        next_offset = ConsumeQueue(store).end_offset(topic)
    finally:
        store.close()
    return (0 if raw is None else unpack_u64(raw)), next_offset


def _frame(payload: bytes) -> bytes:
    """A record as the CommitLog frames it (storage/log_format.py)."""
    return HEADER.pack(RECORD_MAGIC, len(payload),
                       crc32c(payload, len(payload) ^ CRC_SEED)) + payload


def _torn_length(record: bytes, rng: random.Random) -> int:
    """How much of ``record`` a torn write keeps: at least one byte, and never past its last
    non-zero byte (the rest of a segment reads as zeros, so a cut inside trailing zero bytes
    would leave the record whole, not torn)."""
    last = max((i for i, b in enumerate(record) if b), default=0)
    return rng.randrange(1, last + 1) if last >= 1 else 1


def _flushed_position(log_dir: Path) -> int:
    try:
        raw = (log_dir / CHECKPOINT_NAME).read_bytes()
    except FileNotFoundError:
        return 0
    return int(struct.unpack_from("<Q", raw)[0]) if len(raw) >= 8 else 0


def _segment_of(log_dir: Path, position: int) -> tuple[Path, int, int, bool]:
    """(path, base, size, is the last file) of the segment file holding ``position``."""
    paths = sorted(p for p in log_dir.iterdir() if NAME_PATTERN.match(p.name))
    for path in paths:
        base, size = int(path.name), path.stat().st_size
        if base <= position < base + size:
            return path, base, size, path == paths[-1]
    raise FileNotFoundError(f"no CommitLog segment holds position {position}")


def _cut(path: Path, offset: int, stop: int, mode: str, rng: random.Random) -> None:
    """Damage [offset, stop) of the file as ``mode`` says."""
    if mode == "truncate":
        os.truncate(path, offset)
        return
    with open(path, "r+b") as f:
        f.seek(offset)
        n = stop - offset
        f.write(bytes(n) if mode == "zero" else rng.randbytes(n))
        f.flush()
        os.fsync(f.fileno())


def tear_tail(data_dir: Path, rng: random.Random, *, topic: str, tag: str,
              mode: str | None = None) -> TornWrite | None:
    """Tear the log's tail of a stopped server's ``data_dir`` (see the module docstring);
    None when the last segment is exactly full and no later one exists yet."""
    log_dir = data_dir / "commitlog"
    applied, next_offset = _store_state(data_dir, topic)
    floor = max(applied, _flushed_position(log_dir))
    log = CommitLog(log_dir, read_only=True)
    try:
        end = log.end_position
        tail = [pos for pos, _ in log.iter_from(floor)] if floor < end else []
        last_frame = _frame(bytes(log.read(tail[-1]))) if tail else b""
    finally:
        log.close()
    mode = mode or rng.choice(MODES)
    if tail:
        pos = tail[-1]
        cut = pos + _torn_length(last_frame, rng)
        path, base, _, last = _segment_of(log_dir, pos)
        if mode == "truncate" and not last:
            mode = "zero"  # a shorter file before the spare segment is a foreign layout
        _cut(path, cut - base, end - base, mode, rng)
        return TornWrite(mode=mode, position=cut, record_at=pos, fabricated=None,
                         dropped_records=1)
    msg_id = f"torn-{tag}"
    # at the topic's next offset: were recovery to keep it, it would show in the log's tail
    payload = encode_log_record(LogRecord(topic=topic, msg_id=msg_id, queue_offset=next_offset,
                                          body=b"torn", deliver_at=0, stored_at=0))
    frame = _frame(payload)
    try:
        path, base, size, last = _segment_of(log_dir, end)
    except FileNotFoundError:
        return None
    if mode == "truncate" and not last:
        mode = "zero"
    if end - base + len(frame) > size:  # no room left in this segment: tear at its very end
        frame = frame[: size - (end - base)]
    keep = _torn_length(frame, rng)
    with open(path, "r+b") as f:
        f.seek(end - base)
        f.write(frame[:keep] if mode != "garble" else frame[:HEADER.size] +
                rng.randbytes(max(0, len(frame) - HEADER.size)))
    if mode == "truncate":
        os.truncate(path, end - base + keep)
    return TornWrite(mode=mode, position=end + keep, record_at=end,
                     fabricated=(topic, msg_id), dropped_records=0)
