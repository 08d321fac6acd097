"""`hourglass analyze` never writes into a snapshot (it runs on a read-only tree, contents and
times unchanged), and a damaged snapshot or a wrong directory is one clear line, before Spark
starts, with nothing left behind."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import main as hourglass
from tests.spark.conftest import Generated


def _state(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file and directory under ``root``: mode, mtime (ns) and content hash."""
    out = {}
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(root))] = (st.st_mode, st.st_mtime_ns, digest)
    return out


@pytest.fixture
def read_only_copy(workload: Generated, tmp_path: Path) -> Iterator[Path]:
    """A copy of the workload snapshot on a read-only tree: a read-only bind mount when we
    may mount (root), else every file and directory without write permission."""
    src = tmp_path / "src" / workload.snapshot.path.name
    shutil.copytree(workload.snapshot.path, src)
    if os.geteuid() == 0:
        mount = tmp_path / "ro" / src.name
        mount.mkdir(parents=True)
        subprocess.run(["mount", "--bind", str(src), str(mount)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(mount)], check=True)
            with pytest.raises(OSError, match="Read-only file system"):
                (mount / "probe").write_text("x")
            yield mount
        finally:
            subprocess.run(["umount", str(mount)], check=True)
    else:
        paths = [src, *src.rglob("*")]
        for p in paths:
            p.chmod(p.stat().st_mode & ~0o222)
        try:
            yield src
        finally:
            for p in paths:
                p.chmod(p.stat().st_mode | 0o200)


@pytest.mark.spark
def test_analyze_runs_on_a_read_only_snapshot_and_changes_nothing(
        spark: Any, read_only_copy: Path, tmp_path: Path) -> None:
    before = _state(read_only_copy)
    out = tmp_path / "report"
    assert hourglass(["analyze", str(read_only_copy), "--out", str(out), "--quiet",
                      "--partitions", "2"]) == 0
    assert (out / "report.json").is_file() and (out / "report.html").is_file()
    assert _state(read_only_copy) == before


def _truncate_largest_sst(db_dir: Path) -> Path:
    sst = max(db_dir.glob("*.sst"), key=lambda f: f.stat().st_size)
    with open(sst, "r+b") as fh:
        fh.truncate(sst.stat().st_size // 2)
    return sst


@pytest.mark.parametrize("bare", [False, True], ids=["snapshot", "bare-checkpoint"])
def test_a_truncated_sst_is_one_clear_line(workload: Generated, tmp_path: Path, bare: bool,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    snap = tmp_path / workload.snapshot.path.name
    shutil.copytree(workload.snapshot.path / "db" if bare else workload.snapshot.path, snap)
    sst = _truncate_largest_sst(snap if bare else snap / "db")
    out = tmp_path / "out"
    assert hourglass(["analyze", str(snap), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hourglass analyze: ")
    assert sst.name in err and "Traceback" not in err
    assert not out.exists()  # nothing left behind


def test_a_data_directory_is_named_as_such(workload: Generated, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert hourglass(["analyze", str(workload.root), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is a data directory" in err and str(workload.root / "snapshots") in err
    assert not out.exists()
