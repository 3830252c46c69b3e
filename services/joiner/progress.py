"""Where the worker stands on each assigned input partition, and guards against Faust/aiokafka stalls.

Seen when rebalances follow each other (a worker killed and restarted while another runs):

* aiokafka's `seek_to_committed` (which Faust calls after every rebalance) leaves a partition whose
  committed offset is missing or 0 wherever its fetcher last was. If records of that partition were
  prefetched and then dropped by Faust during a rebalance, they are never delivered. The joiner's
  transport therefore seeks such partitions to their first offset (periscope.bus.faust_transport).
* Faust's last step of a rebalance resumes its flow control, which empties every stream's queue, after
  it resumed and sought the stream partitions: records fetched in between would be lost (their read
  offset passed, no seek follows). The app holds the flow from the rebalance's completion (app.py).
* The table recovery of a rebalance that interrupted another one can wait forever for changelog
  records ("No event received for active tp since recovery start").

Skipped input is never acknowledged, so committed offsets stay before it and a fresh process recovers
correctly: the watchdog restarts the worker when a rebalance makes no progress, when an assigned
partition has records but does not advance while the worker has no backlog elsewhere to work through
(a worker catching up takes partitions unevenly: one can wait its turn for longer than the limit), or
when the first record after a rebalance is not the one the partition was positioned at. Where a
partition's end is known from fetch responses only, a partition that is never fetched looks empty; so on
brokers whose end offsets are exact (ListOffsets, see periscope.bus.profile) they are also asked every
few seconds (`refresh_ends`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

import faust
from faust.types import TP

from periscope.bus.topics import NODE_INPUTS
from services.joiner.positions import Positions

log = logging.getLogger(__name__)
INPUT_NAMES = frozenset(t.name for t in NODE_INPUTS)
# A partition still this many records behind its end that advances means the worker is working through a
# backlog (a live worker is a record or two behind).
BUSY_RECORDS = 100


def assigned(app: faust.App) -> set[TP]:
    try:
        return set(app.consumer.assignment())
    except Exception:  # not started yet
        return set()


def assigned_inputs(app: faust.App) -> list[TP]:
    return sorted(tp for tp in assigned(app) if tp.topic in INPUT_NAMES)


def unrecovered(assignment: Iterable[TP], changelogs: Collection[str]) -> dict[str, list[int]]:
    """Changelog topic -> the held input partitions whose changelog partition is not assigned: the
    table's state for those nodes is not recovered (Faust's assignor leaves out a topic missing from
    the leader's metadata)."""
    held = set(assignment)
    inputs = {tp.partition for tp in held if tp.topic in INPUT_NAMES}
    out = {}
    for topic in sorted(changelogs):
        lacking = sorted(p for p in inputs if TP(topic, p) not in held)
        if lacking:
            out[topic] = lacking
    return out


def ready(app: faust.App) -> bool:
    return bool(assigned_inputs(app)) and not app.rebalancing


