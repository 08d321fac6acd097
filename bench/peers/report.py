"""results.json -> results.md (tables, ratios vs hourglass) and PNG plots.

Also runnable alone, to redraw from a results.json: ``python -m bench.peers.report DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

ORDER = ("hourglass", "redis", "bullmq", "postgres")
COLORS = {"hourglass": "#d62728", "redis": "#1f77b4", "bullmq": "#ff7f0e",
          "postgres": "#2ca02c"}
MIB = 1024 * 1024


def _systems(results: dict) -> list[str]:
    present = list(results.get("systems", {}))
    return [s for s in ORDER if s in present] + [s for s in present if s not in ORDER]


def _get(doc: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(p)
    return doc


def _label(results: dict, name: str) -> str:
    return _get(results, "systems", name, "label") or name


# ---------------------------------------------------------------- formatting

def _cell(text: object) -> str:
    """Anything as one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _num(v: float | None, digits: int = 0) -> str:
    if v is None:
        return "—"
    if digits == 0:
        return f"{v:,.0f}"
    return f"{v:,.{digits}f}"


def _dur_ms(v: float | None) -> str:
    """A lateness in ms, in the unit that reads best."""
    if v is None:
        return "—"
    if abs(v) >= 10_000:
        return f"{v / 1000:,.1f} s"
    if abs(v) >= 1000:
        return f"{v / 1000:,.2f} s"
    if abs(v) >= 10:
        return f"{v:,.0f} ms"
    return f"{v:,.1f} ms"


def _mib(v: float | None) -> str:
    return "—" if v is None else f"{v / MIB:,.0f} MiB"


def _ratio(v: float | None, ref: float | None) -> str:
    if v is None or ref is None or ref == 0:
        return "—"
    return f"{v / ref:,.2f}×"


def _pcts(s: dict | None, keys: tuple[str, ...] = ("p50", "p99", "max")) -> str:
    if not s or not s.get("count"):
        return "—"
    return " / ".join(_dur_ms(s.get(k)) for k in keys)


def _correct(sysres: dict) -> str:
    """One cell: ✔ when every workload's check passed, else what went wrong where."""
    bad = []
    ran = False
    for w, res in sorted((sysres.get("workloads") or {}).items()):
        c = res.get("correctness") if isinstance(res, dict) else None
        if not c:
            continue
        ran = True
        if c.get("ok"):
            continue
        if c.get("note"):
            bad.append(f"{w.upper()}: {c['note']}")
            continue
        if "pending" in c:
            bad.append(f"{w.upper()}: pending {c.get('pending')} + delivered "
                       f"{c.get('delivered', 0)} ≠ {c.get('expected')}")
        else:
            bad.append(f"{w.upper()}: missing {c.get('missing')}, dup {c.get('duplicates')}"
                       + ("" if c.get("complete") else " (timed out)"))
    if not ran:
        return "—"
    return "✔ all exactly once" if not bad else "; ".join(bad)


def _loads(w: dict) -> str:
    parts = []
    for k in ("w1", "w2", "w3"):
        la = _get(w, k, "loadavg_1m")
        parts.append("—" if not la else f"{la['start']:.1f} → {la['end']:.1f}")
    return " · ".join(parts)


def _whole_cpu(w: dict) -> str:
    """W3's CPU, both sides: the server's and the consumer side's (consumers and a peer's
    mover, measured per thread or process), the cores over the run's wall time."""
    whole, srv, cons = (_get(w, "w3", "whole_cpu_s"), _get(w, "w3", "server_cpu_s"),
                        _get(w, "w3", "consumer_cpu_s"))
    if whole is None or srv is None or cons is None:
        return "—"
    wall = _get(w, "w3", "wall_s")
    cores = f" = {whole / wall:.2f} core" if wall else ""
    return f"{whole:,.1f} s ({srv:,.1f} + {cons:,.1f}){cores}"


