"""OutputSender.barrier: a persist waits for the output batches submitted before it, and only those;
thousands of persists waiting behind thousands of batches cost memory in proportion to their sum."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from services.joiner.delivery import OutputSender

Record = tuple[str, bytes, bytes]


class Broker:
    """The producer side: each hand-over's records are delivered when the test says so."""

    def __init__(self) -> None:
        self.rounds: list[tuple[list[Record], asyncio.Future[None]]] = []
        self.errors: list[BaseException] = []

    async def send(self, records: list[Record]) -> list[Any]:
        delivered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.rounds.append((records, delivered))
        return [delivered]

    async def fence(self, partition: int) -> None:
        return None

    async def on_error(self, e: BaseException) -> None:
        self.errors.append(e)

    def sender(self, **options: Any) -> OutputSender:
        return OutputSender(self.send, self.fence, lambda topic, n: None, self.on_error, **options)


def record(i: int) -> list[Record]:
    return [("periscope.gpus.v1", f"gpu-{i}".encode(), b"state")]


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@asynccontextmanager
async def sending(**options: Any) -> AsyncIterator[tuple[Broker, OutputSender]]:
    broker = Broker()
    sender = broker.sender(**options)
    running = asyncio.ensure_future(sender.run())
    try:
        yield broker, sender
    finally:
        running.cancel()


async def submitted(sender: OutputSender, i: int) -> None:
    """Batch `i` submitted and handed to the broker."""
    sender.submit(None, 0, record(i))
    await turns()


async def barrier(sender: OutputSender) -> asyncio.Task[None]:
    """A persist's barrier, taken now (its task has run up to the wait)."""
    task = asyncio.ensure_future(sender.barrier())
    await turns()
    return task


async def test_a_barrier_waits_for_the_batches_before_it_and_not_for_later_ones() -> None:
    async with sending() as (broker, sender):
        await submitted(sender, 1)
        first = await barrier(sender)
        await submitted(sender, 2)
        second = await barrier(sender)
        assert len(broker.rounds) == 2 and sender.backlog == 2

        broker.rounds[1][1].set_result(None)  # the later batch lands first
        await turns()
        assert not first.done() and not second.done() and sender.backlog == 1
        broker.rounds[0][1].set_result(None)
        await turns()
        assert first.done() and second.done() and sender.backlog == 0
        await asyncio.wait_for(first, 0)  # without an error

        await submitted(sender, 3)
        third = await barrier(sender)
        assert not third.done()  # batch 3 is not delivered yet
        await submitted(sender, 4)
        broker.rounds[2][1].set_result(None)
        await asyncio.wait_for(third, 1)  # batch 4, submitted after it, is not waited for
        assert sender.backlog == 1
        broker.rounds[3][1].set_result(None)
        await turns()
        await asyncio.wait_for(sender.barrier(), 0.1)  # nothing left: returns at once


async def test_a_batch_that_failed_fails_the_barriers_waiting_for_it_only() -> None:
    async with sending() as (broker, sender):
        await submitted(sender, 1)
        before = await barrier(sender)  # waits for batch 1 only
        await submitted(sender, 2)
        after = await barrier(sender)  # waits for batches 1 and 2
        broker.rounds[1][1].set_exception(RuntimeError("not leader"))
        await turns()
        assert after.done() and isinstance(after.exception(), RuntimeError)
        assert not before.done()
        broker.rounds[0][1].set_result(None)
        await asyncio.wait_for(before, 1)
        assert [str(e) for e in broker.errors] == ["not leader"]
        await asyncio.wait_for(sender.barrier(), 0.1)  # a failure is told once, to those that waited


async def test_a_cancelled_barrier_leaves_the_others_waiting() -> None:
    async with sending() as (broker, sender):
        await submitted(sender, 1)
        gone, kept = await barrier(sender), await barrier(sender)
        gone.cancel()
        await turns()
        broker.rounds[0][1].set_result(None)
        await asyncio.wait_for(kept, 1)
        assert gone.cancelled()


@pytest.mark.parametrize("n", [1500])
async def test_many_persists_behind_many_batches_take_memory_in_proportion_to_their_sum(n: int) -> None:
    # A worker that caught up on n nodes: each node's outputs are a batch, each node's persist a
    # barrier. Waiting on each batch from each barrier held n * n callbacks (about 300 MB here).
    async with sending() as (broker, sender):
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            waits = []
            for i in range(n):
                sender.submit(None, i % 4, record(i))
                waits.append(asyncio.ensure_future(sender.barrier()))
            await turns()
            grown = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert grown < 8 * 2**20, f"{grown / 2**20:.0f} MiB for {n} batches and {n} barriers"
        assert sender.backlog == n
        for _, delivered in broker.rounds:
            delivered.set_result(None)
        await asyncio.wait_for(asyncio.gather(*waits), 5)
        assert sender.backlog == 0


async def test_input_waits_for_room_while_more_outputs_than_the_limit_are_undelivered() -> None:
    async with sending(max_undelivered=2) as (broker, sender):
        await submitted(sender, 1)
        await submitted(sender, 2)
        await asyncio.wait_for(sender.room(), 1)  # two records on their way: at the limit, room
        sender.submit(None, 0, record(3) + record(4))
        await turns()
        waiting = asyncio.ensure_future(sender.room())
        await turns()
        assert not waiting.done()
        broker.rounds[0][1].set_result(None)  # one delivered: three on their way, still over
        await turns()
        assert not waiting.done()
        broker.rounds[1][1].set_result(None)
        await asyncio.wait_for(waiting, 1)
        assert sender.backlog == 1
