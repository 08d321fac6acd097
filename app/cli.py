"""The ``hourglass`` command line: serve, bench, snapshot, analyze, verify.

Each subcommand lives in its own module and is imported only when it runs, so
``hourglass --help`` stays fast and a missing optional piece fails only its own command.
``bench`` lives in the source checkout only (bench/ is not installed): an editable install
finds it beside the installed packages.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

#: the source checkout of an editable install: bench/ and tests/ are there
CHECKOUT = Path(__file__).resolve().parents[1]

# subcommand -> "module:function"; each function takes (argv: list[str]) and returns an exit code
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("app.server:main", "run the HTTP server"),
    "bench": ("bench.cli:main", "benchmarks: storage, engine, http, analysis, all; soak, crash"),
    "snapshot": ("app.snapshot_cli:main", "create, list or remove RocksDB snapshots"),
    "analyze": ("spark_jobs.analyze:main", "run the compaction-impact analysis on snapshots"),
    "verify": ("app.verify_cli:main", "check the CommitLog and the store for corruption"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="hourglass",
        description="A durable server for delayed, scheduled and transactional messages.",
        epilog="\n".join(f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=sorted(COMMANDS), metavar="COMMAND")
    if not args or args[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if args else 2
    ns = parser.parse_args(args[:1])
    if ns.command == "serve" and argv is None:  # this process runs the server: its malloc
        from app import malloc

        env = malloc.early_env(os.environ)
        if env is not None:
            malloc.reexec(env)  # (app/malloc.py; never returns)
    target, _ = COMMANDS[ns.command]
    module_name, func_name = target.split(":")
    if ns.command == "bench" and importlib.util.find_spec("bench") is None:
        if not (CHECKOUT / "bench" / "cli.py").is_file():
            print("hourglass bench: the benchmarks run from a source checkout of hourglass "
                  "(pip install -e '.[bench]' there)", file=sys.stderr)
            return 2
        sys.path.insert(0, str(CHECKOUT))
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(args[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
