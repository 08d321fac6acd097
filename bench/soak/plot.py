"""The soak's PNG: memory (RSS, RssAnon, RocksDB's share, the rest), lateness and rates."""

from __future__ import annotations

from pathlib import Path

from bench.soak.harness import SoakReport


def plot(report: SoakReport, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t_s for s in report.samples]
    fig, (mem, late, rate, disk) = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    mem.plot(t, [s.rss_mib for s in report.samples], label="RSS (with mapped CommitLog pages)")
    mem.plot(t, [s.anon_mib for s in report.samples], label="RssAnon (heap, memtables, cache)")
    if all(s.rocksdb_mib is not None for s in report.samples):
        mem.plot(t, [s.rocksdb_mib for s in report.samples],
                 label="RocksDB: memtables + table readers + block cache")
        mem.plot(t, [s.unaccounted_mib for s in report.samples],
                 label="RssAnon - RocksDB (Python heap, allocator, threads)")
    mem.set_ylabel("MiB")
    mem.set_ylim(bottom=0)
    mem.legend(loc="lower right")
    mem.set_title(title)
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max")):
        late.plot(t, [getattr(s, key) for s in report.samples], label=label)
    late.axhline(report.config["p99_ms"], color="grey", linestyle="--", label="p99 target")
    late.set_ylabel("lateness, ms (per second)")
    late.set_yscale("symlog", linthresh=10)
    late.legend(loc="upper right")
    rate.plot(t, [s.sent for s in report.samples], label="sent (acknowledged)")
    rate.plot(t, [s.consumed for s in report.samples], label="consumed")
    rate.set_ylabel("messages/s")
    rate.legend(loc="lower right")
    samples = report.samples
    disk.plot(t, [s.data_mib for s in samples], label="data directory")
    disk.plot(t, [s.commitlog_mib for s in samples], label="commitlog/ (segments)")
    disk.plot(t, [s.rocksdb_disk_mib for s in samples], label="rocksdb/ (SST, WAL)")
    for cf in (samples[-1].cf_mib if samples else {}):
        disk.plot(t, [s.cf_mib.get(cf, 0.0) for s in samples], linestyle=":",
                  label=f"CF {cf} (SST + memtable)")
    disk.set_ylabel("MiB on disk")
    disk.set_ylim(bottom=0)
    disk.set_xlabel("seconds")
    disk.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
