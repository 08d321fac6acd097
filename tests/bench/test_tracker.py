"""bench.peers.common's Tracker: what the consumers of every system record, counted alike
(its batch parse and its running count of distinct ids)."""

from __future__ import annotations

import numpy as np

from bench.peers.common import Tracker, msg_id, msg_index, msg_indexes


def test_msg_indexes_reads_every_id_as_msg_index_does() -> None:
    cases: list[list[str | bytes]] = [
        [msg_id(i) for i in range(1000)], [b"m1", b"m22"], ["m1", b"m3"], ["x1", "m2"],
        ["m+1", "m 2", "m1_0", "m\u00b2", "m\u0663"], ["m"], ["m007"], [b"m\xff"],
        ["m1,m2"], ["m1,m2", "m3"], ["m1234567890123456789"], [],
    ]
    for ids in cases:
        assert msg_indexes(ids).tolist() == [msg_index(i) for i in ids], ids
        assert msg_indexes(ids).dtype == np.int64


def test_record_counts_distinct_ids_duplicates_and_strangers() -> None:
    t = Tracker(10)
    t.record(["m1", "m1", "m2", "x", "m99"], 5.0, [1, 1, 2, 0, 0])
    t.record([b"m2", b"m3"], [6.0, 7.0])
    t.record(["m4", "m4", "m4"], 8.0)
    assert t.distinct == int((t.count > 0).sum()) == 4
    assert t.count[[1, 2, 3, 4]].tolist() == [2, 2, 1, 3]
    assert t.unexpected == 2 and t.received == 10
    assert t.recv[2] == 5.0 and t.recv[3] == 7.0  # the first receipt's time
    assert t.server_late[1] == 1 and t.server_late[2] == 2
    assert t.correctness() == {"expected": 10, "received_distinct": 4, "missing": 6,
                               "duplicates": 4, "unexpected": 2}
