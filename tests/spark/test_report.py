"""report.json / report.html / console, and `hourglass analyze` end to end (local mode)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

from app.cli import main as hourglass
from spark_jobs.report import console_summary, render_charts, write_html, write_json
from tests.spark.conftest import Generated, Series

pytestmark = pytest.mark.spark

PNG = b"\x89PNG\r\n\x1a\n"


def test_json_html_and_console(analysis: dict[str, Any], workload: Generated,
                               tmp_path: Path) -> None:
    latest = analysis["snapshots"][-1]
    ssts = [{**f, "start_key": bytes.fromhex(f["start_key"]),
             "end_key": bytes.fromhex(f["end_key"])} for f in latest["physical"]["files"]]
    images = render_charts(analysis, ssts)
    assert set(images) == {"due_load", "value_sizes", "lsm_map", "levels", "topics"}
    assert all(png.startswith(PNG) and len(png) > 5_000 for png in images.values())
    page = write_html(analysis, images, tmp_path).read_text()
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(embedded) == 5 and base64.b64decode(embedded[0]).startswith(PNG)
    fired = [f for f in analysis["rules"] if f["fired"]]
    # its 50 overdue messages (up to 10 s late), and its topics: 'orders' holds 60 % of four,
    # and 95 % of the messages are in topics that hash to shard 0 (a topic lives in one
    # shard). Its large values get no blob advice: compaction has hardly rewritten them.
    assert [f["rule"] for f in fired] == ["overdue", "topic-skew", "shard-imbalance"]
    assert "Hot topics: &#x27;orders&#x27;" in page
    assert workload.snapshot.snapshot_id in page
    data = json.loads(write_json(analysis, tmp_path).read_text())
    assert data["snapshots"][0]["logical"]["dueLoad"]["peakSecond"] == \
        latest["logical"]["dueLoad"]["peakSecond"]
    assert len(data["rules"]) == 14 and data["recommendations"] == fired
    text = console_summary(analysis)
    assert "peak second" in text and "3 of 14 rules fired" in text


def test_hourglass_analyze_cli(spark: Any, workload: Generated, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    status = hourglass(["analyze", str(workload.snapshot.path), "--out", str(out),
                        "--partitions", "3", "--threshold", "delivery_rate=100",
                        "--export-parquet", str(tmp_path / "export")])
    assert status == 0
    captured = capsys.readouterr()
    assert "[analyze" in captured.err and "logical rows" in captured.err  # progress
    assert "recommendations: 4 of 14 rules fired" in captured.out
    report = json.loads((out / "report.json").read_text())
    assert {f["rule"] for f in report["recommendations"]} == {"burst", "overdue", "topic-skew",
                                                               "shard-imbalance"}
    assert report["parameters"]["thresholds"]["delivery_rate"] == 100
    assert (out / "report.html").stat().st_size > 50_000
    # the Parquet export analyses to the same figures, without RocksDB
    export = tmp_path / "export" / workload.snapshot.snapshot_id
    status = hourglass(["analyze", str(export), "--out", str(tmp_path / "again"), "--no-html",
                        "--quiet"])
    assert status == 0
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert again["snapshots"][0]["logical"] == report["snapshots"][0]["logical"]
    assert again["snapshots"][0]["physical"]["tombstones"] == \
        report["snapshots"][0]["physical"]["tombstones"]
    assert not (tmp_path / "again" / "report.html").exists()


def test_a_series_report_has_trends(spark: Any, series: Series, tmp_path: Path) -> None:
    status = hourglass(["analyze", *(str(s.path) for s in reversed(series.snapshots)),
                        "--out", str(tmp_path), "--quiet", "--partitions", "2"])
    assert status == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert [s["snapshot"]["snapshotId"] for s in report["snapshots"]] == [
        s.snapshot_id for s in series.snapshots]  # oldest first, whatever the order given
    assert len(report["series"]["intervals"]) == 2
    page = (tmp_path / "report.html").read_text()
    assert "Trends across the series" in page and "Between snapshots" in page


@pytest.mark.parametrize(("args", "message"), [
    (["/nonexistent/snap"], "no such snapshot"),
    (["{tmp}"], "no snapshots in this directory"),
    (["{snap}", "--threshold", "speed=1"], "unknown threshold 'speed'"),
    (["{snap}", "--threshold", "delivery_rate"], "NAME=VALUE"),
    (["{snap}", "--window-ms", "0"], "--window-ms must be > 0"),
])
def test_cli_errors_are_clear(workload: Generated, tmp_path: Path, args: list[str],
                              message: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(tmp=tmp_path, snap=workload.snapshot.path) for a in args]
    assert hourglass(["analyze", *argv, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written


def test_chart_scales_and_windows() -> None:
    from spark_jobs import charts

    flat = [100, 120, 90, 110] * 50
    assert not charts.needs_log_scale(flat)
    assert charts.needs_log_scale([*flat, 60_000])  # a burst would flatten the rest
    now, hour = 1_700_000_000_000, 3_600_000
    # a far-future message does not stretch the SST map: it shows [watermark, now + horizon)
    assert charts.lsm_window({0: now - 10_000, 1: now - 5 * hour}, now, hour) == (
        now - 5 * hour, now + hour)
    assert charts.lsm_window({}, now, 0) == (now - 60_000, now + 60_000)
    far = {"file": "1.sst", "file_number": 1, "cf": "timer.0", "level": 6, "size": 10,
           "start_key": b"", "end_key": b"", "start_time": now - hour,
           "end_time": now + 3 * 365 * 24 * hour, "num_entries": 10, "num_deletions": 1}
    png = charts.lsm_map([far], {0: now - 10_000}, now, hour)
    assert png.startswith(PNG)
