"""The joiner's progress watch: a partition that has records but whose position does not move for the
stall limit restarts the worker, whether its end is known from fetch responses or, on brokers whose end
offsets are exact, from asking for them (a partition that is never fetched has no fetched end); not
while the worker works through a backlog on other partitions. And which held input partitions an
assignment left without their changelog partitions (their state is not recovered)."""

from __future__ import annotations

from typing import Any

import pytest
from faust.types import TP

from periscope.bus import topics as T
from services.joiner.positions import Positions
from services.joiner.progress import ProgressWatch, unrecovered

TELEMETRY = TP("periscope.node.telemetry.v1", 0)


OTHER = TP("periscope.node.telemetry.v1", 1)


class Consumer:
    def __init__(self, fetched: int | None, end: int, others: dict[TP, int] | None = None) -> None:
        self.fetched, self.end = fetched, end
        self.others = others or {}  # more assigned partitions: their (fetched and asked) end

    def assignment(self) -> set[TP]:
        return {TELEMETRY, *self.others}

    def highwater(self, tp: TP) -> int | None:
        return self.others.get(tp, self.fetched)

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        return {tp: self.others.get(tp, self.end) for tp in tps}


class App:
    rebalancing = False

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer


def _watch(fetched: int | None, end: int, ask_ends: bool) -> tuple[ProgressWatch, list[str]]:
    stalls: list[str] = []
    app: Any = App(Consumer(fetched, end))
    watch = ProgressWatch(app, Positions(), 20.0, lambda: stalls.append("stall"), ask_ends=ask_ends)
    watch.offsets.start = {TELEMETRY: 5}
    return watch, stalls


async def test_a_partition_never_fetched_is_seen_stalled_where_end_offsets_are_asked() -> None:
    watch, stalls = _watch(None, 40, ask_ends=True)
    await watch.refresh_ends()
    watch.check(100.0)
    watch.check(121.0)
    assert stalls == ["stall"]


async def test_without_asking_a_never_fetched_partition_looks_empty() -> None:
    watch, stalls = _watch(None, 40, ask_ends=False)
    await watch.refresh_ends()
    watch.check(100.0)
    watch.check(121.0)
    assert stalls == [] and watch.ends == {}


async def test_a_partition_at_its_end_is_not_stalled() -> None:
    watch, stalls = _watch(None, 5, ask_ends=True)
    await watch.refresh_ends()
    watch.check(100.0)
    watch.check(200.0)
    assert stalls == []
    assert list(watch.lag()) == [(TELEMETRY.topic, 0, 0)]


def _two(other_end: int) -> tuple[ProgressWatch, dict[tuple[str, int], int], list[str]]:
    """TELEMETRY waits at 5 of 40 (nothing handled); OTHER has records up to `other_end`."""
    stalls: list[str] = []
    processed: dict[tuple[str, int], int] = {}
    app: Any = App(Consumer(40, 40, {OTHER: other_end}))
    watch = ProgressWatch(app, Positions(processed), 20.0, lambda: stalls.append("stall"))
    watch.offsets.start = {TELEMETRY: 5, OTHER: 0}
    return watch, processed, stalls


def test_a_partition_waiting_while_the_worker_works_through_a_backlog_is_not_stalled() -> None:
    # Seen catching up 550 nodes: one partition got nothing for 21 s while the others were worked through,
    # and restarting the worker then only started it over.
    watch, processed, stalls = _two(10_000)
    for i in range(60):  # a minute of ticks, OTHER advancing and still far behind its end
        processed[(OTHER.topic, OTHER.partition)] = 100 * i
        watch.check(100.0 + i)
    assert stalls == []
    processed[(OTHER.topic, OTHER.partition)] = 9_999  # the backlog is done; TELEMETRY still waits
    for i in range(60, 82):
        watch.check(100.0 + i)
    assert stalls == ["stall"]


def test_a_live_worker_still_sees_a_stalled_partition() -> None:
    # Live, the other partitions advance too, but a record or two behind their end: no backlog.
    watch, processed, stalls = _two(10_000)
    for i in range(22):
        processed[(OTHER.topic, OTHER.partition)] = 9_000 + i
        watch.app.consumer.others[OTHER] = 9_002 + i
        watch.check(100.0 + i)
    assert stalls == ["stall"]


def test_the_next_offset_is_after_the_last_handled_else_where_the_partition_was_positioned() -> None:
    # One place for the fact: the lag metric, the stall watch, catch-up and input alignment all read it.
    positions = Positions()
    assert positions.next(TELEMETRY.topic, 0) is None  # neither handled nor positioned yet
    positions.start = {TELEMETRY: 5}  # as align() sets it at an assignment (a TP is a (topic, partition))
    assert positions.next(TELEMETRY.topic, 0) == 5
    positions.processed[(TELEMETRY.topic, 0)] = 11
    assert positions.next(TELEMETRY.topic, 0) == 12
    assert positions.next(OTHER.topic, OTHER.partition) is None


# ------------------------------------------------ an assignment that leaves a changelog out

NODES_LOG, MARKS_LOG = "j-nodes-changelog", "j-marks-changelog"


def _tps(topic: str, *partitions: int) -> list[TP]:
    return [TP(topic, p) for p in partitions]


@pytest.mark.parametrize(("assignment", "want"), [
    # every held input partition has its changelog partitions: nothing is left unrecovered
    ([*_tps(T.TELEMETRY.name, 1, 3), *_tps(T.XID.name, 1, 3), *_tps(NODES_LOG, 1, 3),
      *_tps(MARKS_LOG, 1, 3)], {}),
    # standby changelog partitions beyond the inputs are fine
    ([*_tps(T.TELEMETRY.name, 1), *_tps(NODES_LOG, 0, 1), *_tps(MARKS_LOG, 1, 2)], {}),
    # the leader's metadata lacked the marks changelog: none of it assigned
    ([*_tps(T.TELEMETRY.name, 1, 3), *_tps(NODES_LOG, 1, 3)], {MARKS_LOG: [1, 3]}),
    # one partition of one changelog missing; a partition held of any input topic counts
    ([*_tps(T.TELEMETRY.name, 1), *_tps(T.PODS.name, 5), *_tps(NODES_LOG, 1), *_tps(MARKS_LOG, 1, 5)],
     {NODES_LOG: [5]}),
    # no input held: nothing to recover
    ([*_tps(NODES_LOG, 1)], {}),
])
def test_unrecovered_names_the_held_input_partitions_without_their_changelog(
        assignment: list[TP], want: dict[str, list[int]]) -> None:
    assert unrecovered(assignment, {NODES_LOG, MARKS_LOG}) == want


def test_a_partition_waiting_while_the_worker_holds_its_input_for_its_outputs_is_not_stalled() -> None:
    # Catching up on 2,050 nodes, input waits while 20,000 outputs are on their way to the broker; the
    # partitions wait on the worker then, and a restart would only start the wait over.
    watch, _, stalls = _two(10)  # nothing else to work through
    held = [True]
    watch.held_up = lambda: held[0]
    for i in range(60):
        watch.check(100.0 + i)
    assert stalls == []
    held[0] = False  # the outputs went out; the input stays where it was
    for i in range(60, 82):
        watch.check(100.0 + i)
    assert stalls == ["stall"]
