"""CommitLog record framing: building a framed batch and walking records in segments.

Record = 12-byte header ``<magic u32 LE, length u32 LE, crc u32 LE>`` + payload, where
crc = CRC32C of the payload seeded with ``length ^ CRC_SEED``: it covers the length too, and
a magic followed by zeros (torn garbage) is not a valid empty record. An ``EOS_MAGIC`` header
marks the rest of a segment as padding; a zero header marks the end of the log.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from collections.abc import Iterator, Sequence

from crc32c import crc32c

from storage.native import native
from storage.segment import Segment

HEADER = struct.Struct("<III")
HEADER_SIZE = HEADER.size
RECORD_MAGIC = 0x31474C48  # b"HLG1" little-endian
EOS_MAGIC = 0x534F4548  # b"HEOS": rest of the segment is padding
CRC_SEED = 0x9E3779B9
_FRAMED = HEADER_SIZE.__add__  # payload length -> framed length, as a C-level callable


def frame_py(payloads: Sequence[bytes], lengths: list[int],
             start: int) -> tuple[bytes, list[int]]:
    """The framed bytes of ``payloads`` (one buffer, for one memmove) and the position of
    each record when the buffer is written at ``start``. No Python call per record: map,
    zip and join run the loop in C (storage/_native.pyx: the whole loop)."""
    crcs = map(crc32c, payloads, [n ^ CRC_SEED for n in lengths])
    headers = map(HEADER.pack, itertools.repeat(RECORD_MAGIC), lengths, crcs)
    buf = b"".join(itertools.chain.from_iterable(zip(headers, payloads, strict=True)))
    positions = list(itertools.accumulate(map(_FRAMED, lengths), initial=start))
    positions.pop()  # the end of the run
    return buf, positions


def frame_headers_py(payloads: Sequence[bytes], lengths: list[int],
                     start: int) -> tuple[bytes, list[int]]:
    """The headers of ``payloads``' records, back to back (12 bytes each), and each record's
    position when header and payload after header and payload are written at ``start``:
    ``frame`` without copying the payloads, for a gathered write (``Segment.write_gather``)."""
    crcs = map(crc32c, payloads, [n ^ CRC_SEED for n in lengths])
    headers = b"".join(map(HEADER.pack, itertools.repeat(RECORD_MAGIC), lengths, crcs))
    positions = list(itertools.accumulate(map(_FRAMED, lengths), initial=start))
    positions.pop()
    return headers, positions


def _frame_headers_native(payloads: Sequence[bytes], lengths: list[int],
                          start: int) -> tuple[bytes, list[int]]:
    assert native is not None
    headers, positions = native.frame_headers(list(payloads), start, RECORD_MAGIC, CRC_SEED)
    return headers, positions


def _frame_native(payloads: Sequence[bytes], lengths: list[int],
                  start: int) -> tuple[bytes, list[int]]:
    assert native is not None
    buf, positions = native.frame(list(payloads), lengths, start, RECORD_MAGIC, CRC_SEED)
    return buf, positions


frame = frame_py if native is None else _frame_native
frame_headers = frame_headers_py if native is None else _frame_headers_native


def seal(seg: Segment, off: int) -> None:
    """Mark the rest of ``seg`` from ``off`` as padding (if a header fits)."""
    if seg.size - off >= HEADER_SIZE:
        seg.write(off, HEADER.pack(EOS_MAGIC, seg.size - off - HEADER_SIZE, 0))


def check(magic: int, length: int, crc: int, seg: Segment, off: int) -> tuple[bytes, str | None]:
    """(payload, None) if a valid record starts at ``off``, else (b"", reason)."""
    if magic != RECORD_MAGIC:
        return b"", f"bad magic 0x{magic:08x}"
    start = off + HEADER_SIZE
    if start + length > seg.size:
        return b"", f"impossible length {length}"
    payload = seg.mm[start:start + length]
    if crc32c(payload, length ^ CRC_SEED) != crc:
        return b"", "CRC32C mismatch"
    return payload, None


class Walk:
    """Iterates (position, payload, None) per valid record from ``start``; at the first
    invalid one yields (position, b"", reason) and stops. ``end`` is where the walk stopped.
    Without ``stop`` a zero header is the normal end of the log; before ``stop`` it is an
    error (bytes of the log were lost)."""

    def __init__(self, segments: list[Segment], bases: list[int], start: int,
                 stop: int | None) -> None:
        self._segments, self._bases = segments, bases
        self.start, self.stop, self.end = start, stop, start

    def __iter__(self) -> Iterator[tuple[int, bytes, str | None]]:
        i = bisect.bisect_right(self._bases, self.start) - 1
        if i < 0:
            return
        stop = self.stop
        position = self.start
        unpack = HEADER.unpack_from
        for seg in self._segments[i:]:
            base, mm, size = seg.base, seg.mm, seg.size
            off = position - base
            while True:
                here = base + off
                if stop is not None and here >= stop:
                    self.end = here
                    return
                if size - off < HEADER_SIZE:
                    break
                magic, length, crc = unpack(mm, off)
                if magic == EOS_MAGIC:
                    break
                if magic == 0 and length == 0 and crc == 0:
                    self.end = here
                    if stop is not None:
                        yield here, b"", f"zeros before the log's end {stop}"
                    return
                payload, reason = check(magic, length, crc, seg, off)
                if reason is not None:
                    self.end = here
                    yield here, b"", reason
                    return
                yield here, payload, None
                off += HEADER_SIZE + length
            position = seg.end
            self.end = position
