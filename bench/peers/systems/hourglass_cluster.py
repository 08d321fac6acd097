"""hourglass as a 3-node cluster (docs/cluster.md): 3 NATS servers (one JetStream cluster,
R3 write-ahead stream) and 3 ``hourglass serve --cluster`` nodes, all on this machine,
started through bench/support (``NatsCluster``, ``HourglassCluster``) fresh for each
workload. Every client (producers and consumers) talks to the **leader** (a follower would
forward writes to it, and serve reads from what it applied); the HTTP side is
``HourglassSystem``'s, unchanged.

Besides the workload's figures it reports (``cluster`` in results.json):
- follower lag: each follower's ``hourglass_cluster_apply_lag_ms`` histogram (from the
  stream storing a record to that follower applying it, every record of the workload),
  read from its ``/metrics`` at the end: count, mean, and p50/p99 interpolated within the
  histogram's buckets (and the bucket bound it falls under);
- CPU seconds per process group (leader, followers, NATS servers) over the workload: the six
  servers share this machine's cores with the load generator; and the leader's and the
  followers' split (``cpu_threads_s``): ``rocksdb`` = RocksDB's flush and compaction
  threads, ``python`` = the rest (HTTP, writes, apply, the NATS client's loop).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import psutil
import urllib3

from ..common import dir_size, log, tree_memory
from .base import SystemUnavailable
from .hourglass import HourglassSystem

LEASE_MS = 2000
_BUCKET = re.compile(r'^hourglass_cluster_apply_lag_ms_bucket\{le="([^"]+)"\} (\S+)$')
_SUM = re.compile(r"^hourglass_cluster_apply_lag_ms_sum (\S+)$")
_COUNT = re.compile(r"^hourglass_cluster_apply_lag_ms_count (\S+)$")


def lag_summary(metrics_text: str) -> dict[str, Any]:
    """count, mean and p50/p99 (interpolated within buckets, with the bucket bound they fall
    under) of a follower's apply-lag histogram in Prometheus text."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in metrics_text.splitlines():
        if m := _BUCKET.match(line):
            buckets.append((float(m.group(1)), float(m.group(2))))
        elif m := _SUM.match(line):
            total = float(m.group(1))
        elif m := _COUNT.match(line):
            count = float(m.group(1))
    out: dict[str, Any] = {"records": int(count),
                           "mean_ms": round(total / count, 1) if count else None}
    buckets.sort()
    for name, q in (("p50", 0.50), ("p99", 0.99)):
        if not count:
            out[f"{name}_ms"] = out[f"{name}_le_ms"] = None
            continue
        rank, lo, below = q * count, 0.0, 0.0
        for le, cum in buckets:
            if cum >= rank:
                if le == float("inf"):
                    out[f"{name}_ms"], out[f"{name}_le_ms"] = lo, None  # past the last bound
                else:
                    frac = (rank - below) / (cum - below) if cum > below else 1.0
                    out[f"{name}_ms"] = round(lo + frac * (le - lo), 1)
                    out[f"{name}_le_ms"] = le
                break
            lo, below = le, cum
    return out


