"""The analysis on a real standalone Spark cluster: a master and one worker on 127.0.0.1
(started from the pyspark distribution), the job sent with spark-submit and its code shipped
as a zip with --py-files. Its figures are checked against the workload's ground truth (the
local-mode figures are checked in full by test_figures.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from storage.records import MessageStatus
from tests.spark import direct
from tests.spark.conftest import SPEC, Generated

# Four JVMs (master, worker, driver, executor) on two shared cores: about a minute alone, but
# several times that under contention, so this one test gets a longer bound than the default.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env.update(SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
               SPARK_LOG_DIR=str(tmp / "logs"), SPARK_WORKER_DIR=str(tmp / "work"),
               SPARK_DAEMON_MEMORY="512m")
    return env


class Daemon:
    """A Spark daemon in the foreground; ``wait_for`` blocks until its log says ``text``."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=env,
                                     cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append("<exited>")
            self.changed.notify_all()

    def wait_for(self, text: str, timeout: float = 120) -> None:
        with self.changed:
            ok = self.changed.wait_for(
                lambda: any(text in ln or ln == "<exited>" for ln in self.lines), timeout)
            assert ok and not any(ln == "<exited>" for ln in self.lines), "".join(self.lines)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.thread.join(30)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    env = _env(tmp_path)
    port = _free_port()
    master = Daemon(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(port), "--webui-port", str(_free_port())], env, tmp_path)
    worker = None
    try:
        master.wait_for("I have been elected leader")
        url = f"spark://127.0.0.1:{port}"
        worker = Daemon(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                         "--webui-port", str(_free_port()), "--cores", "1", "--memory", "1g",
                         "--work-dir", str(tmp_path / "work"), url], env, tmp_path)
        worker.wait_for("Successfully registered with master")
        yield url, env
    finally:
        if worker is not None:
            worker.stop()
        master.stop()


def _code_zip(dest: Path) -> Path:
    with zipfile.ZipFile(dest, "w") as zf:
        for package in ("spark_jobs", "storage"):
            for f in sorted((REPO / package).glob("*.py")):
                zf.write(f, f"{package}/{f.name}")
    return dest


def test_spark_submit_to_a_standalone_cluster(
    cluster: tuple[str, dict[str, str]], workload: Generated, tmp_path: Path,
) -> None:
    url, env = cluster
    code = _code_zip(tmp_path / "hourglass.zip")
    out = tmp_path / "report"
    done = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", url, "--py-files", str(code),
         "--conf", f"spark.pyspark.python={sys.executable}",
         "--conf", f"spark.pyspark.driver.python={sys.executable}",
         "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
         "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=1g",
         "--conf", "spark.cores.max=1", "--driver-memory", "1g",
         str(REPO / "spark_jobs" / "analyze.py"), str(workload.snapshot.path),
         "--out", str(out), "--partitions", "3", "--no-html"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=500, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["parameters"]["master"] == url
    assert report["parameters"]["code"].startswith(str(tmp_path))  # the shipped zip ran
    snap = report["snapshots"][0]
    truth = workload.work.messages
    assert snap["logical"]["counts"]["indexStates"] == dict(Counter(m.state.value for m in truth))
    waiting = [m for m in truth if m.state is MessageStatus.SCHEDULED]
    assert snap["logical"]["valueSizes"]["bytes"] == sum(m.value_size for m in waiting)
    future = Counter(m.deliver_at // 1000 for m in waiting if m.deliver_at >= SPEC.now_ms)
    assert snap["logical"]["dueLoad"]["peakSecond"]["messages"] == max(future.values())
    files = direct.live_files(workload.snapshot.db_path)
    assert snap["physical"]["tombstones"]["total"] == sum(f["num_deletions"] for f in files)
    assert {f["rule"] for f in report["recommendations"]} == {"overdue", "topic-skew",
                                                              "shard-imbalance"}
    # spark-submit merges the Python driver's stderr (progress) into its own stdout
    assert "logical rows" in done.stdout + done.stderr, done.stdout[-3000:]
