"""W3's two halves against each other: lateness p99 and server CPU, one scan interval at a time.

    python -m bench.peers.tradeoff --intervals 1,2,4,8 --peers redis,postgres \\
        --out bench/peers/results-tradeoff

W3 of the side-by-side (a steady 2 k msg/s, each due 1-3 s after it is sent) asks for a p99
lateness no worse than the best peer's AND a whole CPU (server + consumer side: the consumers
and a peer's mover, measured per thread) no more than that peer's. Both depend on how
often hourglass's scanner looks for due keys (``HOURGLASS_SCAN_INTERVAL_MS``): each scan that
finds something is a delivery commit and, downstream, a frame to the consumer's stream (or a
receive, with ``--hourglass-consume receive``), so a shorter interval buys lateness with
CPU. This runs ``python -m bench.peers.run --workloads w3`` once per interval (a fresh
server each, nothing else changed) and once per peer, in turns (peer, interval, interval,
peer, ...) so that a drift of the machine spreads over both, and writes:

- ``tradeoff.json``: per run, p50 / p99 lateness, server, consumer-side, whole (the two
  together) and client CPU and the cores they are over the run's wall time (W3 sends for
  30 s, then drains for up to 3 s more);
- ``tradeoff.md``: the same as a table, with the command and the machine;
- ``tradeoff.png``: p99 lateness against CPU (server, and whole), hourglass's intervals as
  lines, the peers as points, and the corner the target asks for shaded.

Each run's own report (results.md, plots) stays in ``OUT/<run>/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..http import cpu_shares, cpu_times
from .common import log, number_list
from .systems import SYSTEM_NAMES

SCAN_ENV = "HOURGLASS_SCAN_INTERVAL_MS"


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.tradeoff", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--intervals", default="1,2,4,8",
                    help="hourglass scan intervals to run, ms, comma-separated")
    ap.add_argument("--peers", default="redis,postgres",
                    help="peers to run once each for reference, comma-separated ('' for none)")
    ap.add_argument("--out", default="bench/peers/results-tradeoff", help="output directory")
    ap.add_argument("--w3-rate", type=float, default=2000.0, help="W3 messages per second")
    ap.add_argument("--w3-duration", type=float, default=30.0, help="W3 seconds of sending")
    ap.add_argument("--hourglass-rev", default=None, metavar="REV",
                    help="run the hourglass servers from a frozen copy of this git commit")
    ap.add_argument("--wait-quiet", type=float, default=None, metavar="LOAD",
                    help="before each run, wait (up to 300 s) until the 1-min load average is "
                         "below LOAD (bench.peers.run's option): the machine may be shared")
    args = ap.parse_args(argv)
    args.intervals = number_list(ap, "--intervals", args.intervals, int, "1,2,4,8")
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for peer in args.peers:
        if peer not in SYSTEM_NAMES or peer == "hourglass":
            ap.error(f"unknown peer {peer!r}; choose from "
                     f"{', '.join(n for n in SYSTEM_NAMES if n != 'hourglass')}")
    return args


def plan(intervals: list[int], peers: list[str]) -> list[tuple[str, int | None]]:
    """The runs in turns: (system, interval), a peer's interval None; each peer goes before
    its share of the intervals, so that peers and intervals alternate over the whole run."""
    runs: list[tuple[str, int | None]] = []
    share = -(-len(intervals) // max(len(peers), 1))  # ceil
    rest = list(intervals)
    for peer in peers or [""]:
        if peer:
            runs.append((peer, None))
        runs.extend(("hourglass", iv) for iv in rest[:share])
        rest = rest[share:]
    runs.extend(("hourglass", iv) for iv in rest)
    return runs


def run_name(system: str, interval: int | None) -> str:
    return system if interval is None else f"hourglass-{interval}ms"


def run_one(system: str, interval: int | None, args: argparse.Namespace, out: Path) -> dict:
    """One W3 run through the side-by-side's own harness; its W3 figures."""
    where = out / run_name(system, interval)
    cmd = [sys.executable, "-m", "bench.peers.run", "--systems", system, "--workloads", "w3",
           "--n", "1000", "--w3-rate", str(args.w3_rate), "--w3-duration",
           str(args.w3_duration), "--out", str(where)]
    if args.wait_quiet is not None:
        cmd += ["--wait-quiet", str(args.wait_quiet)]
    if interval is not None:
        cmd += ["--hourglass-env", f"{SCAN_ENV}={interval}"]
        if args.hourglass_rev:
            cmd += ["--hourglass-rev", args.hourglass_rev]
    log(f"tradeoff: {run_name(system, interval)}: {shlex.join(cmd[1:])}")
    before = cpu_times()
    done = subprocess.run(cmd, check=False)
    steal = cpu_shares(before, cpu_times()).get("steal")
    if done.returncode != 0:
        raise RuntimeError(f"{run_name(system, interval)} failed (exit {done.returncode}); "
                           f"see {where}")
    return {**figures(json.loads((where / "results.json").read_text()), system, interval),
            "steal_pct": steal}


