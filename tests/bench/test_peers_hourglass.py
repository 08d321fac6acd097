"""The side-by-side's hourglass adapter against a real server: its sends, its receive and
pull loops (urllib3, msgpack both ways), through the two tools built on it."""

from __future__ import annotations

import pytest

from bench.peers import client_cost, consume_only


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
