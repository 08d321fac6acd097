"""``hourglass serve``: settings from defaults < TOML < env < flags, then one uvicorn worker
(uvloop + httptools) serving the API. The FastAPI lifespan starts and closes the engine.

One worker only: the engine owns the RocksDB directory (an exclusive lock) and the CommitLog.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import resource
import secrets
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import uvicorn

from api.auth import Role, TokenSpec
from app import malloc
from app.settings import MIN_TOKEN_LENGTH, Settings, load_settings
from storage.errors import InvalidArgument
from storage.private import UMASK, private_dir, readable_by_others

log = logging.getLogger("hourglass.server")

TOKEN_BYTES = 32  # secrets.token_urlsafe(32): 43 characters, 256 bits


def ensure_admin_token(settings: Settings) -> Settings:
    """With no token configured at all, use the admin token kept in the data directory,
    generating it (mode 0600) on first start; say where it is, never what it is."""
    if settings.tokens:
        return settings
    path = settings.admin_token_file
    if path.exists():
        if readable_by_others(path):
            raise InvalidArgument(f"{path} is readable by others (mode "
                                  f"{path.stat().st_mode & 0o777:o}); chmod 600 it")
        token = path.read_text(encoding="utf-8").strip()
        if len(token) < MIN_TOKEN_LENGTH:
            raise InvalidArgument(f"{path} holds no valid token; delete it to generate a new "
                                  "one, or configure tokens")
        created = False
    else:
        private_dir(path.parent)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        partial = path.with_name(path.name + ".partial")
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(partial, path)  # whole or absent, even across a crash
        created = True
    print(f"hourglass: no token configured; {'generated an' if created else 'using the'} admin "
          f"token in {path} (send it as 'Authorization: Bearer <token>')", file=sys.stderr)
    return settings.with_tokens((TokenSpec(token=token, role=Role.ADMIN,
                                           name=f"generated {path.name}"),))


class Server(uvicorn.Server):
    """uvicorn's server, releasing long polls as soon as shutdown starts: uvicorn waits for
    in-flight requests before running the lifespan shutdown, and a long poll may wait 30 s."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None], *,
                 tune_gc: bool = False) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown
        self._tune_gc = tune_gc

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self._tune_gc:
            tune_gc()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="hourglass serve",
        description="Run the hourglass HTTP server. Settings: defaults < --config TOML file "
                    "< HOURGLASS_* environment < these flags (see docs/api.md).",
    )
    parser.add_argument("--data-dir", type=Path, help="data directory (default ./data)")
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", help="listen port (default 7740)")
    parser.add_argument("--config", type=Path, help="TOML settings file")
    parser.add_argument("--cluster", metavar="URLS",
                        help="cluster mode: the NATS servers, comma-separated (docs/cluster.md)")
    parser.add_argument("--node-id", help="this node's id in the cluster")
    parser.add_argument("--advertise", metavar="URL",
                        help="how other nodes reach this one (default http://HOST:PORT)")
    return parser.parse_args(list(argv))


#: the most open files asked for when the hard limit is unlimited (Linux's fs.nr_open default)
MAX_OPEN_FILES = 1 << 20


GC_GEN0_THRESHOLD = 10_000  # container allocations (net) between young collections; 700 in CPython


def tune_gc() -> None:
    """The cyclic GC of a long-running server (process-wide; ``hourglass serve`` only).

    - Everything alive once the engine has started (modules, the app, the engine) lives as
      long as the process: ``gc.freeze`` puts it out of the collector's reach, so a full
      collection (set off by the allocations of pulls and batches) scans only what requests
      created since. In process: a full collection took 44 ms; pulls of 1000 +35 %.
    - A young collection every 10 000 net container allocations instead of 700. The engine
      frees nearly all it allocates by reference counting, but a scan batch holds 1000
      (key, value) tuples while it waits for its commit, so at 700 a burst set off a young
      collection every few scans, each walking the batches in flight and promoting them:
      200 k due at once over HTTP (W2 of bench/peers), 160 young and 15 older collections,
      ~28 ms of CPU, against none at 10 000 (drain 0.44 / 0.47 -> 0.37 / 0.42 s, server CPU
      1.13 / 1.16 -> 1.02 / 1.11 s, two pairs). Garbage in cycles waits a little longer.
    """
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


def raise_open_files_limit(needed: int) -> int:
    """Raise this process's soft limit of open files to its hard limit, as servers do (Go's
    runtime does it for every program): at its limits hourglass holds ``max_connections``
    sockets, a duplicate of each standing stream's socket (api/push.py), every RocksDB table
    file (``max_open_files = -1``) and the log's segments, and Debian's default soft limit
    is 1024. Warns when even the hard limit is below ``needed``; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError) as exc:  # (e.g. above fs.nr_open)
            log.warning("cannot raise the open files limit: %s", exc)
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "%d open files allowed (ulimit -n), fewer than the %d that max_connections and "
            "max_long_polls may need with RocksDB's files: raise the hard limit", soft, needed)
    return soft


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    os.umask(UMASK)  # RocksDB's files, the CommitLog, snapshots: the owner's only
    try:
        settings = load_settings(
            cli={"data_dir": str(args.data_dir) if args.data_dir else None, "host": args.host,
                 "port": args.port, "cluster": args.cluster, "node_id": args.node_id,
                 "advertise": args.advertise},
            env=os.environ, config_file=args.config,
        )
    except InvalidArgument as exc:
        print(f"hourglass serve: error: {exc.detail}", file=sys.stderr)
        return 2
    env = malloc.late_env(os.environ, settings.malloc_huge_pages)
    if env is not None:  # the TOML file turned off what app/cli.py turned on
        malloc.reexec(env)
    logging.basicConfig(level=settings.log_level.upper() if settings.log_level != "trace"
                        else "DEBUG", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = ensure_admin_token(settings)
    except (OSError, InvalidArgument) as exc:
        print(f"hourglass serve: error: cannot set up the admin token: {exc}", file=sys.stderr)
        return 2

    raise_open_files_limit(settings.max_connections + settings.max_long_polls + 1024)
    sys.setswitchinterval(settings.gil_switch_interval_us / 1e6)
    from app.wiring import build_app, uvicorn_config  # imports the whole server: only here

    try:
        app = build_app(settings)  # the engine checks its own settings (e.g. delay levels)
    except InvalidArgument as exc:
        print(f"hourglass serve: error: {exc.detail}", file=sys.stderr)
        return 2
    server = Server(uvicorn_config(app, settings), on_shutdown=app.state.ctx.release_waiters,
                    tune_gc=True)
    server.run()
    return 0 if server.started else 1
