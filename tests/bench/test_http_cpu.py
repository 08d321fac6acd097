"""The CPU shares bench/http.py records per phase (busy, idle, steal from /proc/stat)."""

from __future__ import annotations

import sys

import psutil
import pytest

from bench.http import _process_cpu, cpu_shares, cpu_times


def test_shares_of_synthetic_counters() -> None:
    before = [100, 0, 50, 1000, 10, 0, 0, 5]
    #         user nice sys idle iowait irq softirq steal: +300 busy, +600 idle, +100 steal
    after = [350, 0, 100, 1580, 30, 0, 0, 105]
    assert cpu_shares(before, after) == {"busy": 30.0, "idle": 60.0, "steal": 10.0}
    assert cpu_shares([], after) == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_real_counters_move_forward() -> None:
    first = cpu_times()
    sum(i * i for i in range(200_000))  # some CPU time passes
    second = cpu_times()
    assert len(first) == 8 and all(b >= a for a, b in zip(first, second, strict=True))
    shares = cpu_shares(first, second)
    assert set(shares) == {"busy", "idle", "steal"}
    assert all(0 <= v <= 100 for v in shares.values())


def test_a_process_cpu_time_counts_its_work() -> None:
    me = psutil.Process()
    before = _process_cpu(me)
    sum(i * i for i in range(300_000))
    assert _process_cpu(me) > before
    assert _process_cpu(None) == 0.0
