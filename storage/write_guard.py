"""WriteGuard: whether the RocksStore takes writes, and when it tries to take them again.

A full disk reaches RocksDB in two ways, and the guard answers both with StorageError
(503 UNAVAILABLE) until the store can write again, without a restart:

1. **The reserve** (``reserve_bytes``; 0 disables it). While writes flow, the free space of
   the store's filesystem is read (``os.statvfs``, ~1 us) at most every SPACE_CHECK_MS; below
   the reserve, writes are refused before RocksDB sees them, so it never meets ENOSPC in the
   middle of a WAL append or a memtable flush (what Kafka's and Elasticsearch's disk
   watermarks do). The reserve must exceed what RocksDB writes in SPACE_CHECK_MS plus a
   memtable flush.
2. **The sticky error.** When a write fails with an ``IO error`` (ENOSPC: "IO error: No space
   left on device: While appending to file: .../000004.log"), RocksDB keeps it as its
   background error and answers every later write with it, even after space returns, until
   the DB is closed and reopened (rocksdict 0.3.29 has no ``DB::Resume()``). The guard
   then refuses writes itself and, once there is room again, has the store reopen
   (``admit`` returns True). Reopening replays the WAL and flushes it into an L0 file, so
   "room" is the reserve, and at least the WAL's size plus REOPEN_HEADROOM_BYTES.

While refusing, the free space is read again (and a reopen tried) at most every
``retry_interval_ms`` on the given clock, when a write or a readiness check asks. A write
is the common trigger (a send, the delivery stage's retries); a readiness probe is the one
that works when nothing writes (a load balancer that stopped sending to an unready server).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from storage.errors import StorageError

log = logging.getLogger(__name__)

SPACE_CHECK_MS = 100  # ms between free-space reads while writes are accepted
REOPEN_HEADROOM_BYTES = 4 << 20  # bytes beyond the WAL a reopen needs (MANIFEST, WAL, OPTIONS)
NEVER = 1 << 62


class NowMs(Protocol):
    """A clock (scheduler.clock.SystemClock / FakeClock fit)."""

    def now_ms(self) -> int: ...


class MonotonicClock:
    """The store's default clock: only intervals matter to the guard."""

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


def is_sticky(exc: BaseException) -> bool:
    """RocksDB's I/O errors of a write become its sticky background error; a Corruption or
    an InvalidArgument do not, and a reopen would not cure them."""
    return "IO error" in str(exc)


def wal_bytes(path: Path) -> int:
    """Bytes of RocksDB's write-ahead log files (``NNNNNN.log``) in ``path``."""
    total = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                name = entry.name
                if name.endswith(".log") and name[:-4].isdigit():
                    total += entry.stat().st_size
    except OSError:
        return 0
    return total


class WriteGuard:
    def __init__(self, path: Path, *, clock: NowMs, reserve_bytes: int,
                 retry_interval_ms: int) -> None:
        if reserve_bytes < 0 or retry_interval_ms < 0:
            raise ValueError("reserve_bytes and retry_interval_ms must be >= 0")
        self._path = path
        self._clock = clock
        self._reserve = reserve_bytes
        self._retry_ms = retry_interval_ms
        self._lock = threading.Lock()
        self.refusal: str | None = None  # why writes are refused; None while accepted
        self.sticky = False  # RocksDB holds a background error: only a reopen clears it
        self._reopening = False  # a caller of admit() is reopening the store
        # the next free-space read (or recovery attempt): writers compare it with the clock
        self.next_check_ms = 0 if reserve_bytes else NEVER

    def free_bytes(self) -> int:
        try:
            st = os.statvfs(self._path)
        except OSError as exc:
            log.warning("cannot read the free space of %s: %s", self._path, exc)
            return NEVER  # unknown: let RocksDB be the judge
        return st.f_bavail * st.f_frsize

    def admit(self) -> bool:
        """Before a write (or for readiness): raises StorageError while writes are refused;
        returns True when the caller must reopen the store first (then ``reopened`` or
        ``reopen_failed``), False when the write may go ahead."""
        now = self._clock.now_ms()
        with self._lock:
            if now < self.next_check_ms or self._reopening:
                if self.refusal is None:
                    return False
                raise StorageError(self.refusal)
            free = self.free_bytes()
            if self.sticky:
                self.next_check_ms = now + self._retry_ms
                need = max(self._reserve, wal_bytes(self._path) + REOPEN_HEADROOM_BYTES)
                if free < need:
                    raise StorageError(self._refuse(
                        f"RocksDB stopped writing after an I/O error and is reopened once "
                        f"{need} bytes are free on its filesystem ({free} are)"))
                self._reopening = True
                return True
            if free < self._reserve:
                self.next_check_ms = now + self._retry_ms
                raise StorageError(self._refuse(
                    f"only {free} bytes are free on the store's filesystem, below the "
                    f"reserve of {self._reserve} (disk_reserve_bytes): writes are refused "
                    f"until space returns"))
            self.next_check_ms = now + SPACE_CHECK_MS if self._reserve else NEVER
            if self.refusal is not None:
                log.warning("%s: writes accepted again (%d bytes free)", self._path, free)
                self.refusal = None
            return False

    def _refuse(self, reason: str) -> str:
        if self.refusal is None:  # log the change, not every refused write
            log.error("%s: %s", self._path, reason)
        self.refusal = reason
        return reason

    def failed(self, exc: BaseException) -> None:
        """A write failed with ``exc``; an I/O error makes the store refuse writes until it
        is reopened. The next ``admit`` may try at once (the space may already be back)."""
        if not is_sticky(exc):
            return
        with self._lock:
            if not self.sticky:
                self.sticky = True
                self.refusal = None  # log this one even after a reserve refusal
                self._refuse(f"RocksDB stopped writing after an I/O error ({exc}); it is "
                             f"reopened once there is free space again")
                self.next_check_ms = 0

    def reopened(self) -> None:
        with self._lock:
            was = self.sticky
            self._reopening = False
            self.sticky = False
            self.refusal = None
            self.next_check_ms = 0 if self._reserve else NEVER
        if was:
            log.warning("%s: reopened after the I/O error; writes accepted again", self._path)

    def reopen_failed(self, exc: BaseException) -> None:
        """The store is left without a DB: refuse writes until a later reopen works."""
        log.warning("%s: reopening RocksDB failed (next attempt in %d ms): %s",
                    self._path, self._retry_ms, exc)
        with self._lock:
            self._reopening = False
            self.sticky = True
            self.refusal = f"RocksDB could not be reopened yet ({exc})"
            self.next_check_ms = self._clock.now_ms() + self._retry_ms
