"""The lean install: the analysis and the benchmarks are extras. ``hourglass analyze`` says
what to install when its dependencies are missing; ``hourglass bench`` runs from the source
checkout of an editable install, whatever the working directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main as hourglass


@pytest.mark.parametrize("module", ["pyspark", "pandas", "matplotlib"])
def test_analyze_without_an_analysis_dependency_says_what_to_install(
        module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: importing it fails
    out = tmp_path / "report"
    assert hourglass(["analyze", str(tmp_path / "snapshot"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hourglass analyze: needs {module},")
    assert "pip install 'hourglass[analysis]'" in err
    assert not out.exists()


def test_bench_runs_from_outside_the_checkout(tmp_path: Path) -> None:
    # -m app.cli from elsewhere: app comes from the install, bench/ only from the checkout
    done = subprocess.run([sys.executable, "-m", "app.cli", "bench", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: hourglass bench {storage,")
