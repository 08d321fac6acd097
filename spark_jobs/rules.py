"""Plain-language recommendations: each a rule over the figures, with its threshold.

Rules read the latest snapshot's report (and the series, for the trend rules). Every rule is
evaluated and reported, fired or not, so a reader sees which checks passed. Each says, as
sentences with units: what it measured, the threshold and where that figure comes from, a
what-if showing the advice would help (or why none would), and the advice. The thresholds
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
    # name                               default     unit / meaning (source: docs/analysis.md)
    due_scan_skipped_keys: int = 10_000  #         internal keys one due scan skips (tombstones)
    due_scan_range_tombstones: int = 1_000  #      range tombstones in the levels a scan touches
    due_scan_ssts: int = 8  #                      SST files a due scan meets (one shard)
    dead_prefix_share: float = 0.2  #              dead-prefix bytes / all SST bytes
    space_amplification: float = 2.0  #            SST bytes / live bytes estimate
    write_amplification: float = 12.0  #           bytes written by RocksDB / by the app
    blob_bytes_share: float = 0.5  #               share of value bytes a threshold must move
    blob_values_share: float = 0.2  #              ... while moving at most this share of values
    blob_compaction_rewrites: float = 1.0  #       compaction bytes written / bytes ingested
    delivery_rate: int = 50_000  #                 msgs/s the delivery stage sustains
    overdue_age_ms: int = 5_000  #                 ms the oldest due-but-undelivered waits
    pending_compaction_bytes: int = 1024 * MIB  #  bytes of compaction debt in one CF
    write_stalls: int = 0  #                       write stalls (delays + stops) since open
    hot_topic_to_mean: float = 2.0  #              a topic's messages / the mean topic's
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
    value: float | int | None  # the figure tested, in ``unit``
    unit: str
    threshold: float | int
    measured: str  # the figure as a sentence with units
    basis: str  # the threshold and where it comes from
    what_if: str  # what the advice would change (or why nothing would)
    advice: str

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["whatIf"] = out.pop("what_if")
        return out


def _utc(ms: int | None) -> str:
    if ms is None:
        return "n/a"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _bytes(n: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def _ms(micros: int) -> str:
    return f"{micros / 1000:.1f} ms"


Rule = Callable[[Mapping[str, Any], Mapping[str, Any], Thresholds], Finding]


def _worst_shard(ra: Mapping[str, Any], name: str) -> tuple[str, Mapping[str, Any]] | None:
    rows = [(s, v) for s, v in ra["byShard"].items() if v.get(name) is not None]
    return max(rows, key=lambda sv: sv[1][name]) if rows else None


def _not_measured(rule: str, title: str, unit: str, threshold: int, why: str) -> Finding:
    return Finding(rule=rule, title=title, fired=False, value=None, unit=unit,
                   threshold=threshold, measured=f"Not measured: {why}.", basis="", what_if="",
                   advice="")


def due_scan_tombstones(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    ra = r["physical"]["readAmplification"]
    rule, title = "due-scan-tombstones", "Point tombstones the due scan steps over"
    worst = _worst_shard(ra, "internalKeysSkipped")
    if worst is None:
        return _not_measured(rule, title, "internal keys", t.due_scan_skipped_keys,
                             "the due scan runs on a snapshot, not on a Parquet export taken "
                             "with another --window-ms")
    shard, v = worst
    skipped, from_start = v["internalKeysSkipped"], v["fromStart"]["internalKeysSkipped"]
    return Finding(
        rule=rule, title=title, fired=skipped > t.due_scan_skipped_keys, value=skipped,
        unit="internal keys", threshold=t.due_scan_skipped_keys,
        measured=f"The due scan of timer shard {shard} (from its watermark "
                 f"{_utc(v['watermark'])} to the snapshot time + {ra['windowMs']:,} ms), run on "
                 f"the snapshot, skipped {skipped:,} internal keys (point tombstones and the "
                 f"versions they hide) to return {v['liveKeys']:,} live keys, in "
                 f"{_ms(v['scanMicros'])}.",
        basis=f"More than {t.due_scan_skipped_keys:,} skipped keys per scan: a seek past 900 k "
              "tombstones took ~300 ms here (~0.33 us each, docs/analysis.md), so "
              f"{t.due_scan_skipped_keys:,} add ~{t.due_scan_skipped_keys * 0.33 / 1000:.1f} ms "
              "to every scan of that shard.",
        what_if=f"The same scan from key 0 (no watermark) skips {from_start:,}: the watermark "
                f"already saves {max(from_start - skipped, 0):,}. Clean-up below the watermark "
                "cannot remove the ones inside the window.",
        advice=f"{skipped:,} tombstones lie inside the due window itself: messages cancelled "
               "shortly before they were due, not the delivered prefix. They go when compaction "
               "rewrites their files: lower the timer CFs' deletion-triggered compaction "
               "(storage/rocks_options.py deletion_trigger) or compact_range the window "
               "[watermark, now + window).")


def due_scan_range_tombstones(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    ra = r["physical"]["readAmplification"]
    rule, title = "due-scan-range-tombstones", "Range tombstones where the due scan reads"
    worst = _worst_shard(ra, "rangeTombstones")
    if worst is None:
        return _not_measured(rule, title, "range tombstones", t.due_scan_range_tombstones,
                             "the levels' table properties are read from the snapshot")
    shard, v = worst
    n = v["rangeTombstones"]
    levels = ", ".join(f"L{lv}" for lv in v["byLevel"]) or "none"
    return Finding(
        rule=rule, title=title, fired=n > t.due_scan_range_tombstones, value=n,
        unit="range tombstones", threshold=t.due_scan_range_tombstones,
        measured=f"The levels the due scan of timer shard {shard} reads ({levels}) hold {n:,} "
                 "range tombstones (RocksDB's table properties per level: an upper bound for "
                 "the files the scan opens).",
        basis=f"More than {t.due_scan_range_tombstones:,}: 1 000 range tombstones made each new "
              "iterator ~0.15 ms slower here, linearly in their number (docs/analysis.md).",
        what_if="One delete_range per periodic clean-up below the watermark instead of one per "
                "delivery commit leaves one range tombstone per clean-up period; compaction "
                "drops them once they reach the last level.",
        advice=f"{n:,} range tombstones sit where the due scan reads: issue delete_range rarely "
               "(a periodic clean-up below the persisted watermark), or compact that range.")


def due_scan_ssts(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    ra = r["physical"]["readAmplification"]
    worst = _worst_shard(ra, "ssts")
    empty: Mapping[str, Any] = {"ssts": 0, "byLevel": {}, "fromStart": {"ssts": 0}}
    shard, v = worst if worst else ("-", empty)
    n = v["ssts"]
    levels = ", ".join(f"L{lv}: {c}" for lv, c in v["byLevel"].items()) or "no files"
    return Finding(
        rule="due-scan-read-amplification", title="SST files read by one due scan",
        fired=n > t.due_scan_ssts, value=n, unit="SST files", threshold=t.due_scan_ssts,
        measured=f"The due window of timer shard {shard} overlaps {n} SST files ({levels}).",
        basis=f"More than {t.due_scan_ssts}: RocksDB compacts L0 once it holds 4 files "
              "(level0_file_num_compaction_trigger), so twice that means compaction is behind.",
        what_if=f"From key 0 the scan would overlap {v['fromStart']['ssts']} files; once L0 is "
                "compacted each deeper level adds one file to the scan.",
        advice=f"A due scan consults {n} SST files: L0 files are piling up. Let compaction "
               "catch up (more background jobs, a lower level0_file_num_compaction_trigger) "
               "before raising the send rate.")


def dead_prefix(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    dead = r["physical"]["tombstones"]["deadPrefixBytes"]
    total = r["physical"]["sst"]["bytes"]
    share = dead / total if total else 0.0
    return Finding(
        rule="dead-prefix", title="SST bytes wholly below the scan watermark",
        fired=share > t.dead_prefix_share and total >= t.min_sst_bytes,
        value=round(share, 4), unit="share of SST bytes", threshold=t.dead_prefix_share,
        measured=f"{_bytes(dead)} of {_bytes(total)} SST bytes ({share:.0%}) are in files whose "
                 "keys all lie below their shard's watermark: delivered or cancelled messages.",
        basis=f"More than {t.dead_prefix_share:.0%} of the SST bytes (and at least "
              f"{_bytes(t.min_sst_bytes)} in all): below that the disk to win is small.",
        what_if=f"cleanup_prefix (delete_range + compact_range below the watermark) gives back "
                f"about {_bytes(dead)}.",
        advice=f"{_bytes(dead)} of SST hold only keys below the watermark: run the prefix "
               "clean-up (cleanup_prefix) more often.")


def space_amplification(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    sp = r["physical"]["space"]
    v = sp["spaceAmplification"] or 0.0
    return Finding(
        rule="space-amplification", title="Disk used per live byte",
        fired=v > t.space_amplification and sp["sstBytes"] >= t.min_sst_bytes,
        value=round(v, 3), unit="x", threshold=t.space_amplification,
        measured=f"The SSTs take {_bytes(sp['sstBytes'])}, {v:.2f}x the "
                 f"{_bytes(sp['liveBytesEstimate'])} estimated for the live keys.",
        basis=f"More than {t.space_amplification:g}x (and at least "
              f"{_bytes(t.min_sst_bytes)}): leveled compaction keeps about 1.1x when it is up "
              "to date.",
        what_if=f"Compacting down to the live data would give back about "
                f"{_bytes(sp['reclaimableBytes'])}.",
        advice=f"{_bytes(sp['reclaimableBytes'])} are tombstones and dead versions waiting for "
               "compaction: compact the delivered prefix and check the compaction debt.")


def _counters(r: Mapping[str, Any], intervals: Sequence[Mapping[str, Any]]
              ) -> tuple[dict[str, int], str]:
    """The latest interval's ticker deltas, else the counters since the DB was opened."""
    if intervals and intervals[-1].get("deltas"):
        return dict(intervals[-1]["deltas"]), "between the last two snapshots"
    return dict(r["physical"]["rocksdb"]["counters"]), "since the DB was opened"


