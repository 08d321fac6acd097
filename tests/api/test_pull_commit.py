"""A pull that commits the group's offset first (``commit=true``): one request per batch."""

from __future__ import annotations

from tests.api.test_http_contract import TOPIC, problem, send
from tests.support.live import CONSUMER, Live


def test_a_pull_with_commit_moves_the_group_offset_then_reads(live: Live) -> None:
    with live.client() as c:
        for i in range(5):
            assert send(c, msgId=f"m{i}").status_code == 201
    url = f"/v1/topics/{TOPIC}/messages"
    offset_url = f"/v1/topics/{TOPIC}/groups/g/offset"
    with live.client(token=CONSUMER) as c:
        first = c.get(url, params={"group": "g", "max": 2}).json()
        assert [m["msgId"] for m in first["messages"]] == ["m0", "m1"]
        assert c.get(offset_url).json() == {"offset": 0}  # a plain pull commits nothing
        second = c.get(url, params={"group": "g", "offset": first["nextOffset"], "max": 2,
                                    "commit": "true"}).json()
        assert [m["msgId"] for m in second["messages"]] == ["m2", "m3"]
        assert c.get(offset_url).json() == {"offset": 2}
        # the committed offset is where a pull by group alone starts
        again = c.get(url, params={"group": "g", "max": 10}).json()
        assert [m["msgId"] for m in again["messages"]] == ["m2", "m3", "m4"]


def test_a_pull_with_commit_needs_group_and_offset_and_a_valid_flag(live: Live) -> None:
    url = f"/v1/topics/{TOPIC}/messages"
    offset_url = f"/v1/topics/{TOPIC}/groups/g/offset"
    with live.client() as c:
        send(c, msgId="m0")
        problem(c.get(url, params={"group": "g", "commit": "true"}), 400, "INVALID_ARGUMENT")
        problem(c.get(url, params={"offset": 1, "commit": "true"}), 400, "INVALID_ARGUMENT")
        problem(c.get(url, params={"group": "g", "offset": 1, "commit": "yes"}), 400,
                "INVALID_ARGUMENT")
        problem(c.get(url, params={"group": "g", "offset": 5, "commit": "true"}), 400,
                "INVALID_ARGUMENT")  # beyond the end of the topic
        assert c.get(offset_url).json() == {"offset": 0}  # nothing changed
