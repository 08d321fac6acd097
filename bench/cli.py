"""``hourglass bench NAME``: runs bench/NAME.py's ``main(argv)``; ``all`` runs each in turn.

``soak`` (minutes of sustained load) and the peers comparison (``python -m bench.peers.run``,
which needs redis-server and PostgreSQL) are run on their own, not by ``all``."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = ("storage", "engine", "http", "analysis")
SEPARATE = ("soak",)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: hourglass bench {{{','.join((*BENCHMARKS, *SEPARATE, 'all'))}}} [options]")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in (*BENCHMARKS, *SEPARATE, "all"):
        print(f"hourglass bench: unknown benchmark {name!r}; choose from "
              f"{', '.join((*BENCHMARKS, *SEPARATE, 'all'))}", file=sys.stderr)
        return 2
    status = 0
    for bench in BENCHMARKS if name == "all" else (name,):
        module = importlib.import_module(f"bench.{bench}")
        status |= int(module.main(rest) or 0)
    return status
