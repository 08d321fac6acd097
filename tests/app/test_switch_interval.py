"""``gil_switch_interval_us`` (app/settings.py): ``hourglass serve`` sets the interpreter's
switch interval from it before it builds the engine (default: CPython's 5 ms)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import app.wiring
from app import server
from app.settings import load_settings
from storage.errors import InvalidArgument


def test_parsed_and_checked() -> None:
    assert load_settings(env={}).gil_switch_interval_us == 5000
    assert load_settings(env={"HOURGLASS_GIL_SWITCH_INTERVAL_US": "20000"}
                         ).gil_switch_interval_us == 20000
    with pytest.raises(InvalidArgument):
        load_settings(env={"HOURGLASS_GIL_SWITCH_INTERVAL_US": "0"})


def test_serve_sets_it_before_building_the_engine(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []

    def build_app(settings: object) -> None:  # stands in for the engine: stop right there
        seen.append(sys.getswitchinterval())
        raise InvalidArgument("stop here")

    monkeypatch.setattr(app.wiring, "build_app", build_app)
    monkeypatch.setenv("HOURGLASS_GIL_SWITCH_INTERVAL_US", "12000")
    monkeypatch.setenv("HOURGLASS_ADMIN_TOKEN", "switch-interval-token-0123456789")
    before = sys.getswitchinterval()
    try:
        assert server.main(["--data-dir", str(tmp_path / "data")]) == 2
    finally:
        sys.setswitchinterval(before)
    assert seen == [pytest.approx(0.012)]
