"""The dashboard in a real browser: headless Chromium against a real server with a
known workload. The page's numbers equal the API's, a planted burst shows in the right bar,
cancel from the page cancels, a consumer sees no cancel button, a wrong token is told so, the
page refreshes itself, times are the browser's zone's. Each test leaves a screenshot in
tests/output/browser/."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol
from zoneinfo import ZoneInfo

import httpx
import pytest

from bench.support.hourglass_cluster import TOKEN as CLUSTER_TOKEN
from scheduler.clock import FakeClock
from scheduler.timeline import HOUR, MINUTE
from tests.browser.conftest import ZONE
from tests.support.live import (
    ADMIN,
    CONSUMER,
    PRODUCER,
    T0,
    Live,
    make_settings,
    serve,
)

BURST_AT = T0 + 5 * HOUR + 17 * MINUTE + 30_000  # 300 messages, all due in this second
BURST = 300
WAIT_S = 20  # for the page's own fetches (real time, not a due time)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A server with a known workload: a spread of messages over 24 h on three topics, a
    burst, deliveries (so lateness), a cancel, a leased message, a dead letter, three half
    messages."""
    settings = make_settings(tmp_path_factory.mktemp("browser") / "data")
    settings = dataclasses.replace(settings, engine=dataclasses.replace(
        settings.engine, max_reconsume_times=0))  # a nack dead-letters at once
    with serve(settings, clock=FakeClock(T0)) as live, live.client() as c:
        for i, topic in enumerate(("orders.a", "orders.b", "orders.c")):
            assert c.post(f"/v1/topics/{topic}/messages:batch", json={"messages": [
                {"body": "x", "msgId": f"{topic}-{j}", "delayMs": 1_000 + j * 37 * MINUTE + i}
                for j in range(39)]}).status_code == 201
        for start in range(0, BURST, 100):
            assert c.post("/v1/topics/orders.burst/messages:batch", json={"messages": [
                {"body": "b", "msgId": f"burst-{j}", "deliverAt": BURST_AT}
                for j in range(start, start + 100)]}).status_code == 201
        assert c.post("/v1/topics/orders.now/messages", json={"body": "now"}).status_code == 201
        assert c.delete("/v1/topics/orders.a/messages/orders.a-5").status_code == 200
        for group in ("billing", "billing", "shipping"):
            assert c.post("/v1/topics/orders.a/transactions", json={
                "body": "t", "producerGroup": group}).status_code == 201
        live.advance(2_000)  # the first message of each topic is delivered
        r = c.post("/v1/topics/orders.now/groups/workers:receive", json={"max": 1})
        assert len(r.json()["messages"]) == 1
        r = c.post("/v1/topics/orders.a/groups/audit:receive", json={"max": 1})
        receipt = r.json()["messages"][0]["receipt"]
        r = c.post("/v1/topics/orders.a/groups/audit:nack", json={"receipts": [receipt]})
        assert r.json()["deadLettered"] == 1
        yield live


class Served(Protocol):
    """A running server the page is opened on (``Live``, or a cluster's ``ServerProcess``)."""

    @property
    def base_url(self) -> str: ...


def open_page(browser: Any, live: Served, token: str, refresh_ms: int = 500) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{live.base_url}/ui/?refresh={refresh_ms}")
    browser.execute_script("sessionStorage.clear()")
    browser.get(f"{live.base_url}/ui/?refresh={refresh_ms}")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "signin-button").click()
    if token in (ADMIN, PRODUCER, CONSUMER, CLUSTER_TOKEN):
        WebDriverWait(browser, WAIT_S).until(ec.visibility_of_element_located((By.ID, "who")))


def wait_for(browser: Any, condition: Any) -> Any:
    """``condition(browser)`` once truthy; elements the page redrew meanwhile are looked up
    again."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, WAIT_S, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(condition)


def value(browser: Any, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.ID, element_id).get_attribute("data-value") or "")


def clock_forms(local: dt.datetime, rest: str) -> tuple[str, ...]:
    """How the browser's locale may write that local time: 24 h, or 12 h with AM/PM."""
    twelve = local.strftime(f"{local.hour % 12 or 12}:{rest} %p")
    return (local.strftime(f"%H:{rest}"), twelve, "0" + twelve)


def api(live: Live, path: str, **params: Any) -> Any:
    with live.client() as c:
        r = c.get(path, params=params)
        assert r.status_code == 200, r.text
        return r.json()


def test_the_pages_numbers_equal_the_apis(browser: Any, server: Live,
                                          screenshot: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, ADMIN, refresh_ms=60_000)  # one look: lateness since start
    wait_for(browser, lambda b: value(b, "pending") != "" and
             b.find_elements(By.CSS_SELECTOR, "#topics-table tbody tr"))
    stats = api(server, "/v1/admin/stats")
    overview = api(server, "/v1/admin/overview")
    for element_id, name in (("pending", "pending"), ("delivered", "delivered"),
                             ("cancelled", "cancelled"), ("parked", "parked"),
                             ("retries", "retries"), ("queue-batches", "deliveryQueueBatches"),
                             ("queue-messages", "deliveryQueueMessages"),
                             ("prepared", "transactionsPrepared")):
        assert int(value(browser, element_id)) == stats[name], element_id
        shown = browser.find_element(By.ID, element_id).text.replace(",", "")
        assert shown.startswith(str(stats[name])), (element_id, shown)
    assert stats["pending"] == 3 * 39 - 3 - 1 + BURST
    assert value(browser, "ready") == "true" and stats["ready"] is True
    assert browser.find_element(By.ID, "delivery-state").text == "running"
    # lateness: the page's first look covers everything since the start, as the stats do
    assert float(value(browser, "lateness-p50")) == stats["latenessP50Ms"]
    assert float(value(browser, "lateness-p99")) == stats["latenessP99Ms"]
    assert int(value(browser, "disk-rocksdb")) > 0 and int(value(browser, "disk-commitlog")) > 0
    rows = {row.get_attribute("data-topic"): {
        cls: row.find_element(By.CSS_SELECTOR, f"td.{cls}").get_attribute("data-value")
        for cls in ("pending", "delivered", "oldest", "leased")}
        for row in browser.find_elements(By.CSS_SELECTOR, "#topics-table tbody tr")}
    assert set(rows) == {t["topic"] for t in overview["topics"]}
    for topic in overview["topics"]:
        row = rows[topic["topic"]]
        assert int(row["pending"]) == stats["pendingByTopic"].get(topic["topic"], 0)
        assert int(row["delivered"]) == topic["delivered"]
        assert row["oldest"] == str(stats["oldestPendingByTopic"].get(topic["topic"], ""))
    assert rows["orders.now"]["leased"] == "1" and rows["orders.now"]["delivered"] == "1"
    tx = {row.get_attribute("data-group"): row.find_element(
        By.CSS_SELECTOR, "td.prepared").get_attribute("data-value")
        for row in browser.find_elements(By.CSS_SELECTOR, "#transactions-table tbody tr")}
    assert tx == {t["producerGroup"]: str(t["prepared"]) for t in overview["transactions"]}
    assert tx == {"billing": "2", "shipping": "1"}


def test_the_planted_burst_is_in_the_right_bar(browser: Any, server: Live,
                                               screenshot: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, ADMIN, refresh_ms=60_000)  # the chart stays as drawn
    bars = wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#timeline-chart .bar"))
    chart = browser.find_element(By.ID, "timeline-chart")
    start, end = int(chart.get_attribute("data-from")), int(chart.get_attribute("data-to"))
    doc = api(server, "/v1/admin/timeline", **{"from": start, "to": end, "buckets": 60})
    shown = [int(bar.get_attribute("data-count")) for bar in bars]
    assert shown == doc["counts"]  # every bar, the API's number
    highest = max(bars, key=lambda bar: int(bar.get_attribute("data-count")))
    lo, hi = int(highest.get_attribute("data-start")), int(highest.get_attribute("data-end"))
    assert lo <= BURST_AT < hi and hi - lo == 30 * MINUTE  # 24 h in bars of 30 min
    assert int(highest.get_attribute("data-count")) >= BURST
    # axes: labelled, with units and the browser's zone; ticks on the zone's whole hours
    titles = [t.text for t in chart.find_elements(By.CSS_SELECTOR, "text.axis-title")]
    assert "messages due per 30 min" in titles and f"deliver time ({ZONE})" in titles
    ticks = chart.find_elements(By.CSS_SELECTOR, "text.tick")
    assert len(ticks) >= 3
    zone = ZoneInfo(ZONE)
    for tick in ticks:
        local = dt.datetime.fromtimestamp(int(tick.get_attribute("data-time")) / 1000, zone)
        assert local.minute == 0, tick.text
        assert tick.text.endswith(clock_forms(local, "%M")), tick.text
    # zoom into the bar: the burst is then in a bar of 30 s
    highest.click()
    wait_for(browser, lambda b: b.find_element(By.ID, "timeline-chart")
             .get_attribute("data-from") == str(lo))
    bars = browser.find_elements(By.CSS_SELECTOR, "#timeline-chart .bar")
    hit = [bar for bar in bars if int(bar.get_attribute("data-start")) <= BURST_AT
           < int(bar.get_attribute("data-end"))]
    assert len(hit) == 1 and int(hit[0].get_attribute("data-count")) == BURST
    assert int(hit[0].get_attribute("data-end")) - int(hit[0].get_attribute("data-start")) \
        == 30_000
    summary = browser.find_element(By.ID, "timeline-summary").text
    assert "bars of 30 s" in summary


