"""After a rebalance the worker takes up, from the tables, the nodes that wait on it rather than on a
record: a node whose last samples are held for the lateness, persisted and committed, has no record
left to read, and was never rebuilt, so its last samples never came out."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from periscope.bus import codec
from periscope.bus.topics import GPUS, TELEMETRY
from periscope.core.engine import EngineConfig
from services.joiner.delivery import OutputSender
from services.joiner.metrics import JoinerMetrics
from services.joiner.worker import Hooks, Joiner
from tests.unit.core_builders import dev, gpu, meta, tel
from tests.unit.joiner_io import Event, Msg, Table, read

LATENESS_MS = EngineConfig().lateness_ms


def telemetry(node: str, partition: int, t: int, offset: int, util: float = 50.0) -> Event:
    ev = replace(tel(t, dev(gpu(0), util)), meta=meta(t, node=node, source=f"probe/{node}"))
    return Event(Msg(TELEMETRY.name, partition, offset, node.encode(), codec.encode(ev)))


class Worker:
    """A joiner on shared tables, with what it published and acknowledged. The records a test feeds are
    all the broker holds: a partition's telemetry ends after the last one fed (`ends`, shared)."""

    def __init__(self, nodes: Table, pods: Table, marks: Table, now: list[float], ends: dict[int, int]
                 ) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.acked: list[int] = []
        self.ends = ends  # partition -> telemetry end on the broker the workers share

        async def send(records: list[tuple[str, bytes, bytes]]) -> list[Any]:
            self.published += [(topic, key) for topic, key, _ in records]
            return []

        async def fail(e: BaseException) -> None:
            raise AssertionError(f"unexpected error: {e!r}")

        async def dead_letter(msg: Any, error: str) -> None:
            raise AssertionError(f"dead-lettered: {error}")

        async def ack(topic: str, partition: int, offset: int) -> None:
            self.acked.append(offset)

        self.sender = OutputSender(send, marks.fence, lambda topic, n: None, fail)
        def end_of(topic: str, partition: int) -> int | None:
            return self.ends.get(partition) if topic == TELEMETRY.name else None

        hooks = Hooks(dead_letter=dead_letter, on_error=fail, ack=ack, clock=lambda: now[0], end_of=end_of)
        self.joiner = Joiner(config=EngineConfig(), persist_interval_s=1.0, metrics=JoinerMetrics(),
                             nodes=nodes, pods=pods, marks=marks, sender=self.sender, hooks=hooks)
        self.running = asyncio.ensure_future(self.sender.run())

    async def feed(self, batch: list[Event]) -> None:
        for ev in batch:
            p = ev.message.partition
            self.ends[p] = max(self.ends.get(p, 0), ev.message.offset + 1)
        await self.joiner.handle_batch(read(batch))

    async def adopt(self, partitions: set[int]) -> int:
        # As at an assignment: positioned at the committed offsets (here, everything was committed).
        self.joiner.positions.start |= {(TELEMETRY.name, p): self.ends.get(p, 0) for p in partitions}
        return await self.joiner.adopt(partitions)

    async def settle(self) -> None:
        for _ in range(20):
            await asyncio.sleep(0)
        await self.sender.barrier()


async def test_a_node_whose_held_samples_are_all_committed_is_taken_up_and_released() -> None:
    nodes, pods, marks, now, ends = Table(), Table(), Table(), [100.0], {}
    first = Worker(nodes, pods, marks, now, ends)
    try:
        # gpu-a on partition 1: two samples, the second held for the lateness; gpu-b on partition 2.
        await first.feed([telemetry("gpu-a", 1, 1000, 0),
                                         telemetry("gpu-a", 1, 2000, 1, util=90.0),
                                         telemetry("gpu-b", 2, 1000, 0)])
        now[0] += 1.5
        first.joiner.tick()  # the periodic persist: every record is in the tables, and acknowledged
        await first.settle()
        assert first.joiner.slots["gpu-a"].state.pending
        assert sorted(first.acked) == [0, 0, 1]
    finally:
        first.running.cancel()

    # The partitions move (or the worker restarts): no record of gpu-a is left to read.
    heir = Worker(nodes, pods, marks, now, ends)
    try:
        assert await heir.adopt({1}) == 1
        assert set(heir.joiner.slots) == {"gpu-a"}  # gpu-b is not on partition 1
        slot = heir.joiner.slots["gpu-a"]
        assert slot.partition == 1 and [p.meta.time_ms for p in slot.state.pending] == [2000]
        now[0] += 2 * LATENESS_MS / 1000 + 1  # quiet: its probe stopped
        heir.joiner.tick()
        await heir.settle()
        assert not slot.state.pending
        assert slot.state.processed_ms == 2000, "the held sample never came out"
        assert [topic for topic, _ in heir.published] == [GPUS.name]  # its GPU state at 90 %
    finally:
        heir.running.cancel()


