"""Where the joiner's consumer (periscope.bus.faust_transport) positions its partitions after a
rebalance: each stream partition at its committed offset, or at its first offset where it has none,
whatever its fetcher read and Faust dropped meanwhile; changelog partitions are left to their readers.

Run on a real Faust consumer of the transport; its consumer thread is replaced by one that keeps
aiokafka's rule (`seek_to_committed` seeks only partitions whose committed offset is above 0, and
returns every committed offset, None where there is none). The seeks run in the consumer's thread:
from the caller's, aiokafka's seek races the thread's fetch (it drops the partition's fetched records
while the fetch reads them)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from aiokafka.structs import ConsumerRecord
from faust.types import TP

from periscope.bus.faust_transport import Fetched, not_handed_on, transport_class
from periscope.bus.profile import profile

A, B, C, D = (TP("in", p) for p in range(4))
LOG = TP("seek-test-t-changelog", 0)


class Thread:
    """The consumer thread's positioning calls over aiokafka; `position` is each fetcher's next offset."""

    def __init__(self, committed: dict[TP, int | None], first: dict[TP, int],
                 position: dict[TP, int]) -> None:
        self.committed, self.first, self.position = committed, first, position
        self.asked: list[tuple[TP, ...]] = []
        self.seeks_on: set[int] = set()  # the threads aiokafka's seek ran in
        self.calls = 0  # calls into the consumer thread

    async def seek_to_committed(self) -> dict[TP, int | None]:
        for tp, offset in self.committed.items():
            if offset and offset > 0:
                self.position[tp] = offset
        return dict(self.committed)

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        self.asked.append(tps)
        return {tp: self.first[tp] for tp in tps}

    def seek(self, tp: TP, offset: int) -> None:
        self.position[tp] = offset
        self.seeks_on.add(threading.get_ident())

    async def call_thread(self, fun: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Runs `fun` on an event loop in another OS thread, as mode runs it on the consumer thread's."""
        self.calls += 1
        return await asyncio.to_thread(asyncio.run, fun(*args))


async def nothing(_message: Any) -> None:
    pass


def consumer(thread: Thread) -> Any:
    app = faust.App("seek-test", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False)
    app.Table("t", partitions=1)  # a changelog topic the consumer is assigned too
    c = transport_class(profile("kafka"))(app.conf.broker_consumer, app).create_consumer(
        callback=nothing, on_partitions_revoked=None, on_partitions_assigned=None)
    c._thread = thread
    return c


async def test_a_stream_partition_without_a_committed_offset_goes_back_to_its_first_offset() -> None:
    # The fetcher read all four to 60, and Faust dropped what it fetched (a paused partition).
    thread = Thread(committed={A: None, B: 0, C: 22, D: 3, LOG: None},
                    first={A: 0, B: 0, C: 0, D: 5, LOG: 0},
                    position={A: 60, B: 60, C: 60, D: 60, LOG: 9})
    c = consumer(thread)
    committed = await c.seek_to_committed()
    assert committed == thread.committed  # what Faust records as committed is aiokafka's answer
    # No commit: the first offset (not where the fetcher was); a commit: there (aiokafka's seek);
    # a commit below the first offset (retention): aiokafka resets it to the first on its next fetch.
    assert thread.position == {A: 0, B: 0, C: 22, D: 3, LOG: 9}
    assert c.positioned == {A: 0, B: 0, C: 22, D: 5}
    assert thread.asked == [(A, B, C, D)]  # one request; the changelog's reader positions it itself
    # Faust reads a partition sought to its first offset from there again.
    assert c._read_offset[A] is None and c._read_offset[B] is None


async def test_every_partition_committed_is_left_where_aiokafka_put_it() -> None:
    thread = Thread(committed={A: 4, B: 7}, first={A: 0, B: 2}, position={A: 60, B: 60})
    c = consumer(thread)
    await c.seek_to_committed()
    assert thread.position == {A: 4, B: 7}
    assert c.positioned == {A: 4, B: 7}


async def test_the_seeks_run_in_the_consumer_thread_not_the_callers() -> None:
    thread = Thread(committed={A: None, B: None}, first={A: 0, B: 3}, position={A: 60, B: 60})
    c = consumer(thread)
    await c.seek_to_committed()
    assert thread.position == {A: 0, B: 3}
    assert thread.seeks_on and threading.get_ident() not in thread.seeks_on
    # All in one call: the thread takes its calls one at a time, each after the fetch under way.
    assert thread.calls == 1
    assert c._read_offset[A] is None and c._read_offset[B] == 3  # read from there again, as Faust's seek


# ------------------------------------------------- records Faust fetched and dropped are read again

def record(tp: TP, offset: int) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, b"k", b"v", None, 1, 1, ())


class FetchingThread:
    """A consumer thread whose fetch returns `fetched` (aiokafka's RecordMap), and which notes the unreads
    the consumer asks for."""

    def __init__(self, fetched: dict[TP, list[ConsumerRecord[bytes, bytes]]],
                 during: Callable[[], None] = lambda: None) -> None:
        self.fetched, self.during = fetched, during
        self.fetched_at: Fetched | None = None
        self.unreads: list[tuple[object, dict[TP, int]]] = []  # (assignment fetched in, offsets)

    async def getmany(self, active_partitions: Any, timeout: float) -> dict[TP, Any]:
        self.fetched_at = Fetched(self.fetched, "assignment 1", {})
        self.during()  # what happens in the app while the fetch waits for records
        return self.fetched

    def highwater(self, tp: TP) -> int:
        return 100

    async def unread(self, fetched: Fetched, offsets: dict[TP, int]) -> None:
        self.unreads.append((fetched.assignment, offsets))


