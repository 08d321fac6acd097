"""ack_runs: sorted offsets as runs of consecutive ones, exactly and maximally."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from scheduler.group_state import ack_runs


@given(st.sets(st.integers(0, 300), min_size=1))
def test_runs_cover_exactly_the_offsets_and_are_maximal(offsets: set[int]) -> None:
    runs = ack_runs(sorted(offsets))
    assert {o for first, end in runs for o in range(first, end)} == offsets
    assert all(first < end for first, end in runs)
    assert all(a_end < b_first for (_, a_end), (b_first, _) in pairwise(runs))


def test_one_lease_in_order_is_one_run() -> None:
    assert ack_runs(list(range(1000, 2000))) == [(1000, 2000)]
    assert ack_runs([5]) == [(5, 6)]
    assert ack_runs([1, 2, 4, 5, 9]) == [(1, 3), (4, 6), (9, 10)]
