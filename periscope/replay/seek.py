"""Where a time range starts in a partition: the first offset whose record is at or after an event time.

A reader finds it by asking for the event time of single records (a probe). Where the broker's time index
cannot be trusted (the broker profile says which: periscope.bus.profile), the search takes only probes,
and a probe can be dear: a broker may spend as much CPU on a one-record fetch as on a full one (80-100 ms
measured in a partition of 14,400 records; bench/README.md), and bisection takes log2(n) probes (16 for
a partition an hour of fifty nodes fills). A range that begins before what the partition holds (a replay
of everything a broker keeps, as the benchmark's hour is) needs one: the first record is already at or
after the time. So the search looks at the first record first, and bisects as before where it is not.
Where the broker's time index can be trusted, its answer is taken once the records on either side of it
bear it out: two probes.

Event times in a partition only mostly grow: nodes share it, and a probe that was cut off sends old
samples late. Both ways out of the search lean towards reading more, never less: the first record at or
after the time starts the read at the partition's start, and otherwise the answer is bisection's. A
shortcut at the last record (a range after everything held) was tried and left: one late record at the
end, older than the range, made the whole partition look before it, and the range read nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

# The event time of the first record at or after an offset; None past the partition's end.
TimeAt = Callable[[int], Awaitable[int | None]]


async def first_at_or_after(time_at: TimeAt, lo: int, hi: int, target_ms: int, hint: int | None = None
                            ) -> int:
    """The first offset in [lo, hi) whose record is at or after `target_ms` in event time (`hi` if none):
    `hint` (the broker's time index's answer) where the records on either side of it bear it out, else
    `lo` when the first record is, else bisection's answer over [lo, hi)."""

    async def before(offset: int) -> bool:  # does the record at offset come before the target?
        t = await time_at(offset)
        return t is not None and t < target_ms

    # The time index finds record timestamps, not event times: a producer clock that ran ahead misleads it.
    if (hint is not None and lo <= hint <= hi and (hint == lo or await before(hint - 1))
            and (hint == hi or not await before(hint))):
        return hint
    if lo >= hi or not await before(lo):
        return lo
    while lo < hi:
        mid = (lo + hi) // 2
        if await before(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo
