"""The log's retention settings under the project's naming: engine.commitlog_retention_ms /
HOURGLASS_COMMITLOG_RETENTION_MS and engine.disk_clean_ratio / HOURGLASS_DISK_CLEAN_RATIO,
defaults 72 h and 0.85, bad values refused loudly."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import load_settings
from storage.errors import InvalidArgument


def test_defaults() -> None:
    engine = load_settings(env={}).engine
    assert engine.commitlog_retention_ms == 72 * 3600 * 1000
    assert engine.disk_clean_ratio == 0.85


def test_env_and_toml(tmp_path: Path) -> None:
    engine = load_settings(env={"HOURGLASS_COMMITLOG_RETENTION_MS": "5m",
                                "HOURGLASS_DISK_CLEAN_RATIO": "0.9"}).engine
    assert (engine.commitlog_retention_ms, engine.disk_clean_ratio) == (300_000, 0.9)
    toml = tmp_path / "hourglass.toml"
    toml.write_text('[engine]\ncommitlog_retention_ms = "3d"\ndisk_clean_ratio = 0.7\n')
    engine = load_settings(env={}, config_file=toml).engine
    assert (engine.commitlog_retention_ms, engine.disk_clean_ratio) == (3 * 86_400_000, 0.7)


@pytest.mark.parametrize(("name", "value"), [
    ("HOURGLASS_DISK_CLEAN_RATIO", "1.5"), ("HOURGLASS_DISK_CLEAN_RATIO", "0"),
    ("HOURGLASS_DISK_CLEAN_RATIO", "-0.1"), ("HOURGLASS_DISK_CLEAN_RATIO", "most"),
    ("HOURGLASS_DISK_CLEAN_RATIO", "true"), ("HOURGLASS_COMMITLOG_RETENTION_MS", "-1"),
    ("HOURGLASS_COMMITLOG_RETENTION_MS", "soon"),
])
def test_bad_values_are_refused_naming_the_source(name: str, value: str) -> None:
    with pytest.raises(InvalidArgument, match=name):
        load_settings(env={name: value})
