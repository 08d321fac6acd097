"""Storage's compiled hot paths, when they were built: ``native`` is storage/_native (Cython,
built by pip from source with the machine's C compiler; see setup.py) or None.

Every function there has a pure-Python twin next to its caller (storage/log_format.py,
storage/commitlog.py, storage/records.py, storage/batch.py) that gives the same bytes
(tests/storage/test_native.py). The other layers have their own pair: scheduler/native.py
and api/native.py, which also follow ``HOURGLASS_PURE_PYTHON=1``: in the environment, it
makes the process use every twin even when the extensions are there.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_PYTHON_ENV = "HOURGLASS_PURE_PYTHON"


def pure_python() -> bool:
    """Whether ``HOURGLASS_PURE_PYTHON`` asks for the pure-Python twins."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def load(package: str) -> ModuleType | None:
    """``package``'s compiled module (``package._native``), or None: not built, refused at
    import, or ``HOURGLASS_PURE_PYTHON`` set."""
    if pure_python():
        return None
    try:
        return importlib.import_module(f"{package}._native")
    except ImportError:
        return None


native: ModuleType | None = load("storage")
