"""Where a range starts in a partition: one probe where it begins before the partition's records, and
otherwise bisection's answer; never later than bisection's, whatever order the event times come in."""

from __future__ import annotations

import asyncio
import bisect
import math

from hypothesis import given
from hypothesis import strategies as st

from periscope.replay.seek import first_at_or_after


class Partition:
    """Records' event times by offset; counts the probes, as a reader's single-record fetches."""

    def __init__(self, times: list[int]) -> None:
        self.times = times
        self.probes = 0

    async def time_at(self, offset: int) -> int | None:
        self.probes += 1
        return self.times[offset] if offset < len(self.times) else None

    def find(self, target_ms: int, lo: int = 0, hi: int | None = None, hint: int | None = None) -> int:
        end = len(self.times) if hi is None else hi
        return asyncio.run(first_at_or_after(self.time_at, lo, end, target_ms, hint))


spans = st.lists(st.integers(0, 50), max_size=300)


@given(spans.map(sorted), st.integers(-5, 55), st.data())
def test_where_times_only_grow_it_is_bisections_answer(times: list[int], target: int, data: st.DataObject
                                                        ) -> None:
    lo = data.draw(st.integers(0, len(times)))
    hi = data.draw(st.integers(lo, len(times)))
    p = Partition(times)
    assert p.find(target, lo, hi) == bisect.bisect_left(times, target, lo, hi)
    assert p.probes <= math.ceil(math.log2(hi - lo + 1)) + 1


@given(spans, st.integers(-5, 55), st.data())
def test_with_late_records_it_starts_where_bisection_does_or_at_the_first_record(
        times: list[int], target: int, data: st.DataObject) -> None:
    lo = data.draw(st.integers(0, len(times)))
    hi = data.draw(st.integers(lo, len(times)))
    at = Partition(times).find(target, lo, hi)
    # The reader's search before: bisection on whether a record is before the target, which is what
    # bisect_left does on any list, ordered or not.
    old = bisect.bisect_left(times, target, lo, hi)
    assert at == old or (at == lo and times[lo] >= target)
    assert at <= old  # never reads less than the bisection did


def test_a_range_that_begins_before_the_partition_takes_one_probe() -> None:
    p = Partition([1_000 * k for k in range(60_000)])
    assert p.find(-1) == 0
    assert p.probes == 1


def test_one_late_record_at_the_end_does_not_hide_the_range() -> None:
    # A probe cut off for a while sends its old samples last: the partition's last record is older than
    # the range, the records before it are in it.
    times = [1_000 * k for k in range(1_000)] + [5_000]
    assert Partition(times).find(400_000) == 400


def test_a_hint_the_records_on_either_side_bear_out_takes_two_probes() -> None:
    p = Partition([1_000 * k for k in range(60_000)])
    assert p.find(400_000, hint=400) == 400
    assert p.probes == 2


def test_a_hint_they_do_not_bear_out_is_searched_past() -> None:
    # The broker's time index finds record timestamps; a producer clock that ran ahead put it too early.
    times = [1_000 * k for k in range(60_000)]
    p = Partition(times)
    assert p.find(400_000, hint=350) == 400
    assert p.probes > 2


def test_an_empty_span_asks_nothing() -> None:
    p = Partition([5, 6, 7])
    assert p.find(6, 2, 2) == 2
    assert p.probes == 0
