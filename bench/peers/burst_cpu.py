"""One burst over HTTP, the server's CPU by thread while it drains.

W2 of the side-by-side counts the server's CPU from the start of its ingest and its RSS
growth from before it; this starts a server as the side-by-side does, sends ``--n`` messages
of ``--payload`` bytes all due at one instant (``--lead`` seconds after the ingest ends, so
RocksDB's flushes have settled), consumes them with the adapter's stream, and reports, from
just before the due time until the last message is in hand: when the first and the last
arrived, the server's CPU (each thread's, named as ``py-spy dump`` names them when it is
installed) and the growth of its anonymous and file-backed RSS (sampled every 20 ms)::

    .venv/bin/python -m bench.peers.burst_cpu --n 20000 --payload 16384
    .venv/bin/python -m bench.peers.burst_cpu --src /tmp/frozen-copy   # another checkout

One JSON line goes to stdout, the threads to stderr.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .common import Batch, msg_id, now_ms, random_bodies
from .systems.hourglass import HourglassSystem


def _rss(pid: int) -> dict[str, int]:
    """RssAnon and RssFile of ``pid``, in MiB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("RssAnon", "RssFile")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) // 1024
    return out


def _thread_names(pid: int) -> dict[int, str]:
    """Thread id -> Python thread name, from ``py-spy dump`` (empty when it is not there)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    try:
        dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True,
                              text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    names = {}
    for line in dump.splitlines():
        if line.startswith("Thread ") and '"' in line:
            tid = line.split()[1]
            names[int(tid, 0)] = line.split('"')[1]
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.burst_cpu",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--payload", type=int, default=16_384, help="bytes of each body")
    ap.add_argument("--lead", type=float, default=4.0,
                    help="seconds between the ingest's estimated end and the due time")
    ap.add_argument("--src", type=Path, default=None,
                    help="serve the code of this checkout (built), not the working tree's")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="a HOURGLASS_* setting for the server (repeatable)")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    options: dict[str, object] = {"hourglass_env": dict(e.split("=", 1) for e in args.env)}
    if args.src is not None:
        options["hourglass_src"] = args.src.resolve()
    work = Path(tempfile.mkdtemp(prefix="hourglass-burst-"))
    system = HourglassSystem(options)
    system.start(work)
    try:
        server = system.server_processes()[0]
        received: dict[str, float] = {}
        lock = threading.Lock()

        def sink(ids: list[str], t: float, _lateness: list[int]) -> None:
            with lock:
                for i in ids:
                    received[i] = t

        system.start_consumers(sink)  # type: ignore[arg-type]
        bodies = random_bodies(1000, args.payload)
        due = int(now_ms() + 1000 * (args.lead + args.n * args.payload / 60e6))
        for start in range(0, args.n, 1000):
            stop = min(start + 1000, args.n)
            system.send(Batch([msg_id(i) for i in range(start, stop)], [due] * (stop - start),
                              bodies[:stop - start]))
        while now_ms() < due - 300:
            time.sleep(0.05)

        def threads() -> dict[int, float]:
            return {t.id: t.user_time + t.system_time for t in server.threads()}

        cpu0, rss0 = threads(), _rss(server.pid)
        peak = dict(rss0)
        while len(received) < args.n and now_ms() < due + args.timeout * 1000:
            time.sleep(0.02)
            peak = {k: max(v, peak[k]) for k, v in _rss(server.pid).items()}
        cpu1 = threads()
        names = _thread_names(server.pid)
        for tid in cpu1:  # the native threads (RocksDB's) by their kernel name
            if tid not in names:
                try:
                    names[tid] = Path(f"/proc/{server.pid}/task/{tid}/comm").read_text().strip()
                except OSError:
                    pass
        system.stop_consumers()
        if len(received) < args.n:
            raise SystemExit(f"only {len(received):,} of {args.n:,} messages arrived")
        spent = {tid: cpu1[tid] - cpu0.get(tid, 0.0) for tid in cpu1}
        print(json.dumps({
            "n": args.n, "payload": args.payload,
            "first_ms": round(min(received.values()) - due, 1),
            "drain_s": round((max(received.values()) - due) / 1000, 3),
            "server_cpu_s": round(sum(spent.values()), 3),
            "rss_growth_mib": {k: peak[k] - rss0[k] for k in peak}}))
        for tid in sorted(spent, key=lambda t: -spent[t]):
            if spent[tid] >= 0.005:
                print(f"  {names.get(tid, tid)}: {spent[tid]:.3f} s", file=sys.stderr)
    finally:
        system.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
