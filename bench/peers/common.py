"""Shared pieces: clocks, message generation, server processes, sizes, the delivery tracker."""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

BODY_BYTES = 100
ID_PREFIX = "m"
_PARSED_WHOLE = 32  # ids in a batch from which msg_indexes parses them in one pass
_IDS = re.compile(f"{ID_PREFIX}[0-9]{{1,18}}(?:,{ID_PREFIX}[0-9]{{1,18}})*")


def now_ms() -> float:
    """Wall-clock time in epoch milliseconds (float, sub-ms resolution)."""
    return time.time() * 1000.0


def msg_id(i: int) -> str:
    """The message id of message number ``i``: 'm' + decimal (BullMQ refuses integer job ids)."""
    return f"{ID_PREFIX}{i}"


def msg_indexes(ids: Sequence[str | bytes]) -> np.ndarray:
    """``msg_index`` of each id, as an int64 array: parsed by numpy in one pass when there
    are ``_PARSED_WHOLE`` or more and all are the harness's ('m' + ASCII decimal digits, the
    usual batch), else id by id (a message popped alone: no slower than before)."""
    if len(ids) >= _PARSED_WHOLE:
        try:  # (str ids, or bytes ids: one type a batch)
            joined = (b",".join(ids).decode("ascii") if isinstance(ids[0], bytes)  # type: ignore[arg-type]
                      else ",".join(ids))  # type: ignore[arg-type]
        except (TypeError, UnicodeDecodeError):
            joined = ""
        if _IDS.fullmatch(joined):  # (np.fromstring's text mode: ~10x faster than int() each)
            found = np.fromstring(joined[len(ID_PREFIX):].replace("," + ID_PREFIX, ","),
                                  dtype=np.int64, sep=",")
            if len(found) == len(ids):  # (an id holding a comma: id by id)
                return found
    return np.fromiter((msg_index(i) for i in ids), dtype=np.int64, count=len(ids))


def msg_index(mid: str | bytes) -> int:
    """Inverse of :func:`msg_id`; -1 for an id this harness did not make."""
    if isinstance(mid, bytes):
        mid = mid.decode("ascii", "replace")
    if not mid.startswith(ID_PREFIX):
        return -1
    try:
        return int(mid[len(ID_PREFIX):])
    except ValueError:
        return -1


def random_bodies(count: int, size: int = 100) -> list[str]:
    """``count`` random ``size``-byte ASCII bodies (base64 of random bytes, cut to ``size``:
    hardly compressible; an entropy coder such as ZSTD's gets them to ~3/4)."""
    raw_size = (size + 3) // 4 * 3
    raw = os.urandom(raw_size * count)
    return [base64.b64encode(raw[k * raw_size:(k + 1) * raw_size])[:size].decode("ascii")
            for k in range(count)]


@dataclass
class Batch:
    """A batch of messages to send: parallel lists of ids, due times (epoch ms) and bodies."""

    ids: list[str]
    due_ms: list[int]
    bodies: list[str]

    def __len__(self) -> int:
        return len(self.ids)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- server processes

_LIVE: set[ManagedProcess] = set()
_LIVE_LOCK = threading.Lock()


def number_list(ap: argparse.ArgumentParser, flag: str, text: str,
                cast: Callable[[str], float], example: str) -> list:
    """The comma-separated numbers of option ``flag`` (each >= 0, at least one, none twice);
    a usage error through ``ap`` otherwise."""
    try:
        values = [cast(v) for v in text.split(",") if v.strip()]
    except ValueError:
        ap.error(f"{flag} wants numbers, e.g. {example}, not {text!r}")
    if not values or min(values) < 0:
        ap.error(f"{flag} wants at least one number, each >= 0")
    if len(set(values)) != len(values):
        ap.error(f"{flag} names one twice: {text!r}")
    return values


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ManagedProcess:
    """A server started by the harness, in its own session, stopped for sure at the end.

    Every live one is registered so :func:`stop_all` (called from ``run.py``'s ``finally`` and
    signal handlers) can stop whatever is left, even after an error or Ctrl-C.
    """

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None,
                 stop_signal: int = signal.SIGTERM, user: str | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.stop_signal = stop_signal
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
            user=user, group=user,
        )
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(self.stop_signal)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # the whole session: postgres' backends, a server's workers
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def tree(self) -> list[psutil.Process]:
        """The server process and all its descendants (postgres' backends, uvicorn workers)."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def stop_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for p in live:
        try:
            p.stop(timeout=15)
        except Exception as exc:  # keep stopping the others
            log(f"could not stop {p.name} (pid {p.pid}): {exc}")


def wait_until(check: Callable[[], bool], timeout: float, what: str,
               proc: ManagedProcess | None = None, interval: float = 0.1) -> None:
    """Poll ``check`` until true; raise RuntimeError on timeout or if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{what}: process exited with {proc.proc.returncode}:\n"
                               f"{proc.log_tail()}")
        try:
            if check():
                return
        except Exception as exc:
            last_exc = exc
        time.sleep(interval)
    raise RuntimeError(f"{what}: not ready after {timeout:.0f} s (last error: {last_exc})")


# ---------------------------------------------------------------- sizes

