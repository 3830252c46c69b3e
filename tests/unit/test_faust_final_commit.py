"""The joiner consumer's last commit at stop (periscope.bus.faust_transport) covers every record
acknowledged before it, even when a periodic commit is in flight: Faust's own returns at once then,
and that commit took its offsets before the final acknowledgements.

Run on a real Faust consumer of the transport; its consumer thread is replaced by one whose commit
waits until the test lets it finish, and its producer by one with nothing to flush."""

from __future__ import annotations

import asyncio
from typing import Any

import faust
from faust.types import TP

from periscope.bus.faust_transport import transport_class
from periscope.bus.profile import profile

IN = TP("in", 0)


class Thread:
    def __init__(self) -> None:
        self.commits: list[dict[TP, int]] = []
        self.release = asyncio.Event()

    def assignment(self) -> set[TP]:
        return {IN}

    async def commit(self, offsets: dict[TP, int]) -> bool:
        await self.release.wait()  # a broker taking its time
        self.commits.append({tp: int(getattr(o, "offset", o)) for tp, o in offsets.items()})
        return True


class Producer:
    async def flush(self) -> None:
        pass


async def nothing(_message: Any) -> None:
    pass


def consumer(thread: Thread) -> Any:
    app = faust.App("commit-test", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    app._producer = Producer()
    c = transport_class(profile("kafka"))(app.conf.broker_consumer, app).create_consumer(
        callback=nothing, on_partitions_revoked=None, on_partitions_assigned=None)
    c._thread = thread
    return c


def acknowledge(c: Any, *offsets: int) -> None:
    for offset in offsets:  # what Consumer.ack records for an acknowledged record
        c._acked[IN].append(offset)
        c._acked_index[IN].add(offset)


async def test_the_last_commit_waits_for_one_in_flight_and_commits_what_came_after() -> None:
    thread = Thread()
    c = consumer(thread)
    acknowledge(c, 0, 1, 2)
    periodic = asyncio.create_task(c.commit())  # takes offset 3, then waits on the broker
    await asyncio.sleep(0.01)
    acknowledge(c, 3, 4)  # the final persist at stop acknowledges the rest
    final = asyncio.create_task(c.commit_and_end_transactions())
    await asyncio.sleep(0.01)
    thread.release.set()
    await asyncio.wait_for(asyncio.gather(periodic, final), 5)
    assert thread.commits == [{IN: 3}, {IN: 5}]


async def test_with_none_in_flight_the_last_commit_is_faust_s() -> None:
    thread = Thread()
    thread.release.set()
    c = consumer(thread)
    acknowledge(c, 0, 1)
    await c.commit_and_end_transactions()
    assert thread.commits == [{IN: 2}]


async def test_records_the_joiner_acknowledges_by_position_are_committed() -> None:
    """The joiner keeps a waiting record's offset, not the record, and hands Faust's own Consumer.ack a
    stand-in (services.joiner.app.Acked): Faust's bookkeeping takes it as the record, once."""
    from services.joiner.app import Acked

    thread = Thread()
    thread.release.set()
    c = consumer(thread)
    c.app.topics._acking_topics.add(IN.topic)
    acked = [c.ack(Acked(IN.topic, IN.partition, offset)) for offset in (0, 1, 1, 2)]
    assert acked == [True, True, False, True]  # (offset 1 twice: the second is not counted)
    await c.commit_and_end_transactions()
    assert thread.commits == [{IN: 3}]
