"""The report's charts (matplotlib, Agg backend), each returned as PNG bytes."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

COLORS = {"main": "#3467a8", "second": "#e08a2c", "bad": "#c23b3b", "ok": "#3a9a5b",
          "grey": "#888888"}
LEVEL_CMAP = "YlOrRd"


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def utc_label(ms: int) -> str:
    """Epoch ms as a readable UTC time."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def due_load(due: Mapping[str, Any]) -> bytes:
    """Messages due per second / minute / hour / day ahead of the snapshot."""
    panels = [("perSecond", "seconds ahead", "per second, next hour"),
              ("perMinute", "minutes ahead", "per minute, next 24 h"),
              ("perHour", "hours ahead", "per hour, next 7 days"),
              ("perDay", "days ahead", "per day, next year")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 10.5))
    for ax, (key, xlabel, title) in zip(axes, panels, strict=True):
        series = due[key]["messages"]
        logarithmic = needs_log_scale(series)
        if logarithmic:  # a burst would flatten everything else on a linear axis
            ax.set_yscale("symlog", linthresh=1)
            title += ", log scale"
        if len(series) > 400:  # vlines keep a lone busy slot visible among 1-pixel slots
            ax.vlines(range(len(series)), 0, series, color=COLORS["main"], linewidth=1.0)
        else:
            ax.bar(range(len(series)), series, width=0.9, color=COLORS["main"], linewidth=0)
        if series and max(series) > 0:
            peak = max(range(len(series)), key=series.__getitem__)
            ax.annotate(f"peak {series[peak]:,}", (peak, series[peak]), xytext=(6, -2),
                        textcoords="offset points", fontsize=8, color=COLORS["bad"])
        ax.set_title(f"Messages due {title}", fontsize=10, loc="left")
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel("messages", fontsize=8)
        ax.set_xlim(-0.5, len(series) - 0.5)
        ax.tick_params(labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"Due load from {utc_label(due['now'])} "
                 f"(overdue at snapshot: {due['overdue']['messages']:,})", fontsize=11)
    fig.tight_layout()
    return _png(fig)


