"""schemathesis 3.x against the running server's /openapi.json, in a bounded run: no 5xx,
status codes, content types, headers and bodies conform to the document, invalid input is
refused, and auth is not ignored (``--checks all``; positive and negative data)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.live import ADMIN, Live

REPO = Path(__file__).resolve().parents[2]
MAX_EXAMPLES = 30


@pytest.mark.slow
def test_schemathesis_run(live: Live) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "schemathesis"), "run",
         f"{live.base_url}/openapi.json", "--checks", "all", "-D", "all",
         "--experimental=openapi-3.1", "--hypothesis-max-examples", str(MAX_EXAMPLES),
         "--hypothesis-derandomize", "--hypothesis-suppress-health-check", "all",
         "-H", f"Authorization: Bearer {ADMIN}", "--no-color", "--request-timeout", "20000"],
        env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
             "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"},
        cwd=REPO, capture_output=True, text=True, timeout=280, check=False,
    )
    tail = result.stdout[-6000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    assert "FAILED" not in result.stdout, tail
    with live.client(token=None) as c:
        spec = c.get("/openapi.json").json()
    operations = sum(len(item) for item in spec["paths"].values())
    summary = re.search(r"=+ (\d+) passed in [\d.]+s =+", result.stdout)
    assert summary is not None, tail
    assert int(summary.group(1)) == operations, tail  # every operation ran, none failed
