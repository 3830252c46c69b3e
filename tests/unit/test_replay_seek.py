"""Where a range starts in a partition: bisection's answer, in fewer probes where event time grows evenly."""

from __future__ import annotations

import asyncio
import bisect
import math

from hypothesis import given
from hypothesis import strategies as st

from periscope.replay.seek import MAX_MISSES, first_at_or_after


class Partition:
    """Records' event times by offset; counts the probes, as a reader's single-record fetches."""

    def __init__(self, times: list[int]) -> None:
        self.times = times
        self.probes = 0

    async def time_at(self, offset: int) -> int | None:
        self.probes += 1
        return self.times[offset] if offset < len(self.times) else None

    def find(self, target_ms: int, lo: int = 0, hi: int | None = None) -> int:
        end = len(self.times) if hi is None else hi
        return asyncio.run(first_at_or_after(self.time_at, lo, end, target_ms))


def bisection_probes(n: int) -> int:
    return math.ceil(math.log2(n + 1))


@given(st.lists(st.integers(0, 50), max_size=300).map(sorted), st.integers(-5, 55), st.data())
def test_where_times_only_grow_it_is_bisections_answer(times: list[int], target: int, data: st.DataObject
                                                        ) -> None:
    lo = data.draw(st.integers(0, len(times)))
    hi = data.draw(st.integers(lo, len(times)))
    p = Partition(times)
    assert p.find(target, lo, hi) == bisect.bisect_left(times, target, lo, hi)
    assert p.probes <= bisection_probes(hi - lo) + 2 + MAX_MISSES


@given(st.lists(st.integers(0, 50), max_size=300), st.integers(-5, 55), st.data())
def test_with_late_records_it_ends_where_the_record_before_is_earlier_and_its_own_is_not(
        times: list[int], target: int, data: st.DataObject) -> None:
    lo = data.draw(st.integers(0, len(times)))
    hi = data.draw(st.integers(lo, len(times)))
    at = Partition(times).find(target, lo, hi)
    assert lo <= at <= hi
    assert at == lo or times[at - 1] < target
    assert at == hi or times[at] >= target


def test_a_range_that_begins_before_the_partition_takes_one_probe() -> None:
    p = Partition([1_000 * k for k in range(60_000)])
    assert p.find(-1) == 0
    assert p.probes == 1


def test_a_range_that_begins_after_the_partition_takes_two() -> None:
    p = Partition([1_000 * k for k in range(60_000)])
    assert p.find(60_000_000) == 60_000
    assert p.probes == 2


def test_evenly_growing_times_take_four_probes_where_bisection_takes_sixteen() -> None:
    times = [59 * k for k in range(60_000)]
    for target in (1_000, 777_777, 1_765_432, 3_500_000):
        p = Partition(times)
        assert p.find(target) == bisect.bisect_left(times, target)
        assert p.probes <= 4, (target, p.probes)
    assert bisection_probes(len(times)) == 16


def test_runs_of_equal_times_take_fewer_probes_than_bisection_on_average() -> None:
    # Seventeen nodes on a partition, a sample each a second: runs of equal times, as an input topic holds.
    times = [1_000 * (k // 17) for k in range(60_000)]
    probes = []
    for target in range(0, 3_529_000, 9_973):
        p = Partition(times)
        assert p.find(target) == bisect.bisect_left(times, target)
        probes.append(p.probes)
    assert sum(probes) / len(probes) < 13 < bisection_probes(len(times))
    assert max(probes) <= bisection_probes(len(times)) + 2 + MAX_MISSES


def test_an_empty_span_asks_nothing() -> None:
    p = Partition([5, 6, 7])
    assert p.find(6, 2, 2) == 2
    assert p.probes == 0
