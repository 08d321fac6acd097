"""The bounded crash run: the real server, 10 kill -9 at random moments plus torn CommitLog
tails, then every guarantee checked against what the clients were told (bench/crash)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.crash import CrashConfig, run
from bench.crash.harness import PHASES


@pytest.mark.slow
def test_ten_kills_lose_nothing_acknowledged(tmp_path: Path) -> None:
    report = run(CrashConfig(workdir=tmp_path, kills=10, torn_every=4), progress=print)
    print(report.summary())
    assert report.ok, report.summary()
    assert report.kills == 11  # ten under load, one for the final torn tail
    assert set(report.phases) == set(PHASES)
    assert len(report.torn) == 3  # after kills 4 and 8, and the final one
    counts = report.counts
    assert counts["acked"] > 1000 and report.logged > 1000
    assert counts["cancelled"] > 0 and counts["alreadyDelivered"] > 0
    assert counts["consumed"] > 0
    assert counts["txCommitted"] > 0 and counts["txRolledBack"] > 0, report.notes
