"""``hourglass bench http`` runs end to end in a tiny configuration (figures not asserted:
speed is the benchmark's business, not a unit test's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import http


@pytest.mark.slow
def test_bench_http_smoke(tmp_path: Path) -> None:
    out = tmp_path / "http.json"
    status = http.main(["--duration", "1", "--warmup", "0.2", "--connections", "4",
                        "--prefill", "2000", "--layer-rounds", "2", "--json", str(out)])
    assert status == 0
    report = json.loads(out.read_text())
    phases = {p["name"]: p for p in report["phases"]}
    assert set(phases) == {"single", "batch", "batch-msgpack", "pull"}
    for phase in phases.values():
        assert phase["errors"] == 0
        assert phase["requests"] > 0
        assert phase["messages_per_server_cpu_s"] > 0  # the server's CPU time was read
        assert set(phase["cpu"]) == {"busy", "idle", "steal"}
        assert set(phase["statuses"]) == ({"200"} if phase["name"] == "pull" else {"201"})
    assert phases["batch"]["messages"] == 1000 * phases["batch"]["requests"]
    assert set(report["layers_msgs_per_s"]) == {"engine_send_batch", "engine_pull",
                                                "api_decode_batch", "api_encode_pull"}
