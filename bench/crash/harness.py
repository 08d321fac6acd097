"""The crash run: the real server under load, killed with SIGKILL N times at random moments
(during ingest, during a large due burst, during a cancel storm), its CommitLog tail torn now
and then while it is down, restarted each time; then everything is let due, drained and
checked against what the clients were told (support/crash/verify.py).
"""

from __future__ import annotations

import random
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.crash.torn import TornWrite, tear_tail
from bench.support.crash.ledger import Ledger
from bench.support.crash.verify import check, check_statuses, read_logs
from bench.support.crash.workload import (
    TOPICS,
    Shared,
    cancel,
    now_ms,
    probe_transactions,
    send_new,
    start_clients,
)
from bench.support.server_process import ServerError, ServerProcess

PHASES = ("ingest", "burst", "cancel-storm")
DRAIN_TIMEOUT_S = 120.0
RESOLVE_TIMEOUT_S = 60.0


@dataclass(frozen=True, kw_only=True)
class CrashConfig:
    workdir: Path
    kills: int = 10
    seed: int | None = None
    torn_every: int = 4  # tear the CommitLog tail after every n-th kill (and once at the end)
    burst_size: int = 3000  # messages due at the same instant in a burst phase
    storm_size: int = 600  # messages sent, then cancelled concurrently, in a storm phase
    senders: int = 2  # sending client threads
    max_delay_ms: int = 3000  # longest delay the clients ask for
    segment_size: str = "4MiB"  # small segments: roll-overs happen during the run
    status_sample: int = 500  # acknowledged messages whose status is checked at the end


@dataclass(kw_only=True)
class CrashReport:
    seed: int
    kills: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    torn: list[str] = field(default_factory=list)
    restart_s: list[float] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    logged: int = 0
    notes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        r = self.restart_s
        restarts = (f"{len(r)} restarts, ready after median {statistics.median(r):.2f} s / "
                    f"max {max(r):.2f} s" if r else "no restarts")
        lines = [
            f"crash run (seed {self.seed}): {self.kills} kill -9 in {self.elapsed_s:.0f} s "
            f"({', '.join(f'{k} {v}' for k, v in self.phases.items())}); {restarts}",
            f"torn CommitLog tails: {len(self.torn)}" + "".join(f"\n  {t}" for t in self.torn),
            "client ledger: " + ", ".join(f"{k} {v}" for k, v in self.counts.items()),
            f"messages in the logs: {self.logged}",
            *(f"note: {n}" for n in self.notes),
            "VERDICT: " + ("every guarantee held" if self.ok else
                           f"{len(self.violations)} violation line(s)"),
            *self.violations,
        ]
        return "\n".join(lines)