def _metrics(sysres: dict) -> dict[str, float | None]:
    w = sysres.get("workloads") or {}
    return {
        "w1": _get(w, "w1", "msgs_per_s"),
        "w2_drain_s": _get(w, "w2", "drain_s"),
        "w2_rate": _get(w, "w2", "drain_msgs_per_s"),
        "w2_p50": _get(w, "w2", "lateness_ms", "p50"),
        "w2_p99": _get(w, "w2", "lateness_ms", "p99"),
        "w2_max": _get(w, "w2", "lateness_ms", "max"),
        "w3_p50": _get(w, "w3", "lateness_ms", "p50"),
        "w3_p99": _get(w, "w3", "lateness_ms", "p99"),
        "w3_max": _get(w, "w3", "lateness_ms", "max"),
        "w3_whole_cpu": _get(w, "w3", "whole_cpu_s"),
        "mem": _get(w, "w1", "per_million_pending", "memory"),
        # once compacted where the system has that step (hourglass), else right after W1
        "disk": _get(w, "w1", "per_million_pending", "disk_compacted")
        or _get(w, "w1", "per_million_pending", "disk"),
    }


# ---------------------------------------------------------------- markdown

def write_markdown(results: dict, out: Path) -> Path:
    meta = results.get("meta", {})
    names = _systems(results)
    p = meta.get("params", {})
    lines = [
        "# hourglass and its peers, side by side",
        "",
        f"- **Machine**: {meta.get('machine', '?')}",
        f"- **Date**: {meta.get('date', '?')}; repository at `{meta.get('git', '?')}`",
        *([f"- **Command**: `{meta.get('command', '?')}`"] if len(meta.get("runs", [])) < 2
          else ["- **Commands** (results merged from several runs):",
                *(f"  - `{r['command']}` ({r['date']}: {', '.join(r['systems'])})"
                  for r in meta["runs"])]),
        f"- **Parameters**: N = {p.get('n', 0):,}; batches of {p.get('batch')} "
        f"from {p.get('producers')} producer threads; {p.get('payload', 100):,}-byte random "
        "bodies; "
        f"W3 = {p.get('w3_rate', 0):,.0f} msg/s for {p.get('w3_duration_s')} s, delays "
        f"{p.get('w3_delay_min_ms')}–{p.get('w3_delay_max_ms')} ms; every workload on a fresh "
        "server instance; client and servers share the machine.",
        "- **Disk / M pending**: the data dir's growth per million pending after W1; for "
        "hourglass once compacted (the harness stops its server and compacts its RocksDB, "
        "as background compaction would in time; right after the ingest it still holds "
        "its WAL and L0 files: `per_million_pending.disk` in results.json), for the peers "
        "as they are right after the ingest.",
    ]
    lines += [f"- {note}" for note in meta.get("notes", [])]
    for n in names:
        sp = results["systems"][n].get("params")
        if sp and sp != p and not results["systems"][n].get("skipped"):
            diff = ", ".join(f"{k}={v}" for k, v in sp.items() if p.get(k) != v)
            lines.append(f"- **Note**: {_label(results, n)} ran with different parameters: {diff}")
    lines += [
        "",
        "## Results",
        "",
        "| System | Delivery guarantee | Durability as configured | W1 ingest (msg/s) "
        "| W2 drain time | W2 drain rate (msg/s) | W2 lateness p50 / p99 / max "
        "| W3 lateness p50 / p99 / max | W3 early "
        "| W3 whole CPU: server + consumer side | Memory / M pending | Disk / M pending "
        "| Correctness |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for n in names:
        s = results["systems"][n]
        if s.get("skipped"):
            lines.append(f"| {_label(results, n)} | {s.get('guarantee', '')} | "
                         f"{s.get('durability', '')} | skipped: {_cell(s['skipped'])} "
                         "| | | | | | | | | |")
            continue
        m = _metrics(s)
        w = s.get("workloads") or {}
        early = _get(w, "w3", "early")
        lines.append(
            f"| {_label(results, n)} | {s.get('guarantee', '')} | {s.get('durability', '')} "
            f"| {_num(m['w1'])} | {_num(m['w2_drain_s'], 1) + ' s' if m['w2_drain_s'] else '—'} "
            f"| {_num(m['w2_rate'])} | {_pcts(_get(w, 'w2', 'lateness_ms'))} "
            f"| {_pcts(_get(w, 'w3', 'lateness_ms'))} "
            f"| {'—' if early is None else early} | {_whole_cpu(w)} "
            f"| {_mib(m['mem'])} | {_mib(m['disk'])} | {_correct(s)} |")

    hg = results.get("systems", {}).get("hourglass")
    ref = _metrics(hg) if hg and not hg.get("skipped") else None
    lines += ["", "### Ratios relative to hourglass", ""]
    if ref is None or all(v is None for v in ref.values()):
        lines.append("hourglass has no results in this run, so there are no ratios yet "
                     "(run it with `--systems hourglass --merge`).")
    else:
        lines += [
            "Each cell is *peer ÷ hourglass*. Throughput: above 1× the peer is faster. "
            "Lateness, CPU, memory, disk: above 1× the peer is worse (higher).",
            "",
            "| System | W1 ingest | W2 drain rate | W2 p99 lateness | W3 p99 lateness "
            "| W3 whole CPU | Memory / M | Disk / M |",
            "|---|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for n in names:
            s = results["systems"][n]
            if n == "hourglass" or s.get("skipped"):
                continue
            m = _metrics(s)
            lines.append(
                f"| {_label(results, n)} | {_ratio(m['w1'], ref['w1'])} "
                f"| {_ratio(m['w2_rate'], ref['w2_rate'])} | {_ratio(m['w2_p99'], ref['w2_p99'])} "
                f"| {_ratio(m['w3_p99'], ref['w3_p99'])} "
                f"| {_ratio(m['w3_whole_cpu'], ref['w3_whole_cpu'])} "
                f"| {_ratio(m['mem'], ref['mem'])} "
                f"| {_ratio(m['disk'], ref['disk'])} |")

    lines += ["", "## Details", "",
              "| System | W1 elapsed | W1 CPU server / client (per msg) | W2 ingest (msg/s) "
              "| W2 first msg after due | W2 CPU server / client (per msg) "
              "| W3 achieved send rate | W3 max behind schedule "
              "| W3 CPU server / client (per msg) | server-side lateness W2 · W3 "
              "(p50 / p99 / max) | load avg (1 min) at start → end of W1 · W2 · W3 |",
              "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|"]
    for n in names:
        s = results["systems"][n]
        if s.get("skipped"):
            continue
        w = s.get("workloads") or {}

        def cpu(k: str, w: dict = w) -> str:
            """CPU seconds server / client, and CPU µs per message (both sides together): the
            figure that stays comparable when other work shares the machine."""
            a, b, cnt = (_get(w, k, "server_cpu_s"), _get(w, k, "client_cpu_s"),
                         _get(w, k, "n"))
            if a is None:
                return "—"
            per = f" ({(a + b) / cnt * 1e6:,.0f} µs/msg)" if cnt else ""
            return f"{a:,.1f} s / {b:,.1f} s{per}"

        srv = " · ".join(_pcts(_get(w, k, "server_lateness_ms")) for k in ("w2", "w3"))
        lines.append(
            f"| {_label(results, n)} | {_num(_get(w, 'w1', 'elapsed_s'), 1)} s | {cpu('w1')} "
            f"| {_num(_get(w, 'w2', 'ingest_msgs_per_s'))} "
            f"| {_dur_ms(_get(w, 'w2', 'first_after_due_ms'))} | {cpu('w2')} "
            f"| {_num(_get(w, 'w3', 'achieved_send_rate'))} "
            f"| {_dur_ms(_get(w, 'w3', 'max_behind_schedule_ms'))} | {cpu('w3')} "
            f"| {srv if n.startswith('hourglass') else 'n/a'} | {_loads(w)} |")

    lines += _cluster_lines(results, names)
    errors = [(n, w, e) for n in names
              for w, e in (results["systems"][n].get("errors") or {}).items()]
    if errors:
        lines += ["", "### Errors", ""]
        lines += [f"- **{n} {w.upper()}**: `{e.splitlines()[-1] if e else e}`"
                  for n, w, e in errors]

    lines += ["", "## Configuration", ""]
    for n in names:
        s = results["systems"][n]
        lines.append(f"**{_label(results, n)}** — {s.get('guarantee', '')}; "
                     f"{s.get('durability', '')}")
        lines.append("")
        for k, v in (s.get("config") or {}).items():
            lines.append(f"- {k}: `{v}`" if len(str(v)) < 40 else f"- {k}: {v}")
        lines.append("")
    lines += ["## Plots", ""]
    for png in results.get("plots", []):
        lines.append(f"![{png}]({png})")
        lines.append("")
    path = out / "results.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _cluster_lines(results: dict, names: list[str]) -> list[str]:
    """The cluster's own figures: follower lag (from the stream storing a record to a
    follower applying it) and CPU seconds per process group, per workload."""
    rows = []
    for n in names:
        for wl, w in sorted((results["systems"][n].get("workloads") or {}).items()):
            c = w.get("cluster") if isinstance(w, dict) else None
            if not c:
                continue
            lags = "; ".join(
                f"{node}: {_num(v.get('p50_ms'), 1)} / {_num(v.get('p99_ms'), 1)} ms "
                f"(p99 ≤ {_num(v.get('p99_le_ms'))} ms bucket; mean {_num(v.get('mean_ms'), 1)}"
                f" ms, {v.get('records', 0):,} records)"
                for node, v in sorted((c.get("follower_lag") or {}).items()))
            cpu = ", ".join(f"{k} {v:,.1f} s" for k, v in (c.get("cpu_s") or {}).items())
            rows.append(f"| {_label(results, n)} | {wl.upper()} | {lags or '—'} | {cpu} |")
    if not rows:
        return []
    return ["", "### Cluster", "",
            "Follower lag: from the stream storing a record to a follower applying it "
            "(`hourglass_cluster_apply_lag_ms`, every record of the workload; p50 / p99 "
            "interpolated within the histogram's buckets). CPU: seconds per process group "
            "over the workload (the six servers and the client share the machine).", "",
            "| System | Workload | Follower lag p50 / p99 | CPU by process group |",
            "|---|---|---|---|", *rows]


# ---------------------------------------------------------------- plots

def _bars(ax: Any, names: list[str], values: list[float | None], results: dict,
          fmt: str, title: str, ylabel: str) -> None:
    xs = np.arange(len(names))
    vals = [0 if v is None else v for v in values]
    bars = ax.bar(xs, vals, color=[COLORS.get(n, "#7f7f7f") for n in names])
    for b, v in zip(bars, values, strict=True):
        ax.annotate("n/a" if v is None else fmt.format(v),
                    (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=9, xytext=(0, 2),
                    textcoords="offset points")
    ax.set_xticks(xs, [_label(results, n) for n in names], rotation=12)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,.0f}"))
    ax.margins(y=0.15)
    ax.grid(axis="y", alpha=0.3)


def plot_throughput(results: dict, out: Path) -> Path:
    names = [n for n in _systems(results) if not results["systems"][n].get("skipped")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    _bars(axes[0], names, [_metrics(results["systems"][n])["w1"] for n in names], results,
          "{:,.0f}", "W1 ingest, due over the next hour", "messages / s (higher is better)")
    _bars(axes[1], names, [_metrics(results["systems"][n])["w2_rate"] for n in names], results,
          "{:,.0f}", "W2 drain, all due at one instant", "messages / s (higher is better)")
    fig.suptitle(f"Throughput, N = {results['meta']['params']['n']:,}")
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _compact(v: float) -> str:
    """A bar label that stays narrow: 9.55, 158, 3.5k, 142k."""
    if v >= 10_000:
        return f"{v / 1000:,.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}k"
    if v >= 10:
        return f"{v:.0f}"
    return f"{v:.2f}"


def _pct_bars(ax: Any, names: list[str], results: dict, wl: str, scale: float,
              unit: str, title: str) -> None:
    keys = ("p50", "p99", "max")
    if not any(_get(results["systems"][n], "workloads", wl, "lateness_ms", "p50") is not None
               for n in names):
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        return
    width = 0.8 / len(keys)
    xs = np.arange(len(names))
    shades = (0.45, 0.7, 1.0)
    for k, (key, alpha) in enumerate(zip(keys, shades, strict=True)):
        vals = [_get(results["systems"][n], "workloads", wl, "lateness_ms", key) for n in names]
        heights = [max(v / scale, 1e-3) if v is not None else 0 for v in vals]
        bars = ax.bar(xs + (k - 1) * width, heights, width,
                      color=[COLORS.get(n, "#7f7f7f") for n in names], alpha=alpha,
                      edgecolor="black", linewidth=0.4, label=key)
        for b, v in zip(bars, vals, strict=True):
            if v is None:
                continue
            txt = _compact(v / scale)
            ax.annotate(txt, (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 1),
                        textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xticks(xs, [_label(results, n) for n in names], rotation=12)
    ax.set_ylabel(f"lateness ({unit}, log scale; lower is better)")
    ax.set_title(title)
    handles = [Patch(facecolor="#555555", alpha=a, edgecolor="black", label=k)
               for k, a in zip(keys, shades, strict=True)]
    ax.legend(handles=handles, title="shade", fontsize=8, title_fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3, which="both")


def plot_lateness(results: dict, out: Path) -> Path:
    names = [n for n in _systems(results) if not results["systems"][n].get("skipped")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    p = results["meta"]["params"]
    _pct_bars(axes[0], names, results, "w2", 1000.0, "s",
              f"W2: {p['n']:,} due at one instant")
    _pct_bars(axes[1], names, results, "w3", 1.0, "ms",
              f"W3: {p['w3_rate']:,.0f} msg/s, delays {p['w3_delay_min_ms'] / 1000:g}–"
              f"{p['w3_delay_max_ms'] / 1000:g} s")
    fig.suptitle("Lateness = received by the consumer − due time")
    fig.tight_layout()
    path = out / "lateness.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_w3_cdf(results: dict, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 5))
    for n in _systems(results):
        w3 = _get(results["systems"][n], "workloads", "w3") or {}
        q = w3.get("lateness_quantiles_ms") or []
        if not q:
            continue
        ys = np.linspace(0, 1, len(q))
        ax.plot(np.maximum(q, 0.1), ys, color=COLORS.get(n), lw=2,
                label=f"{_label(results, n)} (consumer)")
        sq = w3.get("server_lateness_quantiles_ms") or []
        if sq:
            ax.plot(np.maximum(sq, 0.1), np.linspace(0, 1, len(sq)), color=COLORS.get(n),
                    lw=1.5, ls="--", label=f"{_label(results, n)} (server: storedAt − deliverAt)")
    if not ax.lines:
        ax.text(0.5, 0.5, "no W3 data", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.set_xscale("log")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("lateness (ms, log scale; values ≤ 0.1 ms drawn at 0.1)")
    ax.set_ylabel("fraction of messages")
    p = results["meta"]["params"]
    ax.set_title(f"W3 lateness CDF: {p['w3_rate']:,.0f} msg/s for {p['w3_duration_s']:g} s, "
                 f"delays {p['w3_delay_min_ms'] / 1000:g}–{p['w3_delay_max_ms'] / 1000:g} s")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path = out / "w3_lateness_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_footprint(results: dict, out: Path) -> Path:
    names = [n for n in _systems(results) if not results["systems"][n].get("skipped")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    mem = [_metrics(results["systems"][n])["mem"] for n in names]
    disk = [_metrics(results["systems"][n])["disk"] for n in names]
    _bars(axes[0], names, [None if v is None else v / MIB for v in mem], results, "{:,.0f}",
          "Memory per million pending", "MiB (lower is better)")
    _bars(axes[1], names, [None if v is None else v / MIB for v in disk], results, "{:,.0f}",
          "Disk per million pending", "MiB (lower is better)")
    fig.suptitle("Footprint after W1 (growth over the empty server, scaled to 1 M)")
    fig.tight_layout()
    path = out / "footprint.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(results: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    plots = [plot_throughput(results, out), plot_lateness(results, out),
             plot_w3_cdf(results, out), plot_footprint(results, out)]
    results["plots"] = [p.name for p in plots]
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    md = write_markdown(results, out)
    return [out / "results.json", md, *plots]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "bench/peers/results")
    results = json.loads((out / "results.json").read_text())
    for p in write_all(results, out):
        print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
