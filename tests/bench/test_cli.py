"""``hourglass bench NAME``: the dispatch of every benchmark, including the separately run
soak and crash packages, through the real ``hourglass`` command line."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main as hourglass
from bench import cli


def _hourglass(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_help_lists_every_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    assert hourglass(["bench", "--help"]) == 0
    usage = capsys.readouterr().out
    for name in ("storage", "engine", "http", "analysis", "soak", "crash", "all"):
        assert name in usage
    assert hourglass(["bench"]) == 2  # no name: the usage, and a usage error


def test_unknown_benchmark_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert hourglass(["bench", "crsh", "--kills", "5"]) == 2
    assert "unknown benchmark 'crsh'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(cli.MODULES))
def test_every_name_maps_to_a_module_with_main(name: str) -> None:
    module = importlib.import_module(cli.MODULES[name])
    assert callable(module.main)


def test_all_runs_the_quick_benchmarks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, list[str]]] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def main(self, argv: list[str]) -> int:
            ran.append((self.name, argv))
            return 1 if self.name == "bench.http" else 0

    monkeypatch.setattr(cli.importlib, "import_module", Recorder)
    assert cli.main(["all", "--quick"]) == 1  # one failing benchmark fails the run
    assert ran == [(module, ["--quick"]) for module in cli.BENCHMARKS.values()]
    assert not set(cli.SEPARATE.values()) & {name for name, _ in ran}


def test_crash_help_reaches_the_crash_harness() -> None:
    done = _hourglass("bench", "crash", "--help")
    assert done.returncode == 0, done.stderr
    assert "--kills" in done.stdout and "kill -9" in done.stdout


def test_crash_rejects_a_bad_option() -> None:
    done = _hourglass("bench", "crash", "--kills", "five")
    assert done.returncode == 2
    assert "--kills" in done.stderr and "invalid int value" in done.stderr


@pytest.mark.slow
def test_a_tiny_crash_run(tmp_path: Path) -> None:
    """One kill -9 of the real server (plus the final torn tail), then the verdict."""
    done = _hourglass("bench", "crash", "--kills", "1", "--burst", "200", "--storm", "50",
                      "--workdir", str(tmp_path), timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "VERDICT: every guarantee held" in done.stdout
    assert "2 kill -9" in done.stdout  # the one asked for, and the final torn tail's
    assert (tmp_path / "server.log").exists()


def test_bench_native_pairs_both_paths(tmp_path: Path) -> None:
    """``hourglass bench native`` times each stage through the compiled functions and
    through their twins, and leaves the engine on the compiled ones."""
    import scheduler.committer as committer
    from api.native import native as api_native
    from bench import native as bench_native
    from scheduler.codec import _log_payloads_native
    from scheduler.native import native as scheduler_native
    from storage.native import native

    if None in (native, scheduler_native, api_native):
        pytest.skip("the compiled hot paths are not built")
    out = tmp_path / "native.json"
    assert bench_native.main(["--rounds", "2", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(figures) == {"commit", "pull", "msgpack pull"}
    for stage in figures.values():
        assert stage["compiled"] > 0 and stage["python"] > 0
    assert committer.log_payloads is _log_payloads_native
