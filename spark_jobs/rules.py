"""Plain-language recommendations: each a rule over the figures, with its threshold.

Rules read the latest snapshot's report (and the series, for the trend rules). Every rule is
evaluated and reported, fired or not, so a reader sees which checks passed. The thresholds
are in one table below; ``hourglass analyze --threshold NAME=VALUE`` overrides any of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    # name                               default     unit / meaning
    due_scan_tombstones: int = 10_000  #           tombstones in the SSTs a due scan meets
    due_scan_ssts: int = 8  #                      SST files a due scan meets (one shard)
    dead_prefix_share: float = 0.2  #              dead-prefix bytes / all SST bytes
    space_amplification: float = 2.0  #            SST bytes / live bytes estimate
    write_amplification: float = 12.0  #           bytes written by RocksDB / by the app
    blob_bytes_share: float = 0.5  #               share of value bytes a threshold must move
    blob_values_share: float = 0.2  #              ... while moving at most this share of values
    delivery_rate: int = 50_000  #                 msgs/s the delivery stage sustains
    overdue_age_ms: int = 5_000  #                 ms the oldest due-but-undelivered waits
    pending_compaction_bytes: int = 1024 * MIB  #  bytes of compaction debt in one CF
    write_stalls: int = 0  #                       write stalls (delays + stops) since open
    topic_share: float = 0.8  #                    share of waiting messages in one topic
    shard_imbalance: float = 1.5  #                busiest shard / mean shard (messages)
    tombstone_growth: float = 2.0  #               last / first tombstone count of a series
    min_sst_bytes: int = 16 * MIB  #               size below which space rules stay silent
    min_messages: int = 1_000  #                   messages below which skew rules stay silent

    def with_overrides(self, overrides: Mapping[str, str]) -> Thresholds:
        """A copy with NAME=VALUE strings applied; ValueError names a bad one."""
        types = {f.name: f.type for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for name, raw in overrides.items():
            if name not in types:
                raise ValueError(f"unknown threshold {name!r}; known: {', '.join(types)}")
            try:
                changes[name] = float(raw) if types[name] in (float, "float") else int(raw)
            except ValueError:
                raise ValueError(f"threshold {name} needs a number, not {raw!r}") from None
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class Finding:
    rule: str
    title: str
    fired: bool
    value: Any
    threshold: Any
    advice: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _utc(ms: int | None) -> str:
    if ms is None:
        return "n/a"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / MIB:.1f} MiB"


Rule = Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]], Thresholds], Finding]


def due_scan_tombstones(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    v = r["physical"]["readAmplification"]["tombstonesMax"]
    return Finding(
        rule="due-scan-tombstones", title="Tombstones in the path of the due scan",
        fired=v > t.due_scan_tombstones, value=v, threshold=t.due_scan_tombstones,
        advice=f"A due scan meets up to {v:,} tombstones in the SSTs overlapping its window. "
               "Clean the delivered prefix more often (cleanup_prefix: delete_range + "
               "compact_range) or lower the deletion-collector trigger of the timer CFs.")


def due_scan_ssts(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    v = r["physical"]["readAmplification"]["max"]
    return Finding(
        rule="due-scan-read-amplification", title="SST files read by one due scan",
        fired=v > t.due_scan_ssts, value=v, threshold=t.due_scan_ssts,
        advice=f"A due scan consults up to {v} SST files. L0 files are piling up or the "
               "window spans many files: let compaction catch up (more background jobs, a "
               "lower level0_file_num_compaction_trigger) before raising the send rate.")


def dead_prefix(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    dead = r["physical"]["tombstones"]["deadPrefixBytes"]
    total = r["physical"]["sst"]["bytes"]
    share = dead / total if total else 0.0
    return Finding(
        rule="dead-prefix", title="SST bytes wholly below the scan watermark",
        fired=share > t.dead_prefix_share and total >= t.min_sst_bytes,
        value=round(share, 4), threshold=t.dead_prefix_share,
        advice=f"{_gib(dead)} ({share:.0%}) of the SST bytes hold only delivered or cancelled "
               "keys below the watermark. Compact that prefix (cleanup_prefix) to reclaim it.")


def space_amplification(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    sp = r["physical"]["space"]
    v = sp["spaceAmplification"] or 0.0
    return Finding(
        rule="space-amplification", title="Disk used per live byte",
        fired=v > t.space_amplification and sp["sstBytes"] >= t.min_sst_bytes,
        value=round(v, 3), threshold=t.space_amplification,
        advice=f"The SSTs take {v:.1f}x the estimated live data ({_gib(sp['reclaimableBytes'])} "
               "reclaimable). Tombstones and overwritten values wait for compaction: compact "
               "the delivered prefix, and check for pending compaction debt.")


def write_amplification(r: Mapping[str, Any], intervals: Sequence[Mapping[str, Any]],
                        t: Thresholds) -> Finding:
    measured = [i["writeAmplification"] for i in intervals if i.get("writeAmplification")]
    v = measured[-1] if measured else r["physical"]["rocksdb"]["writeAmplificationSinceOpen"]
    return Finding(
        rule="write-amplification", title="Bytes RocksDB writes per byte ingested",
        fired=v is not None and v > t.write_amplification,
        value=None if v is None else round(v, 3), threshold=t.write_amplification,
        advice=f"RocksDB writes {v or 0:.1f} bytes per byte ingested. Large values are "
               "rewritten by every compaction: enable blob files for them, or use larger "
               "memtables / universal compaction for the timer CFs.")


def blob_separation(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    fits = [b for b in r["logical"]["valueSizes"]["blobSeparation"]
            if b["shareOfBytes"] >= t.blob_bytes_share
            and b["shareOfValues"] <= t.blob_values_share]
    best = max(fits, key=lambda b: b["thresholdBytes"]) if fits else None
    return Finding(
        rule="blob-separation", title="Large values worth moving to blob files",
        fired=best is not None,
        value=None if best is None else {k: best[k] for k in
                                         ("thresholdBytes", "shareOfBytes", "shareOfValues")},
        threshold={"bytesShare": t.blob_bytes_share, "valuesShare": t.blob_values_share},
        advice="" if best is None else
        f"Values of {best['thresholdBytes']:,} bytes or more are {best['shareOfValues']:.0%} "
        f"of the messages but {best['shareOfBytes']:.0%} of the bytes. Enable blob files on "
        f"the timer CFs with min_blob_size={best['thresholdBytes']}: compaction then moves "
        "keys and small values only.")


def burst(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    peak = r["logical"]["dueLoad"]["peakSecond"] or {"messages": 0, "at": None}
    v = peak["messages"]
    return Finding(
        rule="burst", title="Messages due in the busiest second",
        fired=v > t.delivery_rate, value=v, threshold=t.delivery_rate,
        advice=f"{v:,} messages fall due in one second (at {_utc(peak['at'])}); at "
               f"{t.delivery_rate:,} msgs/s the last leaves about {v / t.delivery_rate:.1f} s "
               "late. Spread producers' deliverAt (jitter) or raise delivery batch sizes.")


def overdue(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    od = r["logical"]["dueLoad"]["overdue"]
    v = od["oldestAgeMs"] or 0
    return Finding(
        rule="overdue", title="Due messages not delivered at snapshot time",
        fired=v > t.overdue_age_ms, value=v, threshold=t.overdue_age_ms,
        advice=f"{od['messages']:,} messages were due but not delivered; the oldest by "
               f"{v / 1000:.1f} s. Delivery is behind: check /readyz, delivery retries and "
               "the CommitLog disk.")


def compaction_debt(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    v = r["physical"]["rocksdb"]["pendingCompactionBytesMax"]
    return Finding(
        rule="compaction-debt", title="Pending compaction bytes",
        fired=v > t.pending_compaction_bytes, value=v, threshold=t.pending_compaction_bytes,
        advice=f"A column family owes {_gib(v)} of compaction; RocksDB slows writes when it "
               "grows further. Give compaction more background jobs or lower the write rate.")


def write_stalls(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    rocks = r["physical"]["rocksdb"]
    v = rocks["writeStallsTotal"]
    micros = rocks["counters"].get("stallMicros", 0)
    return Finding(
        rule="write-stalls", title="Write stalls since the DB was opened",
        fired=v > t.write_stalls, value=v, threshold=t.write_stalls,
        advice=f"RocksDB delayed or stopped writes {v:,} times ({micros / 1e6:.1f} s in all): "
               "memtables or L0 filled faster than flush and compaction drained them.")


def topic_skew(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    tp = r["logical"]["topics"]
    total = sum(x["messages"] for x in r["logical"]["shards"]["rows"])
    v = tp["topShare"]
    name = tp["top"][0]["topic"] if tp["top"] else None
    return Finding(
        rule="topic-skew", title="Share of waiting messages in the biggest topic",
        fired=v > t.topic_share and tp["count"] >= 2 and total >= t.min_messages,
        value=round(v, 4), threshold=t.topic_share,
        advice=f"Topic {name!r} holds {v:.0%} of the waiting messages: its bursts are the due "
               "profile. Give it a per-topic quota, or check its producers' deliverAt spread.")


def shard_imbalance(r: Mapping[str, Any], _i: Any, t: Thresholds) -> Finding:
    sh = r["logical"]["shards"]
    total = sum(x["messages"] for x in sh["rows"])
    v = sh["maxToMean"]
    return Finding(
        rule="shard-imbalance", title="Busiest timer shard against the mean",
        fired=v > t.shard_imbalance and len(sh["rows"]) >= 2 and total >= t.min_messages,
        value=round(v, 4), threshold=t.shard_imbalance,
        advice=f"One timer shard holds {v:.2f}x the mean: its scanner does most of the work. "
               "A topic lives whole in one shard (crc32(topic) % timer_shards, which keeps "
               "each topic in deliver-time order), so the busiest topics share this one: "
               "raise timer_shards, or split a hot topic.")


def tombstone_growth(_r: Mapping[str, Any], trend: Mapping[str, Any], t: Thresholds) -> Finding:
    tomb = trend.get("tombstones", {})
    v = tomb.get("ratio")
    return Finding(
        rule="tombstone-growth", title="Tombstones growing across the series",
        fired=bool(tomb.get("risingEveryInterval")) and v is not None and v >= t.tombstone_growth,
        value=None if v is None else round(v, 3), threshold=t.tombstone_growth,
        advice=f"Tombstones rose in every interval, {v or 0:.1f}x from first to last snapshot: "
               "prefix clean-up is not keeping up with deliveries.")


SNAPSHOT_RULES: tuple[Rule, ...] = (
    due_scan_tombstones, due_scan_ssts, dead_prefix, space_amplification, blob_separation,
    burst, overdue, compaction_debt, write_stalls, topic_skew, shard_imbalance,
)


def evaluate(latest: Mapping[str, Any], series: Mapping[str, Any],
             thresholds: Thresholds) -> list[Finding]:
    """Every rule on the latest snapshot (and the series), in a stable order."""
    findings = [rule(latest, (), thresholds) for rule in SNAPSHOT_RULES]
    findings.append(write_amplification(latest, series.get("intervals", []), thresholds))
    findings.append(tombstone_growth(latest, series.get("trends", {}), thresholds))
    return findings
