"""``hourglass bench NAME``: runs NAME's ``main(argv)``; ``all`` runs the quick ones in turn.

The quick ones are modules (bench/NAME.py). ``soak`` (minutes of sustained load) and
``crash`` (the server killed -9 N times) are packages run on their own, never by ``all``:
``hourglass bench crash --kills 5`` is ``python -m bench.crash --kills 5``. The peers
comparison (``python -m bench.peers.run``, which needs redis-server and PostgreSQL) is not
dispatched here."""

from __future__ import annotations

import importlib
import sys

# name -> the module whose main(argv) runs it
BENCHMARKS = {name: f"bench.{name}" for name in ("storage", "engine", "http", "breakdown", "native",
                                                     "footprint", "analysis", "groups")}
SEPARATE = {**{name: f"bench.{name}.__main__" for name in ("soak", "crash")},
            "timeline": "bench.timeline",  # 10 M messages written first: minutes
            "restart": "bench.restart",  # 10 M messages written first, then restarts: minutes
            "backlog": "bench.backlog"}  # millions of sends and their compactions: minutes
MODULES = {**BENCHMARKS, **SEPARATE}


def main(argv: list[str]) -> int:
    names = (*MODULES, "all")
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: hourglass bench {{{','.join(names)}}} [options]\n"
              f"  quick: {', '.join(BENCHMARKS)} ('all' runs them in turn); on their own: "
              f"{', '.join(SEPARATE)}. 'hourglass bench NAME --help' for NAME's options.")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"hourglass bench: unknown benchmark {name!r}; choose from {', '.join(names)}",
              file=sys.stderr)
        return 2
    status = 0
    for module_name in BENCHMARKS.values() if name == "all" else (MODULES[name],):
        status |= int(importlib.import_module(module_name).main(rest) or 0)
    return status