def write_amplification(r: Mapping[str, Any], series: Mapping[str, Any],
                        t: Thresholds) -> Finding:
    counters, when = _counters(r, series.get("intervals", []))
    ingested = counters.get("bytesWritten", 0)
    written = counters.get("flushWriteBytes", 0) + counters.get("compactWriteBytes", 0)
    v = written / ingested if ingested else None
    large = _blob_choice(r, t)
    return Finding(
        rule="write-amplification", title="Bytes RocksDB writes per byte ingested",
        fired=v is not None and v > t.write_amplification,
        value=None if v is None else round(v, 3), unit="x", threshold=t.write_amplification,
        measured="No RocksDB statistics in the manifest." if v is None else
        f"RocksDB wrote {_bytes(written)} (flush + compaction) for {_bytes(ingested)} "
        f"ingested {when}: {v:.2f}x.",
        basis=f"More than {t.write_amplification:g}x: leveled compaction typically writes "
              "10-30x; below that flush and compaction keep up cheaply.",
        what_if="Blob files would spare compaction the large values (see blob-separation)."
        if large else "Values are small: blob files would not help; fewer, larger flushes and "
                      "universal compaction lower the rewrites.",
        advice=f"RocksDB writes {v or 0:.1f} bytes per byte ingested: "
               + ("enable blob files for the large values (blob-separation)." if large else
                  "raise the timer CFs' write_buffer_size, or use universal compaction for "
                  "them."))