def figures(results: dict, system: str, interval: int | None) -> dict[str, Any]:
    """The W3 figures of one run's results.json (bench.peers.run's format)."""
    entry = results["systems"][system]
    w3 = entry["workloads"]["w3"]
    if interval is not None:  # the server really ran with it (the harness records its env)
        recorded = entry.get("config", {}).get(SCAN_ENV)
        if recorded != str(interval):
            raise RuntimeError(f"hourglass ran with {SCAN_ENV}={recorded!r}, not {interval}")
    wall = float(w3["wall_s"])
    ok = bool(w3["correctness"]["ok"]) and w3["early"] == 0
    return {
        "run": run_name(system, interval), "system": entry.get("label", system),
        "interval_ms": interval, "messages": w3["n"],
        "p50_ms": w3["lateness_ms"]["p50"], "p99_ms": w3["lateness_ms"]["p99"],
        "server_cpu_s": w3["server_cpu_s"], "client_cpu_s": w3["client_cpu_s"],
        "consumer_cpu_s": w3["consumer_cpu_s"], "whole_cpu_s": w3["whole_cpu_s"],
        "wall_s": wall, "server_cores": w3["server_cpu_s"] / wall,
        "whole_cores": w3["whole_cpu_s"] / wall, "correct": ok,
    }


def table(rows: list[dict]) -> str:
    lines = ["| run | scan interval | lateness p50 / p99 | server CPU (cores) | "
             "consumer side CPU | whole CPU: server + consumer side (cores) | "
             "every message once, none early | CPU steal |",
             "|---|--:|--:|--:|--:|--:|---|--:|"]
    for r in rows:
        iv = "—" if r["interval_ms"] is None else f"{r['interval_ms']} ms"
        steal = "?" if r.get("steal_pct") is None else f"{r['steal_pct']:.1f} %"
        lines.append(
            f"| {r['system']} | {iv} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} ms | "
            f"{r['server_cpu_s']:.1f} s ({r['server_cores']:.2f}) | "
            f"{r['consumer_cpu_s']:.1f} s | "
            f"{r['whole_cpu_s']:.1f} s ({r['whole_cores']:.2f}) | "
            f"{'yes' if r['correct'] else 'NO'} | {steal} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours = sorted((r for r in rows if r["interval_ms"] is not None),
                  key=lambda r: r["interval_ms"])
    peers = [r for r in rows if r["interval_ms"] is None]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    best = min(peers, key=lambda r: r["p99_ms"], default=None)
    if best is not None:  # the corner W3's target asks for: both halves at once
        ax.fill_between([0, best["whole_cores"]], 0, best["p99_ms"], color="tab:green",
                        alpha=0.15, label="target: p99 and whole CPU ≤ the best peer's")
    # filled: server CPU; hollow: whole CPU (the target's measure), server + consumer side,
    # where a peer's own scheduling loop runs (Redis's mover) next to its consumers
    ax.plot([r["server_cores"] for r in ours], [r["p99_ms"] for r in ours], "o-",
            color="tab:blue", label="hourglass by scan interval: server")
    ax.plot([r["whole_cores"] for r in ours], [r["p99_ms"] for r in ours], "o--",
            color="tab:blue", markerfacecolor="none", alpha=0.6,
            label="… whole: server + consumer side")
    for r in ours:
        ax.annotate(f"{r['interval_ms']} ms", (r["server_cores"], r["p99_ms"]),
                    textcoords="offset points", xytext=(6, 4), fontsize=9)
    for r, (marker, color) in zip(peers, [("s", "tab:red"), ("D", "tab:orange"),
                                          ("^", "tab:purple"), ("v", "tab:brown")],
                                  strict=False):
        ax.plot([r["server_cores"]], [r["p99_ms"]], marker, color=color, markersize=8,
                label=f"{r['system']}: server")
        ax.plot([r["whole_cores"]], [r["p99_ms"]], marker, color=color, markersize=8,
                markerfacecolor="none", label="… whole")
    ax.set_xlabel("CPU during W3 (cores)")
    ax.set_ylabel("lateness p99 (ms)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title("W3 at a steady rate: lateness bought with CPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.peers.tradeoff " + shlex.join(argv)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    rows = [run_one(system, interval, args, out)
            for system, interval in plan(args.intervals, args.peers)]
    rows.sort(key=lambda r: (r["interval_ms"] is None, r["interval_ms"] or 0, r["run"]))
    (out / "tradeoff.json").write_text(json.dumps(
        {"command": command, "started": started, "runs": rows}, indent=2) + "\n")
    (out / "tradeoff.md").write_text(
        f"# W3: lateness against server CPU, by scan interval\n\n- **Command**: `{command}`\n"
        f"- **Started**: {started}; each run's machine and parameters are in its "
        f"results.md\n\n{table(rows)}\n\n![p99 against CPU](tradeoff.png)\n")
    plot(rows, out / "tradeoff.png")
    print(table(rows))
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