class _Run:
    def __init__(self, config: CrashConfig, progress: Callable[[str], None]) -> None:
        self.config = config
        self.progress = progress
        seed = config.seed if config.seed is not None else secrets.randbelow(2**31)
        self.rng = random.Random(seed)
        self.report = CrashReport(seed=seed)
        self.ledger = Ledger()
        config.workdir.mkdir(parents=True, exist_ok=True)
        self.server = ServerProcess(
            config.workdir / "data", token=secrets.token_urlsafe(24),
            log_path=config.workdir / "server.log",
            # bodies stay small; a segment must hold the largest body (scheduler/broker.py).
            # The verdict reads every topic from offset 0: a disk the machine's other work
            # filled past disk_clean_ratio must not delete segments under it (1.0: never)
            settings={"segment_size": config.segment_size, "max_body_bytes": "1MiB",
                      "disk_clean_ratio": "1.0"})
        self.shared = Shared(self.server, self.ledger, config.max_delay_ms)
        self._storm_threads: list[threading.Thread] = []

    # --- server lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self.report.restart_s.append(self.server.start())
        self.shared.gate.open()

    def kill(self) -> None:
        self.shared.gate.close()
        self.server.kill()
        self.report.kills += 1

    def tear(self, tag: str) -> TornWrite | None:
        torn = tear_tail(self.server.data_dir, self.rng, topic=TOPICS[0], tag=tag)
        if torn is not None:
            self.report.torn.append(torn.describe())
            if torn.fabricated:
                self.ledger.torn_ids.append(torn.fabricated)
        return torn

    # --- phases (the main thread; clients keep running meanwhile) ------------------------------
    def ingest(self, client: httpx.Client) -> None:
        time.sleep(self.rng.uniform(0.4, 2.5))

    def burst(self, client: httpx.Client) -> None:
        due = now_ms() + 1200
        send_new(client, self.shared, self.rng, self.rng.choice(TOPICS),
                 self.config.burst_size, deliver_at=due)
        _sleep_until(due + self.rng.randrange(150))

    def storm(self, client: httpx.Client) -> None:
        due = now_ms() + self.rng.randrange(700, 1200)
        records = send_new(client, self.shared, self.rng, self.rng.choice(TOPICS),
                           self.config.storm_size, deliver_at=due, spread_ms=400)
        targets = [r for r in records if r.acked]
        self.rng.shuffle(targets)

        def cancel_all(part: list[Any], seed: int) -> None:
            rng = random.Random(seed)
            with self.server.client() as c:
                for rec in part:
                    try:
                        cancel(c, self.shared, rec, by_handle=rng.random() < 0.5)
                    except httpx.TransportError:
                        return  # killed: the rest is never asked, the asked ones are retried
        threads = [threading.Thread(target=cancel_all, args=(targets[i::3], self.rng.random()))
                   for i in range(3)]
        for t in threads:
            t.start()
        _sleep_until(due + self.rng.randrange(-100, 400))
        self._storm_threads = threads

    # --- the run ------------------------------------------------------------------------------
    def run(self) -> CrashReport:
        t0 = time.monotonic()
        cfg = self.config
        try:
            self.start()
            with self.server.client() as client:
                why = probe_transactions(client, self.shared, self.rng)
            self.shared.transactions = why is None
            if why:
                self.report.notes.append(f"transactions not exercised: {why}")
            clients = start_clients(self.shared, self.rng.randrange(2**30), cfg.senders)
            for k in range(cfg.kills):
                if k:
                    self.start()
                self._cycle(k)
            self.start()
            self._finish(clients)
            self._verify("after the run")
            if self.report.ok:
                self._final_torn_round()
        except ServerError as exc:
            self.report.violations.append(f"the server did not come back: {exc}")
        finally:
            self.shared.gate.stop()
            self.server.stop()
            self.report.counts = self.ledger.counts()
            self.report.elapsed_s = time.monotonic() - t0
        return self.report

    def _cycle(self, k: int) -> None:
        phase = PHASES[k % len(PHASES)]
        self._storm_threads = []
        with self.server.client() as client:
            try:
                {"ingest": self.ingest, "burst": self.burst, "cancel-storm": self.storm}[phase](
                    client)
            except httpx.TransportError as exc:
                self.ledger.anomaly(f"the {phase} phase lost its server: {exc!r}")
        self.kill()
        for t in self._storm_threads:
            t.join()
        self.report.phases[phase] = self.report.phases.get(phase, 0) + 1
        torn = None
        if self.config.torn_every and (k + 1) % self.config.torn_every == 0:
            torn = self.tear(f"k{k + 1}")
        counts = self.ledger.counts()
        self.progress(f"kill {k + 1}/{self.config.kills} during {phase}: acked "
                      f"{counts['acked']}, unacked {counts['unacked']}, cancelled "
                      f"{counts['cancelled']}/409 {counts['alreadyDelivered']}, consumed "
                      f"{counts['consumed']}" + (f"; torn tail: {torn.describe()}" if torn
                                                 else ""))

    def _finish(self, clients: list[Any]) -> None:
        """Stop new work, let the clients resolve open cancels and decisions, then wait until
        everything is due and delivered."""
        self.shared.finishing.set()
        deadline = time.monotonic() + RESOLVE_TIMEOUT_S
        while self.shared.open_work() and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.shared.open_work():
            self.report.notes.append(f"{self.shared.open_work()} cancels/decisions stayed "
                                     "unanswered")
        self.shared.gate.stop()
        for c in clients:
            c.join()
        _sleep_until(self.ledger.latest_due_ms() + 200)
        self._drain()

    def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        with self.server.client() as client:
            while True:
                stats = client.get("/v1/admin/stats").json()
                if (stats["pending"] == 0 and stats["deliveryQueueMessages"] == 0
                        and stats["appliedLogPosition"] == stats["logEndPosition"]):
                    return
                if time.monotonic() > deadline:
                    raise ServerError(f"not drained after {DRAIN_TIMEOUT_S:.0f} s: {stats}")
                time.sleep(0.1)

    def _verify(self, when: str) -> dict[str, list[Any]]:
        with self.server.client(timeout_s=60) as client:
            logs = read_logs(client, TOPICS)
            problems = check(self.ledger, logs)
            problems += check_statuses(client, self.ledger, logs, self.config.status_sample)
        self.report.logged = sum(len(v) for v in logs.values())
        self.report.violations += [f"[{when}] {p}" for p in problems]
        self.progress(f"verified {when}: {self.report.logged} messages in the logs, "
                      f"{len(problems)} problem line(s)")
        return logs

    def _final_torn_round(self) -> None:
        """Kill the drained server, tear its tail, restart: the logs must be unchanged, and
        appends after the recovered tail must work."""
        with self.server.client() as client:
            before = read_logs(client, TOPICS)
        self.kill()
        torn = self.tear("final")
        self.start()
        after = self._verify(f"after the final torn tail ({torn.describe() if torn else '-'})")
        if _fingerprint(after) != _fingerprint(before):
            self.report.violations.append("the logs changed across the final torn-tail restart")
        with self.server.client() as client:
            records = send_new(client, self.shared, self.rng, TOPICS[0], 10, deliver_at=0)
            logs = read_logs(client, TOPICS)
        tail = [e.get("body") for e in logs[TOPICS[0]][len(after[TOPICS[0]]):]]
        if tail != [r.token for r in records]:
            self.report.violations.append(f"appends after the torn tail: expected "
                                          f"{[r.token for r in records]}, the log has {tail}")


def _fingerprint(logs: dict[str, list[Any]]) -> dict[str, list[tuple[Any, ...]]]:
    return {t: [(e["offset"], e["msgId"], e["storedAt"]) for e in entries]
            for t, entries in logs.items()}


def _sleep_until(epoch_ms: int) -> None:
    delay = (epoch_ms - now_ms()) / 1000
    if delay > 0:
        time.sleep(delay)


def run(config: CrashConfig, progress: Callable[[str], None] = print) -> CrashReport:
    return _Run(config, progress).run()
