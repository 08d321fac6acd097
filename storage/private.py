"""Private files: everything hourglass keeps on disk (message bodies, callback secrets, the
admin token, snapshots) is readable by its owner only.

``hourglass serve`` sets the process umask to 077, so RocksDB's own files are 0600 too; the
engine also makes each directory it owns 0700 (tightening one made earlier with a looser
mode) and creates its own files 0600, whatever the umask of the process embedding it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700
UMASK = 0o077


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (created, with its parents, if
    needed)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        os.chmod(path, DIR_MODE)
    return path


def readable_by_others(path: Path) -> bool:
    return bool(stat.S_IMODE(path.stat().st_mode) & 0o077)