async def fetch(c: Any) -> list[tuple[str, int, int]]:
    return [(m.topic, m.partition, m.offset) async for _tp, m in c.getmany(timeout=1.0)]


async def test_records_fetched_for_a_partition_paused_meanwhile_are_read_again() -> None:
    # Faust pauses the stream partitions while a rebalance recovers the tables; what the fetcher
    # returns for them then is dropped, and aiokafka's position is past it.
    fetched = {A: [record(A, o) for o in (0, 1, 2)], B: [record(B, o) for o in (7, 8)]}
    c = consumer(Thread({}, {}, {}))
    c._thread = thread = FetchingThread(fetched, during=lambda: c._active_partitions.discard(A))
    c._active_partitions = {A, B}
    assert await fetch(c) == [("in", 1, 7), ("in", 1, 8)]
    assert thread.unreads == [("assignment 1", {A: 0})]  # sought back, unless moved since


async def test_a_fetch_handed_on_whole_is_not_read_again() -> None:
    fetched = {A: [record(A, o) for o in (3, 4)], B: [record(B, 9)]}
    c = consumer(Thread({}, {}, {}))
    c._thread = thread = FetchingThread(fetched)
    c._active_partitions = {A, B}
    assert sorted(await fetch(c)) == [("in", 0, 3), ("in", 0, 4), ("in", 1, 9)]
    assert thread.unreads == []


async def test_the_rest_of_a_fetch_after_the_flow_stopped_is_read_again_from_its_first() -> None:
    fetched = {A: [record(A, o) for o in (0, 1, 2)]}
    c = consumer(Thread({}, {}, {}))
    c._thread = thread = FetchingThread(fetched)
    c._active_partitions = {A}
    got = []
    async for _tp, m in c.getmany(timeout=1.0):
        got.append(m.offset)
        c.stop_flow()  # a rebalance starts after the first record
    assert got == [0] and thread.unreads == [("assignment 1", {A: 1})]


def test_not_handed_on_names_each_partition_from_its_first_record_left() -> None:
    fetched = {A: [record(A, o) for o in (4, 5, 6)], B: [record(B, 1)], C: [record(C, 2), record(C, 3)],
               D: []}
    assert not_handed_on(fetched, {A: 4, B: 1}) == {A: 5, C: 2}
    assert not_handed_on(fetched, {A: 6, B: 1, C: 3}) == {}


class Position:
    """aiokafka's TopicPartitionState, as far as unread reads it."""

    def __init__(self, position: int | None) -> None:
        self.position, self.has_valid_position = position, position is not None


class Assignment:
    def __init__(self, positions: dict[TP, int | None]) -> None:
        self.states = {tp: Position(p) for tp, p in positions.items()}

    def state_value(self, tp: TP) -> Position | None:
        return self.states.get(tp)


class Subscribed:
    """An aiokafka consumer as the thread's fetch and unread see it: its assignment, and its seeks."""

    def __init__(self, assignment: Assignment) -> None:
        self.assignment = assignment
        self.seeks: list[tuple[TP, int]] = []
        self.seeks_on: set[int] = set()  # the threads the seeks ran in

    @property
    def _subscription(self) -> Any:
        return type("S", (), {"subscription": type("Sub", (), {"assignment": self.assignment})})()

    def seek(self, tp: TP, offset: int) -> None:
        self.seeks.append((tp, offset))
        self.seeks_on.add(threading.get_ident())
        self.assignment.states[tp].position = offset


async def test_unread_seeks_back_only_partitions_nothing_moved_since_the_fetch() -> None:
    c = consumer(Thread({}, {}, {}))
    thread = c._new_consumer_thread()
    thread.call_thread = Thread({}, {}, {}).call_thread  # runs it in another OS thread, as mode does
    thread._consumer = aiokafka = Subscribed(Assignment({A: 3, B: 9, C: 4}))
    fetched = Fetched.of(aiokafka, {A: [], B: [], C: []})  # a fetch left A at 3, B at 9, C at 4
    aiokafka.seek(C, 0)  # then something sought C (Faust positioning it at its committed offset)
    aiokafka.seeks.clear()
    aiokafka.seeks_on.clear()
    await thread.unread(fetched, {A: 0, B: 5, C: 2})
    assert aiokafka.seeks == [(A, 0), (B, 5)]  # C is left where it was sought
    assert aiokafka.seeks_on and threading.get_ident() not in aiokafka.seeks_on
    aiokafka.assignment = Assignment({A: 0, B: 5})  # a rebalance: a new assignment
    aiokafka.seeks.clear()
    await thread.unread(Fetched.of(Subscribed(Assignment({A: 0, B: 5})), {A: [], B: []}), {A: 0})
    await thread.unread(fetched, {A: 0})
    assert aiokafka.seeks == []  # positioned by the new assignment itself
    unassigned = type("Consumer", (), {"_subscription": type("S", (), {"subscription": None})()})()
    assert Fetched.of(unassigned, {A: []}) is None  # no assignment when fetched: nothing to seek back