def _blob_choice(r: Mapping[str, Any], t: Thresholds) -> Mapping[str, Any] | None:
    fits = [b for b in r["logical"]["valueSizes"]["blobSeparation"]
            if b["shareOfBytes"] >= t.blob_bytes_share
            and b["shareOfValues"] <= t.blob_values_share]
    return max(fits, key=lambda b: b["thresholdBytes"]) if fits else None


def blob_separation(r: Mapping[str, Any], series: Mapping[str, Any], t: Thresholds) -> Finding:
    best = _blob_choice(r, t)
    counters, when = _counters(r, series.get("intervals", []))
    ingested = counters.get("bytesWritten", 0)
    compacted = counters.get("compactWriteBytes", 0)
    rewrites = compacted / ingested if ingested else 0.0
    raw = sum(c["keyBytes"] + c["valueBytes"] for c in r["logical"]["counts"]["byCf"].values())
    moved = best["bytesMoved"] if best else 0
    saved = compacted * moved / raw if raw else 0.0
    sizes = ("no min_blob_size moves most value bytes with few values" if best is None else
             f"values of {best['thresholdBytes']:,} B or more are "
             f"{best['shareOfValues']:.0%} of the waiting messages and "
             f"{best['shareOfBytes']:.0%} of their value bytes")
    return Finding(
        rule="blob-separation", title="Compaction rewriting large values",
        fired=best is not None and rewrites > t.blob_compaction_rewrites,
        value=round(rewrites, 3), unit="compaction bytes per byte ingested",
        threshold=t.blob_compaction_rewrites,
        measured=f"Compaction wrote {_bytes(compacted)} for {_bytes(ingested)} ingested {when} "
                 f"({rewrites:.2f}x); {sizes}.",
        basis=f"Compaction rewrites more than {t.blob_compaction_rewrites:g}x what is ingested, "
              f"and a min_blob_size moves at least {t.blob_bytes_share:.0%} of the value bytes "
              f"with at most {t.blob_values_share:.0%} of the values: below one rewrite, blob "
              "files cost about what they save (each large value is still written once more "
              "to a blob file, and garbage collection rewrites the live ones).",
        what_if="" if best is None else
        f"With min_blob_size={best['thresholdBytes']}, compaction would not have rewritten "
        f"about {_bytes(saved)} {when} (its {_bytes(compacted)} x the large values' "
        f"{moved / raw if raw else 0:.0%} of all key and value bytes).",
        advice="" if best is None else
        f"Enable blob files on the timer CFs with min_blob_size={best['thresholdBytes']} and "
        "enable_blob_garbage_collection. Costs: a due message's body is one more file read; a "
        "blob file stays on disk until every message in it is delivered or garbage collection "
        "(blob_garbage_collection_age_cutoff, 0.25 by default) relocates the rest, so bodies "
        "of delivered messages hold disk meanwhile and their GC rewrites count as writes.")


