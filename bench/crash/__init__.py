"""The crash harness: the real server, kill -9 at random moments, torn CommitLog
tails, and a verdict against everything the clients were told.

``python -m bench.crash --kills 200`` is the long run; tests/crash runs a bounded one.
"""

from bench.crash.harness import CrashConfig, CrashReport, run

__all__ = ["CrashConfig", "CrashReport", "run"]
