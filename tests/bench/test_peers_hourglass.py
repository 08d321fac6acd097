"""The side-by-side's hourglass adapter against a real server: its sends, its receive and
pull loops (urllib3, msgpack both ways), through the three tools built on it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.peers import burst_cpu, client_cost, consume_only, members_burst, request_cost
from bench.peers.systems.hourglass import HourglassSystem


@pytest.mark.parametrize(("mode", "body", "encoding"), [
    ("receive", "once", "msgpack"), ("pull", "once", "msgpack"), ("stream", "once", "msgpack"),
    ("receive", "both", "msgpack"), ("pull", "both", "msgpack"), ("stream", "both", "msgpack"),
    ("receive", "once", "json"), ("pull", "once", "json"), ("stream", "once", "json")])
def test_the_consumers_get_every_message(mode: str, body: str, encoding: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert consume_only.main(["--mode", mode, "--body", body, "--encoding", encoding,
                              "--n", "3000", "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{mode}, body {body}, {encoding}: 3,000 messages in hand in "), out


def test_burst_cpu_times_a_burst_of_large_bodies(capsys: pytest.CaptureFixture[str]) -> None:
    assert burst_cpu.main(["--n", "1500", "--payload", "8192", "--lead", "0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 1500 and out["drain_s"] >= 0 and out["server_cpu_s"] > 0
    assert set(out["rss_growth_mib"]) == {"RssAnon", "RssFile"}


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_members_burst_drains_a_burst_due_at_once(encoding: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Every message of a burst in hand (else it exits with how many), its drain and CPU
    from the due time, and the receives answered since (the two members' long polls of the
    due time and at least one more)."""
    assert members_burst.main(["--n", "3000", "--encoding", encoding, "--lead-ms", "3000",
                               "--timeout", "60"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"receive, {encoding}: drain "), out
    assert "CPU of the drain: server " in out and "ms each in the server" in out, out
    requests = int(out.split(" receive requests")[0].rsplit(" ", 1)[1])
    assert requests >= 3, out


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
        began = time.perf_counter()
        paced = request_cost.measure(system, 10, gap_s=0.02)
        assert time.perf_counter() - began >= 3 * 10 * 0.02  # the client idled before each
        assert system.pending_count() == 41 + 11
    finally:
        system.stop()
    for answer in (rows, paced):
        assert list(answer) == ["GET /healthz", "receive, nothing there", "send one, due in 1 h"]
        for row in answer.values():  # (the idle time is not in the wall time per request)
            assert 0 < row["wall_us"] < 200_000 and row["user_us"] >= 0 and row["system_us"] >= 0
    # the server's CPU is read from its process, in clock ticks (10 ms): 150 requests take
    # tens of ms of it, 30 alone may take less than a tick (a failure under load, once)
    spent = [row["user_us"] + row["system_us"] for answer in (rows, paced)
             for row in answer.values()]
    assert sum(spent) > 0, spent


def test_request_cost_refuses_bad_gaps(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("x", "-4", ""):
        with pytest.raises(SystemExit) as exc:
            request_cost.main(["--gaps-ms", bad])
        assert exc.value.code == 2
        assert "--gaps-ms" in capsys.readouterr().err
