"""bench.peers.tradeoff: W3 once per scan interval, each on a real hourglass server started
with that interval, the figures collected from the harness's own results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.peers import tradeoff


def test_the_runs_take_turns() -> None:
    assert tradeoff.plan([1, 2, 4, 8], ["redis", "postgres"]) == [
        ("redis", None), ("hourglass", 1), ("hourglass", 2),
        ("postgres", None), ("hourglass", 4), ("hourglass", 8)]
    assert tradeoff.plan([1, 2, 4], ["redis"]) == [
        ("redis", None), ("hourglass", 1), ("hourglass", 2), ("hourglass", 4)]
    assert tradeoff.plan([4, 8], []) == [("hourglass", 4), ("hourglass", 8)]


@pytest.mark.parametrize(("args", "said"), [
    (["--intervals", "1,x"], "--intervals"), (["--intervals", ""], "--intervals"),
    (["--intervals", "-1"], "--intervals"), (["--intervals", "4,4"], "--intervals"),
    (["--peers", "redis,mysql"], "unknown peer 'mysql'"),
    (["--peers", "hourglass"], "unknown peer 'hourglass'"),
])
def test_bad_options_are_refused(args: list[str], said: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        tradeoff.parse_args(args)
    assert exc.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.slow
def test_each_interval_reaches_its_server_and_is_measured(tmp_path: Path) -> None:
    code = tradeoff.main(["--intervals", "1,16", "--peers", "", "--w3-rate", "200",
                          "--w3-duration", "2", "--out", str(tmp_path)])
    assert code == 0
    doc = json.loads((tmp_path / "tradeoff.json").read_text())
    runs = doc["runs"]
    assert [r["interval_ms"] for r in runs] == [1, 16]
    for r in runs:
        assert r["messages"] == 400 and r["correct"] is True
        assert 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["server_cpu_s"] > 0 and r["wall_s"] > 2
    # a 16 ms scan interval leaves messages waiting longer than a 1 ms one: the server
    # really ran with each (it records its HOURGLASS_* environment; ``figures`` checks it)
    assert runs[1]["p50_ms"] > runs[0]["p50_ms"]
    assert (tmp_path / "tradeoff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "tradeoff.md").read_text()
    assert "| 1 ms |" in md and "| 16 ms |" in md

    # a run whose server did not get the interval asked for is refused, not reported
    results = json.loads((tmp_path / "hourglass-1ms" / "results.json").read_text())
    with pytest.raises(RuntimeError, match="HOURGLASS_SCAN_INTERVAL_MS='1', not 4"):
        tradeoff.figures(results, "hourglass", 4)
