"""The HTTP transport's fence (api/transport/): no other module of api reaches into uvicorn or
spells out HTTP/1.1 framing; the installed uvicorn is the tested one and has every internal
the transport relies on; without them the server warns once and serves on uvicorn's own
protocol, streams and big answers included, over real HTTP."""

from __future__ import annotations

import ast
import base64
import logging
import os
import sys
import tomllib
from pathlib import Path

import msgspec
import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from api.routes.consume import pull_msgpack, pull_result
from api.transport import TESTED_UVICORN, check_internals, chunk
from api.transport import limits as transport_limits
from scheduler.clock import FakeClock
from tests.api.test_stream import STREAM, TOPIC, Frames, pulled, send
from tests.support.live import ADMIN, CONSUMER, T0, make_settings, serve

ROOT = Path(__file__).resolve().parents[2]
TRANSPORT = ROOT / "api" / "transport"
#: the one module allowed to import uvicorn's internals
INTERNALS_MODULE = TRANSPORT / "uvicorn_httptools.py"


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _crlf(node: ast.Constant) -> bool:
    """A literal holding a CRLF: HTTP/1.1 framing."""
    value = node.value
    return ("\r\n" in value if isinstance(value, str)
            else isinstance(value, bytes) and b"\r\n" in value)


def test_only_the_transport_reaches_into_uvicorn_or_frames_http() -> None:
    wrong = []
    for path in sorted((ROOT / "api").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT)
        for line, module in _imports(tree):
            top = module.split(".")[0]
            if top == "httptools" or module.startswith("uvicorn.protocols") or (
                    top == "uvicorn" and not path.is_relative_to(TRANSPORT)):
                if path != INTERNALS_MODULE:
                    wrong.append(f"{where}:{line} imports {module}")
        if path.is_relative_to(TRANSPORT):
            continue
        wrong.extend(f"{where}:{node.lineno} spells out HTTP framing {node.value!r:.40}"
                     for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and _crlf(node))
    assert not wrong, "outside api/transport/:\n" + "\n".join(wrong)


def test_the_installed_uvicorn_is_the_tested_one_and_has_every_internal() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pins = [Requirement(d) for d in pyproject["project"]["dependencies"]
            if Requirement(d).name == "uvicorn"]
    assert len(pins) == 1 and pins[0].specifier == SpecifierSet(TESTED_UVICORN)
    upper = [s for s in pins[0].specifier if s.operator == "<"]
    assert upper, "a ceiling: the next minor is untested"
    assert uvicorn.__version__ in SpecifierSet(TESTED_UVICORN)
    assert check_internals() == []


def test_the_check_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_limits, "REQUIRED_INTERNALS", (
        *transport_limits.REQUIRED_INTERNALS,
        ("HttpToolsProtocol", ("on_gone", "__init__(no_such_parameter)")),
        ("NoSuchCycle", ("send",))))
    assert check_internals() == [
        "HttpToolsProtocol.on_gone", "HttpToolsProtocol.__init__(no_such_parameter)",
        f"{transport_limits.HTTPTOOLS_IMPL}.NoSuchCycle"]
    monkeypatch.setitem(sys.modules, transport_limits.HTTPTOOLS_IMPL, None)
    (missing,) = check_internals()
    assert missing.startswith(f"{transport_limits.HTTPTOOLS_IMPL} cannot be imported")


def test_a_chunk_is_http_1_1_chunked_framing() -> None:
    assert b"".join(chunk(b"x" * 26)) == b"1a\r\n" + b"x" * 26 + b"\r\n"


@pytest.mark.parametrize("gone", ["a method", "the module"])
def test_without_the_internals_it_warns_once_and_serves_on_uvicorns_protocol(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        gone: str) -> None:
    # an untested uvicorn: a method the guarded protocol overrides is gone, or the whole
    # httptools_impl module (its import fails)
    if gone == "the module":
        monkeypatch.setitem(sys.modules, transport_limits.HTTPTOOLS_IMPL, None)
        said = "cannot be imported"
    else:
        monkeypatch.setattr(transport_limits, "REQUIRED_INTERNALS", (
            ("HttpToolsProtocol", ("on_headers_complete", "on_headers_gone")),))
        said = "HttpToolsProtocol.on_headers_gone"
    caplog.set_level(logging.WARNING, logger="hourglass.api")
    with serve(make_settings(tmp_path / "data"), FakeClock(T0)) as live, \
            live.client(CONSUMER) as consumer, live.client(ADMIN) as c:
        warned = [r for r in caplog.records if "lacks internals" in r.getMessage()]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING
        assert said in warned[0].getMessage()
        pusher = live.app.state.ctx.pusher
        # a stream: a frame at once, then one per delivery, each what a pull answers
        with consumer.stream("GET", STREAM, params={"durationMs": 30_000, "max": 2}) as r:
            assert r.status_code == 200
            frames = Frames(r)
            assert frames.next() == {"messages": [], "nextOffset": 0}
            send(c, range(3), delay_ms=1000)
            live.advance(1000)
            for at in (0, 2):
                assert frames.next() == pulled(c, at, {"Accept": "application/json"}, 2)
            assert pusher.parked == 0  # (no socket to lend: the loop wrote every frame)
        assert pusher.totals()[0] == 0
        # a big answer: made piece by piece, the bytes of the answer made at once
        bodies = [{"bodyBase64": base64.b64encode(os.urandom(20_000)).decode()}
                  for _ in range(80)]
        assert c.post(f"/v1/topics/{TOPIC}/messages:batch",
                      json={"messages": bodies}).status_code == 201
        live.broker.drain()
        payloads = live.broker.read(TOPIC, 3, 1000)
        assert len(payloads) == 80
        for accept, whole in (
                ("application/json", msgspec.json.encode(pull_result(payloads, 3, False))),
                ("application/x-msgpack", pull_msgpack(payloads, 3, False))):
            r = c.get(f"/v1/topics/{TOPIC}/messages", params={"offset": 3, "max": 1000},
                      headers={"Accept": accept})
            assert r.status_code == 200 and "content-length" not in r.headers
            assert r.content == whole
