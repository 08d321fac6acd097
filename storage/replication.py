"""Cluster mode's physical replication: what a node writes, shipped as write-ahead records.

Every state change of hourglass ends in two choke points: ``CommitLog.append_batch`` (and
its ``revoke``) and ``RocksStore.write``. With a ``Replicator`` attached to both, the
leader ships exactly what they write, as PostgreSQL's streaming replication ships its WAL:

- A **record** is the CommitLog operations since the previous record (each append with the
  position it started at, each revoke with its position), then the operations of ONE
  RocksDB batch (``Batch.ops``), msgpack-encoded (``encode_record`` / ``decode_record``).
- The **leader** (``LeaderReplicator``), under one lock: encodes the record, publishes it
  to the write-ahead stream with the sequence it last saw as the expected last one (the
  sink fences: a deposed leader's publish is refused), puts the sequence it got back and
  the log's end into the same batch (``META_CLUSTER_SEQ``, ``META_CLUSTER_LOG_END``),
  writes it locally, and only then returns (so the caller answers after the stream has it).
  A refused or failed publish deposes it for good: the log's unpublished tail is revoked
  and every later write or append raises ``NotLeader``.
- A **follower** applies each record with ``apply_record``: the appends at exactly the
  recorded positions (its log's end must equal each one), the revokes, then the batch with
  the record's sequence. Logs are byte-identical at the same offsets by construction (same
  segment size, same payloads, same start positions). ``FollowerGuard`` refuses every
  other write, so a follower's engine can never diverge from the stream.
- On start a node truncates what its log holds past ``META_CLUSTER_LOG_END`` (a tail
  appended but never published, or published but never written: the stream redelivers it)
  with ``settle_log``.

This module knows nothing of NATS: the stream is a ``Sink`` (scheduler/cluster/ has the
JetStream one; tests use an in-memory one).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from storage.batch import OP_DELETE, OP_DELETE_RANGE, OP_PUT, OP_PUT_SORTED, Batch
from storage.constants import CF_META, META_CLUSTER_LOG_END, META_CLUSTER_SEQ
from storage.errors import HourglassError, NotLeader, ReplicationError
from storage.keys import pack_u64, unpack_u64

log = logging.getLogger(__name__)

RECORD_VERSION = 1
LOG_APPEND, LOG_REVOKE = 0, 1
#: a stream message: one byte of kind, then the record (WHOLE) or a piece of it (PART, more
#: follow; LAST, the record is complete). A record longer than the stream's largest message
#: (NATS's max_payload, 1 MiB by default) goes in pieces: a send batch of 1000 bodies of 4 KiB
#: must not depose the leader. Pieces of a leader that died before its LAST are dropped by the
#: next WHOLE (every leader's first record is a WHOLE one, its fence): only a complete record
#: is applied.
WHOLE, PART, LAST = 0x52, 0x50, 0x45  # "R", "P", "E"
DEFAULT_MAX_MESSAGE_BYTES = 900 << 10
# (LOG_APPEND, start, payloads) or (LOG_REVOKE, position, None)
LogOp = tuple[int, int, list[bytes] | None]


class Replicator(Protocol):
    """What RocksStore and CommitLog call when one is attached (None: single-node mode)."""

    def appended(self, start: int, end: int, payloads: Sequence[bytes]) -> None:
        """``payloads`` were appended from position ``start``, the log now ends at ``end``
        (CommitLog lock held); may raise to refuse them (the append is then rolled back)."""

    def revoked(self, position: int) -> None:
        """The log was cut back to ``position`` (CommitLog lock held)."""

    def write(self, batch: Batch, sync: bool | None) -> None:
        """Replicate ``batch`` and write it (``RocksStore.write_local``)."""

    def check_leading(self) -> None:
        """Raise NotLeader unless this node may act as the leader now: what only the leader
        decides without a write (a group's receive leases in memory) asks it first."""


class Sink(Protocol):
    """The write-ahead stream as the leader sees it."""

    def publish(self, record: bytes, expected_last_seq: int) -> int:
        """Append ``record`` if the stream's last sequence is ``expected_last_seq``; returns
        its sequence. Raises NotLeader when refused (fenced), anything else when unsure."""

    def check_leading(self) -> None:
        """Raise NotLeader unless this node's lease still holds (by its own clock)."""


class _Store(Protocol):
    def batch(self) -> Batch: ...
    def write_local(self, batch: Batch, *, sync: bool | None = None) -> None: ...
    def get(self, cf: str, key: bytes) -> bytes | None: ...


class _Log(Protocol):
    @property
    def end_position(self) -> int: ...
    def append_batch(self, payloads: Sequence[bytes]) -> list[int]: ...
    def revoke(self, position: int) -> None: ...


# --- the record ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Record:
    log_ops: list[LogOp]
    ops: list[tuple[int, str, Any, Any]]


_packer = msgpack.Packer(use_bin_type=True)


def encode_record(log_ops: Sequence[LogOp], ops: Sequence[tuple[int, str, Any, Any]]) -> bytes:
    out: bytes = _packer.pack((RECORD_VERSION, log_ops, ops))
    return out


def decode_record(data: bytes) -> Record:
    try:
        version, log_ops, ops = msgpack.unpackb(data, raw=False, use_list=True)
    except Exception as exc:
        raise ReplicationError(f"undecodable write-ahead record: {exc}") from exc
    if version != RECORD_VERSION:
        raise ReplicationError(f"write-ahead record version {version} (this node reads "
                               f"{RECORD_VERSION}): upgrade this node")
    return Record([(int(k), int(p), x) for k, p, x in log_ops],
                  [(int(o), str(cf), a, b) for o, cf, a, b in ops])


def stream_messages(record: bytes, max_bytes: int) -> list[bytes]:
    """``record`` as the stream messages that carry it (``max_bytes`` each at most)."""
    room = max_bytes - 1
    if len(record) <= room:
        return [bytes((WHOLE,)) + record]
    pieces = [record[i:i + room] for i in range(0, len(record), room)]
    return [bytes((PART,)) + p for p in pieces[:-1]] + [bytes((LAST,)) + pieces[-1]]


def add_ops(batch: Batch, ops: Sequence[tuple[int, str, Any, Any]]) -> None:
    """Add captured operations to ``batch`` (in their order)."""
    for op, cf, a, b in ops:
        if op == OP_PUT:
            batch.put(cf, a, b)
        elif op == OP_DELETE:
            batch.delete(cf, a)
        elif op == OP_DELETE_RANGE:
            batch.delete_range(cf, a, b)
        elif op == OP_PUT_SORTED:
            batch.put_sorted(cf, a, b)
        else:
            raise ReplicationError(f"unknown batch operation {op}")


# --- positions a node has applied -------------------------------------------------------------
def applied_seq(store: _Store) -> int:
    raw = store.get(CF_META, META_CLUSTER_SEQ)
    return 0 if raw is None else unpack_u64(raw)


def recorded_log_end(store: _Store) -> int:
    raw = store.get(CF_META, META_CLUSTER_LOG_END)
    return 0 if raw is None else unpack_u64(raw)


def settle_log(store: _Store, commitlog: _Log) -> int:
    """Cut the log back to the end recorded with the last applied record (what it holds past
    that was never applied through the stream); returns the bytes cut."""
    end, recorded = commitlog.end_position, recorded_log_end(store)
    if end < recorded:
        raise ReplicationError(
            f"the CommitLog ends at {end}, before the position {recorded} recorded with the "
            "last applied record: its tail was lost (power loss with async flushing?); wipe "
            "this node's data directory and let it rejoin from the stream")
    if end > recorded:
        log.warning("cutting the CommitLog back from %d to %d: a tail never applied through "
                    "the write-ahead stream", end, recorded)
        commitlog.revoke(recorded)
    return end - recorded


def _mark(batch: Batch, seq: int, log_end: int) -> None:
    batch.put(CF_META, META_CLUSTER_SEQ, pack_u64(seq))
    batch.put(CF_META, META_CLUSTER_LOG_END, pack_u64(log_end))


# --- follower -----------------------------------------------------------------------------------
class FollowerGuard:
    """The replicator of a follower: refuses every write and append but ``apply``'s."""

    def __init__(self, store: _Store, commitlog: _Log) -> None:
        self._store = store
        self._log = commitlog
        self._lock = threading.Lock()
        self._applying = False
        self.seq = applied_seq(store)  # the last record applied (persisted with it)
        self.consumed = self.seq  # the last stream message taken (pieces of a record too)
        self._pieces: list[bytes] = []

    def check_leading(self) -> None:
        raise NotLeader("this node is a follower")

    def appended(self, start: int, end: int, payloads: Sequence[bytes]) -> None:
        if not self._applying:
            raise NotLeader("this node is a follower: it appends only what the leader wrote")

    def revoked(self, position: int) -> None:
        pass  # (settle_log at start, apply's revokes: both its own)

    def write(self, batch: Batch, sync: bool | None) -> None:
        raise NotLeader("this node is a follower: writes go to the leader")

    def apply(self, seq: int, message: bytes) -> Record | None:
        """Take the stream message ``seq`` (which must follow the last one taken); apply the
        record it completes, if it does (returned), else None (a piece kept for later)."""
        with self._lock:
            if seq != self.consumed + 1:
                raise ReplicationError(f"stream message {seq} does not follow {self.consumed}")
            kind, body = message[0] if message else -1, message[1:]
            if kind == WHOLE:  # a new leader begins with one (its fence): never a piece
                if self._pieces:
                    log.warning("dropping %d pieces of a record its leader never finished",
                                len(self._pieces))
                    self._pieces = []
            if kind == PART:
                self._pieces.append(body)
                self.consumed = seq
                return None
            if kind == LAST:
                if not self._pieces:  # its first pieces were dropped: never complete
                    raise ReplicationError(f"stream message {seq} ends a record never begun")
                self._pieces.append(body)
                body, self._pieces = b"".join(self._pieces), []
            elif kind != WHOLE:
                raise ReplicationError(f"stream message {seq} is of no known kind")
            record = decode_record(body)
            self._applying = True
            try:
                apply_record(self._store, self._log, seq, record)
            finally:
                self._applying = False
            self.seq = self.consumed = seq
            return record


def apply_record(store: _Store, commitlog: _Log, seq: int, record: Record) -> None:
    """The log operations at exactly their positions, then the batch with ``seq``."""
    for kind, position, payloads in record.log_ops:
        if kind == LOG_APPEND:
            if commitlog.end_position != position:
                raise ReplicationError(
                    f"record {seq} appends at {position} but this node's log ends at "
                    f"{commitlog.end_position}")
            assert payloads is not None
            commitlog.append_batch(payloads)
        elif kind == LOG_REVOKE:
            commitlog.revoke(position)
        else:
            raise ReplicationError(f"unknown log operation {kind} in record {seq}")
    batch = store.batch()
    add_ops(batch, record.ops)
    _mark(batch, seq, commitlog.end_position)
    store.write_local(batch)


# --- leader -------------------------------------------------------------------------------------
class LeaderReplicator:
    """The replicator of the leader: every write is a record in the stream first."""

    def __init__(self, store: _Store, commitlog: _Log, sink: Sink, *,
                 last_seq: int | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        """``last_seq``: the stream's last sequence as this node consumed it (default: the
        applied one; more when the stream ends in pieces of a record never finished)."""
        self._store = store
        self._log = commitlog
        self._sink = sink
        self._max_message_bytes = max_message_bytes
        self._lock = threading.Lock()  # THE replication lock: encode, publish, write
        self._pending_lock = threading.Lock()  # the log operations not yet shipped
        self._pending: list[LogOp] = []
        self.written_seq = applied_seq(store)  # the last record also written here
        self.seq = self.written_seq if last_seq is None else last_seq  # the last published
        self.published_end = recorded_log_end(store)
        self._pending_end = self.published_end  # the log's end after the pending operations
        self.deposed: str | None = None  # why, once deposed

    @property
    def lock(self) -> threading.Lock:
        """The replication lock: held, no record is being shipped or written (a snapshot)."""
        return self._lock

    def check_leading(self) -> None:
        if self.deposed is not None:
            raise NotLeader(f"this node is no longer the leader ({self.deposed})")
        self._sink.check_leading()

    def appended(self, start: int, end: int, payloads: Sequence[bytes]) -> None:
        if self.deposed is not None:
            raise NotLeader(f"this node is no longer the leader ({self.deposed})")
        with self._pending_lock:
            self._pending.append((LOG_APPEND, start, list(payloads)))
            self._pending_end = end

    def revoked(self, position: int) -> None:
        with self._pending_lock:
            self._pending.append((LOG_REVOKE, position, None))
            self._pending_end = position

    def write(self, batch: Batch, sync: bool | None) -> None:
        with self._lock:
            if self.deposed is not None:
                raise NotLeader(f"this node is no longer the leader ({self.deposed})")
            with self._pending_lock:
                log_ops, self._pending = self._pending, []
                end = self._pending_end
            if batch.ops is None:  # made before this replicator was attached: not shippable
                with self._pending_lock:
                    self._pending[:0] = log_ops
                raise ReplicationError("a batch made before cluster mode's replicator was "
                                       "attached cannot be shipped")
            record = encode_record(log_ops, batch.ops)
            try:
                seq = self.seq
                for message in stream_messages(record, self._max_message_bytes):
                    seq = self._sink.publish(message, seq)
            except BaseException as exc:
                self._depose(f"the write-ahead stream refused or lost a record: {exc}")
                if isinstance(exc, NotLeader):
                    raise
                raise NotLeader(f"the write-ahead stream failed: {exc}") from exc
            self.seq = seq
            if log_ops:
                self.published_end = end
            _mark(batch, seq, self.published_end)
            try:
                self._store.write_local(batch, sync=sync)
                self.written_seq = seq
            except BaseException:
                # the stream has it, this node does not: it must re-apply it as a follower
                self._depose(f"record {seq} is in the stream but its local write failed")
                raise

    def _depose(self, why: str) -> None:
        """Never write again; take back what the log holds past the published end."""
        self.deposed = why
        log.error("deposed: %s", why)
        with self._pending_lock:
            self._pending = []
            self._pending_end = self.published_end
        try:
            if self._log.end_position > self.published_end:
                self._log.revoke(self.published_end)
        except (HourglassError, OSError):  # a restart as follower cuts it (settle_log)
            log.exception("could not revoke the unpublished log tail")


__all__ = ["FollowerGuard", "LeaderReplicator", "Record", "Replicator", "Sink", "add_ops",
           "applied_seq", "apply_record", "decode_record", "encode_record", "recorded_log_end",
           "settle_log", "stream_messages"]