def rocksdb_cpu(proc: psutil.Process) -> float:
    """CPU seconds of ``proc``'s RocksDB background threads (flushes and compactions, named
    ``rocksdb:low`` / ``rocksdb:high``; they live as long as the store)."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        for t in proc.threads():
            try:
                name = Path(f"/proc/{proc.pid}/task/{t.id}/comm").read_text()
            except OSError:
                continue
            if name.startswith("rocksdb:"):
                total += t.user_time + t.system_time
    return total


class HourglassClusterSystem(HourglassSystem):
    name = "hourglass-cluster"
    label = "hourglass 3-node cluster (HTTP, at the leader)"
    guarantee = ("exactly-once into the log; at-least-once to a committing consumer; each "
                 "acked write in the R3 stream before it is answered")
    durability = "each state change in an R3 NATS JetStream stream (quorum-acked) first"

    def __init__(self, options: dict) -> None:
        options = {**options, "hourglass_url": None}
        super().__init__(options)
        self.nats: Any = None
        self.cluster: Any = None
        self.root: Path | None = None
        self._cpu0: dict[str, float] = {}

    def start(self, workdir: Path) -> None:
        try:
            from bench.support.hourglass_cluster import TOKEN, HourglassCluster
            from bench.support.nats_cluster import NATS_SERVER, NatsCluster
        except ImportError as exc:
            raise SystemUnavailable(f"bench/support not importable: {exc}") from exc
        if not NATS_SERVER.exists():
            raise SystemUnavailable(f"no nats-server at {NATS_SERVER} (the cluster extra)")
        self.root = workdir
        try:
            self.nats = NatsCluster(workdir / "nats")
            self.nats.start()
            self.cluster = HourglassCluster(workdir, self.nats, lease_ms=LEASE_MS,
                                            log_level="warning")
            for node in self.cluster.nodes:
                node.extra_env.update(self.extra_env)
                if self.src is not None:  # --hourglass-rev: the servers run that commit's code
                    node.extra_env["PYTHONPATH"] = str(self.src)
            self.cluster.start()
            leader = self.cluster.leader()
            self.cluster.wait_converged()
        except Exception as exc:
            self.stop()
            raise SystemUnavailable(f"the cluster did not start: {exc}") from exc
        log(f"hourglass-cluster: leader {leader.base_url}, followers "
            f"{', '.join(n.base_url for n in self.cluster.nodes if n is not leader)}")
        self.leader = leader
        self.url = leader.base_url
        self.token = TOKEN
        super().start(workdir)
        self._cpu0 = self._cpu_by_group()

    def stop(self) -> None:
        super().stop()
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.stop()
            self.cluster = None
        if self.nats is not None:
            with contextlib.suppress(Exception):
                self.nats.stop()
            self.nats = None

    # --- what the harness measures ------------------------------------------------------------
    def _groups(self) -> dict[str, list[psutil.Process]]:
        groups: dict[str, list[psutil.Process]] = {"leader": [], "followers": [], "nats": []}
        if self.cluster is not None:
            for node in self.cluster.nodes:
                if node.pid is not None:
                    with contextlib.suppress(psutil.Error):
                        groups["leader" if node is self.leader else "followers"].append(
                            psutil.Process(node.pid))
        if self.nats is not None:
            for proc in self.nats.procs:
                if proc is not None:
                    with contextlib.suppress(psutil.Error):
                        groups["nats"].append(psutil.Process(proc.pid))
        return groups

    def _cpu_by_group(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for group, procs in self._groups().items():
            total = 0.0
            rocks = 0.0
            for p in procs:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
                if group != "nats":
                    rocks += rocksdb_cpu(p)
            out[group] = total
            if group != "nats":
                out[f"{group}.rocksdb"], out[f"{group}.python"] = rocks, total - rocks
        return out

    def server_processes(self) -> list[psutil.Process]:
        return [p for procs in self._groups().values() for p in procs]

    def footprint(self) -> dict[str, int | None]:
        import time

        time.sleep(1.5)
        self._refresh_stats()
        procs = self.server_processes()
        if not procs or self.root is None:
            return {"memory": None, "disk": None}
        mem = tree_memory(procs)
        return {"memory": mem["rss"], "process_pss": mem["pss"], "disk": dir_size(self.root)}

    def durability_settings(self) -> dict[str, str]:
        url, self.url = self.url, None  # the servers were started here: their settings
        try:
            return super().durability_settings()
        finally:
            self.url = url

    def config(self) -> dict[str, str]:
        cfg = super().config()
        cfg["server"] = ("started by the harness: 3 nats-server (one JetStream cluster, R3 "
                         "write-ahead stream) + 3 hourglass serve --cluster, lease "
                         f"{LEASE_MS} ms, all on this machine; every client at the leader")
        return cfg

    def extra_results(self) -> dict[str, Any]:
        """Follower lag over the workload and CPU seconds per process group."""
        cpu1 = self._cpu_by_group()
        spent = {k: round(cpu1.get(k, 0.0) - self._cpu0.get(k, 0.0), 2) for k in cpu1}
        out: dict[str, Any] = {"cpu_s": {k: v for k, v in spent.items() if "." not in k},
                               "cpu_threads_s": {k: v for k, v in spent.items() if "." in k}}
        lags: dict[str, Any] = {}
        if self.cluster is not None:
            for node in self.cluster.nodes:
                if node is self.leader:
                    continue
                try:
                    r = urllib3.request("GET", node.base_url + "/metrics", timeout=10.0,
                                        headers={"Authorization": f"Bearer {self.token}"})
                    lags[node.settings.get("node_id", node.base_url)] = lag_summary(
                        r.data.decode())
                except Exception as exc:
                    lags[node.base_url] = {"error": repr(exc)}
        out["follower_lag"] = lags
        p99s = [v["p99_ms"] for v in lags.values() if v.get("p99_ms") is not None]
        out["follower_lag_p99_ms"] = max(p99s) if p99s else None
        return {"cluster": out}
