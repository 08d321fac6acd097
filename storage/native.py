"""The compiled hot paths, when they were built: ``native`` is storage/_native (Cython,
built by pip from source with the machine's C compiler; see setup.py) or None.

Every function there has a pure-Python twin next to its caller (storage/log_format.py,
storage/commitlog.py, scheduler/codec.py, scheduler/timeline.py, api/routes/consume.py,
api/routes/groups.py) that gives the same bytes (tests/storage/test_native.py).
``HOURGLASS_PURE_PYTHON=1`` in the environment makes the process use the twins even when the
extension is there.
"""

from __future__ import annotations

import os
from types import ModuleType

PURE_PYTHON_ENV = "HOURGLASS_PURE_PYTHON"


def _load() -> ModuleType | None:
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    try:
        from storage import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _native


native: ModuleType | None = _load()
