"""Headless Chromium driven by selenium against a real hourglass (tests/support/live.py's
``serve``). Skipped, saying what to install, where Chromium or chromedriver is missing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

OUTPUT = Path(__file__).resolve().parent.parent / "output" / "browser"  # gitignored
ZONE = "America/St_Johns"  # the browser's zone: -03:30, so UTC-aligned hours would show :30
INSTALL = ("the browser tests need Chromium and its driver: apt-get install -y chromium "
           "chromium-driver (Debian), and selenium (pip install -e '.[dev]')")


def _binaries() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = _binaries() is None
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing = True
    for item in items:
        if "tests/browser/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)
            if missing:
                item.add_marker(pytest.mark.skip(reason=INSTALL))


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the session, in the zone ``ZONE``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = _binaries()
    assert found is not None
    chromium, chromedriver = found
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1800", "--no-first-run",
                "--disable-extensions", "--disable-background-networking"):
        options.add_argument(arg)
    service = Service(executable_path=chromedriver, env={**os.environ, "TZ": ZONE})
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def screenshot(browser: Any, request: pytest.FixtureRequest) -> Iterator[Path]:
    """Each test leaves a screenshot of the page as it ended, named after the test."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    path = OUTPUT / f"{request.node.name}.png"
    yield path
    browser.save_screenshot(str(path))
