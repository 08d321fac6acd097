"""The packages depend one way: app -> api -> scheduler -> storage (spark_jobs reads storage
only; tests -> bench; what both share lives in bench/support). A module importing against that direction fails here, naming
the import."""

from __future__ import annotations

import ast
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


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path``, lazy ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_one_way(package: str) -> None:
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {name}"
             for path in sorted((ROOT / package).rglob("*.py"))
             for line, name in imported_packages(path) if name in FORBIDDEN[package]]
    assert wrong == []


def test_a_wrong_import_is_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from app.settings import Settings\n")
    assert imported_packages(module) == [(2, "app")]
