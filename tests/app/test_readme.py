"""The README's "A first session", run as written against a real ``hourglass serve``.

Each ``$`` command of its console blocks runs in bash (curl, the shell variables it set
before) against a server started as ``make run`` starts it (``./data``, a generated admin
token), on a free port instead of 7740. Each answer the README shows must match the real one:
the fields it shows appear in the answer in that order, with the same values, except the ones
that differ from run to run (times, handles, receipts); those are carried into the later
commands that quote them, as a reader copying the session would. A README whose commands
or answers drift from the server fails here."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.test_data_at_rest import wait_ready
from tests.api.test_serve import free_port

REPO = Path(__file__).resolve().parents[2]

# fields whose value is new in every run: matched by name only, and remembered so that a
# later command quoting the README's value is given the real one
VOLATILE = {"deliverAt", "bornAt", "storedAt", "leaseUntil", "cancelHandle", "receipt",
            "detail", "instance"}
_PAIR = re.compile(r'"(\w+)":("(?:[^"\\]|\\.)*"|-?\d+|true|false|null|\[\])')


def session_steps(readme: str) -> list[tuple[str, str]]:
    """(command, the answer shown after it) for each ``$`` line of the section's console
    blocks; a command continued with a trailing backslash is joined."""
    section = readme.split("\n## A first session", 1)[1].split("\n## ", 1)[0]
    steps: list[tuple[str, str]] = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        continued = False
        for line in block.splitlines():
            command, shown = steps[-1] if steps else ("", "")
            if line.startswith("$ "):
                steps.append((line[2:], ""))
            elif continued:
                steps[-1] = (command + "\n" + line, shown)
            else:
                steps[-1] = (command, (shown + "\n" + line).strip())
            continued = line.endswith("\\")
    return steps


def shown_pairs(text: str) -> list[tuple[str, str]]:
    return _PAIR.findall(text)


def answer_pairs(value: object, key: str = "") -> list[tuple[str, str]]:
    """(field, its value as compact JSON) for every scalar field, in document order."""
    if isinstance(value, dict):
        return [pair for k, v in value.items() for pair in answer_pairs(v, k)]
    if isinstance(value, list) and value:
        return [pair for v in value for pair in answer_pairs(v, key)]
    return [(key, json.dumps(value, separators=(",", ":"), ensure_ascii=False))] if key else []


def test_the_first_session_runs_as_written(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.fail("curl is needed to run the README's session as written (.ci/run installs it)")
    steps = session_steps((REPO / "README.md").read_text())
    assert len(steps) >= 7, steps
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOURGLASS_")}
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
                            env={**env, "PYTHONPATH": str(REPO)}, cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, tmp_path / "server.log")
        prelude: list[str] = []  # the commands that set shell variables
        real: dict[str, str] = {}  # a volatile value the README shows -> the real one
        for command, shown in steps:
            command = command.replace("localhost:7740", f"127.0.0.1:{port}")
            for readme_value, value in real.items():
                command = command.replace(readme_value, value)
            run = subprocess.run(["bash", "-c", "\n".join([*prelude, command])], cwd=tmp_path,
                                 capture_output=True, text=True, timeout=60, env=env)
            assert run.returncode == 0, (command, run.stderr)
            if not shown:
                prelude.append(command)
                continue
            got = answer_pairs(json.loads(run.stdout))
            at = 0
            for key, value in shown_pairs(shown):
                while at < len(got) and got[at][0] != key:
                    at += 1
                assert at < len(got), f"{command}\nanswered {run.stdout}\nno {key!r} as shown"
                if key in VOLATILE:
                    real[value.strip('"')] = got[at][1].strip('"')
                else:
                    assert got[at][1] == value, f"{command}\nanswered {run.stdout}\n{key}"
                at += 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
