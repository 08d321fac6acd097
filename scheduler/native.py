"""The scheduler's compiled hot paths, when they were built: ``native`` is scheduler/_native
(Cython, built by pip from source; see setup.py) or None (not built, or
``HOURGLASS_PURE_PYTHON=1``: storage/native.py).

Every function there has a pure-Python twin next to its caller (scheduler/codec.py,
scheduler/intake.py, scheduler/group_state.py, scheduler/timeline.py) that gives the same
bytes (tests/scheduler/test_native.py).
"""

from __future__ import annotations

from types import ModuleType

from storage.native import load

native: ModuleType | None = load("scheduler")
