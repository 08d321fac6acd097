"""The packages depend one way: app -> api -> scheduler -> storage (spark_jobs reads storage
only; tests -> bench; what both share lives in bench/support). A module importing against
that direction fails here, naming the import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: package -> the first-party packages it must not import
FORBIDDEN = {
    "storage": {"scheduler", "api", "app", "spark_jobs", "bench", "tests"},
    "scheduler": {"api", "app", "spark_jobs", "bench", "tests"},
    "api": {"app", "spark_jobs", "bench", "tests"},
    "spark_jobs": {"scheduler", "api", "app", "bench", "tests"},
    "app": {"bench", "tests"},
    # tests import bench (to test it, and bench/support: what both share), never back
    "bench": {"tests"},
}


#: Cython's imports (``import``, ``cimport``, ``from X import``/``cimport``): .pyx and .pxd are
#: not Python, so their lines are read, not parsed (a multi-line import's first line names it)
CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\b"
                           r"|c?import\s+([\w.]+(?:\s*,\s*[\w.]+)*))")


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path``, lazy ones included;
    for a Cython file (.pyx, .pxd), its imports and cimports."""
    if path.suffix in (".pyx", ".pxd"):
        return cython_imports(path)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def cython_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        match = CYTHON_IMPORT.match(text)
        if match and match.group(1) and not match.group(1).startswith("."):
            found.append((number, match.group(1).split(".")[0]))
        elif match and match.group(2):
            found += [(number, name.strip().split(".")[0]) for name in match.group(2).split(",")]
    return found


def sources(package: str) -> list[Path]:
    """Its Python modules and its compiled ones' sources (the hot paths: setup.py)."""
    return sorted(path for pattern in ("*.py", "*.pyx", "*.pxd")
                  for path in (ROOT / package).rglob(pattern))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for path in sources(package)
             for line, name in imported_packages(path) if name in FORBIDDEN[package]]
    assert wrong == []


def test_a_wrong_import_is_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from app.settings import Settings\n")
    assert imported_packages(module) == [(2, "app")]


def test_a_compiled_modules_imports_are_seen(tmp_path: Path) -> None:
    """The compiled hot paths are in the layers too: a .pyx or .pxd that cimports or imports
    from a layer above is found like a .py."""
    module = tmp_path / "m.pyx"
    module.write_text("from libc.stdint cimport uint8_t\n"
                      "from api._native cimport _delivered\n"
                      "cimport scheduler._handles\n"
                      "import app.settings, bench\n"
                      "from storage._msgpack cimport (Item,\n"
                      "                               _head)\n"
                      "from . cimport sibling\n"
                      "    # from app import nothing: a comment\n")
    assert imported_packages(module) == [(1, "libc"), (2, "api"), (3, "scheduler"),
                                         (4, "app"), (4, "bench"), (5, "storage")]
    assert (ROOT / "storage" / "_native.pyx") in sources("storage")
    assert (ROOT / "storage" / "_msgpack.pxd") in sources("storage")
