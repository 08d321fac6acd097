"""``hourglass bench native``: the compiled hot paths against their pure-Python twins.

CPU µs per message of the stages the compiled hot paths (storage/_native.pyx,
scheduler/_native.pyx, api/_native.pyx) take over, in one process, on the same
engine, the two implementations taking turns batch by batch (paired: the machine's drift
hits both alike):

commit       a delivery commit of 1000 due messages (key split, log payloads, framing and
             CRC32C, CommitLog append, index entries, the one RocksDB write)
pull         a pull of 1000: consume queue, log reads with their CRC32C checks, decoding
msgpack pull a pull of 1000 answered in msgpack (read + answer bytes)

Needs the extensions (pip install -e . builds them); ``HOURGLASS_PURE_PYTHON=1`` makes a
server use the twins instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BATCH = 1000
BODY = "x" * 100
START_MS = 1_700_000_000_000


def _use(compiled: bool) -> None:
    """Point the engine's hot paths at the compiled functions or at their twins."""
    import scheduler.codec as codec
    import scheduler.committer as committer
    import storage.commitlog as commitlog
    import storage.log_format as log_format
    from storage.native import native

    committer.log_payloads = codec._log_payloads_native if compiled else codec.log_payloads_py
    committer.split_due = codec._split_due_native if compiled else codec.split_due_py
    committer.delivered_index_values = (codec._delivered_index_values_native if compiled
                                        else codec.delivered_index_values_py)
    commitlog.frame = log_format._frame_native if compiled else log_format.frame_py
    commitlog.native = native if compiled else None


def measure(data_dir: Path, rounds: int) -> dict[str, dict[str, float]]:
    from api.routes.consume import _pull_msgpack_native, pull_msgpack_py
    from scheduler.broker import Broker
    from scheduler.clock import FakeClock
    from scheduler.committer import ScanBatch
    from scheduler.config import EngineConfig
    from scheduler.model import SendRequest
    from scheduler.timer_index import TimerIndex
    from storage.keys import time_bound

    due = START_MS + 3_600_000
    clock = FakeClock(START_MS)  # stands still: the benchmark commits by hand
    config = EngineConfig(data_dir=data_dir, timer_shards=1, segment_size=256 << 20)
    samples: dict[str, dict[bool, list[float]]] = {
        stage: {True: [], False: []} for stage in ("commit", "pull", "msgpack pull")}

    def timed(stage: str, compiled: bool, work: Callable[[], object]) -> None:
        _use(compiled)
        started = time.thread_time()
        work()
        samples[stage][compiled].append((time.thread_time() - started) * 1e6 / BATCH)

    with Broker(config, clock) as broker:
        store, committer = broker.parts.store, broker.parts.committer  # the benchmark looks inside
        assert store is not None and committer is not None
        for r in range(rounds):
            broker.send_batch([SendRequest(topic="t", body=BODY.encode(), msg_id=f"r{r}m{i}",
                                           deliver_at=due) for i in range(BATCH)])
        timers = TimerIndex(store)
        cursor = time_bound(0)
        for r in range(rounds):
            items = timers.read_due("timer.0", cursor, time_bound(due + 1), BATCH).items
            scan = ScanBatch(shard=0, start=cursor, end=items[-1][0] + b"\x00", items=items)
            cursor = scan.end
            timed("commit", r % 2 == 0, lambda s=scan: committer.commit_due([s]))  # type: ignore[misc]
        for r in range(rounds):
            for compiled in (r % 2 == 0, r % 2 == 1):
                timed("pull", compiled, lambda r=r: broker.pull("t", r * BATCH, BATCH))  # type: ignore[misc]
                answer = _pull_msgpack_native if compiled else pull_msgpack_py
                timed("msgpack pull", compiled,
                      lambda r=r, a=answer: a(broker.read("t", r * BATCH, BATCH), r * BATCH))  # type: ignore[misc]
        _use(True)
    out: dict[str, dict[str, float]] = {}
    for stage, by in samples.items():
        c, p = statistics.median(by[True]), statistics.median(by[False])
        out[stage] = {"compiled": round(c, 3), "python": round(p, 3),
                      "python / compiled": round(p / c, 2)}
    return out


def main(argv: list[str] | None = None) -> int:
    from api.native import native as api_native
    from scheduler.native import native as scheduler_native
    from storage.native import native

    ap = argparse.ArgumentParser(prog="hourglass bench native", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40, help="batches of 1000 per stage")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    if None in (native, scheduler_native, api_native):
        print("hourglass bench native: the compiled hot paths (storage/, scheduler/, "
              "api/_native) are not built or HOURGLASS_PURE_PYTHON is set (pip install -e . "
              "builds them)", file=sys.stderr)
        return 2
    if args.rounds < 2:
        ap.error("--rounds must be at least 2")
    with tempfile.TemporaryDirectory(prefix="hg-native-") as tmp:
        print(f"hourglass bench native: {args.rounds} batches of {BATCH} per stage, "
              "compiled and Python taking turns", file=sys.stderr)
        figures: dict[str, Any] = measure(Path(tmp), args.rounds)
    print(f"{'CPU µs per message':32s} {'compiled':>9s} {'python':>9s} {'ratio':>7s}")
    for stage, f in figures.items():
        print(f"{stage:32s} {f['compiled']:9.2f} {f['python']:9.2f} "
              f"{f['python / compiled']:6.2f}x")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
