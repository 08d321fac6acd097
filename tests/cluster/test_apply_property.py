"""The apply function under hypothesis: a random stream of records (appends, revokes and
RocksDB batches, as a leader's store and log ship them, whole or in pieces) applied to two
fresh stores gives
the same CommitLog bytes, the same RocksDB contents and the same answers as the source."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.commitlog import CommitLog
from storage.replication import LeaderReplicator
from storage.rocks import RocksStore
from tests.support.replication import FollowerNode, MemoryStream, log_bytes, store_contents

CFS = ["meta", "index", "cq", "timer.0", "tx"]
keys = st.binary(min_size=1, max_size=6)
payloads = st.lists(st.binary(min_size=0, max_size=90), min_size=1, max_size=6)
batch_op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(CFS), keys, st.binary(max_size=20)),
    st.tuples(st.just("delete"), st.sampled_from(CFS), keys, st.none()),
    st.tuples(st.just("range"), st.sampled_from(CFS), keys, keys),
    st.tuples(st.just("sorted"), st.sampled_from(CFS),
              st.lists(keys, max_size=5), st.binary(max_size=8)),
)
step = st.one_of(
    st.tuples(st.just("append"), payloads),
    st.tuples(st.just("revoke"), st.integers(min_value=0, max_value=20)),
    st.tuples(st.just("write"), st.lists(batch_op, max_size=6)),
)

SEGMENT = 256  # small: appends roll over segment ends


def _node(directory: Path) -> tuple[RocksStore, CommitLog]:
    directory.mkdir(parents=True)
    return (RocksStore(directory / "rocksdb", timer_shards=1),
            CommitLog(directory / "commitlog", segment_size=SEGMENT))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=25), st.sampled_from([48, 300, 1 << 20]))
def test_two_fresh_stores_applying_one_stream_hold_the_same_bytes(
        steps: list, max_message: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        stream = MemoryStream()
        store, log = _node(root / "source")
        rep = LeaderReplicator(store, log, stream, max_message_bytes=max_message)
        store.attach_replicator(rep)
        log.attach_replicator(rep)
        starts: list[int] = []  # record boundaries appended so far
        try:
            for kind, arg in steps:
                if kind == "append":
                    starts += log.append_batch(arg)
                elif kind == "revoke" and starts:
                    cut = starts[arg % len(starts)]
                    log.revoke(cut)
                    starts = [p for p in starts if p < cut]
                elif kind == "write":
                    batch = store.batch()
                    for op, cf, a, b in arg:
                        if op == "put":
                            batch.put(cf, a, b)
                        elif op == "delete":
                            batch.delete(cf, a)
                        elif op == "range" and a < b:
                            batch.delete_range(cf, a, b)
                        elif op == "sorted":
                            batch.put_sorted(cf, a, [b + k for k in a])
                    store.write(batch)
            store.write(store.batch())  # ships the last appends
            followers = [FollowerNode(root / f"f{i}", timer_shards=1, segment_size=SEGMENT)
                         for i in range(2)]
            try:
                for f in followers:
                    f.catch_up(stream)
                end = log.end_position
                source_bytes = log_bytes(root / "source" / "commitlog", end)
                source_rows = store_contents(store, skip_timer_below_frontier=False)
                answers = log.read_many(starts)
                for i, f in enumerate(followers):
                    assert f.log.end_position == end
                    assert log_bytes(root / f"f{i}" / "commitlog", end) == source_bytes
                    rows = store_contents(f.store, skip_timer_below_frontier=False)
                    rows["meta"] = [kv for kv in rows["meta"]
                                    if not kv[0].startswith((b"timer_shards", b"format"))]
                    expected = dict(source_rows)
                    expected["meta"] = [kv for kv in source_rows["meta"]
                                        if not kv[0].startswith((b"timer_shards", b"format"))]
                    assert rows == expected
                    assert f.log.read_many(starts) == answers
            finally:
                for f in followers:
                    f.close()
        finally:
            log.close()
            store.close()
