"""CommitLog: fixed-size memory-mapped segments of length+magic+CRC32C framed records.

A position is a global byte offset: segment start offset + offset inside the segment.

Records are framed as storage/log_format.py describes (length, magic, CRC32C, payload).
A record never spans segments: when the next record does not fit, an end-of-segment header
(magic ``EOS_MAGIC``) is written if there is room for one, and the record goes at the start
of the next segment (base = previous base + previous size). Bytes after the last record are
zero (segments are allocated zero-filled), so "zero header" means "end of log".

Durability. Appends go into the page cache (large ones with ``pwrite``, small ones through
the mapping, which serves the reads; storage/segment.py says why): they survive a kill -9
(the page cache belongs to the kernel) but a power cut only once msync'ed.
``flush_policy="sync"`` msyncs each batch before ``append_batch`` returns; ``"async"`` msyncs
every ``flush_interval_ms`` on a background thread.
Either way the thread records the last msync'ed position in ``checkpoint`` (12 bytes).

Recovery on open walks the records after the checkpoint (those before it were msync'ed): the
first bad one (bad magic, impossible length, CRC mismatch, zeros) is where a torn tail
starts, and everything from it is zeroed and later segments removed, so new appends are
clean. ``full_check=True`` walks every record instead and refuses (``CorruptionError``) a bad
one below the checkpoint, since truncating there would drop acknowledged records
(``repair=True`` truncates anyway). ``verify()`` reports every bad record without raising.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from crc32c import crc32c

from storage.errors import CorruptionError, InvalidArgument, OffsetExpired, StorageError
from storage.log_format import (
    CRC_SEED,
    EOS_MAGIC,
    HEADER,
    HEADER_SIZE,
    RECORD_MAGIC,
    Walk,
    frame,
    frame_headers,
    seal,
)
from storage.native import native
from storage.private import FILE_MODE, private_dir
from storage.segment import NAME_PATTERN, PWRITE_MIN_BYTES, Segment, fsync_dir

if TYPE_CHECKING:
    from storage.replication import Replicator

FLUSH_POLICIES = ("async", "sync")
MIN_SEGMENT_SIZE = 64
DEFAULT_SEGMENT_SIZE = 32 << 20  # a fresh server allocates (and maps) one segment
_CHECKPOINT = struct.Struct("<QI")  # flushed position, crc32c of those 8 bytes
CHECKPOINT_NAME = "checkpoint"
LOCK_NAME = "LOCK"


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    records: int
    bytes: int
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _lock_directory(directory: Path) -> int:
    """An exclusive flock on ``directory/LOCK``: one writer per log, across processes."""
    fd = -1
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, FILE_MODE)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if fd >= 0:
            os.close(fd)
        raise StorageError(f"CommitLog {directory} is in use by another writer: {exc}") from exc
    return fd


_REVOKE_PIECE = 1 << 20  # revoke zeroes at most this many bytes at a time
_UNBOUNDED = 1 << 62  # read_many without max_bytes
#: bytes a record takes on average (header and payload) from which a run of records is
#: written gathered, not framed into one buffer (``_write_run``; not measured between 100 B
#: records, where the copy into one buffer is cheaper than a piece each, and 16 KiB ones)
GATHER_MIN_RECORD = 4096
#: segments at the log's end whose pages the flusher leaves mapped in: the one appends go to
#: and the one before (a caught-up reader's); older ones it gives back (``_release_behind``)
KEEP_MAPPED = 2


def _written_end(seg: Segment, off: int) -> int:
    """Offset after the records written in ``seg`` from ``off`` and the end-of-segment header
    that may follow them."""
    mm, size = seg.mm, seg.size
    while size - off >= HEADER_SIZE:
        magic, length, _ = HEADER.unpack_from(mm, off)
        if magic != RECORD_MAGIC:
            return off + HEADER_SIZE if magic == EOS_MAGIC else off
        off += HEADER_SIZE + length
    return min(off, size)


def _just_appended(last: tuple[list[int], Sequence[bytes]], positions: Sequence[int],
                   room: int) -> list[bytes] | None:
    """``read_many``'s answer when ``positions`` are consecutive records of the last append
    (``last``: its positions and payloads) and all fit in ``room``: those payloads themselves;
    else None (read from the segments).

    A caught-up stream's frame (api/push.py) reads, right after each commit, what that commit
    appended: the same bytes the append framed and checksummed a moment before. Read back
    from the mapping they cost a copy and a second CRC32C each (with 16 KiB bodies, ~8 % of
    the drain's CPU, perf 2026-11-27) and can differ from the payloads only by a fault of the
    memory itself; records of older appends are read, and checked, from the segments."""
    done, payloads = last
    first = positions[0]
    if not done[0] <= first <= done[-1]:
        return None
    i = bisect.bisect_left(done, first)
    n = len(positions)
    if done[i:i + n] != (positions if isinstance(positions, list) else list(positions)):
        return None
    hit = list(payloads[i:i + n])
    if room < _UNBOUNDED and sum(map(len, hit)) > room:
        return None
    return hit


class CommitLog:
    def __init__(
        self, directory: str | Path, *, segment_size: int = DEFAULT_SEGMENT_SIZE,
        flush_policy: str = "async", flush_interval_ms: int = 200,
        read_only: bool = False, repair: bool = False, full_check: bool = False,
    ) -> None:
        """Opens (recovering: the tail after the last valid record is truncated) or creates.

        ``read_only`` maps the segments read-only and changes nothing on disk (no recovery,
        no flusher): for ``verify`` and analysis of a live or damaged log. ``full_check``
        validates every record on open, not just those after the last flush; ``repair``
        truncates at the first bad record even below the last flush (losing what follows).
        """
        if flush_policy not in FLUSH_POLICIES:
            raise InvalidArgument(f"flush_policy must be one of {FLUSH_POLICIES}")
        if segment_size < MIN_SEGMENT_SIZE or segment_size >= 1 << 32:
            raise InvalidArgument(f"segment_size must be in [{MIN_SEGMENT_SIZE}, 2**32)")
        if flush_interval_ms <= 0:
            raise InvalidArgument("flush_interval_ms must be > 0")
        self._dir = Path(directory)
        self._segment_size = segment_size
        self._sync = flush_policy == "sync"
        self._interval_s = flush_interval_ms / 1000
        self._read_only = read_only
        self._lock = threading.Lock()  # appends, rolls and the end position
        self._flush_lock = threading.Lock()  # msync + checkpoint
        self._flushed_cond = threading.Condition(threading.Lock())
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._closed = False
        self._load_errors: list[str] = []
        self._stop = threading.Event()
        #: set by an append that filled the last segment past half with no spare made yet
        #: (and by ``close``): the flusher makes the spare at once, not at its next tick
        self._spare_wanted = threading.Event()
        self._asked = -1  # the base of the segment whose spare was asked for last
        self._flusher: threading.Thread | None = None
        self._spare: Segment | None = None  # next segment, made ahead by the flusher
        self._retired: list[Segment] = []  # deleted by retention, mapping closed next time
        self._create_lock = threading.Lock()  # segment creation (appender vs flusher)
        self._lock_fd = -1
        self._end = self._flushed = 0
        self._replicator: Replicator | None = None  # cluster mode (storage/replication.py)
        #: the last append's (positions, payloads) until the next one or the flusher's tick:
        #: a read of exactly those records returns them (``read_many``)
        self._last: tuple[list[int], Sequence[bytes]] | None = None
        #: the last append went into the file with ``pwrite`` (a burst's: ``_prepare_spare``)
        self._bulk = False
        try:
            if not read_only:
                private_dir(self._dir)
                self._lock_fd = _lock_directory(self._dir)
            self._load_segments(repair)
            self._end = self._flushed = self._recover(repair, full_check)
            if not read_only:
                if not self._segments:
                    self._add(Segment.create(self._dir, 0, self._segment_size))
                # what survived a crash in the page cache but was never msync'ed: make it
                # durable before the checkpoint says so
                self._sync_range(min(self._read_checkpoint(), self._end), self._end)
                self._write_checkpoint(self._end)
        except BaseException:
            self._close_segments()
            self._unlock()
            raise
        if not read_only:
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"commitlog-flush:{self._dir.name}", daemon=True)
            self._flusher.start()

    # --- opening and recovery -------------------------------------------------------------------
    def _load_segments(self, repair: bool) -> None:
        if not self._dir.is_dir():
            raise StorageError(f"no CommitLog directory {self._dir}")
        paths = sorted(p for p in self._dir.iterdir() if NAME_PATTERN.match(p.name))
        if paths and paths[-1].stat().st_size == 0:
            # the spare segment a kill -9 interrupted between its creation and its allocation
            # (Segment.create): it never held a record; a writer removes it
            if not self._read_only:
                paths[-1].unlink()
                fsync_dir(self._dir)
            paths.pop()
        for n, path in enumerate(paths):
            seg = Segment.open(path, writable=not self._read_only)
            if self._segments and seg.base != self._segments[-1].end:
                seg.close()
                expected = self._segments[-1].end
                if self._read_only:
                    self._load_errors.append(f"segment {path.name} does not start at {expected}")
                    return
                if not repair:
                    raise CorruptionError(
                        f"CommitLog {self._dir}: segment {path.name} does not start where the "
                        f"previous one ends ({expected}); a file is missing or foreign. Open "
                        "with repair=True to drop it and every later segment.")
                for later in paths[n:]:
                    later.unlink()
                fsync_dir(self._dir)
                return
            self._add(seg)

    def _add(self, seg: Segment) -> None:
        self._segments.append(seg)
        self._bases.append(seg.base)

    def _read_checkpoint(self) -> int:
        try:
            raw = (self._dir / CHECKPOINT_NAME).read_bytes()
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StorageError(f"cannot read CommitLog checkpoint: {exc}") from exc
        if len(raw) != _CHECKPOINT.size:
            return 0
        position, stored_crc = _CHECKPOINT.unpack(raw)
        return int(position) if crc32c(raw[:8]) == stored_crc else 0

    def _recover(self, repair: bool, full_check: bool) -> int:
        """Position after the last valid record. Read-write: zero what follows it and remove
        later segments, so new appends start clean.

        The walk starts at the checkpoint (msync'ed, so trusted: opening costs the unflushed
        tail, not the whole log); ``full_check`` walks from the first record instead, and
        then refuses bad records below the checkpoint."""
        if not self._segments:
            return 0
        first, last = self._segments[0].base, self._segments[-1].end
        durable = self._read_checkpoint()
        if durable > last and self._read_only:
            self._load_errors.append(f"the flushed position {durable} lies beyond the last "
                                     f"segment's end {last}")
        elif durable > last and not repair:
            raise CorruptionError(
                f"CommitLog {self._dir}: the flushed position {durable} lies beyond the last "
                f"segment's end {last}: segment files are missing. Open with repair=True to "
                "keep what is there.")
        start = durable if first <= durable <= last and not full_check else first
        walk = self._walk(start)
        bad = next((reason for _, _, reason in walk if reason is not None), None)
        end = walk.end
        if self._read_only:
            return end
        if end < durable and not repair:
            raise CorruptionError(
                f"CommitLog {self._dir}: {bad or 'zeros'} at position {end}, below the flushed "
                f"position {durable}: acknowledged records would be lost. Inspect with a "
                "read-only open and verify(); open with repair=True to truncate there."
            )
        self._truncate(end)
        return end

    def _truncate(self, position: int) -> None:
        """Zero [position, end of its segment) and remove every later segment."""
        i = max(0, bisect.bisect_right(self._bases, position) - 1)
        seg = self._segments[i]
        if position < seg.end:
            seg.zero_from(position - seg.base)
            seg.sync(position - seg.base, seg.size)
        later = self._segments[i + 1:]
        for extra in later:
            extra.close()
            extra.path.unlink()
        del self._segments[i + 1:], self._bases[i + 1:]
        if later:
            fsync_dir(self._dir)

    # --- walking --------------------------------------------------------------------------------
    def _walk(self, position: int, stop: int | None = None) -> Walk:
        return Walk(self._segments, self._bases, position, stop)

    # --- appending ------------------------------------------------------------------------------
    @property
    def end_position(self) -> int:
        """Position the next record will be written at."""
        return self._end

    @property
    def segment_size(self) -> int:
        return self._segment_size

    @property
    def max_payload(self) -> int:
        return self._segment_size - HEADER_SIZE

    def append_batch(self, payloads: Sequence[bytes]) -> list[int]:
        """Append records; returns their positions. Raises StorageError on failure, in which
        case the log's end is unchanged (nothing of the failed batch becomes readable)."""
        if not payloads:
            return []
        lengths = list(map(len, payloads))
        if max(lengths) > self.max_payload:
            raise InvalidArgument(
                f"record of {max(lengths)} bytes exceeds the segment's {self.max_payload}")
        payload_bytes = sum(lengths)
        with self._lock:
            self._writable()
            seg = self._current_segment()
            old_end, old_count = self._end, len(self._segments)
            off = old_end - seg.base
            try:
                if off + payload_bytes + HEADER_SIZE * len(lengths) <= seg.size:
                    positions = self._write_run(seg, off, payloads, lengths, payload_bytes)
                else:
                    positions = self._append_rolling(seg, off, payloads, lengths)
                if self._sync:
                    self._sync_range(old_end, self._end)
                if self._replicator is not None:
                    self._replicator.appended(old_end, self._end, payloads)
            except BaseException:
                self._rollback(old_end, old_count)
                raise
            self._last = (positions, payloads)
            self._bulk = payload_bytes >= PWRITE_MIN_BYTES
            base = self._segments[-1].base
            if self._spare is None and self._asked != base and self._wants_spare():
                self._asked = base  # once a segment (a failed creation: at the ticks)
                self._spare_wanted.set()
            return positions

    def attach_replicator(self, replicator: Replicator | None) -> None:
        """Cluster mode: tell ``replicator`` of every append and revoke (None: detach)."""
        with self._lock:
            self._replicator = replicator

    def _rollback(self, old_end: int, old_count: int) -> None:
        """Undo a partly applied append: zero its bytes, drop the segments it created."""
        self._last = None
        with contextlib.suppress(OSError, ValueError):
            self._truncate(old_end)
        del self._segments[old_count:], self._bases[old_count:]
        self._end = old_end

    def revoke(self, position: int) -> None:
        """Take back every record from ``position`` (a record boundary) to the end: the log
        ends at ``position`` again and its next append goes there, as if they had never been
        appended. For a writer that appended a batch, failed to commit it elsewhere and must
        not let it become visible (scheduler/committer.py: all-or-nothing send batches); the
        caller makes sure nothing refers to those positions.

        Crash-consistent: if the checkpoint already covers the records it is lowered first
        (the file is written and fsync'ed), then the bytes are zeroed and later
        segments removed. A crash in between leaves the records after the checkpoint, where
        recovery keeps them (the caller must recognise them; the engine marks them), never
        zeros below the checkpoint, which recovery would refuse. Raises StorageError, having
        changed nothing, when the checkpoint cannot be written. Cost: the zeroing and an msync
        of the revoked bytes (1000 records of 100 B: ~4 ms), plus the checkpoint's fsyncs when
        it is lowered (~12 ms)."""
        with self._lock, self._flush_lock:
            self._writable()
            end = self._end
            if position == end:
                return
            i = bisect.bisect_right(self._bases, position) - 1
            if i < 0 or position > end:
                raise InvalidArgument(f"position {position} is outside the log [.., {end}]")
            seg = self._segments[i]
            off = position - seg.base
            self._last = None
            # a record starts there, or the end-of-segment header an append that rolled over
            # wrote there (cluster mode cuts a log back to where such an append began)
            if seg.size - off < HEADER_SIZE or HEADER.unpack_from(seg.mm, off)[0] not in (
                    RECORD_MAGIC, EOS_MAGIC):
                raise InvalidArgument(f"no record at position {position}")
            if self._flushed > position:
                self._write_checkpoint(position)
                with self._flushed_cond:
                    self._flushed = position
            # zero exactly what was written (pages the records occupy: no new space), not the
            # rest of the segment (recovery's _truncate reads up to 1 GiB: ~0.4 s)
            stop = end - seg.base if end <= seg.end else _written_end(seg, off)
            zeros = memoryview(bytes(min(stop - off, _REVOKE_PIECE)))
            for at in range(off, stop, len(zeros)):
                seg.write(at, zeros[:stop - at])
            with self._create_lock:  # the flusher makes spares under it, for the last segment
                later = self._segments[i + 1:]
                del self._segments[i + 1:], self._bases[i + 1:]
                if self._spare is not None and self._spare.base != seg.end:
                    later.append(self._spare)  # it would not follow on: recovery refuses gaps
                    self._spare = None
            self._end = position
            if self._replicator is not None:
                self._replicator.revoked(position)
            for extra in later:
                self._discard(extra)
            # as recovery: after an msync error the page cache still has the zeros
            with contextlib.suppress(OSError, ValueError):
                seg.sync(off, stop)
                if later:
                    fsync_dir(self._dir)

    def _writable(self) -> None:
        if self._closed:
            raise StorageError("the CommitLog is closed")
        if self._read_only:
            raise StorageError("the CommitLog is open read-only")

    def _current_segment(self) -> Segment:
        if not self._segments:
            self._add(self._new_segment(0))
        seg = self._segments[-1]
        if self._end >= seg.end:  # ends exactly at the boundary
            self._add(self._new_segment(seg.end))
            seg = self._segments[-1]
        return seg

    def _new_segment(self, base: int) -> Segment:
        """The segment starting at ``base``: the spare if the flusher made it, else a new one,
        not populated (storage/segment.py: the appends outran the flusher, a burst)."""
        with self._create_lock:
            spare, self._spare = self._spare, None
            if spare is not None:
                if spare.base == base:
                    return spare
                self._discard(spare)
            return Segment.create(self._dir, base, self._segment_size, populated=False)

    def _wants_spare(self) -> bool:
        """The last segment is half full or more (``_prepare_spare``)."""
        segments = self._segments
        return bool(segments) and self._end - segments[-1].base >= segments[-1].size // 2

    def _prepare_spare(self) -> None:
        """Create the next segment ahead of time once the current one is half full, so a
        roll-over does not pay for allocating and populating it on the append path; not
        populated while appends go in with ``pwrite`` (a burst's commits: populating serves
        writes through the mapping, and holds all its pages in the RSS; storage/segment.py).
        The flusher calls it at each tick, and at once when an append asks for it
        (``_spare_wanted``): a burst of 16 KiB bodies fills a 32 MiB segment in ~80 ms, and
        at the ticks alone (200 ms) the appending thread made most segments itself, on the
        delivery's path (``posix_fallocate``, the page cache's zero-filled pages, the
        directory's fsync: ~5 % of a 20 k burst's drain, perf)."""
        segments = self._segments
        if self._spare is not None or not segments:
            return
        current = segments[-1]
        if not self._wants_spare():
            return
        with self._create_lock:
            if self._spare is None and self._segments and self._segments[-1] is current:
                self._spare = Segment.create(self._dir, current.end, self._segment_size,
                                             populated=not self._bulk)

    @staticmethod
    def _discard(seg: Segment) -> None:
        seg.close()
        with contextlib.suppress(OSError):
            seg.path.unlink()

    def _write_run(self, seg: Segment, off: int, payloads: Sequence[bytes],
                   lengths: list[int], payload_bytes: int) -> list[int]:
        """Frame and copy records that all fit in ``seg`` at ``off``: one memmove. Records
        of ``GATHER_MIN_RECORD`` bytes or more on average go in with one gathered write of
        their headers and payloads instead (``Segment.write_gather``): the payloads are not
        copied into a framed buffer first (16 KiB bodies: 16 MiB more to allocate, fault in
        and copy a commit of 1000, docs/performance.md, Large bodies)."""
        total = payload_bytes + HEADER_SIZE * len(lengths)  # (payload_bytes: their sum)
        if total >= PWRITE_MIN_BYTES and total >= GATHER_MIN_RECORD * len(lengths):
            headers, positions = frame_headers(payloads, lengths, seg.base + off)
            view = memoryview(headers)
            pieces: list[bytes | memoryview] = [b""] * (2 * len(lengths))
            pieces[0::2] = [view[at:at + HEADER_SIZE]
                            for at in range(0, len(headers), HEADER_SIZE)]
            pieces[1::2] = payloads
            seg.write_gather(off, pieces, total)
            self._end = seg.base + off + total
            return positions
        buf, positions = frame(payloads, lengths, seg.base + off)
        seg.write(off, buf)
        self._end = seg.base + off + len(buf)
        return positions

    def _append_rolling(self, seg: Segment, off: int, payloads: Sequence[bytes],
                        lengths: list[int]) -> list[int]:
        """A batch that crosses one or more segment ends. Every segment it needs is created
        before a byte is copied, so a failure (ENOSPC) leaves the log unchanged."""
        runs: list[tuple[int, int, int]] = []  # (segment number, first, stop) per run
        first, cursor, seg_index, seg_size = 0, off, 0, seg.size
        for i, n in enumerate(lengths):
            if cursor + HEADER_SIZE + n > seg_size:
                runs.append((seg_index, first, i))
                first, cursor, seg_index, seg_size = i, 0, seg_index + 1, self._segment_size
            cursor += HEADER_SIZE + n
        runs.append((seg_index, first, len(lengths)))
        created: list[Segment] = []
        try:
            for n in range(seg_index):
                base = seg.end + n * self._segment_size
                created.append(self._new_segment(base))
        except StorageError:
            for extra in created:
                self._discard(extra)
            raise
        targets = [seg, *created]
        positions: list[int] = []
        for index, lo, hi in runs:
            target = targets[index]
            if index > 0:
                prev = targets[index - 1]
                seal(prev, self._end - prev.base)
                self._add(target)
                self._end = target.base
            if hi > lo:
                some = lengths[lo:hi]
                positions += self._write_run(target, self._end - target.base, payloads[lo:hi],
                                             some, sum(some))
        return positions

    # --- reading --------------------------------------------------------------------------------
    def _segment_at(self, position: int) -> Segment:
        """The segment holding ``position``. Retention removes segments from the head of the
        lists while readers look (``drop_segments_below``), so a look that lands on the wrong
        one is tried again; a position below the first segment is ``OffsetExpired``."""
        for _ in range(4):
            i = bisect.bisect_right(self._bases, position) - 1
            if i < 0 or position >= self._end:
                break
            try:
                seg = self._segments[i]
            except IndexError:
                continue
            if seg.base <= position < seg.base + seg.size:
                # read again: its pages come back, and the flusher gives them back again
                # (``_release_behind``; a caught-up stream reads the tail of the segment
                # before the last after each roll, and those pages stayed until the next
                # idle round, a minute later)
                seg.touched = True
                seg.released = False
                return seg
        if position < self.first_position:
            raise OffsetExpired(f"position {position} was deleted (the log starts at "
                                f"{self.first_position})")
        raise InvalidArgument(f"position {position} is outside the log [.., {self._end})")

    def read(self, position: int) -> bytes:
        """The payload of the record at ``position``; CorruptionError if it fails its CRC."""
        return self.read_many((position,))[0]

    def read_many(self, positions: Sequence[int], max_bytes: int | None = None) -> list[bytes]:
        """``[read(p) for p in positions]`` with the same checks, in one tight loop (the pull
        path reads up to 1000 records a request, mostly from one segment). With
        ``max_bytes``, stops (a prefix of the answer) before the payloads past the first
        would add up to more than that: a bounded answer."""
        if self._closed:
            raise StorageError("the CommitLog is closed")
        room = _UNBOUNDED if max_bytes is None else max_bytes
        last = self._last
        if last is not None and positions:
            hit = _just_appended(last, positions, room)
            if hit is not None:
                return hit
        try:
            if native is not None:
                return self._read_many_native(positions, room)
            return self._read_many_py(positions, room)
        except (ValueError, IndexError):  # InvalidArgument too; a mapping closed by retention
            first = self.first_position
            if any(p < first for p in positions):
                raise OffsetExpired(f"the log starts at {first}: records were deleted") from None
            raise

    def _read_many_py(self, positions: Sequence[int], room: int) -> list[bytes]:
        out: list[bytes] = []
        unpack, header, magic_ok, seed = HEADER.unpack_from, HEADER_SIZE, RECORD_MAGIC, CRC_SEED
        lo = hi = 0
        mm: bytes | mmap.mmap = b""
        for position in positions:
            if not lo <= position < hi:
                seg = self._segment_at(position)
                lo, hi, mm = seg.base, min(seg.base + seg.size, self._end), seg.mm
            off = position - lo
            if hi - position < header:
                raise InvalidArgument(f"no record at position {position}")
            magic, length, crc = unpack(mm, off)
            if magic != magic_ok:
                raise InvalidArgument(f"no record at position {position}")
            if length > room and out:
                break
            room -= length
            start = off + header
            payload = mm[start:start + length]
            if len(payload) != length or crc32c(payload, length ^ seed) != crc:
                raise CorruptionError(f"CommitLog record at {position}: bad length or CRC32C")
            out.append(payload)
        return out

    def _read_many_native(self, positions: Sequence[int], room: int) -> list[bytes]:
        """``read_many``'s loop in C (storage/_native.pyx), a segment at a time."""
        assert native is not None
        todo = positions if isinstance(positions, list) else list(positions)
        out: list[bytes] = []
        index = 0
        while index < len(todo):
            position = todo[index]
            seg = self._segment_at(position)
            index, room, status = native.read_records(
                seg.mm, seg.base, min(seg.base + seg.size, self._end), todo, index, out, room,
                RECORD_MAGIC, CRC_SEED)
            if status == 1:
                break
            if status == 0 and todo[index:index + 1] == [position]:  # (cannot happen)
                raise InvalidArgument(f"no record at position {position}")
            if status == 2:
                raise InvalidArgument(f"no record at position {todo[index]}")
            if status == 3:
                raise CorruptionError(f"CommitLog record at {todo[index]}: bad length or CRC32C")
        return out

    def iter_from(self, position: int) -> Iterator[tuple[int, bytes]]:
        """(position, payload) of every record from ``position`` to the end (the end when the
        iteration started)."""
        if self._closed:
            raise StorageError("the CommitLog is closed")
        stop = self._end
        if position >= stop:
            return
        self._segment_at(position)
        for pos, payload, error in self._walk(position, stop):
            if error is not None:
                raise CorruptionError(f"CommitLog record at {pos}: {error}")
            yield pos, payload

    def verify(self) -> VerifyReport:
        """Walk every record and report corruption (never raises for bad data). After a bad
        CRC with a plausible length the walk goes on at the next record; after a bad header
        it goes on with the next segment."""
        records = size = 0
        errors = list(self._load_errors)
        if self._closed:
            return VerifyReport(records=0, bytes=0, errors=["the CommitLog is closed"])
        position = reached = self._segments[0].base if self._segments else 0
        stop = self._end if not self._read_only else (
            self._segments[-1].end if self._segments else 0)
        while position < stop:
            walk = self._walk(position, None if self._read_only else stop)
            resume = None
            for pos, payload, error in walk:
                if error is None:
                    records += 1
                    size += len(payload)
                else:
                    errors.append(f"position {pos}: {error}")
                    resume = self._resume_after(pos, error)
            reached = max(reached, walk.end)
            if resume is None:
                if self._read_only:
                    resume = self._next_nonzero_segment(walk.end)
                if resume is None:
                    break
            position = resume
        if not errors and reached < self._end:
            # a reader stops there too (a checkpoint past zeros: what it flushed is gone)
            errors.append(f"position {reached}: zeros before the log's end {self._end}")
        return VerifyReport(records=records, bytes=size, errors=errors)

    def _resume_after(self, pos: int, error: str) -> int:
        seg = self._segments[bisect.bisect_right(self._bases, pos) - 1]
        if error.startswith("CRC"):
            _, length, _ = HEADER.unpack_from(seg.mm, pos - seg.base)
            return int(pos + HEADER_SIZE + length)
        return seg.end

    def _next_nonzero_segment(self, pos: int) -> int | None:
        """Read-only verify: a later segment that holds data after the log's end is lost
        data (or a torn tail); report it and keep walking there."""
        i = bisect.bisect_right(self._bases, pos) - 1
        for seg in self._segments[i + 1:]:
            if HEADER.unpack_from(seg.mm, 0) != (0, 0, 0):
                return seg.base
        return None

    # --- retention (scheduler/retention.py) --------------------------------------------------
    @property
    def first_position(self) -> int:
        """Position of the first byte the log still holds (0 until retention deleted a
        segment)."""
        bases = self._bases
        try:
            return bases[0]
        except IndexError:
            return 0

    def sealed_segments(self) -> list[tuple[int, int]]:
        """(base, end) of every segment but the last (the one appends go to), oldest first."""
        with self._lock:
            return [(seg.base, seg.end) for seg in self._segments[:-1]]

    def drop_segments_below(self, position: int) -> list[Segment]:
        """Take every segment that ends at or below ``position`` out of the log (never the
        last one) and return them; the log then starts at the first one left. The files stay
        until ``delete_segments``: the caller first makes sure nothing points into them.
        Appends and flushes wait only for the lists to change (no I/O under the locks)."""
        with self._lock, self._flush_lock:
            self._writable()
            n = 0
            segments = self._segments
            while n < len(segments) - 1 and segments[n].end <= position:
                n += 1
            dropped = segments[:n]
            if n:
                # bases first: a reader between the two sees a too-short ``_bases`` (and
                # ``_segment_at`` looks again), never a base without its segment
                del self._bases[:n]
                del self._segments[:n]
        return dropped

    def delete_segments(self, segments: Sequence[Segment]) -> None:
        """Remove the files of segments ``drop_segments_below`` returned, oldest first (a
        crash in between leaves a log that still starts with a whole segment and runs on
        without a gap), and fsync the directory. Their mappings are closed by the next
        call (``_retired``): a reader that found one just before it was dropped finishes
        first."""
        for seg in self._retired:
            with contextlib.suppress(BufferError, OSError, ValueError):
                seg.close()
        self._retired = list(segments)
        for seg in segments:
            try:
                seg.path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StorageError(f"cannot delete CommitLog segment {seg.path}: {exc}") from exc
        if segments:
            fsync_dir(self._dir)

    def release_idle(self) -> int:
        """Give back the pages of the segments that nobody wrote or read since the last call
        (``Segment.release``: the mapping stays, its pages leave the process's RSS; a later
        read faults them in again from the page cache). Never the last segment (appends).
        Returns how many segments were released."""
        released = 0
        for seg in self._segments[:-1]:
            if seg.touched:
                seg.touched = seg.released = False
            elif not seg.released:
                with contextlib.suppress(OSError, ValueError):
                    seg.release()
                    released += 1
        return released

    # --- flushing and closing -------------------------------------------------------------------
    def _sync_range(self, start: int, stop: int) -> None:
        i = max(0, bisect.bisect_right(self._bases, start) - 1)
        try:
            for seg in self._segments[i:]:
                if seg.base >= stop:
                    break
                seg.sync(start - seg.base, stop - seg.base)
        except (OSError, ValueError) as exc:
            raise StorageError(f"CommitLog msync failed: {exc}") from exc

    def flush(self) -> None:
        """msync everything appended so far and record it in the checkpoint file."""
        if self._read_only:
            return
        with self._flush_lock:
            if self._closed:
                raise StorageError("the CommitLog is closed")
            end = self._end
            if not self._sync and end > self._flushed:
                self._sync_range(self._flushed, end)
            if end != self._flushed:
                self._write_checkpoint(end)
                with self._flushed_cond:
                    self._flushed = end
                    self._flushed_cond.notify_all()

    @property
    def flushed_position(self) -> int:
        """Everything before this position is msync'ed and recorded in the checkpoint."""
        return self._flushed

    def wait_flushed(self, position: int, timeout_s: float | None = None) -> bool:
        """Block until ``position`` is flushed (group commit for "async": wait for the next
        background flush instead of an msync per batch). False on timeout or close."""
        with self._flushed_cond:
            return self._flushed_cond.wait_for(
                lambda: self._flushed >= position or self._closed, timeout_s
            ) and self._flushed >= position

    def _write_checkpoint(self, position: int) -> None:
        raw = _CHECKPOINT.pack(position, crc32c(position.to_bytes(8, "little")))
        tmp = self._dir / (CHECKPOINT_NAME + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
            try:
                os.write(fd, raw)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._dir / CHECKPOINT_NAME)
            fsync_dir(self._dir)
        except OSError as exc:
            raise StorageError(f"cannot write CommitLog checkpoint: {exc}") from exc

    def _flush_loop(self) -> None:
        tick = time.monotonic() + self._interval_s
        while True:
            self._spare_wanted.wait(max(0.0, tick - time.monotonic()))
            if self._stop.is_set():
                return
            if self._spare_wanted.is_set():  # an append asked for the next segment
                self._spare_wanted.clear()
                with contextlib.suppress(StorageError):  # (the tick tries again)
                    self._prepare_spare()
                if time.monotonic() < tick:
                    continue
            tick = time.monotonic() + self._interval_s
            self._last = None  # (held at most a tick after the last append)
            # first, so that a slow flush (a burst's msync) does not hold the pages back
            self._release_behind()
            with contextlib.suppress(StorageError):  # retried next tick; close() reports
                self.flush()
                self._prepare_spare()

    def _release_behind(self) -> int:
        """Give back the pages of every segment but the last ``KEEP_MAPPED`` that still holds
        them (``Segment.release``). A burst fills a 32 MiB segment in well under a second, and
        ``release_idle`` runs once a retention round (a minute): without this a drain of 1 M
        messages kept each segment it wrote, populated and read, in the RSS (+161 MiB of
        file-backed pages at its peak). A reader further behind faults its pages in again
        from the page cache (``release_idle`` gives them back later). Returns how many."""
        released = 0
        for seg in self._segments[:-KEEP_MAPPED]:
            if not seg.released:
                with contextlib.suppress(OSError, ValueError):
                    seg.release()
                    released += 1
        return released

    def close(self) -> None:
        """Stop the flusher, msync, and unmap every segment. Idempotent."""
        if self._closed:
            return
        self._stop.set()
        self._spare_wanted.set()
        if self._flusher is not None:
            self._flusher.join()
        if self._spare is not None:
            self._discard(self._spare)
            self._spare = None
        try:
            self.flush()
        finally:
            with self._lock, self._flush_lock:
                self._closed = True
                self._close_segments()
                self._unlock()
            with self._flushed_cond:
                self._flushed_cond.notify_all()

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            os.close(fd)  # releases the flock

    def _close_segments(self) -> None:
        for seg in [*self._retired, *self._segments]:
            with contextlib.suppress(BufferError):
                seg.close()
        self._retired.clear()
        self._segments.clear()
        self._bases.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
