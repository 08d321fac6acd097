"""scheduler/timeline.py against a plain list of pending messages (hypothesis): any sequence
of batches added, removed and cancelled, any window, gives the brute-force counts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import timeline as timeline_module
from scheduler.timeline import (
    DAY,
    HOUR,
    MAX_SPAN_MS,
    WIDTHS_MS,
    Loader,
    TimelineCounts,
    pick_width,
)
from storage.keys import pack_u64

T0 = 1_700_000_000_000
TOPICS = ("a", "b", "c")
message = st.tuples(st.sampled_from(TOPICS), st.integers(T0, T0 + 3 * DAY))
window = st.tuples(st.integers(T0 - HOUR, T0 + 3 * DAY), st.integers(1, 4 * DAY),
                   st.integers(1, 200))


def brute(pending: list[tuple[str, int]], topic: str | None, start: int, width: int,
          n: int) -> list[int]:
    counts = [0] * n
    for t, at in pending:
        if (topic is None or t == topic) and start <= at < start + n * width:
            counts[(at - start) // width] += 1
    return counts


@settings(max_examples=80, deadline=None)
@given(batches=st.lists(st.lists(message, min_size=1, max_size=40), min_size=1, max_size=8),
       removals=st.lists(st.integers(0, 1000), max_size=30),
       windows=st.lists(window, min_size=1, max_size=5),
       fold_at=st.sampled_from([1, 7, timeline_module.FOLD_AT]))
def test_counts_equal_a_brute_force_count(
        batches: list[list[tuple[str, int]]], removals: list[int],
        windows: list[tuple[int, int, int]], fold_at: int) -> None:
    """``fold_at``: what is buffered is counted at every change, every few messages, or
    only when read."""
    default, timeline_module.FOLD_AT = timeline_module.FOLD_AT, fold_at
    try:
        check_against_brute_force(batches, removals, windows)
    finally:
        timeline_module.FOLD_AT = default


def check_against_brute_force(batches: list[list[tuple[str, int]]], removals: list[int],
                              windows: list[tuple[int, int, int]]) -> None:
    timeline = TimelineCounts()
    pending: list[tuple[str, int]] = []
    for batch in batches:
        topics = [t for t, _ in batch]
        one = len(set(topics)) == 1  # then the topic of them all, as the Backlog hands it
        timeline.add(topics[0] if one else topics, [at for _, at in batch])
        pending += batch
    delivered = [pending.pop(i % len(pending)) for i in removals[:len(removals) // 2]
                 if pending]
    if delivered:
        timeline.remove([t for t, _ in delivered], [at for _, at in delivered])
    for i in removals[len(removals) // 2:]:
        if pending:
            cancelled, at = pending.pop(i % len(pending))
            timeline.remove_one(cancelled, at)
    for from_ms, span, buckets in windows:
        for topic in (*TOPICS, None):
            view = timeline.query(from_ms, from_ms + span, buckets, topic)
            n = len(view.counts)
            assert n <= buckets + 1
            assert view.start <= from_ms and view.end >= from_ms + span
            assert view.counts == brute(pending, topic, view.start, view.width_ms, n)
            assert view.pending == sum(1 for t, _ in pending if topic is None or t == topic)
    if not pending:
        assert timeline.entries() == 0  # nothing pending: nothing held


def test_messages_of_one_second_count_together_in_one_batch() -> None:
    timeline = TimelineCounts()
    timeline.add(["a", "a", "a"], [T0 + 90_000, T0 + 90_500, T0 + 91_000])  # one topic
    timeline.add(["b", "a"], [T0 + 90_999, T0 + 200_000])  # several
    view = timeline.query(T0 + 90_000, T0 + 92_000, 2, "a")
    assert (view.width_ms, view.counts) == (1_000, [2, 1])
    assert timeline.query(T0 + 90_000, T0 + 92_000, 2, None).counts == [3, 1]


def test_widths_are_the_narrowest_that_fit() -> None:
    assert pick_width(T0, T0 + HOUR, 60)[0] == 60_000
    assert pick_width(T0, T0 + HOUR, 61)[0] == 60_000
    assert pick_width(T0, T0 + HOUR + 1, 60)[0] == 120_000
    assert pick_width(T0, T0 + 24 * HOUR, 60)[0] == 30 * 60_000
    assert pick_width(T0, T0 + MAX_SPAN_MS, 1)[0] == WIDTHS_MS[-1]
    width, unit, start = pick_width(T0 + 1_234, T0 + 7 * DAY, 7)
    assert (width, unit, start) == (DAY, HOUR, (T0 + 1_234) // HOUR * HOUR)


def test_a_load_replaces_everything() -> None:
    """The start-up scan's bulk load (Loader), over two chunks, replaces what was kept."""
    timeline = TimelineCounts()
    timeline.add(["a", "b"], [T0, T0 + 5_000])
    loader = Loader()
    loader.prefixes[b"c"] += [pack_u64(T0 + i) for i in range(4)]
    loader.flush()  # a full chunk
    loader.prefixes[b"c"].append(pack_u64(T0 + HOUR))
    loader.prefixes[b"d"].append(pack_u64(T0 + 61_000))
    loader.into(timeline)
    view = timeline.query(T0, T0 + 2 * HOUR, 120, None)  # 1-min buckets from T0's minute
    start = view.start
    assert view.counts[(T0 - start) // 60_000] == 4 and sum(view.counts) == 6 == view.pending
    assert view.counts[(T0 + HOUR - start) // 60_000] == 1
    assert (timeline.pending("a"), timeline.pending("c"), timeline.pending("d")) == (0, 5, 1)
    assert sum(timeline.query(T0, T0 + 2 * HOUR, 120, "c").counts) == 5
    timeline.remove(["c"] * 4, [T0 + i for i in range(4)])  # and it is kept from there
    assert timeline.pending("c") == 1 and timeline.pending(None) == 2
