"""A disk that really fills up, for the full-disk tests (tests/faults, tests/storage)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(tmp_path: Path, megabytes: int, skip_note: str = "") -> Iterator[Path]:
    """A ``megabytes`` MiB tmpfs mounted under ``tmp_path``; the test is skipped where
    mounting is not allowed."""
    mountpoint = tmp_path / "fs"
    mountpoint.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0755",
                           "tmpfs", str(mountpoint)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})"
                    f"{skip_note}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill_disk(directory: Path, leave_bytes: int = 0) -> Path:
    """Grow the ballast file ``directory/ballast`` until the filesystem has only
    ``leave_bytes`` free (called again, it takes more); unlink it to give the space back."""
    ballast = directory / "ballast"
    st = os.statvfs(directory)
    size = max(0, st.f_bavail * st.f_frsize - leave_bytes)
    chunk = bytes(1 << 20)
    with open(ballast, "ab") as f:
        written = 0
        while written < size:
            try:
                written += f.write(chunk[: min(len(chunk), size - written)])
            except OSError:  # already full
                break
    return ballast