def test_cancel_from_the_page_cancels(browser: Any, server: Live, screenshot: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, PRODUCER)
    assert not browser.find_element(By.ID, "overview").is_displayed()  # admin only
    browser.find_element(By.ID, "lookup-topic").send_keys("orders.b")
    browser.find_element(By.ID, "lookup-id").send_keys("orders.b-20")
    browser.find_element(By.ID, "lookup-button").click()
    wait_for(browser, lambda b: b.find_element(By.ID, "message-status").text == "SCHEDULED")
    deliver_at = int(value(browser, "message-deliver-at"))
    local = dt.datetime.fromtimestamp(deliver_at / 1000, ZoneInfo(ZONE))
    shown = browser.find_element(By.ID, "message-deliver-at").text
    assert any(form in shown for form in clock_forms(local, "%M:%S")), shown
    button = browser.find_element(By.ID, "cancel-button")
    assert button.is_displayed()
    button.click()
    wait_for(browser, lambda b: b.find_element(By.ID, "message-status").text == "CANCELLED")
    assert "Cancelled" in browser.find_element(By.ID, "message-result").text
    assert not browser.find_element(By.ID, "cancel-button").is_displayed()
    with server.client() as c:
        assert c.get("/v1/topics/orders.b/messages/orders.b-20").json()["status"] == "CANCELLED"
        assert c.delete("/v1/topics/orders.b/messages/orders.b-20").json()["status"] == \
            "CANCELLED"


def test_a_consumer_sees_no_cancel_button(browser: Any, server: Live, screenshot: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, CONSUMER)
    assert "consumer" in browser.find_element(By.ID, "who-text").text
    for section in ("overview", "timeline", "topics", "transactions"):
        assert not browser.find_element(By.ID, section).is_displayed(), section
    browser.find_element(By.ID, "lookup-topic").send_keys("orders.c")
    browser.find_element(By.ID, "lookup-id").send_keys("orders.c-30")
    browser.find_element(By.ID, "lookup-button").click()
    wait_for(browser, lambda b: b.find_element(By.ID, "message-status").text == "SCHEDULED")
    assert not browser.find_element(By.ID, "cancel-button").is_displayed()
    with server.client() as c:  # and it is still scheduled
        assert c.get("/v1/topics/orders.c/messages/orders.c-30").json()["status"] == "SCHEDULED"


def test_a_wrong_token_gets_a_clear_message(browser: Any, server: Live,
                                            screenshot: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, "not-a-token-0123456789")
    error = wait_for(browser, lambda b: b.find_element(By.ID, "error").is_displayed()
                     and b.find_element(By.ID, "error"))
    assert "not accepted" in error.text and "401" in error.text
    assert not browser.find_element(By.ID, "app").is_displayed()
    assert browser.execute_script("return sessionStorage.getItem('hourglass.token')") is None


def test_the_page_refreshes_itself(browser: Any, server: Live, screenshot: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, ADMIN, refresh_ms=300)
    before = api(server, "/v1/admin/stats")["pending"]
    wait_for(browser, lambda b: value(b, "pending") == str(before))
    browser.execute_script("window.notReloaded = true")
    with httpx.Client(base_url=server.base_url,
                      headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        assert c.post("/v1/topics/orders.c/messages:batch", json={"messages": [
            {"body": "late", "delayMs": 3 * HOUR} for _ in range(7)]}).status_code == 201
    wait_for(browser, lambda b: value(b, "pending") == str(before + 7))
    assert browser.execute_script("return window.notReloaded") is True
    rows = browser.find_elements(By.CSS_SELECTOR, "#topics-table tbody tr[data-topic='orders.c']")
    assert rows and int(rows[0].find_element(By.CSS_SELECTOR, "td.pending")
                        .get_attribute("data-value")) == \
        api(server, "/v1/admin/stats")["pendingByTopic"]["orders.c"]
    # rates: two looks at least, so the chart has lines and the rates are numbers
    wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#rates-chart polyline"))
    assert value(browser, "rate-delivered") != ""


def test_dead_letters_are_redriven_from_the_page(browser: Any, server: Live,
                                                 screenshot: Path) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, server, ADMIN, refresh_ms=60_000)
    row = wait_for(browser, lambda b: b.find_elements(
        By.CSS_SELECTOR, "#groups-table tr[data-group='orders.a/audit']"))[0]
    with server.client() as c:
        group = c.get("/v1/topics/orders.a/groups/audit").json()
    assert int(row.find_element(By.CSS_SELECTOR, "td.dead-letters").get_attribute(
        "data-value")) == group["deadLettered"] == 1
    topic_row = browser.find_element(By.CSS_SELECTOR, "#topics-table tr[data-topic='orders.a']")
    assert topic_row.find_element(By.CSS_SELECTOR, "td.dead-letters").text == "1"
    assert not browser.find_elements(  # no redrive where there is nothing to redrive
        By.CSS_SELECTOR, "#groups-table tr[data-group='orders.now/workers'] button.redrive")
    row.find_element(By.CSS_SELECTOR, "button.redrive").click()
    wait_for(browser, lambda b: b.find_element(
        By.CSS_SELECTOR, "#groups-table tr[data-group='orders.a/audit'] td.dead-letters")
        .get_attribute("data-value") == "0")
    with server.client() as c:
        assert c.get("/v1/topics/orders.a/groups/audit").json()["deadLettered"] == 0
