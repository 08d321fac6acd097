"""Issue 32, finding 7 (the low ones), over real HTTP: hot-route integers take ASCII digits
only, ``/metrics`` may require a token, ``/docs`` runs under a strict Content-Security-Policy.
Each test here failed on the code before its fix."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import load_settings
from tests.support.live import ADMIN, CONSUMER, PRODUCER, Live


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    doc: dict[str, Any] = response.json()
    assert doc["code"] == code, doc
    return doc


# percent-encoded, as a client sends them: '+' would otherwise arrive as a space
NOT_ASCII_INTEGERS = ("%2B1_0", "1_0", "%2B3", "%207", "7%20", "%D9%A3",  # ARABIC-INDIC THREE
                      "%EF%BC%93", "3.0", "0x3", "")  # FULLWIDTH THREE


@pytest.mark.parametrize("path", [
    "/v1/topics/orders.a/messages?offset={}",
    "/v1/topics/orders.a/messages?offset=0&max={}",
    "/v1/topics/orders.a/messages?offset=0&waitMs={}",
    "/v1/topics/orders.a/groups/g/dead-letters?offset={}",
    "/v1/topics/orders.a/messages:stream?offset=0&durationMs={}",
])
def test_hot_route_integers_are_ascii_digits_only(shared_live: Live, path: str) -> None:
    with shared_live.client(CONSUMER) as client:
        for raw in NOT_ASCII_INTEGERS:
            doc = problem(client.get(path.format(raw)), 400, "INVALID_ARGUMENT")
            assert "ASCII digits" in doc["detail"], (raw, doc)
        doc = problem(client.get(path.format("-1")), 400, "INVALID_ARGUMENT")  # a number, refused
        assert "between" in doc["detail"], doc
        doc = problem(client.get(path.format("9" * 400)), 400, "INVALID_ARGUMENT")
        assert "between" in doc["detail"] and len(doc["detail"]) < 200, doc


def test_hot_route_integers_in_ascii_digits_still_work(shared_live: Live) -> None:
    with shared_live.client(ADMIN) as admin:
        assert admin.post("/v1/topics/orders.b/messages",
                          json={"body": "x", "msgId": "m1"}).status_code == 201
        shared_live.broker.drain()
        r = admin.get("/v1/topics/orders.b/messages?offset=000&max=0010&waitMs=0")
        assert r.status_code == 200, r.text
        assert [m["msgId"] for m in r.json()["messages"]] == ["m1"]


def test_metrics_are_open_by_default_and_name_topics(shared_live: Live) -> None:
    with shared_live.client(ADMIN) as admin, shared_live.client(None) as anonymous:
        assert admin.post("/v1/topics/orders.metered/messages",
                          json={"body": "x", "msgId": "m1", "delayMs": 60_000}).status_code == 201
        r = anonymous.get("/metrics")
        assert r.status_code == 200 and 'topic="orders.metered"' in r.text


def test_metrics_may_require_an_admin_token(live_factory: Callable[..., Live],
                                            tmp_path: Path) -> None:
    env = {"HOURGLASS_DATA_DIR": str(tmp_path / "d"), "HOURGLASS_METRICS_REQUIRE_TOKEN": "true"}
    assert load_settings(env=env).metrics_require_token is True
    assert load_settings(env={}).metrics_require_token is False
    live = live_factory(metrics_require_token=True)
    with live.client(None) as anonymous, live.client("not-a-token-0123456789") as stranger, \
            live.client(CONSUMER) as consumer, live.client(PRODUCER) as producer, \
            live.client(ADMIN) as admin:
        assert admin.post("/v1/topics/orders.metered/messages",
                          json={"body": "x", "msgId": "m1", "delayMs": 60_000}).status_code == 201
        for client in (anonymous, stranger):
            r = client.get("/metrics")
            problem(r, 401, "UNAUTHORIZED")
            assert "orders.metered" not in r.text
        for client in (consumer, producer):  # the labels name every tenant's topics
            problem(client.get("/metrics"), 403, "FORBIDDEN")
        r = admin.get("/metrics")
        assert r.status_code == 200 and 'topic="orders.metered"' in r.text, r.text
        for path in ("/healthz", "/readyz"):  # the probes stay open
            assert anonymous.get(path).status_code == 200
        spec = admin.get("/openapi.json").json()["paths"]["/metrics"]["get"]
        assert {"401", "403"} <= set(spec["responses"])


class _Page(HTMLParser):
    """The <script> and <link> elements of a page, and every URL it names."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.links: list[dict[str, str | None]] = []
        self.urls: list[str] = []
        self._script: dict[str, str | None] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.urls += [v for k, v in attrs if k in ("src", "href", "action") and v is not None]
        if tag == "script":
            self._script, self._text = found, ""
        elif tag == "link":
            self.links.append(found)

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, self._text))
            self._script = None


def _digest(algorithm: str, data: bytes) -> str:
    return f"{algorithm}-" + base64.b64encode(hashlib.new(algorithm, data).digest()).decode()


def test_docs_run_only_pinned_scripts_under_a_strict_policy(shared_live: Live) -> None:
    """The dashboard's token is in this origin's sessionStorage: /docs may run nothing but
    a pinned Swagger UI release (integrity-checked) and its own hashed lines, and may call
    only its own origin."""
    with shared_live.client(None) as anonymous:
        r = anonymous.get("/docs")
        assert anonymous.get("/openapi.json").status_code == 200  # what the page reads
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    policy = {d.split()[0]: d.split()[1:]
              for d in r.headers["content-security-policy"].split(";") if d.strip()}
    assert policy["default-src"] == ["'none'"]
    assert policy["connect-src"] == ["'self'"] and policy["frame-ancestors"] == ["'none'"]
    assert policy["base-uri"] == ["'none'"] and policy["form-action"] == ["'none'"]
    assert set(policy["img-src"]) <= {"'self'", "data:"}
    assert r.headers["x-content-type-options"] == "nosniff"
    script_src = policy["script-src"]
    for source in script_src:  # whole files or digests: no host, scheme or keyword
        assert source.startswith("'sha256-") or re.fullmatch(
            r"https://cdn\.jsdelivr\.net/npm/swagger-ui-dist@\d+\.\d+\.\d+/[\w.-]+\.js", source
        ), source
    page = _Page()
    page.feed(r.text)
    assert len(page.scripts) == 2
    for attrs, text in page.scripts:
        if attrs.get("src"):
            assert attrs["src"] in script_src and attrs.get("crossorigin") == "anonymous"
            integrity = attrs.get("integrity") or ""
            assert re.fullmatch(r"sha384-[A-Za-z0-9+/]{64}", integrity), attrs
        else:
            assert f"'{_digest('sha256', text.encode())}'" in script_src
    sheets = [link for link in page.links if link.get("rel") == "stylesheet"]
    assert sheets and all(re.fullmatch(r"sha384-[A-Za-z0-9+/]{64}", s.get("integrity") or "")
                          and s["href"] in policy["style-src"] for s in sheets)
    for url in page.urls:  # nothing else from elsewhere (the favicon was fastapi's site)
        assert url.startswith(("data:", "/")) or url in script_src or url in policy["style-src"]
