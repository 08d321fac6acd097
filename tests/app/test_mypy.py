"""The type check is part of the test command: ``mypy`` with the project's configuration
passes, and that configuration holds storage and scheduler to everything ``--strict``
turns on (pyproject.toml's [[tool.mypy.overrides]]), so ``mypy --strict storage scheduler``
and plain ``mypy`` cannot drift apart. (A cold run takes about 10 s; with .mypy_cache, < 1 s.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("mypy")
from mypy.main import process_options  # noqa: E402
from mypy.options import Options  # noqa: E402


def _options(*args: str) -> Options:
    return process_options([*args, "x.py"])[1]


def test_strict_is_the_configured_default_for_storage_and_scheduler() -> None:
    plain, strict = _options("--config-file", ""), _options("--config-file", "", "--strict")
    base, want = plain.snapshot(), strict.snapshot()
    strict_flags = sorted(k for k in want if want[k] != base.get(k))
    assert "warn_return_any" in strict_flags  # the comparison sees what --strict changes
    configured = _options("--config-file", str(ROOT / "pyproject.toml"))
    for module in ("storage", "storage.rocks", "scheduler", "scheduler.checkback.registry"):
        got = configured.clone_for_module(module).snapshot()
        assert {k: got[k] for k in strict_flags} == {k: want[k] for k in strict_flags}, module


def test_mypy_passes() -> None:
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