def needs_log_scale(values: Sequence[int], ratio: float = 20.0) -> bool:
    """True when the largest value is more than ``ratio`` times the median non-zero one: on a
    linear axis everything but the peak would be a few pixels tall."""
    nonzero = sorted(v for v in values if v > 0)
    return bool(nonzero) and nonzero[-1] > ratio * nonzero[len(nonzero) // 2]


def value_sizes(vs: Mapping[str, Any]) -> bytes:
    """Value-size histogram (messages and bytes) with the blob-separation thresholds."""
    hist = vs["histogram"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    labels = [f"≤ {_size(h['upTo'])}" for h in hist]
    total_v = max(vs["values"], 1)
    total_b = max(vs["bytes"], 1)
    xs = range(len(hist))
    ax1.bar([x - 0.2 for x in xs], [h["values"] / total_v for h in hist], width=0.4,
            color=COLORS["main"], label="share of messages")
    ax1.bar([x + 0.2 for x in xs], [h["bytes"] / total_b for h in hist], width=0.4,
            color=COLORS["second"], label="share of value bytes")
    ax1.set_xticks(list(xs))
    ax1.set_xticklabels(labels)
    ax1.set_title("Waiting messages by value size", fontsize=10, loc="left")
    ax1.tick_params(axis="x", labelrotation=45, labelsize=7)
    ax1.grid(axis="y", alpha=0.3)
    ax1.legend(fontsize=8)
    blob = vs["blobSeparation"]
    names = [_size(b["thresholdBytes"]) for b in blob]
    ax2.plot(names, [b["shareOfBytes"] for b in blob], marker="o", color=COLORS["second"],
             label="share of bytes moved")
    ax2.plot(names, [b["shareOfValues"] for b in blob], marker="o", color=COLORS["main"],
             label="share of values moved")
    ax2.set_ylim(0, 1.05)
    ax2.set_title("What blob files would take, by min_blob_size", fontsize=10, loc="left")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _size(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def lsm_window(watermarks: Mapping[int, int], now_ms: int, horizon_ms: int) -> tuple[int, int]:
    """The deliverAt range the SST map shows: from the lowest watermark (a minute before the
    snapshot if later) to ``horizon_ms`` after the snapshot."""
    start = min([now_ms - 60_000, *watermarks.values()])
    return start, now_ms + max(horizon_ms, 60_000)


def lsm_map(ssts: Sequence[Mapping[str, Any]], watermarks: Mapping[int, int], now_ms: int,
            horizon_ms: int, max_panels: int = 4) -> bytes:
    """SST files of each timer shard laid out over deliverAt (x), clipped to the window that
    matters (``lsm_window``: far-future messages would stretch it over years): one row per L0
    file (they overlap), one row per deeper level; shaded by their share of tombstones, with
    the watermark and the snapshot time. What lies outside the window is said per panel."""
    shards = sorted({str(f["cf"]) for f in ssts if str(f["cf"]).startswith("timer.")})
    shards = shards[:max_panels] or ["timer.0"]
    lo, hi = lsm_window(watermarks, now_ms, horizon_ms)
    panels = []
    for cf in shards:
        files = [f for f in ssts if f["cf"] == cf and f["start_time"] is not None]
        l0 = sorted((f for f in files if f["level"] == 0), key=lambda f: -int(f["file_number"]))
        rows = [(f"L0 #{f['file_number']}", [f]) for f in l0]
        deeper = sorted({int(f["level"]) for f in files if f["level"] > 0})
        rows += [(f"L{lv}", [f for f in files if f["level"] == lv]) for lv in deeper]
        panels.append((cf, files, rows))
    heights = [max(len(rows), 1) * 0.38 + 1.1 for _, _, rows in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, sum(heights) + 1.0), squeeze=False,
                             gridspec_kw={"height_ratios": heights}, layout="constrained")
    cmap = plt.get_cmap(LEVEL_CMAP)
    for ax, (cf, files, rows) in zip(axes[:, 0], panels, strict=True):
        beyond = [f for f in files if int(f["end_time"]) > hi]
        before = [f for f in files if int(f["start_time"]) < lo]
        for y, (_, row_files) in enumerate(rows):
            for f in row_files:
                start = max(int(f["start_time"]), lo)
                end = min(int(f["end_time"]), hi)
                if end < start:
                    continue
                share = f["num_deletions"] / f["num_entries"] if f["num_entries"] else 0
                ax.barh(y, _days(max(end - start, 1)), left=_date(start), height=0.7,
                        color=cmap(0.1 + 0.9 * share), edgecolor="#333333", linewidth=0.4)
        shard = int(cf.split(".")[1])
        ax.axvline(_date(now_ms), color=COLORS["ok"], linewidth=1.4, label="snapshot time")
        if shard in watermarks:
            ax.axvline(_date(watermarks[shard]), color=COLORS["bad"], linestyle="--",
                       linewidth=1.4, label="watermark")
        ax.set_xlim(_date(lo), _date(hi))
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([label for label, _ in rows], fontsize=7)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        left_out = []
        if beyond:
            last = max(int(f["end_time"]) for f in beyond)
            left_out.append(f"{len(beyond)} file(s) reach past the window, up to {utc_label(last)}")
        if before:
            left_out.append(f"{len(before)} start before it")
        gap = now_ms - watermarks.get(shard, now_ms)
        ax.set_title(f"{cf}: {len(files)} SST files (colour = share of tombstones); watermark "
                     f"{gap / 1000:,.1f} s before the snapshot time"
                     + (f"\nclipped: {'; '.join(left_out)}" if left_out else ""),
                     fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(maxticks=7))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d\n%H:%M:%S"))
    scale = matplotlib.cm.ScalarMappable(cmap=cmap, norm=matplotlib.colors.Normalize(0, 1))
    fig.colorbar(scale, ax=list(axes[:, 0]), fraction=0.025, label="tombstones / entries")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper right", fontsize=8, ncols=2)
    axes[-1, 0].set_xlabel(f"deliverAt (UTC), {utc_label(lo)} to {utc_label(hi)}", fontsize=8)
    return _png(fig)


def _date(ms: int) -> float:
    """Epoch ms as a matplotlib date number (days)."""
    return float(mdates.date2num(datetime.fromtimestamp(ms / 1000, UTC)))


def _days(ms: int) -> float:
    return ms / 86_400_000


def levels(sst: Mapping[str, Any]) -> bytes:
    """Bytes and tombstones per level."""
    present = {r["level"]: r for r in sst["byLevel"]}
    rows = [present.get(lv, {"level": lv, "bytes": 0, "deletions": 0})
            for lv in range(max([6, *present]) + 1)]  # every level, so the shape reads
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
    names = [f"L{r['level']}" for r in rows]
    ax1.bar(names, [r["bytes"] / (1 << 20) for r in rows], color=COLORS["main"])
    ax1.set_title("SST MiB per level", fontsize=10, loc="left")
    ax2.bar(names, [r["deletions"] for r in rows], color=COLORS["bad"])
    ax2.set_title("Tombstones per level", fontsize=10, loc="left")
    for ax in (ax1, ax2):
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    return _png(fig)


def topics(tp: Mapping[str, Any], top: int = 12) -> bytes:
    """Waiting messages and their value bytes per topic, side by side."""
    rows = tp["top"][:top][::-1]
    names = [r["topic"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 0.32 * max(len(rows), 3) + 1.0),
                                   sharey=True)
    ax1.barh(names, [r["messages"] for r in rows], color=COLORS["main"])
    for i, r in enumerate(rows):
        ax1.text(r["messages"], i, f" {r['share']:.1%}", va="center", fontsize=8)
    total_b = sum(r["bytes"] for r in tp["top"]) or 1
    ax2.barh(names, [r["bytes"] / (1 << 20) for r in rows], color=COLORS["second"])
    for i, r in enumerate(rows):
        ax2.text(r["bytes"] / (1 << 20), i, f" {r['bytes'] / total_b:.1%}", va="center",
                 fontsize=8)
    ax1.set_title(f"Waiting messages per topic (top {len(rows)} of {tp['count']}, "
                  f"Gini {tp['gini']:.2f})", fontsize=10, loc="left")
    ax2.set_title("Their value MiB", fontsize=10, loc="left")
    for ax in (ax1, ax2):
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def trends(series: Mapping[str, Any], created: Sequence[int]) -> bytes:
    """Small multiples of the trend metrics, plus write amplification per interval."""
    names = [n for n, t in series["trends"].items() if any(v is not None for v in t["values"])]
    cols = 3
    panels = len(names) + 1
    rows = (panels + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.4 * rows), squeeze=False)
    xs = [(t - created[0]) / 60_000 for t in created]
    flat = list(axes.flat)
    for ax, name in zip(flat, names, strict=False):
        values = series["trends"][name]["values"]
        ax.plot(xs, [float("nan") if v is None else v for v in values], marker="o",
                color=COLORS["main"])
        ax.set_title(name, fontsize=9, loc="left")
    wa_ax = flat[len(names)]
    wa = [i.get("writeAmplification") for i in series["intervals"]]
    wa_ax.bar(range(1, len(wa) + 1), [w or 0 for w in wa], color=COLORS["second"])
    for x, w in enumerate(wa, 1):
        if w is None:
            wa_ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7)
    wa_ax.set_xticks(range(1, len(wa) + 1))
    wa_ax.set_xlabel("interval" + (" (n/a: no statistics)" if None in wa else ""), fontsize=7)
    wa_ax.set_title("write amplification per interval", fontsize=9, loc="left")
    for ax in flat[: len(names)]:
        ax.set_xlabel("minutes since first snapshot", fontsize=7)
    for ax in flat:
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in flat[panels:]:
        ax.axis("off")
    fig.tight_layout()
    return _png(fig)