async def test_every_stored_node_of_the_partitions_is_taken_up() -> None:
    """A node with nothing held is taken up too: the worker holds the nodes of its partitions (its
    nodes gauge says so), whether or not a record of theirs is left to read."""
    nodes, pods, marks, now, ends = Table(), Table(), Table(), [100.0], {}
    first = Worker(nodes, pods, marks, now, ends)
    try:
        await first.feed([telemetry("gpu-a", 0, 1000, 0), telemetry("gpu-b", 1, 1000, 0)])
        now[0] += 2 * LATENESS_MS / 1000 + 1
        first.joiner.tick()  # quiet: released, then persisted with nothing held
        await first.settle()
        assert not first.joiner.slots["gpu-a"].state.pending and first.acked == [0, 0]
    finally:
        first.running.cancel()

    heir = Worker(nodes, pods, marks, now, ends)
    try:
        assert await heir.adopt({0, 1}) == 2
        assert heir.joiner.metrics.nodes._value.get() == 2
        await heir.feed([telemetry("gpu-a", 0, 2000, 1)])
        assert heir.joiner.slots["gpu-a"].state.watermark_ms == 2000
        assert heir.joiner.slots["gpu-a"].state.counters.samples == 1  # the first, restored
    finally:
        heir.running.cancel()


async def test_a_node_that_arrived_first_is_not_rebuilt_over() -> None:
    nodes, pods, marks, now, ends = Table(), Table(), Table(), [100.0], {}
    first = Worker(nodes, pods, marks, now, ends)
    try:
        await first.feed([telemetry("gpu-a", 0, 1000, 0), telemetry("gpu-a", 0, 2000, 1)])
        now[0] += 1.5
        first.joiner.tick()
        await first.settle()
    finally:
        first.running.cancel()
    heir = Worker(nodes, pods, marks, now, ends)
    try:
        await heir.feed([telemetry("gpu-a", 0, 3000, 2)])
        slot = heir.joiner.slots["gpu-a"]
        assert await heir.adopt({0}) == 0
        assert heir.joiner.slots["gpu-a"] is slot
    finally:
        heir.running.cancel()


async def test_a_mark_the_table_recovery_missed_still_holds_back_what_was_published() -> None:
    """A table recovery reads a changelog only up to where it ended then: a mark still on its way is
    missed, while the outputs waiting for it are published. The worker remembers the marks it wrote,
    so after the rebalance it holds back what it published, and no key goes back in time."""
    nodes, pods, marks, now, ends = Table(), Table(), Table(), [100.0], {}
    w = Worker(nodes, pods, marks, now, ends)
    gpu_times: list[int] = []

    async def send(records: list[tuple[str, bytes, bytes]]) -> list[Any]:
        gpu_times.extend(codec.decode(GPUS, v).as_of_ms for t, _, v in records if t == GPUS.name)
        return []

    w.sender._send = send
    try:
        samples = [telemetry("gpu-a", 0, 1000 * k, k - 1, util=10.0 * k) for k in range(1, 9)]
        await w.feed(samples[:2])
        now[0] += 1.5
        w.joiner.tick()  # persisted and acknowledged through offset 1 (the time-2000 sample, held)
        await w.settle()
        committed, recovered_mark = 2, marks.data[b"gpu-a"]
        await w.feed(samples[2:])  # published through time 7000, its mark with it
        await w.settle()
        assert max(gpu_times) == 7000
        marks.data[b"gpu-a"] = recovered_mark  # the recovery read the marks changelog up to before it
        w.joiner.on_rebalance()  # the same worker keeps the partition, re-read from the committed offset
        await w.feed(samples[committed:])
        now[0] += 10.0
        w.joiner.tick()
        await w.settle()
    finally:
        w.running.cancel()
    assert gpu_times == sorted(gpu_times), f"a GPU state went back in time: {gpu_times}"
    assert gpu_times[-1] == 8000
