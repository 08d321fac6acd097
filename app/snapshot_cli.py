"""``hourglass snapshot create|list|remove``: RocksDB snapshots of a data directory.

``create`` opens the store itself when no server runs on the data directory. When one does,
RocksDB's lock is held by it, and the snapshot is asked of the server instead
(``POST /v1/admin/snapshots``) at ``--url`` with ``--token`` (default: HOURGLASS_ADMIN_TOKEN,
else the generated token file in the data directory). ``list`` and ``remove`` only touch
files, so they work either way.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.settings import DEFAULT_PORT, Settings
from storage.constants import ROCKSDB_DIR, SNAPSHOTS_DIR
from storage.errors import HourglassError, InvalidArgument, NotFound, StorageError
from storage.snapshots import disk_usage, list_snapshots, remove_snapshot

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
TOKEN_ENV = "HOURGLASS_ADMIN_TOKEN"


class CliError(Exception):
    """A failure explained to the user; ``status`` is the exit code."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hourglass snapshot",
                                description=(__doc__ or "").replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", type=Path, default=Path("data"),
                        help="the server's data directory (default: ./data)")
    common.add_argument("--json", action="store_true", help="print JSON")
    create = sub.add_parser("create", parents=[common], help="take a snapshot")
    create.add_argument("--url", help=f"server to ask when it holds the store "
                                      f"(default {DEFAULT_URL})")
    create.add_argument("--token", help=f"admin token (default: ${TOKEN_ENV}, else the "
                                        "token file the server generated in DATA_DIR)")
    create.add_argument("--timeout", type=float, default=60.0, help="HTTP timeout, seconds")
    sub.add_parser("list", parents=[common], help="list snapshots and the disk they pin")
    remove = sub.add_parser("remove", parents=[common], help="delete a snapshot")
    remove.add_argument("snapshot_id", metavar="ID")
    return p


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "lock" in text and ("resource temporarily unavailable" in text or "hold" in text)


def create_offline(data_dir: Path) -> dict[str, Any]:
    """Open the store (no server running), snapshot it, close it."""
    from storage.rocks import RocksStore
    from storage.snapshots import create_snapshot

    db_dir = data_dir / ROCKSDB_DIR
    if not (db_dir / "CURRENT").is_file():
        raise CliError(f"{data_dir} holds no hourglass store (no {ROCKSDB_DIR}/ in it)", 2)
    store = RocksStore(db_dir, timer_shards=None)
    try:
        info = create_snapshot(store, data_dir / SNAPSHOTS_DIR,
                               extra={"takenBy": "hourglass snapshot (offline)"})
    finally:
        store.close()
    return {"snapshotId": info.snapshot_id, "path": str(info.path), "createdAt": info.created_at}


def _token(data_dir: Path, given: str | None) -> str:
    if given:
        return given
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    token_file = Settings(data_dir=data_dir).admin_token_file
    try:
        return token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CliError(f"a server holds the store, and no admin token was given: pass "
                       f"--token, set {TOKEN_ENV}, or make {token_file} readable ({exc})") from exc


def create_online(data_dir: Path, url: str, token: str, timeout: float) -> dict[str, Any]:
    import httpx

    endpoint = url.rstrip("/") + "/v1/admin/snapshots"
    try:
        response = httpx.post(endpoint, headers={"Authorization": f"Bearer {token}"},
                              timeout=timeout)
    except httpx.HTTPError as exc:
        raise CliError(f"the store in {data_dir} is locked by a running server, and the "
                       f"server at {url} did not answer ({exc}); give its --url") from exc
    if response.status_code != 201:
        try:
            detail = response.json().get("detail") or response.text
        except ValueError:
            detail = response.text
        raise CliError(f"server at {url} refused the snapshot: HTTP {response.status_code} "
                       f"{detail}")
    result: dict[str, Any] = response.json()
    return result


def create(args: argparse.Namespace) -> dict[str, Any]:
    if args.url is None:
        try:
            return create_offline(args.data_dir)
        except StorageError as exc:
            if not _is_lock_error(exc):
                raise
    url = args.url or DEFAULT_URL
    return create_online(args.data_dir, url, _token(args.data_dir, args.token), args.timeout)


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def listing(data_dir: Path) -> list[dict[str, Any]]:
    live = data_dir / ROCKSDB_DIR
    rows = []
    for info in list_snapshots(data_dir / SNAPSHOTS_DIR):
        usage = disk_usage(info, live if live.is_dir() else None)
        rows.append({"snapshotId": info.snapshot_id, "path": str(info.path),
                     "createdAt": info.created_at, "totalBytes": usage.total_bytes,
                     "pinnedBytes": usage.pinned_bytes, "exclusiveBytes": usage.exclusive_bytes})
    return rows


def _print_listing(rows: list[dict[str, Any]]) -> None:
    if not rows:
        print("no snapshots")
        return
    print(f"{'SNAPSHOT':<28} {'CREATED (UTC)':<20} {'SIZE':>10} {'PINNED':>10} {'FREES':>10}")
    for r in rows:
        created = datetime.fromtimestamp(r["createdAt"] / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        print(f"{r['snapshotId']:<28} {created:<20} {_size(r['totalBytes']):>10} "
              f"{_size(r['pinnedBytes']):>10} {_size(r['exclusiveBytes']):>10}")
    print(f"pinned: disk the live DB no longer uses, kept by snapshots "
          f"({_size(sum(r['pinnedBytes'] for r in rows))} in all); frees: what removing "
          f"that snapshot alone gives back")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.action == "create":
            result: Any = create(args)
            text = f"snapshot {result['snapshotId']} at {result['path']}"
        elif args.action == "list":
            result = listing(args.data_dir)
            if not args.json:
                _print_listing(result)
                return 0
            text = ""
        else:
            remove_snapshot(args.data_dir / SNAPSHOTS_DIR, args.snapshot_id)
            result = {"removed": args.snapshot_id}
            text = f"removed snapshot {args.snapshot_id}"
    except CliError as exc:
        print(f"hourglass snapshot: {exc}", file=sys.stderr)
        return exc.status
    except (NotFound, InvalidArgument) as exc:
        print(f"hourglass snapshot: {exc.detail}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidArgument) else 1
    except HourglassError as exc:
        print(f"hourglass snapshot: {args.action} failed: {exc.detail}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1) if args.json else text)
    return 0
