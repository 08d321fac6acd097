"""Writing the analysis out: report.json (every figure), report.html (charts), console summary."""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from spark_jobs import charts


def key_figures(r: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The headline figures of one snapshot, as (label, formatted value)."""
    lg, ph = r["logical"], r["physical"]
    due = lg["dueLoad"]
    peak = due["peakSecond"] or {"messages": 0, "at": 0}
    wa = ph["rocksdb"]["writeAmplificationSinceOpen"]
    sa = ph["space"]["spaceAmplification"]
    return [
        ("waiting messages", f"{due['future']['messages'] + due['overdue']['messages']:,}"),
        ("overdue at snapshot", f"{due['overdue']['messages']:,}"),
        ("peak second", f"{peak['messages']:,} msgs at {charts.utc_label(peak['at'])}"
         if peak["messages"] else "none"),
        ("delay p50 / p99", f"{_dur(due['delayPercentilesMs']['p50'])} / "
                            f"{_dur(due['delayPercentilesMs']['p99'])}"),
        ("value size p50 / p99", f"{lg['valueSizes']['percentiles']['p50'] or 0:,} B / "
                                 f"{lg['valueSizes']['percentiles']['p99'] or 0:,} B"),
        ("SST files / bytes", f"{ph['sst']['files']:,} / {_bytes(ph['sst']['bytes'])}"),
        ("tombstones (dead prefix)", f"{ph['tombstones']['total']:,} "
                                     f"({ph['tombstones']['deadPrefixTombstones']:,})"),
        ("space amplification", "n/a" if sa is None else f"{sa:.2f}x"),
        ("reclaimable", _bytes(ph["space"]["reclaimableBytes"])),
        ("due-scan SSTs (max shard)", f"{ph['readAmplification']['max']} "
                                      f"(from key 0: {_from_start(ph)})"),
        ("due-scan skipped keys / range tombstones",
         "not measured" if ph["readAmplification"]["internalKeysSkippedMax"] is None else
         f"{ph['readAmplification']['internalKeysSkippedMax']:,} / "
         f"{ph['readAmplification']['rangeTombstonesMax']:,}"),
        ("write amplification since open", "n/a" if wa is None else f"{wa:.2f}x"),
        ("topics / top share", f"{lg['topics']['count']:,} / {lg['topics']['topShare']:.1%}"),
    ]


def _from_start(ph: Mapping[str, Any]) -> int:
    return max((s["fromStart"]["ssts"] for s in ph["readAmplification"]["byShard"].values()),
               default=0)


def _bytes(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def _dur(ms: int | None) -> str:
    if ms is None:
        return "n/a"
    for unit, div in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if abs(ms) >= div:
            return f"{ms / div:.1f} {unit}"
    return f"{ms} ms"


def write_json(report: Mapping[str, Any], out_dir: Path) -> Path:
    path = out_dir / "report.json"
    path.write_text(json.dumps(report, indent=1, sort_keys=True, default=_json_default),
                    encoding="utf-8")
    return path


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def render_charts(report: Mapping[str, Any], ssts: Sequence[Mapping[str, Any]]
                  ) -> dict[str, bytes]:
    latest = report["snapshots"][-1]
    snap = latest["snapshot"]
    watermarks = {int(k): int(v) for k, v in snap["watermarks"].items()}
    out: dict[str, Callable[[], bytes]] = {
        "due_load": lambda: charts.due_load(latest["logical"]["dueLoad"]),
        "value_sizes": lambda: charts.value_sizes(latest["logical"]["valueSizes"]),
        "lsm_map": lambda: charts.lsm_map(ssts, watermarks, snap["createdAt"],
                                          _lsm_horizon(latest["logical"]["dueLoad"])),
        "levels": lambda: charts.levels(latest["physical"]["sst"]),
        "topics": lambda: charts.topics(latest["logical"]["topics"]),
    }
    if len(report["snapshots"]) >= 2:
        created = [s["snapshot"]["createdAt"] for s in report["snapshots"]]
        out["trends"] = lambda: charts.trends(report["series"], created)
    return {name: make() for name, make in out.items()}


def _lsm_horizon(due: Mapping[str, Any]) -> int:
    """How far past the snapshot the SST map looks: where 99 % of the waiting messages are
    due (an hour when none is), so a few far-future messages do not stretch it over years."""
    p99 = due["delayPercentilesMs"].get("p99")
    return int(p99) if p99 else 3_600_000


_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222;padding:0 1em}
h1{font-size:1.5em}
h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .6em;
font-size:.9em;text-align:left}th{background:#f4f4f4}.rec{border-left:4px solid #c23b3b;
background:#fdf3f3;padding:.5em 1em;margin:.6em 0}.ok{color:#3a9a5b}.fired{color:#c23b3b}
img{max-width:100%;margin:.5em 0}.muted{color:#777;font-size:.85em}
.wide{overflow-x:auto;max-width:100%}
"""


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<div class='wide'><table><tr>{head}</tr>{body}</table></div>"


def _img(png: bytes, alt: str) -> str:
    return (f'<img alt="{html.escape(alt)}" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')


def write_html(report: Mapping[str, Any], images: Mapping[str, bytes], out_dir: Path) -> Path:
    latest = report["snapshots"][-1]
    fired = report["recommendations"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>hourglass compaction "
             f"analysis</title><style>{_CSS}</style></head><body>",
             "<h1>hourglass: compaction-impact analysis</h1>",
             f"<p class='muted'>Generated {html.escape(report['generatedAt'])} over "
             f"{len(report['snapshots'])} snapshot(s); latest "
             f"<b>{html.escape(latest['snapshot']['snapshotId'])}</b> taken "
             f"{charts.utc_label(latest['snapshot']['createdAt'])}.</p>",
             f"<h2>Recommendations ({len(fired)})</h2>"]
    parts += [f"<div class='rec'><b>{html.escape(f['title'])}</b> "
              f"<span class='muted'>[{html.escape(f['rule'])}]</span><br>"
              + "<br>".join(html.escape(f[k]) for k in ("measured", "advice", "whatIf", "basis")
                            if f[k])
              + "</div>" for f in fired] or ["<p class='ok'>No rule fired: nothing to change.</p>"]
    parts.append(_table(("check", "result", "measured", "threshold"), [
        (f"{f['title']} ({f['rule']})", "FIRED" if f["fired"] else "ok", f["measured"],
         f["basis"]) for f in report["rules"]]))
    parts.append("<h2>Key figures (latest snapshot)</h2>")
    parts.append(_table(("figure", "value"), key_figures(latest)))
    captions = {"due_load": "Due load", "value_sizes": "Value sizes and blob separation",
                "lsm_map": "SST files of the timer shards over deliverAt",
                "levels": "Bytes and tombstones per level", "topics": "Topic skew",
                "trends": "Trends across the series"}
    for name, caption in captions.items():
        if name in images:
            parts.append(f"<h2>{caption}</h2>{_img(images[name], caption)}")
    if report["series"]["intervals"]:
        parts.append("<h2>Between snapshots</h2>")
        parts.append(_table(("from", "to", "elapsed", "write amplification", "counter reset"), [
            (i["from"], i["to"], _dur(i["elapsedMs"]),
             "n/a" if i.get("writeAmplification") is None else f"{i['writeAmplification']:.2f}",
             i.get("counterReset", "n/a")) for i in report["series"]["intervals"]]))
    if len(report["snapshots"]) > 1:  # one column per snapshot, one row per figure: fits
        parts.append("<h2>Every snapshot</h2>")
        columns = [dict(key_figures(s)) for s in report["snapshots"]]
        parts.append(_table(("figure", *(s["snapshot"]["snapshotId"]
                                          for s in report["snapshots"])),
                            [(label, *(c[label] for c in columns))
                             for label, _ in key_figures(latest)]))
    parts.append("<p class='muted'>Every figure is in report.json; definitions and rule "
                 "thresholds: docs/analysis.md.</p></body></html>")
    path = out_dir / "report.html"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def console_summary(report: Mapping[str, Any]) -> str:
    lines = []
    for s in report["snapshots"]:
        lines.append(f"snapshot {s['snapshot']['snapshotId']} "
                     f"({charts.utc_label(s['snapshot']['createdAt'])})")
        lines += [f"  {label:<32} {value}" for label, value in key_figures(s)]
    for i in report["series"]["intervals"]:
        wa = i.get("writeAmplification")
        lines.append(f"interval {i['from']} -> {i['to']}: write amplification "
                     f"{'n/a' if wa is None else f'{wa:.2f}x'}"
                     f"{' (counters reset: restart in between)' if i.get('counterReset') else ''}")
    fired = report["recommendations"]
    lines.append(f"recommendations: {len(fired)} of {len(report['rules'])} rules fired")
    for f in fired:
        lines.append(f"  * [{f['rule']}] {f['measured']}")
        lines += [f"      {f[k]}" for k in ("advice", "whatIf") if f[k]]
    return "\n".join(lines)
