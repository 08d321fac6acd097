"""CommitLog: fixed-size memory-mapped segments of length+magic+CRC32C framed records.

A position is a global byte offset: segment start offset + offset inside the segment.

Record = 12-byte header ``<magic u32 LE, length u32 LE, crc u32 LE>`` + payload, where
crc = CRC32C of the payload seeded with ``length ^ CRC_SEED``: it covers the length too, and
a magic followed by zeros (torn garbage) is not a valid empty record.
A record never spans segments: when the next record does not fit, an end-of-segment header
(magic ``EOS_MAGIC``) is written if there is room for one, and the record goes at the start
of the next segment (base = previous base + previous size). Bytes after the last record are
zero (segments are allocated zero-filled), so "zero header" means "end of log".

Durability. Writes go into the mapping: they survive a kill -9 (the page cache belongs to the
kernel) but a power cut only once msync'ed. ``flush_policy="sync"`` msyncs each batch before
``append_batch`` returns; ``"async"`` msyncs every ``flush_interval_ms`` on a background thread.
Either way the thread records the last msync'ed position in ``checkpoint`` (16 bytes); on open,
a bad record *below* that position is corruption of acknowledged data and is refused
(``CorruptionError``; ``repair=True`` truncates anyway), while a bad record above it is a torn
tail and is truncated (zeroed, and later segments removed) so new appends are clean.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import mmap
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from crc32c import crc32c

from storage.errors import CorruptionError, InvalidArgument, StorageError
from storage.segment import NAME_PATTERN, Segment, fsync_dir

HEADER = struct.Struct("<III")
HEADER_SIZE = HEADER.size
RECORD_MAGIC = 0x31474C48  # b"HLG1" little-endian
EOS_MAGIC = 0x534F4548  # b"HEOS": rest of the segment is padding
CRC_SEED = 0x9E3779B9
FLUSH_POLICIES = ("async", "sync")
MIN_SEGMENT_SIZE = 64
_CHECKPOINT = struct.Struct("<QI")  # flushed position, crc32c of those 8 bytes
CHECKPOINT_NAME = "checkpoint"


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    records: int
    bytes: int
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


class _Walk:
    """Iterates (position, payload length, None) per valid record from ``start``; at the first
    invalid one yields (position, 0, reason) and stops. ``end`` is where the walk stopped.
    Without ``stop`` a zero header is the normal end of the log; before ``stop`` it is an
    error (bytes of the log were lost)."""

    def __init__(self, segments: list[Segment], bases: list[int], start: int,
                 stop: int | None) -> None:
        self._segments, self._bases = segments, bases
        self.start, self.stop, self.end = start, stop, start

    def __iter__(self) -> Iterator[tuple[int, int, str | None]]:
        i = bisect.bisect_right(self._bases, self.start) - 1
        if i < 0:
            return
        stop = self.stop
        position = self.start
        for seg in self._segments[i:]:
            mm, off, size = seg.mm, position - seg.base, seg.size
            while True:
                here = seg.base + off
                self.end = here
                if stop is not None and here >= stop:
                    return
                if size - off < HEADER_SIZE:
                    break
                magic, length, crc = HEADER.unpack_from(mm, off)
                if magic == EOS_MAGIC:
                    break
                if magic == 0 and length == 0 and crc == 0:
                    if stop is not None:
                        yield here, 0, f"zeros before the log's end {stop}"
                    return
                reason = _invalid(magic, length, crc, mm, off, size)
                if reason is not None:
                    yield here, 0, reason
                    return
                yield here, length, None
                off += HEADER_SIZE + length
            position = seg.end
            self.end = position


def _invalid(magic: int, length: int, crc: int, mm: mmap.mmap, off: int,
             size: int) -> str | None:
    if magic != RECORD_MAGIC:
        return f"bad magic 0x{magic:08x}"
    if off + HEADER_SIZE + length > size:
        return f"impossible length {length}"
    start = off + HEADER_SIZE
    with memoryview(mm) as view:
        if crc32c(view[start:start + length], length ^ CRC_SEED) != crc:
            return "CRC32C mismatch"
    return None


class CommitLog:
    def __init__(
        self, directory: str | Path, *, segment_size: int = 1 << 30,
        flush_policy: str = "async", flush_interval_ms: int = 200,
        read_only: bool = False, repair: bool = False,
    ) -> None:
        """Opens (recovering: the tail after the last valid record is truncated) or creates.

        ``read_only`` maps the segments read-only and changes nothing on disk (no recovery,
        no flusher): for ``verify`` and analysis of a live or damaged log.
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
        self._flusher: threading.Thread | None = None
        try:
            if not read_only:
                self._dir.mkdir(parents=True, exist_ok=True)
            self._load_segments(repair)
            self._end = self._recover(repair)
        except BaseException:
            self._close_segments()
            raise
        self._flushed = self._end
        self._spare: Segment | None = None  # next segment, made ahead by the flusher
        self._create_lock = threading.Lock()  # segment creation (appender vs flusher)
        if not read_only:
            if not self._segments:
                self._add(Segment.create(self._dir, 0, self._segment_size))
            self._write_checkpoint(self._end)
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"commitlog-flush:{self._dir.name}", daemon=True)
            self._flusher.start()

    # --- opening and recovery -------------------------------------------------------------------
    def _load_segments(self, repair: bool) -> None:
        if not self._dir.is_dir():
            raise StorageError(f"no CommitLog directory {self._dir}")
        paths = sorted(p for p in self._dir.iterdir() if NAME_PATTERN.match(p.name))
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
        position, check = _CHECKPOINT.unpack(raw)
        return int(position) if crc32c(raw[:8]) == check else 0

    def _recover(self, repair: bool) -> int:
        """Position after the last valid record. Read-write: zero what follows it and remove
        later segments, so new appends start clean."""
        if not self._segments:
            return 0
        walk = self._walk(self._segments[0].base)
        bad = next((reason for _, _, reason in walk if reason is not None), None)
        end = walk.end
        if self._read_only:
            return end
        durable = self._read_checkpoint()
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
    def _walk(self, position: int, stop: int | None = None) -> _Walk:
        return _Walk(self._segments, self._bases, position, stop)

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
        with self._lock:
            self._writable()
            seg = self._current_segment()
            old_end, old_count = self._end, len(self._segments)
            off = old_end - seg.base
            try:
                if off + sum(lengths) + HEADER_SIZE * len(lengths) <= seg.size:
                    positions = self._write_run(seg, off, payloads, lengths)
                else:
                    positions = self._append_rolling(seg, off, payloads, lengths)
                if self._sync:
                    self._sync_range(old_end, self._end)
            except BaseException:
                self._rollback(old_end, old_count)
                raise
            return positions

    def _rollback(self, old_end: int, old_count: int) -> None:
        """Undo a partly applied append: zero its bytes, drop the segments it created."""
        with contextlib.suppress(OSError, ValueError):
            self._truncate(old_end)
        del self._segments[old_count:], self._bases[old_count:]
        self._end = old_end

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
        """The segment starting at ``base``: the spare if the flusher made it, else a new one."""
        with self._create_lock:
            spare, self._spare = self._spare, None
            if spare is not None:
                if spare.base == base:
                    return spare
                self._discard(spare)
            return Segment.create(self._dir, base, self._segment_size)

    def _prepare_spare(self) -> None:
        """Create the next segment ahead of time once the current one is half full, so a
        roll-over does not pay for allocating and populating it on the append path."""
        segments = self._segments
        if self._spare is not None or not segments:
            return
        current = segments[-1]
        if self._end - current.base < current.size // 2:
            return
        with self._create_lock:
            if self._spare is None and self._segments and self._segments[-1] is current:
                self._spare = Segment.create(self._dir, current.end, self._segment_size)

    @staticmethod
    def _discard(seg: Segment) -> None:
        seg.close()
        with contextlib.suppress(OSError):
            seg.path.unlink()

    def _write_run(self, seg: Segment, off: int, payloads: Sequence[bytes],
                   lengths: list[int]) -> list[int]:
        """Frame and copy records that all fit in ``seg`` at ``off``: one memmove."""
        crcs = map(crc32c, payloads, [n ^ CRC_SEED for n in lengths])
        headers = map(HEADER.pack, itertools.repeat(RECORD_MAGIC), lengths, crcs)
        buf = b"".join(itertools.chain.from_iterable(zip(headers, payloads, strict=True)))
        start = seg.base + off
        positions = list(itertools.accumulate((n + HEADER_SIZE for n in lengths[:-1]),
                                              initial=start))
        seg.mm[off:off + len(buf)] = buf
        self._end = start + len(buf)
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
                self._seal(prev, self._end - prev.base)
                self._add(target)
                self._end = target.base
            if hi > lo:
                positions += self._write_run(target, self._end - target.base, payloads[lo:hi],
                                             lengths[lo:hi])
        return positions

    @staticmethod
    def _seal(seg: Segment, off: int) -> None:
        """Mark the rest of ``seg`` from ``off`` as padding."""
        if seg.size - off >= HEADER_SIZE:
            HEADER.pack_into(seg.mm, off, EOS_MAGIC, seg.size - off - HEADER_SIZE, 0)

    # --- reading --------------------------------------------------------------------------------
    def _segment_at(self, position: int) -> Segment:
        i = bisect.bisect_right(self._bases, position) - 1
        if i < 0 or position >= self._end:
            raise InvalidArgument(f"position {position} is outside the log [.., {self._end})")
        return self._segments[i]

    def read(self, position: int) -> bytes:
        """The payload of the record at ``position``; CorruptionError if it fails its CRC."""
        if self._closed:
            raise StorageError("the CommitLog is closed")
        seg = self._segment_at(position)
        off = position - seg.base
        if seg.size - off < HEADER_SIZE:
            raise InvalidArgument(f"no record at position {position}")
        magic, length, crc = HEADER.unpack_from(seg.mm, off)
        if magic != RECORD_MAGIC:
            raise InvalidArgument(f"no record at position {position}")
        start = off + HEADER_SIZE
        if start + length > seg.size:
            raise CorruptionError(f"record at {position}: impossible length {length}")
        payload = seg.mm[start:start + length]
        if crc32c(payload, length ^ CRC_SEED) != crc:
            raise CorruptionError(f"record at {position}: CRC32C mismatch")
        return payload

    def read_many(self, positions: Sequence[int]) -> list[bytes]:
        return [self.read(p) for p in positions]

    def iter_from(self, position: int) -> Iterator[tuple[int, bytes]]:
        """(position, payload) of every record from ``position`` to the end (the end when the
        iteration started)."""
        if self._closed:
            raise StorageError("the CommitLog is closed")
        stop = self._end
        if position >= stop:
            return
        self._segment_at(position)
        for pos, length, error in self._walk(position, stop):
            if error is not None:
                raise CorruptionError(f"CommitLog record at {pos}: {error}")
            seg = self._segments[bisect.bisect_right(self._bases, pos) - 1]
            start = pos - seg.base + HEADER_SIZE
            yield pos, seg.mm[start:start + length]

    def verify(self) -> VerifyReport:
        """Walk every record and report corruption (never raises for bad data). After a bad
        CRC with a plausible length the walk goes on at the next record; after a bad header
        it goes on with the next segment."""
        records = size = 0
        errors = list(self._load_errors)
        if self._closed:
            return VerifyReport(records=0, bytes=0, errors=["the CommitLog is closed"])
        position = self._segments[0].base if self._segments else 0
        stop = self._end if not self._read_only else (
            self._segments[-1].end if self._segments else 0)
        while position < stop:
            walk = self._walk(position, None if self._read_only else stop)
            resume = None
            for pos, length, error in walk:
                if error is None:
                    records += 1
                    size += length
                else:
                    errors.append(f"position {pos}: {error}")
                    resume = self._resume_after(pos, error)
            if resume is None:
                if self._read_only:
                    resume = self._next_nonzero_segment(walk.end)
                if resume is None:
                    break
            position = resume
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
        raw = struct.pack("<Q", position)
        raw += struct.pack("<I", crc32c(raw))
        tmp = self._dir / (CHECKPOINT_NAME + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, raw)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._dir / CHECKPOINT_NAME)
        except OSError as exc:
            raise StorageError(f"cannot write CommitLog checkpoint: {exc}") from exc

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            with contextlib.suppress(StorageError):  # retried next tick; close() reports
                self.flush()
                self._prepare_spare()

    def close(self) -> None:
        """Stop the flusher, msync, and unmap every segment. Idempotent."""
        if self._closed:
            return
        self._stop.set()
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
            with self._flushed_cond:
                self._flushed_cond.notify_all()

    def _close_segments(self) -> None:
        for seg in self._segments:
            seg.close()
        self._segments.clear()
        self._bases.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> CommitLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