class ProgressWatch:
    def __init__(self, app: faust.App, positions: Positions, stall_s: float,
                 on_stall: Callable[[], Any], ask_ends: bool = False,
                 held_up: Callable[[], bool] = lambda: False) -> None:
        self.app = app
        # True while the worker takes no input because its outputs wait on the broker (delivery.py):
        # then its partitions wait on it, not on Faust, and a restart would only start the wait over.
        self.held_up = held_up
        self.offsets = positions  # the worker's; this watch sets where each partition starts
        self.stall_s = stall_s
        self.on_stall = on_stall
        self.ask_ends = ask_ends  # the broker's end offsets are exact: ask for them, not only fetch's
        self.ends: dict[TP, int] = {}  # from the last ListOffsets
        self._rebalance: tuple[float, object] | None = None  # (since, recovery progress)
        self._partitions: dict[TP, tuple[float, int]] = {}  # since, position

    async def align(self) -> None:
        """Position every input partition at its committed offset, or at its start when it has none, and
        note where each starts (the joiner's transport does both, see periscope.bus.faust_transport)."""
        consumer: Any = self.app.consumer  # the transport's consumer; ConsumerT does not declare these
        await consumer.seek_to_committed()
        positioned = consumer.positioned
        self.offsets.start = {(tp.topic, tp.partition): positioned[tp]
                              for tp in assigned_inputs(self.app) if tp in positioned}

    async def refresh_ends(self) -> None:
        """Ask the broker for the assigned input partitions' end offsets (when it answers them exactly)."""
        inputs = assigned_inputs(self.app)
        if not self.ask_ends or not inputs or self.app.rebalancing:
            return
        try:
            self.ends = dict(await self.app.consumer.highwaters(*inputs))
        except Exception as e:  # a rebalance or a broker hiccup: the next tick asks again
            log.debug("end offsets not known this time: %r", e)

    def positions(self) -> Iterator[tuple[TP, int, int | None]]:
        """(partition, end offset on the broker, next offset this worker will process if known)."""
        for tp in assigned_inputs(self.app):
            end = self.end_of(tp.topic, tp.partition)  # from fetch responses, and asked where exact
            if end is None:
                continue
            yield tp, end, self.position(tp)

    def position(self, tp: TP) -> int | None:
        """The next offset of `tp` this worker will process, if known."""
        return self.offsets.next(tp.topic, tp.partition)

    def end_of(self, topic: str, partition: int) -> int | None:
        """The partition's end offset as last known (fetch responses, or asked), None when unknown."""
        tp = TP(topic, partition)
        try:
            fetched = self.app.consumer.highwater(tp)
        except Exception:  # not assigned (any more), or no consumer yet
            fetched = None
        end = max(fetched if fetched is not None else -1, self.ends.get(tp, -1))
        return end if end >= 0 else None

    def lag(self) -> Iterator[tuple[str, int, int]]:
        for tp, end, position in self.positions():
            yield tp.topic, tp.partition, max(0, end - (position or 0))

    def _stalled(self, why: str) -> None:
        log.error("%s (a known Faust stall): restarting the worker", why)
        self._rebalance = None
        self._partitions.clear()
        self.on_stall()

    def check(self, now: float) -> None:
        if self.app.rebalancing:
            self._partitions.clear()
            recovery = getattr(self.app.tables, "_recovery", None)
            progress = sorted(getattr(recovery, "active_offsets", {}).items())
            if self._rebalance is None or self._rebalance[1] != progress:
                self._rebalance = (now, progress)
            elif now - self._rebalance[0] > self.stall_s:
                self._stalled(f"no rebalance or recovery progress for {now - self._rebalance[0]:.0f}s")
            return
        self._rebalance = None
        waiting: list[tuple[TP, int, int]] = []
        busy = self.held_up()
        for tp, end, position in self.positions():
            if position is None or end <= position:
                self._partitions.pop(tp, None)
                continue
            seen = self._partitions.get(tp)
            if seen is None or seen[1] != position:
                self._partitions[tp] = (now, position)
                busy = busy or (seen is not None and end - position >= BUSY_RECORDS)
            else:
                waiting.append((tp, end, position))
        for tp, end, position in waiting:
            if busy:
                # The worker is working through a backlog on other partitions, or holds its input while
                # its outputs go out: one that waits meanwhile waits its turn (a large backlog fetched
                # unevenly), it is not stalled. Counted from the moment the backlog is done, a stalled
                # partition still stands out.
                self._partitions[tp] = (now, position)
            elif now - (since := self._partitions[tp][0]) > self.stall_s:
                self._stalled(f"{tp.topic}[{tp.partition}] has records from {position} to {end} but "
                              f"none arrived for {now - since:.0f}s")
                return

    def first_offset(self, topic: str, partition: int, offset: int) -> None:
        """The first record of a partition since the last rebalance must be the one it was positioned at."""
        start = self.offsets.start.get((topic, partition))
        if start is not None and offset > start:
            self._stalled(f"{topic}[{partition}] resumed at {offset}, not at {start}")
