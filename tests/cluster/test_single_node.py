"""Single-node mode is unchanged by cluster mode: GET /v1/cluster answers the contract's fixed
document, no cluster metric appears, and nothing imports nats."""

from __future__ import annotations

import subprocess
import sys

from tests.support.live import Live


def test_single_node_cluster_view_is_the_contracts(live: Live) -> None:
    with live.client() as c:
        r = c.get("/v1/cluster")
        assert r.status_code == 200
        assert r.json() == {"nodeId": "single", "role": "leader", "leader": None,
                            "appliedSeq": 0, "nodes": []}
        assert c.get("/v1/cluster", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert "hourglass_cluster_role" not in c.get("/metrics").text


def test_single_node_mode_never_imports_nats() -> None:
    code = ("import sys, app.server, app.wiring, scheduler.broker, api.app;"
            "from app.settings import load_settings;"
            "from app.wiring import build_app;"
            "import tempfile, pathlib;"
            "d = pathlib.Path(tempfile.mkdtemp());"
            "s = load_settings(cli={'data_dir': str(d)}, env={'HOURGLASS_ADMIN_TOKEN': 'x' * 20});"
            "build_app(s);"
            "bad = [m for m in sys.modules if m == 'nats' or m.startswith("
            "('nats.', 'scheduler.cluster', 'api.forward'))];"
            "print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
