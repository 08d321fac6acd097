"""One CommitLog segment: a fixed-size, fully allocated, memory-mapped file.

Named by its 20-digit start position (like RocketMQ's ``00000000001073741824``). The file is
allocated to its full size when created (``posix_fallocate``), so a full disk is an error at
creation time, never on a later append (nor a SIGBUS reading through the mapping).

Syncing calls ``msync(MS_SYNC)`` through ctypes, not ``mmap.flush()``: CPython 3.11's
``mmap.flush`` keeps the GIL for the whole msync (47-364 ms per 64 MiB on 2 cores, every
server thread stalled), while a ctypes foreign call releases it. Same syscall, same range,
same durability. Populating a new segment's pages likewise: ``MAP_POPULATE`` makes the
``mmap`` call fault them all in, and CPython holds the GIL through it (757 ms for 256 MiB
here, so ~95 ms per default 32 MiB segment; a spinning thread made 0.5 % of its progress
meanwhile); ``madvise
(MADV_POPULATE_READ)`` through ctypes does the same kernel work without it (the same
thread: 77 %). Kernels before 5.14 refuse that advice: then ``MAP_POPULATE`` as before.

A segment for ``pwrite`` appends (``populated=False``: the appending thread makes it itself
because a burst filled the last one before the flusher made the next, or the flusher makes
it after a ``pwrite`` append) is not populated: those writes need no mapped page, and a
populated segment holds all its 32 MiB in the RSS (1 M due at once over HTTP: 65 MiB of
file-backed RSS growth, two segments). Its pages are put in the page cache instead
(``posix_fadvise(WILLNEED)``, without the GIL: zero-filled, no I/O, mapped nowhere): a
``pwrite`` into pages not yet cached costs more than populating them first (they come one
4 KiB page at a time, each with its buffer heads; readahead makes large folios): 256 records
of 16 KiB appended 80 times in process, CPU median 0.32 s uncached, 0.25 populated, 0.25
cached (four runs each, load 9). A read through the mapping then faults in only the pages
it reads (16 a fault, the kernel's fault-around).

Large writes go into the file with ``pwrite``, not through the mapping, which serves the
reads. A page written through a shared mapping has a writable, dirty page-table entry, and
writing that page back (the flusher's msync, or the kernel's own writeback) must make the
entry clean and read-only again, which in a multi-threaded process means a TLB shoot-down:
an IPI to the other CPU for every 4 KiB page. On these VMs the IPIs were 12 % of an
in-process drain's CPU (200 k records, 63 MiB: 350 of 2 772 perf samples in msync's
``flush_tlb_mm_range``), and they interrupt whatever runs on the other CPU. A page written
with ``pwrite`` is dirty only in the page cache, the mapping's entries stay read-only and
clean, and writeback has nothing to shoot down; ``pwrite`` also copies without the GIL. The
mapping and the file share one page cache, so a read through the mapping sees it at once.

Small writes (below ``PWRITE_MIN_BYTES``: a steady trickle's commit of a few records) still
copy through the mapping: a ``pwrite`` is a system call, 2.5 µs back to back and ~10-40 µs
on a thread just woken here, against a page fault and one IPI per page touched. Measured on
a trickle's scan-and-commit cycle (8 records every 4 ms, in process): 10-30 µs more per
cycle with ``pwrite`` for every append, in 7 alternating runs of 7. The pages are populated
for reading only (populated writable, every entry would be dirty from the start, and each
page's writeback a shoot-down again), so a small write takes one fault per new page.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import re
import threading
from pathlib import Path

from storage.errors import StorageError
from storage.private import FILE_MODE

NAME_PATTERN = re.compile(r"^\d{20}\Z")
_ZERO_CHUNK = bytes(1 << 20)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_MS_SYNC = 4  # <sys/mman.h> on Linux
_libc = ctypes.CDLL(None, use_errno=True)
_msync = _libc.msync
_msync.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_msync.restype = ctypes.c_int
_madvise = _libc.madvise
_madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_madvise.restype = ctypes.c_int
_MADV_POPULATE_READ = 22  # <sys/mman.h>, Linux 5.14
_MADV_DONTNEED = 4  # <sys/mman.h>
PWRITE_MIN_BYTES = 16 << 10  # writes this large go in with pwrite (module doc)
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # pieces a pwritev


def populate(mm: mmap.mmap) -> bool:
    """Fault every page of ``mm`` in for reading, without the GIL; False if the kernel
    refused. (Not ``MADV_POPULATE_WRITE``: writable entries would all be dirty from the
    start, and each page's writeback a TLB shoot-down: module doc.)"""
    view = ctypes.c_char.from_buffer(mm)
    try:
        rc: int = _madvise(ctypes.addressof(view), len(mm), _MADV_POPULATE_READ)
        return rc == 0
    finally:
        del view


def segment_name(base: int) -> str:
    return f"{base:020d}"


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Segment:
    __slots__ = ("_fd", "_sync_lock", "base", "mm", "path", "released", "size", "touched",
                 "writable")

    def __init__(self, path: Path, base: int, mm: mmap.mmap, fd: int, *,
                 writable: bool = True) -> None:
        """Takes ownership of ``fd`` (the file, open for writing when ``writable``)."""
        self.path = path
        self.base = base
        self.mm = mm
        self.size = len(mm)
        self.writable = writable
        self._fd = fd
        self._sync_lock = threading.Lock()  # an msync in flight vs close()
        self.touched = True  # read or written since the last ``release`` round
        self.released = False  # its pages were given back (``release``), none touched since

    @classmethod
    def create(cls, directory: Path, base: int, size: int, *,
               populated: bool = True) -> Segment:
        """Create, fully allocate and map a new segment, its pages populated up front for
        reading (one kernel pass instead of a page fault per 4 KiB, ~3x cheaper here;
        without the GIL where the kernel can: module doc); ``populated=False``: in the page
        cache only, not mapped (for ``pwrite`` appends, module doc). Any failure removes the
        partial file."""
        path = directory / segment_name(base)
        fd = -1
        mm = None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno not in (95, 22):  # EOPNOTSUPP / EINVAL: no fallocate here
                    raise
                os.ftruncate(fd, size)
                _write_zeros(fd, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
            if not populated:
                with contextlib.suppress(OSError, AttributeError):  # (only a hint)
                    os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
            elif not populate(mm):
                mm.close()
                mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
            fsync_dir(directory)
        except BaseException as exc:
            if mm is not None:
                mm.close()
            if fd >= 0:
                os.close(fd)
                with contextlib.suppress(OSError):
                    path.unlink()
            if isinstance(exc, OSError):
                raise StorageError(f"cannot create CommitLog segment {path}: {exc}") from exc
            raise
        return cls(path, base, mm, fd)

    @classmethod
    def open(cls, path: Path, *, writable: bool) -> Segment:
        fd = -1
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
            size = os.fstat(fd).st_size
            if size == 0:
                raise StorageError(f"CommitLog segment {path} is empty")
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            mm = mmap.mmap(fd, size, access=access)
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            if isinstance(exc, OSError):
                raise StorageError(f"cannot open CommitLog segment {path}: {exc}") from exc
            raise
        return cls(path, int(path.name), mm, fd, writable=writable)

    @property
    def end(self) -> int:
        return self.base + self.size

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` inside the segment: a large write with ``pwrite``, a
        small one through the mapping (module doc)."""
        if offset < 0 or offset + len(data) > self.size:
            raise ValueError(f"write of {len(data)} bytes at {offset} outside the segment")
        if len(data) < PWRITE_MIN_BYTES:
            self.mm[offset:offset + len(data)] = data
            return
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written

    def write_gather(self, offset: int, pieces: list[bytes | memoryview], total: int) -> None:
        """Write ``pieces`` (``total`` bytes together) back to back at ``offset`` with
        ``pwritev``, up to ``_IOV_MAX`` pieces a call: records of large payloads go in
        without first being copied into one buffer (storage/commitlog.py ``_write_run``).
        A short write (a signal, a full disk) writes the rest of that call's pieces with
        ``write``."""
        if offset < 0 or offset + total > self.size:
            raise ValueError(f"write of {total} bytes at {offset} outside the segment")
        for first in range(0, len(pieces), _IOV_MAX):
            some = pieces[first:first + _IOV_MAX]
            want = sum(map(len, some))
            written = os.pwritev(self._fd, some, offset)
            if written < want:
                self.write(offset + written, memoryview(b"".join(some))[written:])
            offset += want

    def zero_from(self, offset: int) -> int:
        """Zero every non-zero byte from ``offset`` to the end; returns the bytes rewritten."""
        mm, rewritten = self.mm, 0
        pos = offset
        while pos < self.size:
            stop = min(self.size, (pos // len(_ZERO_CHUNK) + 1) * len(_ZERO_CHUNK))
            if mm[pos:stop] != _ZERO_CHUNK[: stop - pos]:
                self.write(pos, _ZERO_CHUNK[: stop - pos])
                rewritten += stop - pos
            pos = stop
        return rewritten

    def sync(self, start: int, stop: int) -> None:
        """msync the bytes [start, stop) of this segment (offsets inside it), without the GIL.

        Other threads run meanwhile, so the mapping must outlive the call: ``close()`` waits
        for it, and ``c_char.from_buffer`` (the address) holds the buffer until it returns. On
        a closed segment it raises ValueError, like ``mmap.flush``. Read-only mappings have
        nothing to sync."""
        start = max(0, start) // mmap.PAGESIZE * mmap.PAGESIZE
        stop = min(self.size, stop)
        if stop <= start or not self.writable:
            return
        with self._sync_lock:
            view = ctypes.c_char.from_buffer(self.mm, start)  # page-aligned, as msync needs
            try:
                if _msync(ctypes.addressof(view), stop - start, _MS_SYNC) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"msync: {os.strerror(err)}")
            finally:
                del view

    def release(self) -> None:
        """Drop this mapping's pages from the process (``madvise(MADV_DONTNEED)``): RSS, the
        file-backed pages included, no longer counts them. The mapping is shared and the
        file holds the bytes (a dirty page stays dirty in the page cache), so nothing is
        lost: a later read faults the page in again from the page cache. Cheaper and safer
        than unmapping: a reader holding ``mm`` never sees it closed."""
        with self._sync_lock:
            if self.mm.closed:
                return
            view = ctypes.c_char.from_buffer(self.mm)
            try:
                if _madvise(ctypes.addressof(view), self.size, _MADV_DONTNEED) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"madvise: {os.strerror(err)}")
            finally:
                del view
            self.released = True

    def close(self) -> None:
        with self._sync_lock:
            if not self.mm.closed:
                self.mm.close()
                os.close(self._fd)


def _write_zeros(fd: int, size: int) -> None:
    written = 0
    while written < size:
        written += os.pwrite(fd, _ZERO_CHUNK[: min(len(_ZERO_CHUNK), size - written)], written)
