"""``hourglass serve`` raises its soft limit of open files to the hard one (a server holds a
socket per connection, a duplicate per standing stream and every RocksDB file)."""

from __future__ import annotations

import resource
import subprocess
import sys

PROBE = """
import resource, sys
from app.server import raise_open_files_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
print(raise_open_files_limit(int(sys.argv[1])), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def probe(needed: int) -> tuple[list[int], str]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(needed)], capture_output=True,
                          text=True, check=True, timeout=60)
    return [int(v) for v in done.stdout.split()], done.stderr


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = (1 << 20) if hard == resource.RLIM_INFINITY else hard
    (returned, now), stderr = probe(needed=100)
    assert returned == now == expected > 256
    assert "open files" not in stderr


def test_a_hard_limit_below_the_need_is_said() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = (1 << 20) if hard == resource.RLIM_INFINITY else hard
    (returned, _), stderr = probe(needed=limit + 1)
    assert returned == limit
    assert f"{limit} open files allowed (ulimit -n), fewer than the {limit + 1}" in stderr