def dir_size(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (like ``du -s``: blocks, not apparent sizes)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, f))
                total += st.st_blocks * 512
    return total


def tree_memory(procs: list[psutil.Process]) -> dict[str, int]:
    """RSS and PSS summed over a process tree (PSS counts shared memory once: postgres)."""
    rss = pss = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            info = p.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
    return {"rss": rss, "pss": pss}


def chown_tree(path: Path, user: str) -> None:
    for root, dirs, files in os.walk(path):
        for name in (root, *(os.path.join(root, d) for d in dirs),
                     *(os.path.join(root, f) for f in files)):
            shutil.chown(name, user, user)


# ---------------------------------------------------------------- delivery tracking

class Tracker:
    """Who was sent when due, who was received when, how often: numpy arrays indexed by id.

    ``record`` is called by consumers (any thread) with the ids of one received batch.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.due = np.full(n, np.nan)           # epoch ms, set by the producer
        self.recv = np.full(n, np.nan)          # first receipt, epoch ms
        self.server_late = np.full(n, np.nan)   # server-reported lateness (hourglass)
        self.count = np.zeros(n, dtype=np.uint32)
        self.unexpected = 0
        self.received = 0                       # receipts, duplicates included
        self.last_recv = float("nan")
        self._distinct = 0                      # ids received at least once
        self._lock = threading.Lock()

    def set_due(self, ids: list[str], due_ms: list[int]) -> None:
        self.due[msg_indexes(ids)] = due_ms

    def record(self, ids: Sequence[str | bytes], recv_ms: float | Sequence[float],
               server_late: Sequence[float] | None = None) -> None:
        """One received batch: its ids, when it was received (one time, or one per id) and,
        if the system reports it, each message's server-side lateness. It runs on the
        consumers' threads, in their process: ~0.1 ms a batch of 1000 (0.89 ms when each id
        was parsed by ``msg_index`` and ``distinct`` counted the whole array: the harness's
        own work then bounded a drain by consumers in one process, for every system)."""
        if not ids:
            return
        idx = msg_indexes(ids)
        ok = (idx >= 0) & (idx < self.n)
        recv = np.broadcast_to(np.asarray(recv_ms, dtype=float), idx.shape)[ok]
        with self._lock:
            self.unexpected += int((~ok).sum())
            idx_ok = idx[ok]
            np.add.at(self.count, idx_ok, 1)
            first = np.isnan(self.recv[idx_ok])
            fresh = idx_ok[first]
            self.recv[fresh] = recv[first]
            # an id k times fresh in one batch has count k now (0 before): counted once
            self._distinct += (len(fresh) if len(fresh) < 2
                               else round(float(np.sum(1.0 / self.count[fresh]))))
            if server_late is not None:
                sl = np.asarray(server_late, dtype=float)[ok]
                self.server_late[fresh] = sl[first]
            self.received += len(ids)
            if recv.size:
                self.last_recv = float(recv.max())

    @property
    def distinct(self) -> int:
        """Ids received at least once (kept by ``record``: a drain's wait asks every 2 ms)."""
        return self._distinct

    def correctness(self, expected: int | None = None) -> dict[str, int]:
        """Missing / duplicate counts over the first ``expected`` ids (all sent ones)."""
        m = self.n if expected is None else expected
        c = self.count[:m]
        return {
            "expected": m,
            "received_distinct": int((c > 0).sum()),
            "missing": int((c == 0).sum()),
            "duplicates": int(np.maximum(c.astype(np.int64) - 1, 0).sum()),
            "unexpected": self.unexpected,
        }

    def lateness(self, expected: int | None = None) -> np.ndarray:
        m = self.n if expected is None else expected
        lat = self.recv[:m] - self.due[:m]
        return lat[~np.isnan(lat)]

    def server_lateness(self, expected: int | None = None) -> np.ndarray:
        m = self.n if expected is None else expected
        s = self.server_late[:m]
        return s[~np.isnan(s)]


def summarize(values_ms: np.ndarray) -> dict[str, float | int | None]:
    """p50/p90/p99/p99.9/max/mean of a lateness sample (ms), plus a 1001-point quantile curve."""
    if values_ms.size == 0:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "p999": None,
                "max": None, "mean": None, "min": None}
    q = np.percentile(values_ms, [50, 90, 99, 99.9])
    return {
        "count": int(values_ms.size),
        "min": float(values_ms.min()),
        "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "p999": float(q[3]),
        "max": float(values_ms.max()),
        "mean": float(values_ms.mean()),
    }


def quantile_curve(values_ms: np.ndarray, points: int = 201) -> list[float]:
    """Quantiles at 0, 0.5 %, ..., 100 %: enough to draw a CDF without storing every sample."""
    if values_ms.size == 0:
        return []
    return [float(v) for v in np.quantile(values_ms, np.linspace(0, 1, points))]


# ---------------------------------------------------------------- progress

class Progress:
    """Prints ``status()`` every ``every`` seconds on stderr while a phase runs."""

    def __init__(self, label: str, status: Callable[[], str], every: float = 3.0) -> None:
        self.label = label
        self.status = status
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{label}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                log(f"{self.label}: {self.status()}")
            except Exception as exc:
                log(f"{self.label}: (progress failed: {exc})")

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
