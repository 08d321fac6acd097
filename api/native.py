"""The HTTP layer's compiled wire encoders, when they were built: ``native`` is api/_native
(Cython, built by pip from source; see setup.py) or None (not built, ``HOURGLASS_PURE_PYTHON=1``:
storage/native.py, or the schemas list a document's fields otherwise than it writes them:
api/wire_keys.py).

Every function there has a pure-Python twin next to its caller (api/routes/consume.py,
api/routes/groups.py, api/routes/messages.py) that gives the same bytes
(tests/api/test_native.py).
"""

from __future__ import annotations

from types import ModuleType

from storage.native import load

native: ModuleType | None = load("api")
