"""kill -9 of a real child process: every acknowledged prepare, commit and rollback
survives, and a committed message is delivered exactly once, also when the process died
between the CommitLog append of a commit (or a discard) and its RocksDB write."""

from __future__ import annotations

import collections
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scheduler.broker import Broker
from scheduler.clock import FakeClock, SystemClock
from storage.constants import TOPIC_TRANS_CHECK_MAX_TIME
from storage.records import MessageStatus
from tests.support.engine import read_topic

from .crash_child import START_MS, config

REPO = Path(__file__).resolve().parents[2]


def _child(data_dir: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "tests.txn.crash_child", str(data_dir), mode],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _acks(lines: list[str]) -> list[dict[str, str]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


def _run_to_death(data_dir: Path, mode: str) -> list[dict[str, str]]:
    proc = _child(data_dir, mode)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, out + err
    return _acks(out.splitlines())


@pytest.mark.slow
def test_kill_9_after_the_append_of_a_commit(tmp_path: Path) -> None:
    acks = _run_to_death(tmp_path, "commit")
    dying = acks[-1]["tx"]
    broker = Broker(config(tmp_path), FakeClock(START_MS + 1_000))
    broker.start()
    try:
        assert broker.transactions.get(dying).status == "COMMITTED"  # finished by replay
        assert broker.transactions.commit(dying).status == "COMMITTED"  # the client's retry
        committed = [a["tx"] for a in acks if a["op"] == "commit"]
        rolled = [a["tx"] for a in acks if a["op"] == "rollback"]
        assert all(broker.transactions.get(t).status == "COMMITTED" for t in committed)
        assert all(broker.transactions.get(t).status == "ROLLED_BACK" for t in rolled)
        assert sorted(m.msg_id for m in read_topic(broker, "orders")) == \
            sorted(["m10", *(f"m{i}" for i in range(5))])
        assert broker.stats().transactions_prepared == 9
    finally:
        broker.close()


@pytest.mark.slow
def test_kill_9_after_the_append_of_a_discard(tmp_path: Path) -> None:
    acks = _run_to_death(tmp_path, "discard")
    oldest_prepared = acks[10]["tx"]  # m10: the first neither committed nor rolled back
    broker = Broker(config(tmp_path, transaction_check_max=0), FakeClock(START_MS + 6_000))
    broker.start()
    try:
        assert broker.transactions.get(oldest_prepared).status == "DISCARDED"
        assert broker.status("orders", "m10").status is MessageStatus.DISCARDED
        assert [m.msg_id for m in read_topic(broker, TOPIC_TRANS_CHECK_MAX_TIME)] == \
            [oldest_prepared]
        assert len(broker.transactions.poll_checks("pg", 100)) == 0  # the rest: discarded now
        broker.drain()
        discarded = [m.msg_id for m in read_topic(broker, TOPIC_TRANS_CHECK_MAX_TIME)]
        assert len(discarded) == len(set(discarded)) == 10
    finally:
        broker.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill_9_at_a_random_moment(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    with _child(tmp_path, "random") as proc:  # closes the pipes
        assert proc.stdout is not None and proc.stderr is not None
        lines: list[str] = []
        wanted = rng.randint(50, 400)
        while len(lines) < wanted:
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
            lines.append(line)
        time.sleep(rng.random() * 0.01)  # die somewhere inside a later operation
        proc.send_signal(signal.SIGKILL)
        # read through the buffered file readline used (communicate() would read the pipe
        # underneath it and miss the lines readline had already buffered)
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == -signal.SIGKILL, proc.stderr.read()
    acks = _acks(lines + rest.splitlines())

    msg_of = {a["tx"]: a["msg"] for a in acks if a["op"] == "prepare"}
    final = {a["tx"]: a["op"] for a in acks if a["op"] in ("commit", "rollback")}
    # the child ran on the system clock with delays of at most 50 ms: a minute later, in
    # fake time, everything committed is due
    broker = Broker(config(tmp_path), FakeClock(SystemClock().now_ms() + 60_000))
    broker.start()
    try:
        broker.drain()
        delivered = collections.Counter(m.msg_id for m in read_topic(broker, "orders"))
        assert all(n == 1 for n in delivered.values()), delivered
        for tx, msg in msg_of.items():
            state = broker.transactions.get(tx).status
            expected = {"commit": "COMMITTED", "rollback": "ROLLED_BACK"}.get(final.get(tx, ""))
            if expected is not None:
                assert state == expected, (tx, msg)
            else:  # acknowledged as prepared; the unacknowledged last operation may have ended it
                assert state in ("PREPARED", "COMMITTED", "ROLLED_BACK"), (tx, state)
            assert (msg in delivered) == (state == "COMMITTED"), (tx, msg, state)
        # the child commits only what it saw prepared: nothing else is ever delivered
        assert set(delivered) <= set(msg_of.values())
        assert len(final) >= 10  # the run did get somewhere before it died
    finally:
        broker.close()
