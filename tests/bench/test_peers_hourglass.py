"""The side-by-side's hourglass adapter against a real server: its sends, its receive and
pull loops (urllib3, msgpack both ways), through the three tools built on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers import client_cost, consume_only, request_cost
from bench.peers.systems.hourglass import HourglassSystem


@pytest.mark.parametrize("mode", ["receive", "pull"])
def test_the_consumers_get_every_message(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert consume_only.main(["--mode", mode, "--n", "3000", "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{mode}: 3,000 messages in hand in "), out


def test_client_cost_pulls_everything_through_both_clients(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert client_cost.main(["--n", "2500", "--rounds", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["httpx", "urllib3"], lines
    assert all("per pull of 1000 (msgpack, decoded): client CPU" in line for line in lines)


def test_request_cost_measures_each_kind_against_a_real_server(tmp_path: Path) -> None:
    system = HourglassSystem({})
    system.start(tmp_path)
    try:
        rows = request_cost.measure(system, 40)
        assert system.pending_count() == 41  # every send of one was stored (and the warm-up)
    finally:
        system.stop()
    assert list(rows) == ["GET /healthz", "receive, nothing there", "send one, due in 1 h"]
    for row in rows.values():
        assert row["wall_us"] > 0 and row["user_us"] >= 0 and row["system_us"] >= 0
    assert sum(row["user_us"] + row["system_us"] for row in rows.values()) > 0