def burst(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    peak = r["logical"]["dueLoad"]["peakSecond"] or {"messages": 0, "at": None}
    v = peak["messages"]
    spread = -(-v // t.delivery_rate) if t.delivery_rate else 0
    return Finding(
        rule="burst", title="Messages due in the busiest second",
        fired=v > t.delivery_rate, value=v, unit="messages in one second",
        threshold=t.delivery_rate,
        measured=f"{v:,} messages fall due in the busiest second "
                 f"({_utc(peak['at'])})." if v else "No message is due ahead.",
        basis=f"More than {t.delivery_rate:,} msgs/s, a delivery rate below what the engine "
              "drains on 2 cores (README: 205-269 k msgs/s) to leave room for consumers.",
        what_if=f"At {t.delivery_rate:,} msgs/s the last leaves about "
                f"{v / t.delivery_rate:.1f} s late; spread over {spread} s it leaves on time.",
        advice=f"Spread the producers' deliverAt of that second over at least {spread} s "
               "(jitter), or raise delivery batch sizes.")


def overdue(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    od = r["logical"]["dueLoad"]["overdue"]
    v = od["oldestAgeMs"] or 0
    return Finding(
        rule="overdue", title="Due messages not delivered at snapshot time",
        fired=v > t.overdue_age_ms, value=v, unit="ms", threshold=t.overdue_age_ms,
        measured=f"{od['messages']:,} waiting messages were already due; the oldest by "
                 f"{v / 1000:.1f} s.",
        basis=f"Older than {t.overdue_age_ms / 1000:g} s: a healthy engine delivers within "
              "milliseconds of deliverAt.",
        what_if="",
        advice="Delivery is behind: check /readyz, delivery retries and the CommitLog disk.")


def compaction_debt(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    v = r["physical"]["rocksdb"]["pendingCompactionBytesMax"]
    return Finding(
        rule="compaction-debt", title="Pending compaction bytes",
        fired=v > t.pending_compaction_bytes, value=v, unit="bytes",
        threshold=t.pending_compaction_bytes,
        measured=f"The column family furthest behind owes {_bytes(v)} of compaction.",
        basis=f"More than {_bytes(t.pending_compaction_bytes)}: an early warning, well before "
              "RocksDB slows writes (soft_pending_compaction_bytes_limit, 64 GiB by default).",
        what_if="",
        advice="Give compaction more background jobs or lower the write rate.")


def write_stalls(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    rocks = r["physical"]["rocksdb"]
    v = rocks["writeStallsTotal"]
    micros = rocks["counters"].get("stallMicros", 0)
    return Finding(
        rule="write-stalls", title="Write stalls since the DB was opened",
        fired=v > t.write_stalls, value=v, unit="stalls", threshold=t.write_stalls,
        measured=f"RocksDB delayed or stopped writes {v:,} times ({micros / 1e6:.1f} s in all).",
        basis="Any stall: each one delays acknowledged sends.",
        what_if="",
        advice="Memtables or L0 filled faster than flush and compaction drained them: more "
               "background jobs, larger memtables, or a lower send rate.")


def _hot_topics(r: Mapping[str, Any], t: Thresholds) -> list[Mapping[str, Any]]:
    tp = r["logical"]["topics"]
    mean = tp.get("meanMessages") or 0.0
    if tp["count"] < 2 or tp.get("messages", 0) < t.min_messages:
        return []
    return [x for x in tp["top"] if x["messages"] > t.hot_topic_to_mean * mean]


def topic_skew(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    tp = r["logical"]["topics"]
    hot = _hot_topics(r, t)
    top = tp["top"][0] if tp["top"] else None
    v = tp["maxToMean"]
    names = ", ".join(f"{x['topic']!r} ({x['share']:.0%}, "
                      f"{x['messages'] / tp['meanMessages']:.1f}x)" for x in hot)
    return Finding(
        rule="topic-skew", title="Hot topics", fired=bool(hot), value=round(v, 3),
        unit="x the mean topic", threshold=t.hot_topic_to_mean,
        measured="No waiting messages." if top is None else
        f"The biggest topic, {top['topic']!r}, holds {top['share']:.0%} of the "
        f"{tp['messages']:,} waiting messages, {v:.1f}x the mean of {tp['count']:,} topics.",
        basis=f"A topic above {t.hot_topic_to_mean:g}x the mean topic (with at least 2 topics "
              f"and {t.min_messages:,} messages) is hot.",
        what_if="A topic lives whole in one timer shard: however many shards there are, one "
                "scanner hands its messages on (see shard-imbalance).",
        advice=f"Hot topics: {names}. Their producers shape the due profile and load one "
               "shard each: spread their deliverAt, or split a hot topic into several "
               "(e.g. by key) so that placement can spread it." if hot else "")


def shard_imbalance(r: Mapping[str, Any], _s: Any, t: Thresholds) -> Finding:
    sh = r["logical"]["shards"]
    rows = sh["rows"]
    total = sum(x["messages"] for x in rows)
    v = sh["maxToMean"]
    what_if = r["logical"]["topics"].get("shardWhatIf", [])
    current = next((w for w in what_if if w["current"]), None)
    better = [w for w in what_if if not w["current"] and w["maxToMean"] <= t.shard_imbalance
              and current is not None
              and w["busiestShardMessages"] < current["busiestShardMessages"]]
    top = r["logical"]["topics"]["top"][0] if r["logical"]["topics"]["top"] else None
    table = ", ".join(f"{w['shards']}: {w['maxToMean']:.1f}x" for w in what_if)
    if better:
        pick = min(better, key=lambda w: w["shards"])
        advice = (f"Set timer_shards = {pick['shards']}: busiest shard "
                  f"{pick['busiestShardMessages']:,} messages ({pick['maxToMean']:.1f}x the "
                  f"mean) instead of {current['busiestShardMessages']:,} ({v:.1f}x)."
                  if current else "")
    elif top is not None:
        advice = (f"No timer shard count up to {max((w['shards'] for w in what_if), default=0)} "
                  f"brings the busiest shard under {t.shard_imbalance:g}x the mean: topic "
                  f"{top['topic']!r} alone holds {top['share']:.0%} of the messages and lives "
                  "whole in one shard, so more shards only add idle ones. Split that topic "
                  "(several topics, e.g. by key) or spread its producers' load.")
    else:
        advice = ""
    return Finding(
        rule="shard-imbalance", title="Busiest timer shard against the mean",
        fired=v > t.shard_imbalance and len(rows) >= 2 and total >= t.min_messages,
        value=round(v, 3), unit="x the mean shard", threshold=t.shard_imbalance,
        measured=f"The busiest of {len(rows)} timer shards holds {v:.2f}x the mean "
                 f"({max((x['messages'] for x in rows), default=0):,} of {total:,} waiting "
                 "messages).",
        basis=f"More than {t.shard_imbalance:g}x (with at least 2 shards and "
              f"{t.min_messages:,} messages): one scanner then does most of the work.",
        what_if=f"Busiest shard / mean with the engine's placement (crc32(topic) % shards) "
                f"for each shard count: {table}." if table else "",
        advice=advice)


def tombstone_growth(_r: Mapping[str, Any], series: Mapping[str, Any],
                     t: Thresholds) -> Finding:
    tomb = series.get("trends", {}).get("tombstones", {})
    v = tomb.get("ratio")
    values = tomb.get("values") or []
    return Finding(
        rule="tombstone-growth", title="Tombstones growing across the series",
        fired=bool(tomb.get("risingEveryInterval")) and v is not None and v >= t.tombstone_growth,
        value=None if v is None else round(v, 3), unit="x first snapshot",
        threshold=t.tombstone_growth,
        measured="One snapshot: no series." if not values else
        f"Tombstones in the SSTs went {' -> '.join(f'{int(x or 0):,}' for x in values)} "
        f"across {len(values)} snapshots ({v or 0:.1f}x).",
        basis=f"Rising in every interval and at least {t.tombstone_growth:g}x from first to "
              "last: clean-up and compaction are not keeping up.",
        what_if="",
        advice="Prefix clean-up is not keeping up with deliveries: run it more often.")


SNAPSHOT_RULES: tuple[Rule, ...] = (
    due_scan_tombstones, due_scan_range_tombstones, due_scan_ssts, dead_prefix,
    space_amplification, blob_separation, write_amplification, burst, overdue,
    compaction_debt, write_stalls, topic_skew, shard_imbalance, tombstone_growth,
)


def evaluate(latest: Mapping[str, Any], series: Mapping[str, Any],
             thresholds: Thresholds) -> list[Finding]:
    """Every rule on the latest snapshot (and the series), in a stable order."""
    return [rule(latest, series, thresholds) for rule in SNAPSHOT_RULES]
