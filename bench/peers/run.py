"""Run the side-by-side benchmark.

    python -m bench.peers.run --n 1000000 --systems redis,bullmq,postgres,hourglass \\
        --workloads w1,w2,w3 --out bench/peers/results

Each (system, workload) pair runs on a fresh server instance in a temporary directory; every
server the harness started is stopped at the end, also on an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import psutil

from storage.native import PURE_PYTHON_ENV

from . import report
from .common import log, stop_all
from .systems import DEFAULT_SYSTEMS, SYSTEM_NAMES, SystemUnavailable, make_system
from .workloads import WORKLOADS, Params, pilot_rate

REPO = Path(__file__).resolve().parents[2]
NATIVE_LAYERS = ("storage", "scheduler", "api")  # one compiled module each (setup.py)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.peers.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="messages in W1 and W2")
    ap.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                    help=f"comma-separated, from {','.join(SYSTEM_NAMES)} (default: "
                         f"{','.join(DEFAULT_SYSTEMS)})")
    ap.add_argument("--workloads", default="w1,w2,w3", help="comma-separated, from w1,w2,w3")
    ap.add_argument("--out", default="bench/peers/results", help="output directory")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other systems' results already in OUT/results.json")
    ap.add_argument("--batch", type=int, default=1000, help="messages per send request")
    ap.add_argument("--producers", type=int, default=2, help="producer threads")
    ap.add_argument("--consumers", type=int, default=2,
                    help="consumer threads (BullMQ: Worker objects; hourglass: members of one "
                         "group with --hourglass-consume receive, else 1 per topic)")
    ap.add_argument("--bullmq-concurrency", type=int, default=50,
                    help="jobs in flight per BullMQ Worker")
    ap.add_argument("--w3-rate", type=float, default=2000.0, help="W3 messages per second")
    ap.add_argument("--w3-duration", type=float, default=30.0, help="W3 seconds of sending")
    ap.add_argument("--w3-delay-ms", default="1000-3000", help="W3 delay range, ms (MIN-MAX)")
    ap.add_argument("--drain-timeout", type=float, default=1800.0,
                    help="seconds after the due time to wait for the last message")
    ap.add_argument("--hourglass-consume", choices=("receive", "pull", "stream"),
                    default="stream",
                    help="hourglass consumers: 'receive' = --consumers members of one group "
                         "(POST …:receive, then …:ack); 'pull' = one thread pulling by offset "
                         "and committing it (the mode before competing consumers); 'stream' = "
                         "one thread reading GET …/messages:stream, committing its offset "
                         "once a second")
    ap.add_argument("--hourglass-url", default=None,
                    help="use this running hourglass server instead of starting one")
    ap.add_argument("--token", default=None,
                    help="bearer token for hourglass (default: a random admin token given to "
                         "the server the harness starts)")
    ap.add_argument("--hourglass-cmd", default=None,
                    help="hourglass executable (default: .venv/bin/hourglass)")
    ap.add_argument("--hourglass-encoding", choices=("msgpack", "json"), default="msgpack",
                    help="hourglass request and response bodies: msgpack (the API's opt-in "
                         "for batches and pulls) or JSON (its default)")
    ap.add_argument("--hourglass-answer", choices=("minimal", "full"), default="minimal",
                    help="hourglass send answers: minimal (`Prefer: return=minimal`, the API's "
                         "opt-in: a count and the duplicates' positions) or full (a SendResult "
                         "per message, its default)")
    ap.add_argument("--postgres-bodies", action=argparse.BooleanOptionalAction, default=True,
                    help="PostgreSQL's consumers get each body (RETURNING msg_id, run_at, body), "
                         "as Redis's and hourglass's do; --no-postgres-bodies: msgId and run_at "
                         "only, as this harness did before 2026-11-27")
    ap.add_argument("--hourglass-body", choices=("once", "both"), default="once",
                    help="hourglass pulls and receives: once (`Prefer: body=once`, the API's "
                         "opt-in: each body once, as text or as bytes) or both (its default: "
                         "bodyBase64 always, body beside it for text)")
    ap.add_argument("--hourglass-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for the hourglass server the harness starts, e.g. "
                         "HOURGLASS_FLUSH_POLICY=sync (repeatable)")
    ap.add_argument("--hourglass-rev", default=None, metavar="REV",
                    help="run the hourglass server from a frozen copy of this git commit (git "
                         "archive) instead of the live working tree, which may change mid-run")
    ap.add_argument("--workdir", default=None,
                    help="where servers keep their data (default: a new temp directory)")
    ap.add_argument("--wait-quiet", type=float, default=None, metavar="LOAD",
                    help="before each workload, wait (up to --wait-quiet-max s) until the 1-min "
                         "load average is below LOAD: the machine may be shared")
    ap.add_argument("--wait-quiet-max", type=float, default=300.0)
    ap.add_argument("--keep-data", action="store_true", help="do not delete the data dirs")
    ap.add_argument("--payload", type=int, default=100, metavar="BYTES",
                    help="bytes of each message body (random base64 text), for every system")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.workloads = [w.strip().lower() for w in args.workloads.split(",") if w.strip()]
    for s in args.systems:
        if s not in SYSTEM_NAMES:
            ap.error(f"unknown system {s!r}")
    if args.payload < 1:
        ap.error("--payload must be >= 1")
    for w in args.workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}")
    env = {}
    for kv in args.hourglass_env:
        k, sep, v = kv.partition("=")
        if not sep or not k.startswith("HOURGLASS_"):
            ap.error(f"--hourglass-env wants HOURGLASS_NAME=VALUE, not {kv!r}")
        env[k] = v
    args.hourglass_env = env
    lo, _, hi = args.w3_delay_ms.partition("-")
    args.w3_delay = (int(lo), int(hi or lo))
    return args


def machine() -> dict[str, str]:
    osname = "?"
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip('"')
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for pkg in ("redis", "bullmq", "psycopg", "urllib3", "numpy", "matplotlib"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    mem = psutil.virtual_memory().total / 2**30
    return {
        "summary": f"{os.cpu_count()} cores / {mem:.0f} GiB, {osname} ({cpu}); "
                   f"Python {platform.python_version()}",
        "packages": ", ".join(f"{k} {v}" for k, v in versions.items()),
    }


def run_system(name: str, args: argparse.Namespace, params: Params, workroot: Path,
               results: dict, save: Callable[[], None]) -> None:
    options = {"consumers": args.consumers, "bullmq_concurrency": args.bullmq_concurrency,
               "hourglass_url": args.hourglass_url, "token": args.token,
               "hourglass_consume": args.hourglass_consume,
               "hourglass_cmd": args.hourglass_cmd, "hourglass_env": args.hourglass_env,
               "hourglass_encoding": args.hourglass_encoding,
               "hourglass_answer": args.hourglass_answer,
               "hourglass_body": args.hourglass_body, "postgres_bodies": args.postgres_bodies,
               "hourglass_src": args.hourglass_src, "hourglass_rev": args.hourglass_rev}
    entry: dict = {"workloads": {}, "errors": {}, "params": asdict(params)}
    results["systems"][name] = entry
    ctx: dict = {}
    plan = list(args.workloads)
    if "w2" in plan and "w1" not in plan:
        plan.insert(plan.index("w2"), "pilot")
    for wl in plan:
        try:
            system = make_system(name, options)
        except SystemUnavailable as exc:
            entry["skipped"] = str(exc)
            log(f"SKIP {name}: {exc}")
            return
        entry.update({k: v for k, v in system.describe().items() if k != "config"})
        workdir = Path(tempfile.mkdtemp(prefix=f"{name}-{wl}-", dir=workroot))
        log(f"=== {name} {wl.upper()} (data in {workdir})")
        if args.wait_quiet is not None:
            wait_quiet(args.wait_quiet, args.wait_quiet_max)
        t0 = time.perf_counter()
        load0 = round(os.getloadavg()[0], 2)
        try:
            system.start(workdir)
            entry["config"] = system.config()
            fn = pilot_rate if wl == "pilot" else WORKLOADS[wl]
            res = fn(system, params, ctx)
            if wl != "pilot":
                res.update(system.extra_results())
            res["wall_s"] = round(time.perf_counter() - t0, 1)
            res["loadavg_1m"] = {"start": load0, "end": round(os.getloadavg()[0], 2)}
            if wl == "pilot":
                entry["pilot"] = res
            else:
                entry["workloads"][wl] = res
                _log_summary(name, wl, res)
            entry["config"] = system.config()  # may know more once running (hourglass stats)
        except SystemUnavailable as exc:
            entry["skipped"] = str(exc)
            log(f"SKIP {name}: {exc}")
            return
        except Exception as exc:
            entry["errors"][wl] = "".join(traceback.format_exception(exc))
            log(f"ERROR {name} {wl}: {exc!r}")
        finally:
            try:
                system.stop()
            except Exception as exc:
                log(f"stopping {name}: {exc!r}")
            if not args.keep_data:
                shutil.rmtree(workdir, ignore_errors=True)
            save()


def git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True,
                          check=True).stdout.strip()


def git_state() -> str:
    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (subprocess.CalledProcessError, OSError):
        return "?"
    return head + (" (working tree modified)" if dirty else "")


def freeze_source(rev: str, workroot: Path) -> tuple[Path, str]:
    """``git archive REV`` into WORKROOT/hourglass-src; returns (dir, full commit id)."""
    commit = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    dest = workroot / "hourglass-src"
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    log(f"hourglass server code frozen at {commit[:12]} in {dest}")
    # git archive holds no build products: the working tree's compiled hot paths (one per
    # layer, setup.py) go along when they were built from the same sources; else the frozen
    # copy's own are built (a missing one would not mean its pure-Python twin: the editable
    # install's finder maps ``<layer>._native`` to the working tree's build)
    differ = []
    for layer in NATIVE_LAYERS:
        sources = [Path(layer) / "_native.pyx", Path("storage") / "_msgpack.pxd",
                   Path("scheduler") / "_handles.pxd"]
        built = sorted((REPO / layer).glob("_native.*.so"))
        if built and all((dest / s).is_file() and (dest / s).read_bytes()
                         == (REPO / s).read_bytes() for s in sources):
            for so in built:
                shutil.copy2(so, dest / layer / so.name)
        else:
            differ.append(layer)
    if differ:
        log(f"{', '.join(differ)}: the working tree's build is of other sources: building the "
            "frozen copy's compiled hot paths (a minute)")
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=dest,
                       capture_output=True, check=False)
    return dest, commit


def frozen_unbuilt(dest: Path) -> list[str]:
    """The layers of the frozen copy ``dest`` without a compiled module of their own (its
    server must then run every pure-Python twin: ``HOURGLASS_PURE_PYTHON``)."""
    return [layer for layer in NATIVE_LAYERS if not sorted((dest / layer).glob("_native.*.so"))]


def wait_quiet(threshold: float, max_wait: float) -> None:
    deadline = time.monotonic() + max_wait
    load = os.getloadavg()[0]
    if load < threshold:
        return
    log(f"load average {load:.1f} ≥ {threshold}: waiting up to {max_wait:.0f} s for quiet")
    while load >= threshold and time.monotonic() < deadline:
        time.sleep(5)
        load = os.getloadavg()[0]
    log(f"load average now {load:.1f}; going on")


def _log_summary(name: str, wl: str, res: dict) -> None:
    c = res.get("correctness", {})
    if wl == "w1":
        log(f"{name} W1: {res['msgs_per_s']:,.0f} msg/s; pending {c.get('pending')}; "
            f"per M: mem {_fmt_mib(res['per_million_pending'].get('memory'))}, "
            f"disk {_fmt_mib(res['per_million_pending'].get('disk'))}"
            + (f" ({_fmt_mib(res['per_million_pending']['disk_compacted'])} compacted)"
               if res['per_million_pending'].get('disk_compacted') is not None else ""))
    else:
        lat = res.get("lateness_ms", {})
        log(f"{name} {wl.upper()}: lateness p50 {lat.get('p50')} p99 {lat.get('p99')} "
            f"max {lat.get('max')} ms; early {res.get('early')}; missing {c.get('missing')}, "
            f"duplicates {c.get('duplicates')}"
            + (f"; drain {res.get('drain_s'):.1f} s" if res.get("drain_s") else "")
            + (f"; server RSS growth {_fmt_mib(res['server_rss_growth']['rss'])} (anon "
               f"{_fmt_mib(res['server_rss_growth'].get('anon'))}, file-backed "
               f"{_fmt_mib(res['server_rss_growth'].get('file'))})"
               if res.get("server_rss_growth") else ""))


def _fmt_mib(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 2**20:,.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    params = Params(n=args.n, batch=args.batch, producers=args.producers,
                    w3_rate=args.w3_rate, w3_duration_s=args.w3_duration,
                    w3_delay_min_ms=args.w3_delay[0], w3_delay_max_ms=args.w3_delay[1],
                    drain_timeout_s=args.drain_timeout, seed=args.seed,
                    payload=args.payload)
    cmd = "python -m bench.peers.run " + shlex.join(sys.argv[1:] if argv is None else argv)
    results: dict = {"systems": {}}
    previous = out / "results.json"
    if args.merge and previous.exists():
        results = json.loads(previous.read_text())
        results.setdefault("systems", {})
        results.setdefault("meta", {}).setdefault("runs", [])
    m = machine()
    meta = results.setdefault("meta", {})
    date = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    run_info = {"command": cmd, "date": date,
                "systems": args.systems, "params": asdict(params)}
    if args.merge and meta.get("params") and meta["params"] != asdict(params):
        log("warning: merging results made with different parameters")
    meta.update({
        "machine": f"{m['summary']} — nominally 2 cores / 24 GiB Debian 12",
        "packages": m["packages"],
        "git": git_state(),
        "command": cmd,
        "date": run_info["date"], "params": asdict(params),
    })
    meta.setdefault("runs", []).append(run_info)

    def save() -> None:
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
        tmp.replace(out / "results.json")

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    workroot = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="hg-peers-"))
    workroot.mkdir(parents=True, exist_ok=True)
    args.hourglass_src = None
    if args.hourglass_rev and any(s.startswith("hourglass") for s in args.systems):
        args.hourglass_src, args.hourglass_rev = freeze_source(args.hourglass_rev, workroot)
        if unbuilt := frozen_unbuilt(args.hourglass_src):
            log(f"{', '.join(unbuilt)} not built in the frozen copy: its server runs the "
                "pure-Python twins")
            args.hourglass_env[PURE_PYTHON_ENV] = "1"
    status = 0
    try:
        for name in args.systems:
            run_system(name, args, params, workroot, results, save)
    except KeyboardInterrupt:
        log("interrupted: stopping servers, writing what was measured")
        status = 130
    finally:
        stop_all()
        if not args.keep_data and not args.workdir:
            shutil.rmtree(workroot, ignore_errors=True)
        save()
    for p in report.write_all(results, out):
        log(f"wrote {p}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
